"""The rules of a verdict, once: labels, exit codes, costs, cut-offs, the header lines.

Every way spamnb answers for a message -- the click commands, ``spamnb
filter``'s cold path, the resident server -- decides with these functions, so
the ways cannot drift apart. Standard library only, and only its cheap
modules: ``spamnb filter`` imports this before it asks the server, and must not
pay for numpy, click, joblib, or even ``json`` and ``re``.

The decision (``docs/naive-bayes.md`` §1) with p = P(spam | x) and the costs
C_fp (ham filed as spam), C_fn (spam let through), C_u (any message held as
unsure)::

    R(ham | x) = C_fn·p     R(spam | x) = C_fp·(1 − p)     R(unsure | x) = C_u

gives two cut-offs on p: ham when p <= ham cut-off, spam when p > spam cut-off,
unsure between (:func:`cutoffs_from_costs`, :func:`label_for`).

Errors are plain :class:`DecisionError` (a ValueError); the command line turns
them into usage errors, the cold path into a :class:`Fallback`. What a delivery
does when anything fails is here too, once for every path: :class:`Boundary`.
"""

import math
import os
import sys

from spamnb._version import __version__

#: The classes, in the column order of every model.
LABELS = ("ham", "spam")
#: The actions of the decision, in the row order of its loss matrix.
ACTIONS = ("ham", "unsure", "spam")

#: ``spamnb filter``'s exit status for each label (bogofilter's: 0 spam, 1 ham,
#: 2 unsure), and for an error (the message is then passed through unchanged).
EXIT_SPAM, EXIT_HAM, EXIT_UNSURE, EXIT_ERROR = 0, 1, 2, 3
EXIT_CODES = {"spam": EXIT_SPAM, "ham": EXIT_HAM, "unsure": EXIT_UNSURE}

#: Default costs (C_fp, C_fn, C_u): filing a ham as spam is ten times worse
#: than letting a spam through, and holding a message for a look costs half a
#: missed spam. Cut-offs: ham below C_u/C_fn = 0.5, spam above 1 − C_u/C_fp = 0.95.
DEFAULT_COSTS = (10.0, 1.0, 0.5)

#: The decision options, in the order of :func:`cutoffs_from`'s parameters.
DECISION_OPTIONS = ("cost_fp", "cost_fn", "cost_unsure", "spam_cutoff", "ham_cutoff")

#: X-Spam-Status's first word, SpamAssassin's two: an unsure message is "No" (not
#: spam: deliver it), and ``tests=`` (:data:`VERDICT_TEST`) keeps spamnb's three verdicts.
STATUS_WORD = {"spam": "Yes", "ham": "No", "unsure": "No"}
#: X-Spam-Status's ``tests=``: spamnb's verdict, in the place SpamAssassin lists its rules.
VERDICT_TEST = {"spam": "SPAMNB_SPAM", "ham": "SPAMNB_HAM", "unsure": "SPAMNB_UNSURE"}
#: Header fields that read as a verdict: spamnb's own and those SpamAssassin, Amavis
#: (its remove_existing_spam_headers list) and Exim's usual ACL write. Incoming ones
#: are removed before spamnb adds its own (a sender's ``X-Spam-Flag: YES`` or
#: ``X-Spam-Score: -10`` never reaches the user or the next program), and none is
#: ever a token, so that removal leaves a message's tokens as they were.
VERDICT_FIELDS = ("X-Spam-Flag", "X-Spam-Status", "X-Spam-Evidence", "X-Spam-Level", "X-Spam-Score",
                  "X-Spam-Report", "X-Spam-Checker-Version", "X-Spam-Tests", "X-Spam-Bar")
#: Long header fields (the evidence) are folded to lines of about this many characters.
FOLD_WIDTH = 78


class DecisionError(ValueError):
    """Decision options that make no decision (bad costs, cut-offs out of order, both)."""


class Fallback(Exception):
    """This way of answering cannot (the reason is the message): take the next one."""


# -- cut-offs --------------------------------------------------------------------


def check_cost(name, value):
    """A cost must be a positive, finite real number (NaN fails too): TypeError for
    what is not a number, DecisionError for a number that is not a cost."""
    try:
        # x - x == 0 holds for finite numbers only (not inf, not NaN), and for any numeric type
        ok = not isinstance(value, bool) and value - value == 0 and value > 0
    except TypeError:  # not a number at all, or complex
        ok = None
    if ok is None or isinstance(value, bool):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    if not ok:
        raise DecisionError(f"{name} must be positive and finite, got {value!r}")


