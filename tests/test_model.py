"""SpamModel: learning is counting, relabelling moves, state round-trips."""

import tracemalloc

import numpy as np
import pytest

from spamnb.model import FORMAT_VERSION, ModelFormatError, SpamModel, legacy_message_key, message_key

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
    assert done == {"learned": 0, "moved": 0, "unchanged": 2, "duplicates": 0}
    after = counts(m)
    np.testing.assert_array_equal(before[0], after[0])
    np.testing.assert_array_equal(before[1], after[1])


def test_a_message_given_twice_in_one_call_is_a_duplicate():
    m = trained()
    extra = b"Subject: new offer\n\nan entirely new offer\n"
    done = m.learn([(extra, "spam"), (SPAM1, "spam"), (extra + b"\n", "spam"), (SPAM1, "spam")])
    assert done == {"learned": 1, "moved": 0, "unchanged": 1, "duplicates": 2}
    assert m.class_count.tolist() == [2, 3]


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


@pytest.mark.parametrize("features", ["counts", "presence-l2"])
def test_a_copy_with_a_clients_fields_moves_and_forgets(features):
    """A mail client's status fields are tokens: the copy's row is not the row learned."""
    def with_status(raw):
        return raw.replace(b"\n\n", b"\nStatus: RO\nX-Keywords: $Junk\n\n", 1)

    spam2 = with_status(SPAM2)  # the client's fields are in the vocabulary
    m = SpamModel(features=features)
    m.learn([(HAM1, "ham"), (HAM2, "ham"), (SPAM1, "spam"), (spam2, "spam")])
    copy = with_status(HAM1)  # the same message, to learn
    assert m.learn([(copy, "spam")]) == {"learned": 0, "moved": 1, "unchanged": 0, "duplicates": 0}
    assert m.class_count.tolist() == [1, 3]
    assert (m.estimator.feature_count_ >= 0).all() and (m.doc_freq >= 0).all()
    assert m.forget([(copy, "spam")]) == 1
    assert m.class_count.tolist() == [1, 2]
    # the ham class holds what it would without the message: exactly for counts, and to
    # within the scaling of a row with four tokens more for presence-l2
    ref = SpamModel(features=features)
    ref.learn([(HAM2, "ham"), (SPAM1, "spam"), (spam2, "spam")])
    ref_ham = {tok: ref.estimator.feature_count_[0, i] for i, tok in enumerate(ref.vocabulary.tokens())}
    ham = [(ref_ham.get(tok, 0.0), m.estimator.feature_count_[0, i]) for i, tok in enumerate(m.vocabulary.tokens())]
    np.testing.assert_allclose(*zip(*ham), rtol=0, atol=1e-12 if features == "counts" else 0.05)


def test_forget_refuses_unknown_or_mislabelled_and_changes_nothing():
    m = trained()
    before = counts(m)
    with pytest.raises(ValueError, match="not learned"):
        m.forget([(b"Subject: never seen\n\nhello\n", "ham")])
    with pytest.raises(ValueError, match="learned as spam"):
        m.forget([(HAM1, "ham"), (SPAM1, "ham")])
    np.testing.assert_array_equal(before[1], counts(m)[1])


MAIL = (b"Received: from mx.example.org by mail.example.net; Mon, 2 Sep 2002 16:21:48 +0100\n"
        b"Message-ID: <m1@example.org>\nDate: Mon, 2 Sep 2002 16:21:40 +0100\n"
        b"From: Ann <ann@example.org>\nTo: bob@example.net,\n\tcarol@example.net\nSubject: the agenda\n"
        b"\nsee you at lunch\nFrom now on the agenda is attached   \n")


def _below_headers(raw, lines):
    cut = raw.index(b"\n\n") + 1
    return raw[:cut] + lines + raw[cut:]


