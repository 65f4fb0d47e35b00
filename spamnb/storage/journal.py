"""The model's journal: learning that costs the message, not the model.

Why
---
Rewriting the model file for every learned message costs the whole model
(load, re-derive, save, recompile the scorer: about a second for a model of
8,000 messages), and holds the model's lock all that time. So the model file
is a *snapshot*, and each ``learn``, ``forget`` or ``filter -u`` appends one
record per message to ``<model>.journal`` beside it: the message's identity,
the class it leaves and the class it joins, and the change of each of its
tokens' counts. An append costs the message's tokens, a lock, one ``write``
and one ``fsync``; every reader sees snapshot + journal as one model:

* the filter's cold path and the server: :class:`Overlay` sums the records'
  changes, and :meth:`spamnb.storage.scorer.Scorer.score` scores the
  multinomial model from the snapshot's counts plus those changes
  (docs/naive-bayes.md §5: the changed tokens' weights and the class totals
  are recomputed, nothing else);
* every command that loads the model (:func:`spamnb.storage.modelfile.load_model`)
  adds the same changes to the full model.

A compaction (:func:`spamnb.storage.modelfile.compact`) folds the journal into
a new snapshot once it is larger than :data:`MAX_BYTES`.

Records are computed by the learner that appends them, under the model's lock,
from the snapshot's counts (its scorer) and the journal before them: replaying
a record never decides anything, so every reader gets the same counts, and a
count taken out is never more than the count there (as ``forget`` clips).

File layout
-----------
::

    header  b"SPNBJRN1"  8-byte journal id  8-byte save id of the base snapshot
    frame   b"R"  uint32 length  payload  16-byte BLAKE2b of the payload
    payload the records of one update (one learn or forget call), each as
            uint32 length  record
    record  float64 time  16-byte message key  int8 old class  int8 new class
            uint32 n tokens  int32 tokens it adds to the vocabulary less those it takes out
            float64 Δ messages (ham, spam)  float64 Δ total count (ham, spam)
            uint64[n] token hashes (the scorer's)  float64[n] Δ ham  float64[n] Δ spam
            int8[n] Δ messages containing the token  uint32[n] token lengths  the tokens, UTF-8

A journal applies to a snapshot when its base is the snapshot (all records),
or when the snapshot says it folded this journal up to an offset (the records
after it): a compaction installs the new snapshot before it rewrites the
journal, so a crash between the two loses nothing and counts nothing twice.
Any other journal is stale (``train`` replaced the model) and is ignored.

One update is one frame, written with one ``write`` and made durable with one
``fsync`` before the learner says it is done: a ``learn`` of 30 messages
killed at any moment has learned all 30 or none. A frame that is cut short
or fails its digest ends the journal: what follows is ignored, never read as
counts. Readers skip it silently (it may be an append
in progress); writers, who hold the lock, report it and cut it off. So does a
frame whose digest is good but whose records are not ones a learner writes
(:meth:`Record.check`: counts that do not add up, tokens that are not UTF-8,
class changes other than -1, 0 or 1, counts not finite or beyond
:data:`MAX_COUNT`): only the model's owner can write the journal, but a damaged
or crafted frame must end it, never stop every reader or be baked into the snapshot.

Standard library only: ``filter -u`` appends without numpy.
"""

from __future__ import annotations

import math
import os
import struct
import time
from array import array

from spamnb.nb.membership import holds
from spamnb.storage import store
from spamnb.storage.store import ModelError

MAGIC = b"SPNBJRN1"
SUFFIX = ".journal"
_HEADER = struct.Struct("<8s8s8s")
_FRAME = struct.Struct("<cI")
_COUNT = struct.Struct("<I")
_FIXED = struct.Struct("<d16sbbIidddd")
_DIGEST = 16
# Fold the journal into a new snapshot past this size (about 100 messages of
# 300 distinct tokens). The cold path reads the whole journal at each delivery
# and sums the changes of the message's tokens: at 1 MB a cold delivery takes
# 1.2 times as long as with no journal (tools/benchmarks/bench_learning.py), and a
# compaction runs every ~100 learned messages, in the background. (At 4 MB an
# in-process measurement gave +53 ms a delivery, as much as all the rest.)
MAX_BYTES = 1024 * 1024

