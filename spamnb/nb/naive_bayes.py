"""Naive Bayes estimators (docs/naive-bayes.md §2-§6), scikit-learn's names and conventions.

Counts are the state; log-probabilities are derived from them. For the count
models (Multinomial, Bernoulli, Complement) a ``partial_fit`` / ``forget`` of a
batch updates only what depends on the columns it touches, and growing by a
few features is O(new features) amortised, so one classify-then-learn step of
the online protocol costs O(nnz·K), not O(K·|V|) (see :class:`_BaseCountNB`);
full arrays such as ``feature_log_prob_`` are computed when read.
Everything is computed in log space; posteriors are normalised with log-sum-exp.

Models
------
MultinomialNB   word counts                P(w|c) = (n_cw + λ) / (Σ_w' n_cw' + |V|·λ)
BernoulliNB     word presence              P(w present|c) = (m_cw + λ) / (N_c + 2λ)
ComplementNB    Rennie et al. (2003)       weights from the complement classes' counts
CategoricalNB   general discrete features  P(x_j=a|c) = (N_c^(j,a) + λ) / (N_c + S_j·λ)
GaussianNB      continuous features        normal density with a variance floor

Priors (all models): learned P(c_k) = N_k/N (``fit_prior=True``), smoothed
P_λ(c_k) = (N_k + λ_p)/(N + K·λ_p) (``smooth_prior=True``; λ_p is ``prior_alpha``, else λ), uniform 1/K
(``fit_prior=False``) or given (``class_prior=[...]``). With no observation at
all (N = 0) a learned prior falls back to uniform.

λ = 0 (maximum likelihood)
--------------------------
A probability 0 gives log-probability -inf, never NaN: sums are computed from
the finite part of the weights, and a separate sparse product counts the
zero-probability events each sample hits; a hit sets that class's joint
log-likelihood to exactly -inf (posterior exactly 0). A distribution with no
observations and λ = 0 (0/0) assigns probability 0 to everything. If *every*
class is ruled out for a sample, the evidence is ignored for that sample and its
posterior is the class prior (``predict`` then returns the most probable class a
priori). No numpy warnings are emitted for these cases.

Inputs
------
X may be a dense array or any scipy sparse matrix/array; sparse input is
converted to CSR (never densified; memory stays proportional to the nonzeros).
Dense input to the count models is converted to CSR too, so dense and sparse
inputs give bit-identical results. ``partial_fit`` / ``forget`` given X with
more columns than ``n_features_in_`` grow the discrete count models
(Multinomial, Bernoulli, Complement) first (new tokens); fewer columns are
refused. Prediction is strict: X must have exactly ``n_features_in_`` columns
(ValueError otherwise), like scikit-learn - grow the model or pad X explicitly.

scikit-learn
------------
The estimators keep scikit-learn's conventions (:mod:`spamnb.nb.estimator`), so
``clone``, ``Pipeline``, ``GridSearchCV``, ``cross_val_score`` and
``CalibratedClassifierCV`` take them, and they pass its ``check_estimator``, where
:func:`expected_failed_checks` names the checks that cannot apply and why.
``fit`` needs at least one sample and one feature, as scikit-learn's do;
``partial_fit`` and ``forget`` take an empty batch (a model with no message yet).
"""

from __future__ import annotations

import abc
import numbers
import re
import sys

import numpy as np
import scipy.sparse as sp

from spamnb.nb.estimator import Classifier, check_labels, not_fitted
from spamnb.nb.kernels import (
    CHUNK_NNZ,
    GATHER_NNZ,
    binary_chunks,
    check_finite_data,
    check_not_empty,
    check_result_finite,
    check_sample_weight,
    column_sums,
    dense_2d,
    finite_log,
    is_narrow,
    log_normalize,
    pattern,
    product,
    quiet_log,
    readonly,
    row_sums,
    split_inf,
    sum_rows,
    to_csr,
)

__all__ = ["BernoulliNB", "CategoricalNB", "ComplementNB", "GaussianNB", "MultinomialNB", "expected_failed_checks"]


# --------------------------------------------------------------------------- base


