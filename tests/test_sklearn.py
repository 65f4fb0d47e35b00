"""spamnb's estimators with scikit-learn's own tools and checks, and raw mail into scikit-learn.

Everything here needs scikit-learn (the ``test`` extra installs it) and skips
without it; that spamnb itself never imports scikit-learn is tested in
tests/test_naive_bayes.py.
"""

from __future__ import annotations

import os
import pickle
import re
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

from conftest import ROOT

sklearn = pytest.importorskip("sklearn", reason="scikit-learn is not installed (pip install -e '.[test]')")
if tuple(int(p) for p in re.findall(r"\d+", sklearn.__version__)[:2]) < (1, 6):
    pytest.skip(f"scikit-learn {sklearn.__version__} is older than 1.6 (the test extra's)", allow_module_level=True)

from sklearn.base import clone, is_classifier  # noqa: E402
from sklearn.calibration import CalibratedClassifierCV  # noqa: E402
from sklearn.exceptions import NotFittedError  # noqa: E402
from sklearn.metrics import roc_auc_score  # noqa: E402
from sklearn.model_selection import GridSearchCV, cross_val_score  # noqa: E402
from sklearn.pipeline import Pipeline, make_pipeline  # noqa: E402
from sklearn.utils import get_tags  # noqa: E402
from sklearn.utils.estimator_checks import check_estimator  # noqa: E402
from sklearn.utils.validation import check_is_fitted  # noqa: E402

from spamnb.mail.sources import iter_messages  # noqa: E402
from spamnb.mail.tokenizer import TokenizerConfig  # noqa: E402
from spamnb.model import MailVectorizer, SpamModel  # noqa: E402
from spamnb.nb.naive_bayes import (  # noqa: E402
    BernoulliNB,
    CategoricalNB,
    ComplementNB,
    GaussianNB,
    MultinomialNB,
    expected_failed_checks,
)

ESTIMATORS = [MultinomialNB(), BernoulliNB(), ComplementNB(), CategoricalNB(), GaussianNB()]
# λ = 0 and the other paths of the count models, held to the same checks
MORE_SETTINGS = [MultinomialNB(alpha=0), BernoulliNB(alpha=0, binarize=0.5), ComplementNB(norm=True),
                 MultinomialNB(alpha=0.01, smooth_prior=True, prior_alpha=1.0)]


def counts(seed=0, n=120, d=25, classes=(0, 1)):
    rng = np.random.default_rng(seed)
    y = rng.choice(np.asarray(classes, dtype=object), n)
    X = rng.poisson(0.6, (n, d)).astype(float)
    for k, c in enumerate(classes):  # each class prefers a few words: something to learn
        X[y == c, 3 * k: 3 * k + 3] += rng.poisson(2.0, ((y == c).sum(), 3))
    return sp.csr_matrix(X), y


