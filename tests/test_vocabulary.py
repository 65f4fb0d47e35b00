"""Tests for spamnb.nb.vocabulary: hand-checked CSR matrices, pruning, oracles."""

import pickle
import tracemalloc

import numpy as np
import pytest
import scipy.sparse as sp

from spamnb.nb.vocabulary import Vocabulary, document_frequency, remap_csr


def assert_csr(X, data, indices, indptr, shape):
    """X is canonical CSR with exactly these arrays."""
    assert sp.isspmatrix_csr(X)
    assert X.shape == shape
    assert X.indices.dtype == np.int32
    assert X.has_canonical_format
    np.testing.assert_array_equal(X.data, data)
    np.testing.assert_array_equal(X.indices, indices)
    np.testing.assert_array_equal(X.indptr, indptr)


def test_mapping_basics():
    v = Vocabulary(["a", "b", "c"])
    assert len(v) == 3
    assert "b" in v and "z" not in v
    assert v.index("c") == 2 and v.index("z") is None
    assert v.tokens() == ["a", "b", "c"]
    v.tokens().append("mutate")  # a copy
    assert len(v) == 3


def test_duplicate_initial_tokens_rejected():
    with pytest.raises(ValueError, match="duplicate"):
        Vocabulary(["a", "b", "a"])


def test_transform_counts_hand_example():
    v = Vocabulary(["a", "b", "c"])
    docs = [["b", "a", "b", "x"], [], ["c", "y", "y", "c", "a"]]
    X, n_unknown = v.transform(docs)
    # doc0: a=1 b=2 (x unknown); doc1 empty; doc2: a=1 c=2 (y twice unknown)
    assert_csr(X, [1.0, 2.0, 1.0, 2.0], [0, 1, 0, 2], [0, 2, 2, 4], (3, 3))
    np.testing.assert_array_equal(n_unknown, [1, 0, 2])
    assert n_unknown.dtype == np.int64
    assert X.dtype == np.float64
    assert len(v) == 3  # not grown


def test_transform_binary():
    v = Vocabulary(["a", "b", "c"])
    X, n_unknown = v.transform([["b", "a", "b", "x"], ["c", "c", "c"]], binary=True)
    assert_csr(X, [1.0, 1.0, 1.0], [0, 1, 2], [0, 2, 3], (2, 3))
    np.testing.assert_array_equal(n_unknown, [1, 0])


def test_transform_dtype():
    X, _ = Vocabulary(["a"]).transform([["a", "a"]], dtype=np.int32)
    assert X.dtype == np.int32
    assert X.toarray().tolist() == [[2]]


def test_transform_grow_appends_in_first_seen_order():
    v = Vocabulary(["a", "b"])
    X, n_unknown = v.transform([["z", "a", "y"], ["y", "b", "w", "y"]], grow=True)
    assert v.tokens() == ["a", "b", "z", "y", "w"]
    assert [v.index(t) for t in "abzyw"] == [0, 1, 2, 3, 4]
    # doc0: a(0)=1 z(2)=1 y(3)=1 ; doc1: b(1)=1 y(3)=2 w(4)=1
    assert_csr(X, [1, 1, 1, 1, 2, 1], [0, 2, 3, 1, 3, 4], [0, 3, 6], (2, 5))
    np.testing.assert_array_equal(n_unknown, [0, 0])


def test_fit_transform_from_empty_and_generators():
    v = Vocabulary()
    docs = (iter(d) for d in [["x", "y", "x"], ["y"]])  # generators of generators
    X = v.fit_transform(docs)
    assert v.tokens() == ["x", "y"]
    assert_csr(X, [2.0, 1.0, 1.0], [0, 1, 1], [0, 2, 3], (2, 2))


def test_transform_no_docs_and_empty_vocabulary():
    X, n_unknown = Vocabulary(["a"]).transform([])
    assert X.shape == (0, 1) and X.nnz == 0 and n_unknown.shape == (0,)
    X, n_unknown = Vocabulary().transform([["a", "b"], []])
    assert X.shape == (2, 0) and X.nnz == 0
    np.testing.assert_array_equal(n_unknown, [2, 0])


