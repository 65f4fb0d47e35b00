"""Evaluation metrics for spam filters.

Conventions used throughout:

- ``y`` holds the true labels, ``1`` = spam, ``0`` = ham.
- ``scores`` are *spam scores*: higher means spammier.  Any monotone scale
  works for the ranking metrics (log-odds, probabilities, bogofilter's
  spamicity); only :func:`confusion_at_cutoffs` and the metrics built on it
  need probabilities, because the cut-offs are probabilities.
- Rates are fractions in [0, 1]; names ending in ``_pct`` are percentages.

References
----------
.. [TREC05] G. V. Cormack and T. R. Lynam, "TREC 2005 Spam Track Overview",
   Proc. TREC 2005 (NIST SP 500-266).  Defines hm% (ham misclassification),
   sm% (spam misclassification), lam% and (1-ROCA)%.
.. [A00] I. Androutsopoulos, J. Koutsias, K. V. Chandrinos, G. Paliouras and
   C. D. Spyropoulos, "An Evaluation of Naive Bayesian Anti-Spam Filtering",
   Proc. Workshop on Machine Learning in the New Information Age, 11th ECML,
   Barcelona, 2000, pp. 9-17.  Defines weighted accuracy and the total cost
   ratio for λ = 1, 9, 999 (ham misfiled as spam costs λ times a missed spam).
"""

from __future__ import annotations

import math

import numpy as np

from spamnb.nb.decision import action_indices

__all__ = [
    "roc_auc",
    "one_minus_auc_pct",
    "roc_curve",
    "recall_at_fpr",
    "lam_pct",
    "Confusion",
    "confusion_at_cutoffs",
    "weighted_accuracy",
    "total_cost_ratio",
    "summary",
    "paired_bootstrap",
    "bootstrap_intervals",
    "misordered_pairs",
    "worst_ranked",
    "LAMBDAS",
]

#: The cost ratios of [A00]: spam shown apart (1), blocked with a
#: challenge to the sender (9), deleted silently (999).
LAMBDAS = (1, 9, 999)


def _check(y, scores):
    """Validate and convert ``y`` (0/1) and ``scores`` (finite floats)."""
    y = np.asarray(y)
    scores = np.asarray(scores, dtype=np.float64)
    if y.ndim != 1 or scores.ndim != 1:
        raise ValueError("y and scores must be one-dimensional")
    if y.shape != scores.shape:
        raise ValueError(
            f"y and scores differ in length ({y.shape[0]} != {scores.shape[0]})"
        )
    if not np.isin(y, (0, 1)).all():
        raise ValueError("y must hold only 0 (ham) and 1 (spam)")
    if np.isnan(scores).any():
        raise ValueError("scores contain NaN")
    return y.astype(np.int8), scores


def _check_both_classes(y):
    n_spam = int(y.sum())
    n_ham = int(y.shape[0] - n_spam)
    if n_spam == 0 or n_ham == 0:
        raise ValueError(
            f"need both classes (got {n_ham} ham, {n_spam} spam)"
        )
    return n_ham, n_spam


def _average_ranks(x):
    """1-based ranks of ``x`` with tied values given their mean rank."""
    order = np.argsort(x, kind="mergesort")
    _, inverse, counts = np.unique(x[order], return_inverse=True, return_counts=True)
    # a tie group occupying sorted positions first..last (1-based) gets
    # rank (first + last) / 2 = end - (count - 1) / 2, end = cumsum(counts)
    ends = np.cumsum(counts)
    group_rank = ends - (counts - 1) / 2.0
    ranks = np.empty(x.shape[0], dtype=np.float64)
    ranks[order] = group_rank[inverse]
    return ranks


def roc_auc(y, scores):
    """Area under the ROC curve, by the Mann-Whitney U statistic.

    AUC = P(score of a random spam > score of a random ham), ties counted
    as one half.  With R_s the sum of the (tie-averaged) ranks of the spam
    scores among all scores,

        AUC = (R_s - n_s (n_s + 1) / 2) / (n_s · n_h)

    which is O(n log n) (one sort).

    Parameters
    ----------
    y : array-like of {0, 1}, shape (n,)
    scores : array-like of float, shape (n,)

    Returns
    -------
    float in [0, 1].

    Raises
    ------
    ValueError
        If the inputs are malformed or one class is absent.
    """
    y, scores = _check(y, scores)
    n_ham, n_spam = _check_both_classes(y)
    ranks = _average_ranks(scores)
    r_spam = ranks[y == 1].sum()
    # U_s = R_s - n_s(n_s+1)/2 counts the (spam, ham) pairs the spam wins, ties 1/2
    u_spam = r_spam - n_spam * (n_spam + 1) / 2.0
    return float(u_spam / (n_spam * n_ham))


