"""What the page shows and does, without HTML: the history's queries, the model's
facts, learning a message and re-scoring the unsure ones.

Every query reads one page of rows (``LIMIT``/``OFFSET`` on an index), never
the whole history: a history of a year of mail pages as fast as a day's. A
list page reads its rows with their messages in that one query (two with the
count), however many rows it shows, and all of one request's reads and writes
go through one connection (:meth:`Site.request`).
"""

from __future__ import annotations

import collections
import contextlib
import math
import os
import sqlite3
import sys
import threading
import time

from spamnb.delivery import pipeline
from spamnb.mail.mime import MAX_PARSE_BYTES
from spamnb.storage.filestore import FileBackend, ModelHolder, file_state
from spamnb.storage import history
from spamnb.storage.modelfile import default_seed, load_model, own_model_path
from spamnb.verdict import Decision

PAGE = 25
#: The largest message the Scan page takes: the most the tokenizer reads of one (a larger
#: one would be scored, and learned, on its first 4 MB).
MAX_MESSAGE = MAX_PARSE_BYTES
RESCORE = 200  # unsure messages re-scored after a choice (the newest)
LABELS = ("spam", "ham", "unsure")
COLUMNS = ("id", "t", "verdict", "score", "p", "sender", "subject", "message_id", "user", "size", "via",
           "dest", "learned", "corrected", "corrected_t", "now_verdict", "now_score", *history.ENVELOPE_COLUMNS)
#: The text a search looks in: From, Subject, and the envelope's sender and recipients (where known).
SEARCHED = ("sender", "subject", "env_sender", "rcpt")


#: The Overview's kinds of correction (docs/web.md), of a row's verdict and the class taught.
CORRECTIONS = ("false positive", "false negative", "unsure taught")


def correction_kind(verdict, corrected):
    """Which of :data:`CORRECTIONS` a verdict taught as ``corrected`` is: spam taught as ham
    (false positive), ham taught as spam (false negative), unsure taught either way; None
    for a verdict taught as it stood (``spamnb learn --spam`` of mail filed as spam): the
    model learned it, but the filter made no mistake there, so the Overview leaves it out."""
    if verdict == "unsure":
        return "unsure taught"
    if verdict == corrected:
        return None
    return "false positive" if verdict == "spam" else "false negative"


class NotMarked(Exception):
    """The page's choice was learned, but its rows could not be marked in the history (the
    reason): they stay in the queue, and choosing them again marks them (a message is
    learned once). What the page says, with the next page, instead of an error;
    ``subjects``: those of the messages learned, by which it names them."""

    def __init__(self, reason, subjects=()):
        super().__init__(reason)
        self.subjects = list(subjects)


def rescored_queue(site, log):
    """``site.rescore()``, after a choice was learned and marked: a re-scoring that fails is
    a line to ``log`` and None (nothing said of it on the page), never the choice's error."""
    try:
        return site.rescore()
    except Exception as exc:  # noqa: BLE001 - the choice stands; the next choice re-scores again
        log(f"re-scoring the unsure messages failed: {exc.__class__.__name__}: {exc}")
        return None


#: Evidence asked of the pipeline for a message's chips: every token of it the model knows.
EVERY = sys.maxsize


class Reading(pipeline.ModelSource):
    """:class:`spamnb.delivery.pipeline.ModelSource` keeping the tokens the pipeline read: a
    chip shows its token's count in the message, which the evidence does not carry, and the
    message is tokenized once."""

    toks = ()

    def read(self, raw):
        model, self.toks = super().read(raw)
        return model, self.toks