def test_grow_then_transform_is_consistent():
    v = Vocabulary()
    X1 = v.fit_transform([["a", "b"], ["b", "c"]])
    X2, unk = v.transform([["a", "b"], ["b", "c"]])
    assert (X1 != X2).nnz == 0 and not unk.any()


def test_grow_failure_midway_keeps_vocabulary_consistent():
    v = Vocabulary(["a"])

    def docs():
        yield ["b"]
        raise RuntimeError("tokenizer failed")

    with pytest.raises(RuntimeError):
        v.transform(docs(), grow=True)
    assert v.tokens() == ["a", "b"]
    assert v.index("b") == 1


def test_growth_over_many_steps_appends_in_first_seen_order():
    # an online run: one document at a time, through transform and ids, on a
    # vocabulary that already holds tokens; repeats within a document and tokens
    # known from earlier steps get no new id
    rng = np.random.default_rng(3)
    alphabet = [f"t{i}" for i in range(400)]
    v, seen = Vocabulary(["t7", "t3"]), ["t7", "t3"]
    for step in range(150):
        doc = list(rng.choice(alphabet, size=rng.integers(0, 12)))
        before = len(v)
        if step % 2:
            X, _ = v.transform([doc], grow=True)
            assert X.shape == (1, len(v))
            assert [v.tokens()[j] for j in X.indices] == sorted(set(doc), key=v.index)
        else:
            ids = v.ids(doc, grow=True)
            assert [v.tokens()[j] for j in ids] == doc
        seen += [t for t in dict.fromkeys(doc) if t not in seen]
        assert v.tokens() == seen  # first-seen order, ids dense
        assert v.tokens()[before:] == [t for t in dict.fromkeys(doc) if t not in seen[:before]]
    assert [v.index(t) for t in seen] == list(range(len(seen)))
    assert Vocabulary(seen) == v  # the id -> token list and the token -> id dict agree


def test_growing_by_a_few_tokens_costs_those_tokens_not_the_vocabulary():
    # Closing a growing step must not copy every key (it did: list(index)[n:],
    # 8 bytes a token, for each document that brought a new token).
    n = 400_000
    v = Vocabulary(f"t{i}" for i in range(n))
    doc = ["t5", "new1", "t9", "new2", "new1", "new3"]
    tracemalloc.start()
    X, _ = v.transform([doc], grow=True)
    ids = v.ids(["new4", "t1", "new5"], grow=True)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 100_000, peak  # bytes; one pointer per token of the vocabulary is 3.2 MB
    assert v.tokens()[n:] == ["new1", "new2", "new3", "new4", "new5"]
    assert X.indices.tolist() == [5, 9, n, n + 1, n + 2] and X.data.tolist() == [1, 1, 2, 1, 1]
    assert ids.tolist() == [n + 3, 1, n + 4] and v.index("new5") == n + 4


def test_document_frequency():
    X = sp.csr_matrix(np.array([[2, 0, 1], [0, 0, 3], [1, 0, 0]]))
    df = document_frequency(X)
    np.testing.assert_array_equal(df, [2, 0, 2])
    assert df.dtype == np.int64


def test_document_frequency_ignores_explicit_zeros_and_duplicates():
    # row 0 has column 1 twice (duplicate), row 1 stores an explicit zero at column 0
    X = sp.csr_matrix(([1.0, 1.0, 0.0], [1, 1, 0], [0, 2, 3]), shape=(2, 2))
    np.testing.assert_array_equal(document_frequency(X), [0, 1])


def _docs():
    # token: doc freq / total count
    # a: 3 docs / 4   b: 1 / 3   c: 2 / 2   d: 1 / 1   e: 3 / 3
    return [["a", "b", "b", "b", "e"], ["a", "c", "e"], ["a", "a", "c", "d", "e"]]