def one_minus_auc_pct(y, scores):
    """TREC's (1-ROCA)%: ``100 · (1 - AUC)``; lower is better."""
    return 100.0 * (1.0 - roc_auc(y, scores))


def roc_curve(y, scores):
    """ROC curve points, one per distinct score (ties merged).

    A message is called spam when ``score >= threshold``.  The thresholds are
    the distinct scores in decreasing order, preceded by ``+inf`` (nothing
    called spam, the point (0, 0)); the last point is (1, 1).

    Returns
    -------
    fpr, tpr, thresholds : ndarray of shape (m + 1,)
        ``fpr[i]`` = share of ham with ``score >= thresholds[i]``,
        ``tpr[i]`` = share of spam with ``score >= thresholds[i]``.
    """
    y, scores = _check(y, scores)
    n_ham, n_spam = _check_both_classes(y)
    order = np.argsort(-scores, kind="mergesort")
    s, t = scores[order], y[order]
    # last index of every run of equal scores in the descending order
    last = np.r_[np.flatnonzero(np.diff(s) != 0), s.shape[0] - 1]
    tp = np.cumsum(t)[last]
    fp = (last + 1) - tp
    fpr = np.r_[0.0, fp / n_ham]
    tpr = np.r_[0.0, tp / n_spam]
    thresholds = np.r_[np.inf, s[last]]
    return fpr, tpr, thresholds


def recall_at_fpr(y, scores, fpr=0.001):
    """Largest spam recall at a ham misclassification rate of at most ``fpr``.

    Exactly: let k = floor(fpr · n_ham) be the number of ham the filter may
    misfile, and c the (k+1)-th highest ham score (the 0-based k-th of the
    ham scores sorted in decreasing order; c = -inf when k >= n_ham).  The
    filter calls a message spam iff ``score > c``.  At most k ham are
    strictly above c, so the ham misclassification rate is <= fpr; any lower
    threshold would call the k+1 ham with scores >= c spam.  The result is
    the share of spam with ``score > c``: a spam *tied* with a ham at the
    threshold is not counted as caught (conservative tie handling, since no
    threshold separates the two).

    Example: ham scores (0.9, 0.5, 0.1, 0.1), spam (0.95, 0.9, 0.6, 0.2),
    fpr = 0.25 -> k = 1, c = 0.5; spam above 0.5: 0.95, 0.9, 0.6 -> 0.75.
    With fpr = 0 -> k = 0, c = 0.9; only 0.95 is above (the spam at 0.9 ties
    the top ham) -> 0.25.

    Parameters
    ----------
    y : array-like of {0, 1}
    scores : array-like of float
    fpr : float in [0, 1]
        The allowed ham misclassification rate (0.001 = 0.1%).

    Returns
    -------
    float in [0, 1].
    """
    y, scores = _check(y, scores)
    n_ham, n_spam = _check_both_classes(y)
    if not 0.0 <= fpr <= 1.0:
        raise ValueError(f"fpr must be in [0, 1], got {fpr!r}")
    # small epsilon: 0.001 * 4000 is 3.9999999999999996 in binary floating point
    k = int(math.floor(fpr * n_ham + 1e-9))
    if k >= n_ham:
        return 1.0
    ham_desc = np.sort(scores[y == 0])[::-1]
    c = ham_desc[k]
    return float(np.count_nonzero(scores[y == 1] > c) / n_spam)


def _logit(p):
    return math.log(p / (1.0 - p))


def _expit(x):
    return 1.0 / (1.0 + math.exp(-x))


def _edge_corrected(rate, n):
    """Move a rate of exactly 0 or 1 half a message inwards: 0.5/n, (n-0.5)/n."""
    if rate <= 0.0:
        return 0.5 / n
    if rate >= 1.0:
        return (n - 0.5) / n
    return rate


