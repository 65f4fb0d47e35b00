"""Shared fixtures: an isolated environment for every test, a small labelled
corpus cut from the shipped SpamAssassin archive, and a model trained on it.

Training on the whole shipped corpus takes about 15 s; the fixtures here take
about 3 s once per session (reading the archive dominates), so the CLI and
end-to-end tests stay fast.
"""

from __future__ import annotations

import io
import math
import os
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHIPPED_ARCHIVE = ROOT / "corpora" / "spamassassin.tar.xz"
SAMPLE_MAILDIR = ROOT / "corpora" / "sample-maildir"
SAMPLE_INDEX = ROOT / "corpora" / "sample-maildir.index"

# The small corpus: every HAM_STEP-th ham and SPAM_STEP-th spam of the archive
# (4077 ham, 1866 spam), N_PER_CLASS of each: both classes spread over all the
# archive's sub-corpora (easy_ham, easy_ham_2, hard_ham; spam, spam_2).
N_PER_CLASS = 150
HAM_STEP, SPAM_STEP = 27, 12


@pytest.fixture(autouse=True)
def isolated_env(tmp_path_factory, monkeypatch):
    """Nothing a test runs may touch the real home, data or cache folders.

    SPAMNB_CORPUS points at a path that does not exist, so a test that reaches
    the default model by accident fails at once ("no shipped corpus") instead
    of spending 15 s training on the real one; tests that want the default
    model point it at :func:`small_archive`.
    """
    base = tmp_path_factory.mktemp("env")
    for name, sub in [("HOME", "home"), ("XDG_DATA_HOME", "data"), ("XDG_CACHE_HOME", "cache")]:
        (base / sub).mkdir(mode=0o700)
        monkeypatch.setenv(name, str(base / sub))
    monkeypatch.delenv("SPAMNB_MODEL", raising=False)
    monkeypatch.delenv("SPAMNB_DEBUG", raising=False)
    # configuration files: none of the machine's (/etc/spamnb, $XDG_CONFIG_HOME) unless a test writes one
    monkeypatch.delenv("SPAMNB_CONFIG", raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setenv("SPAMNB_SYSTEM_CONFIG", str(base / "system.toml"))
    monkeypatch.setenv("SPAMNB_CORPUS", str(base / "no-corpus.tar.gz"))
    return base


@dataclass(frozen=True)
class SmallCorpus:
    """A labelled corpus on disk: ``root/ham/*``, ``root/spam/*``, ``root/index``."""

    root: Path
    ham_dir: Path
    spam_dir: Path
    index: Path
    n_ham: int
    n_spam: int


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory) -> SmallCorpus:
    """~300 real messages from the shipped archive, as folders plus a TREC index."""
    from spamnb.mail.sources import iter_index

    if not SHIPPED_ARCHIVE.exists():
        pytest.skip("the shipped corpus is not in this checkout")
    root = tmp_path_factory.mktemp("small-corpus")
    seen = {"ham": 0, "spam": 0}
    step = {"ham": HAM_STEP, "spam": SPAM_STEP}
    lines = []
    for msg in iter_index(str(SHIPPED_ARCHIVE)):
        n = seen[msg.label]
        seen[msg.label] += 1
        if n % step[msg.label] or n // step[msg.label] >= N_PER_CLASS:
            continue
        name = msg.source.rsplit("/", 1)[1]
        (root / msg.label).mkdir(exist_ok=True)
        (root / msg.label / name).write_bytes(msg.raw)
        lines.append(f"{msg.label} {msg.label}/{name}\n")
    (root / "index").write_text("".join(lines))
    n_ham = len(os.listdir(root / "ham"))
    n_spam = len(os.listdir(root / "spam"))
    assert (n_ham, n_spam) == (N_PER_CLASS, N_PER_CLASS)
    return SmallCorpus(root, root / "ham", root / "spam", root / "index", n_ham, n_spam)


