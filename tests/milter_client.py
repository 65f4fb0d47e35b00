"""An MTA's side of the milter protocol, for the tests: written from the protocol's
description (Sendmail's libmilter docs, Postfix's MILTER_README), sharing no code with
:mod:`spamnb.delivery.milter_protocol`, so that a misreading there is not repeated here."""

from __future__ import annotations

import socket
import struct

# what Postfix 3.x offers: every action, every protocol flag of version 6
ALL_ACTIONS = 0x1FF
ALL_PROTOCOL = 0x1FFFFF


class MTA:
    """One milter connection as Postfix's smtpd holds it."""

    def __init__(self, port, *, timeout=20.0):
        """``port``: the milter's TCP port on 127.0.0.1, or its Unix socket's path (a str)."""
        if isinstance(port, str):
            self.sock = socket.socket(socket.AF_UNIX)
            self.sock.settimeout(timeout)
            self.sock.connect(port)
        else:
            self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.flags = 0

    def close(self):
        self.sock.close()

    def send(self, cmd: bytes, data: bytes = b""):
        self.sock.sendall(struct.pack("!L", len(data) + 1) + cmd + data)

    def _exact(self, n):
        out = b""
        while len(out) < n:
            got = self.sock.recv(n - len(out))
            if not got:
                raise EOFError("the milter closed the connection")
            out += got
        return out

    def read(self):
        size, = struct.unpack("!L", self._exact(4))
        body = self._exact(size)
        return body[:1], body[1:]

    def negotiate(self, version=6, actions=ALL_ACTIONS, protocol=ALL_PROTOCOL):
        self.send(b"O", struct.pack("!LLL", version, actions, protocol))
        cmd, data = self.read()
        assert cmd == b"O", (cmd, data)
        v, a, p = struct.unpack("!LLL", data[:12])
        self.flags = p
        return v, a, p

    def step(self, cmd, data, no_reply_flag):
        """Send a step; read its reply unless the milter asked for none."""
        self.send(cmd, data)
        if not self.flags & no_reply_flag:
            return self.read()
        return None

    def macro(self, for_cmd: bytes, **pairs):
        self.send(b"D", for_cmd + b"".join(k.encode() + b"\0" + v.encode() + b"\0" for k, v in pairs.items()))

    def message(self, raw: bytes, *, sender="a@example.org", rcpts=("bob@example.com",), chunk=65535,
                queue_id="4ABC123", connect=True, queue_id_with=b"E"):
        """One message through the steps Postfix sends (headers without their line ends, the
        body in chunks of ``chunk``): the replies at the end of the body. The queue id
        (``{i}``, None: none) goes with the macros of the end of the body, as Postfix sends
        it, or (``queue_id_with=b"M"``) with MAIL's, before MAIL, as Sendmail does."""
        if connect:
            self.macro(b"C", j="mx.example.com")
            self.step(b"C", b"client.example.net\x004" + struct.pack("!H", 40000) + b"192.0.2.9\0", 0x1000)
            self.step(b"H", b"client.example.net\0", 0x2000)
        if queue_id is not None and queue_id_with == b"M":
            self.macro(b"M", i=queue_id, mail_mailer="esmtp")
        self.step(b"M", f"<{sender}>\0".encode(), 0x4000)
        for r in rcpts:
            self.step(b"R", f"<{r}>\0".encode(), 0x8000)
        if not self.flags & 0x200:
            self.step(b"T", b"", 0x10000)
        head, _, body = raw.partition(b"\r\n\r\n")
        fields = []
        for line in head.split(b"\r\n"):
            if line[:1] in (b" ", b"\t") and fields:
                fields[-1] += b"\n" + line  # a folded field as Postfix sends it
            else:
                fields.append(line)
        for f in fields:
            name, _, value = f.partition(b":")
            if not self.flags & 0x100000:  # without HDR_LEADSPC the space after the colon is not sent
                value = value[1:] if value[:1] == b" " else value
            self.step(b"L", name + b"\0" + value + b"\0", 0x80)
        if not self.flags & 0x40:
            self.step(b"N", b"", 0x40000)
        for i in range(0, len(body), chunk):
            self.step(b"B", body[i:i + chunk], 0x80000)
        if queue_id is not None and queue_id_with == b"E":
            self.macro(b"E", i=queue_id)
        self.send(b"E")
        return self.until_final()

    def until_final(self):
        """The replies to the end of the body, up to the final one (accept, continue,
        reject, tempfail, a reply code)."""
        got = []
        while True:
            cmd, data = self.read()
            got.append((cmd, data))
            if cmd in (b"a", b"c", b"r", b"t", b"y", b"d"):
                return got


def added(replies):
    """The header fields added: ``[(name, value)]``."""
    return [tuple(d.split(b"\0")[:2]) for c, d in replies if c == b"h"]


def changed(replies):
    """The header changes: ``[(index, name, value)]``."""
    return [(struct.unpack("!L", d[:4])[0], *d[4:].split(b"\0")[:2]) for c, d in replies if c == b"m"]
