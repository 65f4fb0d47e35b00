"""What every host's filter did: the verdict history in the model's Redis store, for a
site of several mail hosts (``[history] store = true``, ``--history-store``; shown by
``spamnb web --store URL``).

The same records as :mod:`spamnb.storage.history` (its :func:`~spamnb.storage.history.row`,
the client's address and the SMTP envelope among them when known, plus the host that answered), the same corrections (:func:`~spamnb.storage.history.correct`'s
rule: the newest verdict of the message's Message-ID and its key, of the user when given; a row
recorded before rows held the key, by its Message-ID alone) and the
same retention (rows for :data:`~spamnb.storage.history.ROW_DAYS` days, whole messages of
unsure verdicts for :data:`~spamnb.storage.history.BODY_DAYS` days and of the
:data:`~spamnb.storage.history.KEEP_RECENT` most recent others), and a bound on the
count of rows too (:data:`MAX_ROWS`: a store's memory is the site's).

Layout, under the store's prefix P and ``h:`` (each key with a TTL of the rows' age,
renewed by every record: nothing here lives without one under a volatile ``maxmemory``)::

    P h:next     the last verdict's id (INCR)
    P h:t        sorted set: id -> time (every row; the age and count bounds, date ranges)
    P h:row      hash: id -> the row's columns (JSON)
    P h:body     hash: id -> the whole message, when kept
    P h:bt       sorted set: id -> time of the rows whose message is kept (its age bound)
    P h:kept     sorted set: id -> id of kept messages that were not unsure (their count bound)
    P h:queue    sorted set: id -> id of unsure verdicts kept whole and not corrected (the page's queue)
    P h:mid      hash: "USER\\nMESSAGE-ID\\nKEY" and "\\nMESSAGE-ID\\nKEY" -> the newest verdict's id
                 (KEY: the message's, hex; rows recorded before they held it: without "\\nKEY")
    P h:fix      hash: id -> "LABEL TIME", the user's correction
    P h:now      hash: id -> "VERDICT SCORE", after the page re-scored it

One round trip per record (:data:`RECORD`, a script that writes the row and drops what the
bounds drop, at most :data:`TRIM` rows a call); the server's writer thread sends a burst
of records as one pipeline. Every value read back is checked (:func:`check_row`): a value
no spamnb wrote is a one-line :class:`~spamnb.storage.history.HistoryError`.
"""

from __future__ import annotations

import json
import math
import socket
import time

from spamnb.storage import history as sqlhist
from spamnb.storage.backend import StoreUnavailable
from spamnb.storage.history import HistoryError
from spamnb.storage.store import ModelError

#: the most verdicts the store keeps (the oldest go first)
MAX_ROWS = 200_000
#: rows, messages dropped at most per record (what the bounds drop, a little at a time)
TRIM = 100
KEYS = ("next", "t", "row", "body", "bt", "kept", "queue", "mid", "fix", "now")