class _BaseNB(Classifier, abc.ABC):
    """Shared prior handling, label bookkeeping, learning entry points and prediction.

    A subclass provides (abstract):

    * ``_update(X, y, sample_weight, sign)``: add (sign=+1) or subtract (sign=-1)
      a batch's statistics, set ``n_features_in_`` and ``class_log_prior_``; a
      refused subtraction leaves the model unchanged;
    * ``_check_X_predict(X)``: X validated for prediction;
    * ``_joint_log_likelihood(X)``: log P(c) + log P(x|c), shape (n, K), for what
      ``_check_X_predict`` returned.

    It may override ``_check_params``, ``_reset`` and ``_check_classes`` (the
    steps of fit / partial_fit around ``_update``). It holds the parameters the
    prior reads (``alpha``, ``fit_prior``, ``class_prior``, ``smooth_prior``, ``prior_alpha``),
    and names its learnt state ``x_`` or, if private, in ``_state`` (what ``_reset`` drops).
    """

    # the private attributes learning sets: fit drops them (and every ``x_``) first, and
    # nothing else, since tools set private attributes of their own on an estimator they
    # fit (scikit-learn's Pipeline does, and takes them back after)
    _state: tuple = ()

    @abc.abstractmethod
    def _update(self, X, y, sample_weight, sign):
        """Add (sign=+1) or subtract (sign=-1) a batch; return self."""

    @abc.abstractmethod
    def _check_X_predict(self, X):
        """X validated (and converted) for :meth:`_joint_log_likelihood`."""

    @abc.abstractmethod
    def _joint_log_likelihood(self, X):
        """log P(c) + log P(x|c) for each sample and class, shape (n, K)."""

    def _check_params_prior(self):
        a = self.alpha
        if isinstance(a, bool) or not isinstance(a, numbers.Real) or not np.isfinite(a) or a < 0:
            raise ValueError(f"alpha (λ) must be a finite number >= 0, got {a!r}")

    # -- labels -------------------------------------------------------------
    def _init_classes(self, classes):
        try:  # labels of any one type: numbers, strings, booleans, objects that order
            classes = np.unique(check_labels(classes, type(self).__name__))
        except TypeError as e:
            raise ValueError(f"class labels must be of one type that orders: {e}") from None
        if classes.size == 0:
            raise ValueError("classes must not be empty")
        self.classes_ = classes
        self.class_count_ = np.zeros(classes.size, dtype=np.float64)

    def _label_matrix(self, y, n, sample_weight):
        """One-hot (weighted) label matrix Y of shape (n, K); validates y."""
        y = check_labels(y, type(self).__name__)
        if y.shape[0] != n:
            raise ValueError(f"Found input variables with inconsistent numbers of samples: [{n}, {y.shape[0]}]")
        try:
            idx = np.searchsorted(self.classes_, y)
            idx[idx >= self.classes_.size] = 0
            bad = np.asarray(self.classes_[idx] != y, dtype=bool)
        except TypeError as e:
            raise ValueError(f"y labels are not comparable with classes_ {self.classes_.tolist()}") from e
        if bad.shape != y.shape:
            raise ValueError(f"y labels are not comparable with classes_ {self.classes_.tolist()}")
        if bad.any():
            raise ValueError(
                f"y contains labels not in classes_ {self.classes_.tolist()}: "
                f"{np.unique(y[bad]).tolist()[:10]}"
            )
        w = check_sample_weight(sample_weight, n)
        Y = np.zeros((n, self.classes_.size), dtype=np.float64)
        Y[np.arange(n), idx] = 1.0 if w is None else w
        return Y

    # -- learning -----------------------------------------------------------
    def fit(self, X, y, sample_weight=None):
        """Fit from scratch (forget any previous state). X needs a sample and a feature."""
        self._check_params()
        self._reset()
        y = check_labels(y, type(self).__name__)
        shape = X.shape if sp.issparse(X) else np.shape(dense_2d(X))
        check_not_empty(shape, type(self).__name__)
        self._init_classes(y)
        return self._update(X, y, sample_weight, sign=1)

    def partial_fit(self, X, y, classes=None, sample_weight=None):
        """Add a batch (fit == partial_fit over all batches); ``classes`` is required on the first call.

        The count models first grow to the columns of X beyond ``n_features_in_``
        (new tokens) and cost O(nnz(X)·K) plus O(new columns) amortised, not
        O(K·n_features); CategoricalNB grows S_j to the categories X holds.
        """
        self._check_params()
        if not hasattr(self, "classes_"):
            if classes is None:
                raise ValueError("classes must be passed on the first call to partial_fit")
            self._init_classes(classes)
        elif classes is not None:
            self._check_classes(classes)
        return self._update(X, y, sample_weight, sign=1)

    def forget(self, X, y, sample_weight=None):
        """Subtract a batch: the exact inverse of :meth:`partial_fit` (GaussianNB: up to
        float rounding, bit-exact for integer-valued data).

        Raises ValueError, leaving the model unchanged, if a count would go below
        zero (the batch was not learnt), y holds an unknown class or (CategoricalNB)
        X a category never learnt.
        """
        self._check_fitted()
        return self._update(X, y, sample_weight, sign=-1)

    def _check_params(self):
        """Validate the parameters before fit / partial_fit change anything: λ here;
        override for more parameters, or to check them in ``_update`` instead."""
        self._check_params_prior()

    def _reset(self):
        """Drop the learnt state before a fit: every attribute named x_, and ``_state``."""
        for attr in [a for a in vars(self) if a.endswith("_") and not a.startswith("__") or a in self._state]:
            del self.__dict__[attr]

    def _check_classes(self, classes):
        """``classes`` passed again after the first partial_fit: accepted unread here;
        override to refuse a different set (the count models do)."""

    @staticmethod
    def _clip_negative(new, old, what):
        # exact for integral weights; tolerate float rounding of fractional ones
        tol = 1e-9 * max(1.0, float(np.max(np.abs(old), initial=0.0)))
        if (new < -tol).any():
            raise ValueError(
                f"forget would make a {what} count negative: the batch was not learnt by this model"
            )
        return np.where(new < 0, 0.0, new) if (new < 0).any() else new

    # -- prior --------------------------------------------------------------
    def _class_log_prior(self):
        K = self.classes_.size
        if self.class_prior is not None:
            p = np.asarray(self.class_prior, dtype=np.float64)
            if p.shape != (K,):
                raise ValueError(f"class_prior has {p.size} entries but there are {K} classes")
            if not np.all(np.isfinite(p)) or (p < 0).any() or not np.isclose(p.sum(), 1.0):
                raise ValueError("class_prior must be non-negative and sum to 1")
            return quiet_log(p)  # given P(c_k)
        if not self.fit_prior:
            return np.full(K, -np.log(K))  # uniform P(c_k) = 1/K
        N_k = self.class_count_
        N = N_k.sum()
        if self.smooth_prior:
            # λ_p: its own smoothing (prior_alpha; 1 is Laplace's rule of succession), else the counts' λ
            lam = float(self.alpha if self.prior_alpha is None else self.prior_alpha)
            if N + K * lam > 0:
                return quiet_log(N_k + lam) - np.log(N + K * lam)  # P_λ(c_k) = (N_k + λ)/(N + K·λ)
        elif N > 0:
            return quiet_log(N_k) - np.log(N)  # P(c_k) = N_k / N
        return np.full(K, -np.log(K))  # no observations: uniform

    # -- prediction ---------------------------------------------------------
    def _check_fitted(self):
        if not hasattr(self, "class_log_prior_"):
            raise not_fitted(self)

    def __sklearn_is_fitted__(self):
        return hasattr(self, "class_log_prior_")

    def _check_n_features(self, d):
        """ValueError unless X has ``d`` == ``n_features_in_`` columns."""
        if d != self.n_features_in_:
            hint = ""
            if d > self.n_features_in_ and hasattr(self, "grow_features"):
                hint = " (new features: grow the model with grow_features or partial_fit first)"
            raise ValueError(
                f"X has {d} features, but {type(self).__name__} is expecting "
                f"{self.n_features_in_} features as input{hint}"
            )

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        # sparse input is converted to CSR, never densified
        tags.input_tags.sparse = True
        return tags

    def predict_joint_log_proba(self, X):
        """Unnormalised log P(c) + log P(x|c) for each class, shape (n, K)."""
        self._check_fitted()
        return self._joint_log_likelihood(self._check_X_predict(X))

    def predict_log_proba(self, X):
        """Log posteriors log P(c|x), normalised with log-sum-exp.

        A sample that every class rules out (possible only with λ = 0) gets the
        class prior as its posterior.
        """
        jll = self.predict_joint_log_proba(X)
        return log_normalize(jll, self.class_log_prior_)

    def predict_proba(self, X):
        """Posteriors P(c|x), shape (n, K); rows sum to 1."""
        return np.exp(self.predict_log_proba(X))

    def predict(self, X):
        """Class of maximum posterior (prior for samples every class rules out)."""
        jll = self.predict_joint_log_proba(X)
        dead = ~np.isfinite(jll.max(axis=1))
        if dead.any():
            jll[dead] = self.class_log_prior_
        return self.classes_[np.argmax(jll, axis=1)]


# --------------------------------------------------------------------------- count models