def lam_pct(hm, sm, n_ham=None, n_spam=None):
    """TREC's logistic average misclassification percentage [TREC05].

        lam% = 100 · logit⁻¹((logit(hm) + logit(sm)) / 2),  logit(p) = ln(p / (1-p))

    with ``hm`` the ham misclassification rate (ham filed as spam / all ham)
    and ``sm`` the spam misclassification rate (spam not filed as spam / all
    spam), both fractions.  It is the geometric mean of the two error odds,
    turned back into a percentage; lam% = hm% = sm% when the two are equal.

    The logit is infinite at 0 and 1.  Our choice, documented here because
    the published formula leaves it open:

    - With the class sizes ``n_ham`` / ``n_spam`` given, a rate of exactly
      0 (1) is replaced by 0.5/n ((n - 0.5)/n), i.e. half a message is added
      to (taken from) the zero (full) error count; rates strictly inside
      (0, 1) are used unchanged.  This is the "add 0.5 to the count"
      continuity correction and keeps lam% finite and > 0 for a perfect
      filter, so filters with no errors on sets of different sizes still
      compare sensibly.  (We could not check the exact correction used by
      the TREC toolkit from the material at hand; we apply it only at the
      edges so that ordinary values follow the formula exactly.)
    - Without class sizes the limits are returned: 0.0 if one rate is 0
      and the other < 1, 100.0 if one rate is 1 and the other > 0, and NaN
      for the undefined case of one rate 0 and the other 1.

    Returns
    -------
    float, a percentage in [0, 100].
    """
    for name, v in (("hm", hm), ("sm", sm)):
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"{name} must be a fraction in [0, 1], got {v!r}")
    if n_ham is not None:
        hm = _edge_corrected(hm, n_ham)
    if n_spam is not None:
        sm = _edge_corrected(sm, n_spam)
    rates = (hm, sm)
    if 0.0 in rates and 1.0 in rates:
        return float("nan")
    if 0.0 in rates:
        return 0.0
    if 1.0 in rates:
        return 100.0
    # lam = logit⁻¹((logit(hm) + logit(sm)) / 2)
    return 100.0 * _expit((_logit(hm) + _logit(sm)) / 2.0)


def _pct(part, whole):
    """100 · part / whole, NaN when there is nothing to divide by."""
    return 100.0 * part / whole if whole else float("nan")


class Confusion:
    """Counts of a three-way (ham / unsure / spam) decision against the truth.

    Attributes are ``n_<true>_<decided>`` with true in {ham, spam} and decided
    in {ham, unsure, spam}; e.g. ``n_ham_spam`` is ham filed as spam (a false
    positive).
    """

    __slots__ = (
        "n_ham_ham", "n_ham_unsure", "n_ham_spam",
        "n_spam_ham", "n_spam_unsure", "n_spam_spam",
    )

    def __init__(self, n_ham_ham, n_ham_unsure, n_ham_spam,
                 n_spam_ham, n_spam_unsure, n_spam_spam):
        self.n_ham_ham = int(n_ham_ham)
        self.n_ham_unsure = int(n_ham_unsure)
        self.n_ham_spam = int(n_ham_spam)
        self.n_spam_ham = int(n_spam_ham)
        self.n_spam_unsure = int(n_spam_unsure)
        self.n_spam_spam = int(n_spam_spam)

    @property
    def n_ham(self):
        return self.n_ham_ham + self.n_ham_unsure + self.n_ham_spam

    @property
    def n_spam(self):
        return self.n_spam_ham + self.n_spam_unsure + self.n_spam_spam

    @property
    def fp_pct(self):
        """Ham misclassification %: ham filed as spam / all ham (unsure ham excluded)."""
        return _pct(self.n_ham_spam, self.n_ham)

    @property
    def fn_pct(self):
        """Spam misclassification %: spam filed as ham / all spam (unsure spam excluded)."""
        return _pct(self.n_spam_ham, self.n_spam)

    @property
    def unsure_ham_pct(self):
        return _pct(self.n_ham_unsure, self.n_ham)

    @property
    def unsure_spam_pct(self):
        return _pct(self.n_spam_unsure, self.n_spam)

    @property
    def accuracy(self):
        """(ham→ham + spam→spam) / all; an unsure message counts as not correct."""
        n = self.n_ham + self.n_spam
        return (self.n_ham_ham + self.n_spam_spam) / n if n else float("nan")

    def as_dict(self):
        return {name: getattr(self, name) for name in self.__slots__}

    def __eq__(self, other):
        return isinstance(other, Confusion) and self.as_dict() == other.as_dict()

    def __repr__(self):
        body = ", ".join(f"{k}={v}" for k, v in self.as_dict().items())
        return f"Confusion({body})"


