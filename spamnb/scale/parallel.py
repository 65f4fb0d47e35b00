"""Sharded counting: training on every core, or on a Dask cluster, with one result.

Naive Bayes training is a sum of counts, so it splits into independent pieces
and merges exactly. The pipeline::

    plan(sources)  --> Shard 0, Shard 1, ...       (parent, lazily, in source order)
    count_shard(shard, spec) --> ShardCounts        (a worker: read, tokenize, count)
    ShardMerger.add(counts), in shard order         (parent)
    ShardMerger.install(model)                      (parent, once)

Design decisions, each made here:

* Shards are defined by the data, never by the number of workers: consecutive
  chunks of :data:`SHARD_SIZE` messages in source order. Every worker count
  and every backend therefore computes the same shards, and the parent merges
  them in shard order, so the model is identical bit for bit whatever
  ``--jobs`` or ``--backend`` is (the default presence-l2 features are floats:
  the order of additions matters, and is fixed). :data:`SHARD_SIZE` equals the
  model's learning batch, so a corpus without duplicates gives exactly the
  model :meth:`SpamModel.learn` gives (for counts, presence and presence-l2
  features; logtf-l2 row norms may differ in the last bit).
* A worker counts its shard against a shard-local :class:`Vocabulary` (or the
  stateless :class:`HashingVocabulary`): per-class feature sums
  n_cw = Σ_{i in c} f(x_i)_w (rows added in message order), document
  frequencies df_w and class counts N_c. The parent maps the shard's tokens to
  global ids in shard order (a new token gets the next id), which is the
  vocabulary one sequential pass would build, then adds the arrays.
* Where a worker can read its own input (message files: maildirs, folder
  trees, single files, index files) a shard carries only paths, so a Dask
  worker reads its own shards (from a file system it shares with the client).
  Streams that cannot be split (standard input, mbox, MH, archives) are read by
  the parent, which ships the raw bytes of one shard at a time.
* Memory is bounded: shards are planned lazily and at most ``2 × workers`` of
  them are in flight (locally a window over the executor -- with loky this
  process counts shards too while it would otherwise wait for the workers to
  start; on Dask joblib's ``pre_dispatch``); the parent keeps only the
  vocabulary, the count arrays and, with the registry, 16 bytes per message
  key (a dict entry, ~100 bytes: pass ``registry=False`` for very large corpora).
* Duplicates (same :func:`message_key`: the author's header fields and the body) are
  decided at merge time with :meth:`SpamModel.learn`'s rules: a message
  already counted under the same label is not counted again; under the other
  label it moves (its row is subtracted from the old class), so a message given
  as both ham and spam (a *conflict*) counts once, under the label given last,
  and its earlier row leaves the sample kept for refine(): training on errors
  never repeats it under the other label. Within one shard the last occurrence
  of a key is the one counted. To decide, the worker returns the shard's
  feature rows along with its sums (O(nnz) more to ship); without the registry
  every message given is counted, duplicates too.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from array import array
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from spamnb.mail import sources as _src
from spamnb._version import __version__
from spamnb.model import BATCH, LABELS, REFINE_MAX_ROWS, SpamModel, binary_features, label_id, message_key, transform_features
from spamnb.mail.mime import NotMailError, looks_like_mail
from spamnb.mail.tokenizer import TokenizerConfig, tokenize
from spamnb.nb.vocabulary import HashingVocabulary, Vocabulary

__all__ = [
    "SHARD_SIZE", "BACKENDS", "TokenTable", "Tokenized", "Shard", "ShardPlan", "CountSpec", "ShardCounts",
    "ShardMatrix", "Runner", "ShardMerger", "plan", "shards_of", "count_shard", "matrix_shard", "train", "count_matrix",
    "can_fork", "ordered_map",
]

# Messages per shard. Part of the result (float sums are added shard by shard),
# so it is a constant, equal to the model's learning batch.
SHARD_SIZE = BATCH

# Where shards are counted. "multiprocessing" (the default): worker processes
# forked from this one (the standard library's ProcessPoolExecutor), so a worker
# starts in milliseconds with this process's modules already imported; joblib's
# own multiprocessing backend cannot hand results back as a generator, which the
# bounded window below needs. "loky": joblib's fresh interpreters (slow to
# start: each imports numpy, scipy and the tokenizer; for where forking is
# unsafe, e.g. a caller with threads running). "dask": the workers of a Dask
# cluster, through joblib. Measured by tools/benchmarks/bench_train.py (section a):
# docs/scale.md.
BACKENDS = ("multiprocessing", "loky", "dask")


# -- shards ------------------------------------------------------------------------


class TokenTable:
    """Each distinct token once, and its id: :class:`Tokenized` messages keep their
    tokens as ids into one table (4 bytes a token, where a list of the token strings
    costs 8 bytes a token and every string again per message)."""

    def __init__(self):
        self._ids: dict[str, int] = {}
        self._tokens: list[str] = []

    def encode(self, tokens) -> array:
        ids, table = self._ids, self._tokens
        out = array("i")
        for token in tokens:
            i = ids.get(token)
            if i is None:
                i = ids[token] = len(table)
                table.append(token)
            out.append(i)
        return out

    def decode(self, ids) -> list[str]:
        table = self._tokens
        return [table[i] for i in ids]


@dataclass(frozen=True, slots=True)
class Tokenized:
    """A message read and tokenized once, standing in a shard item for its bytes.

    For a caller that needs the same mail's tokens more than once (``spamnb setup``
    screens its ham, cross-validates and trains on the same messages): counting it
    gives what counting its bytes would, without reading or tokenizing it again.
    ``ids``: its tokens under ``config`` (in order) in ``table``; ``key``: its
    :func:`~spamnb.model.message_key`; ``mail``: whether its bytes look like mail
    (one that does not is skipped, as a file of it would be); ``raw``: the bytes
    it was made from when they were given, None when read from its file, for a
    caller that must read it again under other settings. For this process's
    runner: a worker process would be sent the table along with each shard.
    """

    ids: array = field(repr=False)
    table: TokenTable = field(repr=False)
    key: object
    config: TokenizerConfig = field(repr=False)
    mail: bool = True
    raw: bytes | None = field(default=None, repr=False)

    @classmethod
    def of(cls, raw: bytes, config: TokenizerConfig, table: TokenTable, given: bool = False) -> "Tokenized":
        """``raw`` read and tokenized (``given``: keep ``raw``, the bytes were not read from a file)."""
        return cls(table.encode(tokenize(raw, config)), table, message_key(raw), config,
                   looks_like_mail(raw), raw if given else None)

    def tokens(self, config: TokenizerConfig) -> list[str]:
        if config != self.config:
            raise ValueError("a message tokenized under other settings than this model's: read it again")
        return self.table.decode(self.ids)


def _tokens(raw, config):
    return raw.tokens(config) if isinstance(raw, Tokenized) else tokenize(raw, config)


def _key(raw):
    return raw.key if isinstance(raw, Tokenized) else message_key(raw)


@dataclass(frozen=True)
class Shard:
    """A chunk of consecutive messages: ``(source, raw, label)`` items.

    ``raw`` is None when ``source`` is a file the worker reads itself.
    ``strict``: an unreadable file raises instead of being skipped.
    """

    number: int
    items: tuple
    strict: bool = False

    def __len__(self) -> int:
        return len(self.items)

    def read(self):
        """The shard's messages ``[(source, raw, label)]`` and the skipped ``[(source, exc)]``;
        a :class:`Tokenized` message stays as it is (``raw``), or is skipped if not mail."""
        skipped = []
        report = _src.reporter(self.strict, lambda source, exc: skipped.append((source, exc)))
        read = []
        for source, raw, label in self.items:
            if isinstance(raw, Tokenized):
                if raw.mail:
                    read.append((source, raw, label))
                else:
                    report(source, NotMailError())  # as mail_only says of its bytes
                continue
            got = [_src.Message(source, raw, label)] if raw is not None else _src.message_file(source, label, report)
            read.extend((m.source, m.raw, m.label) for m in _src.mail_only(got, report))
        return read, skipped


class ShardPlan:
    """An iterable of :class:`Shard` (lazily, in source order), built by :func:`plan`.

    ``nested``: ``(folder, label, root, root_label)`` of each Maildir++ sub-folder
    given as a source of its own that ``recursive`` does not read again as part
    of its root.
    """

    def __init__(self, items_factory, size: int = SHARD_SIZE, strict: bool = False, nested=()):
        self._items = items_factory
        self.size = int(size)
        self.strict = strict
        self.nested = list(nested)

    def __iter__(self) -> Iterator[Shard]:
        chunk = []
        number = 0
        for item in self._items():
            if isinstance(item, Shard):  # already a shard: passed through as it is
                yield item
                continue
            chunk.append(item)
            if len(chunk) == self.size:
                yield Shard(number, tuple(chunk), self.strict)
                number += 1
                chunk = []
        if chunk:
            yield Shard(number, tuple(chunk), self.strict)


def plan(ham=(), spam=(), index=(), *, recursive=False, strict=False, on_error=None,
         size: int = SHARD_SIZE, trust_index: bool = False) -> ShardPlan:
    """The shards of the messages ``--ham``/``--spam``/``--index`` name.

    The messages, and their order, are those of :func:`spamnb.cli.options.labelled`
    (ham sources, spam sources, then index files). Every source is checked
    here, before any mail is read, so a typo fails at once. Message files
    become paths (read by the workers); other kinds are read here.

    With ``recursive``, a Maildir++ root does not read its sub-folders that
    are given as sources in their own right (``--ham ~/Maildir --spam
    ~/Maildir/.Junk``: the Junk messages are spam only); they are listed in
    the plan's ``nested``.

    Index files are read line by line as shards are needed, so a bad line
    raises :class:`~spamnb.mail.sources.SourceError` when it is reached, and so
    does a path outside the index's folder unless ``trust_index``
    (:func:`spamnb.mail.sources.index_paths`).
    Listing a maildir or folder tree holds its file names (sorted) in memory;
    for very large corpora use an index file.
    """
    report = _src.reporter(strict, on_error)
    specs = []
    for label, group in (("ham", ham), ("spam", spam)):
        for spec in group:
            spec = os.fspath(spec)
            kind = _src.detect_kind(spec)
            if kind == "index":
                raise _src.SourceError(f"{spec} is a labelled index file; do not give it a label too")
            specs.append((kind, spec, label))
    for spec in index:
        spec = os.fspath(spec)
        if not os.path.exists(spec):
            raise _src.SourceError(f"no such index file or archive: {spec}")
        if os.path.isdir(spec):
            raise _src.SourceError(f"{spec} is a directory, not an index file")
        specs.append(("archive-index" if _src.is_archive(spec) else "index", spec, None))

    maildirs = [(os.path.realpath(spec), spec, label) for kind, spec, label in specs if kind == "maildir"]
    skip = {}  # root -> its Maildir++ sub-folders given as sources of their own
    nested = []
    if recursive:
        for kind, spec, label in specs:
            if kind == "maildir":
                root = os.path.realpath(spec)
                subs = [(sub, lb) for real, sub, lb in maildirs
                        if os.path.dirname(real) == root and os.path.basename(real).startswith(".")]
                skip[spec] = [sub for sub, _ in subs]
                nested.extend((sub, lb, spec, label) for sub, lb in subs)

    def items():
        for kind, spec, label in specs:
            if kind == "maildir":
                yield from ((p, None, label)
                            for p in _src.maildir_paths(spec, recursive, report, skip=skip.get(spec, ())))
            elif kind == "tree":
                yield from ((p, None, label) for p in _src.tree_paths(spec, report))
            elif kind == "file":
                yield spec, None, label
            elif kind == "index":
                yield from ((p, None, lb) for p, lb in _src.index_paths(spec, trusted=trust_index))
            elif kind == "archive-index":
                yield from ((m.source, m.raw, m.label)
                            for m in _src.iter_index(spec, strict=strict, on_error=on_error))
            else:  # stdin, mbox, MH, archive: one sequential reader, bytes shipped
                yield from ((m.source, m.raw, m.label)
                            for m in _src.iter_messages(spec, label=label, recursive=recursive,
                                                        strict=strict, on_error=on_error))

    return ShardPlan(items, size, strict, nested)


def shards_of(messages, size: int = SHARD_SIZE) -> ShardPlan:
    """Shards of messages already in hand: an iterable of ``(source, raw, label)``
    (a :class:`ShardPlan` is returned as it is, :class:`Shard` items pass through)."""
    if isinstance(messages, ShardPlan):
        return messages
    return ShardPlan(lambda: iter(messages), size)


# -- counting one shard (in a worker) -------------------------------------------------


@dataclass(frozen=True)
class CountSpec:
    """What a worker needs to count a shard as a given model would."""

    tokenizer: TokenizerConfig
    features: str
    hash_features: int | None = None
    keys: bool = True  # registry keys (and the rows, to decide duplicates at merge time)
    rows: bool = False  # the feature rows, for refine() (training on errors) after the merge
    version: str = __version__  # a worker running another spamnb would tokenize differently

    def check(self) -> None:
        if self.version != __version__:
            raise RuntimeError(f"this worker runs spamnb {__version__}, the client {self.version}: "
                               "install the same version on every worker")

    @classmethod
    def of(cls, model: SpamModel, keys: bool = True) -> "CountSpec":
        return cls(model.tokenizer, model.features, model.hash_features, keys,
                   model.refine_rounds > 0, __version__)

    @property
    def binary(self) -> bool:
        return binary_features(self.features)

    def vocabulary(self):
        return Vocabulary() if self.hash_features is None else HashingVocabulary(self.hash_features)


@dataclass
class ShardCounts:
    """The counts of one shard, over its own columns.

    ``columns``: the shard's tokens in first-seen order (a hashed model: its
    column ids, ascending). ``feature_count`` (2, len(columns)): n_cw;
    ``doc_freq``: df_w; ``class_count``: N_c. ``keys``/``rows`` only when the
    registry is kept: each message's key and its feature row.
    """

    number: int
    y: np.ndarray
    columns: list | np.ndarray
    class_count: np.ndarray
    feature_count: np.ndarray
    doc_freq: np.ndarray
    keys: list | None = None
    rows: sp.csr_matrix | None = None
    skipped: list = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class ShardMatrix:
    """One shard as rows of counts (presence when binary) over its own columns."""

    number: int
    sources: list
    y: np.ndarray
    columns: list | np.ndarray
    X: sp.csr_matrix
    skipped: list = field(default_factory=list)
    seconds: float = 0.0


@contextmanager
def _cyclic_gc_paused():
    """No cyclic garbage collection while a shard is tokenized.

    Tokenizing allocates millions of short-lived, acyclic objects, freed by
    reference counting; the collector's passes over them (and, in a forked
    worker, over every object inherited from the parent) find nothing to free
    and cost the workers time for it (docs/speed.md, "Training"). Collection resumes
    after the shard, so the rare cycle is still freed. What the collector still costs a
    whole ``train`` (176 passes, 0.21-0.23 CPU s) did not move with a larger gen-0
    threshold or ``gc.freeze()`` after the imports (docs/tokenizer-speed.md).
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _tokenized(shard: Shard, spec: CountSpec):
    spec.check()
    messages, skipped = shard.read()
    with _cyclic_gc_paused():
        token_lists = [_tokens(raw, spec.tokenizer) for _, raw, _ in messages]
    y = np.fromiter((label_id(lb) for _, _, lb in messages), dtype=np.int64, count=len(messages))
    return messages, token_lists, y, skipped


