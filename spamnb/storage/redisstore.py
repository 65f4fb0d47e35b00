"""A model in Redis, shared by several mail hosts: the second :class:`Backend`.

Why: a site with two or three MX hosts runs a ``spamnb serve --spamd`` on each;
with model files, what a user teaches on one host the others never learn. Here
the counts, the learned messages' identities, the tokenizer settings and the
decision live in one Redis (or Valkey) that every host uses (docs/many-hosts.md).

Layout, under the URL's prefix P (``?prefix=``, default ``spamnb:``; a user's
model under ``P u:NAME:``)::

    P meta                hash: epoch (the model's id), settings (JSON: the model's
                          settings, the decision, the store's ageing rule), rev (the
                          settings' revision, new when ``cutoffs`` or ``prune``
                          change them in place, so that every reader that keeps
                          them, on any host, reads them again), counts
                          (5 doubles: messages per class N_c with refine()'s copies,
                          totals T_c = Σ_w n_cw, vocabulary size |V|)
    P EPOCH:b:K           token bucket K (K = token hash mod buckets): a hash whose
                          fields are 8-byte token hashes (the scorer's
                          :func:`~spamnb.storage.scorer.token_hash`) and whose values are
                          24 bytes (n_ham, n_spam as doubles, doc. frequency, last-seen
                          day) and the token's text when it has at most 40 bytes
    P EPOCH:long          the texts of longer tokens (kept apart so that every bucket
                          stays a small listpack: Redis converts a hash with a value
                          over 64 bytes to a hash table, about 3 times the memory)
    P EPOCH:r:K           learned messages: 16-byte identity -> class

Numbers are packed doubles, never Redis' float arithmetic (HINCRBYFLOAT prints
17 decimals and Lua's tostring 14 digits): what the file model holds, bit for bit.

One round trip per classification (:data:`READ`: the message's tokens and the
totals in one script call), one per learned message (:data:`LEARN`: a Lua script
that checks the message's identity and changes every count at once, so a message
told twice, from two hosts, is learned once). redis-py's ``Script`` sends EVALSHA
and loads the script again on NOSCRIPT (a restarted or flushed server).

Ageing, as ``prune``'s rule (old *and* rare: unseen for ``age_days`` and in at
most ``age_max_messages`` learned messages), is done when a bucket is written:
the learn script drops the bucket's tokens that rule drops and takes their counts
out of the totals (a marker per bucket says when the next one is due, so a write
costs a scan of the bucket only then). Every written bucket gets a TTL of
``keep_factor`` x ``age_days`` days, so nothing here lives without a TTL under a
``maxmemory`` volatile policy, and the keyspace is never scanned.

A new model (``store push``, ``train --store``) is written under a new epoch and
made current by one write of ``meta``; the old epoch's keys are removed after.
"""

from __future__ import annotations

import json
import math
import secrets
import struct
import time
import urllib.parse

from spamnb import checks
from spamnb.storage.backend import Backend, Edit, Status, StoreUnavailable, Writes
from spamnb.storage.scorer import Scorer, token_hash
from spamnb.storage.store import ModelError
from spamnb.verdict import LABELS

DEFAULT_PREFIX = "spamnb:"
#: seconds one request to the store may take (connect, or answer): a slow store is a
#: failed request, never a delivery held behind it (``?timeout=`` in the URL)
DEFAULT_TIMEOUT = 2.0
#: a new store's buckets: the vocabulary / this many tokens each (room to grow 4x
#: before Redis' hash-max-listpack-entries, 128, turns a bucket into a hash table)
TOKENS_PER_BUCKET = 32
MIN_BUCKETS = 64
REGISTRY_BUCKETS = 1024
#: prune's defaults (``spamnb prune``): old = unseen for 90 days, rare = in at most 1 message
AGE_DAYS = 90
AGE_MAX_MESSAGES = 1
#: a bucket nobody writes lives this many times age_days (days)
KEEP_FACTOR = 10
#: longer token texts go to the ``long`` hash
INLINE_TEXT = 40
#: messages whose class ``learned_as`` asks in one round trip
LOOKUPS = 500
VALUE = struct.Struct("<ddiI")
COUNTS = struct.Struct("<ddddd")
FORMAT = "spamnb-store"

# Shared by the scripts: the feature transform f(x) of the known tokens' counts tf,
# as spamnb.storage.scorer.feature_values computes it.
_LUA_FEATURES = r"""
local function fvalues(features, tfs)
  local out = {}
  local n = #tfs
  if features == 'counts' then
    for i = 1, n do out[i] = tfs[i] end
  elseif features == 'presence' then
    for i = 1, n do out[i] = 1.0 end
  elseif features == 'presence-l2' then
    for i = 1, n do out[i] = 1.0 / math.sqrt(n) end
  else -- logtf-l2
    local s = 0.0
    for i = 1, n do out[i] = math.log(1 + tfs[i]); s = s + out[i] * out[i] end
    local norm = math.sqrt(s)
    if norm == 0 then norm = 1.0 end
    for i = 1, n do out[i] = out[i] / norm end
  end
  return out
end
"""

# Drop a bucket's old and rare tokens (prune's rule) when its marker says one is due;
# returns the changes of T_ham, T_spam and |V|.
_LUA_SWEEP = r"""
local function sweep(key, longkey, today, age, rare)
  local mark = redis.call('HGET', key, 'm')
  if not mark or tonumber(mark) >= today - age then return 0.0, 0.0, 0 end
  local all = redis.call('HGETALL', key)
  local dh, ds, dv = 0.0, 0.0, 0
  local newmark = nil
  for i = 1, #all, 2 do
    local f, v = all[i], all[i + 1]
    if #f == 8 then
      local h, s, df, day = struct.unpack('<ddi4I4', v)
      if df <= rare then
        if day < today - age then
          redis.call('HDEL', key, f)
          redis.call('HDEL', longkey, f)
          dh = dh - h; ds = ds - s; dv = dv - 1
        elseif newmark == nil or day < newmark then
          newmark = day
        end
      end
    end
  end
  if newmark then redis.call('HSET', key, 'm', newmark) else redis.call('HDEL', key, 'm') end
  return dh, ds, dv
end
"""

#: KEYS: meta. ARGV: epoch, the bucket keys' prefix (``P EPOCH:b:``), the token hashes
#: (8 bytes each, one string). The buckets are named here, from the hashes, rather than
#: sent as hundreds of KEYS (a standalone server or a replica: Cluster is not supported).
#: Reply: {'ok', counts .. 24 bytes per token (doc. frequency -1: not stored)} |
#: {'empty'} | {'epoch', now} | {'bad', what}: a value no writer of this module writes
#: (the numbers in the values are checked by :meth:`RedisBackend.read`).
READ = r"""
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if not epoch then return {'empty'} end
if epoch ~= ARGV[1] or (redis.call('HGET', KEYS[1], 'rev') or '0') ~= ARGV[4] then return {'epoch', epoch} end
local counts = redis.call('HGET', KEYS[1], 'counts')
if not counts or #counts ~= 40 then return {'bad', 'the counts are not 5 numbers'} end
local nb = tonumber(redis.call('HGET', KEYS[1], 'buckets'))
if not nb or nb < 1 or nb ~= math.floor(nb) then return {'bad', 'the number of buckets is not a count'} end
local hashes, prefix = ARGV[3], ARGV[2]
local missing = struct.pack('<ddi4I4', 0, 0, -1, 0)
local out = {counts}
for i = 1, #hashes / 8 do
  local field = string.sub(hashes, 8 * i - 7, 8 * i)
  local v = redis.call('HGET', prefix .. (struct.unpack('<I4', field) % nb), field)
  if v and #v < 24 then return {'bad', 'a token value is short'} end
  if v then out[i + 1] = string.sub(v, 1, 24) else out[i + 1] = missing end
end
return {'ok', table.concat(out)}
"""

