"""What ``spamnb web --store URL`` shows and does: every host's verdicts, from the history in
the store (:mod:`spamnb.storage.redishistory`), and corrections that teach the store's
model, so that the next verdict on every host follows them.

The same methods as :class:`spamnb.web.data.Site`, read from Redis: a page of the
history is one range of a sorted set and one pipeline for its rows; a search by text or
verdict, and the Overview, read the rows of their dates in pipelines of :data:`CHUNK`
(the history is bounded: :data:`spamnb.storage.redishistory.MAX_ROWS`).
"""

from __future__ import annotations

import contextlib
import datetime
import threading
import time

from spamnb.delivery import pipeline
from spamnb.storage import redishistory, redissite, upkeep
from spamnb.storage.redishistory import RedisHistory
from spamnb.storage.store import ModelError
from spamnb.web.data import (LABELS, PAGE, RESCORE, SEARCHED, chosen, explained, marked, per_day_corrections,
                             rescored, teach, time_bound)

CHUNK = 1000  # rows read in one pipeline by a search or the Overview
MODEL_TTL = 10.0  # seconds the Model and Overview pages keep the whole model they read


class StoreSite:
    """The store and its history one ``spamnb web --store`` serves."""

    def __init__(self, backend, *, log=None, hist=None):
        self.backend = backend
        self.hist = hist or RedisHistory(backend)
        self.log = log or (lambda text: None)
        self.lock = threading.Lock()  # one choice (learn, re-score) at a time
        self.full = (0.0, None)
        self.history_path = self.hist.path

    @contextlib.contextmanager
    def request(self):
        yield  # redis-py's pool gives each thread its connection

    # -- the history --------------------------------------------------------------

    def _page(self, ids, page, size, bodies):
        return self.hist.rows(ids[page * size:(page + 1) * size], bodies=bodies)

    def unsure(self, page=0, *, bodies=False, size=PAGE):
        """The queue: unsure messages kept whole and not taught yet."""
        ids = self.hist.ids("queue", page * size, (page + 1) * size - 1)
        return self.hist.rows(ids, bodies=bodies), self.hist.count("queue")

    def _matching(self, since, until, test):
        """Ids of rows in [since, until) for which ``test(row)`` holds, newest first."""
        ids = self.hist.ids(since=since, until=until)
        if test is None:
            return ids
        out = []
        for i in range(0, len(ids), CHUNK):
            out += [r["id"] for r in self.hist.rows(ids[i:i + CHUNK]) if test(r)]
        return out

    def search(self, *, q="", verdict="", since="", until="", user="", page=0, bodies=False, size=PAGE):
        """History rows by text (in :data:`spamnb.web.data.SEARCHED`), verdict, user and time (as
        :meth:`spamnb.web.data.Site.search`)."""
        lo, hi = time_bound(since), time_bound(until, end=True)
        if not q and verdict not in LABELS and not user:
            if lo is None and hi is None:
                ids = self.hist.ids("t", page * size, (page + 1) * size - 1)
                return self.hist.rows(ids, bodies=bodies), self.hist.count("t")
            ids = self._matching(lo, hi, None)
        else:
            needle = q.casefold()

            def test(r):
                return (verdict not in LABELS or r["verdict"] == verdict) and (not user or r["user"] == user) and (
                    not needle or any(needle in (r[c] or "").casefold() for c in SEARCHED))
            ids = self._matching(lo, hi, test)
        return self._page(ids, page, size, bodies), len(ids)

    def message(self, mid):
        """``(row, raw or None)`` of verdict ``mid``; None when there is no such row."""
        found = self.hist.rows([mid], bodies=True)
        if not found:
            return None
        row = found[0]
        return row, row.pop("raw")

    # -- the model --------------------------------------------------------------

    def model(self):
        return self.backend.view()

    def clues(self, raw, model=None):
        return explained(self.model() if model is None else model, raw)

    def clues_of(self, rows):
        model = self.model()
        return {r["id"]: self.clues(bytes(r["raw"]), model=model) for r in rows if r.get("raw") is not None}

    def full_model(self):
        """The store's whole model (for its facts), read again after :data:`MODEL_TTL` seconds."""
        when, m = self.full
        if m is None or time.monotonic() - when > MODEL_TTL:
            m = self.backend.model()
            self.full = (time.monotonic(), m)
        return m

    def facts(self):
        m = self.full_model()
        counts = m.messages
        rows, _ = self.backend.describe(m)
        return [
            *rows,
            ("messages", f"{int(counts[0])} ham, {int(counts[1])} spam"),
            ("vocabulary", f"{len(m.vocabulary)} tokens"),
            ("cut-offs", f"ham if P(spam) <= {m.cutoffs.ham_cutoff:g}, spam if > {m.cutoffs.spam_cutoff:g}"),
            ("model type", f"{m.model_type}, features {m.features}"),
            ("history", f"in the store: {self.hist.count('t')} verdicts of every host"),
        ], m

    def lookup(self, word):
        return self.full_model().lookup(word)

    def prune_preview(self, older_than=90, max_messages=1):
        return upkeep.age_out(self.backend, older_than_days=older_than, max_messages=max_messages, dry_run=True)

    # -- choices -----------------------------------------------------------------

    def learn(self, mids, label):
        """Teach the store's model the messages of verdicts ``mids`` as ``label`` (what a TELL
        does: every host's next verdict follows), mark their rows, re-score the queue:
        ``(subjects, moved)``, as :meth:`spamnb.web.data.Site.learn`.

        Learned and marked, or neither, as far as the store lets anything be: the mark is asked
        for first (:meth:`~spamnb.storage.redishistory.RedisHistory.mark` with ``check``: this
        user's ACL, the keys), so a store that would refuse it refuses before the model learns
        anything (StoreUnavailable). Then the learn, then the mark (one script: every row or
        none). Learning first: a mark that fails after it (the store gone in between) leaves
        the rows in the queue, learned (:class:`~spamnb.web.data.NotMarked`, which the page
        says), and choosing them again marks them (a message is learned once); marking first
        would take out of the queue a message that a failed learn never taught."""
        with self.lock:
            mids, raws, subjects = chosen(self, mids, label)
            self.hist.mark(mids, label, check=True)
            pipeline.learn(self.backend, [(raw, label) for raw in raws], via="web", warn=self.log)
            return marked(self, mids, label, subjects, lambda: self.hist.mark(mids, label), ModelError)

    def teach(self, raw, label):
        """Teach the store's model a message pasted on the Scan page, as a TELL does (its row
        in the store's history marked when the history holds it): :func:`spamnb.web.data.teach`."""
        return teach(self, self.backend, raw, label, lambda: redishistory.Now(self.hist, self.log))

    def rescore(self):
        """Score the newest :data:`RESCORE` messages of the queue again; ``[(id, subject, was, now)]``
        of those whose verdict changed."""
        model = self.model()
        moved, updates = [], []
        for r in self.hist.rows(self.hist.ids("queue", 0, RESCORE - 1), bodies=True):
            if r["raw"] is None:
                continue
            was = r["now_verdict"] or r["verdict"]
            d = rescored(model, r["raw"], r["spam_cut"], r["ham_cut"])
            updates.append((d.label, d.score, r["id"]))
            if d.label != was:
                moved.append((r["id"], r["subject"], was, d.label))
        self.hist.rescored(updates)
        return moved

    # -- the site ---------------------------------------------------------------------

    def site_view(self) -> dict:
        """What the Site view shows, read-only: the hosts that beat in the last hour
        (:func:`spamnb.storage.redissite.hosts`, read where classification reads, so that a
        failover's replicas still answer), whether more did, and the store's servers as the
        Sentinels report them, or one Redis's role (:func:`~spamnb.storage.redissite.servers`).
        A store or Sentinel that does not answer is said in the view, never raised."""
        now = time.time()
        try:
            rows, more = redissite.hosts(self.backend, now)
            error = None
        except ModelError as exc:
            rows, more, error = [], False, str(exc)
        return {"now": now, "hosts": rows, "more": more, "error": error, "servers": redissite.servers(self.backend)}

    # -- the overview ---------------------------------------------------------------

    def _since(self, days):
        ids = self.hist.ids(since=time.time() - days * 86400)
        for i in range(0, len(ids), CHUNK):
            yield from self.hist.rows(ids[i:i + CHUNK])

    def per_day(self, days=30):
        out = {}
        for r in self._since(days):
            day = datetime.date.fromtimestamp(r["t"]).isoformat()
            out.setdefault(day, {}).setdefault(r["verdict"], 0)
            out[day][r["verdict"]] += 1
        return out

    def score_bins(self, lo=-40.0, hi=40.0, bins=40, days=30):
        width = (hi - lo) / bins
        counts = {v: [0] * bins for v in LABELS}
        for r in self._since(days):
            if r["score"] is not None:
                counts[r["verdict"]][max(0, min(bins - 1, int((r["score"] - lo) / width)))] += 1
        return [lo + i * width for i in range(bins + 1)], counts

    def corrections(self, days=90):
        """``{day: {kind: n}}``, a kind of :data:`spamnb.web.data.CORRECTIONS` (of the rows still kept)."""
        since = time.time() - days * 86400
        ids = sorted(self.hist.corrected_ids(), reverse=True)
        rows = (r for i in range(0, len(ids), CHUNK) for r in self.hist.rows(ids[i:i + CHUNK]))
        return per_day_corrections((datetime.date.fromtimestamp(r["corrected_t"]).isoformat(), r["verdict"],
                                    r["corrected"], 1)
                                   for r in rows if r["corrected"] is not None and r["corrected_t"] >= since)
