"""Metrics against hand-computed values, with scikit-learn as an extra oracle."""

import json
import math

import numpy as np
import pytest

from spamnb.evaluation.metrics import (
    Confusion,
    confusion_at_cutoffs,
    lam_pct,
    one_minus_auc_pct,
    recall_at_fpr,
    roc_auc,
    roc_curve,
    summary,
    total_cost_ratio,
    weighted_accuracy,
)

# ham 0.1, 0.4, 0.4; spam 0.4, 0.8.  Of the 6 (spam, ham) pairs, spam 0.8
# wins 3; spam 0.4 wins against 0.1 and ties twice (2 x 1/2): AUC = 5/6.
Y_TIES = [0, 0, 0, 1, 1]
S_TIES = [0.1, 0.4, 0.4, 0.4, 0.8]


def test_auc_with_ties_by_hand():
    assert roc_auc(Y_TIES, S_TIES) == pytest.approx(5 / 6)
    assert one_minus_auc_pct(Y_TIES, S_TIES) == pytest.approx(100 / 6)


def test_auc_extremes_and_invariance():
    assert roc_auc([0, 0, 1, 1], [0.1, 0.2, 0.3, 0.4]) == 1.0
    assert roc_auc([0, 0, 1, 1], [0.4, 0.3, 0.2, 0.1]) == 0.0
    assert roc_auc([0, 1, 0, 1], [7, 7, 7, 7]) == 0.5
    # a monotone transform (probability -> log-odds) leaves the AUC unchanged
    p = np.array([0.1, 0.4, 0.4, 0.4, 0.8])
    assert roc_auc(Y_TIES, np.log(p / (1 - p))) == pytest.approx(5 / 6)


def test_auc_rejects_bad_input():
    with pytest.raises(ValueError, match="both classes"):
        roc_auc([1, 1], [0.1, 0.2])
    with pytest.raises(ValueError, match="differ in length"):
        roc_auc([0, 1], [0.1])
    with pytest.raises(ValueError, match="only 0"):
        roc_auc([0, 2], [0.1, 0.2])
    with pytest.raises(ValueError, match="NaN"):
        roc_auc([0, 1], [0.1, float("nan")])


def test_roc_curve_merges_ties():
    fpr, tpr, thr = roc_curve(Y_TIES, S_TIES)
    np.testing.assert_allclose(thr, [np.inf, 0.8, 0.4, 0.1])
    np.testing.assert_allclose(fpr, [0, 0, 2 / 3, 1])
    np.testing.assert_allclose(tpr, [0, 0.5, 1, 1])
    # trapezoid area under the merged curve is the tie-as-half AUC
    assert np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2) == pytest.approx(5 / 6)


def test_recall_at_fpr_worked_example():
    # ham 0.9 0.5 0.1 0.1; spam 0.95 0.9 0.6 0.2 (the docstring's example)
    y = [0, 0, 0, 0, 1, 1, 1, 1]
    s = [0.9, 0.5, 0.1, 0.1, 0.95, 0.9, 0.6, 0.2]
    # fpr 0.25: k = 1 ham may be misfiled, threshold strictly above 0.5
    assert recall_at_fpr(y, s, 0.25) == 0.75
    # fpr 0.2: k = floor(0.8) = 0, strictly above 0.9; the spam tied at 0.9 is not caught
    assert recall_at_fpr(y, s, 0.2) == 0.25
    assert recall_at_fpr(y, s, 0.0) == 0.25
    # fpr 0.5: k = 2, strictly above the third ham (0.1): 0.95 0.9 0.6 0.2 all caught
    assert recall_at_fpr(y, s, 0.5) == 1.0
    assert recall_at_fpr(y, s, 1.0) == 1.0


def test_recall_at_fpr_k_is_floor_without_float_noise():
    # 0.001 * 4000 = 3.9999999999999996 in floating point; k must still be 4
    n_ham = 4000
    ham = np.arange(n_ham, dtype=float)  # top ham scores 3999, 3998, 3997, 3996, 3995
    spam = np.array([3995.5, 3994.5])
    y = np.r_[np.zeros(n_ham), np.ones(2)].astype(int)
    s = np.r_[ham, spam]
    # k = 4: threshold strictly above the 5th highest ham (3995)
    assert recall_at_fpr(y, s, 0.001) == 0.5


