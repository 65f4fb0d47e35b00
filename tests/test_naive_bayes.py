"""Tests for spamnb.nb.naive_bayes: hand-computed posteriors, sklearn as oracle,
incremental learning invariants, λ = 0 edge cases, sparse-only memory."""

import math
import tracemalloc
import warnings
from fractions import Fraction as F

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from spamnb.nb.naive_bayes import BernoulliNB, CategoricalNB, ComplementNB, GaussianNB, MultinomialNB

COUNT_MODELS = [MultinomialNB, BernoulliNB, ComplementNB]


def posterior(prior, likelihood):
    """Exact P(c|x) = P(c)·P(x|c) / Σ_k P(c_k)·P(x|c_k) (Fractions)."""
    joint = [p * lik for p, lik in zip(prior, likelihood)]
    total = sum(joint)
    return [j / total for j in joint]


def prod(fs):
    out = F(1)
    for f in fs:
        out *= f
    return out


def assert_proba(got, expected):
    np.testing.assert_allclose(got, np.array([float(e) for e in expected]), rtol=0, atol=1e-14)


@pytest.fixture(autouse=True)
def _no_numpy_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        yield


# --------------------------------------------------------------------------- hand-computed

# class 0 ("A"): [2,0,1,0], [1,1,0,0]; class 1 ("B"): [0,2,1,0]; word 3 never seen.
X_MN = np.array([[2, 0, 1, 0], [1, 1, 0, 0], [0, 2, 1, 0]])
Y_MN = np.array([0, 0, 1])
PRIOR_MN = [F(2, 3), F(1, 3)]


def mn_likelihood(theta, x):
    return [prod(t**k for t, k in zip(th, x)) for th in theta]


def test_multinomial_laplace_by_hand():
    # counts A [3,1,1,0] (5 words), B [0,2,1,0] (3 words); |V| = 4, λ = 1
    theta = [[F(4, 9), F(2, 9), F(2, 9), F(1, 9)], [F(1, 7), F(3, 7), F(2, 7), F(1, 7)]]
    m = MultinomialNB(alpha=1).fit(X_MN, Y_MN)
    np.testing.assert_allclose(np.exp(m.feature_log_prob_), [[float(t) for t in r] for r in theta], atol=1e-15)
    for x in ([1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 0, 3], [5, 0, 2, 1]):
        assert_proba(m.predict_proba([x])[0], posterior(PRIOR_MN, mn_likelihood(theta, x)))


def test_multinomial_ml_by_hand():
    theta = [[F(3, 5), F(1, 5), F(1, 5), F(0)], [F(0), F(2, 3), F(1, 3), F(0)]]
    m = MultinomialNB(alpha=0).fit(X_MN, Y_MN)
    assert np.isneginf(m.feature_log_prob_[1, 0]) and not np.isnan(m.feature_log_prob_).any()
    p = m.predict_proba([[1, 1, 0, 0]])[0]  # word 0 never seen in B: B ruled out
    assert p[1] == 0.0 and p[0] == 1.0
    assert_proba(m.predict_proba([[0, 1, 1, 0]])[0], posterior(PRIOR_MN, mn_likelihood(theta, [0, 1, 1, 0])))
    assert_proba(m.predict_proba([[0, 1, 1, 0]])[0], [F(9, 34), F(25, 34)])
    # word 3 never seen at all: every class ruled out -> documented fallback to the prior
    assert_proba(m.predict_proba([[0, 0, 0, 1]])[0], PRIOR_MN)
    assert m.predict([[0, 0, 0, 1]])[0] == 0
    assert np.isneginf(m.predict_joint_log_proba([[0, 0, 0, 1]])).all()


X_BE = np.array([[1, 0, 1], [1, 1, 0], [0, 1, 1]])
Y_BE = np.array([0, 0, 1])


def be_likelihood(p, x):
    return [prod(pc if xi else 1 - pc for pc, xi in zip(row, x)) for row in p]


def test_bernoulli_laplace_by_hand():
    # N_A = 2, m_A = [2,1,1]; N_B = 1, m_B = [0,1,1]; p = (m + 1)/(N + 2)
    p = [[F(3, 4), F(2, 4), F(2, 4)], [F(1, 3), F(2, 3), F(2, 3)]]
    m = BernoulliNB(alpha=1).fit(X_BE, Y_BE)
    for x in ([1, 0, 0], [0, 1, 1], [0, 0, 0], [1, 1, 1]):
        assert_proba(m.predict_proba([x])[0], posterior(PRIOR_MN, be_likelihood(p, x)))
    assert_proba(m.predict_proba([[1, 0, 0]])[0], posterior(PRIOR_MN, [F(3, 16), F(1, 27)]))


def test_bernoulli_ml_by_hand():
    p = [[F(1), F(1, 2), F(1, 2)], [F(0), F(1), F(1)]]
    m = BernoulliNB(alpha=0).fit(X_BE, Y_BE)
    assert_proba(m.predict_proba([[1, 1, 1]])[0], [1, 0])  # word 0 present: p_B0 = 0
    assert_proba(m.predict_proba([[0, 1, 1]])[0], [0, 1])  # word 0 absent: p_A0 = 1
    assert_proba(m.predict_proba([[1, 1, 0]])[0], posterior(PRIOR_MN, be_likelihood(p, [1, 1, 0])))
    # absent w0 rules out A, absent w1 rules out B -> prior
    assert_proba(m.predict_proba([[0, 0, 0]])[0], PRIOR_MN)


