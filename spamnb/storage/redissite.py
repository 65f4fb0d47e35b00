"""The site in the store: every host's heartbeat, and what the Sentinels say of the store
(what the Site view of ``spamnb web --store`` shows).

Each ``spamnb serve`` (its socket, ``--spamd`` and ``--milter``) and ``spamnb imap filter --watch``
that uses a store beats from a thread of its own (:class:`Heartbeat`) every
:data:`BEAT` seconds: one script call (:data:`BEAT_SCRIPT`) that writes what it has
counted since it started (:class:`spamnb.delivery.events.Counts`, the counts its
metrics read). Never per message and never on the delivery's path: a delivery costs
what it cost. A store that does not answer loses that beat; the log says so once, and
once again when it answers.

Layout, under the store's prefix P (a beating process is "HOST ROLE": ``mx1 serve``,
``mx1 imap alice``, so that a host running both, or one ``imap filter`` per account,
has a row for each)::

    P site              sorted set: "HOST ROLE" -> time of its last beat: the page's
                        index (the keyspace is never scanned), newest first, bounded by
                        what it asks; each beat drops the members silent for :data:`TTL`
    P site:HOST ROLE    hash: :data:`FIELDS`, written whole by each beat

Each key has a TTL of :data:`TTL` (a day) renewed by each beat: a host gone for good
leaves the store a day after its last beat; nothing here lives without one under a
``volatile-*`` maxmemory policy.

Why a hash per host and an index rather than one hash with a field per host: Redis 7.0
has no TTL per field, so a host gone for good would stay as long as any other beats;
and the page reads at most :data:`MAX_HOSTS` of them, newest first, by a range of the
index, where a hash of every host ever seen would be read whole.

Everything read back is checked and clipped (:func:`checked`): the store is writable by
any host with its password, so a host name or a count is hostile input.
"""

from __future__ import annotations

import collections
import math
import threading
import time
import unicodedata

from spamnb.storage.redishistory import host_name
from spamnb.storage.redisstore import sentinel_address
from spamnb.storage.store import ModelError

#: seconds between two beats of a process
BEAT = 10.0
#: seconds a heartbeat's keys live after its last beat (and its member in the index)
TTL = 86400
#: seconds a row of the page stays after its host's last beat
SHOWN = 3600
#: the most hosts the page shows (the newest beats)
MAX_HOSTS = 50
#: beats missed before a host is silent: up while its last beat is younger than this many beats
UP_BEATS = 3
#: seconds of counts behind a host's "messages a minute"
MINUTE = 60.0
#: the counts a beat holds, from :meth:`spamnb.delivery.events.Counts.snapshot`
COUNTS = ("ham", "unsure", "spam", "unscanned", "errors", "learned", "forgotten")
#: every field of a host's hash: who, since when, its last beat (``every``: its interval;
#: ``stopped``: when it stopped, 0 while it runs), its counts since it started, and the
#: time and messages of a beat about a minute before (``then``, ``then_messages``)
FIELDS = ("host", "role", "version", "started", "beat", "every", "stopped", *COUNTS, "then", "then_messages")
#: a text of the store shown at most this long (characters)
LONGEST = 80

#: KEYS: the index, the host's hash. ARGV: the member, now, TTL (s), then field, value... .
#: Writes the hash whole, its TTL, the member's time; drops members silent for the TTL
#: (at most 100 a beat). Only HSET, EXPIRE, ZADD, ZRANGEBYSCORE and ZREM: commands the
#: documented ACL user already has.
BEAT_SCRIPT = r"""
local now, ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('HSET', KEYS[2], unpack(ARGV, 4))
redis.call('EXPIRE', KEYS[2], ttl)
redis.call('ZADD', KEYS[1], now, ARGV[1])
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - ttl), 'LIMIT', 0, 100)
for _, old in ipairs(gone) do redis.call('ZREM', KEYS[1], old) end
redis.call('EXPIRE', KEYS[1], ttl)
return #gone
"""


def index_key(backend) -> bytes:
    return backend.prefix + b"site"


def host_key(backend, member) -> bytes:
    """The key of the hash of ``member`` (``HOST ROLE``: a text, or the index's bytes as read)."""
    return backend.prefix + b"site:" + (member if isinstance(member, bytes) else member.encode("utf-8", "replace"))


def totals(snapshot) -> dict:
    """The heartbeat's counts (:data:`COUNTS`) of a :meth:`~spamnb.delivery.events.Counts.snapshot`:
    messages by verdict (every way in), unscanned, errors of every kind, learns, forgets."""
    out = dict.fromkeys(COUNTS, 0)
    for (label, _via), n in snapshot["messages"].items():
        if label in out:
            out[label] += n
    out["unscanned"] = sum(snapshot["unscanned"].values())
    out["errors"] = sum(snapshot["errors"].values())
    out["learned"] = sum(snapshot["learned"].values())
    out["forgotten"] = sum(snapshot["forgotten"].values())
    return out