def _local_matrix(token_lists, spec: CountSpec):
    """Counts (or presence) over the shard's own columns, and those columns."""
    vocab = spec.vocabulary()
    X, _ = vocab.transform(token_lists, grow=True, binary=spec.binary)
    if spec.hash_features is None:
        return X, vocab.tokens()
    # sparse rewrite: keep only the hashed columns the shard touches (ascending, so rows stay sorted)
    cols = np.unique(X.indices)
    X = sp.csr_matrix((X.data, np.searchsorted(cols, X.indices).astype(np.int32), X.indptr),
                      shape=(X.shape[0], cols.size))
    X.has_sorted_indices = True
    X.has_canonical_format = True
    return X, cols.astype(np.int64)


def class_sums(F: sp.csr_matrix, y: np.ndarray):
    """N_c, n_cw = Σ_{i in c} F_iw and df_w = |{i : F_iw ≠ 0}| of canonical CSR rows.

    Each column's sum is accumulated row by row in message order (bincount
    adds in array order), the order the estimator's own batch update uses.
    """
    rows = np.repeat(np.arange(F.shape[0]), np.diff(F.indptr))
    yc = y[rows]
    V = F.shape[1]
    fc = np.empty((len(LABELS), V))
    for c in range(len(LABELS)):
        mine = yc == c
        fc[c] = np.bincount(F.indices[mine], weights=F.data[mine], minlength=V)  # n_cw
    df = np.bincount(F.indices, minlength=V).astype(np.int64)  # df_w (canonical: no explicit zeros)
    cc = np.bincount(y, minlength=len(LABELS)).astype(np.float64)  # N_c
    return cc, fc, df