#: The largest change of counts one record may carry (the sum of its tokens' counts in a
#: class, a class's total): far above what any message spamnb reads can carry (it parses 4 MB).
MAX_COUNT = float(2 ** 32)

try:  # the builtin BLAKE2, without loading OpenSSL at every start-up
    from _blake2 import blake2b
except ImportError:  # pragma: no cover
    from hashlib import blake2b


def journal_path(model_path) -> str:
    return os.fspath(model_path) + SUFFIX


def _digest(payload: bytes) -> bytes:
    return blake2b(payload, digest_size=_DIGEST).digest()


class Record:
    """One learned or forgotten message: ``old``/``new`` class (-1: none), and
    per token its hash, Δ count in each class and (read fully) its text."""

    __slots__ = ("time", "key", "old", "new", "new_vocab", "d_messages", "d_totals",
                 "hashes", "d_ham", "d_spam", "d_df", "tokens")

    def __init__(self, key, old, new, hashes, d_ham, d_spam, d_df, tokens, *, new_vocab, d_messages,
                 d_totals, time_=None):
        self.time = time.time() if time_ is None else time_
        self.key, self.old, self.new = key, old, new
        self.new_vocab = new_vocab
        self.d_messages, self.d_totals = d_messages, d_totals
        self.hashes, self.d_ham, self.d_spam, self.d_df, self.tokens = hashes, d_ham, d_spam, d_df, tokens

    def encode(self) -> bytes:
        """The record's bytes (a frame holds them: :func:`frame`)."""
        blobs = [t.encode("utf-8", "surrogatepass") for t in self.tokens]
        payload = b"".join((
            _FIXED.pack(self.time, self.key, self.old, self.new, len(self.hashes), self.new_vocab,
                        *self.d_messages, *self.d_totals),
            array("Q", self.hashes).tobytes(), array("d", self.d_ham).tobytes(),
            array("d", self.d_spam).tobytes(), array("b", self.d_df).tobytes(),
            array("I", map(len, blobs)).tobytes(), b"".join(blobs)))
        return payload

    @classmethod
    def decode(cls, payload: bytes, *, texts: bool, validate: bool = False) -> "Record":
        """The record in ``payload``; ``texts``: with its tokens' text. ``validate``: also
        ValueError unless it passes :meth:`check` and its tokens are UTF-8 whose lengths
        add up (checked on the whole blob, without making a string per token)."""
        t, key, old, new, n, new_vocab, mh, ms, th, ts = _FIXED.unpack_from(payload)
        at = _FIXED.size
        arrays = []
        for code in "QddbI":
            a = array(code)
            a.frombytes(payload[at:at + a.itemsize * n])
            arrays.append(a)
            at += a.itemsize * n
        if any(len(a) != n for a in arrays):
            raise ValueError("record arrays cut short")
        tokens = None
        if texts:
            tokens, blob = [], payload[at:]
            pos = 0
            for ln in arrays[4]:
                tokens.append(blob[pos:pos + ln].decode("utf-8", "surrogatepass"))
                pos += ln
            if pos != len(blob):
                raise ValueError("record tokens do not match their lengths")
        rec = cls(key, old, new, arrays[0], arrays[1], arrays[2], arrays[3], tokens, new_vocab=new_vocab,
                  d_messages=(mh, ms), d_totals=(th, ts), time_=t)
        if validate:
            rec.check()
            if not texts:
                _check_texts(payload[at:], arrays[4])
        return rec

    def check(self) -> None:
        """ValueError unless the record's numbers are ones a learner writes: one message
        leaves at most one class and joins at most one (-1, 0 or 1 each), counts finite and
        within :data:`MAX_COUNT`, at most one message per token."""
        if not math.isfinite(self.time) or self.old not in (-1, 0, 1) or self.new not in (-1, 0, 1):
            raise ValueError("record time or classes out of range")
        if any(d not in (-1.0, 0.0, 1.0) for d in self.d_messages):
            raise ValueError("record message counts out of range")
        if not all(math.isfinite(t) and abs(t) <= MAX_COUNT for t in self.d_totals):
            raise ValueError("record totals out of range")
        if self.new_vocab > len(self.hashes):
            raise ValueError("record new tokens out of range")
        for a in (self.d_ham, self.d_spam):  # one message's counts: their sum is its length
            if not sum(map(abs, a)) <= MAX_COUNT:  # a NaN fails the comparison, an inf the bound
                raise ValueError("record token counts out of range")
        if self.d_df.tobytes().translate(None, b"\x00\x01\xff"):  # int8 -1, 0, 1: no more
            raise ValueError("record token message counts out of range")


