"""Array kernels of the naive Bayes estimators (:mod:`spamnb.nb.naive_bayes`).

Pure functions over numpy arrays and scipy CSR matrices, holding no estimator
state: input validation and conversion to CSR, views and row chunks that share
X's buffers, binarised chunks, row and column sums, products with a weight
matrix, and the log-space helpers of docs/naive-bayes.md §2-§3 (log 0 = -inf
without a numpy warning, finite parts split from -inf entries, log-sum-exp
normalisation).

They never densify X, so memory stays proportional to its nonzeros, and the
one-row and few-nonzero paths avoid building scipy matrices, whose constructors
cost more than the arithmetic for a single message (the online protocol's step).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = [
    "CHUNK_NNZ",
    "GATHER_NNZ",
    "binary_chunks",
    "check_finite_data",
    "check_result_finite",
    "check_not_empty",
    "check_sample_weight",
    "column_sums",
    "csr_view",
    "dense_2d",
    "finite_log",
    "is_narrow",
    "log_normalize",
    "pattern",
    "product",
    "quiet_log",
    "readonly",
    "row_chunks",
    "row_sums",
    "split_inf",
    "sum_rows",
    "to_csr",
]

# Row chunks for the binarised (Bernoulli) products: bounds temporary memory.
CHUNK_NNZ = 1 << 21
# Batches with fewer nonzeros than this are scored by gathering weight rows
# (no sparse matrix is built: scipy's constructors cost more than the arithmetic)
GATHER_NNZ = 1 << 14


# --------------------------------------------------------------------------- log space


def quiet_log(a):
    """Natural log with log(0) = -inf and no warning."""
    a = np.asarray(a)
    if a.size and a.min() > 0:  # the common case, without the (slower) errstate context
        return np.log(a)
    with np.errstate(divide="ignore"):
        return np.log(a)


def finite_log(a):
    """log(a) where a > 0, and 0 where a <= 0 (terms the caller handles apart)."""
    out = np.zeros(np.shape(a))
    np.log(a, out=out, where=a > 0)
    return out


def split_inf(W):
    """Split weights into finite part (inf -> 0) and indicator of -inf entries."""
    Z = np.isneginf(W)
    if not Z.any():
        return W, None
    return np.where(Z, 0.0, W), Z


def log_normalize(jll, log_prior):
    """Row-wise log posteriors via log-sum-exp (in place on jll).

    Rows where every class is ruled out (all -inf) fall back to the prior.
    """
    m = jll.max(axis=1)
    dead = ~np.isfinite(m)
    if dead.any():
        jll[dead] = log_prior
        m[dead] = np.max(log_prior)
    jll -= m[:, None]
    # log P(c|x) = jll_c − log Σ_k exp(jll_k)   (log-sum-exp, shifted by the max);
    # the max term is exp(0) = 1, so log Σ = log1p(Σ of the others): full precision
    # when one class is nearly certain (log P of the winner ≈ −1e-11, not rounded to 1e-16)
    e = np.exp(jll)
    e[np.arange(jll.shape[0]), np.argmax(jll, axis=1)] = 0.0
    jll -= np.log1p(e.sum(axis=1))[:, None]
    return jll


# --------------------------------------------------------------------------- validation


def check_finite_data(data, what="X"):
    """Raise ValueError if the array ``data`` holds NaN or infinity (scikit-learn's words)."""
    # fast path: the sum is finite iff no NaN/inf (unless it overflows)
    if data.size and not np.isfinite(data.sum()):
        if np.isnan(data).any():
            raise ValueError(f"Input {what} contains NaN.")
        if not np.isfinite(data).all():
            raise ValueError(f"Input {what} contains infinity or a value too large for {data.dtype!r}.")


def check_result_finite(result, X):
    """Cheap NaN/inf check of X through a product's result (n×K or K×d).

    NaN or inf in X make the result non-finite; only then is X itself scanned.
    """
    if not np.isfinite(result).all():
        check_finite_data(X.data)
        raise ValueError("X values are too large: the products overflow")


def check_sample_weight(sample_weight, n):
    """Validate per-sample weights for n samples: None, one number for all, or a finite,
    non-negative (n,) array, not all zero."""
    if sample_weight is None:
        return None
    w = np.asarray(sample_weight, dtype=np.float64)
    if w.ndim == 0:
        w = np.full(n, float(w))
    if w.ndim != 1 or w.shape[0] != n:
        raise ValueError(f"sample_weight has shape {w.shape}, expected ({n},)")
    if not np.all(np.isfinite(w)) or (w < 0).any():
        raise ValueError("sample_weight must be finite and non-negative")
    if n and not w.any():
        raise ValueError("Sample weights must contain at least one non-zero number: all are zero")
    return w


def dense_2d(X):
    """X as a 2-D numeric numpy array, or a ValueError in scikit-learn's words.

    Booleans, integers and floats are kept as they are; an object array (numbers
    stored as Python objects) is converted to float64, which raises TypeError for
    an element that is not a number. Complex values are refused.
    """
    X = np.asarray(X)
    if X.dtype.kind == "O":
        X = X.astype(np.float64)
    if X.dtype.kind == "c":
        raise ValueError("Complex data not supported")
    if X.dtype.kind not in "biuf":
        raise ValueError(f"X must be numeric, got dtype {X.dtype}")
    if X.ndim != 2:
        if X.ndim > 2:
            raise ValueError(f"Found array with dim {X.ndim}: X must be 2-D (n_samples, n_features)")
        got = "a scalar" if X.ndim == 0 else f"a 1D array of shape {X.shape}"
        raise ValueError(
            f"Expected a 2D array (n_samples, n_features), got {got}. Reshape your data: "
            "X.reshape(-1, 1) for a single feature, X.reshape(1, -1) for a single sample."
        )
    return X


def check_not_empty(shape, who):
    """ValueError if a 2-D ``shape`` has no sample or no feature (learning needs both)."""
    for axis, what in enumerate(("sample", "feature")):
        if len(shape) == 2 and shape[axis] == 0:
            raise ValueError(f"Found array with 0 {what}(s) (shape={tuple(shape)}) while a minimum of 1 is "
                             f"required by {who}.")


def to_csr(X, *, check_finite=True):
    """Validate X and return it as a CSR matrix (never densifying sparse input).

    With ``check_finite=False`` the caller checks a product instead
    (:func:`check_result_finite`), saving a pass over the nonzeros.
    """
    if sp.issparse(X):
        X = X.tocsr()
        if not isinstance(X, sp.csr_matrix):
            X = sp.csr_matrix(X)  # sparse array -> matrix, shares the buffers
    else:
        X = sp.csr_matrix(dense_2d(X))
    if X.dtype.kind == "c":
        raise ValueError("Complex data not supported")
    if X.dtype.kind not in "biuf":
        raise ValueError(f"X must be numeric, got dtype {X.dtype}")
    if X.dtype.kind == "b":
        X = X.astype(np.float64)
    if check_finite:
        check_finite_data(X.data)
    return X


# --------------------------------------------------------------------------- CSR views and chunks


def csr_view(X, data, r0, r1, *, transpose=False):
    """Rows r0:r1 of CSR X with the given data, sharing X's indices (no copy).

    With ``transpose`` the same buffers are returned as the CSC transpose.
    """
    s, e = X.indptr[r0], X.indptr[r1]
    shape = (r1 - r0, X.shape[1])
    # attributes assigned directly: the constructors copy small views of big arrays
    out = sp.csc_matrix(shape[::-1]) if transpose else sp.csr_matrix(shape)
    out.indptr = X.indptr[r0 : r1 + 1] - s
    out.indices = X.indices[s:e]
    out.data = data
    return out


def pattern(X):
    """CSR with 1.0 where X has a nonzero entry (shares indices)."""
    return csr_view(X, np.not_equal(X.data, 0).astype(np.float64), 0, X.shape[0])


def readonly(a):
    """A read-only view of a (the state stays writable through a itself)."""
    v = a.view()
    v.flags.writeable = False
    return v


def row_chunks(X, max_nnz=CHUNK_NNZ):
    """Yield (r0, r1) row ranges of about max_nnz nonzeros each."""
    n = X.shape[0]
    cuts = np.searchsorted(X.indptr, np.arange(max_nnz, X.nnz, max_nnz))
    edges = np.unique(np.concatenate([[0], np.clip(cuts, 0, n), [n]]))
    for r0, r1 in zip(edges[:-1], edges[1:]):
        yield int(r0), int(r1)


def binary_chunks(X, threshold, max_nnz=CHUNK_NNZ, *, transpose=False):
    """Yield (r0, r1, Xb) with Xb = [X > threshold] for rows r0:r1, without copying X.

    The binary values live in one buffer reused from chunk to chunk: use each
    chunk before asking for the next.
    """
    if threshold is None:
        yield 0, X.shape[0], (X.T if transpose else X)
        return
    # a chunk may overshoot max_nnz by up to one row
    size = min(X.nnz, max_nnz + int(np.diff(X.indptr).max(initial=0)))
    flags, values = np.empty(size, dtype=bool), np.empty(size)
    for r0, r1 in row_chunks(X, max_nnz):
        s, e = X.indptr[r0], X.indptr[r1]
        if e - s > values.size:
            flags, values = np.empty(e - s, dtype=bool), np.empty(e - s)
        b, v = flags[: e - s], values[: e - s]
        np.greater(X.data[s:e], threshold, out=b)
        v[...] = b
        yield r0, r1, csr_view(X, v, r0, r1, transpose=transpose)


# --------------------------------------------------------------------------- sums and products


def is_narrow(X, n_cols):
    """True if X touches few of its columns: then only those are updated."""
    return 4 * X.nnz < n_cols


def column_sums(X, data, Y):
    """(cols, S): the sorted columns CSR X has entries in, and S = Xᵀ Y restricted to
    them (S[j, c] = Σ_i data_ij·Y_ic, with ``data`` in place of X.data): O(nnz·K)."""
    if X.shape[0] == 1 and X.has_canonical_format:  # one message: its columns are unique
        return X.indices, data[:, None] * Y[0]
    cols, inv = np.unique(X.indices, return_inverse=True)
    r = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))  # row of each nonzero
    S = np.empty((cols.size, Y.shape[1]))
    for c in range(Y.shape[1]):
        S[:, c] = np.bincount(inv, weights=data * Y[r, c], minlength=cols.size)
    return cols, S


def sum_rows(G, X):
    """Per-row sums of G (one row per nonzero of CSR X), shape (n, G.shape[1])."""
    if X.shape[0] == 1:
        return G.sum(axis=0, keepdims=True)
    out = np.zeros((X.shape[0],) + G.shape[1:])
    full = np.diff(X.indptr) > 0
    if full.any():
        # reduceat over the starts of the non-empty rows: each sums exactly its row
        out[full] = np.add.reduceat(G, X.indptr[:-1][full], axis=0)
    return out


def row_sums(X):
    """Σ_w x_w for each row of CSR X, shape (n,): O(n + nnz), no dense temporaries."""
    return sum_rows(X.data, X)


def product(X, M, data):
    """X @ M with ``data`` in place of X.data (M: (n_features, K) C-contiguous)."""
    if X.nnz <= GATHER_NNZ:
        return sum_rows(M[X.indices] * data[:, None], X)
    return csr_view(X, data, 0, X.shape[0]) @ M