def count_shard(shard: Shard, spec: CountSpec) -> ShardCounts:
    """Read, tokenize and count one shard (runs in a worker process)."""
    start = time.perf_counter()
    messages, token_lists, y, skipped = _tokenized(shard, spec)
    X, columns = _local_matrix(token_lists, spec)
    del token_lists
    F = transform_features(X, spec.features)  # f(x): this model's feature transform, in place
    cc, fc, df = class_sums(F, y)
    keys = [_key(raw) for _, raw, _ in messages] if spec.keys else None
    return ShardCounts(shard.number, y, columns, cc, fc, df, keys, F if spec.keys or spec.rows else None,
                       skipped, time.perf_counter() - start)


def matrix_shard(shard: Shard, spec: CountSpec) -> ShardMatrix:
    """Read and tokenize one shard into count rows (runs in a worker process)."""
    start = time.perf_counter()
    messages, token_lists, y, skipped = _tokenized(shard, spec)
    X, columns = _local_matrix(token_lists, spec)
    return ShardMatrix(shard.number, [s for s, _, _ in messages], y, columns, X, skipped,
                       time.perf_counter() - start)


# -- running shards ----------------------------------------------------------------------


@dataclass(frozen=True)
class Runner:
    """Where shards are counted: ``jobs`` local processes (1 = only this one, -1 =
    one per core): ``jobs`` forked workers, or with ``backend="loky"`` this process
    and ``jobs - 1`` joblib/loky workers; or the workers of a Dask cluster at
    ``scheduler`` (through joblib's Dask backend)."""

    jobs: int = 1
    backend: str = "multiprocessing"
    scheduler: str | None = None

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}: choose from {', '.join(BACKENDS)}")
        if self.jobs == 0 or int(self.jobs) != self.jobs:
            raise ValueError(f"jobs must be a positive number of processes or -1 (every core), not {self.jobs!r}")
        if self.backend == "dask" and not self.scheduler:
            raise ValueError("the dask backend needs the address of a scheduler (--scheduler tcp://HOST:8786)")

    def map(self, func, items: Iterable, *args) -> Iterator:
        """``func(item, *args)`` for every item, results in item order.

        Items are taken from ``items`` only as workers free up (at most twice
        as many in flight as there are workers), so a lazy plan stays lazy.
        """
        if self.backend != "dask":
            yield from ordered_map(func, items, *args, jobs=self._n_local(), backend=self.backend)
            return
        from joblib import Parallel, delayed, parallel_config

        calls = (delayed(func)(item, *args) for item in items)
        opts = dict(return_as="generator", pre_dispatch="2*n_jobs", batch_size=1)

        client = _dask_client(self.scheduler)
        try:
            with parallel_config(backend="dask", client=client):
                yield from Parallel(n_jobs=-1, **opts)(calls)
        finally:
            client.close()


    def _n_local(self) -> int:
        return (os.cpu_count() or 1) if self.jobs < 0 else int(self.jobs)