class Journal:
    """What a journal file holds for a snapshot: its id, where its records start
    and end (file offsets), the raw bytes from :attr:`start` on, and
    :attr:`damaged`: bytes ignored after the last good record."""

    def __init__(self, path, jid, start, end, size, data, decoded=None):
        self.path, self.id, self.start, self.end, self.size = path, jid, start, end, size
        self._data = data  # the file's bytes from `start`
        self._decoded = decoded  # the records without texts, as checking them decoded them

    @property
    def damaged(self) -> int:
        return self.size - self.end

    def between(self, a: int, b: int) -> bytes:
        """The file's bytes from offset ``a`` to ``b`` (both within the records read)."""
        return self._data[a - self.start:b - self.start]

    def records(self, *, texts=False):
        """The records from :attr:`start` to :attr:`end`, decoded."""
        if not texts and self._decoded is not None:
            yield from self._decoded
            return
        for at, ln in self._frames():
            yield from _unframe(self._data[at + _FRAME.size:at + _FRAME.size + ln], texts)

    def __len__(self):
        data = self._data
        return sum(_COUNT.unpack_from(data, at + _FRAME.size)[0] for at, _ in self._frames())

    def _frames(self):
        at, stop = 0, self.end - self.start
        while at < stop:
            ln = _FRAME.unpack_from(self._data, at)[1]
            yield at, ln
            at += _FRAME.size + ln + _DIGEST


def frame(payloads) -> bytes:
    """One update's records as a frame: written whole, or ignored whole."""
    body = _COUNT.pack(len(payloads)) + b"".join(_COUNT.pack(len(p)) + p for p in payloads)
    return _FRAME.pack(b"R", len(body)) + body + _digest(body)


def _unframe(body: bytes, texts: bool):
    (n,) = _COUNT.unpack_from(body)
    at = _COUNT.size
    for _ in range(n):
        (ln,) = _COUNT.unpack_from(body, at)
        at += _COUNT.size
        yield Record.decode(body[at:at + ln], texts=texts)
        at += ln


def _good_end(data: bytes, decoded=None) -> int:
    """Length of the run of whole frames with good digests and valid records
    (:func:`_valid_body`) at the start of ``data``; ``decoded``, a list: gets their
    records (without texts), so that a reader decodes them once."""
    at = 0
    while at + _FRAME.size <= len(data):
        tag, ln = _FRAME.unpack_from(data, at)
        body = at + _FRAME.size
        if tag != b"R" or body + ln + _DIGEST > len(data) or ln < _COUNT.size:
            break
        if _digest(data[body:body + ln]) != data[body + ln:body + ln + _DIGEST]:
            break
        records = _valid_body(data[body:body + ln])
        if records is None:
            break
        if decoded is not None:
            decoded += records
        at = body + ln + _DIGEST
    return at


# bytes.translate deletes these: what is left of a token's first bytes is UTF-8 continuation bytes
_NOT_CONTINUATION = bytes(b for b in range(256) if not 0x80 <= b < 0xC0)


