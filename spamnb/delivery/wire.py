"""The filter server's wire format, and the socket checks both ends make.

Standard library only, and only the cheap parts of it: the client side runs
inside ``spamnb filter``'s fast path, where ``json`` (which pulls in ``re`` and
``enum``) and ``socket`` (``selectors``, ``enum``) would cost more than the
round trip itself (``tools/benchmarks/bench_filter.py`` measures a delivery). So the framing is
fixed-size ``struct`` fields and the socket is ``_socket``'s.

One request and one reply per connection, over a Unix stream socket
(integers little-endian)::

    request:  b"SPNB\x03"
              uint8 mask (bit i: decision value i given)
              uint8 flags (1: allow insecure model, 2: learn the message as its verdict, as filter -u)
              uint16 model path length  uint16 model name length  uint64 message length
              float64[N] the decision's values, in the order of spamnb.verdict.DECISION_OPTIONS
              model path (file-system encoding)  model name (UTF-8)  the raw message
    reply:    b"SPNB\x03"  uint8 status  uint8 label (its exit status: 0 spam, 1 ham, 2 unsure)
              uint16 reason length  uint64 insertion offset  uint64 block length
              reason (UTF-8)  the verdict block (the header lines to insert, line ends included)

Status ``OK`` carries where the verdict goes and what it is, never message
bytes: the client inserts the block into the message it holds
(:func:`spamnb.verdict.is_verdict_block` checks it is only spamnb's header
lines), so a broken or hostile server cannot change a byte of the mail; ``DECLINED`` (model not served
here, model unreadable, options the server does not handle, request too
large...) tells the client to do the work itself. The client also does it on
any socket error, timeout or malformed reply: the server is only ever a
shortcut, never a place where mail can be lost.

A request with the learn flag is learned by the server before it replies
``OK`` (``filter -u`` then starts no numpy of its own); an ``OK`` with a reason
means the verdict stands but the message could not be learned (the reason
says why, and the client reports it as the click command would).
"""

import os
import stat
import struct
import time  # loaded by the interpreter's own start-up: free here

from spamnb.verdict import DECISION_OPTIONS, EXIT_CODES, MODELS_OWN, Decision

MAGIC = b"SPNB\x03"
_REQUEST = struct.Struct(f"<BBHHQ{len(DECISION_OPTIONS)}d")
_REPLY = struct.Struct("<BBHQQ")
OK, DECLINED = 0, 1
# A label travels as the filter's exit status for it.
_LABEL_OF_CODE = {code: label for label, code in EXIT_CODES.items()}
# SO_PEERCRED's struct ucred: pid, uid, gid.
_UCRED = struct.Struct("3i")


#: Where each setting that travels with a message (the rows of
#: :data:`spamnb.options.TABLE` with ``travels``, by name) is in a request: a field of
#: :func:`read_request_head`'s header, and its index in a list field.
FIELDS = {**{name: ("decision", i) for i, name in enumerate(DECISION_OPTIONS)},
          "allow_insecure_model": ("allow_insecure", None), "learn_": ("learn", None)}


class WireError(Exception):
    """A malformed, truncated or oversized message on the socket."""


class TooLarge(WireError):
    """A request announcing a message over the server's limit; ``size``: its length."""

    def __init__(self, text, size):
        super().__init__(text)
        self.size = size