class Clues:
    """What moved one message's score, for its chips: the pipeline's verdict
    (:class:`spamnb.verdict.Decided`) with every known token's contribution to the score
    (its weight times its feature value in the message, the terms the scorer sums:
    ``spamnb explain``'s and ``X-Spam-Evidence``'s numbers), the prior (the rest of the
    score: what a message with no known token scores) and each token's count.

    ``score = prior + sum of every contribution``; a contribution's share is its size
    over the sum of every size, the prior's included: the shares add up to 1."""

    def __init__(self, decided, counts, features=None):
        self.label, self.score, self.p = decided.label, decided.score, decided.p
        self.features = features  # the model's (spamnb.model.FEATURES): what a count becomes
        self.cutoffs = decided.cutoffs
        self.terms = list(decided.evidence or ())  # (token, contribution), the largest size first
        self.prior = self.score - math.fsum(c for _, c in self.terms)
        self.counts = counts
        self.total = abs(self.prior) + math.fsum(abs(c) for _, c in self.terms)

    def share(self, c):
        return abs(c) / self.total if self.total else 0.0

    def direction(self):
        """+1 when the verdict is spam's side, -1 when ham's; an unsure verdict, its score's."""
        return {"spam": 1, "ham": -1}.get(self.label, 1 if self.score > 0 else -1)

    def sides(self, toward=10, against=10, *, enough=False):
        """``[(side, shown, rest_n, rest_sum)]``: the clues pushing toward the verdict (spam's
        side or ham's), then those pushing against it, each side's ``toward`` / ``against``
        largest shown, and the count and the sum of the others. With ``enough``, the side
        toward a spam or ham verdict shows more, up to :data:`MAX_TOWARD`, until the clues
        shown would give the verdict on their own (with the prior and every clue against):
        the chips then explain it, even when it is made of many small pushes."""
        sign = self.direction()
        groups = [[(tok, c) for tok, c in self.terms if c * d > 0] for d in (sign, -sign)]
        if enough and self.label in ("spam", "ham"):
            toward = max(toward, min(self._sufficient(groups[0], groups[1]), MAX_TOWARD))
        out = []
        for n, d, group in ((toward, sign, groups[0]), (against, -sign, groups[1])):
            rest = group[n:]
            out.append(("spam" if d > 0 else "ham", group[:n], len(rest), math.fsum(c for _, c in rest)))
        return out

    def _sufficient(self, toward, against):
        """How many of the clues ``toward`` (largest first) give the verdict with the prior
        and every clue ``against``: a spam's score above the spam cut-off (as log-odds), a
        ham's at or below the ham cut-off."""
        ham_cut, spam_cut = (logit(c) for c in self.cutoffs)
        score = self.prior + math.fsum(c for _, c in against)
        for n, (_, c) in enumerate(toward):
            if (score > spam_cut) if self.label == "spam" else (score <= ham_cut):
                return n
            score += c
        return len(toward)


#: The most clues toward the verdict a message's page shows to explain it (:meth:`Clues.sides`).
MAX_TOWARD = 40


def explained(model, raw) -> Clues:
    """The verdict of ``raw`` under ``model`` now with every known token's contribution: the
    one pipeline's, writing and recording nothing, as :func:`rescored`'s."""
    source = Reading(model, "")
    decided = pipeline.filter_one(raw, source, via="web", evidence=EVERY, headers=False).decided
    return Clues(decided, collections.Counter(source.toks), getattr(model, "features", None))


def chosen(site, mids, label):
    """``(mids, raws, subjects)`` of the verdicts a page chose to learn as ``label`` (an
    id, or a selection: each once), their messages read from ``site``'s history;
    ValueError when the label is not one, nothing was chosen, or a message is not kept."""
    if label not in ("spam", "ham"):
        raise ValueError("learn it as spam or ham")
    mids = [mids] if isinstance(mids, int) else list(dict.fromkeys(mids))
    if not mids:
        raise ValueError("no message chosen: tick the messages to learn")
    raws, subjects = [], []
    for mid in mids:
        found = site.message(mid)
        if found is None or found[1] is None:
            raise ValueError(f"message {mid} is not kept in the history: it cannot be learned from here")
        raws.append(found[1])
        subjects.append(found[0]["subject"])
    return mids, raws, subjects