class _BaseCountNB(_BaseNB):
    """Counts (class_count_, feature_count_) are the state of the discrete models.

    Online learning (TREC: classify each message, then learn it) must cost per
    step in proportion to the message's tokens, not to the vocabulary |V|:

    * per-feature arrays (counts ``_fc``, scoring weights ``_Wt``, zero-probability
      indicators ``_Dt``) are stored feature-major, shape (capacity, K), with
      spare capacity that doubles when full, so growing by a few columns is
      O(new columns) amortised; rows >= ``n_features_in_`` are always zero.
      ``feature_count_`` is a read-only (K, |V|) view of the used rows;
    * a batch X changes the counts, and the weights, only in the columns it
      touches (np.unique(X.indices)); per-class terms are O(K) and derived on
      demand; a 1-row X is scored as X @ W with W (|V|, K) C-contiguous;
    * full derived arrays (``feature_log_prob_``) are computed when read, cached
      until the next change.

    ``_update`` and ``_check_X_predict`` are written here. A subclass provides
    ``_joint_log_likelihood`` and (abstract):

    * ``_class_terms()``: the per-class part of the score, cached by ``_terms()``
      for ``_joint_log_likelihood``, O(K) (Bernoulli: O(K·max N_c));
    * ``_feature_log_prob()``: the full (K, |V|) array behind ``feature_log_prob_``;

    and ``_column_weights(fc, out)`` unless ``_has_weights`` is False (Bernoulli,
    whose weights all depend on N_c). Hooks with defaults: ``_weights_need_all``
    (Complement with norm), ``_check_X`` / ``_in_shape`` / ``_values`` / ``_count``
    (X read other than as counts: Bernoulli binarises), ``_rebuild_summaries`` /
    ``_on_grow`` / ``_on_counts`` (a summary of the counts kept in step:
    Bernoulli's histogram).
    """

    _state = ("_cc", "_fc", "_Wt", "_Dt", "_T", "_derived_for", "_derived", "_hist")
    _has_weights = True  # per-feature scoring weights are stored (not Bernoulli's)
    _positive_only = True  # X holds counts (Bernoulli: anything, compared with binarize)
    _derived_from_counts = ("terms", "flp")  # what _changed drops from _memo()

    def __init__(self, *, alpha=1.0, fit_prior=True, class_prior=None, smooth_prior=False, prior_alpha=None):
        self.alpha = alpha
        self.fit_prior = fit_prior
        self.class_prior = class_prior
        self.smooth_prior = smooth_prior
        self.prior_alpha = prior_alpha

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.positive_only = self._positive_only
        # scikit-learn's classifier check scores on blobs of continuous features, which
        # counts of words do not model (its own discrete naive Bayes models say the same)
        tags.classifier_tags.poor_score = True
        return tags

    # -- state --------------------------------------------------------------
    @property
    def class_count_(self):
        """N_c: samples (total sample weight) per class, shape (K,); read-only."""
        return readonly(self._cc)

    @class_count_.setter
    def class_count_(self, value):
        self._cc = np.array(value, dtype=np.float64)
        self._derived_for = None  # everything derived is recomputed on next use

    @property
    def feature_count_(self):
        """n_cw (Bernoulli: m_cw), shape (K, n_features_in_); a read-only view of the state."""
        return readonly(self._fc[: self.n_features_in_].T)

    @feature_count_.setter
    def feature_count_(self, value):
        fc = np.asarray(value, dtype=np.float64)
        if fc.ndim != 2 or fc.shape[0] != self.classes_.size:
            raise ValueError(f"feature_count_ must have shape (n_classes, n_features), got {fc.shape}")
        self._fc = np.ascontiguousarray(fc.T).copy()
        self._Wt = self._Dt = None
        self.n_features_in_ = fc.shape[1]
        self._derived_for = None

    def set_counts(self, class_count, feature_count):
        """Install stored counts (N_c, shape (K,); n_cw, shape (K, n_features)) and derive
        everything from them. ``classes_`` must be known (fit / partial_fit first)."""
        if not hasattr(self, "classes_"):
            raise ValueError("set_counts needs classes_: call partial_fit with classes first")
        cc = np.asarray(class_count, dtype=np.float64)
        fc = np.asarray(feature_count, dtype=np.float64)
        K = self.classes_.size
        if cc.shape != (K,) or fc.ndim != 2 or fc.shape[0] != K:
            raise ValueError(f"counts have shapes {cc.shape}, {fc.shape}; expected ({K},), ({K}, n_features)")
        for a, what in ((cc, "class"), (fc, "feature")):
            if not np.isfinite(a).all() or (a < 0).any():
                raise ValueError(f"{what} counts must be finite and non-negative")
        self.class_count_ = cc
        self.feature_count_ = fc
        self._update_derived()
        return self

    def _params(self):
        """Parameters the stored derived state depends on (a change forces a recompute)."""
        return float(self.alpha), getattr(self, "norm", None)

    def _ensure_derived(self):
        if not hasattr(self, "_fc"):  # first batch: empty state
            K = self.classes_.size
            self._fc = np.zeros((0, K))
            self.n_features_in_ = 0
            self._Wt = self._Dt = None
            self._derived_for = None
        if self._derived_for != self._params():
            self._update_derived()

    def _update_derived(self):
        """Recompute every derived quantity from the counts: O(K·|V|)."""
        V = self.n_features_in_
        self._T = self._fc[:V].sum(axis=0)  # Σ_w n_cw per class
        self._Wt = np.zeros_like(self._fc) if self._has_weights else None
        self._Dt = None
        self._derived_for = self._params()
        self._rebuild_summaries()
        self._changed(slice(0, V))

    def _rebuild_summaries(self):
        """Rebuild summaries of the counts from ``_fc``; override to keep one (Bernoulli's histogram)."""

    def _reserve(self, d):
        """Capacity for d features: double when full (O(1) amortised per new column)."""
        cap = self._fc.shape[0]
        if d <= cap:
            return
        new_cap = max(d, 2 * cap)
        V = self.n_features_in_
        for name in ("_fc", "_Wt", "_Dt"):
            old = getattr(self, name)
            if old is not None:
                new = np.zeros((new_cap, old.shape[1]))
                new[:V] = old[:V]
                setattr(self, name, new)

    def _grow_to(self, d, refresh=True, fill=True):
        """Use d > n_features_in_ features (capacity reserved): new columns have zero counts.

        ``fill=False``: the caller sets every new column's weights itself;
        ``refresh=False``: the caller calls :meth:`_changed` itself.
        """
        V = self.n_features_in_
        self.n_features_in_ = d
        self._on_grow(V, d)
        if fill and self._has_weights and not self._weights_need_all():
            # every new column has zero counts: one row of weights, broadcast
            W = np.empty((1, self.classes_.size))
            Z = self._column_weights(np.zeros((1, self.classes_.size)), W)
            self._Wt[V:d] = W
            self._store_indicator(slice(V, d), Z)
        if refresh:
            self._changed(None)

    def _on_grow(self, V, d):
        """Features V..d-1 were added (d < V: V-d were removed), with zero counts; override to
        keep a summary in step."""

    def _on_counts(self, rows, old, new):
        """Counts of the given rows (features) change from old to new; override to keep a
        summary in step."""

    # -- input --------------------------------------------------------------
    def _check_X(self, X):
        """X validated for learning, as ``_in_shape`` / ``_values`` / ``_count`` take it;
        override to read X otherwise (with those three)."""
        X = to_csr(X, check_finite=False)  # checked through the counts
        if X.data.size and X.data.min() < 0:
            raise ValueError(f"Negative values in data passed to {type(self).__name__} (X)")
        return X

    def _check_X_predict(self, X):
        """X validated for prediction (CSR); override with ``_check_X``."""
        self._ensure_derived()
        X = to_csr(X, check_finite=False)  # checked through the product with the finite weights
        self._check_n_features(X.shape[1])
        return X

    @staticmethod
    def _in_shape(X):
        """(samples, columns) of what ``_check_X`` returned; override with it."""
        return X.shape

    @staticmethod
    def _values(X):
        """(CSR X, the values counted for its nonzeros); override with ``_check_X``."""
        return X, X.data

    def _count(self, X, Y):
        """Per-class feature counts of a wide batch, shape (n_features of X, K); override
        with ``_check_X``."""
        # n_cw = Σ_{i in c} x_iw, as Xᵀ Y: one pass over the nonzeros, no densifying
        counts = X.T @ Y
        check_result_finite(counts, X)
        return counts

    # -- state changes ------------------------------------------------------
    def _check_classes(self, classes):
        """A set of classes other than the first call's is refused."""
        if not np.array_equal(np.unique(classes), self.classes_):
            raise ValueError(f"classes {list(classes)} differ from classes_ {self.classes_.tolist()}")

    def _update(self, X, y, sample_weight, sign):
        self._ensure_derived()
        Xt = self._check_X(X)
        n, n_cols = self._in_shape(Xt)
        if n_cols < self.n_features_in_:  # more columns are new features; fewer, a mistake
            self._check_n_features(n_cols)
        Y = self._label_matrix(y, n, sample_weight)
        X, data = self._values(Xt)
        if is_narrow(X, n_cols):  # only the columns X touches change
            rows, counts = column_sums(X, data, Y)
            check_result_finite(counts, X)
        else:
            rows, counts = slice(0, n_cols), self._count(Xt, Y)  # (n_cols, K)
        V = self.n_features_in_
        d = max(V, n_cols)
        if sign > 0 and isinstance(rows, slice):  # a wide batch: add in place, no (|V|, K) temporaries
            if self._fc.shape[0] == 0 and n_cols == d:  # first batch: the product is the count array
                self._fc = np.ascontiguousarray(counts)
                self._Wt = np.zeros_like(self._fc) if self._has_weights else None
                self._Dt = None
                self._grow_to(d, refresh=False, fill=False)  # _changed below sets every column
            else:
                self._reserve(d)
                if d > V:
                    self._grow_to(d, refresh=False, fill=False)  # rows = every column: set below
                self._fc[rows] += counts
            self._T = self._T + counts.sum(axis=0)  # Σ_w n_cw, kept current
            self._cc = self._cc + Y.sum(axis=0)
            self._rebuild_summaries()
            self._changed(rows)
            return self
        self._reserve(d)  # capacity only: rows >= n_features_in_ stay zero
        old = self._fc[rows]
        new = old + counts if sign > 0 else old - counts
        cc = self._cc + sign * Y.sum(axis=0)
        if sign < 0:
            cc = self._clip_negative(cc, self._cc, "class")
            new = self._clip_negative(new, old, "feature")
        # nothing can fail below: commit
        if d > V:
            self._grow_to(d, refresh=False)
        self._on_counts(rows, old, new)
        self._T = np.maximum(self._T + (new - old).sum(axis=0), 0.0)  # Σ_w n_cw, kept current
        self._fc[rows] = new
        self._cc = cc
        self._changed(rows)
        return self

    def grow_features(self, n_features):
        """Pad the counts with zero columns up to ``n_features`` (new tokens); no refit.

        O(new columns) amortised (spare capacity doubles when full).
        """
        self._check_fitted()
        if int(n_features) != n_features or n_features < self.n_features_in_:
            raise ValueError(
                f"n_features must be an integer >= n_features_in_ ({self.n_features_in_}), got {n_features!r}"
            )
        self._ensure_derived()
        if int(n_features) > self.n_features_in_:
            self._reserve(int(n_features))
            self._grow_to(int(n_features))
        return self

    def select_features(self, keep):
        """Keep only the given feature columns, in that order (vocabulary pruning)."""
        self._check_fitted()
        keep = np.asarray(keep)
        if keep.ndim != 1 or (keep.size and keep.dtype.kind not in "iu"):
            raise ValueError("keep must be a 1-D array of integer column ids")
        keep = keep.astype(np.intp)
        if keep.size and (keep.min() < 0 or keep.max() >= self.n_features_in_):
            raise ValueError(f"keep has column ids outside [0, {self.n_features_in_})")
        if np.unique(keep).size != keep.size:
            raise ValueError("keep has repeated column ids")
        self._fc = self._fc[keep]  # fancy indexing: a new C-contiguous array
        self.n_features_in_ = keep.size
        self._update_derived()
        return self

    def drop_features(self, drop):
        """Remove the feature columns ``drop`` (their counts are zero: tokens no learned
        sample holds any more), so that |V| is what it was before they were learned.

        The last columns move into the freed places: O(K·len(drop)), not O(K·|V|).
        Returns ``(src, dst)``: column ``src[i]`` is now column ``dst[i]``; the caller
        moves its own per-feature arrays (the vocabulary) the same way.
        """
        self._check_fitted()
        self._ensure_derived()
        V = self.n_features_in_
        drop = np.unique(np.asarray(drop, dtype=np.intp))
        if drop.size and (drop[0] < 0 or drop[-1] >= V):
            raise ValueError(f"drop has column ids outside [0, {V})")
        d = V - drop.size
        dst = drop[drop < d]  # the places freed below the new end
        tail = np.ones(V - d, dtype=bool)
        tail[drop[drop >= d] - d] = False
        src = d + np.flatnonzero(tail)  # the columns kept beyond it
        old = self._fc[drop]
        self._on_counts(drop, old, np.zeros_like(old))
        self._T = np.maximum(self._T - old.sum(axis=0), 0.0)  # rounding left in the dropped counts
        for name in ("_fc", "_Wt", "_Dt"):
            a = getattr(self, name)
            if a is not None:
                a[dst] = a[src]
                a[d:V] = 0.0  # rows >= n_features_in_ are always zero
        self.n_features_in_ = d
        self._on_grow(V, d)
        self._changed(None)
        return src, dst

    # -- derived ------------------------------------------------------------
    def _changed(self, rows):
        """Counts changed in the given rows (None: only |V| or class counts):
        refresh the weights of those rows; per-class terms are re-derived on demand."""
        memo = self._memo()
        for key in self._derived_from_counts:
            memo.pop(key, None)
        self.class_log_prior_ = self._class_log_prior()
        if rows is not None and self._has_weights and not self._weights_need_all():
            if isinstance(rows, slice):
                Z = self._column_weights(self._fc[rows], self._Wt[rows])  # in place
            else:
                W = np.empty((rows.size, self.classes_.size))
                Z = self._column_weights(self._fc[rows], W)
                self._Wt[rows] = W
            self._store_indicator(rows, Z)

    def _weights_need_all(self):
        """True if a weight depends on every column (then ``_class_terms`` rebuilds the
        weights on demand); override for such a model."""
        return False

    def _column_weights(self, fc, out):
        """Write the per-feature weights of count rows fc (features × K) into out and return
        the indicator of infinite weights (or None); needed when ``_has_weights``."""
        raise NotImplementedError(f"{type(self).__name__} stores weights but has no _column_weights")

    def _store_indicator(self, rows, Z):
        """Record which weights are infinite (Z, bool) in rows of ``_Dt`` (allocated on first need)."""
        if self._Dt is None:
            if Z is None or not Z.any():
                return
            self._Dt = np.zeros_like(self._Wt)
        self._Dt[rows] = 0.0 if Z is None else Z

    def _memo(self):
        """Values derived on first use and kept until what they derive from changes.

        One dict, made while learning, that prediction fills: prediction leaves the
        estimator's attributes as learning left them (scikit-learn checks that it
        does), and a copy or pickle of the estimator carries what is already derived.
        """
        return self.__dict__.setdefault("_derived", {})

    def _terms(self):
        """Per-class terms of the score (kept until the next change)."""
        memo = self._memo()
        if "terms" not in memo:
            memo["terms"] = self._class_terms()
        return memo["terms"]

    @abc.abstractmethod
    def _class_terms(self):
        """The per-class terms of the score that ``_joint_log_likelihood`` reads from ``_terms()``."""

    @abc.abstractmethod
    def _feature_log_prob(self):
        """The full (K, n_features) array of ``feature_log_prob_``: O(K·|V|)."""

    @property
    def feature_log_prob_(self):
        """The full (K, n_features) array, computed on first read after a change (O(K·|V|))."""
        self._check_fitted()
        self._ensure_derived()
        memo = self._memo()
        if "flp" not in memo:
            memo["flp"] = readonly(self._feature_log_prob())
        return memo["flp"]


