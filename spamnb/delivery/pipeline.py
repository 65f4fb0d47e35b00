"""One message through the filter, whatever door it came in by.

Every entrance that filters a message calls :func:`filter_one`, and every one that
learns or forgets messages the user sorted calls :func:`learn`; each entrance
only translates its own protocol to and from them::

    door                 the model (a source)               what it hands back
    filter, fast path    the compiled scorer + the journal   the message and an exit status
    filter, click path   the model's storage (a Backend)     the message and an exit status
    the filter server    the resident Backend                where the verdict goes, over the wire
    spamd                the user's Backend, else the site's  the Spam: line, or the message
    imap filter          the user's Backend                  a label: where the message moves
    the page's re-score  the model in hand (ModelSource)     the row's new verdict
    learn, forget, TELL, learn-moves, IMAPSieve, imap's moves, the page's buttons: learn

One message is: read the model (:meth:`Source.read`); decide the verdict and its
header lines (:func:`spamnb.delivery.hook.decide`: every rule of the verdict is
:func:`spamnb.verdict.judge`'s, the decision carried whole as a
:class:`spamnb.verdict.Decision`); learn it as ``filter -u`` does when asked and the
rule says so; record it: the line, the metrics and the history, through the door's
recorder (:class:`spamnb.delivery.events.Recorder` or :class:`HistoryOnly`). The
result is one :class:`Outcome`, which places the lines in the message when a door asks
for it (:func:`spamnb.delivery.hook.verdict_block`).

When anything fails, :func:`boundary` is the one place it becomes "the message passes
unscanned, one error line, and that door's answer" (exit status 3, spamd's error reply,
a declined socket request, a message left where it is).

Standard library only at import: the filter's fast path runs this for every delivery,
and imports the tokenizer and the scorer only when it scores here.
"""

import sys
import time  # loaded by the interpreter's own start-up: free here

from spamnb.verdict import MODELS_OWN, Boundary, model_name, threshold

# `filter -u` waits this long for the model's lock, then delivers without learning:
# a delivery agent must not hang behind a stuck (or another user's) lock holder.
LEARN_TIMEOUT = 10.0


def not_learned(reason) -> str:
    """The warning of a delivery whose message was filtered but could not be learned."""
    return f"spamnb: warning: the message was filtered but not learned: {reason}"


class Outcome:
    """One message's outcome: its verdict (:class:`spamnb.verdict.Decided`), the class it
    was learned as (None: not learned) and, when learning was asked and failed, why
    (``not_learned``); and, placed when first asked (a door that places the lines itself,
    the milter, never asks), the message without incoming verdict fields (``kept``), where
    spamnb's header lines go in it (``pos``) and those lines (``block``)."""

    __slots__ = ("decided", "raw", "learned", "not_learned", "name", "_placed")

    def __init__(self, decided, raw, learned, not_learned, name):
        self.decided, self.raw = decided, raw
        self.learned, self.not_learned, self.name = learned, not_learned, name
        self._placed = None

    @property
    def label(self):
        return self.decided.label

    def _place(self):
        """``(kept, pos, block)``: :func:`spamnb.delivery.hook.verdict_block` of the verdict's
        lines; without lines (a door that writes none), the message as it is."""
        if self._placed is None:
            from spamnb.delivery.hook import verdict_block

            lines = self.decided.lines
            self._placed = (self.raw, 0, b"") if lines is None else verdict_block(self.raw, lines)
        return self._placed

    @property
    def kept(self) -> bytes:
        return self._place()[0]

    @property
    def pos(self) -> int:
        return self._place()[1]

    @property
    def block(self) -> bytes:
        return self._place()[2]

    def message(self) -> bytes:
        """The message as the filter delivers it: spamnb's verdict in its header block."""
        kept, pos, block = self._place()
        return kept[:pos] + block + kept[pos:]

    def required(self) -> float:
        """T, the spam cut-off as log-odds (``required=``, spamd's ``S / T``)."""
        return threshold(self.decided.cutoffs[1])


class Source:
    """Where :func:`filter_one` reads a model and learns into.

    ``name``: the model's name in the verdict header; ``learns``: whether ``filter -u``
    may learn into it (never the default model); :meth:`read` the model now and the
    message's tokens under it; :meth:`learn` one filtered message, returning None when
    learned, else why not (the verdict stands), raising
    :class:`spamnb.verdict.Fallback` when only another way can learn it (nothing is
    written then)."""

    name = ""
    learns = False

    def read(self, raw):
        raise NotImplementedError

    def learn(self, raw, label, toks, model):
        raise NotImplementedError