#: KEYS: meta. ARGV: epoch, settings (JSON), a new revision: the settings of that model, unless
#: another replaced it, under a revision that readers holding the old settings do not know (a
#: random one: HSET only, which the documented ACL user already has; HINCRBY it has not).
SET_SETTINGS = r"""
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'settings', ARGV[2], 'rev', ARGV[3])
return 1
"""

#: KEYS: meta, registry bucket, long texts, then one bucket per token.
#: ARGV: epoch, message identity, class (0/1), forget (0/1), features, today, age_days,
#: age_max_messages, bucket TTL (s), then per token: field, tf, text.
#: Reply: {'done', class before or -1} | {'unchanged'} | {'notlearned', class or -1} | {'empty'} |
#: {'epoch', now} | {'bad', what}: a value it read is not one a learner writes (it is
#: checked before anything is written, and then nothing is). 'unchanged' writes the
#: message's registry entry again, as it was: so that a WAIT on this connection confirms
#: that the replicas hold the learn another connection made (a learn told again after
#: its first telling went unconfirmed).
LEARN = _LUA_FEATURES + _LUA_SWEEP + r"""
local function bad(x) return x ~= x or x < 0 or x == math.huge end
local meta = KEYS[1]
local epoch = redis.call('HGET', meta, 'epoch')
if not epoch then return {'empty'} end
if epoch ~= ARGV[1] then return {'epoch', epoch} end
local y = tonumber(ARGV[3]) + 1
local forget = ARGV[4] == '1'
local cur = redis.call('HGET', KEYS[2], ARGV[2])
if cur then
  cur = tonumber(cur)
  if cur ~= 0 and cur ~= 1 then return {'bad', 'a learned message has no class'} end
  cur = cur + 1
end
if forget and cur ~= y then return {'notlearned', cur and (cur - 1) or -1} end
if not forget and cur == y then
  redis.call('HSET', KEYS[2], ARGV[2], cur - 1)
  return {'unchanged'}
end
local features, today, age = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
local rare, ttl = tonumber(ARGV[8]), tonumber(ARGV[9])
local c = redis.call('HGET', meta, 'counts')
if not c or #c ~= 40 then return {'bad', 'the counts are not 5 numbers'} end
local N1, N2, T1, T2, V = struct.unpack('<ddddd', c)
if bad(N1) or bad(N2) or bad(V) or bad(T1 + 1e-6) or bad(T2 + 1e-6) then -- totals: see check_counts
  return {'bad', 'the counts are not finite and non-negative'}
end
local N, T = {N1, N2}, {T1, T2}
local n = (#ARGV - 9) / 3
local field, tf, text, vals, d1, d2, ddf = {}, {}, {}, {}, {}, {}, {}
for i = 1, n do
  field[i] = ARGV[7 + 3 * i]; tf[i] = tonumber(ARGV[8 + 3 * i]); text[i] = ARGV[9 + 3 * i]
  local v = redis.call('HGET', KEYS[3 + i], field[i])
  if v then
    if #v < 24 then return {'bad', 'a token value is short'} end
    vals[i] = {struct.unpack('<ddi4I4', v)}
    if bad(vals[i][1]) or bad(vals[i][2]) or vals[i][3] < 0 then
      return {'bad', "a token's counts are not finite and non-negative"}
    end
  end
  d1[i], d2[i], ddf[i] = 0.0, 0.0, 0
end
local d = {d1, d2}
if cur then -- take the known tokens' row out of the old class, no count below zero
  local known, ktf = {}, {}
  for i = 1, n do if vals[i] then known[#known + 1] = i; ktf[#ktf + 1] = tf[i] end end
  local fv = fvalues(features, ktf)
  for j, i in ipairs(known) do
    d[cur][i] = d[cur][i] - math.min(fv[j], math.max(vals[i][cur], 0.0))
    ddf[i] = ddf[i] - 1
  end
  N[cur] = N[cur] - math.min(1.0, math.max(N[cur], 0.0))
end
if not forget then -- add the whole row to the new class
  local fv = fvalues(features, tf)
  for i = 1, n do d[y][i] = d[y][i] + fv[i]; ddf[i] = ddf[i] + 1 end
  N[y] = N[y] + 1.0
end
local touched = {}
for i = 1, n do
  if vals[i] or not forget then
    local old = vals[i]
    if not old then
      old = {0.0, 0.0, 0, today}
      V = V + 1
      if #text[i] > 40 then redis.call('HSET', KEYS[3], field[i], text[i]) end
    end
    local df = math.max(old[3] + ddf[i], 0)
    local inline = ''
    if #text[i] <= 40 then inline = text[i] end
    local value = struct.pack('<ddi4I4', old[1] + d1[i], old[2] + d2[i], df, today)
    redis.call('HSET', KEYS[3 + i], field[i], value .. inline)
    T[1] = T[1] + d1[i]; T[2] = T[2] + d2[i]
    local key = KEYS[3 + i]
    if df <= rare then
      local mark = redis.call('HGET', key, 'm')
      if not mark or tonumber(mark) > today then redis.call('HSET', key, 'm', today) end
    end
    touched[key] = true
  end
end
for key, _ in pairs(touched) do
  local dh, ds, dv = sweep(key, KEYS[3], today, age, rare)
  T[1] = T[1] + dh; T[2] = T[2] + ds; V = V + dv
  redis.call('EXPIRE', key, ttl)
end
if #text > 0 then redis.call('EXPIRE', KEYS[3], ttl) end
if forget then redis.call('HDEL', KEYS[2], ARGV[2]) else redis.call('HSET', KEYS[2], ARGV[2], y - 1) end
redis.call('HSET', meta, 'counts', struct.pack('<ddddd', N[1], N[2], T[1], T[2], V))
return {'done', cur and (cur - 1) or -1}
"""

#: prune through the store: sweep these buckets by the rule. KEYS: meta, long texts, buckets.
#: ARGV: epoch, today, age_days, age_max_messages, dry run (0/1). Reply: tokens dropped.
SWEEP = _LUA_SWEEP + r"""
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if epoch ~= ARGV[1] then return -1 end
local today, age, rare = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if ARGV[5] == '1' then
  local n = 0
  for i = 3, #KEYS do
    local all = redis.call('HGETALL', KEYS[i])
    for j = 1, #all, 2 do
      if #all[j] == 8 then
        local _, _, df, day = struct.unpack('<ddi4I4', all[j + 1])
        if df <= rare and day < today - age then n = n + 1 end
      end
    end
  end
  return n
end
local N1, N2, T1, T2, V = struct.unpack('<ddddd', redis.call('HGET', KEYS[1], 'counts'))
local dropped = 0
for i = 3, #KEYS do
  redis.call('HSET', KEYS[i], 'm', 0)
  local dh, ds, dv = sweep(KEYS[i], KEYS[2], today, age, rare)
  T1 = T1 + dh; T2 = T2 + ds; V = V + dv; dropped = dropped - dv
end
redis.call('HSET', KEYS[1], 'counts', struct.pack('<ddddd', N1, N2, T1, T2, V))
return dropped
"""


def _redis():
    try:
        import redis
    except ImportError:
        raise ModelError("a Redis store needs the redis package: pip install 'spamnb[redis]'") from None
    return redis