class Heartbeat:
    """A process's beat into the store of ``backend`` (a
    :class:`spamnb.storage.redisstore.RedisBackend`) every ``every`` seconds, from a thread
    of its own, of ``counts`` (a :class:`spamnb.delivery.events.Counts`) under the name
    ``role`` (``serve``, ``imap LOGIN``). :meth:`start` it; :meth:`close` writes a last
    beat saying it stopped."""

    def __init__(self, backend, counts, role, *, every=BEAT, log=None, host=None):
        from spamnb import __version__

        self.backend, self.counts, self.every = backend, counts, float(every)
        self.log = log or (lambda text: None)
        self.host = host or host_name()
        self.role = role
        self.member = f"{self.host} {role}"
        self.keys = [index_key(backend), host_key(backend, self.member)]
        self.version = __version__
        self.script = backend.client.register_script(BEAT_SCRIPT)  # the primary: a beat is a write
        self.seen = collections.deque([(counts.started, 0)])  # (time, messages) of the last minute's beats
        self.failing = False
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="spamnb-heartbeat", daemon=True)

    def start(self) -> "Heartbeat":
        self.thread.start()
        return self

    def fields(self, now, stopped=0.0) -> dict:
        """What a beat at ``now`` writes (:data:`FIELDS`)."""
        n = totals(self.counts.snapshot())
        messages = n["ham"] + n["unsure"] + n["spam"]
        self.seen.append((now, messages))
        while len(self.seen) > 1 and self.seen[1][0] <= now - MINUTE:  # keep the newest beat a minute old
            self.seen.popleft()
        then, then_messages = self.seen[0]
        return {"host": self.host, "role": self.role, "version": self.version, "started": repr(self.counts.started),
                "beat": repr(now), "every": repr(self.every), "stopped": repr(stopped), **n, "then": repr(then),
                "then_messages": then_messages}

    def beat(self, stopped=False):
        """One beat now: one script call on the primary; StoreUnavailable when the store fails
        (not noted as the store's answer: its gauges report the reads)."""
        now = time.time()
        pairs = [v for k, x in self.fields(now, now if stopped else 0.0).items() for v in (k, x)]
        self.backend.ask("write the heartbeat", self.script, keys=self.keys,
                         args=[self.member, repr(now), TTL, *pairs], note=False)

    def _run(self):
        while not self.stopping.is_set():
            self._beat_once()
            self.stopping.wait(self.every)

    def _beat_once(self, stopped=False):
        try:
            self.beat(stopped)
        except (ModelError, ValueError) as exc:
            if not self.failing:
                self.log(f"heartbeat: not written (and none until the store answers): {exc}")
            self.failing = True
            return
        if self.failing:
            self.log("heartbeat: the store answers again")
        self.failing = False

    def close(self, wait=5.0):
        """Stop beating, then write one last beat saying when it stopped (what the page shows
        as "stopped" rather than "silent"). A beat still under way after ``wait`` seconds (a
        store that hangs) is left alone, with no last beat beside it: the host then goes silent."""
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join(wait)
            if self.thread.is_alive():
                return
        self._beat_once(stopped=True)


# -- reading: what the page shows ------------------------------------------------------------


def clip(value, longest=LONGEST) -> str:
    """A text of the store as it may be shown: UTF-8 (bytes that are not: U+FFFD), every
    control or format character (a line break, an escape, a bidi override) as U+FFFD, at
    most ``longest`` characters (then an ellipsis). Escaping for HTML is the page's."""
    if isinstance(value, bytes):
        value = value[:longest * 4 + 4].decode("utf-8", "replace")
    text = "".join("\ufffd" if unicodedata.category(c)[0] == "C" else c for c in str(value)[:longest + 1])
    return text if len(text) <= longest else text[:longest - 1] + "\u2026"


def count(value):
    """A count of the store: a whole number of at most 15 digits, else None (shown as such)."""
    try:
        text = value.decode("ascii") if isinstance(value, bytes) else value
    except UnicodeDecodeError:
        return None
    return int(text) if isinstance(text, str) and text.isdigit() and len(text) <= 15 else None


def moment(value):
    """A time of the store (seconds since the epoch) a page can show, else None."""
    try:
        t = float(value.decode("ascii") if isinstance(value, bytes) else value)
    except (ValueError, TypeError, UnicodeDecodeError, AttributeError):
        return None
    return t if math.isfinite(t) and 0 <= t < 1e11 else None