class ModelSource(Source):
    """A model already in hand (a :class:`spamnb.model.SpamModel` or a compiled scorer):
    the page's re-score, a model loaded to rebuild its scorer, the library. It learns
    nothing."""

    def __init__(self, model, name):
        self.model, self.name = model, name

    def read(self, raw):
        from spamnb.delivery.hook import message_tokens

        return self.model, message_tokens(self.model, raw)


class BackendSource(Source):
    """A model in storage (:class:`spamnb.storage.backend.Backend`): the click path, the
    servers, IMAP, a store. ``later``: upkeep (a compaction) run in the background;
    ``journal_only``: learn only what the journal can take (a server holding the
    compiled scorer), a Fallback otherwise; ``warn``: where notes go."""

    def __init__(self, backend, *, warn=None, later=None, journal_only=False):
        self.backend = backend
        self.name = model_name(backend.short_name, backend.is_default)
        self.learns = not backend.is_default
        self.warn, self.later, self.journal_only = warn, later, journal_only

    def read(self, raw):
        from spamnb.delivery.hook import message_tokens

        model = self.backend.view()
        return model, message_tokens(model, raw)

    def learn(self, raw, label, toks, model):
        from spamnb.storage.store import ModelError, lock_timeout
        from spamnb.verdict import Fallback

        extra = {}
        if self.journal_only:
            from spamnb.storage import journal
            from spamnb.storage.scorer import Scorer

            if not isinstance(model, Scorer):
                raise Fallback("learning here needs the model's scorer")
            extra = {"journal_only": True}
        try:
            self.backend.learn([(raw, label, toks)], timeout=lock_timeout(LEARN_TIMEOUT), warn=self.warn,
                               later=self.later, **extra)
        except ModelError as exc:
            if self.journal_only and isinstance(exc, journal.NeedsModel):
                raise Fallback("only the full model can learn it") from None
            return str(exc)
        return None


def filter_one(raw, source, *, via, decision=MODELS_OWN, learn=False, evidence=0, recorder=None, user=None,
               raddr=None, folder=None, name=None, headers=True, envelope=None):
    """Filter one message: its :class:`Outcome` under ``source``'s model.

    ``via``: the door (the line's ``via=``); ``decision``: the
    :class:`spamnb.verdict.Decision` over the model's cut-offs; ``learn``: learn the
    message as its verdict when ``filter -u``'s rule says so; ``evidence``: how many of
    the strongest tokens the verdict names; ``recorder``: what records it (the line, the
    metrics, the history), None for nothing; ``user``, ``raddr``: who it is for and
    where it came from, for the record; ``folder(label)``: where the door files a
    verdict; ``name``: the model's name in the header (``source.name`` by default);
    ``envelope``: what the door knows of the SMTP envelope, for the line and the history (the milter's
    ``helo``, ``sender``, ``rcpt``, ``qid``);
    ``headers``: False when the door writes no header lines (spamd's CHECK).
    Errors are raised: the door's :func:`boundary` turns them into its answer."""
    from spamnb.delivery.hook import decide

    start = time.perf_counter()
    model, toks = source.read(raw)
    name = source.name if name is None else name
    d = decide(model, raw, decision, evidence, toks, name if headers else None)
    learned = why_not = None
    if learn and d.learns and source.learns:
        why_not = source.learn(raw, d.label, toks, model)
        learned = None if why_not else d.label
    if recorder is not None:
        try:
            recorder.message(via, d.label, d.score, d.p, d.cutoffs, len(raw), time.perf_counter() - start,
                             raw=raw, user=user, raddr=raddr, learned=learned, why="filter-u",
                             folder=folder(d.label) if folder else None, envelope=envelope)
        except Exception as exc:  # noqa: BLE001 - judged (and learned) already: a record never undoes that
            note(f"warning: the verdict was not recorded: {exc}")
    return Outcome(d, raw, learned, why_not, name)


def note(text):
    """A warning on stderr that cannot fail the message it is about (stderr itself may be
    gone: a closed pipe, a full disk under the log)."""
    try:
        sys.stderr.write(text + "\n")
    except (OSError, ValueError):
        pass