class MultinomialNB(_BaseCountNB):
    """Multinomial naive Bayes for word counts.

    P_λ(w|c) = (n_cw + λ) / (Σ_w' n_cw' + |V|·λ);  score_c(x) = log P(c) + Σ_w x_w log P(w|c).

    Parameters
    ----------
    alpha : float >= 0, default 1.0
        λ: 0 maximum likelihood, 1 Laplace, (0, 1) Lidstone.
    fit_prior : bool, default True
        Learn the class prior from the counts; False gives the uniform prior.
    class_prior : array-like of shape (n_classes,), optional
        Given prior; overrides ``fit_prior``.
    smooth_prior : bool, default False
        Learned prior is (N_k + λ_p)/(N + K·λ_p) instead of N_k/N.
    prior_alpha : float >= 0, optional
        λ_p, the prior's own smoothing (default: ``alpha``). 1 is Laplace's rule
        of succession: a class with no samples yet keeps a prior above 0.

    See the module docstring for λ = 0 (ruled-out classes get posterior 0; a
    sample every class rules out gets the prior as posterior). Learning is
    incremental: O(nnz·K) per batch (see :class:`_BaseCountNB`).
    """

    # The denominator is kept out of the per-feature weights, so that a batch
    # changes only the weights of the columns it touches:
    #   log P(w|c) = log(n_cw + λ) − log(Σ_w' n_cw' + |V|·λ)
    #   score_c(x) = log P(c) + Σ_w x_w log P(w|c)
    #              = log P(c) + Σ_w x_w·W_cw − (Σ_w x_w)·log(Σ_w' n_cw' + |V|·λ),
    # with W_cw = log(n_cw + λ); the denominator is O(K) from the class totals and |V|.

    def _column_weights(self, fc, out):
        """Write the weights of count rows fc into out; return the -inf indicator (or None)."""
        np.add(fc, float(self.alpha), out=out)  # n_cw + λ
        Z = out <= 0  # λ = 0 and n_cw = 0: P(w|c) = 0, a hit rules c out
        if Z.any():
            np.log(out, out=out, where=~Z)  # W_cw = log(n_cw + λ)
        else:
            np.log(out, out=out)
        out[Z] = 0.0  # finite part 0 where -inf (indicated by Z)
        return Z if Z.any() else None

    def _log_den(self):
        den = self._T + self.n_features_in_ * float(self.alpha)  # Σ_w' n_cw' + |V|·λ
        return den, finite_log(den)

    def _class_terms(self):
        # 0/0 (a class with no words, λ = 0): every word of it is in _Dt, so any
        # word rules it out and the (finite-part 0) denominator term is never used
        return self._log_den()[1]

    def _feature_log_prob(self):
        den, log_den = self._log_den()
        flp = quiet_log(self._fc[: self.n_features_in_].T + float(self.alpha))
        flp -= log_den[:, None]  # log P_λ(w|c) = log(n_cw + λ) − log(Σ_w' n_cw' + |V|·λ)
        flp[den <= 0] = -np.inf  # 0/0: a class with no words and λ = 0
        return flp

    def _joint_log_likelihood(self, X):
        V = self.n_features_in_
        log_den = self._terms()
        jll = X @ self._Wt[:V]  # Σ_w x_w·log(n_cw + λ)   (CSR @ (|V|, K) C-contiguous)
        check_result_finite(jll, X)
        jll -= row_sums(X)[:, None] * log_den  # − (Σ_w x_w)·log(Σ_w' n_cw' + |V|·λ)
        jll += self.class_log_prior_  # + log P(c)
        if self._Dt is not None:  # a word with P(w|c) = 0 rules c out
            hits = product(X, self._Dt[:V], np.not_equal(X.data, 0).astype(np.float64))
            jll[hits > 0] = -np.inf
        return jll