def confusion_at_cutoffs(y, proba, ham_cutoff, spam_cutoff, known=None):
    """Three-way decision from spam probabilities, counted against the truth.

    The rule is the filter's own (:func:`spamnb.verdict.label_for`, applied by
    :func:`spamnb.nb.decision.action_indices`), so ``evaluate`` counts what
    ``classify`` and ``filter`` decide:

    - ham    if ``proba <= ham_cutoff``;
    - spam   if ``proba > spam_cutoff``;
    - unsure otherwise, i.e. ``ham_cutoff < proba <= spam_cutoff``, and wherever
      ``known`` (optional: how many of each message's tokens the model knew) is 0.

    ``ham_cutoff == spam_cutoff`` gives a two-state filter (ham up to the cut-off,
    spam above it), e.g. ``(0.7, 0.7)`` for spamprobe; ``ham_cutoff > spam_cutoff``
    is refused. Any increasing scale works with the cut-offs on that scale.

    Returns
    -------
    Confusion
    """
    y, proba = _check(y, proba)
    if not ham_cutoff <= spam_cutoff:
        raise ValueError(f"need ham_cutoff <= spam_cutoff, got {ham_cutoff!r}, {spam_cutoff!r}")
    action = action_indices(proba, ham_cutoff, spam_cutoff, known)
    is_ham, is_unsure, is_spam = action == 0, action == 1, action == 2
    ham, spam = y == 0, y == 1
    return Confusion(
        np.count_nonzero(ham & is_ham), np.count_nonzero(ham & is_unsure),
        np.count_nonzero(ham & is_spam), np.count_nonzero(spam & is_ham),
        np.count_nonzero(spam & is_unsure), np.count_nonzero(spam & is_spam),
    )


def weighted_accuracy(confusion, lam):
    """Androutsopoulos et al.'s weighted accuracy [A00].

        WAcc_λ = (λ · n_{h→h} + n_{s→s}) / (λ · N_h + N_s)

    Each ham counts λ times; unsure messages count as not correct.
    """
    c = confusion
    # WAcc_λ = (λ·n_hh + n_ss) / (λ·N_h + N_s)
    return (lam * c.n_ham_ham + c.n_spam_spam) / (lam * c.n_ham + c.n_spam)


def total_cost_ratio(confusion, lam):
    """Androutsopoulos et al.'s total cost ratio [A00].

        TCR_λ = N_s / (λ · n_{h→s} + n_{s→h})

    The weighted cost of using no filter (every spam let through) over that
    of the filter; > 1 means the filter pays off.  ``inf`` when the filter
    makes no weighted error.  Unsure messages cost nothing here (they are
    neither misfiled ham nor spam let through as ham).
    """
    c = confusion
    denominator = lam * c.n_ham_spam + c.n_spam_ham
    # TCR_λ = N_s / (λ·n_hs + n_sh)
    return c.n_spam / denominator if denominator else float("inf")


def _finite_or_none(x):
    return None if (x is None or not math.isfinite(x)) else float(x)


