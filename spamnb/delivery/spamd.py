"""``spamnb serve --spamd ADDRESS``: the spamd listeners.

The TCP (:class:`TCPServer`) and Unix (:class:`UnixServer`) listeners that
``serve --spamd`` opens (:func:`listening`), each connection answered in
SpamAssassin's spamc/spamd protocol (:mod:`spamnb.delivery.spamd_protocol`) with
the served or the user's model (:class:`spamnb.delivery.usermodels.Models`); who
may connect, and who may name which user (``User:``, any method), is the rule of
:mod:`spamnb.delivery.access`.

**Limits.** A declared ``Content-length`` over ``spamd_max_bytes`` (``--spamd-max-bytes``,
:data:`SPAMD_MAX_BYTES`) is refused at once, nothing read (EX_DATAERR: spamc passes the
message through), and so is a message without one that runs past it: the disk,
memory and time one request takes are bounded by it, not by bandwidth x timeout.
Below it, a message over ``max_bytes`` is answered as unscanned (score 0.0,
``Spam: False``), as spamc does for its own ``-s`` limit; for ``PROCESS``
it is returned as it came (held on disk while it arrives, never in memory
beyond :data:`SPOOL_BYTES`), never dropped. Every
request has a deadline (reading it, then writing the reply), and the
connections served at once are capped (``--max-connections``): one beyond the
cap waits up to :data:`~spamnb.delivery.server.SLOT_WAIT` for a slot while no more than the cap wait
with it, else it is answered EX_TEMPFAIL and closed at once, so a slow or
stalled client holds one thread for at most the deadline and a flood of idle
ones at most twice the cap of descriptors. One client (a user of this machine,
another host's address) holds at most half the slots and half the waiting
places, so that another user's spamc is served during its flood.

**Who may connect**: loopback, and the ``--allow`` networks, checked before a
byte is read; a Unix socket by its mode (``--spamd-socket-mode``)
(:mod:`spamnb.delivery.access`).
"""

from __future__ import annotations

import dataclasses
import errno
import socket
import socketserver
import tempfile
import time

from spamnb.delivery import access, events, pipeline
from spamnb.delivery.server import SLOT_WAIT, DoorServer, Listening, TCPListener, UnixListener
from spamnb.delivery.access import client_ip
from spamnb.delivery.spamd_protocol import (CHUNK, SCANNING, Reader, SpamdError, answer, find_header_end, namer,
                                            parse_headers, parse_request_line, reply, spam_line, unreadable)
from spamnb.storage.store import ModelError
from spamnb.options import BY_KEY
from spamnb.verdict import threshold

#: An unscanned message for PROCESS is held in memory up to this, then on disk.
SPOOL_BYTES = 8 * 1024 * 1024
#: The largest message a spamd client may send (``--spamd-max-bytes``, its row's default:
#: twenty times spamc's own default limit, ``spamc -s``, 500 KB), so that spamc's limit,
#: not this one, decides for its users; Exim's spam condition sends any size (put a size
#: condition before it, see docs/security.md). It bounds each request's memory
#: (scanned in memory up to it) and disk (an unscanned PROCESS is spooled).
SPAMD_MAX_BYTES = BY_KEY[("spamd", "max_bytes")].default
#: An unscanned message's header block is looked for in its first bytes only.
MAX_HEADER_BLOCK = 1 << 20


# -- the server -------------------------------------------------------------------------


def as_reply(exc) -> SpamdError:
    """The error reply for what failed: a SpamdError as it is, anything else (a bug: one
    bad message never stops the server) EX_SOFTWARE, naming only the kind of error."""
    if isinstance(exc, SpamdError):
        return exc
    return SpamdError("EX_SOFTWARE", f"internal error: {exc.__class__.__name__}")