def test_lam_by_hand():
    # equal rates: lam equals them
    assert lam_pct(0.1, 0.1) == pytest.approx(10.0)
    # hm = 1%, sm = 25%: logit(0.01) = -ln 99, logit(0.25) = -ln 3; their mean is
    # -ln sqrt(297), so the odds are 1/sqrt(297) and lam = 1 / (1 + sqrt(297)):
    # sqrt(297) = 17.233687939614086..., lam = 100 / 18.233687939614086... = 5.48435403...%
    assert lam_pct(0.01, 0.25) == pytest.approx(100 / (1 + math.sqrt(297)), rel=1e-12)
    assert lam_pct(0.01, 0.25) == pytest.approx(5.48435403, abs=1e-8)
    assert lam_pct(0.25, 0.01) == lam_pct(0.01, 0.25)


def test_lam_edges():
    # with class sizes: 0 errors of 100 ham become 0.5/100, odds 1/199;
    # sm = 2% has odds 1/49; lam = 1 / (1 + sqrt(199 * 49))
    assert lam_pct(0.0, 0.02, n_ham=100, n_spam=50) == pytest.approx(
        100 / (1 + 7 * math.sqrt(199))
    )
    # all spam missed out of 10: (10 - 0.5)/10
    assert lam_pct(0.5, 1.0, n_ham=4, n_spam=10) == pytest.approx(
        100 / (1 + math.sqrt(1 / 19))
    )
    # without sizes: the limits
    assert lam_pct(0.0, 0.3) == 0.0
    assert lam_pct(1.0, 0.3) == 100.0
    assert math.isnan(lam_pct(0.0, 1.0))
    with pytest.raises(ValueError):
        lam_pct(1.5, 0.1)


def _three_way_example():
    # ham: 95 at 0.1, 3 unsure at 0.5, 2 at 0.995; spam: 5 at 0.2, 5 at 0.7, 40 at 0.999
    y = np.r_[np.zeros(100), np.ones(50)].astype(int)
    p = np.r_[[0.1] * 95, [0.5] * 3, [0.995] * 2, [0.2] * 5, [0.7] * 5, [0.999] * 40]
    return y, p


def test_confusion_three_way():
    y, p = _three_way_example()
    c = confusion_at_cutoffs(y, p, 0.45, 0.99)
    assert c == Confusion(95, 3, 2, 5, 5, 40)
    assert c.fp_pct == pytest.approx(2.0)
    assert c.fn_pct == pytest.approx(10.0)
    assert c.unsure_ham_pct == pytest.approx(3.0)
    assert c.unsure_spam_pct == pytest.approx(10.0)
    assert c.accuracy == pytest.approx(135 / 150)


def test_confusion_boundaries_and_two_state():
    y = [0, 0, 1, 1]
    p = [0.45, 0.99, 0.46, 0.98]
    # the filter's rule: <= ham_cutoff is ham, > spam_cutoff is spam, else unsure (P on the
    # spam cut-off too: 0.99 is unsure, not spam)
    assert confusion_at_cutoffs(y, p, 0.45, 0.99) == Confusion(1, 1, 0, 0, 2, 0)
    assert confusion_at_cutoffs(y, p, 0.45, 0.98) == Confusion(1, 0, 1, 0, 2, 0)
    # ham_cutoff == spam_cutoff: two-state, ham up to the cut-off, spam above it
    assert confusion_at_cutoffs(y, p, 0.7, 0.7) == Confusion(1, 0, 1, 1, 0, 1)
    assert confusion_at_cutoffs(y, p, 0.46, 0.46) == Confusion(1, 0, 1, 1, 0, 1)
    # cut-offs (0.5, 1.0): P = 1.0 is unsure in the filter, so here too
    assert confusion_at_cutoffs([0, 1], [0.5, 1.0], 0.5, 1.0) == Confusion(1, 0, 0, 0, 1, 0)
    # no known token: unsure whatever P says
    assert confusion_at_cutoffs(y, p, 0.7, 0.7, known=[0, 3, 0, 1]) == Confusion(0, 1, 1, 0, 1, 1)
    with pytest.raises(ValueError, match="ham_cutoff <= spam_cutoff"):
        confusion_at_cutoffs(y, p, 0.8, 0.7)