#: KEYS: :data:`KEYS`. ARGV: row JSON, body, has body (1/0), verdict, mid key of the user,
#: mid key of any user ("": none), t, now, max rows, row days, keep recent, body days. A row
#: dropped takes its mid keys with it: with its message's key (its JSON's "key"), or without
#: (a row recorded before rows held it).
RECORD = r"""
local K = {}
for i, name in ipairs({'next', 't', 'row', 'body', 'bt', 'kept', 'queue', 'mid', 'fix', 'now'}) do K[name] = KEYS[i] end
local id = redis.call('INCR', K.next)
redis.call('HSET', K.row, id, ARGV[1])
redis.call('ZADD', K.t, ARGV[7], id)
if ARGV[3] == '1' then
  redis.call('HSET', K.body, id, ARGV[2])
  redis.call('ZADD', K.bt, ARGV[7], id)
  if ARGV[4] == 'unsure' then redis.call('ZADD', K.queue, id, id) else redis.call('ZADD', K.kept, id, id) end
end
if ARGV[6] ~= '' then
  redis.call('HSET', K.mid, ARGV[5], id, ARGV[6], id)
end
local now, trim = tonumber(ARGV[8]), 100
local function unbody(ids)
  for _, old in ipairs(ids) do
    redis.call('HDEL', K.body, old)
    redis.call('ZREM', K.bt, old); redis.call('ZREM', K.kept, old); redis.call('ZREM', K.queue, old)
  end
end
local function drop(ids)
  unbody(ids)
  for _, old in ipairs(ids) do
    local text = redis.call('HGET', K.row, old)
    if text then
      local ok, r = pcall(cjson.decode, text)
      if ok and type(r) == 'table' and type(r.message_id) == 'string' and r.message_id ~= '' then
        local user = type(r.user) == 'string' and r.user or ''
        local own = type(r.key) == 'string' and ('\n' .. r.key) or ''
        for _, key in ipairs({user .. '\n' .. r.message_id .. own, '\n' .. r.message_id .. own}) do
          if redis.call('HGET', K.mid, key) == old then redis.call('HDEL', K.mid, key) end
        end
      end
    end
    redis.call('HDEL', K.row, old); redis.call('HDEL', K.fix, old); redis.call('HDEL', K.now, old)
    redis.call('ZREM', K.t, old)
  end
end
drop(redis.call('ZRANGEBYSCORE', K.t, '-inf', '(' .. (now - tonumber(ARGV[10]) * 86400), 'LIMIT', 0, trim))
local over = redis.call('ZCARD', K.t) - tonumber(ARGV[9])
if over > 0 then drop(redis.call('ZRANGE', K.t, 0, math.min(over, trim) - 1)) end
unbody(redis.call('ZRANGEBYSCORE', K.bt, '-inf', '(' .. (now - tonumber(ARGV[12]) * 86400), 'LIMIT', 0, trim))
over = redis.call('ZCARD', K.kept) - tonumber(ARGV[11])
if over > 0 then unbody(redis.call('ZRANGE', K.kept, 0, math.min(over, trim) - 1)) end
local ttl = math.max(1, math.floor(tonumber(ARGV[10]) + 1)) * 86400
for _, key in ipairs(KEYS) do redis.call('EXPIRE', key, ttl) end
return id
"""

#: KEYS: :data:`KEYS`. ARGV: the mid key (with the message's key), label, undo (1/0), now, the mid
#: key without the message's key. The user's correction of the newest verdict of that key, else of
#: the newest row recorded before rows held their message's key, found by Message-ID alone (and
#: only such a row: one holding another message's key is another message)
#: (:func:`spamnb.storage.history.correct`'s rule); 1 when a row changed.
CORRECT = r"""
local K = {}
for i, name in ipairs({'next', 't', 'row', 'body', 'bt', 'kept', 'queue', 'mid', 'fix', 'now'}) do K[name] = KEYS[i] end
local id = redis.call('HGET', K.mid, ARGV[1])
if not id then
  id = redis.call('HGET', K.mid, ARGV[5])
  if not id then return 0 end
  local ok, r = pcall(cjson.decode, redis.call('HGET', K.row, id) or '')
  if not ok or type(r) ~= 'table' or r.key ~= nil then return 0 end
end
if redis.call('HEXISTS', K.row, id) == 0 then return 0 end
local fix = redis.call('HGET', K.fix, id)
local was = fix and string.match(fix, '^(%a+) ') or nil
if ARGV[3] == '1' then
  if was ~= ARGV[2] then return 0 end
  redis.call('HDEL', K.fix, id)
  if redis.call('HEXISTS', K.body, id) == 1 then
    local ok, r = pcall(cjson.decode, redis.call('HGET', K.row, id))
    if ok and type(r) == 'table' and r.verdict == 'unsure' then redis.call('ZADD', K.queue, id, id) end
  end
  return 1
end
if was == ARGV[2] then return 0 end
redis.call('HSET', K.fix, id, ARGV[2] .. ' ' .. ARGV[4])
redis.call('ZREM', K.queue, id)
return 1
"""