def cutoffs_from_costs(cost_fp, cost_fn, cost_unsure=None):
    """``(ham_cutoff, spam_cutoff)`` of minimum risk for these costs.

    * Two actions: spam iff C_fp·(1−p) < C_fn·p iff p > C_fp / (C_fp + C_fn);
      both cut-offs are that threshold (ten times worse ham loss: 10/11).
    * With unsure: spam beats unsure iff p > 1 − C_u/C_fp, ham beats unsure iff
      p <= C_u/C_fn. The band between is non-empty iff C_u < C_fp·C_fn/(C_fp + C_fn);
      when it is empty unsure never wins and both cut-offs are the threshold.

    The arithmetic is the costs' own: :class:`fractions.Fraction` costs give
    exact cut-offs (:func:`spamnb.nb.decision.cutoffs_from_costs` relies on it).
    """
    check_cost("cost_fp", cost_fp)
    check_cost("cost_fn", cost_fn)
    threshold = cost_fp / (cost_fp + cost_fn)  # spam iff P(spam|x) > C_fp / (C_fp + C_fn)
    if cost_unsure is None:
        return threshold, threshold
    check_cost("cost_unsure", cost_unsure)
    ham_cut = cost_unsure / cost_fn  # ham iff C_fn·p <= C_u
    spam_cut = 1 - cost_unsure / cost_fp  # spam iff C_fp·(1−p) < C_u
    if ham_cut < spam_cut:
        return ham_cut, spam_cut
    return threshold, threshold


def check_cutoffs(ham, spam):
    """``(ham, spam)`` as floats when 0 <= ham <= spam <= 1; DecisionError otherwise."""
    h, s = float(ham), float(spam)
    if not (0.0 <= h <= s <= 1.0):
        raise DecisionError(f"need 0 <= ham_cutoff <= spam_cutoff <= 1, got {ham}, {spam}")
    return h, s


def cutoffs_from(model_cutoffs, cost_fp=None, cost_fn=None, cost_unsure=None,
                 spam_cutoff=None, ham_cutoff=None):
    """The cut-offs a command applies: explicit cut-offs, else costs, else the model's.

    ``model_cutoffs`` is the model's ``(ham, spam)`` pair. One cut-off given:
    the other is the model's, moved just enough to keep ham <= spam. Costs not
    given default to :data:`DEFAULT_COSTS` (C_u: no unsure band).
    """
    model_ham, model_spam = model_cutoffs
    costs = (cost_fp, cost_fn, cost_unsure)
    if spam_cutoff is not None or ham_cutoff is not None:
        if any(c is not None for c in costs):
            raise DecisionError("give either costs or cut-offs, not both")
        spam = spam_cutoff if spam_cutoff is not None else max(model_spam, ham_cutoff)
        ham = ham_cutoff if ham_cutoff is not None else min(model_ham, spam)
        return check_cutoffs(ham, spam)
    if any(c is not None for c in costs):
        fp = DEFAULT_COSTS[0] if cost_fp is None else cost_fp
        fn = DEFAULT_COSTS[1] if cost_fn is None else cost_fn
        return check_cutoffs(*cutoffs_from_costs(fp, fn, cost_unsure))
    return check_cutoffs(model_ham, model_spam)


