"""The first messages of a stream: no infinite score from missing evidence, and
no verdict while the model has learned one class only (issue: a living filter)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import sample_message
from spamnb.evaluation import evaluate
from spamnb.model import SpamModel
from spamnb.nb.naive_bayes import MultinomialNB
from spamnb.storage import scorer
from spamnb.storage.modelfile import load_model, save_model


def test_laplace_prior_is_the_rule_of_succession():
    """(N_k + 1)/(N + 2): after 1 spam and no ham, P(spam) = 2/3; after 3 ham and 1 spam, 2/6 and 4/6."""
    est = MultinomialNB(alpha=0.01, smooth_prior=True, prior_alpha=1.0)
    est.partial_fit(np.array([[1, 0]]), [1], classes=[0, 1])
    np.testing.assert_allclose(np.exp(est.class_log_prior_), [1 / 3, 2 / 3])
    est.partial_fit(np.array([[0, 1]] * 3), [0, 0, 0])
    np.testing.assert_allclose(np.exp(est.class_log_prior_), [4 / 6, 2 / 6])
    assert scorer.prior_log_odds("laplace", 0.01, [3, 1]) == pytest.approx(math.log(2 / 4))
    assert scorer.prior_log_odds("laplace", 0.01, [0, 1]) == pytest.approx(math.log(2))
    assert scorer.prior_log_odds("learned", 0.01, [0, 1]) == math.inf


def test_a_model_of_one_class_gives_finite_scores_and_no_verdict():
    spam = sample_message("spam", 0).read_bytes()
    model = SpamModel()  # the default prior: laplace
    model.learn([(spam, "spam")])
    for raw in (sample_message("ham", 0).read_bytes(), spam, b"", b"Subject: hello\n\nhello"):
        c = model.classify(raw)
        assert math.isfinite(c.score) and 0.0 < c.spam_probability < 1.0
        assert c.label == "unsure"  # one class learned: the filter cannot tell
    model.learn([(sample_message("ham", 0).read_bytes(), "ham")])
    assert model.classify(spam).label == "spam"


def test_the_scorer_says_unsure_too_and_scores_as_the_model(tmp_path):
    model = SpamModel()
    model.learn([(sample_message("spam", 0).read_bytes(), "spam")])
    path = tmp_path / "m.joblib"
    save_model(model, path)
    sc = scorer.fresh_scorer(path)  # compiled: the prior is finite now
    toks = model.tokens(sample_message("ham", 1).read_bytes())
    s, p, known = sc.score(toks)
    assert known == 0 and s == pytest.approx(model.classify_tokens(toks).score, rel=1e-9)
    assert load_model(path).classify_tokens(toks).label == "unsure"


def test_the_online_protocol_has_no_infinite_score_at_its_start():
    """TREC's protocol from an empty model: the second message (a ham after one spam)
    used to score +inf, above every spam of the stream."""
    msgs = [("s0", sample_message("spam", 0).read_bytes(), "spam")] + \
        [(f"h{i}", sample_message("ham", i).read_bytes(), "ham") for i in range(3)] + \
        [(f"s{i}", sample_message("spam", i).read_bytes(), "spam") for i in range(1, 4)]
    scores = evaluate.online(SpamModel, msgs)
    assert np.isfinite(scores.score).all()
    assert list(scores.known[:2]) == [0, 0] and (scores.known[2:] > 0).all()
    learned = evaluate.online(lambda: SpamModel(prior="learned"), msgs)
    assert learned.score[1] == math.inf  # what the learned prior does