class BernoulliNB(_BaseCountNB):
    """Bernoulli naive Bayes for word presence (absent words count too).

    P_λ(w present|c) = (m_cw + λ) / (N_c + 2λ), m_cw = class-c samples containing w.

    Parameters
    ----------
    alpha, fit_prior, class_prior, smooth_prior
        As in :class:`MultinomialNB`.
    binarize : float or None, default 0.0
        x is present iff x > binarize; None means X is already 0/1. For sparse X
        it must be >= 0 (implicit zeros stay absent). X is never copied: the
        binarised values are built chunk by chunk.

    With λ = 0 a word seen in every class-c sample has p = 1, so its *absence*
    rules c out (log(1 − p) = -inf), as a never-seen word's presence does.

    Every p_cw depends on N_c, so no per-feature weight can be stored and
    updated locally. Instead the weights are computed at predict time for the
    columns X uses only, and the per-class constant Σ_w log(1 − p_cw) is kept
    exact through a histogram of the counts (see :meth:`_absent_sums`): with
    integral counts (no fractional sample weights) a learning step costs
    O(nnz·K) and scoring one message O(nnz·K + K·max N_c), not O(K·|V|).
    Fractional counts fall back to an O(K·|V|) pass per change.
    """

    _has_weights = False
    _positive_only = False
    _derived_from_counts = ("terms", "flp", "weights")

    def __init__(self, *, alpha=1.0, binarize=0.0, fit_prior=True, class_prior=None, smooth_prior=False,
                 prior_alpha=None):
        super().__init__(alpha=alpha, fit_prior=fit_prior, class_prior=class_prior, smooth_prior=smooth_prior,
                         prior_alpha=prior_alpha)
        self.binarize = binarize

    def _threshold(self, X_was_sparse):
        t = self.binarize
        if t is None:
            return None
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not np.isfinite(t):
            raise ValueError(f"binarize must be a finite number or None, got {t!r}")
        if X_was_sparse and t < 0:
            raise ValueError("binarize must be >= 0 for sparse X (implicit zeros would become 1)")
        return float(t)

    def _binarized_input(self, X):
        # binarising would hide NaN: then X itself is checked; with binarize=None
        # it is checked through the product with the finite weights
        if not sp.issparse(X):
            X = dense_2d(X)
            t = self._threshold(False)
            if t is not None:
                check_finite_data(X)
                X = (X > t).astype(np.float64)
            return to_csr(X, check_finite=False), None
        t = self._threshold(True)
        X = to_csr(X, check_finite=t is not None)
        if t is not None and not X.has_canonical_format:
            X = X.copy()
            X.sum_duplicates()  # presence per (row, column), not per stored entry
        return X, t

    def _check_X(self, X):
        return self._binarized_input(X)

    @staticmethod
    def _in_shape(Xt):
        return Xt[0].shape

    @staticmethod
    def _values(Xt):
        X, t = Xt
        return X, (X.data if t is None else (X.data > t).astype(np.float64))

    def _check_X_predict(self, X):
        self._ensure_derived()
        X, t = self._binarized_input(X)
        self._check_n_features(X.shape[1])
        return X, t

    def _count(self, Xt, Y):
        X, t = Xt
        counts = None
        chunk = max(CHUNK_NNZ, 2 * Y.shape[1] * X.shape[1])
        for r0, r1, XbT in binary_chunks(X, t, chunk, transpose=True):
            # m_cw = number of class-c samples with x_w > binarize
            part = XbT @ Y[r0:r1]
            if counts is None:
                counts = part
            else:
                counts += part
        if counts is None:
            counts = np.zeros((X.shape[1], Y.shape[1]))
        if t is None:
            check_result_finite(counts, X)
        return counts

    # -- histogram of the counts: Σ_w log(1 − p_cw) exactly, without a pass over |V|
    # hist[c, v] = #{w : m_cw = v} for integral counts (None when some count is not)
    def _rebuild_summaries(self):
        self._hist = None
        self._memo().pop("logk", None)  # log(k + λ): λ may have changed
        m = self._fc[: self.n_features_in_]
        if m.size and not np.array_equal(m, np.floor(m)):
            return
        top = int(m.max(initial=0.0))
        K = self.classes_.size
        self._hist = np.zeros((K, max(64, 2 * (top + 1))), dtype=np.int64)
        for c in range(K):
            h = np.bincount(m[:, c].astype(np.intp), minlength=top + 1)
            self._hist[c, : h.size] = h

    def _on_grow(self, V, d):
        if self._hist is not None:
            self._hist[:, 0] += d - V  # new (or, d < V, removed) words: m_cw = 0

    def _on_counts(self, rows, old, new):
        if self._hist is None:
            return
        if not np.array_equal(new, np.floor(new)):
            self._hist = None  # fractional counts: O(K·|V|) sums from now on
            return
        K, H = self._hist.shape
        top = int(new.max(initial=0.0))
        if top >= H:
            grown = np.zeros((K, max(top + 1, 2 * H)), dtype=np.int64)
            grown[:, :H] = self._hist
            self._hist, H = grown, grown.shape[1]
        flat = self._hist.reshape(-1)  # a view: updated in place
        off = np.arange(K) * H
        np.subtract.at(flat, (old.astype(np.intp) + off).ravel(), 1)
        np.add.at(flat, (new.astype(np.intp) + off).ravel(), 1)

    def _log_table(self, n):
        """L[k] = log(k + λ) for k = 0..n (finite part: 0 for log 0), grown by doubling."""
        memo = self._memo()
        L = memo.get("logk")
        if L is None or L.size <= n:
            size = max(64, 2 * (n + 1), 0 if L is None else 2 * L.size)
            L = memo["logk"] = finite_log(np.arange(size) + float(self.alpha))
        return L

    def _absent_sums(self):
        """Per class: Σ_w log(N_c − m_cw + λ) over the terms with N_c − m_cw + λ > 0,
        and the number Za_c of the others (p_cw = 1 at λ = 0: absence rules c out).

        With integral counts Σ_w f(m_cw) = Σ_v hist[c, v]·f(v), and
        log(N_c − v + λ) for v = N_c, N_c − 1, ..., 0 is the table log(k + λ) read
        backwards: a dot product, O(K·max N_c), no logarithms per step.
        """
        lam = float(self.alpha)
        N = self._cc
        if self._hist is not None and np.array_equal(N, np.floor(N)):
            K = N.size
            G, Za = np.zeros(K), np.zeros(K)
            L = self._log_table(int(N.max(initial=0.0)))
            for c in range(K):
                n = int(N[c])
                h = self._hist[c]
                k = min(n + 1, h.size)  # hist may be shorter than N_c + 1 (no count that high)
                G[c] = h[:k] @ L[n::-1][:k]  # Σ_v hist[c, v]·log(N_c − v + λ)
                Za[c] = h[n + 1 :].sum()  # m_cw > N_c (inconsistent counts): 1 − p <= 0
                if lam == 0 and n < h.size:
                    Za[c] += h[n]  # m_cw = N_c: p_cw = 1 (its log(0) is 0 in the table)
            return G, Za
        arg = N - self._fc[: self.n_features_in_] + lam  # (|V|, K): N_c − m_cw + λ
        return finite_log(arg).sum(axis=0), (arg <= 0).sum(axis=0).astype(np.float64)

    def _log_den(self):
        den = self._cc + 2 * float(self.alpha)  # N_c + 2λ
        return den, finite_log(den)

    def _class_terms(self):
        # score_c(x) = log P(c) + Σ_w log(1 − p_cw) + Σ_{w ∈ x} [log p_cw − log(1 − p_cw)]
        # (the first sum is a per-class constant, so scoring stays sparse), with
        # Σ_w log(1 − p_cw) = Σ_w log(N_c − m_cw + λ) − |V|·log(N_c + 2λ); the Za_c
        # terms with p_cw = 1 (-inf) are left out here and rule c out through the hits
        G, Za = self._absent_sums()
        _, log_den = self._log_den()
        const = self.class_log_prior_ + G - (self.n_features_in_ - Za) * log_den
        return const, Za

    def _present_weights(self, m):
        """(W, D) for the rows (features) m of the counts, shape (rows, K):
        W = finite part of log p_cw − log(1 − p_cw); D = [p_cw = 0] − [p_cw = 1]."""
        lam = float(self.alpha)
        num = m + lam  # m_cw + λ
        neg = self._cc - m + lam  # N_c − m_cw + λ
        # (0/0, N_c = 0 at λ = 0, has num = neg = 0: both indicators, every event impossible)
        Zp = num <= 0  # p = 0
        Za = neg <= 0  # 1 − p = 0
        # log p_cw = log(m_cw + λ) − log(N_c + 2λ), log(1 − p_cw) = log(N_c − m_cw + λ) − log(N_c + 2λ):
        # the denominators cancel in the difference unless one side is -inf (finite part 0)
        W = finite_log(num) - finite_log(neg)
        if not (Zp.any() or Za.any()):
            return W, None
        # ruled out: a present word with p = 0, or an absent word with p = 1
        # hits = Σ_{w∈x} [Zp − Za] + Σ_w Za > 0
        D = Zp.astype(np.float64) - Za
        W += self._log_den()[1] * D  # restore the uncancelled −log(N_c + 2λ) of the finite side
        return W, D

    def _feature_log_prob(self):
        den, log_den = self._log_den()
        flp = quiet_log(self._fc[: self.n_features_in_].T + float(self.alpha))
        flp -= log_den[:, None]  # log p_cw = log(m_cw + λ) − log(N_c + 2λ)
        flp[den <= 0] = -np.inf  # 0/0: no class-c samples and λ = 0 -> every event impossible
        return flp

    def _joint_log_likelihood(self, Xt):
        X, t = Xt
        const, Za = self._terms()
        if X.nnz <= GATHER_NNZ:  # few nonzeros: the weights of exactly those
            _, xb = self._values(Xt)
            W, D = self._present_weights(self._fc[X.indices])
            jll = sum_rows(W * xb[:, None], X)  # Σ_{w ∈ x} [log p_cw − log(1 − p_cw)]
            if t is None:
                check_result_finite(jll, X)
            if D is not None:
                jll[(sum_rows(D * (xb != 0)[:, None], X) + Za) > 0] = -np.inf
            elif Za.any():
                jll[:, Za > 0] = -np.inf
            jll += const
            return jll
        memo = self._memo()
        if "weights" not in memo:  # a big batch: every column's weights (kept until a change)
            memo["weights"] = self._present_weights(self._fc[: self.n_features_in_])
        W, D = memo["weights"]
        jll = np.empty((X.shape[0], self.classes_.size))
        for r0, r1, Xb in binary_chunks(X, t):
            jll[r0:r1] = Xb @ W
            if t is None:
                check_result_finite(jll[r0:r1], Xb)
            if D is not None:  # hits = Σ_{w∈x} [Zp − Za] + Σ_w Za  (Za over every word)
                hits = (Xb if t is not None else pattern(Xb)) @ D + Za
                jll[r0:r1][hits > 0] = -np.inf
            elif Za.any():  # no zero-probability event among x's words: absent p = 1 words rule out
                jll[r0:r1, Za > 0] = -np.inf
        jll += const
        return jll