def _executor(backend, jobs):
    """``(executor, workers, forked)`` for ``jobs`` local processes.

    "multiprocessing" where :func:`can_fork`: ``jobs`` forked workers of our
    own (they start in milliseconds), this process only merging: the merge in
    shard order waits whenever this process is busy counting, so it counts
    nothing itself (docs/scale.md). Else joblib's reusable loky executor (it
    outlives the call) with ``jobs - 1`` workers, this process counting too
    while they start. Training the shipped corpus with two forked workers: this
    process 1.8-2.0 CPU s (imports, reading the archive, merging), the workers
    7.0-7.9 s together, against 8.5-8.6 s in one process; its wall time against
    ``--jobs 1`` matched the machine's own two-process ceiling (0.75 and 0.75 on a
    shared machine: docs/tokenizer-speed.md, "--jobs 2").
    """
    if backend == "multiprocessing":
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        if can_fork():
            return ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")), jobs, True
    from joblib.externals.loky import get_reusable_executor

    return get_reusable_executor(max_workers=jobs - 1), jobs - 1, False


def can_fork() -> bool:
    """True where local workers are forked from this process.

    Not on macOS, where system frameworks make forking unsafe (Python spawns
    there), nor where the platform has no ``fork``. Forked workers inherit this
    process's modules and objects; elsewhere :func:`ordered_map` starts fresh
    interpreters, which see none of this process's state.
    """
    import multiprocessing

    return "fork" in multiprocessing.get_all_start_methods() and sys.platform != "darwin"