class Decision:
    """The decision options as one value: what a command, the wire, spamd's per-user
    ``[decision]`` and the one pipeline carry whole, resolved once (the table's
    :data:`DECISION_OPTIONS`, None where not given: the model's cut-offs then).

    Adding a decision option is its row in :data:`spamnb.options.TABLE`, its name in
    :data:`DECISION_OPTIONS` and its part of :func:`cutoffs_from`: everything that
    carries a decision carries this value, by the names of that one list."""

    __slots__ = ("values",)

    def __init__(self, values=(), **given):
        """``Decision((v, ...))`` in the order of :data:`DECISION_OPTIONS`, or
        ``Decision(spam_cutoff=0.9)`` by name."""
        unknown = set(given) - set(DECISION_OPTIONS)
        if unknown:
            raise TypeError(f"not a decision option: {', '.join(sorted(unknown))}")
        values = tuple(values) or tuple(given.get(n) for n in DECISION_OPTIONS)
        if len(values) > len(DECISION_OPTIONS):
            raise TypeError(f"a decision has {len(DECISION_OPTIONS)} values, got {len(values)}")
        #: the values in the order of :data:`DECISION_OPTIONS`, None where not given
        self.values = values + (None,) * (len(DECISION_OPTIONS) - len(values))

    @classmethod
    def of(cls, settings):
        """The decision of ``settings``, a mapping with (some of) the options' names;
        other names are not the decision's and are left alone."""
        return cls(settings.get(name) for name in DECISION_OPTIONS)

    def given(self):
        """``{name: value}`` of the options given."""
        return {n: v for n, v in zip(DECISION_OPTIONS, self.values) if v is not None}

    def cutoffs(self, model_cutoffs):
        """The ``(ham, spam)`` cut-offs this decision applies over a model's
        (:func:`cutoffs_from`); DecisionError for values that make no decision."""
        return cutoffs_from(model_cutoffs, **self.given())

    def check(self):
        """DecisionError now for values that make no decision (costs and cut-offs
        together, cut-offs out of order, a cost that is not one); returns self."""
        self.cutoffs(cutoffs_from_costs(*DEFAULT_COSTS))
        return self

    def __bool__(self):
        return any(v is not None for v in self.values)

    def __eq__(self, other):
        return isinstance(other, Decision) and self.values == other.values

    def __hash__(self):
        return hash(self.values)

    def __repr__(self):
        return f"Decision({self.shown()})"

    def shown(self):
        """The options given, as a line says them, or that the model's cut-offs apply."""
        return ", ".join(f"{k}={v:g}" for k, v in self.given().items()) or "the model's cut-offs"


#: No decision option given: every model's own cut-offs.
MODELS_OWN = Decision()


def evidence(known, class_counts):
    """How many of a message's tokens are evidence: ``known`` (tokens the model
    knows), or 0 while the model has not learned both classes. Until then its
    tokens say nothing about the class it has not seen, and the score is
    mostly the smoothing: the filter cannot tell, and says unsure
    (:func:`label_for`)."""
    return known if min(class_counts) > 0 else 0


def label_for(p, cutoffs, known=None):
    """'ham' if p <= ham cut-off, 'spam' if p > spam cut-off, else 'unsure'.

    ``known``: how many of the message's tokens the model knows, when the caller
    counted them (:func:`evidence`). No evidence is no verdict: with none known,
    P(spam | x) is the prior alone (for an empty message, random bytes or a text
    that is not mail; a model that has learned one class only), and the message
    is 'unsure' whatever that prior says.
    """
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise DecisionError(f"spam probability must be in [0, 1], got {p}")
    if known == 0:
        return "unsure"
    ham, spam = cutoffs
    if p <= ham:
        return "ham"
    if p > spam:
        return "spam"
    return "unsure"


#: ``filter -u`` learns its own verdict only for a message scored within this many
#: log-odds of the cut-off that made the verdict (:func:`learns_verdict`). Measured
#: on the loop a user lives with (the filter learns its verdicts, the user moves
#: what it misfiled and sorts the unsure mail: ``python tools/studies/living_filter.py
#: --rule self-all --rule self-margin:5``, with ``--corpus
#: ../shared/corpora/trec06c-dev``, and with the three corpora ``--seed 1 --limit
#: 6000``), learning every verdict -> within 5, misfiled (FP + FN) / unsure / user
#: actions / (1-AUC)%: SpamAssassin, first 2,000 of 3 orders, 29.4 / 63.7 / 93.0 /
#: 0.223 -> 17.8 / 65.3 / 83.0 / 0.189; trec06c-dev 27.4 / 73.3 / 100.7 / 0.091 ->
#: 14.3 / 79.3 / 93.7 / 0.068; the longest stream, first 6,000, 148 / 208 / 356 /
#: 0.377 -> 55 / 228 / 283 / 0.247 (false positives 5.7 -> 4.1, 0.3 -> 0.7, 1 -> 1:
#: noise). A confident wrong verdict is not learned, so it does not teach the
#: error. 5 is CRM114's mailfilter margin and the one the gold-label runs used, not
#: tuned here: 2 misfiles less but holds more unsure mail and ranks SpamAssassin
#: worse than learning everything (0.260); 10 keeps a third to two thirds of the
#: gain in misfiled mail.
LEARN_MARGIN = 5.0