@pytest.mark.parametrize("mid", [True, False], ids=["message-id", "no-message-id"])
def test_message_key_survives_what_delivery_and_clients_change(mid):
    raw = MAIL if mid else MAIL.replace(b"Message-ID: <m1@example.org>\n", b"")
    same = [
        b"From ann@example.org  Mon Sep  2 16:21:48 2002\n" + raw,  # mbox From_ line
        raw + b"\n",  # one more trailing newline
        raw.rstrip(b"\n"),  # or none
        raw.replace(b"\n", b"\r\n"),  # CRLF
        raw.replace(b"\nFrom now", b"\n>From now"),  # mbox quoting
        raw.rstrip(b"\n") + b"  \r\n\r\n",  # blanks at the end
        _below_headers(raw, b"X-Spam-Flag: YES\nX-Spam-Status: Yes, probability=0.999\n"),  # our verdict
        _below_headers(raw, b"Status: RO\nX-Status: A\nX-Keywords: $Junk\nContent-Length: 42\n"),  # a client
        b"Return-Path: <ann@example.org>\nDelivered-To: bob@example.net\n" + raw,  # the MTA
        raw.replace(b"To: bob@example.net,\n\tcarol", b"To: bob@example.net, carol"),  # folding
    ]
    for copy in same:
        assert message_key(copy) == message_key(raw), copy
    different = [
        raw.replace(b"lunch", b"dinner"),  # another body (a Message-ID reused by another message)
        raw.replace(b"Subject: the agenda", b"Subject: the minutes"),
        raw.replace(b"From: Ann", b"From: Anne"),
        raw.replace(b"Date: Mon, 2 Sep 2002 16:21:40", b"Date: Mon, 2 Sep 2002 16:21:41"),
        raw.replace(b"carol@", b"dave@"),
        raw.replace(b"see you", b"\nsee you"),  # a blank line more at the top of the body
    ]
    assert len({message_key(m) for m in different + [raw]}) == len(different) + 1


def test_message_key_of_what_is_not_mail_is_its_content():
    # no identity field: the whole content counts, so no two such inputs collide by their body
    assert message_key(b"X-A: 1\n\n") != message_key(b"X-B: 2\n\n")
    assert message_key(b"hello world") != message_key(b"hello")
    assert message_key(b"hello world\r\n\n") == message_key(b"hello world")
    assert message_key(b"") == message_key(b"\n")
    # a Message-ID in the body is not the message's
    assert message_key(b"Subject: x\n\nMessage-ID: <h1@x>\n") != message_key(b"Subject: x\n\n")


def test_forget_counts_a_message_given_twice_once():
    m = trained()
    before = counts(m)
    extra = b"Subject: new offer\n\nan entirely new offer with newwords\n"
    m.learn([(extra, "spam")])
    assert m.forget([(extra, "spam"), (extra + b"\n", "spam")]) == 1
    np.testing.assert_array_equal(before[0], counts(m)[0])


def test_version_1_model_finds_its_messages_by_their_old_keys():
    m = trained()
    old = m.to_state()
    # a file of format version 1: its registry holds the keys of legacy_message_key
    old.update(format_version=1, registry={legacy_message_key(raw): c for raw, c in
                                           [(HAM1, 0), (HAM2, 0), (SPAM1, 1), (SPAM2, 1)]})
    del old["legacy_registry"]
    v1 = SpamModel.from_state(old)
    assert v1.registry == {} and len(v1.legacy_registry) == 4
    assert v1.learn([(SPAM1, "spam")]) == {"learned": 0, "moved": 0, "unchanged": 1, "duplicates": 0}
    assert v1.registry == {message_key(SPAM1): 1} and len(v1.legacy_registry) == 3  # moved to its new key
    v1.learn([(HAM2, "spam")])  # a correction moves it, as before
    assert v1.class_count.tolist() == [1, 3]
    assert v1.forget([(SPAM2, "spam")]) == 1
    with pytest.raises(ValueError, match="not learned"):
        v1.forget([(b"Subject: never seen\n\nhello\n", "ham")])
    # saved as version 2: the keys not yet seen again are kept apart
    v2 = SpamModel.from_state(v1.to_state())
    assert v2.to_state()["format_version"] == FORMAT_VERSION == 2
    assert v2.registry == v1.registry and v2.legacy_registry == {legacy_message_key(HAM1): 0}
    assert v2.forget([(HAM1, "ham")]) == 1 and v2.legacy_registry == {}


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