def test_confusion_counts_the_labels_of_label_for_at_the_cutoffs():
    """The vectorised rule (action_indices, behind confusion_at_cutoffs, summary and the
    plot's marks) is spamnb.verdict.label_for, on and next to every cut-off."""
    from spamnb.nb.decision import ACTIONS, action_indices
    from spamnb.verdict import label_for

    pairs = [(0.5, 0.95), (0.45, 0.99), (10 / 11, 10 / 11), (0.0, 0.0), (1.0, 1.0), (0.0, 1.0),
             (0.5, 1.0), (0.3, 0.3000000000000001)]
    for ham_cut, spam_cut in pairs:
        edges = {0.0, 1.0, 0.5}
        for c in (ham_cut, spam_cut):
            edges |= {c, np.nextafter(c, 0.0), np.nextafter(c, 1.0)}
        p = np.array(sorted(edges))
        for known in (None, np.arange(p.size) % 3):
            want = [label_for(x, (ham_cut, spam_cut), None if known is None else int(k))
                    for x, k in zip(p, known if known is not None else [None] * p.size)]
            got = action_indices(p, ham_cut, spam_cut, known)
            assert [ACTIONS[i] for i in got] == want, (ham_cut, spam_cut, known)
            for truth in (0, 1):
                c = confusion_at_cutoffs(np.full(p.size, truth), p, ham_cut, spam_cut, known)
                name = ("ham", "spam")[truth]
                assert [getattr(c, f"n_{name}_{a}") for a in ACTIONS] == [want.count(a) for a in ACTIONS]


def test_weighted_accuracy_and_tcr_by_hand():
    c = Confusion(95, 3, 2, 5, 5, 40)
    # WAcc_λ = (λ n_hh + n_ss) / (λ N_h + N_s)
    assert weighted_accuracy(c, 1) == pytest.approx(135 / 150)
    assert weighted_accuracy(c, 9) == pytest.approx((9 * 95 + 40) / (9 * 100 + 50))
    assert weighted_accuracy(c, 999) == pytest.approx((999 * 95 + 40) / (999 * 100 + 50))
    # TCR_λ = N_s / (λ n_hs + n_sh)
    assert total_cost_ratio(c, 1) == pytest.approx(50 / 7)
    assert total_cost_ratio(c, 9) == pytest.approx(50 / 23)
    assert total_cost_ratio(c, 999) == pytest.approx(50 / 2003)
    assert total_cost_ratio(Confusion(10, 0, 0, 0, 1, 9), 999) == math.inf


def test_summary_is_json_and_consistent():
    y, p = _three_way_example()
    out = summary(y, p, cutoffs=(0.45, 0.99))
    json.dumps(out, allow_nan=False)
    assert out["n_ham"] == 100 and out["n_spam"] == 50
    assert out["n_ham_spam"] == 2 and out["n_spam_unsure"] == 5
    assert out["fp_pct"] == pytest.approx(2.0)
    assert out["tcr"]["9"] == pytest.approx(50 / 23)
    # lam from "filed as spam or not": hm = 2/100, sm = (5 + 5)/50
    assert out["lam_pct"] == pytest.approx(lam_pct(0.02, 0.2))
    assert out["auc"] == pytest.approx(roc_auc(y, p))
    assert set(out["recall_at_fpr"]) == {"0.001", "0.01"}
    perfect = summary([0, 1], [0.0, 1.0], cutoffs=(0.5, 0.5))
    assert perfect["tcr"]["999"] is None
    json.dumps(perfect, allow_nan=False)
    assert "lam_pct" not in summary(y, p)


