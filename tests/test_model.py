"""SpamModel: learning is counting, relabelling moves, state round-trips."""

import tracemalloc

import numpy as np
import pytest

from spamnb.model import FORMAT_VERSION, ModelFormatError, SpamModel, message_key

HAM1 = b"Message-ID: <h1@x>\nSubject: lunch meeting\n\nsee you at lunch tomorrow, the agenda is attached\n"
HAM2 = b"Subject: perl question\n\nhow do I sort a hash by value in perl\n"
SPAM1 = b"Message-ID: <s1@y>\nSubject: cheap pills\n\nbuy cheap pills now, click http://pills.example.biz/\n"
SPAM2 = b"Subject: you won\n\nclaim your cheap prize now, click here\n"


def trained(**kw):
    m = SpamModel(**kw)
    m.learn([(HAM1, "ham"), (HAM2, "ham"), (SPAM1, "spam"), (SPAM2, "spam")])
    return m


def counts(m):
    return m.estimator.class_count_.copy(), m.estimator.feature_count_.copy()


def test_classifies_training_mail():
    m = trained()
    assert m.classify(SPAM1).label == "spam"
    assert m.classify(HAM2).label == "ham"
    r = m.classify(SPAM2)
    assert 0.5 < r.spam_probability <= 1 and r.score > 0


def test_score_is_log_odds_of_probability():
    m = trained(alpha=1.0)
    r = m.classify(b"Subject: cheap lunch\n\nclick for lunch\n")
    assert r.score == pytest.approx(np.log(r.spam_probability / (1 - r.spam_probability)), rel=1e-9)


def test_presence_l2_rows_have_unit_length():
    m = trained()
    X, _ = m._rows([m.tokens(SPAM1), m.tokens(HAM2)], grow=False)
    np.testing.assert_allclose(np.asarray(X.multiply(X).sum(axis=1)).ravel(), 1.0)
    assert np.ptp(X[0].data) == 0  # presence: every token weighs the same


def test_learning_twice_counts_once():
    m = trained()
    before = counts(m)
    done = m.learn([(SPAM1, "spam"), (HAM2, "ham")])
    assert done == {"learned": 0, "moved": 0, "unchanged": 2}
    after = counts(m)
    np.testing.assert_array_equal(before[0], after[0])
    np.testing.assert_array_equal(before[1], after[1])


def test_relearning_under_other_label_moves_message():
    m = trained()
    m.learn([(SPAM1, "ham")])
    assert m.estimator.class_count_.tolist() == [3, 1]
    # Same state as learning it as ham in the first place.
    ref = SpamModel()
    ref.learn([(HAM1, "ham"), (HAM2, "ham"), (SPAM1, "ham"), (SPAM2, "spam")])
    for tok in ref.vocabulary.tokens():
        i, j = m.vocabulary.index(tok), ref.vocabulary.index(tok)
        # rows are unit-length floats, so subtracting is exact only to rounding
        np.testing.assert_allclose(m.estimator.feature_count_[:, i], ref.estimator.feature_count_[:, j],
                                   rtol=0, atol=1e-12)


def test_move_within_one_batch():
    m = SpamModel()
    m.learn([(HAM1, "ham"), (HAM1, "spam"), (HAM2, "ham"), (SPAM2, "spam")])
    assert m.estimator.class_count_.tolist() == [1, 2]


@pytest.mark.parametrize("features", ["counts", "presence", "presence-l2", "logtf-l2"])
def test_forget_is_inverse_of_learn(features):
    m = trained(features=features)
    before = counts(m)
    extra = b"Subject: new offer\n\nan entirely new offer with newwords\n"
    m.learn([(extra, "spam")])
    assert m.forget([(extra, "spam")]) == 1
    after = counts(m)
    np.testing.assert_array_equal(before[0], after[0])
    np.testing.assert_allclose(before[1], after[1][:, : before[1].shape[1]], rtol=0, atol=1e-12)
    np.testing.assert_allclose(after[1][:, before[1].shape[1]:], 0, atol=1e-12)


def test_forget_refuses_unknown_or_mislabelled_and_changes_nothing():
    m = trained()
    before = counts(m)
    with pytest.raises(ValueError, match="not learned"):
        m.forget([(b"Subject: never seen\n\nhello\n", "ham")])
    with pytest.raises(ValueError, match="learned as spam"):
        m.forget([(HAM1, "ham"), (SPAM1, "ham")])
    np.testing.assert_array_equal(before[1], counts(m)[1])


