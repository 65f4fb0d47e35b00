"""Who may do what, at every door of ``spamnb serve`` and ``spamnb web``: one rule.

A door is a listener: :data:`SOCKET` (serve's private socket, for ``spamnb filter``),
:data:`SPAMD` (``--spamd``, TCP or Unix), :data:`METRICS` (``--metrics``) and
:data:`WEB` (the review page). Each builds a :class:`Peer` of a connection (the door;
the user of a process on this machine; the address of a TCP peer; whether it showed
the page's key and the form's token) and asks its :class:`Rules` before it acts:
``rules.allows(peer, ACTION)``, or ``rules.refusal(...)`` for the reason. The rule,
action by action (every action needs :data:`CONNECT` first):

=============  =====================  ==========================  ==============  ==================
action         private socket         spamd                       metrics         page
=============  =====================  ==========================  ==============  ==================
CONNECT        the server's own user  TCP: loopback and           loopback and    loopback and
               (``SO_PEERCRED``)      ``--allow``; Unix: whoever  ``--metrics-    ``--allow``
                                      its mode lets in            allow``
CHECK          connected              connected                   -               -
LEARN_OWN      connected (``-u``)     with ``--allow-tell``       -               -
LEARN_SHARED   connected              with ``--allow-tell-        -               -
                                      served`` as well
NAME_USER      -                      a peer on this machine: its -               -
                                      own user, unless root, the
                                      server's user, a system
                                      account (an MTA's) or one
                                      of ``trusted_users``;
                                      another host: as sent
READ_METRICS   -                      -                           connected       -
READ_PAGE      -                      -                           -               the page's key
TEACH_PAGE     -                      -                           -               the key and the
                                                                                  form's CSRF token
=============  =====================  ==========================  ==============  ==================

The milter door (``--milter``) is spamd's column without TELL: its MTAs connect from
loopback and ``--allow`` (the same list: the hosts whose mail spamnb may scan are the
site's MTAs, whichever protocol they speak), or through a Unix socket's mode; the
recipient names the user (:data:`NAME_USER`, asked as of spamd's ``User:``: an MTA runs
as a system account, which may name anyone); refused, the served model scores.

A peer is on this machine when it comes over a Unix socket, or over TCP from one
of this machine's own addresses (loopback or any other, :func:`is_local_address`):
its user is then the kernel's (``SO_PEERCRED``; for TCP the socket table, as identd
reads it, :func:`tcp_peer_uid`), and one the kernel cannot name (a client that reset
its connection) is :data:`UNKNOWN_PEER`, who may name no user. A peer on another
host is trusted for ``User:``, as spamd trusts the addresses ``--allow`` admits.
:data:`NAME_USER` is asked of a spamd request that names a user (``User:``,
``spamc -u``) with a model of their own, whatever its method (that model would
score, learn and list its tokens), and of every ``TELL``; a user without a model
is scored by the served model, as anyone is, without asking (the history then
records the name as sent).

**Shares.** No one client holds more than a share of a listener's connections
(:func:`share`, half its cap): a client is its :func:`holder`, the user of a
process on this machine (whichever address it connects from), the address of
another host; so one user's flood of idle connections leaves the others served.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import ipaddress
import os
import pwd
import socket
import struct

from spamnb import checks
from spamnb.delivery import wire

#: The doors.
SOCKET, SPAMD, MILTER, METRICS, WEB = "socket", "spamd", "milter", "metrics", "web"
#: The actions.
CONNECT = "connect"  # be accepted at all (checked before a byte is read)
CHECK = "check"  # have a message scored
LEARN_OWN = "learn_own"  # learn into one's own model (TELL with a model of one's own, filter -u)
LEARN_SHARED = "learn_shared"  # learn into the served model, which scores everyone without one
NAME_USER = "name_user"  # act for a named user (spamd's User:, any method)
READ_METRICS = "read_metrics"
READ_PAGE = "read_page"
TEACH_PAGE = "teach_page"  # learn from the page's form

#: The actions each door offers; any other is refused there.
OFFERED = {
    SOCKET: {CONNECT, CHECK, LEARN_OWN, LEARN_SHARED},
    SPAMD: {CONNECT, CHECK, LEARN_OWN, LEARN_SHARED, NAME_USER},
    MILTER: {CONNECT, CHECK, NAME_USER},
    METRICS: {CONNECT, READ_METRICS},
    WEB: {CONNECT, READ_PAGE, TEACH_PAGE},
}

LOOPBACK = checks.loopback()
#: A peer on this machine whose user cannot be told: it may name no user.
UNKNOWN_PEER = -1


class Peer:
    """Who is at the other end of one connection, as far as its door can tell.

    ``address``: a TCP peer's IP address (an IPv4 client of a dual-stack socket as its
    IPv4 address), None over a Unix socket. :attr:`uid`: the user of a process on this
    machine, :data:`UNKNOWN_PEER` for one the kernel cannot name, None for a peer on
    another host; it is looked up the first time it is asked (over TCP a scan of the
    kernel's whole socket table: only the rules that need it ask). ``key``: the page's
    key (or the printed token) was shown; ``csrf``: the form's CSRF token was."""

    def __init__(self, door, *, address=None, uid=None, find_uid=None, key=False, csrf=False):
        self.door = door
        self.address = address
        self.key = key
        self.csrf = csrf
        self._uid = uid
        self._find_uid = find_uid

    @classmethod
    def unix(cls, door, conn):
        """The peer of a Unix socket: its user from ``SO_PEERCRED``."""
        return cls(door, find_uid=lambda: wire.peer_uid(conn))

    @classmethod
    def tcp(cls, door, client_address, conn=None, **shown):
        """The peer at ``client_address`` (as accept() gave it) of TCP connection ``conn``:
        its user, when asked, from :func:`tcp_peer_uid` (without ``conn``, one that cannot
        be told: :data:`UNKNOWN_PEER`, never another host's)."""
        if conn is None:
            return cls(door, address=client_ip(client_address) or "", uid=UNKNOWN_PEER, **shown)
        return cls(door, address=client_ip(client_address) or "",
                   find_uid=lambda: tcp_peer_uid(conn, client_address), **shown)

    @property
    def uid(self):
        if self._find_uid is not None:
            self._uid, self._find_uid = self._find_uid(), None
        return self._uid


@dataclasses.dataclass(frozen=True)
class Rules:
    """One listener's settings of the rule: ``networks`` a TCP peer must come from
    (loopback and ``--allow``), ``owner`` the server's user (None: this process's
    effective user when asked), ``tell`` (``--allow-tell``) and ``tell_served``
    (``--allow-tell-served``); ``trusted``: the names of the users who may name any user
    from this machine besides root, the server's user and the system's accounts
    (``--spamd-trusted-user``: a person's account an MTA runs as)."""

    networks: tuple = LOOPBACK
    owner: int | None = None
    tell: bool = False
    tell_served: bool = False
    trusted: tuple = ()

    def allows(self, peer: Peer, action: str, *, user=None) -> bool:
        return self.refusal(peer, action, user=user) is None

    def holder(self, peer: Peer):
        """:func:`holder` of ``peer``, or :data:`UNBOUND` for a user of this machine that no
        share binds: one who may act for anyone (:meth:`names_anyone`), as an MTA sends
        everyone's mail from one user."""
        uid = peer.uid
        if uid is not None and uid != UNKNOWN_PEER and self.names_anyone(uid):
            return UNBOUND
        return holder(peer)

    def names_anyone(self, uid) -> bool:
        """Whether the process user ``uid`` of this machine may act for any user: root, the
        server's user, the system's accounts (an MTA's: :func:`login_user`) and
        ``trusted`` (a person's account an MTA runs as, named by the admin)."""
        owner = os.geteuid() if self.owner is None else self.owner
        return uid in (0, owner) or not login_user(uid) or uid in _uids(self.trusted)

    def refusal(self, peer: Peer, action: str, *, user=None) -> str | None:
        """Why ``peer`` may not do ``action`` (for :data:`NAME_USER`: act for ``user``);
        None when it may."""
        if action not in OFFERED.get(peer.door, ()):
            return f"no {action} at the {peer.door} door"
        if peer.door == SOCKET:
            owner = os.geteuid() if self.owner is None else self.owner
            if peer.uid != owner:  # another user: the socket is the owner's alone
                return f"the connecting process runs as another user (uid {peer.uid})"
        elif peer.address is not None and not client_allowed((peer.address,), self.networks):
            return "not in the allowed networks"
        if action == CONNECT or action == CHECK or peer.door == SOCKET:
            return None  # (a Unix spamd socket: whoever its mode lets connect)
        if action == LEARN_OWN:
            return None if self.tell else "TELL is not enabled (--allow-tell)"
        if action == LEARN_SHARED:
            return None if self.tell and self.tell_served else "TELL into the served model is not enabled"
        if action == NAME_USER:
            return self._naming(peer.uid, user)
        if action == READ_METRICS:
            return None
        if action == READ_PAGE:
            return None if peer.key else "the page's key was not shown"
        if action == TEACH_PAGE:
            return None if peer.key and peer.csrf else "the form's CSRF token was not shown"
        return f"no {action} at the {peer.door} door"


    def _naming(self, uid, user):
        """Why a peer whose user is ``uid`` may not act for ``user``; None when it may."""
        if uid is None:
            return None  # another host: User: as sent, as spamd takes it from --allow's addresses
        if uid == UNKNOWN_PEER:
            return "the connecting process on this machine could not be identified (its socket is gone)"
        if self.names_anyone(uid) or (user is not None and user_name(uid) == user):
            return None
        return f"the connecting process runs as another user (uid {uid})"


#: The rule where nothing but the defaults apply: serve's private socket.
DEFAULT = Rules()


def allows(peer: Peer, action: str, *, user=None) -> bool:
    """:meth:`Rules.allows` under :data:`DEFAULT`."""
    return DEFAULT.allows(peer, action, user=user)


def login_user(uid) -> bool:
    """Whether ``uid`` is a person's account: within ``/etc/login.defs``' ``UID_MIN`` to
    ``UID_MAX`` (1000 to 60000 when it says nothing), the range ``useradd`` gives people.
    The others are the system's (an MTA's user, ``nobody``, a daemon's): no local person
    runs as one, and the mail system runs ``spamc -u RECIPIENT`` as one of them (Postfix's
    pipe as ``nobody``, Exim as ``Debian-exim``), so they may name any user, as root may."""
    low, high = _login_range()
    return low <= uid <= high


_LOGIN_RANGE = []


def _login_range():
    if not _LOGIN_RANGE:
        found = {"UID_MIN": 1000, "UID_MAX": 60000}
        try:
            with open("/etc/login.defs") as f:
                for line in f:
                    words = line.split()
                    if len(words) >= 2 and words[0] in found and words[1].isdigit():
                        found[words[0]] = int(words[1])
        except OSError:
            pass
        _LOGIN_RANGE.append((found["UID_MIN"], found["UID_MAX"]))
    return _LOGIN_RANGE[0]


@functools.lru_cache(maxsize=4096)
def user_name(uid):
    """The name of user ``uid`` (None: no such user), looked up once a process: the password
    database can take milliseconds (NSS), and a spamd request may ask it."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


@functools.lru_cache(maxsize=64)
def _uids(names) -> frozenset:
    """The uids of the users ``names`` (those that exist), looked up once a process."""
    found = set()
    for name in names:
        try:
            found.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            pass
    return frozenset(found)


# -- shares -----------------------------------------------------------------------------


#: The holder of a connection no share binds (:meth:`Rules.holder`): only the listener's cap does.
UNBOUND = ("unbound", None)


def share(cap):
    """The most connections one client (:func:`holder`) may hold of a listener's ``cap``:
    half of it (one, with a cap of one), so that no one client takes every slot."""
    return max(1, cap // 2)


def holder(peer: Peer):
    """Who holds ``peer``'s connection, for :func:`share`: ``("uid", N)`` for a process on
    this machine (its user, whichever of the machine's addresses it connects from; one
    the kernel cannot name is :data:`UNKNOWN_PEER`), ``("address", IP)`` for another host."""
    uid = peer.uid
    return ("address", peer.address) if uid is None else ("uid", uid)


# -- addresses -------------------------------------------------------------------------


def client_ip(client_address):
    """The client's IP address (``raddr=``); None on a Unix socket."""
    if isinstance(client_address, tuple) and client_address:
        ip = str(client_address[0])
        return ip[7:] if ip.startswith("::ffff:") else ip
    return None


def client_allowed(client_address, allowed) -> bool:
    """Whether a TCP client's address is in the ``allowed`` networks (an IPv4 client
    on an IPv6 socket as its IPv4 address)."""
    try:
        ip = ipaddress.ip_address(client_address[0])
    except ValueError:
        return False
    if ip.version == 6 and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return any(ip in net for net in allowed)


def is_local_address(host, own=None) -> bool:
    """Whether ``host`` (an IP address, an IPv6 one with its ``%scope``) is one of this
    machine's own addresses; ``own``: the connection's own local address, compared first.

    Asked of the kernel by binding a UDP socket to ``(host, 0)``: bind() succeeds for
    exactly the addresses the kernel takes as its own (those of every interface, and
    any its local routing table names), fails with EADDRNOTAVAIL for any other, and
    costs one socket and no packet. Comparing with the connection's own address alone
    is not enough: a local client may bind one of the host's addresses and connect to
    another (bind 192.0.2.2, connect to 127.0.0.1); listing the interfaces needs an
    ioctl per family or netlink, and misses the routing table's local ranges. Where
    the kernel lets any address be bound (``ip_nonlocal_bind``), every peer counts as
    local: its user is looked for in the socket table and, not found there, it may
    name no user: the rule fails closed. So does any other failure to ask."""
    ip = ipaddress.ip_address(host.split("%")[0])
    if ip.is_loopback or (own is not None and host == own):
        return True
    try:
        with socket.socket(socket.AF_INET if ip.version == 4 else socket.AF_INET6, socket.SOCK_DGRAM) as s:
            s.bind((host, 0))
    except OSError as exc:
        return exc.errno != errno.EADDRNOTAVAIL
    return True


def tcp_peer_uid(conn, client_address=None):
    """The local user of the peer of TCP connection ``conn`` when it is on this machine
    (:func:`is_local_address`; its user from the kernel's socket table, as identd reads
    it); None for a peer on another host; :data:`UNKNOWN_PEER` for one on this machine
    the table does not list (a client that reset its connection after sending)."""
    try:  # the address accept() gave: a reset connection has no peer name any more
        peer = client_address or conn.getpeername()
        ip = ipaddress.ip_address(peer[0].split("%")[0])
    except (OSError, ValueError):
        return UNKNOWN_PEER
    mapped = getattr(ip, "ipv4_mapped", None)  # an IPv4 client of a dual-stack socket
    try:
        mine = conn.getsockname()
    except OSError:
        mine = None
    host = str(mapped) if mapped else peer[0]
    own = None if mine is None else client_ip(mine)
    if not is_local_address(host, own):
        return None
    if mine is None:
        return UNKNOWN_PEER
    family = conn.family
    if mapped:  # listed in the IPv4 table
        family = socket.AF_INET
        peer, mine = (str(mapped), peer[1]), (str(ipaddress.ip_address(mine[0]).ipv4_mapped), mine[1])
    uid = local_peer_uid(family, peer, mine)
    return UNKNOWN_PEER if uid is None else uid


def local_peer_uid(family, peer, mine):
    """The uid owning the TCP socket at ``peer`` connected to ``mine``, from
    ``/proc/net/tcp`` (``tcp6`` for an AF_INET6 socket); None when it is not listed."""
    def hexed(address):
        if family == socket.AF_INET:
            raw = socket.inet_pton(socket.AF_INET, address[0])
        else:
            raw = socket.inet_pton(socket.AF_INET6, address[0].split("%")[0])
        words = struct.unpack(f"={len(raw) // 4}I", raw)  # each 32-bit word in host order
        return "".join(f"{w:08X}" for w in words) + f":{address[1]:04X}"

    try:
        want = f" {hexed(peer)} {hexed(mine)} ".encode()
        # /proc/self/net: /proc/net is hidden under systemd's ProcSubset=pid (the spamd unit's)
        with open("/proc/self/net/tcp" if family == socket.AF_INET else "/proc/self/net/tcp6", "rb") as f:
            table = f.read()
        # the pair looked for at C speed, not line by line: it is asked of every connection
        # naming a user, and of each one a flooded listener admits (:func:`holder`)
        at = table.find(want)
        if at < 0:
            return None
        fields = table[table.rfind(b"\n", 0, at) + 1:table.find(b"\n", at)].split()
        return int(fields[7]) if len(fields) > 7 else None
    except (OSError, ValueError):
        return None