class Settings:
    """What ``P meta`` says about the model now: its epoch, settings and their revision."""

    def __init__(self, epoch: bytes, settings: dict, rev: bytes = b"0"):
        self.epoch = epoch
        self.rev = rev
        self.s = settings
        self.buckets = int(settings["buckets"])
        self.registry_buckets = int(settings["registry_buckets"])

    def ttl(self) -> int:
        """Seconds a written bucket lives: ``keep_factor`` x ``age_days`` days, and a day at
        least (``prune --older-than 0`` makes ``age_days`` 0, and an EXPIRE of 0 deletes)."""
        return ttl_seconds(self.s["keep_factor"], self.s["age_days"])


def ttl_seconds(keep_factor, age_days) -> int:
    """:meth:`Settings.ttl` of these settings (also what a push gives its buckets)."""
    return max(1, int(keep_factor * age_days)) * 86400


class MalformedStore(ModelError):
    """The store holds a value no writer of spamnb writes (hand-edited, another program's,
    damaged): refused as a damaged model file is, never scored, learned into or pulled."""


def check_settings(s) -> dict:
    """``s``, the settings JSON of ``P meta``, when it holds what every reader uses:
    :func:`spamnb.storage.scorer.check_header`'s fields (what the decision reads) and the
    store's own (its format, buckets, the ageing rule); ValueError naming what is wrong."""
    from spamnb.storage.scorer import check_header

    if not isinstance(s, dict):
        raise ValueError("not a JSON object")
    if s.get("format") != FORMAT or s.get("version") != 1:
        raise ValueError(f"not a {FORMAT} version 1 (format {s.get('format')!r}, version {s.get('version')!r})")
    if s.get("model_type") != "multinomial":
        raise ValueError(f"a store holds multinomial models only, not {s.get('model_type')!r}")
    for key, low in (("buckets", 1), ("registry_buckets", 1), ("age_days", 0), ("age_max_messages", 0),
                     ("keep_factor", 1)):
        value = s.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{key} must be an integer of at least {low}, not {value!r}")
    check_header({**s, "bias": 0.0, "class_count": [0.0, 0.0], "totals": [0.0, 0.0]})
    return s


def check_counts(counts) -> tuple:
    """``counts`` (N_ham, N_spam, T_ham, T_spam, |V|) when they can be counts: finite,
    messages and |V| non-negative, totals above a rounding error below zero (the
    learn script keeps them as running sums); ValueError otherwise."""
    if not all(math.isfinite(c) for c in counts):
        raise ValueError("the counts are not finite")
    if min(counts[0], counts[1], counts[4]) < 0 or min(counts[2], counts[3]) < -1e-6:
        raise ValueError("the counts are negative")
    return counts


def check_value(h, sp, df) -> None:
    """ValueError unless a token's counts ``h``, ``sp`` and messages ``df`` can be counts."""
    if not (math.isfinite(h) and math.isfinite(sp) and h >= 0 and sp >= 0 and df >= 0):
        raise ValueError("a token's counts are not finite and non-negative")


class StoreEmpty(StoreUnavailable):
    """The store answers but holds no model (a Redis restarted without its data): a
    learn given ``create`` makes one; scanning says so."""


class _Reach:
    """Whether a store's client reached it the last time it tried, and when it last
    had an answer (what a server's gauge reads: :meth:`RedisBackend.status`); whether
    its last learn went through (:meth:`RedisBackend.learning`)."""

    def __init__(self):
        self.ok: bool | None = None
        self.when: float | None = None
        self.writes = Writes()