def run_checks(estimator):
    """check_estimator's result per check (its warning that the estimator does not
    derive from scikit-learn's BaseEstimator is spamnb's design: no dependency)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return check_estimator(estimator, on_fail=None, expected_failed_checks=expected_failed_checks(estimator))


@pytest.mark.parametrize("estimator", ESTIMATORS + MORE_SETTINGS, ids=repr)
def test_check_estimator_finds_no_failure(estimator):
    results = run_checks(estimator)
    failed = [f"{r['check_name']}: {r['exception']!r}" for r in results if r["status"] == "failed"]
    assert failed == []
    # the checks declared as not applying do fail (the declaration is not stale) and are the only ones
    assert {r["check_name"] for r in results if r["status"] == "xfail"} == set(expected_failed_checks(estimator))
    assert sum(r["status"] == "passed" for r in results) >= 55


def test_tags_say_what_each_estimator_takes():
    tags = {type(e).__name__: get_tags(e) for e in ESTIMATORS}
    assert all(t.estimator_type == "classifier" and t.input_tags.sparse for t in tags.values())
    assert [n for n, t in tags.items() if t.input_tags.positive_only] == ["MultinomialNB", "ComplementNB",
                                                                          "CategoricalNB"]
    assert tags["CategoricalNB"].input_tags.categorical
    assert all(is_classifier(e) for e in ESTIMATORS)


@pytest.mark.parametrize("cls", [MultinomialNB, BernoulliNB, ComplementNB, GaussianNB])
def test_clone_grid_search_cross_val_score_calibration(cls):
    X, y = counts(1, classes=("ham", "spam"))
    est = cls(alpha=0.5)
    copy = clone(est)
    assert copy is not est and copy.get_params() == est.get_params()
    search = GridSearchCV(est, {"alpha": [0.01, 1.0], "fit_prior": [True, False]}, cv=3).fit(X, y)
    assert search.best_params_["alpha"] in (0.01, 1.0)
    assert list(search.best_estimator_.classes_) == ["ham", "spam"]
    scores = cross_val_score(est, X, y, cv=4)
    assert scores.shape == (4,) and (scores > 0.6).all()
    calibrated = CalibratedClassifierCV(est, cv=3).fit(X, y)
    p = calibrated.predict_proba(X)
    np.testing.assert_allclose(p.sum(axis=1), 1.0)
    assert roc_auc_score(y == "spam", p[:, 1]) > 0.8
    assert not hasattr(est, "classes_")  # the tools fitted clones, never the estimator given


def test_pipeline_sets_nested_parameters_and_fits():
    X, y = counts(2)
    pipe = Pipeline([("nb", MultinomialNB())]).set_params(nb__alpha=0.2)
    assert pipe.get_params()["nb__alpha"] == 0.2
    assert pipe.fit(X, y).score(X, y) == MultinomialNB(alpha=0.2).fit(X, y).score(X, y)
    with pytest.raises(ValueError, match="Invalid parameter 'alpah'"):
        MultinomialNB().set_params(alpah=1)


def test_unfitted_error_is_scikit_learns():
    X, _ = counts(3)
    with pytest.raises(NotFittedError, match="not fitted"):
        MultinomialNB().predict(X)
    with pytest.raises(NotFittedError):
        check_is_fitted(GaussianNB())
    check_is_fitted(GaussianNB().fit(X.toarray(), np.arange(X.shape[0]) % 2))


@pytest.mark.parametrize("cls", [MultinomialNB, BernoulliNB, ComplementNB])
def test_what_spamnb_adds_works_on_scikit_learns_results(cls):
    # a model GridSearchCV picked and refitted, then pickled: still an online spamnb model
    X, y = counts(4)
    best = GridSearchCV(cls(), {"alpha": [0.0, 0.5]}, cv=3).fit(X, y).best_estimator_
    best = pickle.loads(pickle.dumps(best))
    before = best.feature_count_.copy(), best.predict_log_proba(X)
    wide = sp.hstack([X[:5], sp.csr_matrix(np.eye(5, 3))]).tocsr()  # three new features
    best.partial_fit(wide, y[:5])
    assert best.n_features_in_ == X.shape[1] + 3
    best.forget(wide, y[:5])
    np.testing.assert_array_equal(best.feature_count_[:, : X.shape[1]], before[0])
    best.select_features(np.arange(X.shape[1]))
    np.testing.assert_allclose(best.predict_log_proba(X), before[1], atol=1e-12)
    assert best.grow_features(X.shape[1] + 2).n_features_in_ == X.shape[1] + 2


# --------------------------------------------------------------------------- raw mail


@pytest.fixture(scope="module")
def corpus(small_corpus):
    """The small corpus's real messages (150 ham, 150 spam), in a fixed mixed order."""
    mail = list(iter_messages(str(small_corpus.index)))
    order = np.random.default_rng(0).permutation(len(mail))
    return [mail[i].raw for i in order], [mail[i].label for i in order]


def scores_of(pipe, raws):
    log_p = pipe.predict_log_proba(raws)
    return log_p[:, list(pipe.classes_).index("spam")] - log_p[:, list(pipe.classes_).index("ham")]