def test_sklearn_oracle():
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(7)
    for _ in range(20):
        n = int(rng.integers(5, 300))
        y = rng.integers(0, 2, n)
        y[:2] = [0, 1]
        s = rng.integers(0, 12, n) / 11.0  # heavy ties
        assert roc_auc(y, s) == pytest.approx(metrics.roc_auc_score(y, s))
        fpr, tpr, _ = roc_curve(y, s)
        sk_fpr, sk_tpr, _ = metrics.roc_curve(y, s, drop_intermediate=False)
        np.testing.assert_allclose(fpr, sk_fpr)
        np.testing.assert_allclose(tpr, sk_tpr)


def test_paired_bootstrap_of_a_difference():
    from spamnb.evaluation.metrics import one_minus_auc_pct, paired_bootstrap

    rng = np.random.default_rng(3)
    y = np.array([0] * 300 + [1] * 100)
    a = rng.normal(size=400) + 2.0 * y
    # the same filter: difference exactly 0, interval [0, 0]
    assert paired_bootstrap(y, a, a, one_minus_auc_pct, n=200) == (0.0, 0.0, 0.0)
    # a clearly better one: the whole interval below 0, around the observed difference
    b = a + 2.0 * y
    d, low, high = paired_bootstrap(y, a, b, one_minus_auc_pct, n=300)
    assert d == pytest.approx(one_minus_auc_pct(y, b) - one_minus_auc_pct(y, a))
    assert low <= d <= high < 0
    # one message changed: an interval that holds 0 (noise)
    c = a.copy()
    c[0] += 0.5
    d, low, high = paired_bootstrap(y, a, c, one_minus_auc_pct, n=300)
    assert low <= 0 <= high


def _scored(n_ham, n_spam, seed=3, separation=2.0):
    """Normal scores, spam shifted by ``separation``: a ranking with some misordered pairs."""
    rng = np.random.default_rng(seed)
    y = np.array([0] * n_ham + [1] * n_spam)
    return y, rng.normal(size=y.size) + separation * y


def test_bootstrap_intervals_are_the_paired_bootstraps_resamples():
    """Each statistic on each resample is what the rank formulas give on the resampled
    messages themselves: paired against constant scores ((1-AUC)% exactly 50, recall
    exactly 0), paired_bootstrap measures one filter on the same draws, slowly."""
    from spamnb.evaluation.metrics import bootstrap_intervals, paired_bootstrap

    y, s = _scored(300, 100)
    s = np.round(s, 1)  # ties, counted half
    flat = np.zeros(y.size)
    iv = bootstrap_intervals(y, s, n=150, seed=5, fprs=(0.001, 0.01, 0.1))
    _, low, high = paired_bootstrap(y, flat, s, one_minus_auc_pct, n=150, seed=5)
    assert iv["one_minus_auc_pct"] == [pytest.approx(low + 50, abs=1e-9), pytest.approx(high + 50, abs=1e-9)]
    for f in (0.001, 0.01, 0.1):
        _, low, high = paired_bootstrap(y, flat, s, lambda y_, s_: 100 * recall_at_fpr(y_, s_, f), n=150, seed=5)
        assert iv["recall_at_fpr"][repr(f)] == [pytest.approx(low, abs=1e-9), pytest.approx(high, abs=1e-9)]
    assert (iv["level"], iv["resamples"], iv["seed"]) == (0.95, 150, 5)
    # resampled in chunks or all at once: the same draws, the same interval
    assert bootstrap_intervals(y, s, n=150, seed=5, fprs=(0.001, 0.01, 0.1), chunk=7) == iv