class ComplementNB(_BaseCountNB):
    """Complement naive Bayes (Rennie et al. 2003), as scikit-learn's ComplementNB.

    θ̃_cw = (Σ_{c'≠c} n_c'w + λ) / (Σ_{c'≠c} Σ_w' n_c'w' + |V|·λ), weights
    w_cw = −log θ̃_cw (``norm=False``) or log θ̃_cw / Σ_w' log θ̃_cw' (``norm=True``);
    score_c(x) = Σ_w x_w w_cw (plus log P(c) only when there is a single class).

    Parameters
    ----------
    alpha, fit_prior, class_prior, smooth_prior
        As in :class:`MultinomialNB` (the prior matters only with one class).
    norm : bool, default False
        Second normalisation of the weights.

    λ = 0: θ̃_cw = 0 (w seen only in class c) gives an infinite weight. This is
    resolved as the limit λ → 0: with ``norm=False`` the classes with the most
    such occurrences in x (Σ_w x_w over infinite weights) win and the finite
    parts of the weights decide among them; with ``norm=True`` the normalised
    weights tend to 1/m_c on the m_c infinite entries of class c and 0 elsewhere.

    Learning is incremental (O(nnz·K) per batch) with ``norm=False``. With
    ``norm=True`` every weight depends on Σ_w' log θ̃_cw', so the weights are
    rebuilt (O(K·|V|)) at the first prediction after a change.
    """

    # norm=False: as for MultinomialNB the denominator is pulled out of the weights,
    #   w_cw = −log θ̃_cw = −log(Σ_{c'≠c} n_c'w + λ) + log(Σ_{c'≠c} Σ_w' n_c'w' + |V|·λ)
    #   score_c(x) = Σ_w x_w·W_cw + (Σ_w x_w)·log(Σ_{c'≠c} Σ_w' n_c'w' + |V|·λ),
    # with W_cw = −log(Σ_{c'≠c} n_c'w + λ), which depends on column w only.

    def __init__(self, *, alpha=1.0, fit_prior=True, class_prior=None, norm=False, smooth_prior=False,
                 prior_alpha=None):
        super().__init__(alpha=alpha, fit_prior=fit_prior, class_prior=class_prior, smooth_prior=smooth_prior,
                         prior_alpha=prior_alpha)
        self.norm = norm

    @property
    def feature_all_(self):
        """Σ_c n_cw: counts of every feature over all classes."""
        return self.feature_count_.sum(axis=0)

    def _weights_need_all(self):
        return bool(self.norm)

    @staticmethod
    def _complement(fc, lam):
        """Σ_{c'≠c} n_c'w + λ for count rows fc (features × K)."""
        return fc.sum(axis=1, keepdims=True) + lam - fc

    def _column_weights(self, fc, out):
        """Write the weights of count rows fc into out; return the +inf indicator (or None)."""
        np.subtract(fc.sum(axis=1, keepdims=True) + float(self.alpha), fc, out=out)  # Σ_{c'≠c} n_c'w + λ
        Z = out <= 0  # θ̃_cw = 0: infinite weight
        if Z.any():
            np.log(out, out=out, where=~Z)
        else:
            np.log(out, out=out)
        np.negative(out, out=out)  # W_cw = −log(Σ_{c'≠c} n_c'w + λ)
        out[Z] = 0.0  # finite part 0 where +inf (indicated by Z)
        return Z if Z.any() else None

    def _log_den(self):
        T = self._T
        K = T.size
        # Σ_{c'≠c} Σ_w' n_c'w' + |V|·λ
        den = np.array([T[np.arange(K) != c].sum() for c in range(K)]) + self.n_features_in_ * float(self.alpha)
        return den, finite_log(den)

    def _normalized_weights(self):
        """ŵ (K, |V|) for norm=True, from all the counts: O(K·|V|)."""
        comp = self._complement(self._fc[: self.n_features_in_], float(self.alpha)).T
        den = comp.sum(axis=1, keepdims=True)  # Σ_{c'≠c} Σ_w' n_c'w' + |V|·λ
        with np.errstate(divide="ignore", invalid="ignore"):
            logged = np.log(comp / den)  # log θ̃_cw
            W = logged / logged.sum(axis=1, keepdims=True)  # ŵ_cw = log θ̃_cw / Σ_w' log θ̃_cw'
        Z = (comp <= 0) | (den <= 0)  # θ̃_cw = 0 (or 0/0)
        m = Z.sum(axis=1)
        for c in np.flatnonzero(m):  # limit λ → 0: 1/m_c on the zero entries, 0 elsewhere
            W[c] = Z[c] / m[c]
        return W

    def _class_terms(self):
        const = self.class_log_prior_ if self.classes_.size == 1 else np.zeros(self.classes_.size)
        if self.norm:  # every weight, kept beside the state (which may be a read-only memory map)
            return const, None, np.ascontiguousarray(self._normalized_weights().T)
        # 0/0 (λ = 0, no counts outside c): every weight of c is infinite (in _Dt)
        return const, self._log_den()[1], None

    def _feature_log_prob(self):
        if self.norm:
            return self._normalized_weights()
        den, log_den = self._log_den()
        comp = self._complement(self._fc[: self.n_features_in_], float(self.alpha)).T
        flp = log_den[:, None] - finite_log(comp)  # w_cw = −log θ̃_cw
        flp[(comp <= 0) | (den[:, None] <= 0)] = np.inf  # θ̃_cw = 0 (or 0/0): infinite weight
        return flp

    def _joint_log_likelihood(self, X):
        V = self.n_features_in_
        const, log_den, normalized = self._terms()
        jll = X @ (self._Wt[:V] if normalized is None else normalized)  # Σ_w x_w·W_cw   (CSR @ (|V|, K))
        check_result_finite(jll, X)
        jll += const
        if log_den is None:  # norm=True: the weights are complete
            return jll
        n_words = row_sums(X)[:, None]
        h = None
        if self._Dt is not None:
            h = X @ self._Dt[:V]  # Σ_w x_w over infinite weights (the λ → 0 leading term)
            n_words = n_words - h  # an infinite weight has no finite part at all
        jll += n_words * log_den  # + (Σ_w x_w)·log(Σ_{c'≠c} Σ_w' n_c'w' + |V|·λ)
        if h is not None:
            jll[h < h.max(axis=1, keepdims=True)] = -np.inf
        return jll