def marked(site, mids, label, subjects, mark, errors):
    """After the learn: ``mark()`` the rows, then re-score the queue: ``(subjects, moved)``.
    A mark that fails with one of ``errors`` is a line and :class:`NotMarked` (learned,
    not marked: the page says so, and the rows stay in the queue)."""
    which = f"message{'s' if len(mids) > 1 else ''} {', '.join(map(str, mids))}"
    try:
        mark()
    except errors as exc:
        site.log(f"learned {which} as {label}, but not marked in the history: {exc}")
        raise NotMarked(str(exc), subjects) from None
    site.log(f"learned {which} as {label}")
    return subjects, rescored_queue(site, site.log)


def rescored(model, raw, spam_cut, ham_cut):
    """The verdict (:class:`spamnb.verdict.Decided`) of a kept message under
    ``model`` now, at the cut-offs it was delivered with (None: the model's): the one
    pipeline's, writing and recording nothing."""
    source = pipeline.ModelSource(model, "")
    return pipeline.filter_one(raw, source, via="web", decision=Decision(spam_cutoff=spam_cut, ham_cutoff=ham_cut),
                               headers=False).decided

class Site:
    """The model and history one ``spamnb web`` serves, and what it does to them."""

    def __init__(self, model_path, is_default, history_path, *, allow_insecure=False, log=None):
        self.model_path = os.fspath(model_path)
        # learning starts the user's own model from the default one, as `spamnb learn` does
        self.learn_path = os.fspath(own_model_path()) if is_default else self.model_path
        self.history_path = os.fspath(history_path)
        self.allow_insecure = allow_insecure
        self.log = log or (lambda text: None)
        self.holders = {}
        self.lock = threading.Lock()  # one choice (learn, re-score) at a time
        self.local = threading.local()  # the connection of the request this thread answers
        self.full = (None, None)  # (identity, SpamModel) for the Model page

    # -- the database ------------------------------------------------------------

    @contextlib.contextmanager
    def request(self):
        """One connection to the history for everything one request reads and writes: opened
        when first needed, closed when the request ends. The server answers each request on a
        thread of its own (``ThreadingHTTPServer``), so a connection serves one thread and one
        request, and a choice's transaction never takes in another request's statements."""
        self.local.scope = []
        try:
            yield
        finally:
            scope, self.local.scope = self.local.scope, None
            for db in scope:
                db.close()

    @contextlib.contextmanager
    def db(self):
        """The connection of this thread's request (:meth:`request`), else one for this call."""
        scope = getattr(self.local, "scope", None)
        if scope is None:  # outside a request (a script's, a test's call): opened and closed here
            with contextlib.closing(history.open_db(self.history_path, busy_ms=2000)) as db:
                yield db
            return
        if not scope:
            scope.append(history.open_db(self.history_path, busy_ms=2000))
        yield scope[0]

    def query(self, sql, args=()):
        with self.db() as db:
            return db.execute(sql, args).fetchall()

    def rows(self, where="", args=(), *, page=0, size=PAGE, bodies=False):
        """``(rows, total)``: one page of verdicts matching ``where``, newest first; with
        ``bodies``, each row's message too (``raw``: None when not kept), read in the same query."""
        cols, raw = (*COLUMNS, "kept", *(("raw",) if bodies else ())), ", b.raw" if bodies else ""
        with self.db() as db:
            total = db.execute(f"SELECT count(*) FROM verdicts v {where}", args).fetchone()[0]
            cur = db.execute(f"SELECT {', '.join('v.' + c for c in COLUMNS)}, b.id IS NOT NULL{raw} FROM verdicts v "
                             f"LEFT JOIN bodies b ON b.id = v.id {where} ORDER BY v.id DESC LIMIT ? OFFSET ?",
                             (*args, size, page * size))
            rows, now = [dict(zip(cols, r)) for r in cur], time.time()
        for r in rows:
            try:  # a time no page can show as a date (a hand edit's 1e300) is named, never a traceback
                history.check_numbers(r, now)
            except ValueError as exc:
                raise history.HistoryError(f"the history {self.history_path} holds a malformed row (verdict "
                                           f"{r['id']}: {exc}); delete that row or the file to start it "
                                           f"again") from None
        return rows, total

    def unsure(self, page=0, *, bodies=False):
        """The queue: unsure messages kept whole and not taught yet."""
        return self.rows("JOIN bodies k ON k.id = v.id WHERE v.verdict = 'unsure' AND v.corrected IS NULL",
                         page=page, bodies=bodies)

    def search(self, *, q="", verdict="", since="", until="", user="", page=0, size=PAGE, bodies=False):
        """History rows by text (in :data:`SEARCHED`), verdict, user and time (:func:`time_bound`'s
        ``since`` and ``until``: a day, YYYY-MM-DD in local time, or seconds since the epoch)."""
        where, args = [], []
        if q:
            like = "%" + q.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            where.append("(" + " OR ".join(f"v.{c} LIKE ? ESCAPE '\\'" for c in SEARCHED) + ")")
            args += [like] * len(SEARCHED)
        if verdict in LABELS:
            where.append("v.verdict = ?")
            args.append(verdict)
        if user:
            where.append("v.user = ?")
            args.append(user)
        for value, op, end in ((since, ">=", False), (until, "<", True)):
            t = time_bound(value, end=end)
            if t is not None:
                where.append(f"v.t {op} ?")
                args.append(t)
        return self.rows(("WHERE " + " AND ".join(where)) if where else "", args, page=page, size=size,
                         bodies=bodies)

    def message(self, mid):
        """``(row, raw or None)`` of verdict ``mid``; None when there is no such row."""
        found, _ = self.rows("WHERE v.id = ?", (mid,), size=1, bodies=True)
        if not found:
            return None
        row = found[0]
        raw = row.pop("raw")
        return row, None if raw is None else bytes(raw)

    # -- the model --------------------------------------------------------------

    def model(self, path=None):
        """The model as its files are now (a scorer with its journal, else the full model)."""
        path = path or self.current_path()
        holder = self.holders.get(path) or self.holders.setdefault(
            path, ModelHolder(path, allow_insecure=self.allow_insecure, log=self.log))
        return holder.get().model

    def current_path(self):
        """The user's own model once learning made it, else the one served."""
        return self.learn_path if os.path.exists(self.learn_path) else self.model_path

    def clues(self, raw, model=None):
        """What moved the score of ``raw`` under the model now (:class:`Clues`)."""
        return explained(self.model() if model is None else model, raw)

    def clues_of(self, rows):
        """``{id: clues}`` of the ``rows`` read with their messages (``bodies``) that were kept,
        all by one model: the model's files are looked at once a page, not once a row."""
        model = self.model()
        return {r["id"]: self.clues(bytes(r["raw"]), model=model) for r in rows if r["raw"] is not None}

    def full_model(self):
        """The whole model with its journal (for its facts), reloaded when the snapshot or the
        journal changed: a learn, forget or TELL made anywhere appends to the journal, and a
        compaction replaces the snapshot."""
        from spamnb.storage.journal import journal_path

        path = self.current_path()
        ident = (path, *(file_identity(p) for p in (path, journal_path(path))))
        if self.full[0] != ident:
            self.full = (ident, load_model(path, allow_insecure=self.allow_insecure))
        return self.full[1]

    def facts(self):
        """What ``spamnb info`` says, as ``(name, value)`` rows, and the model."""
        import datetime

        from spamnb.storage import journal

        path = self.current_path()
        m = self.full_model()
        stats = m.stats
        counts = m.messages

        def when(t):
            return datetime.datetime.fromtimestamp(t).isoformat(timespec="seconds") if t else "never"

        j = journal.read(path, stats.get("save_id"), stats.get("journal"), allow_insecure=self.allow_insecure)
        jrow = f"{len(j)} update(s), {(j.end - j.start) / 1e3:.0f} kB" if j is not None and len(j) else "empty"
        return [
            ("model file", path),
            ("size", f"{os.path.getsize(path) / 1e6:.1f} MB"),
            ("messages", f"{int(counts[0])} ham, {int(counts[1])} spam"),
            ("vocabulary", f"{len(m.vocabulary)} tokens"),
            ("journal", jrow),
            ("compacted", when(stats.get("compacted"))),
            ("updated", when(stats.get("updated"))),
            ("cut-offs", f"ham if P(spam) <= {m.cutoffs.ham_cutoff:g}, spam if > {m.cutoffs.spam_cutoff:g}"),
            ("model type", f"{m.model_type}, features {m.features}"),
            ("history", f"{self.history_path}"),
        ], m

    def lookup(self, word):
        """What the model (with its journal) knows of ``word``:
        :meth:`spamnb.model.SpamModel.lookup`'s rows."""
        return self.full_model().lookup(word)

    def prune_preview(self, older_than=90, max_messages=1):
        """How many tokens ``spamnb prune --older-than D --max-messages N`` would drop, of how many
        (on a copy loaded for it: the model on disk is not touched)."""
        path = self.current_path()
        m = load_model(path, allow_insecure=self.allow_insecure)
        before = len(m.vocabulary)
        return m.age_out(older_than_days=older_than, max_messages=max_messages), before

    # -- choices -----------------------------------------------------------------

    def learn(self, mids, label):
        """Learn the messages of verdicts ``mids`` (an id, or a page's selection) as ``label``,
        in one update (the path of ``spamnb learn``: the journal, the model's store), mark
        their rows, then re-score the unsure queue once: ``(subjects, moved)``, the subjects
        of the messages learned (by which the page names them) and ``[(id, subject, was,
        now)]`` of the messages whose verdict moved. ValueError when a message is not there
        to learn (then nothing is learned)."""
        with self.lock:
            mids, raws, subjects = chosen(self, mids, label)
            pipeline.learn(FileBackend(self.learn_path, allow_insecure=self.allow_insecure),
                           [(raw, label) for raw in raws], via="web", create=default_seed, warn=self.log)
            # learned first, then marked (in one transaction: every row or none): a mark that fails
            # leaves the rows in the queue, learned, and choosing them again marks them (a message
            # is learned once); marking first would hide a message a failed learn never taught
            return marked(self, mids, label, subjects, lambda: self._mark(mids, label),
                          (sqlite3.Error, history.HistoryError, OSError))

    def _mark(self, mids, label):
        with self.db() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                for mid in mids:
                    history.mark(db, mid, label)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

    def teach(self, raw, label):
        """Learn a message pasted on the Scan page as ``label``, as ``spamnb learn`` does (the
        journal, the model's store): :func:`teach`."""
        return teach(self, FileBackend(self.learn_path, allow_insecure=self.allow_insecure), raw, label,
                     lambda: history.Now(self.history_path, self.log), create=default_seed)

    def rescore(self):
        """Score the newest :data:`RESCORE` messages of the unsure queue again with the model as it
        is now; ``[(id, subject, was, now)]`` of those whose verdict changed."""
        model = self.model()
        moved, updates = [], []
        with self.db() as db:
            cur = db.execute("SELECT v.id, v.subject, coalesce(v.now_verdict, v.verdict), v.ham_cut, v.spam_cut, "
                             "b.raw FROM verdicts v JOIN bodies b ON b.id = v.id WHERE v.verdict = 'unsure' "
                             "AND v.corrected IS NULL ORDER BY v.id DESC LIMIT ?", (RESCORE,))
            for mid, subject, was, ham_cut, spam_cut, raw in cur.fetchall():
                # at the cut-offs it was delivered with (a filter's --spam-cutoff...), else the model's
                d = rescored(model, bytes(raw), spam_cut, ham_cut)
                updates.append((d.label, d.score, mid))
                if d.label != was:
                    moved.append((mid, subject, was, d.label))
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany("UPDATE verdicts SET now_verdict = ?, now_score = ? WHERE id = ?", updates)
                db.execute("COMMIT")
            except BaseException:  # the request's connection goes on: not inside a half-done transaction
                db.execute("ROLLBACK")
                raise
        return moved

    # -- the site ---------------------------------------------------------------------

    def site_view(self):
        """None: a model file has no site; hosts beat into a store (``spamnb web --store``)."""
        return None

    # -- the overview ---------------------------------------------------------------

    def per_day(self, days=30):
        """``{day: {verdict: n}}`` of the last ``days`` days (local time)."""
        since = time.time() - days * 86400
        out = {}
        for day, verdict, n in self.query("SELECT date(t, 'unixepoch', 'localtime') d, verdict, count(*) "
                                          "FROM verdicts WHERE t >= ? GROUP BY d, verdict", (since,)):
            out.setdefault(day, {})[verdict] = n
        return out

    def score_bins(self, lo=-40.0, hi=40.0, bins=40, days=30):
        """``(edges, {verdict: [n per bin]})``: the scores (log-odds) of the last ``days``
        days binned in SQL, clipped into the end bins."""
        width = (hi - lo) / bins
        counts = {v: [0] * bins for v in LABELS}
        for b, verdict, n in self.query(
                "SELECT max(0, min(?, CAST((score - ?) / ? AS INTEGER))) b, verdict, count(*) FROM verdicts "
                "WHERE t >= ? AND score IS NOT NULL GROUP BY b, verdict",
                (bins - 1, lo, width, time.time() - days * 86400)):
            if verdict in counts:
                counts[verdict][int(b)] += n
        return [lo + i * width for i in range(bins + 1)], counts

    def corrections(self, days=90):
        """``{day: {kind: n}}``, a kind of :data:`CORRECTIONS` (:func:`per_day_corrections`)."""
        return per_day_corrections(self.query(
            "SELECT date(corrected_t, 'unixepoch', 'localtime') d, verdict, corrected, count(*) FROM verdicts "
            "WHERE corrected IS NOT NULL AND corrected_t >= ? GROUP BY d, verdict, corrected",
            (time.time() - days * 86400,)))