def test_complement_by_hand():
    # θ̃_A from B's counts [0,2,1,0], θ̃_B from A's [3,1,1,0]; exp(score_c) = Π θ̃_cw^(−x_w)
    for lam, tA, tB in [
        (1, [F(1, 7), F(3, 7), F(2, 7), F(1, 7)], [F(4, 9), F(2, 9), F(2, 9), F(1, 9)]),
    ]:
        m = ComplementNB(alpha=lam).fit(X_MN, Y_MN)
        for x in ([1, 1, 0, 0], [0, 1, 1, 0], [2, 0, 1, 3]):
            e = [prod(t ** (-k) for t, k in zip(th, x)) for th in (tA, tB)]
            assert_proba(m.predict_proba([x])[0], [ei / sum(e) for ei in e])
    assert_proba(ComplementNB(alpha=1).fit(X_MN, Y_MN).predict_proba([[1, 1, 0, 0]])[0],
                 [F(49, 3) / (F(49, 3) + F(81, 8)), F(81, 8) / (F(49, 3) + F(81, 8))])


def test_complement_ml_limit():
    m = ComplementNB(alpha=0).fit(X_MN, Y_MN)
    assert np.isposinf(m.feature_log_prob_[0, 0]) and not np.isnan(m.feature_log_prob_).any()
    assert_proba(m.predict_proba([[0, 1, 0, 0]])[0], [F(3, 13), F(10, 13)])  # 3/2 : 5
    # word 0 only ever seen in A: θ̃_A0 = 0, infinite weight -> A certain
    assert_proba(m.predict_proba([[1, 1, 0, 0]])[0], [1, 0])
    # word 3 never seen: infinite for both, tie -> finite parts decide (both 0)
    assert_proba(m.predict_proba([[0, 0, 0, 1]])[0], [F(1, 2), F(1, 2)])
    mn = ComplementNB(alpha=0, norm=True).fit(X_MN, Y_MN)
    assert np.isfinite(mn.feature_log_prob_).all()
    assert np.isfinite(mn.predict_log_proba(X_MN)).any(axis=1).all()


X_CAT = np.array([[0, 1], [2, 1], [1, 0]])
Y_CAT = np.array([0, 0, 1])


def test_categorical_by_hand():
    # A: f0 counts [1,0,1], f1 [0,2]; B: f0 [0,1,0], f1 [1,0]; S = (3, 2)
    m = CategoricalNB(alpha=1).fit(X_CAT, Y_CAT)
    assert_proba(m.predict_proba([[0, 1]])[0], posterior(PRIOR_MN, [F(2, 5) * F(3, 4), F(1, 4) * F(1, 3)]))
    assert_proba(m.predict_proba([[1, 0]])[0], posterior(PRIOR_MN, [F(1, 5) * F(1, 4), F(2, 4) * F(2, 3)]))
    np.testing.assert_array_equal(m.n_categories_, [3, 2])
    np.testing.assert_array_equal(m.category_count_[0], [[1, 0, 1], [0, 1, 0]])
    m0 = CategoricalNB(alpha=0).fit(X_CAT, Y_CAT)
    assert_proba(m0.predict_proba([[0, 1]])[0], [1, 0])
    assert_proba(m0.predict_proba([[1, 0]])[0], [0, 1])
    assert_proba(m0.predict_proba([[1, 1]])[0], PRIOR_MN)  # both ruled out -> prior
    # sparse input: implicit zeros are category 0
    assert_proba(m.predict_proba(sp.csr_matrix([[0, 1]]))[0], m.predict_proba([[0, 1]])[0])


def test_categorical_min_categories_and_unknown():
    m = CategoricalNB(alpha=1, min_categories=[4, 2]).fit(X_CAT, Y_CAT)
    np.testing.assert_array_equal(m.n_categories_, [4, 2])
    # P(f0 = 3 | A) = (0 + 1) / (2 + 4)
    assert m.feature_log_prob_[0][0, 3] == pytest.approx(math.log(1 / 6), abs=1e-15)
    with pytest.raises(ValueError, match="category"):
        m.predict([[7, 0]])


def test_gaussian_closed_form():
    # A: {0, 2} -> μ=1, σ²=1; B: {2, 4} -> μ=3, σ²=1 (no floor)
    X = np.array([[0.0], [2.0], [2.0], [4.0]])
    y = np.array([0, 0, 1, 1])
    m = GaussianNB(var_smoothing=0).fit(X, y)
    np.testing.assert_array_equal(m.theta_, [[1.0], [3.0]])
    np.testing.assert_array_equal(m.var_, [[1.0], [1.0]])
    # log P(A|x)/P(B|x) = [(x−3)² − (x−1)²]/2 with equal priors and variances
    for x in (2.0, 1.0, -0.5, 7.0):
        lo = ((x - 3) ** 2 - (x - 1) ** 2) / 2
        pa = 1 / (1 + math.exp(-lo))
        np.testing.assert_allclose(m.predict_proba([[x]])[0], [pa, 1 - pa], rtol=1e-12, atol=1e-300)
    assert m.predict_proba([[2.0]])[0, 0] == 0.5


def test_prior_modes():
    y = np.array([0, 0, 0, 1])
    X = np.eye(4)
    assert_proba(np.exp(MultinomialNB().fit(X, y).class_log_prior_), [F(3, 4), F(1, 4)])
    # P_λ(c_k) = (N_k + λ)/(N + K·λ) = (3+2)/(4+4), (1+2)/(4+4)
    assert_proba(np.exp(MultinomialNB(alpha=2, smooth_prior=True).fit(X, y).class_log_prior_), [F(5, 8), F(3, 8)])
    assert_proba(np.exp(BernoulliNB(fit_prior=False).fit(X, y).class_log_prior_), [F(1, 2), F(1, 2)])
    assert_proba(np.exp(ComplementNB(class_prior=[0.1, 0.9]).fit(X, y).class_log_prior_), [F(1, 10), F(9, 10)])
    assert_proba(np.exp(GaussianNB(priors=[0.2, 0.8]).fit(X, y).class_log_prior_), [F(1, 5), F(4, 5)])
    with pytest.raises(ValueError):
        MultinomialNB(class_prior=[1.0]).fit(X, y)