def recv_exact(sock, n: int, deadline: float | None = None) -> bytes:
    """Exactly ``n`` bytes from ``sock``; WireError if the peer closes first, or
    when ``deadline`` (a ``time.monotonic()`` value) passes first.

    The buffer grows with what arrives (a chunk of at most 1 MB at a time),
    never to the announced size up front: a peer announcing 64 MB and sending
    nothing costs nothing.
    """
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            _wait_at_most(sock, deadline)
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise WireError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def _wait_at_most(sock, deadline):
    """Let the next receive wait only until ``deadline``: a client sending a byte now
    and then cannot hold the server's thread longer than the request's time limit."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise WireError("timed out: the request took too long to arrive")
    sock.settimeout(left)


def encode_request(model: str, name: str, decision, body: bytes, *, allow_insecure=False,
                   learn=False) -> list[bytes]:
    """The request for ``body`` under ``decision`` (a :class:`spamnb.verdict.Decision`;
    None: the model's own cut-offs)."""
    path, text = os.fsencode(model), name.encode("utf-8", "surrogatepass")
    decision = (decision or MODELS_OWN).values
    mask = sum(1 << i for i, v in enumerate(decision) if v is not None)
    values = [0.0 if v is None else float(v) for v in decision]
    flags = (1 if allow_insecure else 0) | (2 if learn else 0)
    head = _REQUEST.pack(mask, flags, len(path), len(text), len(body), *values)
    return [MAGIC + head + path + text, body]


def encode_settings(model: str, name: str, body: bytes, values: dict) -> list[bytes]:
    """The request for ``body`` with the settings ``values`` (``{name: value}`` of
    :data:`FIELDS`; one it cannot carry is a ValueError)."""
    unknown = set(values) - set(FIELDS)
    if unknown:
        raise ValueError(f"the request has no field for {', '.join(sorted(unknown))}")
    return encode_request(model, name, Decision.of(values), body,
                          allow_insecure=bool(values.get("allow_insecure_model")), learn=bool(values.get("learn_")))


def settings_of(header: dict) -> dict:
    """``{name: value}`` of the settings a request's ``header`` carries (:data:`FIELDS`)."""
    return {name: header[field] if i is None else header[field].values[i] for name, (field, i) in FIELDS.items()}


def read_request_head(sock, max_body: int, deadline: float | None = None) -> tuple[dict, int]:
    """The request's fields and body length; WireError when malformed or over ``max_body``."""
    pre = recv_exact(sock, len(MAGIC) + _REQUEST.size, deadline)
    if pre[:len(MAGIC)] != MAGIC:
        raise WireError("not a spamnb request")
    mask, flags, plen, nlen, blen, *values = _REQUEST.unpack(pre[len(MAGIC):])
    if blen > max_body:
        raise TooLarge(f"message of {blen} bytes is over the server's limit of {max_body}", blen)
    rest = recv_exact(sock, plen + nlen, deadline)
    header = {"model": os.fsdecode(rest[:plen]), "name": rest[plen:].decode("utf-8", "surrogatepass"),
              "allow_insecure": bool(flags & 1), "learn": bool(flags & 2),
              "decision": Decision(v if mask >> i & 1 else None for i, v in enumerate(values))}
    return header, blen


def encode_reply(status: int, label: str | None = None, pos: int = 0, block: bytes = b"",
                 reason: str = "") -> list[bytes]:
    text = reason.encode("utf-8", "replace")[:60000]
    code = EXIT_CODES.get(label, 255)
    return [MAGIC + _REPLY.pack(status, code, len(text), pos, len(block)) + text, block]


def read_reply(sock, max_block: int = 1 << 20) -> tuple[int, str | None, int, bytes, str]:
    """``(status, label, pos, block, reason)`` of a reply; WireError when malformed."""
    pre = recv_exact(sock, len(MAGIC) + _REPLY.size)
    if pre[:len(MAGIC)] != MAGIC:
        raise WireError("not a spamnb reply")
    status, code, rlen, pos, blen = _REPLY.unpack(pre[len(MAGIC):])
    if blen > max_block:
        raise WireError(f"a verdict block of {blen} bytes")
    reason = recv_exact(sock, rlen).decode("utf-8", "replace")
    block = recv_exact(sock, blen)
    return status, _LABEL_OF_CODE.get(code), pos, block, reason


def send_all(sock, parts) -> None:
    for part in parts:
        if part:
            sock.sendall(part)


def peer_credentials(sock) -> tuple[int, int, int]:
    """``(pid, uid, gid)`` of the process at the other end of a Unix socket (SO_PEERCRED)."""
    import _socket

    return _UCRED.unpack(sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, _UCRED.size))


def peer_uid(sock) -> int:
    """The user id of the process at the other end of a Unix socket (SO_PEERCRED)."""
    return peer_credentials(sock)[1]


def private_socket_dir(path: str) -> bool:
    """Whether the socket at ``path`` is ours: the socket file and its folder owned
    by us, the folder mode 0700 (nobody else can connect, plant or swap it)."""
    try:
        st = os.lstat(path)
        dst = os.lstat(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return False
    uid = os.geteuid()
    return (stat.S_ISSOCK(st.st_mode) and st.st_uid == uid and stat.S_ISDIR(dst.st_mode)
            and dst.st_uid == uid and stat.S_IMODE(dst.st_mode) & 0o077 == 0)