#: KEYS: the ``fix`` and ``queue`` keys. ARGV: "check" or "mark", label, now, the ids. The page's
#: correction of those verdicts: each marked and out of the queue, all or none. Every command it
#: writes with is first checked against the caller's ACL (``redis.acl_check_cmd``, Redis 7) and
#: both keys' types, so that a refusal comes before any write (a script is not rolled back: an
#: error half-way would leave what ran); "check" stops there, writing nothing (what the page asks
#: before it learns). The page's writes need no MULTI: an ACL without ``+multi`` refuses MULTI and
#: then runs the commands meant for the transaction one by one.
MARK = r"""
local probe = {{'HSET', KEYS[1], '0', '0'}, {'ZREM', KEYS[2], '0'}}
if redis.acl_check_cmd then
  for _, c in ipairs(probe) do
    if not redis.acl_check_cmd(unpack(c)) then
      return redis.error_reply('NOPERM this user has no permissions to run the ' .. string.lower(c[1]) ..
                               ' command on ' .. c[2] .. ': nothing was marked')
    end
  end
end
for _, want in ipairs({{KEYS[1], 'hash'}, {KEYS[2], 'zset'}}) do
  local kind = redis.call('TYPE', want[1])['ok']
  if kind ~= 'none' and kind ~= want[2] then
    return redis.error_reply('WRONGTYPE ' .. want[1] .. ' is a ' .. kind .. ', not a ' .. want[2] ..
                             ': nothing was marked')
  end
end
if ARGV[1] ~= 'mark' then return 0 end
for i = 4, #ARGV do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[2] .. ' ' .. ARGV[3])
  redis.call('ZREM', KEYS[2], ARGV[i])
end
return #ARGV - 3
"""

LABELS = ("spam", "ham", "unsure")
#: the row's columns and what each may hold (the envelope's, :data:`~spamnb.storage.history.ENVELOPE_COLUMNS`,
#: absent from a row that has none, and from the rows an older spamnb recorded: None when read)
TEXTS = ("sender", "subject", "message_id", "user", "via", "dest", "host", *sqlhist.ENVELOPE_COLUMNS)
NUMBERS = ("score", "p", "ham_cut", "spam_cut")
LONGEST = 1000  # characters of a text column (history.fields and envelope_columns cut at 300)


def host_name() -> str:
    """This host's name, as a row says which host answered."""
    return socket.gethostname()[:255]


def check_row(value, rid, now=None) -> dict:
    """The row ``value`` (JSON bytes) of verdict ``rid``, when it holds what spamnb writes (its
    numbers: :func:`spamnb.storage.history.check_numbers`, at the time ``now``); ValueError
    naming what is wrong otherwise."""
    try:
        r = json.loads(value)
    except (ValueError, UnicodeDecodeError, TypeError):
        raise ValueError("not JSON") from None
    if not isinstance(r, dict):
        raise ValueError("not a JSON object")
    if r.get("verdict") not in LABELS:
        raise ValueError(f"its verdict is {r.get('verdict')!r}")
    if r.get("learned") not in (None, "spam", "ham"):
        raise ValueError(f"its learned label is {r.get('learned')!r}")
    for k in TEXTS:
        v = r.get(k)
        if v is not None and (not isinstance(v, str) or len(v) > LONGEST):
            raise ValueError(f"its {k} is not a text of at most {LONGEST} characters")
    sqlhist.check_numbers(r, now)  # its time, score, P(spam), cut-offs and size
    out = {k: r.get(k) for k in ("t", "verdict", "learned", "size", *NUMBERS, *TEXTS)}
    out["id"] = rid
    return out


def check_correction(value, now=None):
    """``(label, time)`` of a correction's ``"LABEL TIME"`` value: its time one a row may hold
    (:func:`spamnb.storage.history.check_time`); ValueError."""
    label, t = check_pair(value, ("spam", "ham"), "correction")
    sqlhist.check_time(t, "correction's time", now)
    return label, t


def check_pair(value, first, what):
    """``(word, number)`` of a ``"WORD NUMBER"`` value (a correction, a re-scoring); ValueError."""
    try:
        word, number = value.decode("ascii").split(" ")
        number = float(number)
    except (ValueError, UnicodeDecodeError, AttributeError):
        raise ValueError(f"its {what} is not \"LABEL NUMBER\"") from None
    if word not in first or not math.isfinite(number):
        raise ValueError(f"its {what} is {value[:40]!r}")
    return word, number