@pytest.mark.parametrize("settings", [
    {},  # the defaults: multinomial, presence-l2, λ = 0.01, Laplace's prior
    {"model_type": "bernoulli", "alpha": 1.0, "prior": "learned"},
    {"model_type": "complement", "features": "counts", "tokenizer": TokenizerConfig(bigrams=True)},
    {"features": "logtf-l2", "hash_features": 4096, "prior": "uniform"},
], ids=["defaults", "bernoulli", "complement-bigrams", "hashed-logtf"])
def test_vectorizer_pipeline_gives_spam_models_tokens_and_scores(corpus, settings):
    raws, labels = corpus
    train, test = raws[:100], raws[100:150]
    model = SpamModel(**settings)
    model.learn(zip(train, labels[:100]))
    vectorizer = MailVectorizer(tokenizer=model.tokenizer, features=model.features,
                                hash_features=model.hash_features)
    pipe = make_pipeline(vectorizer, model.new_estimator()).fit(train, labels[:100])
    assert list(vectorizer.get_feature_names_out()) == model.vocabulary.tokens()
    ours = scores_of(pipe, test)
    theirs = np.array([model.classify(raw).score for raw in test])
    np.testing.assert_allclose(ours, theirs, rtol=1e-9, atol=1e-9)
    assert roc_auc_score(np.array(labels[100:150]) == "spam", ours) > 0.9


def test_vectorizer_partial_fit_learns_new_tokens_as_the_model_does(corpus):
    raws, labels = corpus
    model = SpamModel()
    vectorizer = MailVectorizer(features=model.features)
    nb = model.new_estimator()
    nb.partial_fit(sp.csr_matrix((0, 0)), [], classes=["ham", "spam"])
    for lo, hi in ((0, 50), (50, 51), (51, 100)):  # batches, one of a single message
        batch, y = raws[lo:hi], labels[lo:hi]
        model.learn(zip(batch, y))
        width = len(vectorizer.partial_fit(batch).vocabulary_)
        X = vectorizer.transform(batch)
        assert X.shape == (hi - lo, width) and width == len(model.vocabulary)
        nb.partial_fit(X, y)
    assert list(vectorizer.get_feature_names_out()) == model.vocabulary.tokens()
    rows = vectorizer.transform(raws[100:150])
    log_p = nb.predict_log_proba(rows)
    np.testing.assert_allclose(log_p[:, 1] - log_p[:, 0], [model.classify(r).score for r in raws[100:150]],
                               rtol=1e-9, atol=1e-9)
    # unknown tokens are left out: transform never widens the rows
    assert rows.shape[1] == len(vectorizer.vocabulary_)


def test_vectorizer_with_scikit_learns_tools(corpus):
    raws, labels = corpus
    vectorizer = MailVectorizer(features="presence")
    assert clone(vectorizer).get_params() == vectorizer.get_params()
    X = vectorizer.fit_transform(raws[:50])
    assert sp.issparse(X) and X.shape == (50, len(vectorizer.get_feature_names_out()))
    assert set(np.unique(X.data)) == {1.0}
    np.testing.assert_array_equal(X.toarray(), MailVectorizer(features="presence").fit(raws[:50])
                                  .transform(raws[:50]).toarray())
    pipe = make_pipeline(MailVectorizer(), MultinomialNB())
    assert cross_val_score(pipe, np.array(raws[:90], dtype=object), labels[:90], cv=3,
                           scoring="roc_auc").min() > 0.8
    with pytest.raises(NotFittedError):
        MailVectorizer().transform(raws[:1])
    with pytest.raises(ValueError, match="one message"):
        MailVectorizer().fit(raws[0])
    with pytest.raises(ValueError, match="unknown features"):
        MailVectorizer(features="tfidf").fit(raws[:2])
    assert pickle.loads(pickle.dumps(vectorizer)).transform(raws[:3]).nnz == vectorizer.transform(raws[:3]).nnz


# --------------------------------------------------------------------------- docs


def library_section():
    page = (ROOT / "docs" / "library.md").read_text(encoding="utf-8")
    section = page.split("\n## With scikit-learn\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```python\n(.*?)^```$", section, flags=re.S | re.M)


def test_the_library_pages_scikit_learn_blocks_run(monkeypatch, capsys):
    blocks = library_section()
    assert len(blocks) >= 4
    monkeypatch.chdir(ROOT)  # the blocks read corpora/ as a user in a checkout would
    namespace = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # check_estimator's note that no BaseEstimator is inherited
        for block in blocks:
            exec(compile(block, "docs/library.md", "exec"), namespace)
    assert "spam" in capsys.readouterr().out  # the classification report
    assert namespace["search"].best_params_["multinomialnb__alpha"] in (0.01, 1.0)
    assert os.fspath(ROOT) == os.getcwd()