# --------------------------------------------------------------------------- sklearn oracle


def random_counts(seed, n=80, d=40, K=3, density=0.15):
    rng = np.random.default_rng(seed)
    X = sp.random(n, d, density=density, random_state=seed, format="csr")
    X.data = np.ceil(X.data * 6)
    y = rng.integers(0, K, n)
    return X, y


@pytest.mark.parametrize("alpha", [0.01, 0.5, 1.0, 2.5])
@pytest.mark.parametrize(
    "name,kw",
    [("MultinomialNB", {}), ("BernoulliNB", {}), ("BernoulliNB", {"binarize": 2.0}),
     ("ComplementNB", {}), ("ComplementNB", {"norm": True}),
     ("MultinomialNB", {"fit_prior": False}), ("MultinomialNB", {"class_prior": [0.2, 0.3, 0.5]})],
)
def test_against_sklearn_count_models(name, kw, alpha):
    skn = pytest.importorskip("sklearn.naive_bayes")
    import spamnb.nb.naive_bayes as nb

    X, y = random_counts(int(alpha * 100))
    ours = getattr(nb, name)(alpha=alpha, **kw).fit(X, y)
    ref = getattr(skn, name)(alpha=alpha, force_alpha=True, **kw).fit(X, y)
    Xt, _ = random_counts(7)
    np.testing.assert_allclose(ours.feature_log_prob_, ref.feature_log_prob_, rtol=0, atol=1e-10)
    np.testing.assert_allclose(ours.class_log_prior_, ref.class_log_prior_, rtol=0, atol=1e-10)
    np.testing.assert_allclose(ours.predict_log_proba(Xt), ref.predict_log_proba(Xt), rtol=0, atol=1e-10)
    np.testing.assert_array_equal(ours.feature_count_, ref.feature_count_)
    np.testing.assert_array_equal(ours.class_count_, ref.class_count_)
    np.testing.assert_array_equal(ours.predict(Xt), ref.predict(Xt))
    if name == "ComplementNB":
        np.testing.assert_array_equal(ours.feature_all_, ref.feature_all_)


@pytest.mark.parametrize("alpha", [0.01, 0.5, 1.0, 2.5])
def test_against_sklearn_categorical(alpha):
    skn = pytest.importorskip("sklearn.naive_bayes")
    rng = np.random.default_rng(3)
    X = rng.integers(0, 5, (100, 6))
    y = rng.integers(0, 3, 100)
    ours = CategoricalNB(alpha=alpha, min_categories=6).fit(X, y)
    ref = skn.CategoricalNB(alpha=alpha, force_alpha=True, min_categories=6).fit(X, y)
    for a, b in zip(ours.feature_log_prob_, ref.feature_log_prob_):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-10)
    for a, b in zip(ours.category_count_, ref.category_count_):
        np.testing.assert_array_equal(a, b)
    Xt = rng.integers(0, 6, (30, 6))
    np.testing.assert_allclose(ours.predict_log_proba(Xt), ref.predict_log_proba(Xt), rtol=0, atol=1e-10)
    np.testing.assert_allclose(ours.predict_log_proba(sp.csr_matrix(Xt)), ref.predict_log_proba(Xt), atol=1e-10)


@pytest.mark.parametrize("var_smoothing", [1e-9, 1e-3])
def test_against_sklearn_gaussian(var_smoothing):
    skn = pytest.importorskip("sklearn.naive_bayes")
    rng = np.random.default_rng(5)
    X = rng.normal(size=(120, 5)) * [1, 2, 3, 0.5, 10] + [0, 5, -3, 1, 2]
    y = rng.integers(0, 3, 120)
    ours = GaussianNB(var_smoothing=var_smoothing).fit(X, y)
    ref = skn.GaussianNB(var_smoothing=var_smoothing).fit(X, y)
    np.testing.assert_allclose(ours.theta_, ref.theta_, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ours.var_, ref.var_, rtol=1e-10)
    Xt = rng.normal(size=(40, 5))
    np.testing.assert_allclose(ours.predict_log_proba(Xt), ref.predict_log_proba(Xt), rtol=0, atol=1e-10)
    np.testing.assert_allclose(ours.predict_log_proba(sp.csr_matrix(Xt)), ref.predict_log_proba(Xt), atol=1e-9)


def test_sample_weight_against_sklearn():
    skn = pytest.importorskip("sklearn.naive_bayes")
    X, y = random_counts(11)
    w = np.random.default_rng(0).integers(0, 4, X.shape[0]).astype(float)
    for name in ("MultinomialNB", "BernoulliNB", "ComplementNB"):
        ours = getattr(__import__("spamnb.nb.naive_bayes", fromlist=[name]), name)().fit(X, y, sample_weight=w)
        ref = getattr(skn, name)().fit(X, y, sample_weight=w)
        np.testing.assert_allclose(ours.predict_log_proba(X), ref.predict_log_proba(X), atol=1e-10)


# --------------------------------------------------------------------------- incremental