def summary(y, scores, proba=None, cutoffs=None, fprs=(0.001, 0.01), known=None):
    """All metrics in one JSON-serialisable dict.

    Parameters
    ----------
    y : array-like of {0, 1}
    scores : array-like of float
        Spam scores for the ranking metrics.
    proba : array-like of float, optional
        Spam probabilities for the cut-off metrics; ``scores`` is used when
        ``cutoffs`` is given and ``proba`` is not.
    cutoffs : (ham_cutoff, spam_cutoff), optional
        Without it, only the ranking metrics are reported.
    fprs : tuple of float
        Ham misclassification rates at which spam recall is reported.
    known : array-like of int, optional
        How many of each message's tokens the model knew: none makes the message
        unsure whatever its probability, as in the filter
        (:func:`confusion_at_cutoffs`).

    Returns
    -------
    dict
        ``n_ham``, ``n_spam``, ``auc``, ``one_minus_auc_pct``,
        ``recall_at_fpr`` (a dict keyed by the rate as a string, values in
        %), and with cut-offs: the six confusion counts, ``fp_pct``,
        ``fn_pct``, ``unsure_ham_pct``, ``unsure_spam_pct``,
        ``accuracy_pct``, ``lam_pct``, ``wacc_pct`` and ``tcr`` (dicts keyed
        by λ as a string).  ``lam_pct`` is TREC's, from the binary decision
        "filed as spam or not": hm = ham→spam / N_h and sm = (spam→ham +
        spam→unsure) / N_s, with the 0.5 edge correction of :func:`lam_pct`.
        A TCR of ``None`` means infinite (no weighted error), since JSON has
        no infinity.
    """
    y, scores = _check(y, scores)
    n_ham, n_spam = _check_both_classes(y)
    out = {
        "n_ham": n_ham,
        "n_spam": n_spam,
        "auc": roc_auc(y, scores),
        "one_minus_auc_pct": one_minus_auc_pct(y, scores),
        "recall_at_fpr": {
            repr(float(f)): 100.0 * recall_at_fpr(y, scores, f) for f in fprs
        },
    }
    if cutoffs is None:
        return out
    ham_cutoff, spam_cutoff = cutoffs
    c = confusion_at_cutoffs(y, scores if proba is None else proba,
                             ham_cutoff, spam_cutoff, known)
    out["cutoffs"] = [float(ham_cutoff), float(spam_cutoff)]
    out.update(c.as_dict())
    out["fp_pct"] = c.fp_pct
    out["fn_pct"] = c.fn_pct
    out["unsure_ham_pct"] = c.unsure_ham_pct
    out["unsure_spam_pct"] = c.unsure_spam_pct
    out["accuracy_pct"] = 100.0 * c.accuracy
    hm = c.n_ham_spam / n_ham
    sm = (c.n_spam_ham + c.n_spam_unsure) / n_spam
    out["lam_pct"] = lam_pct(hm, sm, n_ham=n_ham, n_spam=n_spam)
    out["wacc_pct"] = {str(lam): 100.0 * weighted_accuracy(c, lam) for lam in LAMBDAS}
    out["tcr"] = {str(lam): _finite_or_none(total_cost_ratio(c, lam)) for lam in LAMBDAS}
    return out


def _resamples(y, n, seed):
    """The ``n`` stratified bootstrap resamples, as index arrays into ``y``.

    The one rule of both bootstraps here: ham and spam drawn apart, with
    replacement, as many of each as there are, so both classes are always there
    and rates keep their denominators (a plain resample of a set with 30 ham could
    hold 24 or 36, and recall at 0.1% FP would jump with it).
    """
    rng = np.random.default_rng(seed)
    ham, spam = np.flatnonzero(y == 0), np.flatnonzero(y == 1)
    for _ in range(n):
        yield np.concatenate([rng.choice(ham, ham.size), rng.choice(spam, spam.size)])


def _percentile_interval(values, level):
    """The central ``level`` interval of bootstrap replicates (percentile method)."""
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


def paired_bootstrap(y, scores_a, scores_b, statistic, *, n=1000, seed=0, level=0.95):
    """The difference ``statistic(y, scores_b) − statistic(y, scores_a)`` and its
    bootstrap interval, the two filters scored on the same messages.

    Each of ``n`` resamples draws ham and spam separately, with replacement, as
    many of each as there are (so both classes are always there, and rates keep
    their denominators); both filters are measured on the same resample, which
    is what makes the interval of a *difference* narrow when the two agree on
    most messages. Returns ``(difference, low, high)`` with the central
    ``level`` interval (percentile method).

    ``statistic(y, scores)``: any of this module's metrics, e.g.
    :func:`one_minus_auc_pct` or ``lambda y, s: recall_at_fpr(y, s, 0.001)``.
    """
    y = np.asarray(y)
    a, b = np.asarray(scores_a, dtype=float), np.asarray(scores_b, dtype=float)
    if not (y.shape == a.shape == b.shape):
        raise ValueError("y and both score arrays must have the same length")
    _check_both_classes(y)
    diffs = [statistic(y[idx], b[idx]) - statistic(y[idx], a[idx]) for idx in _resamples(y, n, seed)]
    low, high = _percentile_interval(diffs, level)
    return statistic(y, b) - statistic(y, a), low, high


