"""Runners for the peer filters spamnb is measured against.

Scripts only: nothing here is a runtime dependency of spamnb.

A *runner* is a function

    runner(train_ham: list[str], train_spam: list[str], test: list[str]) -> RunResult

that trains a fresh filter on the message files ``train_ham`` and
``train_spam`` (in a temporary directory it removes afterwards), scores every
file in ``test`` and returns the spam scores (higher = spammier, in the order
of ``test``) together with the wall-clock seconds spent training and
classifying.  A :class:`Peer` bundles a runner with the filter's own default
cut-offs and with how its memory is measured.  spamnb plugs in the same way:
write a runner, wrap it in a ``Peer`` (or name it ``module:function`` on the
command line of ``run_peers.py``).

:func:`run_isolated` runs one runner in a fresh Python process so that its
peak memory is that run's alone (tools: ``/usr/bin/time -f %M``; in-process
runners: the worker's VmHWM).
"""

from __future__ import annotations

import dataclasses
import importlib
import multiprocessing
import os
import re
import resource
import shutil
import subprocess
import tempfile
import time
from typing import Callable, Sequence

import numpy as np

__all__ = [
    "RunResult",
    "Peer",
    "PEERS",
    "run_bogofilter",
    "run_spamprobe",
    "run_crm114",
    "run_sklearn_nb",
    "run_sklearn_nb_proba",
    "run_isolated",
    "resolve_peer",
    "keep_headers",
    "rewrite_with_headers",
    "bogofilter_bulk_train_seconds",
]

# Keep argument lists well under ARG_MAX (paths are ~60-100 bytes each).
_CHUNK = 1000


@dataclasses.dataclass
class RunResult:
    """What a runner returns: one spam score per test file, and timings."""

    scores: np.ndarray
    train_seconds: float
    classify_seconds: float
    peak_mb: float | None = None  # max RSS; external runners fill it in, else run_isolated


@dataclasses.dataclass(frozen=True)
class Peer:
    """A filter under test.

    Attributes
    ----------
    name : str
    run : runner (see the module docstring); must be a module-level function
        so that :func:`run_isolated` can send it to a fresh process.
    cutoffs : (ham_cutoff, spam_cutoff) or None
        The filter's default decision on its own score scale, counted by
        spamnb's rule (spam iff score > spam_cutoff, ham iff score <= ham_cutoff,
        unsure between; a peer's own rule may differ for a score exactly on a
        cut-off);
        ``None`` when the scores are not probabilities.
    external : bool
        True when the work happens in child processes (peak memory is the
        largest child's max RSS), False when it runs inside the Python
        process (peak memory is that process's max RSS).
    """

    name: str
    run: Callable[[Sequence[str], Sequence[str], Sequence[str]], RunResult]
    cutoffs: tuple[float, float] | None
    external: bool


def _chunks(seq, n=_CHUNK):
    for i in range(0, len(seq), n):
        yield list(seq[i:i + n])


def _check_tool(name, package=None):
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(
            f"{name} is not installed (Debian: apt-get install -y {package or name})"
        )
    return path


class _Tools:
    """Runs external commands and keeps the largest max RSS among them.

    Each command is wrapped in GNU ``/usr/bin/time -f %M`` when that exists:
    ``time`` is a small process that forks the tool and reads its max RSS
    with wait4().  Reading ``RUSAGE_CHILDREN`` from Python instead would
    over-report: Linux carries the max RSS of a forking process across
    fork and exec, so every tool would count the Python interpreter's
    resident size as well.  Without ``/usr/bin/time`` ``peak_mb`` stays None.
    """

    def __init__(self):
        self.time = "/usr/bin/time" if os.access("/usr/bin/time", os.X_OK) else None
        self.peak_kib = None

    def run(self, cmd, **kwargs):
        if self.time is None:
            return subprocess.run(cmd, **kwargs)
        with tempfile.NamedTemporaryFile("r", prefix="peer-rss-") as rss:
            proc = subprocess.run([self.time, "-q", "-f", "%M", "-o", rss.name, *cmd], **kwargs)
            text = rss.read().split()
        if text and text[-1].isdigit():
            self.peak_kib = max(self.peak_kib or 0, int(text[-1]))
        return proc

    @property
    def peak_mb(self):
        return None if self.peak_kib is None else self.peak_kib / 1024.0