class _Handler(socketserver.BaseRequestHandler):
    def handle(self):
        srv = self.server
        conn = self.request
        start = time.monotonic()
        reader = Reader(conn, start + srv.timeout_s)
        #: what is known of the request so far, for its error line (:meth:`_facts`)
        self.facts = {"raddr": client_ip(self.client_address)}

        def error_reply(reason, exc):  # spamc passes the mail through on it
            srv.log(f"spamd: {reason}" if not isinstance(exc, SpamdError) else f"spamd: {exc.logged()}")
            return as_reply(exc).line()

        with pipeline.boundary("spamd", error_reply, recorder=srv.models.recorder, facts=self._facts,
                               kind=lambda exc: as_reply(exc).name.lower(), unscanned=self._went_unscanned) as boundary:
            out = self._request(reader)
        if boundary.result is not None:
            out = boundary.result
        if out:
            self._send([out], time.monotonic() + srv.timeout_s)
        srv.models.recorder.answered(time.monotonic() - start)

    def _went_unscanned(self, exc=None):
        """Whether a failed request's mail went on unscanned: not a TELL's (a learn not
        done: its mail was delivered already), nor a connection that sent no request (a
        port check, PING, SKIP)."""
        method = self.facts.get("method")
        return method in SCANNING or (method is None and self.facts.get("sent", False))

    def _facts(self):
        """What is known of a failed request's message, for its error line."""
        facts = self.facts
        raw = facts.get("raw")
        return {"raw": raw[:MAX_HEADER_BLOCK] if raw is not None else None,
                "size": facts.get("size") if raw is None else len(raw),
                "user": facts.get("headers", {}).get("User"), "raddr": facts.get("raddr"), "mid": facts.get("mid")}

    def _request(self, reader) -> bytes | None:
        srv = self.server
        facts = self.facts
        first = reader.line()
        facts["sent"] = bool(first)
        method, version = parse_request_line(first)
        facts["method"] = method
        headers = {}
        if method in ("PING", "SKIP"):
            if version >= (1, 5):  # 1.5 clients send a (usually empty) header block here too
                parse_headers(reader)
        elif version > (1, 0) or method == "TELL":  # 1.0 requests have no headers: the message follows
            headers = parse_headers(reader, facts.setdefault("headers", {}))
        if method == "PING":
            return b"SPAMD/1.5 0 PONG\r\n"
        if method == "SKIP":
            return None
        length = headers.get("Content-length")
        length = int(length) if length is not None else None
        facts["size"] = length
        if length is not None and length > srv.spamd_max_bytes:
            raise too_long(srv.spamd_max_bytes)
        if length is not None and length > srv.max_bytes:
            return self._unscanned(reader, method, version, headers, length)
        raw = facts["raw"] = b"".join(reader.chunks(length if length is not None else srv.max_bytes + 1))
        if length is not None and len(raw) != length:
            raise SpamdError("EX_PROTOCOL", f"(Content-Length mismatch: Expected {length} bytes, "
                                            f"got {len(raw)} bytes)")
        if len(raw) > srv.max_bytes:
            return self._unscanned(reader, method, version, headers, None, raw)
        # The peer's user is looked up only when a rule reads it (a request that names a user):
        # over TCP it is a scan of the kernel's socket table (/proc/self/net/tcp, every
        # connection of the host, TIME_WAIT ones too), which took 29% of the server's CPU
        # per CHECK on a host with 736 lines there (bench_ref.py --only server).
        return answer(method, version, headers, raw, srv.models, rules=srv.rules,
                      peer=srv.peer(self.request, self.client_address), compact=srv.compactor.soon,
                      raddr=facts["raddr"])

    def _unscanned(self, reader, method, version, headers, length, head=b""):
        """A message over the limit: neither scored nor learned. PROCESS streams it
        back as it came, HEADERS returns its own header block, the others say 0.0."""
        srv = self.server
        if method == "TELL":
            raise SpamdError("EX_DATAERR", f"message over {srv.max_bytes} bytes: not learned")
        user, models = headers.get("User"), srv.models
        backend, own = models.pick(user, namer(method, headers, srv.rules, srv.peer(self.request, self.client_address)))
        decision = models.decision_for(user, via="spamd")
        try:
            t = models.with_fallback(backend, own, lambda b: threshold(decision.cutoffs(b.view().cutoffs)[1]))
        except (ModelError, OSError) as exc:
            raise unreadable(exc) from None
        line = spam_line("ham", 0.0, t, method)
        srv.log(f"spamd: message over {srv.max_bytes} bytes answered unscanned")
        rest = reader.chunks(None if length is None else length - len(head))
        if length is None:
            rest = _at_most(rest, srv.spamd_max_bytes - len(head), srv.spamd_max_bytes)
        seen = _Seen(head, rest)  # its size and Message-ID, for its line
        rest = iter(seen)
        self.facts.pop("raw", None)
        self.facts["size"] = length
        try:
            return self._unscanned_reply(method, version, line, head, rest, srv)
        finally:
            if not seen.failed:  # (a failure has its own error line)
                srv.models.recorder.error("too_big", f"over {srv.max_bytes} bytes (--max-bytes): answered unscanned",
                                          via="spamd", unscanned=True, size=seen.size, mid=seen.mid(),
                                          user=headers.get("User"), raddr=self.facts["raddr"])

    def _unscanned_reply(self, method, version, line, head, rest, srv):
        if method == "PROCESS":
            # Read it all before answering: spamc (like most clients) reads nothing until it
            # has sent everything, so echoing while it sends would deadlock once the sockets'
            # buffers are full. Beyond SPOOL_BYTES it waits on disk, not in memory.
            with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as spool:
                spool.write(head)
                for piece in rest:
                    spool.write(piece)
                size = spool.tell()
                spool.seek(0)
                top = [b"SPAMD/1.0 0 EX_OK\r\n"] if version < (1, 2) else [
                    b"SPAMD/1.1 0 EX_OK\r\n", b"Content-length: %d\r\n" % size,
                    line + b"\r\n" if version >= (1, 3) else b"", b"\r\n"]
                self._send([*top, *iter(lambda: spool.read(CHUNK), b"")], time.monotonic() + srv.timeout_s)
            return None
        block = head
        for piece in rest:  # read what the client sends before answering (it may wait to finish sending)
            if method == "HEADERS" and len(block) < MAX_HEADER_BLOCK and find_header_end(block) is None:
                block += piece
        if method == "HEADERS":
            body = block[:find_header_end(block) or len(block)]
            if version < (1, 2):
                return b"SPAMD/1.0 0 EX_OK\r\n" + body
            return reply(headers=[line] if version >= (1, 3) else [], body=body)
        body = b"" if method == "CHECK" else b"message too large: not scanned\r\n"
        return reply(headers=[line], body=body, length=version >= (1, 3) and method != "CHECK")

    def _send(self, pieces, deadline):
        conn = self.request
        try:
            for piece in pieces:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise socket.timeout
                conn.settimeout(left)
                conn.sendall(piece)
        except (OSError, SpamdError) as exc:
            self.server.log(f"spamd: reply not delivered: {exc}")