def learns_verdict(label, score, cutoffs, margin=LEARN_MARGIN):
    """Whether ``filter -u`` learns a message as its verdict ``label``: never an
    unsure one; a ham or spam only when its score (log-odds) is within ``margin``
    of the cut-off bounding that verdict (the ham cut-off for a ham, the spam
    cut-off for a spam; ``cutoffs`` as in :func:`label_for`), a thick threshold
    on the filter's own labels. ``margin`` None: every ham and spam (bogofilter's
    ``-u``). A message farther from the cut-off is one the model already files
    with confidence: learning it adds little, and when the verdict is wrong it
    teaches the error until the user moves it.
    """
    if label == "unsure":
        return False
    if margin is None:
        return True
    edge = cutoffs[0] if label == "ham" else cutoffs[1]
    if not 0.0 < edge < 1.0:  # a cut-off at certainty: no score is near it
        return False
    return abs(float(score) - math.log(edge / (1.0 - edge))) < margin


class Decided:
    """One message's verdict under a model: the label, P(spam|x), the score
    (log-odds), the evidence asked for, the cut-offs applied, whether ``filter -u``'s
    rule learns it (:func:`learns_verdict`) and its header lines (:func:`header_lines`;
    None when not asked). A plain class: ``dataclasses`` would cost the per-message
    path its import."""

    __slots__ = ("label", "p", "score", "evidence", "cutoffs", "learns", "lines")

    def __init__(self, label, p, score, evidence, cutoffs, learns, lines=None):
        self.label, self.p, self.score = label, p, score
        self.evidence, self.cutoffs, self.learns, self.lines = evidence, cutoffs, learns, lines


def judge(p, score, known, model_cutoffs, decision=MODELS_OWN, evidence=None, name=None):
    """The verdict of a scored message, every rule of it in one place: the cut-offs
    ``decision`` applies over the model's, the label (:func:`label_for`), whether
    ``filter -u`` learns it (:func:`learns_verdict`) and, for a model ``name``, the
    header lines that carry it (:func:`header_lines`). ``known``: how many of the
    message's tokens the model knows; ``evidence``: its strongest tokens, when asked."""
    cutoffs = decision.cutoffs(model_cutoffs)
    label = label_for(p, cutoffs, known)
    lines = None
    if name is not None:
        lines = header_lines(label, p, score, name, evidence, required=threshold(cutoffs[1]))
    return Decided(label, p, score, evidence, cutoffs, learns_verdict(label, score, cutoffs), lines)


# -- what the verdict says ---------------------------------------------------------


def model_name(path, is_default):
    """The model's name in the verdict header: ``default``, or the file's name."""
    return "default" if is_default else os.path.basename(path)


def default_model_notice(path):
    """What every command says when it falls back to the default model."""
    return f"no model of yours yet: using the default model trained on the shipped corpus ({path})"


def passed_through(reason):
    """What ``spamnb filter`` says when it delivers a message unchanged (:func:`unchanged_status`)."""
    return f"spamnb: error: {reason}; message passed through unchanged"


def unchanged_status(exit_zero):
    """``spamnb filter``'s exit status for a message passed through unchanged: 3, or 0
    with ``--exit-zero`` (a recipe that asks for 0 never sees a failure: maildrop's
    ``xfilter`` defers the mail on any other status, for as long as the failure lasts)."""
    return 0 if exit_zero else EXIT_ERROR


def filtered_status(label, exit_zero):
    """``spamnb filter``'s exit status for a message it filtered: by its verdict
    (:data:`EXIT_CODES`), or 0 with ``--exit-zero``."""
    return 0 if exit_zero else EXIT_CODES[label]


def write_out(out, code):
    """Write ``out`` to standard output: ``code``, or 3 when it could not be written whole
    (no delivery agent may take a cut message for a filtered one)."""
    try:
        sys.stdout.buffer.write(out)
        sys.stdout.buffer.flush()
    except (OSError, ValueError):
        return EXIT_ERROR
    return code