class RedisBackend(Backend):
    """A model in Redis (see the module docstring). ``client``: a redis-py client;
    ``prefix``: the keys' prefix; ``name``: the URL without its password."""

    per_user = True

    def __init__(self, client, prefix=DEFAULT_PREFIX, name=None, *, url_parts=None, user=False, reach=None,
                 reader=None, wait=0, sentinel=None):
        self.client = client
        # (redis-py's Sentinel, the service) of a Sentinel URL: what the page asks them (redissite.servers)
        self.sentinel = sentinel
        # classification reads here (a Sentinel group's replicas), everything else on the primary
        self.reader = reader if reader is not None else client
        # replicas that must hold a learn before it is acknowledged (WAIT; a Sentinel URL's default 1)
        self.wait = wait
        # one record for the store's client, shared by its users' backends
        self._reach = reach if reach is not None else _Reach()
        # a user's model is made at their first learn (from ``create()``); the store's own by push
        # or train, and again by a learn given ``create()`` (spamd's TELL) once emptied: scanning
        # an empty store says so, it never starts a model
        self.user = user
        self.prefix = prefix.encode() if isinstance(prefix, str) else prefix
        self.name = name or f"redis store {prefix}"
        self.short_name = "store:" + self.prefix.decode("utf-8", "replace")
        self._url_parts = url_parts
        self._settings: Settings | None = None
        self._read = self.reader.register_script(READ)
        self._learn = client.register_script(LEARN)
        self._sweep = client.register_script(SWEEP)

    def __repr__(self):
        return f"RedisBackend({self.name!r})"

    # -- opening -------------------------------------------------------------------

    @classmethod
    def from_url(cls, url: str) -> "RedisBackend":
        """``redis://[USER@]HOST[:PORT][/DB]``, ``rediss://`` (TLS), ``unix:///PATH[?db=N]``,
        ``redis+sentinel://HOST[:PORT],.../SERVICE[/DB]`` (a Sentinel group, ``?wait=N``;
        ``rediss+sentinel://``: TLS to the Sentinels and the servers they name), with
        ``?prefix=NAME:`` (keys), ``?timeout=SECONDS`` (each request) and ``?password_file=PATH``
        (the password, never in the URL or argv: docs/many-hosts.md).
        redis-py's TLS files (``ssl_ca_certs=``, ``ssl_certfile=``, ``ssl_keyfile=``) go to it; no
        other parameter passes the check."""
        redis = _redis()
        try:  # the rules `config --check` applies to [store] url: scheme, no password in it, prefix...
            parts, query, ours = checks.store_url_parts(url)
        except ValueError as exc:
            raise ModelError(f"store URL {exc}") from None
        prefix = ours.get("prefix", DEFAULT_PREFIX)
        timeout = float(ours.get("timeout", DEFAULT_TIMEOUT))
        kwargs = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
        if "password_file" in ours:
            kwargs["password"] = _read_password(ours["password_file"])
        base = url.split("?", 1)[0]  # (urlunsplit writes unix:///PATH as unix:/PATH, which redis-py refuses)
        name = base + (f"?prefix={prefix}" if "prefix" in ours else "")
        if parts.scheme in checks.SENTINEL_SCHEMES:
            return cls._from_sentinel_url(parts, query, ours, kwargs, prefix, name)
        rest = base + ("?" + urllib.parse.urlencode(query, doseq=True) if query else "")
        try:
            client = redis.Redis.from_url(rest, **kwargs)
        except ValueError as exc:
            raise ModelError(f"store URL {checks.redact(url)}: {exc}") from None
        return cls(client, prefix, name, url_parts=(parts, ours))

    @classmethod
    def _from_sentinel_url(cls, parts, query, ours, kwargs, prefix, name):
        """``redis+sentinel://[USER@]HOST[:PORT][,HOST[:PORT]...]/SERVICE[/DB]`` (checked:
        :func:`spamnb.checks.sentinel_group`, :func:`spamnb.checks.sentinel_trust`): the primary
        of the Sentinels' SERVICE for writing, its replicas (else the primary) for classifying.
        A server the Sentinels name is trusted as far as the URL's TLS lets it be: with
        ``rediss+sentinel://`` it must show a certificate of the URL's CA (or the system's) for
        the address named, before the password is sent; without TLS the password goes to a
        loopback address only, unless ``force_plaintext=yes``."""
        sentinels, service, db = checks.sentinel_group(parts, query, name)
        if parts.username:
            kwargs["username"] = urllib.parse.unquote(parts.username)
        own = {k: kwargs[k] for k in ("socket_timeout", "socket_connect_timeout")}
        if "sentinel_password_file" in ours:
            own["password"] = _read_password(ours["sentinel_password_file"])
        if parts.scheme in checks.TLS_SCHEMES:
            tls = {"ssl": True, **{k: query[k][-1] for k in checks.STORE_FILES if k in query}}
            own.update(tls)
            kwargs.update(tls)
        elif "password" in kwargs and ours.get("force_plaintext") is None:
            kwargs["connection_class"] = _loopback_only()
        group = _sentinel_class()(sentinels, sentinel_kwargs=own, db=db, **kwargs)
        return cls(group.master_for(service), prefix, name, reader=group.slave_for(service),
                   wait=int(ours.get("wait", 1)), sentinel=(group, service))

    def for_user(self, user) -> "RedisBackend":
        if not user or len(user) > 128 or any(c in user for c in ":*?[]\\") or not user.isprintable() \
                or " " in user:
            raise ModelError(f"{user!r} cannot name a model in a store (no ':', spaces or wildcards)")
        name = f"{self.name}#user={user}"
        return RedisBackend(self.client, self.prefix + b"u:" + user.encode() + b":", name, user=True,
                            reach=self._reach, reader=self.reader, wait=self.wait)

    def close(self) -> None:
        pass  # the client is shared by the users' backends

    # -- keys ----------------------------------------------------------------------

    def _meta(self) -> bytes:
        return self.prefix + b"meta"

    def _bucket(self, epoch, k) -> bytes:
        """Token bucket ``k`` of the model ``epoch`` (``k`` = b"": the buckets' prefix)."""
        return b"%s%s:b:%s" % (self.prefix, epoch, k if k == b"" else b"%d" % k)

    def _reg(self, epoch, k) -> bytes:
        return b"%s%s:r:%d" % (self.prefix, epoch, k)

    def _long(self, epoch) -> bytes:
        return b"%s%s:long" % (self.prefix, epoch)

    # -- talking to Redis ----------------------------------------------------------

    def status(self) -> Status:
        """The model's size, asked of the store now (one request), and whether and when
        the store last answered."""
        try:
            size = self.size()
        except ModelError:  # said by the other two: the store is down, or holds no model now
            size = None
        return Status(size, self._reach.ok, self._reach.when)

    def _call(self, what, fn, *args, **kwargs):
        """``fn(*args)``, with redis-py's errors as one clear ModelError line; notes
        whether the store answered (:meth:`status`)."""
        return self._request(self._reach, what, fn, args, kwargs)

    def ask(self, what, fn, *args, note=True, **kwargs):
        """:meth:`_call` for the modules beside this one (the site's heartbeats and what the
        page reads of them: :mod:`spamnb.storage.redissite`); ``note=False``: the answer is
        not what :meth:`status` reports (a heartbeat writes the primary, where the store's
        gauges say whether the reads are answered)."""
        return self._request(self._reach if note else _Reach(), what, fn, args, kwargs)

    def _request(self, reach, what, fn, args, kwargs):
        redis = _redis()
        try:
            out = fn(*args, **kwargs)
        except (redis.exceptions.TimeoutError, TimeoutError, redis.exceptions.ConnectionError, OSError):
            reach.ok = False
            self._raise(what)
        except redis.exceptions.RedisError:
            reach.ok = True  # it answered, with an error
            self._raise(what)
        except (AttributeError, TypeError, ValueError, KeyError, IndexError) as exc:
            # redis-py reading a reply no Redis or Sentinel gives (+OK to HELLO, a Sentinel's
            # list that is not one): the server is not what the URL says, one line
            reach.ok = False
            raise StoreUnavailable(f"cannot {what}: the store {self.name} (or a Sentinel of it) answered what "
                                   f"Redis does not ({type(exc).__name__}: {str(exc)[:120]})") from None
        reach.ok, reach.when = True, time.time()
        return out

    def _raise(self, what):
        """The exception being handled, as one StoreUnavailable line."""
        redis = _redis()
        try:
            raise
        except redis.exceptions.ReadOnlyError:
            raise StoreUnavailable(f"cannot {what}: the store {self.name} is a read-only replica "
                                   f"(learning needs the primary)") from None
        except (redis.exceptions.TimeoutError, TimeoutError):
            raise StoreUnavailable(f"cannot {what}: the store {self.name} did not answer in time") from None
        except redis.exceptions.AuthenticationError as exc:
            raise StoreUnavailable(f"cannot {what}: the store {self.name} refused the login ({exc}){self._hint(exc)}") \
                from None
        except _sentinel_errors() as exc:
            raise StoreUnavailable(f"cannot {what}: {self._no_primary(exc)}") from None
        except (redis.exceptions.ConnectionError, OSError) as exc:
            raise StoreUnavailable(f"cannot {what}: cannot reach the store {self.name} ({exc}){self._hint(exc)}") \
                from None
        except redis.exceptions.ResponseError as exc:
            # a pipeline's error names the command with its arguments (a model's bytes): the error alone
            text = str(exc).rpartition(" of pipeline caused error: ")[2]
            if text.startswith("OOM"):
                raise StoreUnavailable(f"cannot {what}: the store {self.name} is out of memory "
                                       f"(maxmemory; see docs/many-hosts.md)") from None
            raise StoreUnavailable(f"cannot {what}: the store {self.name} answered: {text}") from None
        except redis.exceptions.RedisError as exc:
            raise StoreUnavailable(f"cannot {what}: the store {self.name}: {exc}") from None

    def _no_primary(self, exc) -> str:
        """Why the Sentinels named no server: none of them answered (a different outage from a
        group whose Sentinels answer but see no primary up, which a failover resolves)."""
        group = getattr(self.client.connection_pool, "sentinel_manager", None)
        if getattr(group, "answered", None) == 0:
            where = ", ".join(sentinel_address(c) for c in group.sentinels)
            return f"no Sentinel of the store {self.name} answers ({where}): nothing names its primary"
        return (f"the Sentinels of the store {self.name} answer but name no primary up for its service now "
                f"(a failover under way, every server of the group down, or a service they do not monitor)")

    def _hint(self, exc) -> str:
        """What to change in the URL when a connection fails the way a TLS mismatch fails."""
        text = str(exc)
        if isinstance(exc, _redis().exceptions.AuthenticationError) and not self._names_user():
            return ("; the URL names no user, so the password was tried for Redis' default user: name the ACL "
                    "user in it, as unix://USER@/PATH?password_file=FILE or redis://USER@HOST/?password_file=FILE")
        if "CERTIFICATE_VERIFY_FAILED" in text:
            return "; name the CA that signed the server's certificate with ?ssl_ca_certs=FILE"
        # a TLS port closes a connection that speaks plain RESP to it (Redis 7: a reset, no reply)
        if self.name.startswith("redis://") and "connecting to" not in text:
            return "; if that port is Redis' TLS port, use rediss://"
        return ""

    def _names_user(self) -> bool:
        """Whether the store's URL names the user to log in as (``USER@``)."""
        try:
            return bool(urllib.parse.urlsplit(self.name.split("#", 1)[0]).username)
        except ValueError:
            return False

    def settings(self, refresh=False, *, replica=False) -> Settings:
        """What ``P meta`` says now (kept until ``refresh``); checked: :func:`check_settings`.
        From a replica when ``replica`` (classification: the script it reads with checks
        that they still hold)."""
        if self._settings is None or refresh:
            client = self.reader if replica else self.client
            epoch, text, rev, buckets = self._call("read the model", client.hmget, self._meta(),
                                                   [b"epoch", b"settings", b"rev", b"buckets"])
            if epoch is None or text is None:
                raise StoreEmpty(f"the store {self.name} holds no model: it is empty (a Redis restarted "
                                       f"without its data?); put one there with `spamnb store push MODEL URL`")
            try:
                s = check_settings(json.loads(text))
                if buckets != str(s["buckets"]).encode():  # the read script's buckets are the learner's
                    raise ValueError(f"the buckets ({buckets!r}) are not the settings' ({s['buckets']})")
            except (ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:  # JSONDecodeError: a ValueError
                raise self.malformed(f"settings: {exc}") from None
            self._settings = Settings(epoch, s, rev or b"0")
        return self._settings

    def malformed(self, what) -> MalformedStore:
        """The one-line error of a value in the store that is not what spamnb writes."""
        return MalformedStore(f"the store {self.name} holds a malformed model ({what}): refused, nothing "
                              f"written to it; put a good one there with `spamnb store push MODEL URL`")

    def exists(self) -> bool:
        return bool(self._call("read the model", self.client.hexists, self._meta(), b"epoch"))

    def size(self) -> tuple[int, tuple[int, int]]:
        """``(tokens, (ham messages, spam messages))`` of the model now: its totals, one
        request (what ``--metrics`` reports); StoreEmpty when there is none."""
        epoch, counts = self._call("read the model", self.reader.hmget, self._meta(), [b"epoch", b"counts"])
        if epoch is None or counts is None:
            raise StoreEmpty(f"the store {self.name} holds no model")
        try:
            n_ham, n_spam, _, _, n_tokens = check_counts(COUNTS.unpack(counts))
        except (ValueError, struct.error) as exc:
            raise self.malformed(f"counts: {exc}") from None
        return int(n_tokens), (int(round(n_ham)), int(round(n_spam)))

    def tokenizer(self):
        from spamnb.mail.tokenizer import TokenizerConfig

        return TokenizerConfig.from_dict(self.settings().s["tokenizer"])

    # -- scoring -------------------------------------------------------------------

    def view(self):
        return StoreView(self, self.settings(replica=True))

    def read(self, tokens):
        """``(settings, counts, {token hash: (n_ham, n_spam)})`` of the stored tokens
        among ``tokens``: one script call (one round trip)."""
        hashes = [token_hash(t) for t in set(tokens)]
        blob = b"".join(h.to_bytes(8, "little") for h in hashes)
        for _ in range(3):
            st = self.settings(replica=True)
            reply = self._call("read the model", self._read, keys=[self._meta()],
                               args=[st.epoch, self._bucket(st.epoch, b""), blob, st.rev])
            if reply[0] == b"ok":
                data = reply[1]
                if len(data) != COUNTS.size + VALUE.size * len(hashes):
                    raise self.malformed("the counts or a token value have the wrong length")
                try:
                    counts = check_counts(COUNTS.unpack_from(data))
                    found = {}
                    for h, v in zip(hashes, VALUE.iter_unpack(data[COUNTS.size:])):
                        if v[2] != -1:  # -1: not stored
                            check_value(*v[:3])
                            found[h] = v[:2]
                except ValueError as exc:
                    raise self.malformed(str(exc)) from None
                return st, counts, found
            if reply[0] == b"bad":
                raise self.malformed(reply[1].decode("utf-8", "replace"))
            self.settings(refresh=True, replica=True)  # a new model or new settings meanwhile (or emptied)
        raise StoreUnavailable(f"the model in {self.name} keeps changing; try again")

    # -- learning ------------------------------------------------------------------

    @property
    def writes(self) -> Writes:
        return self._reach.writes

    def probe_write(self) -> bool:
        """Whether the primary takes a write now, as a learn needs: ``HSET`` of a probe key
        (``P probe``, gone a minute later) and, with :attr:`wait`, the replicas' ``WAIT``.
        A read-only replica, a primary that cannot be reached or is out of memory: False."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hset(self.prefix + b"probe", b"at", str(int(time.time())))
        pipe.expire(self.prefix + b"probe", 60)
        self._then_wait(pipe)
        try:
            done = self._call("write to the store", pipe.execute)
            if self.wait:
                self._replicated(done[-1])
        except ModelError:
            return False
        return True

    def learn(self, items, *, forget=False, create=None, timeout=None, warn=None, later=None) -> dict:
        return self.writes.learning(lambda: self._learn_or_start(items, forget, create))

    def _learn_or_start(self, items, forget, create) -> dict:
        if create is not None and self.user and not self.exists():
            self.replace(create())
        try:
            return self._learn_items(items, forget)
        except StoreEmpty:  # emptied (a Redis restarted without its data): a learn asked for starts it again
            if create is None or forget:
                raise
            self.replace(create())
            return self._learn_items(items, forget)

    def _learn_items(self, items, forget) -> dict:
        from spamnb.mail.identity import ALREADY, DUPLICATE, FORGOTTEN, LEARNED, MOVED, message_key, tally
        from spamnb.mail.tokenizer import tokenize

        st = self.settings()
        config = self.tokenizer()
        outcomes = [DUPLICATE] * len(items)  # each copy of a message given earlier in the call stays one
        todo, given = [], set()
        for i, item in enumerate(items):
            raw, label = item[0], item[1]
            toks = item[2] if len(item) > 2 and item[2] is not None else None
            key = message_key(raw)
            if key in given:
                continue
            given.add(key)
            if label not in LABELS:
                raise ValueError(f"unknown label {label!r}: expected 'ham' or 'spam'")
            todo.append((i, raw, LABELS.index(label), key, toks))
        if forget:  # a message not learned so refuses the whole call, before anything changes
            for (_, _, y, key, _), now in zip(todo, self._classes(st, [t[3] for t in todo])):
                if now != y:
                    where = "not learned" if now is None else f"learned as {'ham' if now == 0 else 'spam'}"
                    raise ValueError(f"message was {where}, not as {'ham' if y == 0 else 'spam'}: nothing to forget")
        for i, raw, y, key, toks in todo:
            toks = tokenize(raw, config) if toks is None else toks
            outcome = self._learn_one(key, y, toks, forget)
            outcomes[i] = (ALREADY if outcome == "unchanged" else FORGOTTEN if forget
                           else LEARNED if outcome is None else MOVED)
        return tally(outcomes)

    def learned_as(self, raws):
        """:meth:`Backend.learned_as` from the store's registry of learned messages, without
        reading the model: one round trip for each :data:`LOOKUPS` messages."""
        from spamnb.mail.identity import message_key

        st = self.settings()
        batch = []
        for raw in raws:
            batch.append(message_key(raw))
            if len(batch) == LOOKUPS:
                yield from (None if c is None else LABELS[c] for c in self._classes(st, batch))
                batch = []
        if batch:
            yield from (None if c is None else LABELS[c] for c in self._classes(st, batch))

    def _classes(self, st, keys):
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.hget(self._reg(st.epoch, _reg_bucket(key, st)), key)
        classes = self._call("read the model", pipe.execute)
        if any(c not in (None, b"0", b"1") for c in classes):
            raise self.malformed("a learned message has no class")
        return [None if c is None else int(c) for c in classes]

    def _learn_one(self, key, y, toks, forget):
        """One script call: ``"unchanged"``, or the class the message had (None: none)."""
        tf: dict[str, int] = {}
        for t in toks:
            tf[t] = tf.get(t, 0) + 1
        for _ in range(3):
            st = self.settings()
            s = st.s
            keys = [self._meta(), self._reg(st.epoch, _reg_bucket(key, st)), self._long(st.epoch)]
            args = [st.epoch, key, y, int(forget), s["features"], _today(), s["age_days"], s["age_max_messages"],
                    st.ttl()]
            for t, n in tf.items():
                h = token_hash(t)
                keys.append(self._bucket(st.epoch, h % st.buckets))
                args += [h.to_bytes(8, "little"), n, t.encode("utf-8", "surrogatepass")]
            if self.wait:  # the script and WAIT on one connection
                reply, confirmed = self._learn_and_wait(keys, args)
            else:  # one round trip: EVALSHA (redis-py loads the script again on NOSCRIPT)
                reply, confirmed = self._call("learn", self._learn, keys=keys, args=args), None
            tag = reply[0]
            if tag in (b"done", b"unchanged") and self.wait:
                self._replicated(confirmed)
            if tag == b"done":
                return None if int(reply[1]) < 0 else int(reply[1])
            if tag == b"unchanged":
                return "unchanged"
            if tag == b"bad":
                raise self.malformed(reply[1].decode("utf-8", "replace"))
            if tag == b"notlearned":
                now = int(reply[1])
                where = "not learned" if now < 0 else f"learned as {'ham' if now == 0 else 'spam'}"
                raise ValueError(f"message was {where}, not as {'ham' if y == 0 else 'spam'}: nothing to forget")
            self.settings(refresh=True)  # 'epoch' (a new model meanwhile) or 'empty' (says so)
        raise StoreUnavailable(f"the model in {self.name} keeps changing; nothing learned, try again")

    def _learn_and_wait(self, keys, args):
        """``(reply, replicas)``: the learn script, then WAIT, in one pipeline (one
        connection). EVALSHA, and on NOSCRIPT (a restarted server) SCRIPT LOAD and once
        more: the ACL user's own commands (redis-py's pipeline would ask SCRIPT EXISTS)."""
        redis = _redis()
        for _ in range(2):
            pipe = self.client.pipeline(transaction=False)
            pipe.evalsha(self._learn.sha, len(keys), *keys, *args)
            self._then_wait(pipe)
            reply, confirmed = self._call("learn", pipe.execute, raise_on_error=False)
            if not isinstance(reply, redis.exceptions.NoScriptError):
                break
            self._call("learn", self.client.script_load, LEARN)
        def answered():  # an error the pipeline handed back as a reply: raised where every call's is read
            for got in (reply, confirmed):
                if isinstance(got, Exception):
                    raise got

        self._call("learn", answered)
        return reply, confirmed

    def _then_wait(self, pipe):
        """With :attr:`wait`, ``WAIT`` after the writes queued in ``pipe``: on the connection
        that made them, since WAIT counts the replicas holding that connection's writes
        (on another connection of the pool it would confirm nothing), for up to half the
        store's ``timeout=``."""
        if self.wait:
            timeout = self.client.connection_pool.connection_kwargs.get("socket_timeout") or DEFAULT_TIMEOUT
            pipe.execute_command("WAIT", self.wait, int(timeout * 500))

    def _replicated(self, got):
        """Return when ``got`` (WAIT's answer) replicas hold the writes, at least :attr:`wait`,
        else say the learn is not safe yet: Redis replicates after answering, so a learn the
        primary alone holds is lost if it dies now, and a Sentinel then promotes a replica
        without it. Telling the message again is safe (learned once by its identity)."""
        if got < self.wait:
            raise StoreUnavailable(f"cannot learn: {got} of the {self.wait} replica(s) of {self.name} confirmed "
                                   f"the learn in time; tell it again (a message is learned once)")

    # -- the whole model -----------------------------------------------------------

    def replace(self, model) -> None:
        """Write ``model`` under a new epoch, make it current, remove the old one's keys."""
        import numpy as np

        from spamnb.nb.vocabulary import Vocabulary
        if model.model_type != "multinomial":
            raise ModelError(f"a store holds multinomial models only, not {model.model_type}: "
                             f"train one with --model-type multinomial")
        if type(model.vocabulary) is not Vocabulary:
            raise ModelError("a store needs a vocabulary of tokens (not --hash-features)")
        old = None
        try:
            old = self.settings(refresh=True)
        except MalformedStore:  # what the error says to do: a push replaces it
            old = self._malformed_settings()
        except StoreUnavailable:
            if not self._call("push the model", self.client.ping):
                raise
        epoch = secrets.token_hex(4).encode()
        tokens = model.vocabulary.tokens()
        nb = _buckets(len(tokens))
        fc = np.asarray(model.estimator.feature_count_, dtype=np.float64)
        df = model.doc_freq
        seen = model.last_seen[:len(tokens)]
        rule = (old.s if old else {})
        age = int(rule.get("age_days", AGE_DAYS))
        rare = int(rule.get("age_max_messages", AGE_MAX_MESSAGES))
        keep = int(rule.get("keep_factor", KEEP_FACTOR))
        buckets: dict[int, dict] = {}
        marks: dict[int, int] = {}
        long_texts = {}
        for i, t in enumerate(tokens):
            h = token_hash(t)
            k = h % nb
            text = t.encode("utf-8", "surrogatepass")
            field = h.to_bytes(8, "little")
            if len(text) > INLINE_TEXT:
                long_texts[field] = text
                text = b""
            day = int(seen[i])
            buckets.setdefault(k, {})[field] = VALUE.pack(fc[0, i], fc[1, i], int(df[i]), day) + text
            if df[i] <= rare:
                marks[k] = min(marks.get(k, day), day)
        ttl = ttl_seconds(keep, age)
        pipe = self.client.pipeline(transaction=False)
        for n, (k, fields) in enumerate(buckets.items()):
            key = self._bucket(epoch, k)
            if k in marks:
                fields["m"] = marks[k]
            pipe.hset(key, mapping=fields)
            pipe.expire(key, ttl)
            if n % 500 == 499:
                self._call("write the model", pipe.execute)
        if long_texts:
            pipe.hset(self._long(epoch), mapping=long_texts)
            pipe.expire(self._long(epoch), ttl)
        regs: dict[int, dict] = {}
        for key, c in model.registry.items():
            regs.setdefault(int.from_bytes(key[:4], "little") % REGISTRY_BUCKETS, {})[key] = int(c)
        for k, fields in regs.items():
            pipe.hset(self._reg(epoch, k), mapping=fields)
        self._call("write the model", pipe.execute)
        settings = {
            "format": FORMAT, "version": 1, "model_type": model.model_type, "alpha": model.alpha,
            "prior": model.prior, "features": model.features, "tokenizer": model.tokenizer.to_dict(),
            "cutoffs": [float(model.cutoffs.ham_cutoff), float(model.cutoffs.spam_cutoff)],
            "refine": [model.refine_rounds, model.refine_margin],
            "refine_copies": list(model.stats.get("refine_copies", (0, 0))),
            "created": model.stats.get("created"), "pushed": time.time(),
            "spamnb_version": model.stats.get("spamnb_version"),
            "buckets": nb, "registry_buckets": REGISTRY_BUCKETS,
            "age_days": age, "age_max_messages": rare, "keep_factor": keep,
        }
        cc = np.asarray(model.estimator.class_count_, dtype=np.float64)
        totals = fc.sum(axis=1)
        counts = COUNTS.pack(cc[0], cc[1], totals[0], totals[1], float(len(tokens)))
        self._call("write the model", self.client.hset, self._meta(),
                   mapping={"epoch": epoch, "settings": json.dumps(settings), "counts": counts, "buckets": nb})
        self._settings = None  # read again, with the revision the store holds
        if old is not None and old.epoch != epoch:
            self._drop_epoch(old)

    def _malformed_settings(self) -> Settings:
        """A malformed model's epoch, with what of its keys a push can remove: the buckets
        ``P meta`` counts when that is a count (else none: they expire by their TTL) and the
        learned messages' buckets; the ageing rule is the defaults'."""
        epoch, buckets = self._call("read the model", self.client.hmget, self._meta(), [b"epoch", b"buckets"])
        try:
            nb = max(0, min(int(buckets), 1 << 24))
        except (TypeError, ValueError):
            nb = 0
        return Settings(epoch or b"", {"buckets": nb, "registry_buckets": REGISTRY_BUCKETS})

    def _drop_epoch(self, st: Settings):
        keys = [self._bucket(st.epoch, k) for k in range(st.buckets)]
        keys += [self._reg(st.epoch, k) for k in range(st.registry_buckets)] + [self._long(st.epoch)]
        for i in range(0, len(keys), 1000):
            self._call("remove the old model", self.client.unlink, *keys[i:i + 1000])

    def model(self):
        """The whole model, read bucket by bucket (``store pull``, the batch commands)."""
        from spamnb.model import SpamModel

        st = self.settings(refresh=True)
        s = st.s
        pipe = self.client.pipeline(transaction=False)
        for k in range(st.buckets):
            pipe.hgetall(self._bucket(st.epoch, k))
        pipe.hgetall(self._long(st.epoch))
        for k in range(st.registry_buckets):
            pipe.hgetall(self._reg(st.epoch, k))
        pipe.hget(self._meta(), "counts")
        pipe.hget(self._meta(), "epoch")
        replies = self._call("read the model", pipe.execute)
        if replies[-1] != st.epoch:
            raise StoreUnavailable(f"the model in {self.name} changed while it was read; try again")
        try:
            return SpamModel.from_state(self._state(st, replies))
        except (ValueError, TypeError, KeyError, struct.error) as exc:  # ModelFormatError is a ValueError
            raise self.malformed(str(exc)) from None

    def _state(self, st: Settings, replies) -> dict:
        """The model's state (:meth:`spamnb.model.SpamModel.to_state`'s form) from :meth:`model`'s
        replies; ValueError (or struct.error) for a value that is not one spamnb writes."""
        import numpy as np

        s = st.s
        long_texts = replies[st.buckets]
        tokens, rows = [], []
        for bucket in replies[:st.buckets]:
            for field, value in bucket.items():
                if len(field) != 8:
                    continue
                if len(value) < VALUE.size:
                    raise ValueError("a token value is short")
                h, sp, df, day = VALUE.unpack_from(value)
                check_value(h, sp, df)
                text = value[VALUE.size:] or long_texts.get(field, b"")
                tokens.append(text.decode("utf-8", "surrogatepass"))
                rows.append((h, sp, df, day))
        registry = {}
        for bucket in replies[st.buckets + 1:st.buckets + 1 + st.registry_buckets]:
            if any(c not in (b"0", b"1") or len(k) != 16 for k, c in bucket.items()):
                raise ValueError("a learned message has no class")
            registry.update((k, int(c)) for k, c in bucket.items())
        if replies[-2] is None or len(replies[-2]) != COUNTS.size:
            raise ValueError("the counts are not 5 numbers")
        n_h, n_s, _, _, _ = check_counts(COUNTS.unpack(replies[-2]))
        a = np.array(rows, dtype=np.float64).reshape(-1, 4)
        order = np.argsort(np.array(tokens, dtype=object), kind="stable") if tokens else np.arange(0)
        tokens = [tokens[i] for i in order]
        a = a[order]
        return {
            "format": "spamnb-model", "format_version": 2, "spamnb_version": s.get("spamnb_version"),
            "model_type": s["model_type"], "alpha": s["alpha"], "refine": s["refine"], "prior": s["prior"],
            "features": s["features"], "hash_features": None, "tokenizer": s["tokenizer"],
            "cutoffs": tuple(s["cutoffs"]), "vocabulary": list(tokens),
            "class_count": np.array([n_h, n_s]), "feature_count": a[:, :2].T.copy(),
            "doc_freq": a[:, 2].astype(np.int64), "last_seen": a[:, 3].astype(np.int32),
            "registry": registry, "legacy_registry": {},
            "stats": {"created": s.get("created"), "updated": s.get("pushed"),
                      "spamnb_version": s.get("spamnb_version"), "refine_copies": s.get("refine_copies", [0, 0])},
        }

    # -- changes in place ----------------------------------------------------------

    def edit(self, change, *, dry_run=False):
        """``change`` on the store's model in place: prune's sweeps run as it asks for them
        (each bucket's in one script call), the settings it changed (the cut-offs, the
        ageing rule learners apply from then on) are written at the end in one request,
        refused if the model was replaced meanwhile. A dry run sweeps nothing, writes nothing."""
        e = StoreEdit(self, dry_run)
        out = change(e)
        if not dry_run and e.doing is not None:
            self._set_settings(e.st, e.s, e.doing)
        return out

    def _set_settings(self, st: Settings, s: dict, doing: str):
        """Replace the settings of the model ``st`` was read from (:data:`SET_SETTINGS`)."""
        if not self._call(doing, self.client.eval, SET_SETTINGS, 1, self._meta(), st.epoch, json.dumps(s),
                          secrets.token_hex(8)):
            raise StoreUnavailable(f"the model in {self.name} was replaced meanwhile; {doing} again")
        self._settings = None

    def _age_buckets(self, st: Settings, age, max_messages, dry_run) -> tuple[int, int]:
        """``(dropped, before)``: sweep every bucket of the model ``st`` by prune's rule."""
        counts = self._call("read the model", self.client.hget, self._meta(), "counts")
        try:
            before = int(check_counts(COUNTS.unpack(counts or b""))[4])
        except (ValueError, struct.error):
            raise self.malformed("the counts are not 5 finite, non-negative numbers") from None
        dropped = 0
        for i in range(0, st.buckets, 256):
            keys = [self._meta(), self._long(st.epoch)] + [self._bucket(st.epoch, k)
                                                           for k in range(i, min(i + 256, st.buckets))]
            n = self._call("prune", self._sweep, keys=keys, args=[st.epoch, _today(), age, max_messages,
                                                                   int(dry_run)])
            if n < 0:
                raise StoreUnavailable(f"the model in {self.name} was replaced meanwhile; run prune again")
            dropped += n
        return dropped, before

    def describe(self, model):
        st = self.settings()
        s = st.s
        info = self._call("read the store", self.client.info, "memory")
        return [
            ("store", self.name),
            ("memory", f"{info.get('used_memory_human', '?')} used by the server (maxmemory "
                       f"{info.get('maxmemory_human', '?')}, policy {info.get('maxmemory_policy', '?')})"),
            ("ageing", f"tokens in at most {s['age_max_messages']} message(s) go {s['age_days']} days after "
                       f"they were last learned; a bucket nobody writes for "
                       f"{s['keep_factor'] * s['age_days']} days expires"),
        ], []