class RedisHistory:
    """The history in the store of ``backend`` (a :class:`spamnb.storage.redisstore.RedisBackend`):
    :func:`spamnb.storage.history.row`'s records, :func:`~spamnb.storage.history.correct`'s
    corrections, and what the page reads (:class:`spamnb.web.storesite.StoreSite`)."""

    def __init__(self, backend, *, max_rows=MAX_ROWS, row_days=sqlhist.ROW_DAYS, keep_recent=sqlhist.KEEP_RECENT,
                 body_days=sqlhist.BODY_DAYS):
        self.backend = backend
        self.client = backend.client  # the primary: records and corrections are writes
        self.keys = [backend.prefix + b"h:" + k.encode() for k in KEYS]
        self.k = dict(zip(KEYS, self.keys))
        self.bounds = (max_rows, row_days, keep_recent, body_days)
        self.path = f"the store {backend.name}"  # what a server says it records in
        self.host = host_name()
        self._record = self.client.register_script(RECORD)
        self._correct = self.client.register_script(CORRECT)
        self._mark = self.client.register_script(MARK)

    def _call(self, what, fn, *args, **kwargs):
        return self.backend._call(what, fn, *args, **kwargs)

    # -- writing ------------------------------------------------------------------

    def _record_args(self, cols, body, now):
        cols = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in cols.items()
                if v is not None or k not in sqlhist.ENVELOPE_COLUMNS}  # most rows have no envelope: no nulls
        cols["host"] = self.host
        key = cols.pop("message_key", None)
        if key is not None:
            cols["key"] = key.hex()
        mid, user = cols.get("message_id") or "", cols.get("user") or ""
        own = f"\n{cols['key']}" if key is not None else ""
        max_rows, row_days, keep_recent, body_days = self.bounds
        keys = [f"{who}\n{mid}{own}".encode("utf-8", "replace") for who in (user, "")] if mid else [b"", b""]
        return [json.dumps(cols, allow_nan=False), body or b"", int(body is not None), cols["verdict"], *keys,
                repr(float(cols["t"])), repr(now), max_rows, row_days, keep_recent, body_days]

    def _corr_args(self, raw, label, user, undo, now):
        from spamnb.mail.identity import message_key

        mid = sqlhist.fields(raw)["message_id"]
        if not mid:
            return None
        old = f"{user}\n{mid}" if user else f"\n{mid}"
        return [f"{old}\n{message_key(raw).hex()}".encode("utf-8", "replace"), label, int(bool(undo)), repr(now),
                old.encode("utf-8", "replace")]

    def write(self, records, corrections=()):
        """Write ``records`` (:func:`spamnb.storage.history.row`'s) and ``corrections``
        (``(raw, label, user, undo)``) in one round trip; StoreUnavailable when the store fails."""
        now = time.time()
        calls = [(self._record.sha, self._record_args(cols, body, now)) for cols, body in records]
        for c in corrections:
            args = self._corr_args(*c, now)
            if args is not None:
                calls.append((self._correct.sha, args))
        if calls:
            self._call("record the history", self._send, calls)

    def _send(self, calls, keys=None):
        """EVALSHA each of ``calls`` in one pipeline (with ``keys``, :data:`KEYS`' by default); the
        scripts loaded and sent again when the server lacks them (restarted, flushed). Not
        redis-py's pipelined Script, which asks SCRIPT EXISTS first: a round trip more, and a
        command the documented ACL user lacks."""
        import redis  # there: a RedisBackend was made

        keys = self.keys if keys is None else keys
        for attempt in (0, 1):
            pipe = self.client.pipeline(transaction=False)
            for sha, args in calls:
                pipe.evalsha(sha, len(keys), *keys, *args)
            try:
                return pipe.execute()
            except redis.exceptions.NoScriptError:
                if attempt:
                    raise
                # every script, not just the missing one: a pipeline that found one loaded and
                # another not would run its first calls, then all of them again
                for script in (RECORD, CORRECT, MARK):
                    self.client.script_load(script)

    def record(self, raw, label, score, p, **kw):
        """Record one verdict now (``filter --store``): one round trip."""
        self.write([sqlhist.row(raw, label, score, p, **kw)])

    def mark(self, rids, label, *, check=False):
        """The page's correction of verdicts ``rids`` to ``label``, now: one :data:`MARK` call,
        every row marked and out of the queue or none (StoreUnavailable then, before any write).
        ``check``: only ask whether the store would take it (this user's ACL, the keys' types),
        writing nothing: what the page asks before it learns."""
        args = ["check" if check else "mark", label, repr(time.time()), *rids]
        self._call("check that the correction can be recorded" if check else "record the correction",
                   self._send, [(self._mark.sha, args)], [self.k["fix"], self.k["queue"]])

    def rescored(self, updates):
        """``[(verdict, score, id)]`` of the page's re-scoring."""
        if updates:
            self._call("record the history", self.client.hset, self.k["now"],
                       mapping={rid: f"{label} {score!r}" for label, score, rid in updates})

    # -- reading ------------------------------------------------------------------

    def malformed(self, rid, what, key="row"):
        """The error of verdict ``rid``'s value in ``key`` (``row``, its correction ``fix``, its
        re-scoring ``now``): it names that value and the one command that removes it, so a value
        no spamnb wrote stops no page for longer than it takes to run that."""
        name = self.k[key].decode("utf-8", "replace")
        restart = f"delete the history's keys ({self.backend.prefix.decode('utf-8', 'replace')}h:*) to start it again"
        remedy = f"remove it (HDEL '{name}' {rid}) or {restart}" if isinstance(rid, int) else restart
        return HistoryError(f"the store {self.backend.name} holds a malformed history (verdict {rid} in "
                            f"{name}: {what}); {remedy}")

    def check(self):
        """HistoryError when a history key holds a value of a type spamnb never writes there
        (another program's key under this prefix); what ``spamnb web --store`` checks first."""
        want = {"next": b"string", "t": b"zset", "row": b"hash", "body": b"hash", "bt": b"zset", "kept": b"zset",
                "queue": b"zset", "mid": b"hash", "fix": b"hash", "now": b"hash"}
        pipe = self.client.pipeline(transaction=False)
        for key in self.keys:
            pipe.type(key)
        for name, kind in zip(KEYS, self._call("read the history", pipe.execute)):
            kind = kind if isinstance(kind, bytes) else str(kind).encode()
            if kind not in (b"none", want[name]):
                raise HistoryError(f"the store {self.backend.name} holds a malformed history: "
                                   f"{self.k[name].decode('utf-8', 'replace')} is a {kind.decode()}, not a "
                                   f"{want[name].decode()}; delete the history's keys "
                                   f"({self.backend.prefix.decode('utf-8', 'replace')}h:*) to start it again")
        self._call("read the history", self.client.zcard, self.k["t"])

    def ids(self, which="t", start=0, stop=-1, *, since=None, until=None):
        """Ids of ``which`` (a sorted set), newest first: ranks ``start``..``stop``, or times in
        [``since``, ``until``)."""
        if since is None and until is None:
            found = self._call("read the history", self.client.zrevrange, self.k[which], start, stop)
        else:
            found = self._call("read the history", self.client.zrevrangebyscore, self.k[which],
                               "(" + repr(until) if until is not None else "+inf",
                               repr(since) if since is not None else "-inf")
        return [self._id(v) for v in found]

    def _id(self, v):
        try:
            text = v.decode("ascii")
            if not text.isdigit() or len(text) > 18:
                raise ValueError
            return int(text)
        except (ValueError, UnicodeDecodeError, AttributeError):
            raise self.malformed(repr(v[:20]), "an id that is not a number") from None

    def count(self, which="t"):
        return int(self._call("read the history", self.client.zcard, self.k[which]))

    def rows(self, ids, *, bodies=False):
        """The rows of ``ids`` (missing ones left out), as the page's
        :data:`spamnb.web.data.COLUMNS` with ``kept`` (and ``raw`` with ``bodies``): one round trip."""
        if not ids:
            return []
        pipe = self.client.pipeline(transaction=False)
        pipe.hmget(self.k["row"], ids)
        pipe.hmget(self.k["fix"], ids)
        pipe.hmget(self.k["now"], ids)
        if bodies:
            pipe.hmget(self.k["body"], ids)
        else:
            pipe.zmscore(self.k["bt"], ids)
        replies = self._call("read the history", pipe.execute)
        out, when = [], time.time()
        for i, rid in enumerate(ids):
            value = replies[0][i]
            if value is None:
                continue
            fix, now = replies[1][i], replies[2][i]
            key = "row"
            try:
                r = check_row(value, rid, when)
                key = "fix"
                r["corrected"], r["corrected_t"] = check_correction(fix, when) if fix else (None, None)
                key = "now"
                r["now_verdict"], r["now_score"] = check_pair(now, LABELS, "re-scoring") if now else (None, None)
            except ValueError as exc:
                raise self.malformed(rid, str(exc), key) from None
            r["kept"] = replies[3][i] is not None
            if bodies:
                r["raw"] = replies[3][i]
            out.append(r)
        return out

    def corrected_ids(self):
        """Ids of the verdicts the user corrected."""
        return [self._id(v) for v in self._call("read the history", self.client.hkeys, self.k["fix"])]


