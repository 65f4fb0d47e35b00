"""Token vocabulary and sparse count matrices.

A :class:`Vocabulary` maps each token (a string produced by the tokenizer) to a
column id and turns tokenised messages into a ``scipy.sparse.csr_matrix`` of
counts, one row a message and one column a token::

    X[i, j] = number of times token j occurs in message i        (multinomial)
    X[i, j] = 1 if token j occurs in message i else 0            (binary=True)

Ids are dense (0 .. len(vocab) - 1) and stable: new tokens are appended at the
end, so the count arrays of an estimator only ever grow by columns on the right
(``estimator.grow_features(len(vocab))``).  Pruning (:meth:`Vocabulary.prune`)
is the only operation that renumbers; it keeps the relative order of the
surviving ids and returns them so the caller can select the same columns from
its own arrays.

The CSR matrix is built in one construction from flat arrays: every token of
every message is mapped to an id (one dict lookup per token), the (row, id)
pairs are counted with a single sort, and the counted pairs are already in
canonical CSR order (rows ascending, column indices sorted and unique within a
row).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import defaultdict
from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from itertools import islice, repeat

import numpy as np
import scipy.sparse as sp

__all__ = ["Vocabulary", "HashingVocabulary", "vocabulary_from_state", "document_frequency", "remap_csr"]

# Column indices are stored as int32 (scipy's default index type); a vocabulary
# larger than this cannot be represented.
_MAX_FEATURES = np.iinfo(np.int32).max


class Vocabulary:
    """A bijection between tokens and column ids ``0 .. len(self) - 1``.

    Parameters
    ----------
    tokens : iterable of str, optional
        Initial tokens, given ids in iteration order.  Duplicates are an error.

    Notes
    -----
    The token -> id dict is derived state: pickling (and :meth:`to_state`)
    keeps only the token list in id order and rebuilds the dict on load.
    """

    def __init__(self, tokens: Iterable[str] = ()):
        self._tokens: list[str] = list(tokens)
        self._index = _lookup(self._tokens)
        if len(self._index) != len(self._tokens):
            raise ValueError("duplicate tokens in vocabulary")

    # -- mapping ---------------------------------------------------------

    def __len__(self) -> int:
        return len(self._tokens)

    def __contains__(self, token) -> bool:
        return token in self._index

    def __repr__(self) -> str:
        return f"Vocabulary(<{len(self)} tokens>)"

    def __eq__(self, other) -> bool:
        if not isinstance(other, Vocabulary):
            return NotImplemented
        return self._tokens == other._tokens

    __hash__ = None  # mutable

    def index(self, token) -> int | None:
        """Column id of `token`, or None if it is not in the vocabulary."""
        return self._index.get(token)

    def tokens(self) -> list[str]:
        """All tokens, in id order (a copy)."""
        return list(self._tokens)

    def ids(self, tokens: Iterable[str], *, grow: bool = False) -> np.ndarray:
        """Column ids of `tokens` (int64; -1 for unknown ones unless `grow`).

        With ``grow`` new tokens are appended in order of first appearance, so
        merging shard vocabularies in shard order gives the ids one pass over
        all the messages would (:mod:`spamnb.scale.parallel`).
        """
        if not grow:
            get = self._index.get
            return np.fromiter((get(t, -1) for t in tokens), dtype=np.int64)
        with self._growing() as lookup:
            return np.fromiter(map(lookup, tokens), dtype=np.int64)

    @contextmanager
    def _growing(self):
        """A token -> id function that gives an unseen token the next free id.

        The lookup is the dict's own ``__getitem__`` (mapped over a document in
        C): while growing, a missing key calls ``default_factory``, the dict's
        ``__len__``, before it is inserted, so a new token gets ``len(index)``
        and dict order stays id order. No Python bytecode runs per token (``map``,
        ``__getitem__`` and ``__len__`` are all C), where a ``setdefault`` list
        comprehension would run its loop and a ``len`` call in Python for each.

        The new tokens are the dict's last ``len(index) - len(self._tokens)``
        keys, in id order: they are read from its end (``reversed``), so closing
        costs the new tokens, never the vocabulary (an online step adds a few
        tokens to a vocabulary of hundreds of thousands).
        """
        index = self._index
        index.default_factory = index.__len__
        try:
            yield index.__getitem__
        finally:
            index.default_factory = None  # a plain dict again: missing keys raise
            # Keep the id -> token list in step with the dict, even if a
            # document raised midway (its new tokens stay, harmlessly).
            n_new = len(index) - len(self._tokens)
            if n_new:
                self._tokens.extend(_last_keys(index, n_new))

    def describe(self, ids, doc_tokens: Iterable[str] = ()) -> list[str]:
        """Display names of column ids: here simply their tokens."""
        return [self._tokens[i] for i in ids]

    # -- persistence -----------------------------------------------------

    def to_state(self) -> dict | list[str]:
        """Compact picklable state: the tokens in id order, as one newline-joined string.

        One string instead of a list of every token: joblib pickles in pure Python,
        object by object, so a list of a real vocabulary's size would take most of a
        model save; one string is one object, and ``str.split`` gets the list back at
        C speed. The plain list is kept for a vocabulary holding a token with a newline.
        """
        joined = "\n".join(self._tokens)
        if self._tokens and joined.count("\n") != len(self._tokens) - 1:
            return list(self._tokens)
        return {"tokens": joined, "n": len(self._tokens)}

    @classmethod
    def from_state(cls, state: dict | Sequence[str]) -> "Vocabulary":
        """Inverse of :meth:`to_state`."""
        if isinstance(state, dict):
            tokens = state["tokens"].split("\n") if state["n"] else []
            if len(tokens) != state["n"]:
                raise ValueError(f"vocabulary state lists {len(tokens)} tokens, not {state['n']}")
            return cls(tokens)
        return cls(state)

    def __reduce__(self):
        # Pickle only the token list; the dict is rebuilt by __init__.
        return (type(self), (self._tokens,))

    # -- counting --------------------------------------------------------

    def transform(
        self,
        docs: Iterable[Iterable[str]],
        *,
        grow: bool = False,
        binary: bool = False,
        dtype=np.float64,
    ) -> tuple[sp.csr_matrix, np.ndarray]:
        """Count the tokens of each document.

        Parameters
        ----------
        docs : iterable of iterables of str
            One token sequence (or generator) per document.
        grow : bool, default False
            Give tokens not yet in the vocabulary new ids (appended in order of
            first appearance).  When False they are ignored and only counted
            in `n_unknown`.
        binary : bool, default False
            Output presence (1) instead of counts, for Bernoulli features.
        dtype : numpy dtype, default float64
            dtype of the matrix data.

        Returns
        -------
        X : csr_matrix of shape (n_docs, len(self))
            Canonical format (sorted, unique int32 column indices per row).
            The shape uses the vocabulary size *after* any growth.
        n_unknown : ndarray of shape (n_docs,), int64
            Token occurrences per document that were not in the vocabulary
            (always zeros when ``grow=True``).
        """
        # One lookup per token occurrence, even for presence features: removing a
        # message's repeats first (dict.fromkeys) was slower, 0.57-0.63 vs 0.51-0.59 CPU s
        # on the shipped corpus, as 1.38M of its 2.36M tokens are a message's first of
        # their kind (docs/tokenizer-speed.md).
        ids = array("q")  # flat column ids of all tokens, -1 for unknown
        ends = array("q")  # ids[ends[i-1]:ends[i]] are the tokens of doc i
        if grow:
            with self._growing() as lookup:
                for doc in docs:
                    ids.extend(map(lookup, doc))
                    ends.append(len(ids))
        else:
            get = self._index.get
            for doc in docs:
                ids.extend(map(get, doc, repeat(-1)))
                ends.append(len(ids))
        n_features = len(self._tokens)
        if n_features > _MAX_FEATURES:
            raise OverflowError(f"vocabulary of {n_features} tokens exceeds int32 column ids")
        return _count_csr(
            np.frombuffer(ids, dtype=np.int64),
            np.frombuffer(ends, dtype=np.int64),
            n_features,
            binary=binary,
            dtype=dtype,
        )

    def fit_transform(self, docs: Iterable[Iterable[str]], *, binary: bool = False,
                      dtype=np.float64) -> sp.csr_matrix:
        """:meth:`transform` with ``grow=True``; returns only the matrix."""
        X, _ = self.transform(docs, grow=True, binary=binary, dtype=dtype)
        return X

    # -- pruning ---------------------------------------------------------

    def prune(
        self,
        doc_freq: np.ndarray | None,
        *,
        min_df: int = 1,
        max_features: int | None = None,
        counts: np.ndarray | None = None,
    ) -> np.ndarray:
        """Drop rare tokens and renumber the survivors.

        First tokens with document frequency ``doc_freq >= min_df`` are kept;
        then, if `max_features` is given, only the `max_features` most
        frequent of those.  "Frequent" means by `counts` (e.g. total
        occurrences over all classes) when given, else by `doc_freq`; ties
        are broken by the smaller id, so the result is deterministic.

        Parameters
        ----------
        doc_freq : ndarray of shape (len(self),) or None
            Number of documents each token occurs in (see
            :func:`document_frequency`).  May be None only when
            ``min_df <= 1`` and `counts` ranks the tokens (or no
            `max_features`).
        min_df : int, default 1
        max_features : int or None, default None
        counts : ndarray of shape (len(self),), optional
            Ranking for `max_features`.

        Returns
        -------
        keep : ndarray of int64
            Old ids of the surviving tokens, ascending; the token with old id
            ``keep[k]`` now has id ``k``.  Apply the same selection to any
            per-feature arrays (``estimator.select_features(keep)``) and to
            matrices (:func:`remap_csr`).
        """
        n = len(self)
        doc_freq = _per_feature(doc_freq, n, "doc_freq")
        counts = _per_feature(counts, n, "counts")
        if min_df < 0 or (max_features is not None and max_features < 0):
            raise ValueError("min_df and max_features must be >= 0")
        if doc_freq is None and (min_df > 1 or (max_features is not None and counts is None)):
            raise ValueError("doc_freq is required for min_df > 1 or ranking by doc_freq")

        keep = np.arange(n, dtype=np.int64)
        if doc_freq is not None and min_df > 1:
            keep = np.flatnonzero(doc_freq >= min_df)
        if max_features is not None and keep.size > max_features:
            rank = (counts if counts is not None else doc_freq)[keep]
            # Stable sort on -frequency: equal frequencies stay in id order.
            top = np.argsort(-rank, kind="stable")[:max_features]
            keep = np.sort(keep[top])

        self.select(keep)
        return keep

    def select(self, keep) -> None:
        """Keep the tokens with old ids ``keep`` (ascending), renumbered 0..len(keep)-1."""
        self._tokens = [self._tokens[i] for i in np.asarray(keep).tolist()]
        self._index = _lookup(self._tokens)

    def shrink(self, src, dst, n: int) -> None:
        """Keep ``n`` tokens: the one with id ``src[i]`` moves to id ``dst[i]``, the ids
        in ``dst`` and those from ``n`` on not in ``src`` are removed (what
        ``estimator.drop_features`` returns). O(removed), not O(len(self)): dict
        order stays what :meth:`_growing` needs (new tokens at its end)."""
        tokens, index = self._tokens, self._index
        src, dst = np.asarray(src).tolist(), np.asarray(dst).tolist()
        moved = set(src)
        for i in dst + [i for i in range(n, len(tokens)) if i not in moved]:
            del index[tokens[i]]
        for i, j in zip(src, dst):
            tokens[j] = tokens[i]
            index[tokens[j]] = j
        del tokens[n:]


class HashingVocabulary:
    """Tokens mapped to a fixed number of columns by a stable hash (the hashing trick).

    column(t) = BLAKE2b-64(UTF-8 bytes of t) mod n_features

    The mapping needs no state, so memory no longer grows with the vocabulary
    (only the model's (K, n_features) counts) and every process, on every
    machine, maps a token to the same column without a shared dictionary.
    The price: tokens that share a column are one feature (their counts add
    up); with n_features much larger than the vocabulary few informative
    tokens collide (docs/scale.md has the measured cost).

    Same interface as :class:`Vocabulary` for counting (:meth:`transform`,
    :meth:`ids`, ``len``); every token is "known", so ``n_unknown`` is always
    zero, and there is nothing to prune. Column names are not stored:
    :meth:`describe` names a column by the tokens of the message at hand that
    hash to it.
    """

    def __init__(self, n_features: int):
        if isinstance(n_features, bool) or int(n_features) != n_features or not 1 <= n_features <= _MAX_FEATURES:
            raise ValueError(f"n_features must be an integer in [1, {_MAX_FEATURES}], got {n_features!r}")
        self.n_features = int(n_features)

    def __len__(self) -> int:
        return self.n_features

    def __contains__(self, token) -> bool:
        return True

    def __repr__(self) -> str:
        return f"HashingVocabulary({self.n_features})"

    def __eq__(self, other) -> bool:
        if not isinstance(other, HashingVocabulary):
            return NotImplemented
        return self.n_features == other.n_features

    __hash__ = None

    def column(self, token: str) -> int:
        """The column of one token (stable across processes, machines and versions)."""
        digest = hashlib.blake2b(token.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        return int.from_bytes(digest, "little") % self.n_features

    def index(self, token) -> int:
        return self.column(token)

    def ids(self, tokens: Iterable[str], *, grow: bool = False) -> np.ndarray:
        """Columns of `tokens` (int64), each distinct token hashed once."""
        cache: dict[str, int] = {}
        column = self.column
        return np.fromiter((cache[t] if t in cache else cache.setdefault(t, column(t)) for t in tokens),
                           dtype=np.int64)

    def tokens(self) -> list[str]:
        """Placeholder names ``#hash:J`` for every column (no token list is kept)."""
        return [f"#hash:{j}" for j in range(self.n_features)]

    def describe(self, ids, doc_tokens: Iterable[str] = ()) -> list[str]:
        """Names of columns: the message's tokens hashing there ("a|b"), else ``#hash:J``."""
        doc_tokens = list(dict.fromkeys(doc_tokens))
        by_col: dict[int, list[str]] = {}
        for t, j in zip(doc_tokens, self.ids(doc_tokens).tolist()):
            by_col.setdefault(j, []).append(t)
        return ["|".join(by_col[j]) if j in by_col else f"#hash:{j}" for j in np.asarray(ids).tolist()]

    def to_state(self) -> dict:
        return {"hashing": self.n_features}

    @classmethod
    def from_state(cls, state) -> "HashingVocabulary":
        return cls(state["hashing"])

    def __reduce__(self):
        return (type(self), (self.n_features,))

    def transform(self, docs: Iterable[Iterable[str]], *, grow: bool = False, binary: bool = False,
                  dtype=np.float64) -> tuple[sp.csr_matrix, np.ndarray]:
        """Count hashed columns per document: as :meth:`Vocabulary.transform`, shape
        (n_docs, n_features); tokens sharing a column add up (binary: present once)."""
        cache: dict[str, int] = {}  # each distinct token hashed once per call
        column = self.column
        ids = array("q")
        ends = array("q")
        for doc in docs:
            ids.extend([cache[t] if t in cache else cache.setdefault(t, column(t)) for t in doc])
            ends.append(len(ids))
        return _count_csr(np.frombuffer(ids, dtype=np.int64), np.frombuffer(ends, dtype=np.int64),
                          self.n_features, binary=binary, dtype=dtype)

    def fit_transform(self, docs, *, binary: bool = False, dtype=np.float64) -> sp.csr_matrix:
        X, _ = self.transform(docs, binary=binary, dtype=dtype)
        return X

    def prune(self, *args, **kwargs):
        raise ValueError("a hashed vocabulary has no tokens to prune (do not combine min_df with hashing)")


def vocabulary_from_state(state):
    """A :class:`Vocabulary` or :class:`HashingVocabulary` from its ``to_state()``."""
    if isinstance(state, dict) and "hashing" in state:
        return HashingVocabulary.from_state(state)
    return Vocabulary.from_state(state)


def _per_feature(a, n: int, name: str) -> np.ndarray | None:
    """Validate an optional per-feature vector of length `n`."""
    if a is None:
        return None
    a = np.asarray(a).ravel()
    if a.shape != (n,):
        raise ValueError(f"{name} has {a.size} entries for a vocabulary of {n} tokens")
    return a


def _last_keys(index: dict, n: int) -> list:
    """The last ``n`` keys of ``index`` in insertion order: O(n), whatever its size."""
    keys = list(islice(reversed(index), n))
    keys.reverse()
    return keys


def _lookup(tokens) -> defaultdict:
    """token -> id for ``tokens`` in id order: a ``defaultdict`` with no
    factory (a plain dict) except while :meth:`Vocabulary._growing`."""
    return defaultdict(None, zip(tokens, range(len(tokens))))


def _count_csr(ids: np.ndarray, ends: np.ndarray, n_features: int, *,
               binary: bool, dtype) -> tuple[sp.csr_matrix, np.ndarray]:
    """Build canonical CSR counts from flat token ids and document ends.

    ``ids`` holds the column id of every token occurrence (-1 = unknown),
    ``ends[i]`` the end offset of document i in ``ids``.
    """
    n_docs = ends.size
    lengths = np.diff(ends, prepend=0)
    rows = np.repeat(np.arange(n_docs, dtype=np.int64), lengths)
    known = ids >= 0
    n_unknown = np.bincount(rows[~known], minlength=n_docs).astype(np.int64)

    # One key per occurrence, key = row * n_features + column; sorting the
    # keys orders by row, then column, which is exactly CSR canonical order.
    keys = rows[known] * max(n_features, 1) + ids[known]
    keys.sort()
    # Runs of equal keys are one (row, column) entry; the run length is its count.
    starts = np.flatnonzero(np.diff(keys, prepend=-1))
    unique = keys[starts]
    data = np.diff(starts, append=keys.size)
    row_of = unique // max(n_features, 1)
    indices = (unique - row_of * max(n_features, 1)).astype(np.int32)
    indptr = np.zeros(n_docs + 1, dtype=np.int32 if unique.size <= _MAX_FEATURES else np.int64)
    np.cumsum(np.bincount(row_of, minlength=n_docs), out=indptr[1:])

    data = np.ones(unique.size, dtype=dtype) if binary else data.astype(dtype)
    X = sp.csr_matrix((data, indices, indptr), shape=(n_docs, n_features))
    # Sorted and duplicate-free by construction; tell scipy so it never re-checks.
    X.has_sorted_indices = True
    X.has_canonical_format = True
    return X, n_unknown


def document_frequency(X: sp.spmatrix) -> np.ndarray:
    """Number of rows in which each column is non-zero.

    Parameters
    ----------
    X : sparse matrix of shape (n_docs, n_features), canonical CSR preferred

    Returns
    -------
    df : ndarray of shape (n_features,), int64
    """
    X = sp.csr_matrix(X)
    if not X.has_canonical_format:
        X = X.copy()
        X.sum_duplicates()
    # df_j = |{i : X_ij != 0}|: count explicit non-zeros per column index.
    nonzero = X.indices[X.data != 0]
    return np.bincount(nonzero, minlength=X.shape[1]).astype(np.int64)


def remap_csr(X: sp.spmatrix, keep: np.ndarray, n_old: int) -> sp.csr_matrix:
    """Keep only columns `keep` of `X` (renumbered ``0 .. len(keep) - 1``).

    Parameters
    ----------
    X : sparse matrix of shape (n_docs, n_old)
    keep : ndarray of int, strictly ascending, values in ``[0, n_old)``
        As returned by :meth:`Vocabulary.prune`.
    n_old : int
        Number of columns before pruning (must equal ``X.shape[1]``).

    Returns
    -------
    csr_matrix of shape (n_docs, len(keep)), canonical if `X` was.
    """
    X = sp.csr_matrix(X)
    keep = np.asarray(keep, dtype=np.int64)
    if X.shape[1] != n_old:
        raise ValueError(f"X has {X.shape[1]} columns, expected {n_old}")
    if keep.size and (keep[0] < 0 or keep[-1] >= n_old or np.any(np.diff(keep) <= 0)):
        raise ValueError("keep must be strictly ascending ids in [0, n_old)")
    # new_id[old] = position of old in keep, or -1 if dropped; because keep is
    # ascending the mapping is monotone, so sorted rows stay sorted.
    new_id = np.full(n_old, -1, dtype=np.int64)
    new_id[keep] = np.arange(keep.size)
    mapped = new_id[X.indices]
    kept = mapped >= 0
    rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
    indptr = np.zeros(X.shape[0] + 1, dtype=X.indptr.dtype)
    np.cumsum(np.bincount(rows[kept], minlength=X.shape[0]), out=indptr[1:])
    Y = sp.csr_matrix((X.data[kept], mapped[kept].astype(np.int32), indptr),
                      shape=(X.shape[0], keep.size))
    if X.has_canonical_format:
        Y.has_sorted_indices = True
        Y.has_canonical_format = True
    return Y