def ordered_map(func, items: Iterable, *args, jobs: int, backend: str = "multiprocessing") -> Iterator:
    """``func(item, *args)`` for every item on ``jobs`` local processes, results in item order.

    The one executor window of spamnb: sharded training (:meth:`Runner.map`)
    and batch classification (:func:`spamnb.scale.batch.classify_parallel`)
    both run through it. Items are taken only as workers free up, so a lazy
    iterable stays lazy and at most ``2 × jobs`` items are in flight (each
    worker busy, one item queued behind it). ``jobs <= 1`` is a plain loop in
    this process.

    Processes (:func:`_executor`): ``backend="multiprocessing"`` forks ``jobs``
    workers where :func:`can_fork`; otherwise, and with ``backend="loky"``,
    joblib's loky workers run ``jobs - 1`` fresh interpreters, and whenever the
    next result in order is not ready yet this process runs the next item
    itself instead of waiting, so the time they take to start (importing
    numpy, scipy and the tokenizer) is not lost. ``func`` and ``args`` must
    pickle; a ``func`` that relies on state inherited by forking is only
    correct where :func:`can_fork`, so its caller checks that first.
    """
    from collections import deque
    from concurrent.futures import Future

    it = iter(items)
    if jobs <= 1:
        for item in it:
            yield func(item, *args)
        return
    executor, workers, forked = _executor(backend, jobs)
    window: deque = deque()  # Futures (workers) and finished results (this process), in item order
    limit = 2 * jobs
    exhausted = False

    def take():
        nonlocal exhausted
        try:
            return next(it)
        except StopIteration:
            exhausted = True
            return None

    try:
        while True:
            # keep each worker busy, with one shard queued behind the one it counts
            while not exhausted and len(window) < limit and \
                    sum(isinstance(w, Future) and not w.done() for w in window) < 2 * workers:
                item = take()
                if not exhausted:
                    window.append(executor.submit(func, item, *args))
            if not window:
                return
            head = window[0]
            if not forked and isinstance(head, Future) and not head.done() and not exhausted \
                    and len(window) < limit:
                item = take()  # the next result is not ready: count a shard here meanwhile
                if not exhausted:
                    window.append(_Done(func(item, *args)))
                continue
            window.popleft()
            yield head.result() if isinstance(head, Future) else head.value
    finally:
        for w in window:
            if isinstance(w, Future):
                w.cancel()
        if forked:
            executor.shutdown(wait=False, cancel_futures=True)