def _check_texts(blob: bytes, lengths) -> None:
    """ValueError unless ``blob`` is the tokens of ``lengths``, each UTF-8 (as written:
    surrogates allowed): the blob is, and no token ends inside a character."""
    from itertools import accumulate
    from operator import itemgetter

    if sum(lengths) != len(blob):
        raise ValueError("record tokens do not match their lengths")
    blob.decode("utf-8", "surrogatepass")
    starts = list(accumulate(lengths))[:-1]  # where each token after the first begins
    if len(starts) > 1:  # one C call each, not a Python step per token
        firsts = bytes(itemgetter(*starts)(blob))
    else:
        firsts = bytes(blob[p] for p in starts)
    if firsts.translate(None, _NOT_CONTINUATION):
        raise ValueError("a record token ends inside a character")


def _valid_body(body: bytes):
    """The records of a frame's body (without texts) if it holds exactly the records it
    says, each one that passes :meth:`Record.check` with tokens in UTF-8 (what every
    reader, and the compaction, will decode); None otherwise."""
    records = []
    try:
        (n,) = _COUNT.unpack_from(body)
        at = _COUNT.size
        for _ in range(n):
            (ln,) = _COUNT.unpack_from(body, at)
            at += _COUNT.size
            if at + ln > len(body):
                return None
            records.append(Record.decode(body[at:at + ln], texts=False, validate=True))
            at += ln
    except (struct.error, ValueError):  # UnicodeDecodeError is a ValueError
        return None
    return records if at == len(body) else None


def open_journal(model_path, *, allow_insecure=False):
    """The journal of the model at ``model_path`` opened now: ``(fd, stat)``, or None
    without one (ModelError when it fails the trust checks).

    A reader that opens the journal *before* it loads the snapshot reads a pair
    that belongs together whatever a compaction does meanwhile: a compaction
    renames the new snapshot into place before it replaces the journal, so a
    journal opened first is the snapshot's own, or the one the newer snapshot
    folded (whose records past the fold :func:`read` adds), never a newer one
    that would make an older snapshot's records look stale.
    """
    path = journal_path(model_path)
    uid = None if allow_insecure else store.planted_by(path)
    if uid is not None:  # readers go on without it (the writers refuse: see update)
        _say_once(store.planted_message(path, uid, "ignoring the journal", "what it holds is not counted"))
        return None
    try:
        return store.open_trusted(path, allow_insecure=allow_insecure, what="journal")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ModelError(f"cannot read the journal {path}: {exc.strerror or exc}") from None


_said = set()


def _say_once(text: str) -> None:
    """A warning on stderr, once per process (a server reads the journal at every request)."""
    if text not in _said:
        _said.add(text)
        import sys

        sys.stderr.write(f"spamnb: warning: {text}\n")


def read(model_path, save_id: str, folded, *, allow_insecure=False, since=None, opened=None) -> Journal | None:
    """The journal of the snapshot with ``save_id`` that folded ``folded``
    (``{"id": hex, "through": offset}`` or None): a :class:`Journal`, or None
    when there is none or it belongs to another snapshot. ModelError when the
    file fails the trust checks (as a model file would).

    ``since``: ``(journal id, offset)`` of records already read (the server's):
    when the file is still that journal, only what follows is read.
    ``opened``: what :func:`open_journal` gave before the snapshot was loaded
    (its descriptor is closed here); else the journal is opened now.
    """
    path = journal_path(model_path)
    if opened is None:
        opened = open_journal(model_path, allow_insecure=allow_insecure)
    if not opened:
        return None
    fd, st = opened
    try:
        head = os.pread(fd, _HEADER.size, 0)
        if len(head) < _HEADER.size:
            return None
        magic, jid, base = _HEADER.unpack(head)
        if magic != MAGIC:
            raise ModelError(f"{path} is not a spamnb journal")
        start = _HEADER.size
        if save_id is not None and base.hex() == save_id:
            pass
        elif folded and folded.get("id") == jid.hex() and _HEADER.size <= folded.get("through", -1) <= st.st_size:
            start = folded["through"]
        else:
            return None  # stale: the snapshot was written without it
        if since is not None and since[0] == jid.hex() and start <= since[1] <= st.st_size:
            start = since[1]
        data = os.pread(fd, st.st_size - start, start)
    finally:
        os.close(fd)
    decoded = []
    return Journal(path, jid.hex(), start, start + _good_end(data, decoded), start + len(data), data, decoded)