class StoreEdit(Edit):
    """:class:`spamnb.storage.backend.Edit` of a store's model: its settings, read when
    first asked for, and the sweeps of prune's rule."""

    def __init__(self, backend: RedisBackend, dry_run: bool):
        self.backend = backend
        self.dry_run = dry_run
        #: the settings of the model edited (:meth:`settings` reads them once) and as changed
        self.st: Settings | None = None
        self.s: dict | None = None
        #: what the settings' write is called in its messages; None: nothing to write
        self.doing: str | None = None

    def settings(self) -> dict:
        """The settings as changed so far (read from the store the first time)."""
        if self.st is None:
            self.st = self.backend.settings(refresh=True)
            self.s = dict(self.st.s)
        return self.s

    @property
    def cutoffs(self):
        from spamnb.nb.decision import Cutoffs

        return Cutoffs(*self.settings()["cutoffs"])

    @cutoffs.setter
    def cutoffs(self, new):
        self.settings()["cutoffs"] = [float(new.ham_cutoff), float(new.spam_cutoff)]
        self.doing = "set the cut-offs"

    def limit_tokens(self, limit) -> None:
        if limit is not None:  # none is what a store has
            raise _no_limit()

    def age_out(self, *, older_than_days=None, max_messages=1, max_tokens=None):
        if max_tokens is not None:
            raise _no_limit()
        age = AGE_DAYS if older_than_days is None else int(older_than_days)
        s = self.settings()
        out = self.backend._age_buckets(self.st, age, max_messages, self.dry_run)
        s.update(age_days=age, age_max_messages=int(max_messages))  # learners age by this rule from now on
        self.doing = "run prune"
        return out