@dataclass
class _Done:
    value: object


def _dask_client(address):
    try:
        from distributed import Client
    except ImportError:
        raise ValueError("the dask backend needs Dask: pip install 'spamnb[dask]'") from None
    try:
        return Client(address, timeout=30)
    except (OSError, TimeoutError) as exc:
        raise ValueError(f"cannot reach the Dask scheduler at {address}: {exc}") from None


# -- merging (in the parent, in shard order) ------------------------------------------------


class ShardMerger:
    """Adds shard counts, in shard order, to arrays aligned with a vocabulary.

    Parameters
    ----------
    vocabulary : Vocabulary or HashingVocabulary
        Grown in place (the model's own, for :meth:`install`).
    registry : dict or None
        Message key -> class of the messages counted so far (the model's own
        registry); None counts every message given, duplicates too.
    """

    def __init__(self, vocabulary, registry: dict | None = None, keep_rows: int = 0):
        self.vocabulary = vocabulary
        # A uniform sample of at most keep_rows counted rows (global columns), for
        # refine(): reservoir sampling, so memory is bounded whatever the corpus size.
        self.keep_rows = keep_rows
        self._sample: list = []  # (indices, data, y, key)
        self._slot: dict = {}  # message key -> its row's place in _sample
        self._seen_rows = 0
        self._rng = np.random.default_rng(0)
        self.hashed = isinstance(vocabulary, HashingVocabulary)
        self.registry = registry
        cap = max(len(vocabulary), 1024)
        self._fc = np.zeros((cap, len(LABELS)))  # feature-major: growing appends rows
        self._df = np.zeros(cap, dtype=np.int64)
        self.class_count = np.zeros(len(LABELS))
        self.done = {"learned": 0, "moved": 0, "unchanged": 0}
        self.conflicts: set = set()  # keys of the messages given under both labels
        self.seconds = 0.0  # worker time, summed

    @property
    def feature_count(self) -> np.ndarray:
        return self._fc[: len(self.vocabulary)].T

    @property
    def doc_freq(self) -> np.ndarray:
        return self._df[: len(self.vocabulary)]

    def _reserve(self, n):
        cap = self._fc.shape[0]
        if n > cap:  # double when full: O(1) amortised per new column
            new = max(n, 2 * cap)
            fc = np.zeros((new, len(LABELS)))
            fc[:cap] = self._fc
            df = np.zeros(new, dtype=np.int64)
            df[:cap] = self._df
            self._fc, self._df = fc, df

    def add(self, s: ShardCounts) -> None:
        """Merge one shard (call in shard order)."""
        ids = s.columns if self.hashed else self.vocabulary.ids(s.columns, grow=True)  # local -> global
        self._reserve(len(self.vocabulary))
        cc, fc, df = s.class_count, s.feature_count, s.doc_freq
        rows, y, keys = s.rows, s.y, None
        if self.registry is None:
            self.done["learned"] += len(s.y)
        else:
            keep = self._decide(s, ids)
            keys = [key for key, kept in zip(s.keys, keep) if kept]
            if not keep.all():  # duplicates: recount the kept rows, in the same order
                rows, y = s.rows[keep], s.y[keep]
                cc, fc, df = class_sums(rows, y)
        if self.keep_rows and rows is not None:
            self._sample_rows(rows, y, ids, keys)
        self._fc[ids] += fc.T  # n_cw += Δn_cw (ids are distinct within a shard)
        self._df[ids] += df  # df_w += Δdf_w
        self.class_count += cc  # N_c += ΔN_c
        self.seconds += s.seconds

    def _decide(self, s: ShardCounts, ids) -> np.ndarray:
        """Which rows count (SpamModel.learn's rules); subtract moved messages' old rows."""
        last, labels = {}, {}
        for i, key in enumerate(s.keys):
            last[key] = i  # within a shard, the last occurrence of a key counts
            labels[key] = labels.get(key, 0) | 1 << int(s.y[i])
        keep = np.zeros(len(s.y), dtype=bool)
        self.done["unchanged"] += len(s.y) - len(last)
        for key, i in last.items():
            y = int(s.y[i])
            old = self.registry.get(key)
            if labels[key] == 3 or old not in (None, y):  # given as ham and as spam
                self.conflicts.add(key)
            if old == y:
                self.done["unchanged"] += 1
                continue
            keep[i] = True
            self.registry[key] = y
            if old is None:
                self.done["learned"] += 1
            else:  # learned under the other label: take it out of its old class first
                self.done["moved"] += 1
                self._subtract(s.rows[i], ids, old)
                self._unsample(key)
        return keep

    def _subtract(self, row, ids, c):
        """Take a moved message's row out of class ``c``. A copy may tokenize a little
        differently from the one counted (a mail client's Status field is a token,
        not part of the identity): no count goes below zero (SpamModel.learn's rule)."""
        cols = ids[row.indices]
        self._fc[cols, c] = np.maximum(self._fc[cols, c] - row.data, 0.0)
        self._df[cols] = np.maximum(self._df[cols] - 1, 0)
        self.class_count[c] -= 1

    def _unsample(self, key):
        """Drop a moved message's earlier row from the refine sample."""
        j = self._slot.pop(key, None)
        if j is None:
            return
        last = self._sample.pop()
        if j < len(self._sample):  # fill the hole with the last row
            self._sample[j] = last
            self._slot[last[3]] = j

    def _sample_rows(self, rows, y, ids, keys=None):
        """Reservoir-sample the shard's rows (Algorithm R), in global column ids;
        ``keys``: the rows' message keys (with the registry), so a row can leave."""
        for i in range(rows.shape[0]):
            a, b = rows.indptr[i], rows.indptr[i + 1]
            key = None if keys is None else keys[i]
            item = (ids[rows.indices[a:b]].astype(np.int32), rows.data[a:b].copy(), int(y[i]), key)
            j = len(self._sample)
            if j >= self.keep_rows:
                j = self._rng.integers(0, self._seen_rows + 1)
                if j >= self.keep_rows:
                    j = None
                else:
                    self._slot.pop(self._sample[j][3], None)
            if j is not None:
                if j == len(self._sample):
                    self._sample.append(item)
                else:
                    self._sample[j] = item
                if key is not None:
                    self._slot[key] = j
            self._seen_rows += 1

    def sample(self):
        """The sampled rows as (CSR over the merged columns, labels)."""
        lengths = [len(ix) for ix, _, _, _ in self._sample]
        indptr = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=indptr[1:])
        X = sp.csr_matrix((np.concatenate([d for _, d, _, _ in self._sample]) if self._sample else np.zeros(0),
                           np.concatenate([ix for ix, _, _, _ in self._sample]) if self._sample
                           else np.zeros(0, dtype=np.int32), indptr),
                          shape=(len(lengths), len(self.vocabulary)))
        X.sort_indices()  # global ids of a shard's first-seen columns are not in ascending order
        return X, np.array([c for _, _, c, _ in self._sample], dtype=np.int64)

    def install(self, model: SpamModel) -> None:
        """Add the merged counts to ``model`` (whose vocabulary this merger grew), then refine it."""
        model.add_counts(self.class_count, self.feature_count, self.doc_freq)
        if self.keep_rows and model.refine_rounds:
            model.refine_rows(*self.sample())