@pytest.mark.parametrize("cls", COUNT_MODELS + [CategoricalNB])
def test_fit_equals_chunked_partial_fit(cls):
    X, y = random_counts(1)
    if cls is CategoricalNB:
        X = X.astype(np.int64)
    full = cls().fit(X, y)
    inc = cls()
    for a in range(0, X.shape[0], 17):
        inc.partial_fit(X[a : a + 17], y[a : a + 17], classes=np.unique(y))
    np.testing.assert_array_equal(inc.class_count_, full.class_count_)
    if cls is CategoricalNB:
        for a, b in zip(inc.category_count_, full.category_count_):
            np.testing.assert_array_equal(a, b)
    else:
        np.testing.assert_array_equal(inc.feature_count_, full.feature_count_)
        np.testing.assert_array_equal(inc.feature_log_prob_, full.feature_log_prob_)
    np.testing.assert_array_equal(inc.predict_log_proba(X), full.predict_log_proba(X))


def snapshot(m):
    keys = ("class_count_", "feature_count_", "class_log_prior_", "_cat", "_s1", "_s2", "n_features_in_")
    out = {k: np.copy(getattr(m, k)) for k in keys if hasattr(m, k)}
    flp = m.feature_log_prob_ if hasattr(m, "feature_log_prob_") else None
    if flp is not None:
        out["flp"] = np.concatenate([np.ravel(a) for a in flp]) if isinstance(flp, list) else np.copy(flp)
    return out


def assert_same_state(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.mark.parametrize("cls", COUNT_MODELS + [CategoricalNB, GaussianNB])
def test_partial_fit_then_forget_is_identity(cls):
    X, y = random_counts(2)
    X2, y2 = random_counts(3)
    if cls is CategoricalNB:
        X, X2 = X.astype(np.int64), X2.astype(np.int64)
    m = cls().fit(X, y)
    before = snapshot(m)
    m.partial_fit(X2, y2).forget(X2, y2)
    assert_same_state(before, snapshot(m))  # integer data: exact


@pytest.mark.parametrize("cls", COUNT_MODELS + [CategoricalNB, GaussianNB])
def test_forget_refuses_and_leaves_model_unchanged(cls):
    X, y = random_counts(4)
    m = cls().fit(X[:40], y[:40])
    before = snapshot(m)
    with pytest.raises(ValueError):
        m.forget(X, y)  # rows 40.. were never learnt
    assert_same_state(before, snapshot(m))
    with pytest.raises(ValueError, match="not in classes_"):
        m.forget(X[:2], np.array([0, 9]))
    assert_same_state(before, snapshot(m))


@pytest.mark.parametrize("cls", COUNT_MODELS)
def test_grow_features_equals_padded_fit(cls):
    X, y = random_counts(5)
    Xpad = sp.hstack([X, sp.csr_matrix((X.shape[0], 7))]).tocsr()
    grown = cls(alpha=0.5).fit(X, y).grow_features(X.shape[1] + 7)
    ref = cls(alpha=0.5).fit(Xpad, y)
    np.testing.assert_array_equal(grown.feature_count_, ref.feature_count_)
    np.testing.assert_allclose(grown.predict_log_proba(Xpad), ref.predict_log_proba(Xpad), atol=1e-12)
    # partial_fit with more columns grows automatically
    inc = cls(alpha=0.5).partial_fit(X, y, classes=[0, 1, 2]).partial_fit(Xpad[:3], y[:3])
    assert inc.n_features_in_ == X.shape[1] + 7
    with pytest.raises(ValueError, match="features"):
        inc.predict(X)  # strict at predict time


def test_grow_features_keeps_old_scores_with_ml():
    # λ = 0: new zero-count words change no old probability
    X, y = random_counts(6)
    m = MultinomialNB(alpha=0).fit(X, y)
    before = m.predict_joint_log_proba(X)
    m.grow_features(X.shape[1] + 100)
    Xpad = sp.hstack([X, sp.csr_matrix((X.shape[0], 100))]).tocsr()
    np.testing.assert_array_equal(m.predict_joint_log_proba(Xpad), before)


@pytest.mark.parametrize("cls", COUNT_MODELS)
def test_select_features(cls):
    X, y = random_counts(8)
    keep = np.array([5, 3, 30, 0, 17])
    m = cls().fit(X, y).select_features(keep)
    ref = cls().fit(X[:, keep], y)
    np.testing.assert_array_equal(m.feature_count_, ref.feature_count_)
    np.testing.assert_allclose(m.predict_log_proba(X[:, keep]), ref.predict_log_proba(X[:, keep]), atol=1e-13)
    with pytest.raises(ValueError):
        cls().fit(X, y).select_features([0, 99])


# --------------------------------------------------------------------------- numerics


@pytest.mark.parametrize("cls", COUNT_MODELS)
def test_long_documents_do_not_underflow(cls):
    X, y = random_counts(9)
    m = cls().fit(X, y)
    rng = np.random.default_rng(0)
    big = sp.csr_matrix(rng.integers(200, 400, (3, X.shape[1])).astype(float))  # > 10,000 tokens each
    assert big.sum(axis=1).min() > 10_000
    lp = m.predict_log_proba(big)
    assert np.isfinite(lp).all()  # every model, Complement too: no underflow to -inf or NaN
    p = m.predict_proba(big)
    assert ((p >= 0) & (p <= 1)).all()
    np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-12)
    assert np.isfinite(m.predict_joint_log_proba(big)).all()


@pytest.mark.parametrize("cls", COUNT_MODELS + [CategoricalNB])
def test_ml_random_no_nan(cls):
    X, y = random_counts(10, density=0.05)
    if cls is CategoricalNB:
        X = X.astype(np.int64)
    m = (cls(alpha=0, min_categories=7) if cls is CategoricalNB else cls(alpha=0)).fit(X, y)
    Xt, _ = random_counts(12, density=0.3)
    if cls is CategoricalNB:
        Xt = Xt.minimum(1).astype(np.int64)
    lp = m.predict_log_proba(Xt)
    assert not np.isnan(lp).any()
    p = m.predict_proba(Xt)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-12)