def _no_limit() -> ModelError:
    return ModelError("a store has no token limit: its size is bounded by the ageing rule and the "
                      "server's maxmemory (docs/many-hosts.md)")


class StoreView(Scorer):
    """A store's model as the decision reads it: the tokenizer settings and the
    cut-offs now, and :meth:`score` / :meth:`explain` that read the message's
    tokens' counts and the totals in one round trip, then weigh them as the
    compiled scorer weighs a journal's changes (:meth:`Scorer.with_overlay` on a
    scorer of no tokens: one definition of the multinomial weights)."""

    def __init__(self, backend: RedisBackend, st: Settings):
        super().__init__(_header(st), *_no_tokens())
        self.backend = backend
        self.settings = st

    def _scorer(self, tokens) -> Scorer:
        from spamnb.storage.journal import Overlay

        st, (n_h, n_s, t_h, t_s, v), found = self.backend.read(tokens)
        if st is not self.settings:  # changed since this view was made (`spamnb cutoffs`): the message
            self.__init__(self.backend, st)  # is decided by the settings its counts were read with
        ov = Overlay()
        ov.tokens = {h: (c[0], c[1], 0, 0.0) for h, c in found.items()}
        ov.d_messages, ov.d_totals, ov.new_vocab, ov.records = [n_h, n_s], [t_h, t_s], int(v), 1
        return Scorer(self.header, *_no_tokens()).with_overlay(ov)

    def score(self, tokens):
        return self._scorer(tokens).score(tokens)

    def explain(self, tokens, n):
        return self._scorer(tokens).explain(tokens, n)