class _Seen:
    """The pieces of an unscanned message as they pass: its size, and its first bytes
    for its Message-ID."""

    def __init__(self, head, rest):
        self.rest = rest  # the pieces after ``head`` (the first, which the caller has read already)
        self.size = len(head)
        self.top = head[:65536]
        self.failed = True  # until every piece went by

    def __iter__(self):
        for piece in self.rest:
            yield self._saw(piece)
        self.failed = False

    def _saw(self, piece):
        self.size += len(piece)
        if len(self.top) < 65536:
            self.top += piece[:65536 - len(self.top)]
        return piece

    def mid(self):
        return events.message_id(self.top)


def too_long(cap):
    return SpamdError("EX_DATAERR", f"message over {cap} bytes (the server's --spamd-max-bytes): not scanned")


def _at_most(pieces, left, cap):
    """``pieces`` while they total at most ``left`` bytes; EX_DATAERR (over ``cap``) past it."""
    for piece in pieces:
        left -= len(piece)
        if left < 0:
            raise too_long(cap)
        yield piece


class _SpamdServer(DoorServer):
    what = "the spamd protocol"
    via = "spamd"
    busy_kind = "ex_tempfail"  # answered EX_TEMPFAIL

    def configure(self, models, *, max_bytes, timeout, allow_tell, log, compactor, max_connections,
                  tell_served=False, spamd_max_bytes=SPAMD_MAX_BYTES, trusted_users=()):
        self.models = models
        self.spamd_max_bytes = spamd_max_bytes
        self.max_bytes = min(max_bytes, spamd_max_bytes)
        self.timeout_s = timeout
        self.rules = dataclasses.replace(self.rules, tell=allow_tell, tell_served=tell_served,
                                         trusted=tuple(trusted_users))
        self.log = log
        self.compactor = compactor
        # spamc passes a message through unfiltered when refused: a burst waits a moment instead,
        # as many as are served at most; beyond them (an idle flood) refused at once
        # and no one client (a local user, another host) holds more than half of either
        self.bound_threads(max_connections, busy=SpamdError("EX_TEMPFAIL", "too many connections").line(),
                           wait=SLOT_WAIT, shared=True)


class TCPServer(TCPListener, _SpamdServer, socketserver.TCPServer):
    door = access.SPAMD

    def __init__(self, host, port, allowed):
        super().__init__(host, port, allowed, _Handler)


class UnixServer(UnixListener, _SpamdServer, socketserver.UnixStreamServer):
    door = access.SPAMD

    def __init__(self, path, mode):
        super().__init__(path, mode, _Handler)

    def where(self):
        return self.path  # (spamd's log names its socket by its path alone)


# -- addresses -------------------------------------------------------------------------


def listening(addresses, models, *, max_bytes, timeout, allow_tell=False, unix_mode=0o600, max_connections,
              compactor, log, tell_served=False, spamd_max_bytes=SPAMD_MAX_BYTES, trusted_users=()) -> Listening:
    """The spamd servers of ``addresses`` to open (:func:`spamnb.delivery.server.open_listeners`)."""

    def listen(kind, where, networks):
        srv = UnixServer(where[0], unix_mode) if kind == "unix" else TCPServer(where[0], where[1], networks)
        srv.configure(models, max_bytes=max_bytes, timeout=timeout, allow_tell=allow_tell, log=log,
                      compactor=compactor, max_connections=max_connections, tell_served=tell_served,
                      spamd_max_bytes=spamd_max_bytes, trusted_users=trusted_users)
        return srv

    def said(text, kind, where, exc):
        hint = (" (a port below 1024 needs root or CAP_NET_BIND_SERVICE: see contrib/systemd, "
                "or pick a port above 1023 and give spamc -p PORT)"
                if kind == "tcp" and where[1] < 1024 and exc.errno == errno.EACCES else "")
        return f"cannot listen on {text}: {exc.strerror or exc}{hint}"

    return Listening("--spamd", tuple(addresses), listen, said)