# --------------------------------------------------------------------------
# bogofilter
# --------------------------------------------------------------------------

def run_bogofilter(train_ham, train_spam, test):
    """bogofilter 1.2.x with its built-in defaults (``-C``: no config file).

    Training: bulk registration, ``bogofilter -C -d DIR -n -B FILE...`` for
    ham and ``-s -B`` for spam (one process per 1000 files).
    Classifying: ``-t -B FILE...`` with ``--terse-format='%c %.12e'``, one
    line per file in argument order with the spamicity in exponent form, so
    scores near 0 keep their order (``-TT`` prints 16 fixed decimals, which
    flattens everything below 5e-17 to 0).  Exit codes 0/1/2 are
    spam/ham/unsure (of the last file), 3 an error.
    """
    bogofilter = _check_tool("bogofilter")
    tools = _Tools()
    with tempfile.TemporaryDirectory(prefix="peer-bogofilter-") as db:
        t0 = time.perf_counter()
        _bogofilter_register(tools.run, bogofilter, db, train_ham, train_spam)
        t1 = time.perf_counter()
        lines = []
        for chunk in _chunks(test):
            proc = tools.run(
                [bogofilter, "-C", "-d", db, "-t", "--terse-format=%c %.12e", "-B", *chunk],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )
            if proc.returncode not in (0, 1, 2):
                raise RuntimeError(f"bogofilter failed ({proc.returncode}): {proc.stderr.decode(errors='replace')}")
            got = proc.stdout.decode().splitlines()
            if len(got) != len(chunk):
                raise RuntimeError(f"bogofilter printed {len(got)} lines for {len(chunk)} files")
            lines.extend(got)
        t2 = time.perf_counter()
    scores = np.array([float(line.split()[-1]) for line in lines])
    return RunResult(scores, t1 - t0, t2 - t1, tools.peak_mb)


def _bogofilter_register(run, bogofilter, db, ham, spam):
    """Bulk registration into ``db``: ``-n -B`` for ham, then ``-s -B`` for spam."""
    for flag, files in (("-n", ham), ("-s", spam)):
        for chunk in _chunks(files):
            run([bogofilter, "-C", "-d", db, flag, "-B", *chunk], check=True, stdout=subprocess.DEVNULL)


def bogofilter_bulk_train_seconds(ham, spam):
    """Seconds for bogofilter to bulk-train (-n -B ham, then -s -B spam) from empty."""
    bogofilter = _check_tool("bogofilter")
    with tempfile.TemporaryDirectory(prefix="peer-bogofilter-") as db:
        t0 = time.perf_counter()
        _bogofilter_register(subprocess.run, bogofilter, db, ham, spam)
        return time.perf_counter() - t0


# --------------------------------------------------------------------------
# spamprobe
# --------------------------------------------------------------------------

_SPAMPROBE_LINE = re.compile(r"^(SPAM|GOOD) ([0-9.]+) ", re.M)