def _header(st: Settings) -> dict:
    """A compiled scorer's header for the store's model as ``st`` describes it."""
    s = st.s
    return {"bias": 0.0, "features": s["features"], "cutoffs": s["cutoffs"], "tokenizer": s["tokenizer"],
            "model": None, "n": 0, "model_type": s["model_type"], "alpha": s["alpha"], "prior": s["prior"],
            "class_count": [0.0, 0.0], "totals": [0.0, 0.0]}


def _no_tokens():
    """A compiled scorer's arrays of no token (keys, weights, counts)."""
    empty = memoryview(b"")
    return empty.cast("Q"), empty.cast("d"), empty.cast("d")


def _sentinel_errors():
    """redis-py's errors for "the Sentinels named no server" (both are ConnectionErrors)."""
    from redis.sentinel import MasterNotFoundError, SlaveNotFoundError

    return MasterNotFoundError, SlaveNotFoundError


def sentinel_address(client) -> str:
    """``HOST:PORT`` of a Sentinel (redis-py's client of one), as errors and the page name it."""
    kw = client.connection_pool.connection_kwargs
    return f"{kw.get('host', '?')}:{kw.get('port', '?')}"


def _sentinel_class():
    """redis-py's Sentinel, counting the Sentinels that answered its last search for the
    primary (``answered``), so that an error can say whether none of them answers (every
    Sentinel down, or unreachable) or they answer without naming a primary up."""
    from redis.sentinel import Sentinel

    class Group(Sentinel):
        answered = None

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            for sentinel in self.sentinels:
                sentinel.sentinel_masters = self._counted(sentinel.sentinel_masters)

        def _counted(self, ask):
            def counted():
                reply = ask()
                self.answered = (self.answered or 0) + 1  # (None: asked outside a search)
                return reply
            return counted

        def discover_master(self, service_name):
            self.answered = 0  # (a race between threads can only miscount this message's wording)
            return super().discover_master(service_name)

    return Group


