"""The milter protocol (Sendmail's libmilter, version 6, as Postfix and Sendmail speak it).

Each packet is a 4-byte length in network order (counting the command byte), a
command byte and its data::

    00 00 00 0d  'O'  <version> <actions> <protocol>     option negotiation (12 bytes)

The MTA sends the steps of an SMTP session as it goes (connect, HELO, MAIL,
RCPT, the header fields, the body in chunks, end of body), each preceded by the
macros it defines for that step (``D``); the milter answers each step unless the
negotiation said it would not (the ``NR_*`` flags), and at the end of the body it
may ask for header changes before its final answer. ``A`` (abort) ends a message,
``Q`` the connection, ``K`` (quit, new connection) starts over on the same one.

This module is the codec alone: packets cut from what was read (:class:`Packets`) and made
(:func:`packet` and the replies), the negotiation (:func:`negotiate`), the
commands' data parsed, and a message assembled as the MTA will deliver it
(:class:`Message`). The door that serves it is :mod:`spamnb.delivery.milter`.
Written here rather than taken from a library: pymilter needs libmilter and a
compiler; the pure-Python ones (``purepythonmilter``: asyncio, its own server
loop; ``ppymilter``: unmaintained since 2012) would not run in the capped listeners
every other door uses (CONTRIBUTING.md says more).
"""

from __future__ import annotations

import struct

#: The protocol version spoken (Sendmail 8.14+, Postfix 2.6+).
VERSION = 6

# -- commands (MTA to milter) -------------------------------------------------------
ABORT, BODY, CONNECT, MACRO, EOB, HELO, QUIT_NC = b"A", b"B", b"C", b"D", b"E", b"H", b"K"
HEADER, MAIL, EOH, OPTNEG, QUIT, RCPT, DATA, UNKNOWN = b"L", b"M", b"N", b"O", b"Q", b"R", b"T", b"U"

# -- replies (milter to MTA) ---------------------------------------------------------
ACCEPT, CONTINUE, TEMPFAIL, REPLYCODE = b"a", b"c", b"t", b"y"
ADDHEADER, CHGHEADER = b"h", b"m"

# -- actions the milter may take (SMFIF_*) -------------------------------------------
ADDHDRS, CHGHDRS = 0x01, 0x10
#: What this milter does: add its header fields, remove forged ones. Never the body.
ACTIONS = ADDHDRS | CHGHDRS

# -- protocol flags (SMFIP_*): steps not sent, steps not answered ------------------------
NOCONNECT, NOHELO, NOMAIL, NORCPT, NOBODY, NOHDRS, NOEOH = 0x1, 0x2, 0x4, 0x8, 0x10, 0x20, 0x40
NR_HDR, NOUNKNOWN, NODATA, SKIP, RCPT_REJ = 0x80, 0x100, 0x200, 0x400, 0x800
NR_CONN, NR_HELO, NR_MAIL, NR_RCPT, NR_DATA, NR_UNKN, NR_EOH, NR_BODY = (
    0x1000, 0x2000, 0x4000, 0x8000, 0x10000, 0x20000, 0x40000, 0x80000)
HDR_LEADSPC = 0x100000
#: Steps this milter has no use for: the MTA need not send them.
UNUSED = NOEOH | NODATA | NOUNKNOWN
#: Steps it never answers but at the end of the body (and leading spaces of header
#: values as sent, so that a field is rebuilt byte for byte), when the MTA offers them.
NO_REPLY = NR_CONN | NR_HELO | NR_MAIL | NR_RCPT | NR_DATA | NR_UNKN | NR_EOH | NR_HDR | NR_BODY | HDR_LEADSPC
#: The no-reply flag of each step (a step without one, or not negotiated, is answered CONTINUE).
STEP_NR = {CONNECT: NR_CONN, HELO: NR_HELO, MAIL: NR_MAIL, RCPT: NR_RCPT, DATA: NR_DATA, UNKNOWN: NR_UNKN,
           EOH: NR_EOH, HEADER: NR_HDR, BODY: NR_BODY}

#: The largest packet taken: a body chunk is at most 64 KiB (libmilter's MILTER_CHUNK_SIZE,
#: Postfix's too), a header field at most Postfix's header_size_limit (100 KiB); anything
#: near 2 GiB is garbage or an attack, refused before a byte of it is read.
MAX_PACKET = 1 << 20
#: What is kept of an envelope's address, a HELO name or the queue id: 256 characters
#: (RFC 5321's longest path; a domain is at most 255), the rest cut. And at most
#: :data:`MAX_RCPTS` recipients a message (RFC 5321's 100, the fewest an MTA must
#: take; Postfix's default limit is 1,000): the others are counted, not kept. A
#: session's envelope is then a few tens of kilobytes, however many packets of up to
#: :data:`MAX_PACKET` an MTA (or anyone who reaches the port) sends.
MAX_NAME = 256
MAX_RCPTS = 100
_LEN = struct.Struct(">I")
_MACRO = MACRO[0]