def per_day_corrections(counted):
    """``{day: {kind: n}}`` of ``(day, verdict, corrected, n)`` counts: each kind of
    :data:`CORRECTIONS` (:func:`correction_kind`); a verdict taught as it stood is left out."""
    out = {}
    for day, verdict, corrected, n in counted:
        kind = correction_kind(verdict, corrected)
        if kind is not None:
            kinds = out.setdefault(day, {})
            kinds[kind] = kinds.get(kind, 0) + n
    return out


def teach(site, store, raw, label, history_now, **learn):
    """Teach ``store``'s model (a backend) a message pasted on the Scan page as ``label``,
    its row in ``site``'s history marked when the history holds it (``history_now()``: the
    history's :class:`~spamnb.storage.history.Now`, closed, its marks written, whether the
    learn succeeds or not), then re-score the queue when the model changed: ``(done,
    moved)``, the counts of :func:`spamnb.delivery.pipeline.learn` (``unchanged``: learned
    so already) and ``site.rescore()``'s moves (None when nothing changed). ``learn``: the
    rest of pipeline.learn's arguments (``create``)."""
    from spamnb.mail.identity import CHANGED

    with site.lock:
        marks = pipeline.HistoryOnly(history_now())
        try:
            done = pipeline.learn(store, [(raw, label)], via="web", recorder=marks, warn=site.log, **learn)
        finally:
            marks.close()
        changed = any(outcome in CHANGED for outcome in done["outcomes"])
        return done, rescored_queue(site, site.log) if changed else None


def file_identity(path):
    """What changes when the file at ``path`` is written or replaced (None when there is none)."""
    try:
        return file_state(os.stat(path))
    except FileNotFoundError:
        return None


def day_start(text):
    """Seconds since the epoch at local midnight of ``YYYY-MM-DD``; None for anything else."""
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%d"))
    except (ValueError, TypeError, OverflowError):
        return None


def time_bound(value, *, end=False):
    """Seconds since the epoch of a search's bound ``value``: a number as it is, a day
    (YYYY-MM-DD, local time) at its midnight, or with ``end`` the next midnight (the day
    is in the search); None for anything else (no bound)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    t = day_start(value)
    return None if t is None else t + (86400 if end else 0)


def logit(p):
    """The log-odds of the P(spam) cut-off ``p`` (where the histogram marks it)."""
    p = min(max(p, 1e-300), 1 - 1e-16)
    return math.log(p / (1 - p))