def test_prune_min_df_hand_checked():
    v = Vocabulary()
    X = v.fit_transform(_docs())
    assert v.tokens() == ["a", "b", "e", "c", "d"]
    df = document_frequency(X)
    np.testing.assert_array_equal(df, [3, 1, 3, 2, 1])
    keep = v.prune(df, min_df=2)
    np.testing.assert_array_equal(keep, [0, 2, 3])
    assert v.tokens() == ["a", "e", "c"]
    assert [v.index(t) for t in ["a", "e", "c", "b", "d"]] == [0, 1, 2, None, None]
    Y = remap_csr(X, keep, 5)
    # rows: a,e ; a,c,e ; a(2),c,e   in new ids a=0 e=1 c=2
    np.testing.assert_array_equal(Y.toarray(), [[1, 1, 0], [1, 1, 1], [2, 1, 1]])
    assert Y.has_canonical_format and Y.indices.dtype == np.int32
    # the remapped matrix equals transforming with the pruned vocabulary
    Z, unk = v.transform(_docs())
    assert (Y != Z).nnz == 0
    np.testing.assert_array_equal(unk, [3, 0, 1])


def test_prune_max_features_by_doc_freq_ties_by_id():
    v = Vocabulary()
    X = v.fit_transform(_docs())  # ids a0 b1 e2 c3 d4, df [3,1,3,2,1]
    keep = v.prune(document_frequency(X), max_features=3)
    # df ranking: a(3) e(3) c(2) | b(1) d(1)
    np.testing.assert_array_equal(keep, [0, 2, 3])
    assert v.tokens() == ["a", "e", "c"]


def test_prune_max_features_tie_broken_by_smaller_id():
    v = Vocabulary()
    X = v.fit_transform(_docs())
    keep = v.prune(document_frequency(X), max_features=4)
    # b(1) and d(1) tie for the 4th place; b has the smaller id
    np.testing.assert_array_equal(keep, [0, 1, 2, 3])
    assert v.tokens() == ["a", "b", "e", "c"]


def test_prune_max_features_by_counts_after_min_df():
    v = Vocabulary()
    X = v.fit_transform(_docs())  # ids a0 b1 e2 c3 d4
    counts = np.asarray(X.sum(axis=0)).ravel()
    np.testing.assert_array_equal(counts, [4, 3, 3, 2, 1])
    keep = v.prune(document_frequency(X), min_df=1, max_features=2, counts=counts)
    np.testing.assert_array_equal(keep, [0, 1])  # a(4), then b(3) beats e(3) by id
    keep2 = Vocabulary(["a", "b", "e", "c", "d"]).prune(
        document_frequency(X), min_df=2, max_features=2, counts=counts)
    np.testing.assert_array_equal(keep2, [0, 2])  # b fails min_df; a(4), e(3)


def test_prune_without_doc_freq():
    v = Vocabulary(["a", "b", "c"])
    keep = v.prune(None, max_features=2, counts=np.array([1, 5, 5]))
    np.testing.assert_array_equal(keep, [1, 2])
    with pytest.raises(ValueError):
        Vocabulary(["a"]).prune(None, min_df=2)
    with pytest.raises(ValueError):
        Vocabulary(["a"]).prune(None, max_features=1)


def test_prune_noop_and_bad_lengths():
    v = Vocabulary(["a", "b"])
    np.testing.assert_array_equal(v.prune(np.array([1, 1])), [0, 1])
    assert v.tokens() == ["a", "b"]
    with pytest.raises(ValueError, match="doc_freq has 3 entries"):
        v.prune(np.array([1, 1, 1]), min_df=2)


def test_remap_csr_validation():
    X = sp.csr_matrix(np.eye(3))
    with pytest.raises(ValueError):
        remap_csr(X, [0, 1], 4)
    with pytest.raises(ValueError):
        remap_csr(X, [1, 0], 3)
    with pytest.raises(ValueError):
        remap_csr(X, [0, 3], 3)
    Y = remap_csr(X, np.array([], dtype=np.int64), 3)
    assert Y.shape == (3, 0) and Y.nnz == 0