def learn(store, items, *, via, forget=False, recorder=None, user=None, raddr=None, create=None, timeout=None,
          warn=None, later=None) -> dict:
    """Learn (or, with ``forget``, forget) messages the user sorted, ``(raw, label)``
    items, in ``store``'s model (a :class:`spamnb.storage.backend.Backend`, or anything
    with its ``learn``), and record them: each one's line, its count in the metrics and its
    correction in the history, through ``recorder`` (``via``: the door, the line's
    ``source=``). What every door that learns calls: ``learn``, ``forget``, their fast
    path, ``learn-moves`` and the IMAPSieve pipe program (through ``learn``), spamd's
    TELL, ``imap filter``'s moves, the page's buttons.

    Only a message the model learned, moved or forgot is recorded: one already learned
    as that class (or a copy given twice) changed nothing, and its row is left as it
    was. Returns what :meth:`spamnb.storage.backend.Backend.learn` returns (the counts,
    and each item's outcome); errors are raised (each door says them its way) and
    nothing is recorded then."""
    from spamnb.mail.identity import FORGOTTEN, LEARNED, MOVED

    items = [(raw, label, None) for raw, label, *_ in items]
    done = store.learn(items, forget=forget, create=create, timeout=timeout, warn=warn, later=later)
    if recorder is None:
        return done
    for (raw, label, _), outcome in zip(items, done["outcomes"]):
        if outcome == FORGOTTEN:
            recorder.forgotten(label, via, raw=raw, user=user, raddr=raddr)
        elif outcome in (LEARNED, MOVED):
            was = ("ham" if label == "spam" else "spam") if outcome == MOVED else None
            recorder.learned(label, via, raw=raw, user=user, was=was, raddr=raddr)
    return done


class HistoryOnly:
    """The recorder of a process that writes no line (``filter`` without
    ``--log-messages``, ``learn``, ``forget``): verdicts and corrections go to the
    history alone (``history``: anything with the ``add`` of
    :class:`spamnb.storage.history.Recorder`), without the cost of importing the line's
    writer on every delivery."""

    __slots__ = ("history",)

    def __init__(self, history):
        self.history = history

    def message(self, via, label, score, p, cutoffs, size, seconds, *, raw=None, user=None, learned=None,
                folder=None, raddr=None, envelope=None, **_):
        if self.history is not None and raw is not None:
            self.history.add(raw, label, score, p, via=via, user=user, dest=folder, learned=learned,
                             cutoffs=cutoffs, raddr=raddr, envelope=envelope)

    def learned(self, label, source, *, raw=None, user=None, **_):
        if self.history is not None and raw is not None:
            self.history.correct(raw, label, user=user)

    def forgotten(self, label, source, *, raw=None, user=None, **_):
        if self.history is not None and raw is not None:
            self.history.correct(raw, label, user=user, undo=True)

    def error(self, *args, **kwargs):
        pass

    def close(self):
        if self.history is not None:
            self.history.close()


def boundary(via, answer, *, recorder=None, facts=None, kind="failed", unscanned=True, interrupts=False,
             warn=None):
    """The one failure boundary of every door (:class:`spamnb.verdict.Boundary`)::

        with pipeline.boundary("spamd", answer_error, recorder=rec, facts=facts) as b:
            ...one message...
        if b.result is not None: ...answer b.result...

    Whatever the body raises becomes: one error line through ``recorder`` (``kind``, the
    one-line reason, ``via``, and what ``facts`` holds of the message: ``raw``, ``size``,
    ``user``, ``raddr``, ``mid``, or a function giving them; ``unscanned``: the mail went on without a verdict),
    then ``answer(reason, exc)``, the door's own answer (its exit status, its error
    reply, its refusal), kept in ``b.result``. ``kind`` and ``unscanned`` may be
    functions of the exception. A line that cannot be written is a note to ``warn``:
    it never costs the message its answer."""
    def fail(reason, exc):
        rec = recorder() if callable(recorder) else recorder
        if rec is not None:
            try:
                known = facts() if callable(facts) else (facts or {})
                rec.error(kind(exc) if callable(kind) else kind, reason, via=via,
                          unscanned=unscanned(exc) if callable(unscanned) else unscanned, **known)
            except Exception as exc2:  # noqa: BLE001 - a log line never costs a delivery
                if warn is not None:
                    warn(f"warning: no log line: {exc2}")
        return answer(reason, exc)

    return Boundary(fail, interrupts=interrupts)