# --------------------------------------------------------------------------- categorical


class CategoricalNB(_BaseNB):
    """Naive Bayes for categorical features (docs/naive-bayes.md §4, general form).

    Feature j takes values 0..S_j−1 (S_j = ``n_categories_[j]``);
    P_λ(x_j=a|c) = (N_c^(j,a) + λ) / (N_c + S_j·λ).

    Parameters
    ----------
    alpha, fit_prior, class_prior, smooth_prior
        As in :class:`MultinomialNB`.
    min_categories : int, array-like of shape (n_features,) or None
        Minimum S_j per feature (values not seen in training but possible).

    X holds non-negative integer codes; sparse X is fine (implicit zeros are
    category 0). ``feature_log_prob_`` and ``category_count_`` are lists of
    (n_classes, S_j) arrays, like scikit-learn. A category >= S_j at predict
    time raises ValueError (``partial_fit`` grows S_j; use ``min_categories``).
    """

    def __init__(self, *, alpha=1.0, fit_prior=True, class_prior=None, min_categories=None, smooth_prior=False,
                 prior_alpha=None):
        self.alpha = alpha
        self.fit_prior = fit_prior
        self.class_prior = class_prior
        self.min_categories = min_categories
        self.smooth_prior = smooth_prior
        self.prior_alpha = prior_alpha

    _state = ("_cat", "_off", "_logp", "_W", "_const", "_D", "_Dconst")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.categorical = True
        tags.input_tags.positive_only = True  # category codes 0, 1, 2 ...
        tags.classifier_tags.poor_score = True  # as for the count models: blobs are not categories
        return tags

    # state: self._cat (K, Σ S_j) flat counts; self._off (d+1,) block offsets
    def _check_X(self, X):
        X = to_csr(X)
        if not X.has_canonical_format:
            X = X.copy()
            X.sum_duplicates()
        if X.data.size:
            if X.data.min() < 0:
                raise ValueError("Negative values in data passed to CategoricalNB (X): it holds category codes "
                                 "0, 1, 2 ...")
            if not np.array_equal(X.data, np.floor(X.data)):
                raise ValueError("CategoricalNB: X must hold integer category codes")
        return X

    def _check_X_predict(self, X):
        X = self._check_X(X)
        self._check_n_features(X.shape[1])
        return X

    def _min_categories(self, d):
        mc = self.min_categories
        if mc is None:
            return np.ones(d, dtype=np.intp)
        mc = np.asarray(mc)
        if mc.dtype.kind not in "iu" or (mc < 0).any():
            raise ValueError("min_categories must be non-negative integers")
        if mc.ndim == 0:
            return np.full(d, max(int(mc), 1), dtype=np.intp)
        if mc.shape != (d,):
            raise ValueError(f"min_categories has shape {mc.shape}, expected ({d},)")
        return np.maximum(mc, 1).astype(np.intp)

    def _onehot(self, X):
        """Sparse one-hot of the nonzero categories: column off[j] + a."""
        nz = X.data != 0
        rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))[nz]
        cols = self._off[X.indices[nz]] + X.data[nz].astype(np.intp)
        return sp.csr_matrix(
            (np.ones(rows.size), (rows, cols)), shape=(X.shape[0], self._off[-1])
        )

    def _relayout(self, n_categories):
        """Move the flat counts to new block sizes S_j (growing or shrinking)."""
        new_off = np.concatenate([[0], np.cumsum(n_categories)])
        new = np.zeros((self.classes_.size, new_off[-1]))
        if hasattr(self, "_cat"):
            old_S = np.diff(self._off)
            feat = np.repeat(np.arange(old_S.size), old_S)
            a = np.arange(self._off[-1]) - self._off[feat]
            keep = a < n_categories[feat]
            new[:, new_off[feat[keep]] + a[keep]] = self._cat[:, keep]
        self._cat, self._off, self.n_categories_ = new, new_off, n_categories

    def _update(self, X, y, sample_weight, sign):
        X = self._check_X(X)
        Y = self._label_matrix(y, X.shape[0], sample_weight)
        d = X.shape[1]
        if hasattr(self, "n_features_in_") and d != self.n_features_in_:
            self._check_n_features(X.shape[1])
        maxv = np.zeros(d)
        np.maximum.at(maxv, X.indices, X.data)
        S = np.maximum(maxv.astype(np.intp) + 1, self._min_categories(d))
        if hasattr(self, "n_categories_"):
            if sign < 0 and (S > self.n_categories_).any():
                raise ValueError("forget: X has categories this model never learnt")
            S = np.maximum(S, self.n_categories_)
        saved = {k: getattr(self, k) for k in ("_cat", "_off", "n_categories_") if hasattr(self, k)}
        if not hasattr(self, "n_categories_") or (S != self.n_categories_).any():
            self._relayout(S)
        batch_cc = Y.sum(axis=0)
        # N_c^(j,a) for a >= 1 from the nonzeros; N_c^(j,0) = N_c − Σ_{a≥1} N_c^(j,a)
        cat = (self._onehot(X).T @ Y).T
        cat[:, self._off[:-1]] = batch_cc[:, None] - np.add.reduceat(cat, self._off[:-1], axis=1)
        new_cat = self._cat + sign * cat
        new_cc = self.class_count_ + sign * batch_cc
        if sign < 0:
            try:
                new_cc = self._clip_negative(new_cc, self.class_count_, "class")
                new_cat = self._clip_negative(new_cat, self._cat, "category")
            except ValueError:
                for k, v in saved.items():
                    setattr(self, k, v)
                raise
        self._cat, self.class_count_, self.n_features_in_ = new_cat, new_cc, d
        if sign < 0:
            # S_j is a function of the counts: max(1 + highest category seen, min_categories)
            feat = np.repeat(np.arange(d), self.n_categories_)
            a = np.arange(self._off[-1]) - self._off[feat]
            seen = np.zeros(d, dtype=np.intp)
            used = self._cat.sum(axis=0) > 0
            np.maximum.at(seen, feat[used], a[used] + 1)
            S = np.maximum(seen, self._min_categories(d))
            if (S != self.n_categories_).any():
                self._relayout(S)
        self._update_derived()
        return self

    @property
    def category_count_(self):
        """List of (n_classes, S_j) arrays: N_c^(j,a)."""
        return [self._cat[:, a:b] for a, b in zip(self._off[:-1], self._off[1:])]

    @property
    def feature_log_prob_(self):
        """List of (n_classes, S_j) arrays: log P_λ(x_j=a|c)."""
        return [self._logp[:, a:b] for a, b in zip(self._off[:-1], self._off[1:])]

    def _update_derived(self):
        self.class_log_prior_ = self._class_log_prior()
        lam = float(self.alpha)
        S = np.diff(self._off)
        feat = np.repeat(np.arange(S.size), S)
        den = self.class_count_[:, None] + S[feat] * lam  # N_c + S_j·λ
        with np.errstate(divide="ignore", invalid="ignore"):
            L = np.log(self._cat + lam) - np.log(den)  # log P_λ(x_j=a|c) = log(N_c^(j,a) + λ) − log(N_c + S_j·λ)
        L[np.broadcast_to(den == 0, L.shape)] = -np.inf  # 0/0 with λ = 0
        self._logp = L
        # sparse rewrite: score_c(x) = log P(c) + Σ_j log P(x_j=0|c) + Σ_{x_j≠0} [log P(x_j=a|c) − log P(x_j=0|c)]
        Lf, Z = split_inf(L)
        zero_col = self._off[:-1][feat]
        self._W = np.asfortranarray(Lf - Lf[:, zero_col])
        self._const = self.class_log_prior_ + Lf[:, self._off[:-1]].sum(axis=1)
        if Z is None:
            self._D = None
        else:
            Zf = Z.astype(np.float64)
            self._D = np.asfortranarray(Zf - Zf[:, zero_col])
            self._Dconst = Zf[:, self._off[:-1]].sum(axis=1)

    def _joint_log_likelihood(self, X):
        if X.data.size:
            too_big = X.data >= self.n_categories_[X.indices]
            if too_big.any():
                j = X.indices[too_big][0]
                raise ValueError(
                    f"feature {j} has category {int(X.data[too_big][0])} but only "
                    f"{self.n_categories_[j]} were learnt (set min_categories)"
                )
        H = self._onehot(X)
        jll = H @ self._W.T + self._const
        if self._D is not None:
            jll[(H @ self._D.T + self._Dconst) > 0] = -np.inf
        return jll