def _loopback_only():
    """redis-py's connection to a server a Sentinel names, that sends the store's password to a
    loopback address only: without TLS nothing shows that the server named is the store's,
    and a Sentinel that names another host would have the password cross the network in
    clear text (``force_plaintext=yes`` in the URL lifts this)."""
    from redis.exceptions import ConnectionError
    from redis.sentinel import SentinelManagedConnection, SlaveNotFoundError

    class Refused(ConnectionError):
        pass

    class LoopbackOnly(SentinelManagedConnection):
        def connect_to(self, address):
            if not checks.is_loopback(str(address[0])):
                raise Refused(f"the Sentinels name {address[0]}:{address[1]} for the store: without TLS the "
                              f"store's password goes to loopback addresses only; use rediss+sentinel:// (or "
                              f"force_plaintext=yes on a network nobody else can reach)")
            return super().connect_to(address)

        def _connect_retry(self):
            # redis-py's, but a reader that tried every server the Sentinels name says why it
            # refused them rather than "No slave found"
            if self._sock or self.connection_pool.is_master:
                return super()._connect_retry()
            refused = None
            try:
                for address in self.connection_pool.rotate_slaves():
                    try:
                        return self.connect_to(address)
                    except Refused as exc:
                        refused = refused or exc
                    except ConnectionError:
                        continue
            except SlaveNotFoundError:  # (what the generator raises once it has named them all)
                if refused is None:
                    raise
            raise refused

    return LoopbackOnly


def _read_password(path) -> str:
    """The first line of the password file, which must be ours and mode 0600
    (:func:`spamnb.checks.open_private`, checked on the open file)."""
    try:
        with checks.open_private(path, "store's password file") as f:
            return f.readline().decode("utf-8").rstrip("\r\n")
    except ValueError as exc:  # UnicodeDecodeError too: never the bytes themselves
        why = str(exc) if not isinstance(exc, UnicodeDecodeError) else \
            f"the store's password file {path} is not UTF-8 text"
        raise ModelError(why) from None
    except OSError as exc:
        raise ModelError(f"cannot read the store's password file {path}: {exc.strerror}") from None


def _buckets(n_tokens) -> int:
    """A power of two near ``n_tokens`` / :data:`TOKENS_PER_BUCKET` (at least :data:`MIN_BUCKETS`)."""
    want = max(MIN_BUCKETS, n_tokens // TOKENS_PER_BUCKET)
    return 1 << round(math.log2(want))


def _reg_bucket(key: bytes, st: Settings) -> int:
    return int.from_bytes(key[:4], "little") % st.registry_buckets


def _today() -> int:
    return int(time.time() // 86400)
