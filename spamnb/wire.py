"""The filter server's wire format, and the socket checks both ends make.

Standard library only: the client side runs inside ``spamnb filter``'s fast path.

One request and one reply per connection, over a Unix stream socket::

    request:  b"SPNB" version(1 byte)  uint32 header length  uint64 body length   (little-endian)
              header (UTF-8 JSON: model path and name, decision options)  body (the raw message)
    reply:    b"SPNB" version  uint8 status  uint32 header length  uint64 body length
              header (JSON: {"label": ...} or {"reason": ...})  body (the filtered message)

Status ``OK`` carries the filtered message; ``DECLINED`` (model not served
here, model unreadable, options the server does not handle, request too
large...) tells the client to do the work itself. The client also does it on
any socket error, timeout or malformed reply: the server is only ever a
shortcut, never a place where mail can be lost.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import struct

MAGIC = b"SPNB\x01"
_REQUEST = struct.Struct("<IQ")
_REPLY = struct.Struct("<BIQ")
OK, DECLINED = 0, 1
# Headers are a few hundred bytes; anything bigger is not from our client.
MAX_HEADER = 65536
# SO_PEERCRED's struct ucred: pid, uid, gid.
_UCRED = struct.Struct("3i")


class WireError(Exception):
    """A malformed, truncated or oversized message on the socket."""


def recv_exact(sock, n: int) -> bytes:
    """Exactly ``n`` bytes from ``sock``; WireError if the peer closes first."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], min(n - got, 1 << 20))
        if k == 0:
            raise WireError(f"connection closed after {got} of {n} bytes")
        got += k
    return bytes(buf)


def encode_request(header: dict, body: bytes) -> list[bytes]:
    text = json.dumps(header).encode("utf-8")
    return [MAGIC + _REQUEST.pack(len(text), len(body)) + text, body]


def read_request_head(sock, max_body: int) -> tuple[dict, int]:
    """The request's header and body length; WireError when malformed or over ``max_body``."""
    pre = recv_exact(sock, len(MAGIC) + _REQUEST.size)
    if pre[:len(MAGIC)] != MAGIC:
        raise WireError("not a spamnb request")
    hlen, blen = _REQUEST.unpack(pre[len(MAGIC):])
    if hlen > MAX_HEADER:
        raise WireError(f"request header of {hlen} bytes")
    if blen > max_body:
        raise WireError(f"message of {blen} bytes is over the server's limit of {max_body}")
    try:
        header = json.loads(recv_exact(sock, hlen))
    except ValueError:
        raise WireError("request header is not JSON") from None
    if not isinstance(header, dict):
        raise WireError("request header is not an object")
    return header, blen


def encode_reply(status: int, header: dict, body: bytes = b"") -> list[bytes]:
    text = json.dumps(header).encode("utf-8")
    return [MAGIC + _REPLY.pack(status, len(text), len(body)) + text, body]


def read_reply(sock) -> tuple[int, dict, bytes]:
    pre = recv_exact(sock, len(MAGIC) + _REPLY.size)
    if pre[:len(MAGIC)] != MAGIC:
        raise WireError("not a spamnb reply")
    status, hlen, blen = _REPLY.unpack(pre[len(MAGIC):])
    if hlen > MAX_HEADER:
        raise WireError("reply header too large")
    header = json.loads(recv_exact(sock, hlen))
    return status, header, recv_exact(sock, blen)


def send_all(sock, parts) -> None:
    for part in parts:
        if part:
            sock.sendall(part)


def peer_uid(sock) -> int:
    """The user id of the process at the other end of a Unix socket (SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    return _UCRED.unpack(creds)[1]


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