class _Ranked:
    """Ham and spam scores sorted once, for the statistics of many resamples.

    A resample is a row of weights: how many times it drew each ham (``wh``, in
    ascending ham score order) and each spam (``ws``, ascending spam scores). A
    statistic of weights costs a cumulative sum, not a sort, and counts exactly
    what the rank formulas count on the resampled messages themselves.
    """

    def __init__(self, y, scores):
        self.ham_order = np.flatnonzero(y == 0)[np.argsort(scores[y == 0], kind="mergesort")]
        self.spam_order = np.flatnonzero(y == 1)[np.argsort(scores[y == 1], kind="mergesort")]
        self.ham, self.spam = scores[self.ham_order], scores[self.spam_order]
        # for each spam, the ham strictly below it and the ham at or below it
        self.below = np.searchsorted(self.ham, self.spam, "left")
        self.at_or_below = np.searchsorted(self.ham, self.spam, "right")

    def weights(self, resamples, size):
        """(ham weights, spam weights), one row per resample (index arrays)."""
        counts = np.stack([np.bincount(idx, minlength=size) for idx in resamples])
        return counts[:, self.ham_order], counts[:, self.spam_order]

    def one_minus_auc_pct(self, wh, ws):
        """100 · (1 − U / (n_h · n_s)) per row, U the Mann-Whitney count of :func:`roc_auc`:

            2U = Σ_spam w_s · (ham strictly below + ham at or below)

        (a tied pair counts half), all in integers, so exact."""
        cum = np.concatenate([np.zeros((wh.shape[0], 1), dtype=wh.dtype), np.cumsum(wh, axis=1)], axis=1)
        twice_u = (ws * (cum[:, self.below] + cum[:, self.at_or_below])).sum(axis=1)
        return 100.0 * (1.0 - twice_u / (2.0 * self.ham.size * self.spam.size))

    def recall_pct(self, wh, ws, fpr):
        """100 · :func:`recall_at_fpr` per row: c is the (k+1)-th highest ham drawn,
        k = floor(fpr · n_h); the spam drawn strictly above c are caught."""
        k = int(math.floor(fpr * self.ham.size + 1e-9))  # as recall_at_fpr, same epsilon
        if k >= self.ham.size:
            return np.full(wh.shape[0], 100.0)
        from_top = np.cumsum(wh[:, ::-1], axis=1)
        c = self.ham[::-1][np.argmax(from_top > k, axis=1)]  # first place more than k ham are drawn
        cum = np.concatenate([np.zeros((ws.shape[0], 1), dtype=ws.dtype), np.cumsum(ws, axis=1)], axis=1)
        not_caught = cum[np.arange(ws.shape[0]), np.searchsorted(self.spam, c, "right")]
        return 100.0 * (self.spam.size - not_caught) / self.spam.size


def bootstrap_intervals(y, scores, *, fprs=(0.001, 0.01), n=200, seed=0, level=0.95, chunk=50):
    """Stratified bootstrap intervals of (1-AUC)% and of spam recall (%) at ``fprs``.

    The resamples are :func:`paired_bootstrap`'s (same rule, same ``seed``, same
    draws); each statistic is computed on each resample exactly as on the
    messages themselves, and the interval is the central ``level`` share of the
    ``n`` values (percentile method). What it tells: how much the figure would
    move on another set of mail like this one, drawn the same way; it knows
    nothing of label errors or of mail unlike the set. Vectorised over ``chunk``
    resamples at a time (memory: ``chunk`` rows of one count per message).

    Returns a JSON-serialisable dict: ``level``, ``resamples``, ``seed``,
    ``one_minus_auc_pct`` = [low, high], and ``recall_at_fpr`` = {rate as in
    :func:`summary`: [low, high]}.
    """
    y, scores = _check(y, scores)
    _check_both_classes(y)
    ranked = _Ranked(y, scores)
    auc, recall = [], {f: [] for f in fprs}
    draws = _resamples(y, n, seed)
    for start in range(0, n, chunk):
        wh, ws = ranked.weights([next(draws) for _ in range(min(chunk, n - start))], y.size)
        auc.append(ranked.one_minus_auc_pct(wh, ws))
        for f in fprs:
            recall[f].append(ranked.recall_pct(wh, ws, f))
    return {
        "level": level, "resamples": n, "seed": seed,
        "one_minus_auc_pct": list(_percentile_interval(np.concatenate(auc), level)),
        "recall_at_fpr": {repr(float(f)): list(_percentile_interval(np.concatenate(v), level))
                          for f, v in recall.items()},
    }