def _report_skipped(result, on_error):
    for source, exc in result.skipped:
        if on_error is not None:
            on_error(source, exc)
        else:
            _src.reporter(False, None)(source, exc)


def train(model: SpamModel, shards, *, runner: Runner | None = None, registry: bool = True,
          on_error=None, progress=None) -> dict:
    """Count ``shards`` (a :class:`ShardPlan`, or ``(source, raw, label)`` items)
    in parallel and add them to the fresh ``model``.

    ``registry``: remember each message's key and count duplicates once
    (:meth:`SpamModel.learn`'s rules); False counts every message given.
    ``progress(n)`` is called with the number of messages merged so far.
    Returns learn's counts, ``learned`` (messages counted), ``moved`` and
    ``unchanged`` (copies dropped: the copies of a message under the other
    label, and under the same label), and ``conflicts``: messages given under
    both labels, by the label they were counted under, ``[ham, spam]``.
    """
    if model.class_count.sum() or len(model.registry):
        raise ValueError("sharded training builds a new model: this one has already learned messages")
    runner = runner or Runner()
    spec = CountSpec.of(model, keys=registry)
    merger = ShardMerger(model.vocabulary, model.registry if registry else None,
                         keep_rows=REFINE_MAX_ROWS if model.refine_rounds else 0)
    n = 0
    for result in runner.map(count_shard, shards_of(shards), spec):
        _report_skipped(result, on_error)
        merger.add(result)
        n += len(result.y)
        if progress is not None:
            progress(n)
    merger.install(model)
    final = [merger.registry[key] for key in merger.conflicts]
    return {**merger.done, "conflicts": [final.count(c) for c in range(len(LABELS))]}