class MilterError(Exception):
    """A packet the protocol does not allow (its connection is closed); ``kind``: the
    error line's kind (:data:`spamnb.delivery.events.ERROR_KINDS`)."""

    def __init__(self, text, kind="ex_protocol"):
        super().__init__(text)
        self.kind = kind


def timeval(seconds: float) -> bytes:
    """A socket option's ``struct timeval`` (SO_RCVTIMEO, SO_SNDTIMEO); at least a microsecond
    (zero would mean no timeout)."""
    usec = max(1, round(seconds * 1e6))
    return struct.pack("@ll", usec // 1_000_000, usec % 1_000_000)


def packet(cmd: bytes, data: bytes = b"") -> bytes:
    """One packet: length, command byte, data."""
    return _LEN.pack(len(data) + 1) + cmd + data


class Packets:
    """A connection's bytes as they come, cut into packets (:meth:`take`). An MTA sends a
    session's steps in bursts (Postfix: the envelope in one write, the header fields and
    the body in the next), so one read holds many packets: they are cut at an offset,
    and the bytes of a packet not whole yet are kept for the next read."""

    __slots__ = ("buf", "pos")

    def __init__(self):
        self.buf = b""
        self.pos = 0  # where the next packet starts in buf

    def add(self, data: bytes) -> None:
        """Bytes read from the connection, after those kept."""
        self.buf = self.buf[self.pos:] + data if self.pos < len(self.buf) else data
        self.pos = 0

    def pending(self) -> bool:
        """Whether part of a packet is kept (the connection closed now cuts it)."""
        return self.pos < len(self.buf)

    def take(self):
        """The next whole packet, ``(cmd, data)``, or None until more bytes come;
        MilterError for a length out of bounds (known from its first 4 bytes, before the
        rest is waited for). Postfix sends an empty macro list before each header field
        (nothing defined, nothing to answer): those are passed over here."""
        buf, pos = self.buf, self.pos
        n = len(buf)
        while n - pos >= 4:
            (size,) = _LEN.unpack_from(buf, pos)
            if not 1 <= size <= MAX_PACKET:
                raise MilterError(f"a packet of {size} bytes (the limit is {MAX_PACKET}): not a milter client")
            end = pos + 4 + size
            if end > n:
                break
            self.pos = pos = end
            if size == 2 and buf[end - 2] == _MACRO:
                continue
            return buf[end - size:end - size + 1], buf[end - size + 1:end]
        return None


# -- negotiation -----------------------------------------------------------------------


def negotiate(data: bytes) -> tuple[bytes, int, int]:
    """``(reply, actions, flags)``: the reply to the MTA's ``O`` (its version, the actions
    and protocol flags it offers), the actions agreed (this milter's among those offered)
    and the protocol flags agreed: the steps it does not need and the no-reply flags, each only where
    offered (a version 2 MTA offers none: every step is answered)."""
    if len(data) < 12:
        raise MilterError(f"option negotiation of {len(data)} bytes, not 12")
    version, actions, offered = struct.unpack(">III", data[:12])
    if version < 2:
        raise MilterError(f"milter protocol version {version}: 2 to {VERSION} are spoken")
    if not actions & ADDHDRS:
        raise MilterError("the MTA lets no milter add a header field")
    agreed = offered & (UNUSED | NO_REPLY)
    reply = packet(OPTNEG, struct.pack(">III", min(version, VERSION), actions & ACTIONS, agreed))
    return reply, actions & ACTIONS, agreed


def answers(cmd: bytes, agreed: int) -> bool:
    """Whether the MTA waits for an answer to step ``cmd`` (not negotiated away)."""
    flag = STEP_NR.get(cmd)
    return flag is None or not agreed & flag


# -- the commands' data ------------------------------------------------------------------


def strings(data: bytes) -> list[bytes]:
    """The NUL-terminated strings of ``data``."""
    items = data.split(b"\0")
    return items[:-1] if items and items[-1] == b"" else items


def macros(data: bytes) -> tuple[bytes, dict]:
    """``(step, {name: value})`` of a ``D`` packet; names without their braces (``{i}``: ``i``)."""
    if not data:
        raise MilterError("an empty macro packet")
    items = strings(data[1:])
    found = {}
    for name, value in zip(items[::2], items[1::2]):
        found[name.decode("latin-1").strip("{}")] = value.decode("latin-1")
    return data[:1], found


def queue_id(data: bytes) -> str | None:
    """The queue id of a ``D`` packet (its ``i`` or ``{i}`` macro), or None. An MTA sends
    a macro list before most steps and the queue id in one of them: a list that cannot
    hold it (no ``i`` name ending in it) is not split."""
    if data and b"i\0" not in data and b"{i}\0" not in data:
        return None
    return macros(data)[1].get("i")


def connect(data: bytes) -> tuple[str, str | None]:
    """``(host name, address)`` of a ``C`` packet (address None for a Unix or unknown family)."""
    host, _, rest = data.partition(b"\0")
    family = rest[:1]
    address = None
    if family in (b"4", b"6") and len(rest) >= 3:
        address = rest[3:].split(b"\0", 1)[0].decode("latin-1")
        if address.lower().startswith("ipv6:"):
            address = address[5:]
    return host.decode("latin-1"), address


def header(data: bytes) -> tuple[bytes, bytes]:
    """``(name, value)`` of an ``L`` packet."""
    name, nul, rest = data.partition(b"\0")
    if not nul or not name:
        raise MilterError("a header packet without a name and a value")
    return name, rest.partition(b"\0")[0]


def address(data: bytes) -> str:
    """The address of a MAIL or RCPT packet (its first string), without its angle brackets."""
    items = strings(data)
    first = items[0].decode("latin-1") if items else ""
    return (first[1:-1] if first.startswith("<") and first.endswith(">") else first)[:MAX_NAME]


# -- replies ------------------------------------------------------------------------------


def add_header(name: bytes, value: bytes) -> bytes:
    return packet(ADDHEADER, name + b"\0" + value + b"\0")


def remove_header(index: int, name: bytes) -> bytes:
    """Remove the ``index``-th (from 1) field called ``name``: a change to an empty value."""
    return packet(CHGHEADER, struct.pack(">I", index) + name + b"\0\0")


def reply_code(text: str) -> bytes:
    """An SMTP reply of the milter's own (``550 5.7.1 ...``, ``451 4.3.0 ...``)."""
    return packet(REPLYCODE, text.replace("%", "%%").encode("ascii", "replace") + b"\0")


# -- the message --------------------------------------------------------------------------


def field_value(value: bytes, leadspc: bool) -> bytes:
    """A header value as sent by the MTA, as it is in the message: with its leading space
    (the MTA removes it unless HDR_LEADSPC was agreed), its line breaks CRLF."""
    if b"\n" in value:  # a folded field (most are not)
        value = value.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
    return value if leadspc else b" " + value


class Message:
    """One message as the MTA sends it, assembled as it will deliver it: each field
    ``Name:value`` CRLF, a blank line, the body as sent (CRLF lines). ``limit``: the
    most bytes held; past it the rest is counted, not kept (:attr:`over`)."""

    def __init__(self, limit):
        self.limit = limit
        self.names = []  # each field's name, in order
        self.lines = []  # each field as it is in the message: Name:value CRLF
        self.body = []
        self.size = 2  # the blank line
        self.over = False
        self.sender = None
        self.rcpts = []  # the first MAX_RCPTS
        self.more_rcpts = 0  # the others, counted

    def _grow(self, n) -> bool:
        self.size += n
        if self.size > self.limit:
            self.over, self.names, self.lines, self.body = True, [], [], []
        return not self.over

    def add_header(self, data: bytes, leadspc: bool):
        """The field of an ``L`` packet (:func:`header`), as it will be in the message."""
        name, value = header(data)
        value = field_value(value, leadspc)
        if self._grow(len(name) + len(value) + 3):
            self.names.append(name)
            self.lines.append(b"%s:%s\r\n" % (name, value))

    def add_rcpt(self, address: str):
        if len(self.rcpts) < MAX_RCPTS:
            self.rcpts.append(address)
        else:
            self.more_rcpts += 1

    def rcpt_list(self) -> str:
        """The recipients, comma-separated (``...,+N more`` past :data:`MAX_RCPTS`)."""
        return ",".join(self.rcpts) + (f",+{self.more_rcpts} more" if self.more_rcpts else "")

    def add_body(self, chunk: bytes):
        if chunk and self._grow(len(chunk)):
            self.body.append(chunk)

    def raw(self) -> bytes:
        return b"".join(self.lines) + b"\r\n" + b"".join(self.body)

    def indexes(self, wanted) -> list[tuple[int, bytes]]:
        """``(index, name)`` of each field called one of ``wanted`` (names as lower-case
        bytes; any case in the message), its index among the fields of its name from 1,
        last first (removing one then leaves the indexes of those before it as they were)."""
        seen, found = {}, []
        for name in self.names:
            low = name.lower()  # (ASCII case: a wanted name is ASCII, no other folds into one)
            if low in wanted:  # only the wanted names are counted: indexes are per name
                seen[low] = seen.get(low, 0) + 1
                found.append((seen[low], name))
        return found[::-1]


def line_fields(lines: list[bytes], leadspc: bool) -> list[tuple[bytes, bytes]]:
    """A verdict's header lines (``Name: value``, without line ends; a folded field's
    continuation lines separate items starting with a tab: :func:`spamnb.verdict.header_lines`)
    as ``(name, value)`` for SMFIR_ADDHEADER: line breaks LF (as libmilter's
    smfi_addheader takes a folded value), the leading space as agreed."""
    fields = []
    for line in lines:
        if line[:1] in (b" ", b"\t") and fields:
            fields[-1][1] += b"\n" + line
            continue
        name, _, value = line.partition(b":")
        fields.append([name, value if leadspc else value.lstrip(b" ")])
    return [(n, v) for n, v in fields]