def run_spamprobe(train_ham, train_spam, test):
    """SpamProbe 1.4 with its defaults, one message per file (``-M``).

    Without ``-M`` a file whose first line starts with ``From `` is read as
    an mbox and split at every body line starting with ``From ``.
    Training: ``spamprobe -c -M -d DIR good FILE...`` then ``spam FILE...``
    (every message registered, not the train-on-error ``train-*`` commands).
    Classifying: ``spamprobe -M -d DIR score FILE...`` prints
    ``SPAM|GOOD <score> <digest>`` per message in argument order.  The
    default spam threshold is 0.7 (``-l``), a two-state decision.
    """
    spamprobe = _check_tool("spamprobe")
    tools = _Tools()
    with tempfile.TemporaryDirectory(prefix="peer-spamprobe-") as db:
        t0 = time.perf_counter()
        for command, files in (("good", train_ham), ("spam", train_spam)):
            for chunk in _chunks(files):
                tools.run([spamprobe, "-c", "-M", "-d", db, command, *chunk],
                               check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t1 = time.perf_counter()
        scores = []
        for chunk in _chunks(test):
            proc = tools.run([spamprobe, "-M", "-d", db, "score", *chunk],
                                  check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            got = [float(m.group(2)) for m in _SPAMPROBE_LINE.finditer(proc.stdout.decode())]
            if len(got) != len(chunk):
                raise RuntimeError(f"spamprobe printed {len(got)} scores for {len(chunk)} files")
            scores.extend(got)
        t2 = time.perf_counter()
    return RunResult(np.array(scores), t1 - t0, t2 - t1, tools.peak_mb)


# --------------------------------------------------------------------------
# CRM114
# --------------------------------------------------------------------------

# The classifier settings of the mailfilter.cf that Debian's crm114 package ships
# (/usr/share/crm114/mailfilter.cf), read by mailfilter.crm, mailreaver.crm and
# mailtrainer.crm.
CRM114_CLF = "osb unique microgroom"  # :clf: "Default for 20060101 has been changed to OSB UNIQUE MICROGROOM"
CRM114_LCR = "[[:graph:]]+"  # :lcr:, the tokenizing regex (also crm's built-in default)
CRM114_DECISION_LENGTH = 16000  # :decision_length:, bytes of each message classified or learned
CRM114_THRESHOLD = 5.0  # :good_threshold: 5.0, :spam_threshold: -5.0, :thick_threshold: 5.0 (pR)

# One message from stdin, as a mail delivery agent pipes it.  The status's first
# line ("CLASSIFY succeeds|fails; success probability: P  pR: R") carries the pR of
# the first file (nonspam.css) with four decimals; mailreaver reads the same pR from
# the "#0 ..." line, which has two.  CLASSIFY "fails" when spam.css wins, skipping to
# the end of its block: hence the inner braces.
_CRM114_TEXT_STDIN = f"match (:t:) [:_dw: 0 {CRM114_DECISION_LENGTH}] /.*/"
_CRM114_CLASSIFY_STEP = f"""
isolate (:s:) //
{{ classify <{CRM114_CLF}> [:t:] (nonspam.css | spam.css) (:s:) /{CRM114_LCR}/ }}
match [:s:] (:: :pr:) /pR: ([[:graph:]]+)/
output /:*:pr:\\n/
"""
CRM114_CLASSIFY = "-{" + _CRM114_TEXT_STDIN + _CRM114_CLASSIFY_STEP + "}"
# --css=nonspam.css or --css=spam.css
CRM114_LEARN = "-{" + _CRM114_TEXT_STDIN + f"\nlearn <{CRM114_CLF}> [:t:] (:*:css:) /{CRM114_LCR}/\n}}"
# Many messages in one process: stdin holds file names, one a line (the runner's
# own symlinks, so no blanks: INPUT takes the first blank-delimited word).
_CRM114_LOOP = """{{
    match <fromend nomultiline> (:f:) /[[:graph:]]+/
    isolate (:t:) //
    input (:t:) [:*:f: 0 {n}]
{step}
    liaf
}}"""
_CRM114_CLASSIFY_FILES = "-{" + _CRM114_LOOP.format(n=CRM114_DECISION_LENGTH, step=_CRM114_CLASSIFY_STEP) + "}"
_CRM114_LEARN_FILES = "-{" + _CRM114_LOOP.format(
    n=CRM114_DECISION_LENGTH, step=f"learn <{CRM114_CLF}> [:t:] (:*:css:) /{CRM114_LCR}/") + "}"


def crm114_score(stdout: bytes) -> float:
    """The spam score from :data:`CRM114_CLASSIFY`'s output: minus nonspam.css's pR."""
    return -float(stdout.split()[0])


def crm114_needs_learning(score: float, is_spam: bool) -> bool:
    """mailfilter.crm's rule for ``--learnspam`` / ``--learnnonspam`` without ``--force``:
    learn only when the message's pR towards its own class is below the thick
    threshold (an error, or within 5 of the decision)."""
    return (score if is_spam else -score) < CRM114_THRESHOLD


def run_crm114(train_ham, train_spam, test):
    """CRM114 (Debian's crm114 20100106) with the classifier settings its mail filters ship.

    Debian's mail filters (mailfilter.crm, mailreaver.crm, mailtrainer.crm in
    /usr/share/crm114) read mailfilter.cf, whose defaults are the
    ``osb unique microgroom`` classifier (OSB features, each counted once per
    message, with microgrooming: the upstream default since 20060101), the
    ``[[:graph:]]+`` tokenizer and the first 16000 bytes of each message
    (``:decision_length:``); a message is good at pR >= 5, spam at pR <= -5,
    unsure between, pR being that of nonspam.css.  This runner executes the
    CLASSIFY and LEARN statements with exactly those settings rather than the
    scripts: the scripts need a per-user setup (a mailfilter.cf with a password,
    priority, white, black and rewrite lists, a cache of every message, logs),
    and they only *learn* on error or within the thick threshold (mailreaver
    through mailtrainer.crm; mailfilter.crm unless ``--force``), so "learn
    every message" is not something they do.  Their text preprocessing (base64
    parts expanded through an external decoder, HTML comments removed, the
    user's rewrites) is not applied: CRM114 sees each message's raw bytes.

    The .css files are created by the first LEARN, at crm's default size
    (524287 buckets), as mailtrainer.crm creates them (the HOWTO's
    ``cssutil -b -r`` makes 1048577).

    Training: every message learned into nonspam.css or spam.css (as bogofilter
    and spamprobe register every message here), not CRM114's recommended
    train-on-error; one ``crm`` process per 1000 files, a CRM114 loop over their
    names (the .css files are byte-identical to one process per message).
    Classifying: likewise, one line per file with nonspam.css's pR.
    Score: -pR (higher = spammier), cut-offs (-5, 5).
    """
    crm = _check_tool("crm", "crm114")
    tools = _Tools()
    with tempfile.TemporaryDirectory(prefix="peer-crm114-") as work:
        t0 = time.perf_counter()
        for css, files in (("nonspam.css", train_ham), ("spam.css", train_spam)):
            for chunk in _chunks(files):
                proc = tools.run([crm, "-u", work, _CRM114_LEARN_FILES, f"--css={css}"],
                                 input=_crm114_names(work, chunk),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                if proc.returncode != 0:
                    raise RuntimeError(f"crm failed ({proc.returncode}): {proc.stderr.decode(errors='replace')}")
        t1 = time.perf_counter()
        scores = []
        for chunk in _chunks(test):
            proc = tools.run([crm, "-u", work, _CRM114_CLASSIFY_FILES],
                             input=_crm114_names(work, chunk),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            if proc.returncode != 0:
                raise RuntimeError(f"crm failed ({proc.returncode}): {proc.stderr.decode(errors='replace')}")
            got = proc.stdout.split()
            if len(got) != len(chunk):
                raise RuntimeError(f"crm printed {len(got)} scores for {len(chunk)} files")
            scores.extend(-float(pr) for pr in got)  # -pR, as crm114_score
        t2 = time.perf_counter()
    return RunResult(np.array(scores), t1 - t0, t2 - t1, tools.peak_mb)


def _crm114_names(work, paths):
    """Symlinks ``m/0``, ``m/1``... in ``work`` to ``paths`` (fresh per call); their names as stdin."""
    links = os.path.join(work, "m")
    shutil.rmtree(links, ignore_errors=True)
    os.mkdir(links)
    names = []
    for n, path in enumerate(paths):
        os.symlink(os.path.abspath(path), os.path.join(links, str(n)))
        names.append(f"m/{n}\n")
    return "".join(names).encode()


# --------------------------------------------------------------------------
# scikit-learn baseline
# --------------------------------------------------------------------------

def _read_latin1(paths):
    out = []
    for p in paths:
        with open(p, "rb") as f:
            out.append(f.read().decode("latin-1"))
    return out


def run_sklearn_nb(train_ham, train_spam, test):
    """Naive baseline: CountVectorizer + MultinomialNB, both with defaults,
    on the raw bytes decoded as latin-1 (headers, MIME and HTML included).

    Score: the log-odds ln P(spam|x) - ln P(ham|x) from ``predict_log_proba``
    (default cut-off 0, i.e. ``predict``).  ``predict_proba`` saturates to
    exactly 0 or 1 for long messages and so ties many of them; see
    :func:`run_sklearn_nb_proba`.
    """
    return _sklearn_nb(train_ham, train_spam, test, logodds=True)


def run_sklearn_nb_proba(train_ham, train_spam, test):
    """As :func:`run_sklearn_nb`, scored by ``predict_proba`` (ties at 0 and 1)."""
    return _sklearn_nb(train_ham, train_spam, test, logodds=False)


def _sklearn_nb(train_ham, train_spam, test, logodds):
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.naive_bayes import MultinomialNB

    t0 = time.perf_counter()
    docs = _read_latin1(train_ham) + _read_latin1(train_spam)
    y = np.r_[np.zeros(len(train_ham)), np.ones(len(train_spam))]
    vectorizer = CountVectorizer()
    model = MultinomialNB().fit(vectorizer.fit_transform(docs), y)
    t1 = time.perf_counter()
    x = vectorizer.transform(_read_latin1(test))
    if logodds:
        log_proba = model.predict_log_proba(x)
        scores = log_proba[:, 1] - log_proba[:, 0]
    else:
        scores = model.predict_proba(x)[:, 1]
    t2 = time.perf_counter()
    return RunResult(np.asarray(scores, dtype=float), t1 - t0, t2 - t1)


# --------------------------------------------------------------------------
# registry, isolation
# --------------------------------------------------------------------------


def _read_bytes(paths):
    out = []
    for p in paths:
        with open(p, "rb") as f:
            out.append(f.read())
    return out


def _spamnb(train_ham, train_spam, test, **settings):
    """spamnb with its default tokenizer and the given model settings.

    Score: the log-odds ln P(spam|x) - ln P(ham|x); the default decision's
    cut-offs (0.5, 0.95 on P(spam|x)) are given on that scale.
    """
    from spamnb.scale import parallel
    from spamnb.model import SpamModel

    t0 = time.perf_counter()
    model = SpamModel(**settings)  # trained as `spamnb train` does (counting, then refine())
    parallel.train(model, parallel.plan(ham=train_ham, spam=train_spam), registry=False)
    t1 = time.perf_counter()
    raws = _read_bytes(test)
    scores = np.array([r.score for r in model.classify_many(raws)])
    return RunResult(scores, t1 - t0, time.perf_counter() - t1)


def run_spamnb(train_ham, train_spam, test):
    """spamnb's default model: multinomial NB on unit-length presence rows, λ = 0.01, refined."""
    return _spamnb(train_ham, train_spam, test)


def run_spamnb_bernoulli(train_ham, train_spam, test):
    """spamnb, Bernoulli NB (presence and absence), λ = 0.01, refined."""
    return _spamnb(train_ham, train_spam, test, model_type="bernoulli")


def run_spamnb_complement(train_ham, train_spam, test):
    """spamnb, complement NB (Rennie et al. 2003) on unit-length presence rows."""
    return _spamnb(train_ham, train_spam, test, model_type="complement")


def run_spamnb_counts(train_ham, train_spam, test):
    """spamnb, multinomial NB on raw token counts (the textbook model), λ = 1, not refined."""
    return _spamnb(train_ham, train_spam, test, features="counts", alpha=1.0, refine_rounds=0)


def _logit(p):
    return float(np.log(p / (1 - p)))


_SPAMNB_CUTOFFS = (_logit(0.5), _logit(0.95))

PEERS = {
    "spamnb": Peer("spamnb", run_spamnb, _SPAMNB_CUTOFFS, external=False),
    "spamnb-bernoulli": Peer("spamnb-bernoulli", run_spamnb_bernoulli, _SPAMNB_CUTOFFS, external=False),
    "spamnb-complement": Peer("spamnb-complement", run_spamnb_complement, _SPAMNB_CUTOFFS, external=False),
    "spamnb-counts": Peer("spamnb-counts", run_spamnb_counts, _SPAMNB_CUTOFFS, external=False),
    # bogofilter's compiled-in defaults (bogofilter -Q): ham_cutoff 0.45, spam_cutoff 0.99
    "bogofilter": Peer("bogofilter", run_bogofilter, (0.45, 0.99), external=True),
    # spamprobe's default spam probability threshold -l 0.7, no unsure band
    "spamprobe": Peer("spamprobe", run_spamprobe, (0.7, 0.7), external=True),
    # mailfilter.cf: good at pR >= 5, spam at pR <= -5; the score is -pR
    "crm114": Peer("crm114", run_crm114, (-CRM114_THRESHOLD, CRM114_THRESHOLD), external=True),
    # predict() of a two-class sklearn model: spam iff log-odds > 0
    "sklearn-nb": Peer("sklearn-nb", run_sklearn_nb, (0.0, 0.0), external=False),
    "sklearn-nb-proba": Peer("sklearn-nb-proba", run_sklearn_nb_proba, (0.5, 0.5), external=False),
}


def resolve_peer(spec):
    """A Peer from a registry name or from ``module:function[:in|:ext]``.

    For ``module:function`` the function is a runner; its scores are taken
    as probabilities with cut-offs (0.5, 0.5) unless it has a ``cutoffs``
    attribute; it runs in-process (``:in``, default) or through children
    (``:ext``).  ``module`` must be importable (e.g. with ``scripts/`` or the
    project on ``sys.path``).
    """
    if spec in PEERS:
        return PEERS[spec]
    parts = spec.split(":")
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("in", "ext")):
        raise ValueError(f"unknown peer {spec!r}: use one of {sorted(PEERS)} or module:function[:in|:ext]")
    func = getattr(importlib.import_module(parts[0]), parts[1])
    cutoffs = getattr(func, "cutoffs", (0.5, 0.5))
    return Peer(spec, func, cutoffs, external=len(parts) == 3 and parts[2] == "ext")


def _vm_hwm_mb():
    """This process's peak resident size (VmHWM), reset by exec unlike ru_maxrss."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _isolated_worker(run, external, train_ham, train_spam, test, queue):
    try:
        result = run(train_ham, train_spam, test)
        if result.peak_mb is None:
            result.peak_mb = (resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0
                              if external else _vm_hwm_mb())
        queue.put(("ok", result))
    except BaseException as exc:  # report any failure to the parent
        queue.put(("error", f"{type(exc).__name__}: {exc}"))


def run_isolated(peer, train_ham, train_spam, test):
    """Run ``peer`` in a fresh (spawned) Python process; fill in ``peak_mb``.

    Peak memory: what the runner reported (external tools, measured with
    ``/usr/bin/time``), else the worker's own VmHWM (in-process runners,
    including the interpreter, numpy and the loaded messages), else the
    largest child's ``ru_maxrss`` (an over-estimate, see :class:`_Tools`).
    """
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_isolated_worker,
                       args=(peer.run, peer.external, list(train_ham), list(train_spam), list(test), queue))
    proc.start()
    status, payload = queue.get()
    proc.join()
    if status != "ok":
        raise RuntimeError(f"peer {peer.name} failed: {payload}")
    return payload


# --------------------------------------------------------------------------
# header filtering
# --------------------------------------------------------------------------

_FIELD = re.compile(rb"^([!-9;-~]+)[ \t]*:")


def keep_headers(message: bytes, keep) -> bytes:
    """Drop every header field whose name is not in ``keep``; body untouched.

    Byte-wise: the header is the leading run of header-field lines (a name
    of printable ASCII other than ':' then ':') and their continuation lines
    (starting with space or tab), ended by the first empty line (LF or CRLF)
    or by the first line that is neither.  A leading mbox ``From `` line is
    dropped as well (it is not a header field).  Kept fields keep their
    exact bytes, continuation lines and line endings, in their order; the
    empty line and everything after it are copied unchanged.

    Parameters
    ----------
    message : bytes
    keep : iterable of str
        Field names, compared case-insensitively (``Subject``, ``From``...).
    """
    keep = {k.strip().lower().encode("ascii") for k in keep}
    lines = re.split(rb"(?<=\n)", message)  # keeps each line's own ending
    out = []
    i = 0
    if lines and lines[0].startswith(b"From "):
        i = 1
    keeping = False
    while i < len(lines):
        line = lines[i]
        if line in (b"\n", b"\r\n", b""):
            break  # end of header: the separator and body are copied below
        if line[:1] in (b" ", b"\t") and i > 0:
            if keeping:
                out.append(line)
            i += 1
            continue
        m = _FIELD.match(line)
        if m is None:
            break  # not a header line: body starts here (no separator)
        keeping = m.group(1).lower() in keep
        if keeping:
            out.append(line)
        i += 1
    out.extend(lines[i:])
    return b"".join(out)


def rewrite_with_headers(paths, keep, outdir):
    """Write header-filtered copies of ``paths`` into ``outdir``; return their paths.

    Copies are named by position (``000123``) so names never collide.
    """
    new = []
    for n, path in enumerate(paths):
        with open(path, "rb") as f:
            data = keep_headers(f.read(), keep)
        target = os.path.join(outdir, f"{n:06d}")
        with open(target, "wb") as f:
            f.write(data)
        new.append(target)
    return new