def proportion_interval(k, n, level=0.95):
    """Clopper-Pearson (exact binomial) interval of a rate of ``k`` in ``n``, in %.

    Used instead of the bootstrap where the rate can be 0: a percentile bootstrap of
    0 misfiled of 30 ham is [0, 0], which promises what 30 messages cannot show; this
    interval is [0, 11.6] %, what 30 messages can show.
    """
    from scipy.stats import beta

    if not 0 <= k <= n or n <= 0:
        raise ValueError(f"need 0 <= k <= n and n > 0, got k={k!r}, n={n!r}")
    tail = (1 - level) / 2
    low = beta.ppf(tail, k, n - k + 1) if k > 0 else 0.0
    high = beta.ppf(1 - tail, k + 1, n - k) if k < n else 1.0
    return 100.0 * float(low), 100.0 * float(high)


def decision_intervals(y, proba, ham_cutoff, spam_cutoff, known=None, *, level=0.95):
    """What a user reads off a filter, each with its exact interval
    (:func:`proportion_interval`): the share of ham it would not leave in the inbox
    (filed unsure or spam) and the share of spam it files as spam, in %, at the
    cut-offs (:func:`confusion_at_cutoffs`'s rule).

    Returns ``{"ham_misfiled_pct": (value, low, high), "spam_caught_pct": (value,
    low, high), "confusion": Confusion, "level": level}``.
    """
    c = confusion_at_cutoffs(y, proba, ham_cutoff, spam_cutoff, known)
    _check_both_classes(np.asarray(y))
    misfiled, caught = c.n_ham_unsure + c.n_ham_spam, c.n_spam_spam
    return {
        "ham_misfiled_pct": (_pct(misfiled, c.n_ham), *proportion_interval(misfiled, c.n_ham, level)),
        "spam_caught_pct": (_pct(caught, c.n_spam), *proportion_interval(caught, c.n_spam, level)),
        "confusion": c, "level": level,
    }


def misordered_pairs(y, scores):
    """For each message, the (spam, ham) pairs it is in that the scores misorder.

    A ham's count is the spam scored at or below it; a spam's, the ham scored at
    or above it (a tie is misordered: no threshold separates the two). Also
    returned, each message's share of (1-AUC)% (a tie counts half there, as in
    :func:`roc_auc`), so the shares of all ham, and those of all spam, each sum
    to (1-AUC)%:

        share_i = 100 · (strictly misordered_i + ties_i / 2) / (n_h · n_s)

    Example: y = (0, 0, 1, 1), scores (0.1, 0.9, 0.5, 0.8): the ham at 0.9 is
    above both spam (2 pairs, 50 of the (1-AUC)% = 50), the ham at 0.1 below
    both (0); each spam is below one ham (1 pair, 25).

    Returns ``(counts, share_pct)``, arrays in the input order.
    """
    y, scores = _check(y, scores)
    n_ham, n_spam = _check_both_classes(y)
    ham, spam = np.sort(scores[y == 0]), np.sort(scores[y == 1])
    counts, ties = np.empty(y.size, dtype=np.int64), np.empty(y.size, dtype=np.int64)
    h, s = y == 0, y == 1
    counts[h] = np.searchsorted(spam, scores[h], "right")  # spam at or below the ham
    ties[h] = counts[h] - np.searchsorted(spam, scores[h], "left")
    counts[s] = n_ham - np.searchsorted(ham, scores[s], "left")  # ham at or above the spam
    ties[s] = counts[s] - (n_ham - np.searchsorted(ham, scores[s], "right"))
    return counts, 100.0 * (counts - ties / 2.0) / (n_ham * n_spam)


def worst_ranked(y, scores, n=5):
    """The ``n`` highest-scored ham and the ``n`` lowest-scored spam, worst first.

    Returns ``(ham, spam)``, each a list of ``(index, misordered pairs, share of
    (1-AUC)%)`` (:func:`misordered_pairs`); a message that misorders no pair is
    left out, so a perfect ranking gives two empty lists. Ties in score keep the
    input order.
    """
    y, scores = _check(y, scores)
    counts, share = misordered_pairs(y, scores)
    out = []
    for label, sign in ((0, -1.0), (1, 1.0)):
        idx = np.flatnonzero(y == label)
        idx = idx[np.argsort(sign * scores[idx], kind="mergesort")][:n]
        out.append([(int(i), int(counts[i]), float(share[i])) for i in idx if counts[i]])
    return tuple(out)