@pytest.fixture(scope="session")
def tiny_corpus(small_corpus, tmp_path_factory) -> SmallCorpus:
    """The first 10 ham and 10 spam of the small corpus: for tests of what
    ``train`` stores, where the amount of mail does not matter."""
    root = tmp_path_factory.mktemp("tiny-corpus")
    lines = []
    for label in ("ham", "spam"):
        (root / label).mkdir()
        for src in sorted((small_corpus.root / label).iterdir())[:10]:
            shutil.copyfile(src, root / label / src.name)
            lines.append(f"{label} {label}/{src.name}\n")
    (root / "index").write_text("".join(lines))
    return SmallCorpus(root, root / "ham", root / "spam", root / "index", 10, 10)


@pytest.fixture(scope="session")
def small_archive(small_corpus, tmp_path_factory) -> Path:
    """The small corpus as ``small.tar.gz`` with ``small/index`` inside: a
    stand-in for the shipped archive (``SPAMNB_CORPUS``, ``train --index``)."""
    path = tmp_path_factory.mktemp("archive") / "small.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        names = ["index"] + [line.split(" ", 1)[1].strip()
                             for line in small_corpus.index.read_text().splitlines()]
        for name in names:
            data = (small_corpus.root / name).read_bytes()
            info = tarfile.TarInfo(f"small/{name}")
            info.size = len(data)
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture(scope="session")
def trained_model_file(small_corpus, tmp_path_factory) -> Path:
    """A default-settings model trained on the small corpus (never modify it:
    use :func:`model_file` for a private copy)."""
    from spamnb.model import SpamModel
    from spamnb.storage.modelfile import save_model
    from spamnb.mail.sources import iter_index

    from spamnb.scale import parallel

    model = SpamModel()
    parallel.train(model, [(m.source, m.raw, m.label) for m in iter_index(str(small_corpus.index))])
    path = tmp_path_factory.mktemp("model") / "small.joblib"
    save_model(model, path)
    return path


@pytest.fixture
def model_file(trained_model_file, tmp_path) -> Path:
    """A private, writable copy of the trained model (mode 0600)."""
    path = tmp_path / "model" / "model.joblib"
    path.parent.mkdir(mode=0o700)
    shutil.copyfile(trained_model_file, path)
    path.chmod(0o600)
    return path


@pytest.fixture(scope="session")
def trained_model(trained_model_file):
    """The trained model, loaded (read-only use)."""
    from spamnb.storage.modelfile import load_model

    return load_model(trained_model_file)


@pytest.fixture
def sample_maildir(tmp_path) -> Path:
    """A private copy of the shipped held-out maildir (103 messages)."""
    dst = tmp_path / "Maildir"
    shutil.copytree(SAMPLE_MAILDIR, dst)
    return dst


def gold_labels() -> dict[str, str]:
    """File name -> gold label of the shipped sample maildir."""
    labels = {}
    for line in SAMPLE_INDEX.read_text().splitlines():
        if line.strip():
            label, rel = line.split(None, 1)
            labels[os.path.basename(rel)] = label
    return labels


def sample_message(label: str, i: int = 0) -> Path:
    """The i-th message of the shipped sample maildir with gold ``label``."""
    names = sorted(name for name, lb in gold_labels().items() if lb == label)
    return SAMPLE_MAILDIR / "cur" / names[i]


def learnable_cutoffs(model, raw: bytes, distance: float = 1.0) -> list[str]:
    """Decision options under which ``model`` files ``raw`` spam (a positive score) or
    ham, both cut-offs ``distance`` log-odds inside its score: ``filter -u`` learns it
    when ``distance`` < :data:`spamnb.verdict.LEARN_MARGIN`
    (:func:`spamnb.verdict.learns_verdict`), whatever the message's score."""
    score = model.classify(raw).score
    edge = score - distance if score > 0 else score + distance
    cut = repr(1.0 / (1.0 + math.exp(-edge)))
    return ["--spam-cutoff", cut, "--ham-cutoff", cut]


def strip_from_line(raw: bytes) -> bytes:
    """The message without a leading mbox ``From `` line (the sample has them)."""
    if raw.startswith(b"From "):
        return raw.split(b"\n", 1)[1]
    return raw