def checked(member, score, values, now) -> dict:
    """One host's row of the page: its member and index time, and its hash's ``values``
    (:data:`FIELDS`, None where missing) checked: texts clipped, numbers that are not
    None, and what follows from them: ``up`` (its last beat younger than
    :data:`UP_BEATS` beats, and not stopped), ``per_minute`` (messages a minute
    between the beat about a minute before and the last, None when not up)."""
    raw = dict(zip(FIELDS, values))
    host, _, role = (member.decode("utf-8", "replace") if isinstance(member, bytes) else member).partition(" ")
    r = {"host": clip(raw["host"] if raw["host"] is not None else host), "role": clip(raw["role"] or role),
         "version": clip(raw["version"] or "", 40), "started": moment(raw["started"]),
         "beat": moment(raw["beat"]) or moment(score), "every": moment(raw["every"]) or BEAT,
         "stopped": moment(raw["stopped"]) or None, "missing": raw["beat"] is None}
    r.update((k, count(raw[k])) for k in COUNTS)
    r["every"] = min(max(r["every"], 1.0), 3600.0)
    age = now - r["beat"] if r["beat"] is not None else math.inf
    r["up"] = r["stopped"] is None and age <= UP_BEATS * r["every"]
    r["per_minute"] = None
    then, then_n = moment(raw["then"]), count(raw["then_messages"])
    n = [r[k] for k in ("ham", "unsure", "spam")]
    if r["up"] and then is not None and then_n is not None and None not in n and r["beat"] - then >= 1:
        r["per_minute"] = max(0.0, (sum(n) - then_n) * 60.0 / (r["beat"] - then))
    return r


def hosts(backend, now=None, *, within=SHOWN, most=MAX_HOSTS):
    """``(rows, more)``: the hosts that beat in the last ``within`` seconds, newest beat first,
    at most ``most`` (:func:`checked` rows); ``more``: whether others beat too. Two round trips,
    read-only, where classification reads (a Sentinel group's replicas: they answer while a
    failover replaces the primary); StoreUnavailable when the store fails."""
    now = time.time() if now is None else now
    client = backend.reader
    found = backend.ask("read the heartbeats", client.zrevrangebyscore, index_key(backend), "+inf",
                          repr(now - within), start=0, num=most + 1, withscores=True)
    shown = found[:most]
    pipe = client.pipeline(transaction=False)
    for member, _ in shown:
        pipe.hmget(host_key(backend, member), FIELDS)
    values = backend.ask("read the heartbeats", pipe.execute) if shown else []
    return [checked(m, s, v, now) for (m, s), v in zip(shown, values)], len(found) > most


# -- the store's servers: as the Sentinels see them, or one Redis's role --------------------------


def pairs(reply) -> dict:
    """A Sentinel's state of a server (RESP2's flat list or RESP3's map) as ``{name: text}``."""
    if isinstance(reply, dict):
        items = reply.items()
    elif isinstance(reply, (list, tuple)):
        items = zip(reply[0::2], reply[1::2])
    else:
        raise ValueError("not a server's state")
    return {clip(k, 40): v for k, v in items}


def server(state) -> dict:
    """A server as a Sentinel reports it: address, flags, and whether it is up (no
    ``s_down``, ``o_down`` or ``disconnected`` flag)."""
    s = pairs(state)
    flags = clip(s.get("flags", b"?"))
    return {"address": f"{clip(s.get('ip', b'?'), 60)}:{clip(s.get('port', b'?'), 8)}", "flags": flags,
            "up": not {"s_down", "o_down", "disconnected"} & set(flags.split(","))}


def one_sentinel(client, service):
    """What one Sentinel says of ``service``: ``{"primary": server, "replicas": [server]}``,
    or ``{"error": text}`` when it does not answer (or answers what no Sentinel answers)."""
    try:
        primary = client.execute_command("SENTINEL", "MASTER", service)
        replicas = client.execute_command("SENTINEL", "REPLICAS", service)
        return {"primary": server(primary), "replicas": [server(r) for r in list(replicas)[:MAX_HOSTS]]}
    except Exception as exc:  # noqa: BLE001 - redis-py's, a malformed reply: said on the page, one line
        return {"error": clip(f"{exc.__class__.__name__}: {exc}", 200)}


def servers(backend):
    """The store's servers, read-only, never raising: for a Sentinel URL ``{"service",
    "sentinels": [(address, view)]}`` (:func:`one_sentinel`'s view of each Sentinel, asked
    at once, each within the URL's timeout); for one Redis ``{"role": text}`` (INFO's
    replication role) or ``{"error": text}``."""
    group = getattr(backend, "sentinel", None)
    if group is None:
        try:
            info = backend.ask("read the store's role", backend.client.info, "replication")
        except ModelError as exc:
            return {"error": clip(str(exc), 300)}
        return {"role": clip(info.get("role", "?")), "replicas": count(str(info.get("connected_slaves", "")))}
    sentinels, service = group
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=len(sentinels.sentinels) or 1) as pool:
        views = list(pool.map(lambda c: one_sentinel(c, service), sentinels.sentinels))
    names = [clip(sentinel_address(c), 60) for c in sentinels.sentinels]
    return {"service": clip(service), "sentinels": list(zip(names, views))}