class Now:
    """The store's history for a process that handles one message or one batch, as
    :class:`spamnb.storage.history.Now`: a verdict at once (one round trip), the
    corrections in one round trip at :meth:`close`. A store that fails is a note to
    ``log``: the delivery, or the learning, stands."""

    def __init__(self, hist: RedisHistory, log):
        self.hist, self.log = hist, log
        self.path = hist.path
        self.corrections = []

    def add(self, raw, label, score, p, **kw):
        try:
            self.hist.record(raw, label, score, p, **kw)
        except ModelError as exc:
            self.log(f"history not recorded: {exc}")

    def correct(self, raw, label, user=None, undo=False):
        self.corrections.append((raw, label, user, undo))

    def close(self):
        done, self.corrections = self.corrections, []
        if done:
            try:
                self.hist.write([], done)
            except ModelError as exc:
                self.log(f"history: correction not recorded: {exc}")


class Recorder:
    """A server's recorder into the store: :meth:`add` and :meth:`correct` queue and return at
    once, as :class:`spamnb.storage.history.Recorder`'s; a writer thread sends what is queued
    in one pipeline (one round trip). A store that fails loses those records, said once in the
    log until it answers again, then with their number: the deliveries go on."""

    def __init__(self, hist: RedisHistory, log):
        import queue
        import threading

        self.hist = hist
        self.path = hist.path
        self.log = log
        self.queue = queue.Queue(sqlhist.QUEUE)
        self.dropped = 0
        self.unwritten = 0
        self.failing = False
        self.lost_before = 0  # :attr:`lost` when the store stopped answering
        self.thread = threading.Thread(target=self._run, name="spamnb-history", daemon=True)
        self.thread.start()

    lost = sqlhist.Recorder.lost
    add = sqlhist.Recorder.add
    correct = sqlhist.Recorder.correct
    _put = sqlhist.Recorder._put
    _batch = sqlhist.Recorder._batch

    def _run(self):
        while True:
            records, corrections, stop = self._batch()
            try:
                self.hist.write(records, corrections)
                if self.failing:
                    self.log(f"history: the store records again; {self.lost - self.lost_before} record(s) "
                             "lost while it did not")
                self.failing = False
            except (ModelError, OSError, ValueError) as exc:
                if not self.failing:
                    self.lost_before = self.lost
                    self.log(f"history: {len(records) + len(corrections)} record(s) not written (and none until "
                             f"the store answers): {exc}")
                self.failing = True
                self.unwritten += len(records) + len(corrections)
            if stop:
                return
            time.sleep(sqlhist.LINGER)  # let a burst gather: one round trip for many records

    def close(self, wait=5.0):
        """Write what is queued (at most ``wait`` seconds)."""
        try:
            self.queue.put(None, timeout=wait)
        except Exception:  # noqa: BLE001 - queue.Full: what is left is lost, the server stops anyway
            pass
        self.thread.join(wait)