class Overlay:
    """The sum of a journal's records: what to add to the snapshot's counts.

    ``tokens``: token hash -> (Δ ham, Δ spam, Δ messages containing it, last
    time seen); each sum is taken from zero in journal order, so every reader
    (cold path, server, full model) adds exactly the same numbers.
    """

    def __init__(self):
        self.tokens: dict[int, list] = {}
        self.texts: dict[int, str] = {}
        self.registry: dict[bytes, int] = {}  # key -> class now (-1: forgotten)
        self.d_messages = [0.0, 0.0]
        self.d_totals = [0.0, 0.0]
        self.new_vocab = 0
        self.records = 0
        self.last_time = None

    def __bool__(self):
        return self.records > 0

    def add(self, rec: Record, *, only=None) -> None:
        """Add one record; ``only``: a set of token hashes, the only ones kept
        per token (a delivery needs its own tokens' changes, not all of them)."""
        self.records += 1
        self.last_time = rec.time
        self.registry[rec.key] = rec.new
        self.new_vocab += rec.new_vocab
        for c in (0, 1):
            self.d_messages[c] += rec.d_messages[c]
            self.d_totals[c] += rec.d_totals[c]
        hashes = rec.hashes
        if only is None:
            positions = range(len(hashes))
        else:
            hit = only.intersection(hashes)
            if not hit:
                return
            at = dict(zip(hashes, range(len(hashes))))  # C-speed; array.index would be O(n) per hit
            positions = [at[h] for h in hit]
        texts = rec.tokens
        tokens, get = self.tokens, self.tokens.get
        dh, ds, dd, t = rec.d_ham, rec.d_spam, rec.d_df, rec.time
        for i in positions:  # a new tuple each time, never a change in place: a copy() shares them
            h = hashes[i]
            d = get(h)
            if d is None:
                tokens[h] = (0.0 + dh[i], 0.0 + ds[i], dd[i], t)
                if texts is not None:
                    self.texts[h] = texts[i]
            else:
                tokens[h] = (d[0] + dh[i], d[1] + ds[i], d[2] + dd[i], t)

    def copy(self) -> "Overlay":
        """An independent copy (the server adds records to a copy while requests read the old one)."""
        new = Overlay()
        new.tokens, new.texts, new.registry = dict(self.tokens), dict(self.texts), dict(self.registry)
        new.d_messages, new.d_totals = list(self.d_messages), list(self.d_totals)
        new.new_vocab, new.records, new.last_time = self.new_vocab, self.records, self.last_time
        return new

    @classmethod
    def of(cls, journal: Journal | None, *, only=None, texts=False) -> "Overlay":
        ov = cls()
        if journal is not None:
            for rec in journal.records(texts=texts):
                ov.add(rec, only=only)
        return ov


# -- writing -----------------------------------------------------------------------


def new_id() -> bytes:
    return os.urandom(8)


def write_fresh(model_path, save_id: str, body: bytes = b"") -> str:
    """Replace the journal with a new one for the snapshot ``save_id`` holding the
    record bytes ``body``, atomically (the model's mode without write bits for others:
    :func:`spamnb.storage.store.companion_mode`; fsynced). Returns its id (hex).
    The caller holds the model's lock."""
    jid = new_id()
    store.write_bytes_atomic(journal_path(model_path), [_HEADER.pack(MAGIC, jid, bytes.fromhex(save_id)), body],
                             mode=store.companion_mode(model_path))
    return jid.hex()