def deliver_unchanged(raw, reason, exit_zero):
    """What ``spamnb filter`` does when anything fails (every filter path's ``fail``,
    :class:`Boundary`): the reason on stderr in one line (:func:`passed_through`),
    ``raw`` unchanged on stdout, and the exit status to end with: :func:`unchanged_status`,
    or 3 when even stdout failed (no delivery agent may take a cut message for a filtered one)."""
    try:
        sys.stderr.write(passed_through(reason) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    return write_out(raw, unchanged_status(exit_zero))


def failure_reason(exc):
    """Why a delivery failed, in one line: the message of an error spamnb (or click, or
    the system) raises for the user, else the kind and message of a bug to report
    (``internal error (KeyError: 'x')``)."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    if isinstance(exc, OSError) and exc.filename:
        text = f"{exc.filename}: {exc.strerror or exc}"
    elif isinstance(exc, (OSError, DecisionError)) or type(exc).__module__.partition(".")[0] in ("spamnb", "click"):
        text = str(exc)
    else:
        text = f"internal error ({exc.__class__.__name__}: {exc})"
    return " ".join(text.split()) or exc.__class__.__name__


class Boundary:
    """The one failure boundary of every delivery path::

        with Boundary(fail) as b:
            ...deliver one message...

    Whatever the body raises once the message is read -- a bad configuration, a
    damaged model, a malformed value in a store, a bug -- is not raised: it is
    handed to ``fail(reason, exc)``, ``reason`` being :func:`failure_reason`'s one
    line, and ``fail``'s result is kept in ``b.result`` (None when nothing failed).
    ``SystemExit`` passes (the body chose its exit status), and so does Ctrl-C
    unless ``interrupts``: a filter process interrupted still delivers its message,
    a server or an IMAP pass stops. A failure inside ``fail`` itself is not caught:
    ``fail`` must be the plain last resort of its path.

    Every door enters it through :func:`spamnb.delivery.pipeline.boundary`, which writes
    the one error line and then gives the door's answer. The doors and their answers
    (docs/delivery.md#when-something-fails):

    * ``spamnb filter``'s fast path (:func:`spamnb.delivery.fastfilter.main`) and its
      click command (``spamnb.cli.delivery``; ``spamnb.cli.options.pass_through`` does
      the same for options and configuration that cannot be read, before there is a
      command to run): :func:`deliver_unchanged`, the message unchanged on stdout and the
      reason on stderr, then exit status :func:`unchanged_status`;
    * the filter server, per request (``spamnb.delivery.server``): it declines, and
      the filter's client answers by itself (behind its own boundary);
    * spamd, per request (``spamnb.delivery.spamd``'s listeners): an error reply (EX_IOERR for a
      model it cannot read, EX_SOFTWARE for a bug), on which spamc passes the
      message through unscanned;
    * ``spamnb imap filter``, per message (``spamnb.delivery.imap``): the message stays
      where it is, unflagged, and the pass goes on.
    """

    __slots__ = ("fail", "result", "interrupts")

    def __init__(self, fail, *, interrupts=False):
        self.fail = fail
        self.interrupts = interrupts
        self.result = None

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is None or not isinstance(exc, Exception if not self.interrupts else (Exception, KeyboardInterrupt)):
            return False
        self.result = self.fail(failure_reason(exc), exc)
        return True


def may_hold_verdicts(raw):
    """False when ``raw`` surely has no verdict field in its header block, so the
    filter's client need not import the parser-side
    :func:`spamnb.mail.mime.strip_verdicts` (most mail). Every name of
    :data:`VERDICT_FIELDS` starts ``X-Spam-``, and the header block ends at the
    latest at the first empty line (two line ends in a row: LF LF, CR CR, LF CR)."""
    end = len(raw)
    for blank in (b"\n\n", b"\r\r", b"\n\r"):
        i = raw.find(blank, 0, end)
        if i != -1:
            end = i
    return b"x-spam-" in raw[:end].lower()


def threshold(spam_cutoff):
    """T = log(c / (1 − c)): the spam cut-off on P(spam|x) as log-odds, the
    ``required=`` of X-Spam-Status and the T of spamd's ``Spam: True ; S / T``
    (finite: a cut-off of 0 or 1 is clamped)."""
    c = min(max(spam_cutoff, 1e-300), 1 - 1e-16)
    return math.log(c) - math.log1p(-c)


def clamped(x):
    """A log-odds figure as the headers write it: within ±999.9 (a learned prior of
    an empty class is infinite, and no client parses "inf")."""
    return max(-999.9, min(999.9, x))


def header_lines(label, probability, score, model, evidence=None, *, required):
    """The verdict's header lines (without line endings), ASCII only; a folded
    field's continuation lines are separate items starting with a tab::

        X-Spam-Flag: YES                                                  (spam only)
        X-Spam-Status: Yes, score=9.00 required=2.94 tests=SPAMNB_SPAM probability=0.999874 model=model.joblib version=0.1.0
        X-Spam-Evidence: url:example.biz:+2.31, subject:free:+1.87, ...   (with evidence)

    In SpamAssassin's form, so its clients read them: ``X-Spam-Flag`` only on
    spam (spamass-milter takes its presence for spam), ``Yes``/``No`` first
    (unsure says ``No``), then ``score=`` and ``required=`` on one scale, the
    log-odds S and T (``required``, :func:`threshold` of the spam cut-off; S > T
    exactly for spam), ``tests=`` spamnb's verdict (:data:`VERDICT_TEST`), and
    spamnb's own items. Items are separated by spaces, as SpamAssassin's.
    """
    status = (f"{STATUS_WORD[label]}, score={clamped(score):.2f} required={clamped(required):.2f} "
              f"tests={VERDICT_TEST[label]} probability={probability:.6f} "
              f"model={header_safe(model)} version={__version__}")
    lines = [b"X-Spam-Flag: YES"] if label == "spam" else []
    lines.append(b"X-Spam-Status: " + status.encode("ascii"))
    if evidence:
        items = [f"{header_safe(tok)}:{c:+.2f}" for tok, c in evidence]
        lines.extend(folded("X-Spam-Evidence: ", items))
    return lines


def filed_as(raw):
    """The label of the verdict header :func:`header_lines` put in ``raw`` (the last
    ``X-Spam-Status`` of the header block in spamnb's form: ``score=``, ``required=``
    and spamnb's ``tests=`` first, its ``model=`` and ``version=`` items), or None when
    no spamnb verdict is there. What the IMAP filter reads to tell a delivery filter's
    filing from a user's move. The form before SpamAssassin's (``Yes, probability=...,
    score=..., model=..., version=...``, with ``Unsure``) is read too: mail filed by
    an older spamnb is still in people's folders."""
    head = raw.split(b"\n\n", 1)[0].split(b"\r\n\r\n", 1)[0]
    by_test = {test.encode(): label for label, test in VERDICT_TEST.items()}
    found = None
    for line in head.splitlines():
        if line[:15].lower() != b"x-spam-status: ":
            continue
        word, _, rest = line[15:].partition(b", ")
        items = [item.partition(b"=") for item in rest.split(b" ")]
        keys = [key for key, _, _ in items]
        if keys[:3] == [b"score", b"required", b"tests"] and b"model" in keys and b"version" in keys:
            found = by_test.get(items[2][2], found)
            continue
        keys = [item.split(b"=", 1)[0] for item in rest.split(b", ")]  # the older form
        old = {b"Yes": "spam", b"No": "ham", b"Unsure": "unsure"}
        if word in old and keys[:2] == [b"probability", b"score"] and b"model" in keys and b"version" in keys:
            found = old[word]
    return found


def is_verdict_block(block, label):
    """Whether ``block`` is only the verdict header lines of ``label`` (what
    :func:`spamnb.delivery.hook.verdict_block` inserts): X-Spam-Flag (spam only),
    X-Spam-Status, optionally X-Spam-Evidence and its tab-folded continuation
    lines, ASCII, each ended by one line ending (a first one may close an
    unterminated header line). The filter's client checks a server's answer
    with it before it writes anything."""
    for eol in (b"\r\n", b"\n"):
        if not block.endswith(eol):
            continue
        body = block[:-len(eol)]
        if body.startswith(eol):
            body = body[len(eol):]
        lines = body.split(eol)
        if label == "spam":
            if lines[0] != b"X-Spam-Flag: YES":
                return False
            lines = lines[1:]
        status = b"X-Spam-Status: " + STATUS_WORD[label].encode() + b", score="
        return (len(lines) >= 1 and lines[0].startswith(status)
                and b" tests=" + VERDICT_TEST[label].encode() + b" " in lines[0]
                and all(line.startswith(b"X-Spam-Evidence: ") for line in lines[1:2])
                and all(line.startswith(b"\t") for line in lines[2:])
                and all(line.isascii() and b"\r" not in line and b"\n" not in line for line in lines))
    return False


def folded(name, items, width=FOLD_WIDTH):
    """One header field as physical lines: ``items`` joined by ", ", folded
    before an item (continuation lines start with a tab) once a line would pass
    ``width`` characters, so no line nears RFC 5322's 998-character limit."""
    out, line = [], name
    for i, item in enumerate(items):
        piece = item + ("," if i < len(items) - 1 else "")
        fresh = line in (name, "\t")  # nothing on this line yet: never fold here
        if not fresh and len(line) + 1 + len(piece) > width:
            out.append(line)
            line, fresh = "\t", True
        line += ("" if fresh else " ") + piece
    out.append(line)
    return [x.encode("ascii") for x in out]


def header_safe(text):
    """Header-safe text: non-ASCII and control characters as JSON escapes, commas and
    spaces escaped (they separate the fields' items)."""
    import json  # not at the top: the server's client never writes a header

    return json.dumps(text, ensure_ascii=True)[1:-1].replace(",", "\\u002c").replace(" ", "\\u0020")