# --------------------------------------------------------------------------- Gaussian


class GaussianNB(_BaseNB):
    """Gaussian naive Bayes for continuous features (docs/naive-bayes.md §6).

    p(x_j|c) = 1/sqrt(2π σ²_cj) · exp(−(x_j − μ_cj)² / (2σ²_cj)), with
    σ²_cj floored by ``epsilon_ = var_smoothing · max_j Var(x_j)`` (variance over
    all data seen) as in scikit-learn.

    State: per class the weighted count n_c, Σ (x − s) and Σ (x − s)², with a fixed
    per-feature shift s (mean of the first dense batch, 0 for sparse input) for
    numerical stability. ``forget`` subtracts those sums exactly.

    Parameters
    ----------
    priors : array-like of shape (n_classes,), optional
        Given prior (scikit-learn's name; overrides ``fit_prior``).
    var_smoothing : float, default 1e-9
    fit_prior, smooth_prior, alpha
        Prior modes as in the count models; ``alpha`` is used only by the smoothed prior.

    If every variance floor is 0 (all data constant and var_smoothing = 0) a
    feature with σ² = 0 acts as a point mass: x = μ contributes 0, any other x
    rules the class out.
    """

    _state = ("_s1", "_s2", "_empty")

    def __init__(self, *, priors=None, var_smoothing=1e-9, fit_prior=True, smooth_prior=False, alpha=1.0,
                 prior_alpha=None):
        self.priors = priors
        self.var_smoothing = var_smoothing
        self.fit_prior = fit_prior
        self.smooth_prior = smooth_prior
        self.prior_alpha = prior_alpha
        self.alpha = alpha

    @property
    def class_prior(self):
        return self.priors

    @property
    def class_prior_(self):
        """Prior probabilities P(c)."""
        return np.exp(self.class_log_prior_)

    def _check_X(self, X):
        if sp.issparse(X):
            return to_csr(X)
        X = dense_2d(X).astype(np.float64, copy=False)
        check_finite_data(X)
        return X

    def _check_X_predict(self, X):
        X = self._check_X(X)
        self._check_n_features(X.shape[1])
        return X

    def _check_params(self):
        """Nothing before the update: :meth:`_update` checks λ and var_smoothing, on forget too."""

    def _update(self, X, y, sample_weight, sign):
        self._check_params_prior()
        vs = self.var_smoothing
        if not isinstance(vs, numbers.Real) or not np.isfinite(vs) or vs < 0:
            raise ValueError(f"var_smoothing must be a finite number >= 0, got {vs!r}")
        X = self._check_X(X)
        Y = self._label_matrix(y, X.shape[0], sample_weight)
        if hasattr(self, "n_features_in_"):
            self._check_n_features(X.shape[1])
        else:
            d = X.shape[1]
            self.shift_ = np.zeros(d) if sp.issparse(X) or X.shape[0] == 0 else X.mean(axis=0)
            self._s1 = np.zeros((self.classes_.size, d))
            self._s2 = np.zeros((self.classes_.size, d))
            self.n_features_in_ = d
        n = Y.sum(axis=0)
        s = self.shift_
        if sp.issparse(X):
            sx = (X.T @ Y).T  # Σ x
            sxx = (X.multiply(X).T @ Y).T  # Σ x²
            s1 = sx - n[:, None] * s  # Σ (x − s)
            s2 = sxx - 2 * s * sx + n[:, None] * s**2  # Σ (x − s)²
        else:
            Xs = X - s
            s1 = Y.T @ Xs  # Σ (x − s)
            s2 = Y.T @ (Xs * Xs)  # Σ (x − s)²
        new_n = self.class_count_ + sign * n
        if sign < 0:
            new_n = self._clip_negative(new_n, self.class_count_, "class")
        self.class_count_ = new_n
        self._s1 = self._s1 + sign * s1
        self._s2 = self._s2 + sign * s2
        self._update_derived()
        return self

    def _update_derived(self):
        self.class_log_prior_ = self._class_log_prior()
        n = self.class_count_[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            m1 = self._s1 / n
            self.theta_ = self.shift_ + m1  # μ_cj = s + Σ(x − s)/n_c
            var = np.maximum(self._s2 / n - m1 * m1, 0.0)  # σ²_cj = Σ(x − s)²/n_c − (Σ(x − s)/n_c)²
        N = self.class_count_.sum()
        if N > 0:
            M1 = self._s1.sum(axis=0) / N
            pooled = np.maximum(self._s2.sum(axis=0) / N - M1 * M1, 0.0)  # Var(x_j) over all data
            self.epsilon_ = float(self.var_smoothing) * float(pooled.max(initial=0.0))
        else:
            self.epsilon_ = 0.0
        self.var_ = var + self.epsilon_  # variance floor
        self._empty = self.class_count_ == 0  # no data: the class explains nothing

    def _joint_log_likelihood(self, X):
        K = self.classes_.size
        theta, var = self.theta_, self.var_
        zero = var == 0
        v = np.where(zero, 1.0, var)
        # log p(x_j|c) = −½ log(2π σ²_cj) − (x_j − μ_cj)² / (2σ²_cj)
        const = -0.5 * np.log(2.0 * np.pi * v).sum(axis=1)
        if sp.issparse(X):
            # expanded: Σ_j [x_j²·(−1/2σ²) + x_j·μ/σ² − μ²/2σ²] keeps X sparse
            inv = np.where(zero, 0.0, 1.0 / v)
            jll = X.multiply(X) @ (-0.5 * inv).T + X @ (theta * inv).T
            jll += const - 0.5 * (theta**2 * inv).sum(axis=1)
        else:
            jll = np.empty((X.shape[0], K))
            for c in range(K):
                jll[:, c] = const[c] - 0.5 * (((X - theta[c]) ** 2) / v[c]).sum(axis=1)
        for c in np.flatnonzero(zero.any(axis=1)):  # point masses: any x_j ≠ μ_cj rules c out
            cols = np.flatnonzero(zero[c])
            diff = X[:, cols] - theta[c, cols]  # dense (n, few columns)
            jll[np.asarray(diff != 0).any(axis=1), c] = -np.inf
        jll[:, self._empty] = -np.inf  # a class without data explains nothing
        jll += self.class_log_prior_
        return jll


# --------------------------------------------------------------------------- scikit-learn's checks


def expected_failed_checks(estimator):
    """scikit-learn's common checks that cannot apply to ``estimator``: {check name: reason}.

    For ``check_estimator(estimator, expected_failed_checks=...)`` and
    ``parametrize_with_checks``; every other check passes.
    """
    if not isinstance(estimator, CategoricalNB):
        return {}
    reason = ("the check fits random floats in [0, 1) as X; CategoricalNB takes whole-number "
              "category codes and refuses other values, where scikit-learn's truncates them to 0")
    out = dict.fromkeys(["check_sample_weight_equivalence_on_dense_data",
                         "check_sample_weight_equivalence_on_sparse_data",
                         "check_classifiers_one_label_sample_weights"], reason)
    # asked by scikit-learn, which is loaded then (never imported here)
    version = getattr(sys.modules.get("sklearn"), "__version__", "")
    if tuple(int(p) for p in re.findall(r"\d+", version)[:3]) < (1, 7, 1):
        out["check_positive_only_tag_during_fit"] = (
            "before scikit-learn 1.7.1 the check subtracts a float mean in place from the int32 "
            "category codes it made, which numpy refuses before the estimator is called")
    return out