def test_message_key_is_message_id_and_body():
    # header fields added on the way (a filter's verdict, a client's status) keep the key
    assert message_key(HAM1) == message_key(HAM1.replace(b"Subject:", b"X-Spam-Flag: YES\nSubject:"))
    # another message that reuses the Message-ID does not share it
    assert message_key(HAM1) != message_key(HAM1.replace(b"agenda", b"minutes"))
    assert message_key(HAM2) != message_key(HAM2.replace(b"perl", b"python"))
    # A Message-ID in the body is not the message's.
    body_only = b"Subject: x\n\nMessage-ID: <h1@x>\n"
    assert message_key(body_only) != message_key(HAM1)


@pytest.mark.parametrize("model_type", ["multinomial", "bernoulli", "complement"])
def test_linear_weights_reproduce_scores(model_type):
    m = trained(model_type=model_type, alpha=0.5)
    bias, w = m.linear_weights()
    for raw in (HAM1, SPAM2, b"Subject: cheap perl\n\nunseen words only zzz\n"):
        X, _ = m._rows([m.tokens(raw)], grow=False)
        expected = m.score_tokens([m.tokens(raw)])[0][0]
        assert bias + X.data @ w[X.indices] == pytest.approx(expected, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("model_type", ["multinomial", "bernoulli", "complement"])
def test_an_online_step_costs_the_message_not_the_model(model_type):
    # classify, then learn, one message bringing new tokens, on a model of 300,000
    # tokens: memory in proportion to the message (vocabulary, estimator, doc_freq,
    # registry), far below one pointer or float per token (2.4 MB)
    n = 300_000
    m = SpamModel(model_type=model_type)
    m.learn_tokens([[f"v#{i}" for i in range(n)]], ["ham"])
    m.learn_tokens([["spare"]], ["spam"])  # the per-token arrays double here: spare room from now on
    toks = m.tokens(SPAM1) + ["v#12", "v#345", "v#12"]
    tracemalloc.start()
    m.score_tokens([toks])
    m.learn_tokens([toks], ["spam"])  # new tokens: the vocabulary and every count array grow
    m.classify(HAM1)
    m.learn([(HAM1, "ham")])  # through the registry
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 200_000, peak  # bytes
    assert len(m.vocabulary) == len(m.doc_freq) == m.estimator.n_features_in_ > n + 1
    grown = m.vocabulary.tokens()[n + 1:]  # after v#0..v#{n-1} and "spare": the two messages' new tokens
    assert grown == list(dict.fromkeys(t for t in toks + m.tokens(HAM1) if not t.startswith("v#")))
    assert [m.vocabulary.index(t) for t in grown] == list(range(n + 1, len(m.vocabulary)))
    assert m.doc_freq[m.vocabulary.index("v#12")] == 2 and m.messages.tolist() == [2, 2]


def test_state_round_trip():
    m = trained(model_type="bernoulli", alpha=0.25, prior="smoothed")
    m2 = SpamModel.from_state(m.to_state())
    assert m2.model_type == "bernoulli" and m2.alpha == 0.25 and m2.prior == "smoothed"
    assert m2.vocabulary.tokens() == m.vocabulary.tokens()
    assert m2.registry == m.registry and len(m.registry) == 4
    state = m.to_state()
    assert set(state["registry"]) == {"keys16", "classes"}  # packed: two objects, not 2 per message
    # the plain forms earlier files hold still load
    older = {**state, "registry": dict(m.registry), "vocabulary": m.vocabulary.tokens()}
    m3 = SpamModel.from_state(older)
    assert m3.registry == m.registry and m3.vocabulary.tokens() == m.vocabulary.tokens()
    for raw in (HAM1, SPAM1, SPAM2):
        assert m2.classify(raw) == m.classify(raw)
    # and it keeps learning from where it was
    assert m2.learn([(SPAM1, "spam")])["unchanged"] == 1


def test_state_refuses_other_versions_and_damage():
    state = trained().to_state()
    with pytest.raises(ModelFormatError, match="format version 99"):
        SpamModel.from_state({**state, "format_version": 99})
    assert FORMAT_VERSION != 99
    with pytest.raises(ModelFormatError, match="not a spamnb model"):
        SpamModel.from_state({"weights": [1, 2]})
    bad = dict(state)
    bad["feature_count"] = state["feature_count"][:, :3]
    with pytest.raises(ModelFormatError):
        SpamModel.from_state(bad)
    missing = dict(state)
    del missing["vocabulary"]
    with pytest.raises(ModelFormatError, match="damaged"):
        SpamModel.from_state(missing)


def test_prune_drops_rare_tokens_and_keeps_counts_aligned():
    m = trained()
    common = [t for t in m.vocabulary.tokens() if m.doc_freq[m.vocabulary.index(t)] >= 2]
    fc = {t: m.estimator.feature_count_[:, m.vocabulary.index(t)].copy() for t in common}
    m.prune(2)
    assert sorted(m.vocabulary.tokens()) == sorted(common)
    for t in common:
        np.testing.assert_array_equal(m.estimator.feature_count_[:, m.vocabulary.index(t)], fc[t])


def test_unknown_tokens_are_counted():
    m = trained()
    r = m.classify(b"Subject: zzyzx qwertyuiop\n\nfrobnicate\n")
    assert r.n_unknown >= 2 and r.n_tokens >= r.n_unknown


def test_bad_labels_and_types():
    with pytest.raises(ValueError, match="model type"):
        SpamModel(model_type="svm")
    with pytest.raises(ValueError, match="prior"):
        SpamModel(prior="flat")
    with pytest.raises(ValueError, match="label"):
        SpamModel().learn([(HAM1, "maybe")])


def test_unit_length_transform_with_empty_rows():
    import scipy.sparse as sp

    from spamnb.model import transform_features

    X = sp.csr_matrix(np.array([[0, 0, 0], [3, 4, 0], [0, 0, 0], [1, 0, 0], [0, 0, 0]], dtype=float))
    Y = transform_features(X.copy(), "presence-l2")
    np.testing.assert_allclose(Y.toarray(), [[0, 0, 0], [0.6, 0.8, 0], [0, 0, 0], [1, 0, 0], [0, 0, 0]])
    Z = transform_features(X.copy(), "logtf-l2")
    v = np.log1p([3.0, 4.0])
    np.testing.assert_allclose(Z.toarray()[1, :2], v / np.linalg.norm(v))
    assert transform_features(sp.csr_matrix((2, 4)), "presence-l2").nnz == 0


def test_refine_adds_hard_rows_until_margin():
    from spamnb.model import refine

    m = SpamModel(alpha=1.0, refine_rounds=0)
    train = [(HAM1, "ham"), (HAM2, "ham"), (SPAM1, "spam"), (SPAM2, "spam"),
             (b"Subject: cheap lunch\n\nlunch offer now\n", "ham")]
    m.learn(train)
    X, _ = m._rows([m.tokens(r) for r, _ in train], grow=False)
    y = np.array([lb == "spam" for _, lb in train], dtype=int)
    jll = m.estimator.predict_joint_log_proba(X)
    margins = np.where(y == 1, 1, -1) * (jll[:, 1] - jll[:, 0])
    before = m.estimator.class_count_.copy()
    added = refine(m.estimator, X, y, rounds=1, margin=3.0)
    # one round adds exactly the rows inside the margin, once each
    assert added == int((margins < 3.0).sum()) > 0
    np.testing.assert_array_equal(m.estimator.class_count_ - before,
                                  [((margins < 3.0) & (y == 0)).sum(), ((margins < 3.0) & (y == 1)).sum()])
    # more rounds only widen every margin that was short
    refine(m.estimator, X, y, rounds=20, margin=3.0)
    jll = m.estimator.predict_joint_log_proba(X)
    assert (np.where(y == 1, 1, -1) * (jll[:, 1] - jll[:, 0]) > margins - 1e-9).all()


def test_refine_copies_are_not_messages():
    m = trained()
    X, _ = m._rows([m.tokens(r) for r in (HAM1, SPAM2)], grow=False)
    m.refine_rows(X, [0, 1])
    np.testing.assert_array_equal(m.messages, [2, 2])
    m2 = SpamModel.from_state(m.to_state())
    np.testing.assert_array_equal(m2.messages, [2, 2])
    assert m2.refine_rounds == m.refine_rounds and m2.refine_margin == m.refine_margin


def test_explain_reports_occurrences_not_feature_values():
    m = trained()
    raw = b"Subject: cheap cheap cheap\n\ncheap pills, click now\n"
    ev = m.explain(raw, 50)
    counts = {tok: n for tok, n, _ in ev.tokens}
    assert counts["subject:cheap"] == 3
    assert all(n >= 1 for n in counts.values())
    assert ev.prior + sum(c for _, _, c in ev.tokens) == pytest.approx(ev.score, rel=1e-9, abs=1e-9)
