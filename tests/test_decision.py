"""Tests for spamnb.nb.decision: minimum-risk decisions and cost cut-offs."""

from fractions import Fraction as F

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from spamnb.nb.decision import (
    Cutoffs,
    bayes_decision,
    conditional_risk,
    cutoffs_from_costs,
    spam_loss_matrix,
    zero_one_loss,
)


def test_conditional_risk_by_hand():
    proba = np.array([[0.25, 0.75]])
    loss = np.array([[0, 4], [2, 2], [8, 0]])  # ham, unsure, spam
    # R(ham) = 4·0.75 = 3, R(unsure) = 2, R(spam) = 8·0.25 = 2 -> tie -> lower index (unsure)
    np.testing.assert_array_equal(conditional_risk(proba, loss), [[3.0, 2.0, 2.0]])
    actions, risk = bayes_decision(proba, loss, return_risk=True)
    assert actions.tolist() == [1]


def test_zero_one_loss_is_argmax():
    rng = np.random.default_rng(0)
    for K in (2, 3, 7):
        p = rng.dirichlet(np.ones(K), size=200)
        np.testing.assert_array_equal(bayes_decision(p, zero_one_loss(K)), p.argmax(axis=1))
        # R(c_i|x) = 1 − P(c_i|x)
        np.testing.assert_allclose(conditional_risk(p, zero_one_loss(K)), 1 - p, atol=1e-15)


@given(st.integers(2, 6).flatmap(lambda k: st.lists(st.floats(0.01, 1), min_size=k, max_size=k)))
@settings(max_examples=50, deadline=None)
def test_property_zero_one_loss_is_argmax(w):
    p = np.array([w]) / np.sum(w)
    top = np.sort(p[0])
    assume(top[-1] - top[-2] > 1e-9)  # float ties may go either way
    assert bayes_decision(p, zero_one_loss(len(w)))[0] == np.argmax(p)


def test_two_class_cutoff_ten_to_one():
    assert cutoffs_from_costs(10, 1) == (F(10, 11), F(10, 11))
    assert cutoffs_from_costs(1, 1) == (F(1, 2), F(1, 2))
    h, s = cutoffs_from_costs(10.0, 1.0)
    assert h == s == 10 / 11
    loss = spam_loss_matrix(10, 1)
    p = np.array([0.0, 0.5, 0.9, 10 / 11 - 1e-9, 10 / 11 + 1e-9, 0.95, 1.0])
    proba = np.column_stack([1 - p, p])
    # actions 0 = ham, 2 = spam; the +inf unsure row is never chosen
    assert bayes_decision(proba, loss).tolist() == [0, 0, 0, 0, 2, 2, 2]
    assert Cutoffs.from_costs(10, 1).labels(p).tolist() == ["ham"] * 4 + ["spam"] * 3


def test_unsure_band():
    # C_fp = 10, C_fn = 1, C_u = 1/2: ham iff p <= C_u/C_fn = 1/2, spam iff p > 1 − C_u/C_fp = 19/20
    assert cutoffs_from_costs(10, 1, F(1, 2)) == (F(1, 2), F(19, 20))
    loss = spam_loss_matrix(10, 1, 0.5)
    p = np.linspace(0, 1, 2001)
    acts = bayes_decision(np.column_stack([1 - p, p]), loss)
    labels = Cutoffs.from_costs(10, 1, F(1, 2)).labels(p)
    names = np.array(["ham", "unsure", "spam"])[acts]
    np.testing.assert_array_equal(labels, names)
    assert set(labels[(p > 0.5) & (p <= 0.95)]) == {"unsure"}
    assert set(labels[p <= 0.5]) == {"ham"} and set(labels[p > 0.95]) == {"spam"}


def test_unsure_band_empty_collapses():
    # C_u >= C_fp·C_fn/(C_fp+C_fn) = 10/11: unsure never wins
    assert cutoffs_from_costs(10, 1, 1) == (F(10, 11), F(10, 11))
    p = np.linspace(0, 1, 1001)
    acts = bayes_decision(np.column_stack([1 - p, p]), spam_loss_matrix(10, 1, 1))
    assert 1 not in acts
    c = Cutoffs.from_costs(10, 1, 1)
    assert c.label(0.5) == "ham" and c.label(0.99) == "spam"


@given(st.floats(0.1, 100), st.floats(0.1, 100), st.floats(0.01, 100), st.floats(0, 1))
@settings(max_examples=200, deadline=None)
def test_property_cutoffs_agree_with_risk(c_fp, c_fn, c_u, p):
    h, s = cutoffs_from_costs(c_fp, c_fn, c_u)
    risk = conditional_risk([[1 - p, p]], spam_loss_matrix(c_fp, c_fn, c_u))[0]
    label = Cutoffs(h, s).label(p)
    chosen = ["ham", "unsure", "spam"].index(label)
    assert risk[chosen] <= risk.min() + 1e-9 * max(c_fp, c_fn, c_u)


def test_validation():
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError):
            cutoffs_from_costs(bad, 1)
        with pytest.raises(ValueError):
            spam_loss_matrix(1, 1, bad)
    with pytest.raises(TypeError):
        cutoffs_from_costs("1", 1)
    with pytest.raises(ValueError):
        bayes_decision([[0.5, 0.5]], [[0, 1, 2]])
    with pytest.raises(ValueError):
        bayes_decision([[np.nan, 0.5]], zero_one_loss(2))
    with pytest.raises(ValueError):
        Cutoffs(0.9, 0.1)
    with pytest.raises(ValueError):
        Cutoffs(0.1, 0.9).label(1.5)


def test_decision_imports_only_numpy():
    import ast
    import pathlib

    import spamnb.nb.decision as d

    tree = ast.parse(pathlib.Path(d.__file__).read_text())
    mods = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    mods |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert mods - {"numpy", "__future__", "math", "numbers", "dataclasses", "fractions", "spamnb.verdict"} == set()