def growth_ratio(small, large, repeats=7, sample_seconds=0.02, hopeless=None):
    """How much longer ``large()`` takes than ``small()``: the ratio of the medians of
    ``repeats`` samples each, ``(ratio, median small, median large)`` in seconds per call.

    Made for a shared, noisy machine, where the CPU's speed swings by two while we
    measure (another process on the sibling hyperthread, clock changes):

    * the time is the thread's CPU time, which other processes taking the CPU do not
      inflate; the garbage collector runs between samples, not in them (as in timeit),
      over what the samples made only: the objects alive before are frozen (gc.freeze)
      while we measure, else each of the ~18 collections a measurement makes walks the
      whole test session's heap (0.1 s early in the suite, about 1 s late in it: most
      of a growth test's time went there);
    * every sample of either lasts about as long (``small`` repeated to last as long as
      one ``large``, both at least ``sample_seconds``), so a slow spell is as likely to
      hit a sample of one as of the other;
    * the samples are interleaved, their order alternating, so a drift hits both alike;
    * the median ignores the samples a slow spell still spoils.

    ``hopeless``: when the first calls already show a ratio above it, that ratio, without
    the samples (a cost growing that fast would take minutes to sample).
    """
    import gc
    import statistics
    import time

    def seconds(fn, n):
        gc.collect()
        gc.disable()
        try:
            start = time.thread_time()
            for _ in range(n):
                fn()
            return time.thread_time() - start
        finally:
            gc.enable()

    gc.freeze()
    try:
        fns = (small, large)
        once = [min(seconds(fn, 1) for _ in range(2)) for fn in fns]  # warm, and a first estimate
        if hopeless is not None and once[1] > hopeless * once[0]:
            return once[1] / once[0], once[0], once[1]
        target = max(sample_seconds, max(once))
        reps = [max(1, round(target / max(t, 1e-9))) for t in once]
        samples = ([], [])
        for r in range(repeats):
            for i in ((0, 1) if r % 2 == 0 else (1, 0)):
                samples[i].append(seconds(fns[i], reps[i]) / reps[i])
    finally:
        gc.unfreeze()
    med = [statistics.median(s) for s in samples]
    return med[1] / med[0], med[0], med[1]


def growth_ratios(small, large, limit, attempts=3):
    """:func:`growth_ratio` until one is below ``limit``, at most ``attempts`` times: the
    ratios measured. Noise seldom spoils the medians of one measurement, hardly ever those
    of three in a row; a cost that really grows faster than ``limit`` exceeds it every time."""
    ratios = []
    while len(ratios) < attempts and (not ratios or ratios[-1][0] >= limit):
        ratios.append(growth_ratio(small, large, hopeless=3 * limit))
    return ratios


def _dovecot_harness():
    """tests/dovecot.py, or a skip saying what is missing."""
    import dovecot as harness

    if harness.DOVECOT is None:
        pytest.skip(harness.NOT_INSTALLED)
    pytest.importorskip("imapclient", reason="imapclient is not installed (pip install 'imapclient>=3.0'; "
                                             "it is in the test and imap extras)")
    return harness


@pytest.fixture
def make_dovecot():
    """Start private Dovecot IMAP servers (tests/dovecot.py), e.g.
    ``make_dovecot(capabilities_without=("MOVE",))``; all are stopped at the end."""
    harness = _dovecot_harness()
    started = []

    def make(**options):
        server = harness.Dovecot(**options)
        started.append(server)
        return server.start()

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def dovecot(make_dovecot):
    """A private Dovecot serving ``alice``/``secret`` on 127.0.0.1, stopped after the test."""
    return make_dovecot()


def filter_message(model, raw: bytes, name: str, decision=None):
    """``(output, label, learns)``: what ``spamnb filter`` writes for ``raw`` under ``model``
    (a model or a compiled scorer), through the one pipeline every door filters with."""
    from spamnb.delivery import pipeline
    from spamnb.verdict import MODELS_OWN

    out = pipeline.filter_one(raw, pipeline.ModelSource(model, name), via="filter", decision=decision or MODELS_OWN)
    return out.message(), out.label, out.decided.learns