def append(model_path, journal: Journal | None, save_id: str, records, *, warn=None) -> None:
    """Append ``records`` (encoded) to the journal, under the model's lock (the caller's).

    ``journal``: what :func:`read` gave under this lock. No journal, or a stale
    one: a fresh journal for the snapshot ``save_id`` is written with them. A
    damaged tail is reported through ``warn`` and cut off first, so the new
    records follow the last good one. Returns when they are on disk (fsync).
    """
    body = frame(records)
    if journal is None:
        write_fresh(model_path, save_id, body)
        return
    path = journal.path
    try:
        fd, _ = store.open_trusted(path, what="journal", flags=os.O_WRONLY)
    except OSError as exc:
        raise ModelError(f"cannot write the journal {path}: {exc.strerror or exc}") from None
    try:
        if journal.damaged:
            if warn:
                warn(f"the journal {path} had a damaged tail ({journal.damaged} bytes after byte "
                     f"{journal.end}: an interrupted write); ignored and cut off")
            os.ftruncate(fd, journal.end)
        os.lseek(fd, journal.end, os.SEEK_SET)
        view = memoryview(body)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except OSError as exc:
        try:
            os.ftruncate(fd, journal.end)  # no half record left behind for the next reader
        except OSError:
            pass
        raise ModelError(f"cannot write the journal {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


# -- learning ----------------------------------------------------------------------


class NeedsModel(Exception):
    """This update cannot be journaled (no fresh scorer, a model of format 1's
    message keys): the caller updates the full model instead."""


LABEL_IDS = {"ham": 0, "spam": 1}


def update(model_path, items, *, forget=False, allow_insecure=False, timeout=None, warn=None) -> dict:
    """Learn (or, with ``forget``, forget) messages into the journal of the model at ``model_path``.

    ``items``: ``(raw, label, tokens)`` with ``tokens`` the message's tokens
    under the model's tokenizer, or None to tokenize here. Under the model's
    lock (``timeout``: seconds, :func:`spamnb.storage.store.lock_timeout` for
    None): the snapshot's scorer and the journal give each message's class and
    its tokens' counts now; one record per message that changes the model is
    appended, all in one write and one fsync. Learning follows
    :meth:`spamnb.model.SpamModel.learn` (a message learned under the other
    label moves, one already known is left alone) and forgetting
    :meth:`spamnb.model.SpamModel.forget` (a message not learned under that
    label refuses the whole call with ValueError, before anything is written).

    Returns the counts and each message's outcome (:func:`spamnb.mail.identity.tally`)
    and ``needs_compaction``. Raises NeedsModel when only the full model can do it.
    """
    from spamnb.mail.identity import ALREADY, DUPLICATE, FORGOTTEN, LEARNED, MOVED, message_key, tally
    from spamnb.mail.tokenizer import TokenizerConfig, tokenize
    from spamnb.storage import scorer

    outcomes = []
    uid = None if allow_insecure else store.planted_by(journal_path(model_path))
    if uid is not None:
        raise ModelError(store.planted_message(journal_path(model_path), uid, "the journal",
                                               "nothing is learned into this model while it is there"))
    with store.model_lock(model_path, timeout=timeout):
        try:
            sc = scorer.fresh_scorer(model_path, allow_insecure=allow_insecure)
        except scorer.ScorerError as exc:
            raise NeedsModel(str(exc)) from None
        h = sc.header
        if h.get("legacy") or not h.get("save_id"):
            raise NeedsModel("the model still has message keys of format 1")
        journal = read(model_path, h["save_id"], sc.folded, allow_insecure=allow_insecure)
        config = TokenizerConfig.from_dict(sc.tokenizer)
        items = [(raw, label, tokenize(raw, config) if toks is None else toks) for raw, label, toks in items]
        # the journal's changes to these messages' tokens only: the rest cannot matter here
        hashed = {t: scorer.token_hash(t) for _, _, toks in items for t in set(toks)}
        only = set(hashed.values())
        ov = Overlay.of(journal, only=only)
        counter = _Counts(sc, ov, h)
        records, given = [], set()
        for raw, label, toks in items:
            y = LABEL_IDS[label]
            key = message_key(raw)
            now = ov.registry.get(key)
            now = sc.learned_as(key) if now is None else (None if now < 0 else now)
            again = key in given
            given.add(key)
            if forget:
                if again:
                    outcomes.append(DUPLICATE)
                    continue
                if now != y:
                    where = "not learned" if now is None else f"learned as {'ham' if now == 0 else 'spam'}"
                    raise ValueError(f"message was {where}, not as {label}: nothing to forget")
            elif now == y:
                outcomes.append(DUPLICATE if again else ALREADY)
                continue
            rec = counter.record(key, now, -1 if forget else y, toks, hashed)
            ov.add(rec, only=only)
            records.append(rec.encode())
            outcomes.append(FORGOTTEN if forget else LEARNED if now is None else MOVED)
        if records:
            append(model_path, journal, h["save_id"], records, warn=warn)
        size = os.stat(journal_path(model_path)).st_size if records or journal else 0
    done = tally(outcomes)
    done["needs_compaction"] = size > MAX_BYTES or (bool(records) and h.get("model_type") != "multinomial")
    lock = os.fspath(model_path) + ".compact.lock"
    if done["needs_compaction"] and warn and (uid := store.planted_by(lock, lock=True)) is not None:
        warn(store.planted_message(lock, uid, "the compaction's lock", "the journal is never folded "
                                   "into the model while it is there, and grows"))
    return done


class _Counts:
    """The model's counts now (snapshot + journal so far), to build records from."""

    def __init__(self, sc, ov, header):
        self.sc, self.ov = sc, ov
        self.features = header["features"]
        self.messages = header["class_count"]

    def token(self, h):
        """``(n_ham, n_spam)`` now, or None for a token the model does not know (never
        learned, or its messages all forgotten: :mod:`spamnb.nb.membership`)."""
        base = self.sc.counts(h)
        d = self.ov.tokens.get(h)
        if d is None:
            return base
        nh, ns = base if base is not None else (0.0, 0.0)
        nh, ns = nh + d[0], ns + d[1]
        return (nh, ns) if holds(nh, ns) else None

    def record(self, key, old, new, toks, hashed) -> Record:
        """The record moving the message with tokens ``toks`` from class ``old`` to ``new``
        (None / -1: none): its feature row added to ``new`` as learning adds it (every
        token, :func:`spamnb.storage.scorer.feature_values`), and taken out of ``old``
        as forgetting does (the tokens known before it, never below zero).
        ``hashed``: token -> :func:`spamnb.storage.scorer.token_hash`, for every token of ``toks``."""
        from spamnb.storage.scorer import feature_values

        tf: dict[str, int] = {}
        for t in toks:
            tf[t] = tf.get(t, 0) + 1
        tokens = list(tf)
        hashes = [hashed[t] for t in tokens]
        now = [self.token(h) for h in hashes]
        delta = ([0.0] * len(tokens), [0.0] * len(tokens))
        d_df = [0] * len(tokens)
        d_messages = [0.0, 0.0]
        if old is not None and old >= 0:  # take the known tokens' row out of the old class
            known = [i for i, n in enumerate(now) if n is not None]
            for i, v in zip(known, feature_values(self.features, [tf[tokens[i]] for i in known])):
                delta[old][i] -= min(v, max(now[i][old], 0.0))
                d_df[i] -= 1
            d_messages[old] -= min(1.0, max(self.messages[old] + self.ov.d_messages[old], 0.0))
        if new >= 0:  # add the whole row to the new class
            for i, v in enumerate(feature_values(self.features, [tf[t] for t in tokens])):
                delta[new][i] += v
                d_df[i] += 1
            d_messages[new] += 1.0
        else:  # forgetting: only the known tokens take part
            keep = [i for i, n in enumerate(now) if n is not None]
            tokens = [tokens[i] for i in keep]
            hashes = [hashes[i] for i in keep]
            delta = ([delta[0][i] for i in keep], [delta[1][i] for i in keep])
            d_df = [d_df[i] for i in keep]
            now = [now[i] for i in keep]
        # |V| changes by the tokens that join the vocabulary less those that leave it
        after = [holds((0.0 if n is None else n[0]) + dh, (0.0 if n is None else n[1]) + ds)
                 for n, dh, ds in zip(now, *delta)]
        new_vocab = sum(a - (n is not None) for n, a in zip(now, after))
        return Record(key, -1 if old is None else old, new, hashes, delta[0], delta[1], d_df, tokens,
                      new_vocab=new_vocab, d_messages=tuple(d_messages),
                      d_totals=(math.fsum(delta[0]), math.fsum(delta[1])))