def test_state_and_pickle_roundtrip():
    v = Vocabulary(["x", "y", "z"])
    state = v.to_state()
    assert state == {"tokens": "x\ny\nz", "n": 3}
    w = Vocabulary.from_state(state)
    assert w == v and w.index("z") == 2
    for tokens in ([], [""], ["", "a"], ["a", ""]):  # empty tokens survive the joined form
        assert Vocabulary.from_state(Vocabulary(tokens).to_state()).tokens() == tokens
    odd = Vocabulary(["line\nbreak", "x"])  # a token with a newline: the plain list
    assert odd.to_state() == ["line\nbreak", "x"] and Vocabulary.from_state(odd.to_state()) == odd
    assert Vocabulary.from_state(["x", "y", "z"]) == v  # the list form older files hold
    u = pickle.loads(pickle.dumps(v))
    assert u == v and u.index("y") == 1
    # the pickle holds the token list only, not the dict
    assert v.__reduce__() == (Vocabulary, (["x", "y", "z"],))


def test_random_docs_match_dense_counting():
    rng = np.random.default_rng(0)
    alphabet = [f"t{i}" for i in range(50)]
    docs = [list(rng.choice(alphabet, size=rng.integers(0, 40))) for _ in range(200)]
    v = Vocabulary(alphabet[:30])
    X, unk = v.transform(docs)
    dense = np.zeros((200, 30))
    for i, d in enumerate(docs):
        for t in d:
            if v.index(t) is not None:
                dense[i, v.index(t)] += 1
    np.testing.assert_array_equal(X.toarray(), dense)
    np.testing.assert_array_equal(unk, [sum(t not in v for t in d) for d in docs])
    assert X.has_canonical_format
    Xc = X.copy()
    Xc.has_canonical_format = False
    Xc.sum_duplicates()  # scipy's own canonicalisation changes nothing
    np.testing.assert_array_equal(Xc.indices, X.indices)
    np.testing.assert_array_equal(Xc.indptr, X.indptr)


def test_matches_sklearn_countvectorizer_up_to_column_permutation():
    feature_extraction = pytest.importorskip("sklearn.feature_extraction.text")
    rng = np.random.default_rng(1)
    alphabet = [f"w{i}" for i in range(300)] + ["url:example", "subject:free", "héllo"]
    docs = [list(rng.choice(alphabet, size=rng.integers(0, 80))) for _ in range(300)]
    cv = feature_extraction.CountVectorizer(analyzer=lambda d: d)
    Xs = cv.fit_transform(docs)
    for binary in (False, True):
        v = Vocabulary()
        X = v.fit_transform(docs, binary=binary)
        perm = [cv.vocabulary_[t] for t in v.tokens()]
        assert sorted(perm) == list(range(len(v)))
        expected = Xs[:, perm].toarray()
        if binary:
            expected = (expected > 0).astype(float)
        np.testing.assert_array_equal(X.toarray(), expected)


def test_shrink_moves_the_last_tokens_into_the_gaps_and_growth_goes_on():
    v = Vocabulary(["a", "b", "c", "d", "e", "f"])
    v.shrink([5, 4], [1, 2], 4)  # drop b, c (and nothing at the end): f -> 1, e -> 2
    assert v.tokens() == ["a", "f", "e", "d"] and len(v) == 4
    assert [v.index(t) for t in "afedbc"] == [0, 1, 2, 3, None, None]
    X, _ = v.transform([["g", "b", "a"]], grow=True)  # new tokens still get the next ids
    assert v.tokens() == ["a", "f", "e", "d", "g", "b"] and X.indices.tolist() == [0, 4, 5]
    v.shrink([], [], 5)  # drop the last one
    assert v.tokens() == ["a", "f", "e", "d", "g"] and v.index("b") is None