@pytest.mark.parametrize("cls", COUNT_MODELS + [CategoricalNB, GaussianNB])
def test_dense_and_csr_identical(cls):
    X, y = random_counts(13)
    if cls is CategoricalNB:
        X = X.astype(np.int64)
    Xd = X.toarray()
    a = cls().fit(X, y)
    b = cls().fit(Xd, y)
    if cls is GaussianNB:  # dense and sparse paths compute differently
        np.testing.assert_allclose(a.predict_log_proba(X), b.predict_log_proba(Xd), atol=1e-9)
        return
    np.testing.assert_array_equal(a.predict_log_proba(X), b.predict_log_proba(Xd))
    np.testing.assert_array_equal(a.predict_log_proba(Xd), a.predict_log_proba(sp.coo_matrix(X)))
    np.testing.assert_array_equal(a.predict_log_proba(X), a.predict_log_proba(sp.csc_array(X)))


@pytest.mark.parametrize("cls", [MultinomialNB, BernoulliNB, ComplementNB])
def test_million_features_stay_sparse(cls):
    n, d = 300, 1_000_000
    rng = np.random.default_rng(0)
    X = sp.random(n, d, density=20 / d, random_state=rng, format="csr")
    X.data = np.ceil(X.data * 3)
    y = rng.integers(0, 2, n)
    tracemalloc.start()
    m = cls().fit(X, y)
    lp = m.predict_log_proba(X)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    dense_bytes = n * d * 8  # 2.4 GB
    assert peak < dense_bytes / 20, peak
    assert np.isfinite(lp).all()


# --------------------------------------------------------------------------- validation


def test_validation_errors():
    X, y = random_counts(14)
    with pytest.raises(ValueError, match="alpha"):
        MultinomialNB(alpha=-1).fit(X, y)
    with pytest.raises(ValueError, match="samples"):
        MultinomialNB().fit(X, y[:-1])
    neg = X.copy()
    neg.data[0] = -1
    for cls in (MultinomialNB, ComplementNB):
        with pytest.raises(ValueError, match="Negative"):
            cls().fit(neg, y)
    nan = X.copy()
    nan.data[0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        MultinomialNB().fit(nan, y)
    for cls in COUNT_MODELS:
        for alpha in (0, 1):
            m = cls(alpha=alpha).fit(X, y)
            for bad in (np.nan, np.inf):
                Xb = X.copy()
                Xb.data[3] = bad
                with pytest.raises(ValueError, match="NaN" if np.isnan(bad) else "infinity"):
                    m.predict_log_proba(Xb)
    with pytest.raises(ValueError, match="NaN"):
        GaussianNB().fit(np.array([[np.nan], [1.0]]), [0, 1])
    with pytest.raises(ValueError, match="classes"):
        MultinomialNB().partial_fit(X, y)
    with pytest.raises(ValueError, match="not fitted"):
        MultinomialNB().predict(X)
    with pytest.raises(ValueError, match="features"):
        MultinomialNB().fit(X, y).predict(X[:, :5])
    with pytest.raises(ValueError, match="binarize"):
        BernoulliNB(binarize=-1).fit(X, y)
    with pytest.raises(ValueError, match="sample_weight"):
        MultinomialNB().fit(X, y, sample_weight=-np.ones(X.shape[0]))
    with pytest.raises(ValueError, match="integer"):
        CategoricalNB().fit([[0.5]], [0])


def test_empty_class_and_forget_everything():
    X, y = random_counts(15)
    m = MultinomialNB(alpha=0).partial_fit(X, y, classes=[0, 1, 2, 3])  # class 3 never seen
    p = m.predict_proba(X)
    assert (p[:, 3] == 0).all() and not np.isnan(p).any()
    m.forget(X, y)  # back to nothing: uniform prior, every class rules out every word
    np.testing.assert_array_equal(m.class_count_, 0)
    np.testing.assert_allclose(m.predict_proba(X[:2]), 0.25)


# --------------------------------------------------------------------------- properties

counts_strategy = st.integers(2, 12).flatmap(
    lambda n: st.tuples(
        st.lists(st.lists(st.integers(0, 4), min_size=5, max_size=5), min_size=n, max_size=n),
        st.lists(st.integers(0, 1), min_size=n, max_size=n),
    )
)


@settings(max_examples=40, deadline=None)
@given(counts_strategy, counts_strategy, st.sampled_from([0.0, 0.5, 1.0]), st.sampled_from(COUNT_MODELS))
def test_property_forget_inverts_partial_fit(a, b, alpha, cls):
    Xa, ya = np.array(a[0]), np.array(a[1])
    Xb, yb = np.array(b[0]), np.array(b[1])
    m = cls(alpha=alpha).partial_fit(Xa, ya, classes=[0, 1])
    before = snapshot(m)
    m.partial_fit(Xb, yb)
    p = m.predict_proba(np.vstack([Xa, Xb]))
    assert not np.isnan(p).any()
    np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-12)
    m.forget(Xb, yb)
    assert_same_state(before, snapshot(m))


# --------------------------------------------------------------------------- online (incremental) learning

ONLINE_MODELS = [
    (MultinomialNB, {}), (ComplementNB, {}), (ComplementNB, {"norm": True}),
    (BernoulliNB, {}), (BernoulliNB, {"binarize": 1.0}),
]


