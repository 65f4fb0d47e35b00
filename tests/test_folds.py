"""Folds: disjoint, covering, stratified, deterministic."""

import hashlib

import numpy as np
import pytest

from spamnb.evaluation.folds import hash_folds, split_half, stratified_kfold, train_test_split

LABELS = np.array([1] * 37 + [0] * 83)


@pytest.mark.parametrize("k", [2, 5, 10])
def test_stratified_kfold_covers_and_stratifies(k):
    folds = stratified_kfold(LABELS, k, seed=3)
    assert folds.shape == LABELS.shape
    # one fold id per item: disjoint and covering by construction; all ids used
    assert set(folds.tolist()) == set(range(k))
    for c in (0, 1):
        per_fold = np.bincount(folds[LABELS == c], minlength=k)
        assert per_fold.sum() == np.count_nonzero(LABELS == c)
        assert per_fold.max() - per_fold.min() <= 1
    sizes = np.bincount(folds, minlength=k)
    assert sizes.max() - sizes.min() <= 1


def test_stratified_kfold_deterministic_and_seeded():
    a = stratified_kfold(LABELS, 5, seed=1)
    assert np.array_equal(a, stratified_kfold(LABELS, 5, seed=1))
    assert not np.array_equal(a, stratified_kfold(LABELS, 5, seed=2))
    # string labels work too
    s = np.where(LABELS == 1, "spam", "ham")
    assert np.array_equal(stratified_kfold(s, 5, seed=1), a)


def test_stratified_kfold_rejects_bad_k():
    with pytest.raises(ValueError):
        stratified_kfold(LABELS, 1)
    with pytest.raises(ValueError):
        stratified_kfold([0, 1], 3)


def test_hash_folds_golden():
    # md5("a") = 0cc175b9c0f1b6a831c399e269772661
    assert hashlib.md5(b"a").hexdigest() == "0cc175b9c0f1b6a831c399e269772661"
    # 0x0cc175b9...661 % 5 == 2 and % 10 == 7 (worked out once, kept as golden values)
    assert hash_folds(["a"], 5).tolist() == [2]
    assert hash_folds(["a"], 10).tolist() == [7]
    # paths in the SpamAssassin index format
    keys = ["ham/easy_ham.00001.7c53336b37003a9286aba55d2945844c", "spam/spam.00001.bfc8d64d12b325ff385cca8d07b84288"]
    assert hash_folds(keys, 5).tolist() == [3, 3]
    assert hash_folds(keys, 10).tolist() == [3, 3]
    assert hash_folds(keys, 1).tolist() == [0, 0]
    with pytest.raises(ValueError):
        hash_folds(keys, 0)


def test_train_test_split_stratified_disjoint_covering():
    train, test = train_test_split(LABELS, 0.2, seed=0)
    assert np.intersect1d(train, test).size == 0
    assert np.array_equal(np.sort(np.r_[train, test]), np.arange(LABELS.size))
    assert np.count_nonzero(LABELS[test] == 1) == round(0.2 * 37)
    assert np.count_nonzero(LABELS[test] == 0) == round(0.2 * 83)
    a, b = split_half(LABELS, seed=4)
    assert abs(a.size - b.size) <= 2
    with pytest.raises(ValueError):
        train_test_split(LABELS, 1.0)