def count_matrix(model: SpamModel, shards, *, runner: Runner | None = None, on_error=None):
    """All messages as one count matrix, as ``vocabulary.fit_transform`` in one pass would give.

    Returns ``(sources, X, y, vocabulary)``: X (n, |V|) canonical CSR of counts
    (presence when the model's features are binary), columns in first-seen
    order of a fresh vocabulary of the model's kind.
    """
    runner = runner or Runner()
    spec = CountSpec.of(model, keys=False)
    vocab = spec.vocabulary()
    hashed = spec.hash_features is not None
    sources, ys, data, indices, lengths = [], [], [], [], []
    for m in runner.map(matrix_shard, shards_of(shards), spec):
        _report_skipped(m, on_error)
        ids = m.columns if hashed else vocab.ids(m.columns, grow=True)
        sources.extend(m.sources)
        ys.append(m.y)
        data.append(m.X.data)
        indices.append(ids[m.X.indices].astype(np.int32))  # shard-local -> global column ids
        lengths.append(np.diff(m.X.indptr))
    n_rows = sum(len(y) for y in ys)
    nnz = sum(len(d) for d in data)
    indptr = np.zeros(n_rows + 1, dtype=np.int32 if nnz <= np.iinfo(np.int32).max else np.int64)
    if lengths:
        np.cumsum(np.concatenate(lengths), out=indptr[1:])
    X = sp.csr_matrix((np.concatenate(data) if data else np.zeros(0),
                       np.concatenate(indices) if indices else np.zeros(0, dtype=np.int32),
                       indptr), shape=(n_rows, len(vocab)))
    X.has_sorted_indices = False
    X.sort_indices()  # remapped rows are no longer in column order
    y = np.concatenate(ys) if ys else np.zeros(0, dtype=np.int64)
    return sources, X, y, vocab