def online_rows(seed, n=150, d=3000, nnz=12, fractional=False):
    """Rows whose vocabulary grows: row i uses columns < d·(i+1)/n (new tokens keep
    arriving), ~nnz per row, so a 1-row batch touches few of the columns."""
    rng = np.random.default_rng(seed)
    rows, cols, vals = [], [], []
    for i in range(n):
        hi = max(nnz, d * (i + 1) // n)
        c = np.unique(np.concatenate([rng.integers(0, hi, nnz), [hi - 1]]))
        rows += [i] * c.size
        cols += c.tolist()
        v = rng.integers(1, 4, c.size).astype(float)
        vals += (v / np.sqrt((v * v).sum())).tolist() if fractional else v.tolist()
    X = sp.csr_matrix((vals, (rows, cols)), shape=(n, d))
    return X, rng.integers(0, 2, n)


def width(X, i):
    """Columns of row i's prefix matrix: up to its last nonzero (as a growing vocabulary gives)."""
    return int(X.indices[X.indptr[i] : X.indptr[i + 1]].max()) + 1


def run_online(cls, kw, X, y, weights=None, seed=0):
    """Classify-then-learn one row at a time, with forgets and explicit growth mixed in.
    Returns the model, the rows it holds, the weights, and the per-step log posteriors."""
    rng = np.random.default_rng(seed)
    m = cls(**kw).partial_fit(sp.csr_matrix((0, 0)), np.zeros(0, int), classes=[0, 1])
    held, out = [], []
    w = np.ones(X.shape[0]) if weights is None else weights
    for i in range(X.shape[0]):
        d = max(m.n_features_in_, width(X, i))
        if i and rng.random() < 0.2:
            m.grow_features(d + int(rng.integers(1, 4)))  # a few new tokens, no data yet
            d = m.n_features_in_
        Xi = padded(X[i : i + 1], d)
        if i:  # classify with the model's vocabulary (unknown tokens dropped), then learn
            out.append(m.predict_log_proba(padded(X[i : i + 1], m.n_features_in_)))
        m.partial_fit(Xi, y[i : i + 1], sample_weight=w[i : i + 1])
        held.append(i)
        if held and rng.random() < 0.15:  # forget an earlier row, in today's columns
            j = held.pop(int(rng.integers(len(held))))
            m.forget(padded(X[j, : width(X, j)], m.n_features_in_), y[j : j + 1], sample_weight=w[j : j + 1])
    return m, np.array(held), w


def padded(X, d):
    return sp.hstack([X, sp.csr_matrix((X.shape[0], d - X.shape[1]))]).tocsr() if d > X.shape[1] else X[:, :d]


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("cls,kw", ONLINE_MODELS)
def test_online_steps_equal_fresh_fit(cls, kw, alpha):
    X, y = online_rows(20)
    kw = dict(kw, alpha=alpha)
    m, held, _ = run_online(cls, kw, X, y)
    d = m.n_features_in_
    ref = cls(**kw).fit(padded(X[held], d), y[held])
    np.testing.assert_array_equal(m.class_count_, ref.class_count_)
    np.testing.assert_array_equal(m.feature_count_, ref.feature_count_)  # integer counts: exact
    np.testing.assert_allclose(m.feature_log_prob_, ref.feature_log_prob_, rtol=1e-12, atol=1e-12)
    Xt = padded(X, d)
    np.testing.assert_allclose(m.predict_joint_log_proba(Xt), ref.predict_joint_log_proba(Xt), rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(m.predict_log_proba(Xt), ref.predict_log_proba(Xt), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(m.predict(Xt), ref.predict(Xt))


@pytest.mark.parametrize("cls,kw", ONLINE_MODELS)
def test_online_fractional_counts_equal_fresh_fit(cls, kw):
    # unit-length rows (presence-l2) and fractional sample weights: float counts
    X, y = online_rows(21, fractional=True)
    w = np.random.default_rng(1).choice([0.5, 1.0, 2.25], X.shape[0])
    m, held, _ = run_online(cls, dict(kw, alpha=0.5), X, y, weights=w, seed=1)
    d = m.n_features_in_
    ref = cls(**kw, alpha=0.5).fit(padded(X[held], d), y[held], sample_weight=w[held])
    np.testing.assert_allclose(m.class_count_, ref.class_count_, rtol=1e-12)
    np.testing.assert_allclose(m.feature_count_, ref.feature_count_, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(m.feature_log_prob_, ref.feature_log_prob_, rtol=1e-12, atol=1e-12)
    Xt = padded(X, d)
    np.testing.assert_allclose(m.predict_log_proba(Xt), ref.predict_log_proba(Xt), rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("alpha", [0.0, 0.5])
@pytest.mark.parametrize("cls,kw", ONLINE_MODELS)
def test_each_online_step_matches_recomputation(cls, kw, alpha):
    # after every step the incrementally kept weights score like a model derived
    # from scratch from the same counts (set_counts), and feature_log_prob_'s
    # cache follows the changes
    X, y = online_rows(22, n=60, d=2000)
    m = cls(**kw, alpha=alpha).partial_fit(sp.csr_matrix((0, 0)), np.zeros(0, int), classes=[0, 1])
    for i in range(X.shape[0]):
        m.partial_fit(padded(X[i, : width(X, i)], max(width(X, i), m.n_features_in_)), y[i : i + 1])
        if i % 7:
            continue
        flp = m.feature_log_prob_
        fresh = cls(**kw, alpha=alpha).partial_fit(sp.csr_matrix((0, 0)), np.zeros(0, int), classes=[0, 1])
        fresh.set_counts(m.class_count_, m.feature_count_)
        np.testing.assert_array_equal(flp, fresh.feature_log_prob_)
        Xt = padded(X[: i + 5], m.n_features_in_)
        np.testing.assert_allclose(m.predict_log_proba(Xt), fresh.predict_log_proba(Xt), rtol=1e-12, atol=1e-12)


def test_online_multinomial_against_sklearn():
    skn = pytest.importorskip("sklearn.naive_bayes")
    X, y = online_rows(23)
    m, held, _ = run_online(MultinomialNB, {"alpha": 0.3}, X, y)
    d = m.n_features_in_
    ref = skn.MultinomialNB(alpha=0.3, force_alpha=True).fit(padded(X[held], d), y[held])
    np.testing.assert_allclose(m.feature_log_prob_, ref.feature_log_prob_, rtol=0, atol=1e-10)
    np.testing.assert_allclose(m.predict_log_proba(padded(X, d)), ref.predict_log_proba(padded(X, d)), atol=1e-10)


def test_counts_are_read_only_views():
    X, y = online_rows(24, n=20, d=100)
    m = MultinomialNB().fit(X, y)
    with pytest.raises(ValueError):
        m.feature_count_[0, 0] = 5.0
    with pytest.raises(ValueError):
        m.feature_log_prob_[0, 0] = 5.0
    with pytest.raises(ValueError, match="shapes"):
        m.set_counts([1.0], m.feature_count_)


@pytest.mark.parametrize("cls", COUNT_MODELS)
def test_one_online_step_does_not_touch_the_vocabulary(cls):
    # one classify-then-learn step on a model with 1,000,000 features: memory in
    # proportion to the row's 300 nonzeros, far below one float per feature (8 MB)
    d, rng = 1_000_000, np.random.default_rng(0)
    X = sp.random(50, d, density=300 / d, random_state=rng, format="csr")
    X.data = np.ceil(X.data * 3)
    m = cls().fit(X, rng.integers(0, 2, 50)).grow_features(d + 1)  # spare capacity from here on
    row = sp.random(1, d + 4, density=300 / d, random_state=rng, format="csr")
    row.data = np.ceil(row.data * 3)
    tracemalloc.start()
    m.grow_features(d + 2)
    lp = m.predict_log_proba(row[:, : d + 2])
    m.partial_fit(row, [1])  # grows by 2 more columns
    lp2 = m.predict_log_proba(row)
    m.forget(row, [1])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1_000_000, peak  # bytes; a dense (n_features,) float64 is 8 MB
    assert np.isfinite(lp).all() and np.isfinite(lp2).all()
    assert m.n_features_in_ == d + 4


@pytest.mark.parametrize("cls", [MultinomialNB, BernoulliNB, ComplementNB])
def test_drop_features_after_forget_restores_the_fit(cls):
    """Columns a forgotten batch added (zero counts again) dropped with drop_features:
    the model is the one fitted without them (the last columns move into the gaps)."""
    rng = np.random.default_rng(3)
    X = rng.integers(0, 3, size=(30, 8)).astype(float)
    X[:, X.sum(axis=0) == 0] = 1.0
    y = rng.integers(0, 2, size=30)
    ref = cls().fit(X, y)
    m = cls().fit(X, y)
    extra = np.hstack([rng.integers(0, 2, size=(2, 8)), np.ones((2, 3))])  # 3 new columns
    m.partial_fit(extra, [0, 1])
    m.forget(extra, [0, 1])
    src, dst = m.drop_features([9, 8, 10])  # the tail: nothing moves
    assert m.n_features_in_ == 8 and src.size == dst.size == 0
    np.testing.assert_allclose(m.predict_log_proba(X), ref.predict_log_proba(X), rtol=0, atol=1e-9)
    m.drop_features([2])  # a column in the middle: the last one moves into its place
    keep = [0, 1, 7, 3, 4, 5, 6]
    ref2 = cls().fit(X[:, keep], y)
    np.testing.assert_allclose(m.predict_log_proba(X[:, keep]), ref2.predict_log_proba(X[:, keep]),
                               rtol=0, atol=1e-9)


# --------------------------------------------------------------------------- scikit-learn's conventions

ALL_MODELS = COUNT_MODELS + [CategoricalNB, GaussianNB]


def test_scikit_learns_conventions_without_scikit_learn():
    """Parameters, clone-by-parameters, score, pickling, the not-fitted error, and the
    vectorizer of raw mail, in a process where scikit-learn is never imported."""
    import subprocess
    import sys

    from conftest import ROOT

    code = r'''
import pickle, sys, warnings
import numpy as np
from spamnb.nb.naive_bayes import MultinomialNB, GaussianNB
from spamnb.nb.estimator import DataConversionWarning, NotFittedError
from spamnb.model import MailVectorizer
X, y = np.array([[2, 0, 1], [0, 3, 1], [1, 0, 2], [0, 2, 0]]), np.array(["ham", "spam", "ham", "spam"])
m = MultinomialNB(alpha=0.5)
assert m.get_params() == {"alpha": 0.5, "class_prior": None, "fit_prior": True, "prior_alpha": None,
                          "smooth_prior": False}, m.get_params()
assert repr(m) == "MultinomialNB(alpha=0.5)", repr(m)
twin = type(m)(**m.get_params()).set_params(alpha=0.25)
assert twin.alpha == 0.25 and m.alpha == 0.5
try:
    m.predict(X)
    raise SystemExit("predicted unfitted")
except NotFittedError as e:
    assert isinstance(e, ValueError) and isinstance(e, AttributeError)
assert m.fit(X, y).score(X, y) == 1.0 and list(m.classes_) == ["ham", "spam"]
again = pickle.loads(pickle.dumps(m))
assert (again.predict_log_proba(X) == m.predict_log_proba(X)).all()
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    GaussianNB().fit(X, y[:, None])
assert [type(x.message) for x in w] == [DataConversionWarning], w
vec = MailVectorizer().fit([b"Subject: cheap pills\n\nbuy now", b"Subject: lunch\n\nat noon?"])
assert "subject:cheap" in vec.get_feature_names_out(), vec.get_feature_names_out()
assert not [name for name in sys.modules if name.split(".")[0] == "sklearn"]
print("ok")
'''
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0 and out.stdout == "ok\n", out.stderr


@pytest.mark.parametrize("cls", ALL_MODELS)
def test_input_errors_in_scikit_learns_words(cls):
    X, y = random_counts(16)
    X = X.toarray() if cls is GaussianNB else X
    with pytest.raises(ValueError, match=r"0 sample\(s\) \(shape=\(0, 3\)\) while a minimum of 1"):
        cls().fit(np.zeros((0, 3)), [])
    with pytest.raises(ValueError, match=r"0 feature\(s\) \(shape=\(4, 0\)\) while a minimum of 1"):
        cls().fit(np.zeros((4, 0)), [0, 1, 0, 1])
    with pytest.raises(ValueError, match="Reshape your data"):
        cls().fit(X, y).predict(np.asarray(X[0].toarray() if sp.issparse(X) else X[0]).ravel())
    with pytest.raises(ValueError, match="Complex data not supported"):
        cls().fit(np.ones((2, 2)) + 1j, [0, 1])
    with pytest.raises(ValueError, match="Unknown label type: continuous"):
        cls().fit(X, y + 0.5)
    with pytest.raises(ValueError, match="requires y to be passed"):
        cls().fit(X, None)
    with pytest.raises(ValueError, match=r"inconsistent numbers of samples: \[%d, %d\]" % (X.shape[0], 3)):
        cls().fit(X, y[:3])
    with pytest.raises(ValueError, match="Input y contains NaN"):
        cls().fit(X, np.full(X.shape[0], np.nan))
    with pytest.raises(ValueError, match="weight.*zero"):
        cls().fit(X, y, sample_weight=np.zeros(X.shape[0]))
    with pytest.raises(TypeError, match="must be a string or a real number"):
        cls().fit(np.array([[{"a": 1}], [2]], dtype=object), [0, 1])


@pytest.mark.parametrize("cls", ALL_MODELS)
def test_labels_of_any_type_and_object_input(cls):
    X, y = random_counts(17)
    X = X.toarray()
    names = np.array(["ham", "spam", "eggs"], dtype=object)[y]
    m = cls().fit(X.astype(object), names)  # numbers stored as objects are numbers
    assert list(m.classes_) == ["eggs", "ham", "spam"]
    np.testing.assert_array_equal(m.predict(X), cls().fit(X, y).predict(X).choose(["ham", "spam", "eggs"]))
    flags = cls().fit(X, y == 1)
    assert flags.classes_.dtype == bool and flags.predict(X).dtype == bool
    with pytest.raises(ValueError, match="one type"):
        cls().partial_fit(X, names, classes=np.array(["ham", 1, "eggs"], dtype=object))


@pytest.mark.parametrize("cls", ALL_MODELS)
def test_prediction_changes_no_attribute_and_fit_keeps_foreign_ones(cls):
    X, y = random_counts(18)
    X = X.toarray() if cls is GaussianNB else X
    m = cls()
    m._parent_callback_ctx = "set by a Pipeline around this fit"  # scikit-learn's Pipeline does this
    m.fit(X, y)
    assert m._parent_callback_ctx == "set by a Pipeline around this fit"
    before = dict(vars(m))
    m.predict_proba(X)
    m.predict(X[:1])
    assert vars(m).keys() == before.keys() and all(vars(m)[k] is before[k] for k in before)
    # fit forgets all it learned before: the model of the second batch alone
    m.fit(X[:20], y[:20])
    ref = cls().fit(X[:20], y[:20])
    np.testing.assert_array_equal(m.predict_log_proba(X[:20]), ref.predict_log_proba(X[:20]))


@pytest.mark.parametrize("cls", COUNT_MODELS)
def test_a_narrower_batch_is_refused(cls):
    X, y = random_counts(19)
    m = cls().fit(X, y)
    before = snapshot(m)
    for learn in (m.partial_fit, m.forget):
        with pytest.raises(ValueError, match=f"X has 5 features, but {cls.__name__} is expecting {X.shape[1]}"):
            learn(X[:, :5], y)
    assert_same_state(before, snapshot(m))


@pytest.mark.parametrize("cls", ALL_MODELS)
def test_the_input_is_never_changed(cls):
    # non-canonical CSR (a duplicate entry, unsorted columns) and weights: read, never rewritten
    X, y = random_counts(20, n=30, d=6)
    X = sp.csr_matrix((np.r_[X.data, 1.0], np.r_[X.indices, X.indices[0]], np.r_[X.indptr[:-1], X.nnz + 1]),
                      shape=X.shape)
    X.indices[X.indptr[0]: X.indptr[1]] = X.indices[X.indptr[0]: X.indptr[1]][::-1]
    X.has_sorted_indices = False
    w = np.linspace(0.5, 2.0, X.shape[0])
    inputs = (X.data.copy(), X.indices.copy(), X.indptr.copy(), y.copy(), w.copy())
    m = cls().fit(X, y, sample_weight=w)
    m.partial_fit(X, y, sample_weight=w)
    m.forget(X, y, sample_weight=w)
    m.predict_proba(X)
    m.score(X, y, sample_weight=w)
    for before, after in zip(inputs, (X.data, X.indices, X.indptr, y, w)):
        np.testing.assert_array_equal(before, after)