def test_bootstrap_interval_holds_the_figure_is_seeded_and_narrows_with_more_mail():
    from spamnb.evaluation.metrics import bootstrap_intervals

    y, s = _scored(400, 200)
    iv = bootstrap_intervals(y, s, n=300, seed=1, fprs=(0.01, 0.1))
    low, high = iv["one_minus_auc_pct"]
    assert low < one_minus_auc_pct(y, s) < high
    for f in (0.01, 0.1):
        low, high = iv["recall_at_fpr"][repr(f)]
        assert low <= 100 * recall_at_fpr(y, s, f) <= high and low < high
    assert bootstrap_intervals(y, s, n=300, seed=1, fprs=(0.01, 0.1)) == iv  # deterministic with a seed
    assert bootstrap_intervals(y, s, n=300, seed=2, fprs=(0.01, 0.1)) != iv
    # sixteen times the mail of the same kind: about a quarter of the width (1/sqrt(16))
    y16, s16 = _scored(6400, 3200)
    wide, narrow = iv["one_minus_auc_pct"], bootstrap_intervals(y16, s16, n=300, seed=1)["one_minus_auc_pct"]
    assert 0.15 < (narrow[1] - narrow[0]) / (wide[1] - wide[0]) < 0.4
    assert narrow[0] < one_minus_auc_pct(y16, s16) < narrow[1]


def test_bootstrap_interval_of_a_perfect_ranking_is_a_point():
    from spamnb.evaluation.metrics import bootstrap_intervals

    iv = bootstrap_intervals([0, 0, 0, 1, 1], [0.1, 0.2, 0.3, 0.8, 0.9], n=50)
    assert iv["one_minus_auc_pct"] == [0.0, 0.0]
    assert iv["recall_at_fpr"] == {"0.001": [100.0, 100.0], "0.01": [100.0, 100.0]}
    with pytest.raises(ValueError, match="both classes"):
        bootstrap_intervals([1, 1], [0.1, 0.2])


def test_misordered_pairs_by_hand():
    from spamnb.evaluation.metrics import misordered_pairs, worst_ranked

    # ham 0.1 and 0.9, spam 0.5 and 0.8: the ham at 0.9 is above both spam (2 pairs), the
    # ham at 0.1 below both (0); each spam is below one ham (1). AUC = 2/4, (1-AUC)% = 50:
    # all of it the ham at 0.9's, a half each spam's.
    y, s = [0, 0, 1, 1], [0.1, 0.9, 0.5, 0.8]
    counts, share = misordered_pairs(y, s)
    assert counts.tolist() == [0, 2, 1, 1]
    assert share.tolist() == [0.0, 50.0, 25.0, 25.0]
    assert one_minus_auc_pct(y, s) == 50.0
    assert worst_ranked(y, s, n=5) == ([(1, 2, 50.0)], [(2, 1, 25.0), (3, 1, 25.0)])
    assert worst_ranked(y, s, n=1) == ([(1, 2, 50.0)], [(2, 1, 25.0)])
    # Y_TIES: ham 0.1, 0.4, 0.4; spam 0.4, 0.8. A tie is misordered in the count (no
    # threshold separates the two) and half in the share, as in the AUC: each ham at 0.4
    # ties the spam at 0.4 (1 pair, 1/2 of 6 pairs = 8.33%); that spam ties both (2, 16.67%).
    counts, share = misordered_pairs(Y_TIES, S_TIES)
    assert counts.tolist() == [0, 1, 1, 2, 0]
    np.testing.assert_allclose(share, [0, 100 / 12, 100 / 12, 100 / 6, 0])
    assert worst_ranked(Y_TIES, S_TIES, n=2) == ([(1, 1, pytest.approx(100 / 12)), (2, 1, pytest.approx(100 / 12))],
                                                 [(3, 2, pytest.approx(100 / 6))])


def test_shares_of_misordered_pairs_sum_to_one_minus_auc():
    from spamnb.evaluation.metrics import misordered_pairs

    y, s = _scored(500, 200)
    s = np.round(s, 1)
    counts, share = misordered_pairs(y, s)
    assert share[y == 0].sum() == pytest.approx(one_minus_auc_pct(y, s), rel=1e-12)
    assert share[y == 1].sum() == pytest.approx(one_minus_auc_pct(y, s), rel=1e-12)
    # the pair counts against all pairs, by brute force
    ham, spam = s[y == 0], s[y == 1]
    assert counts[y == 0].tolist() == [int((spam <= h).sum()) for h in ham]
    assert counts[y == 1].tolist() == [int((ham >= x).sum()) for x in spam]
