"""Bayes decision: pick the action of minimum conditional risk (docs/naive-bayes.md §1).

Classes c_1..c_K, actions a_1..a_A (there may be more actions than classes, e.g.
an "unsure" action that holds a message for a person). ``loss[i, j]`` = λ_ij is
the loss of taking action i when the truth is class j. For a message x with
posteriors P(c_j | x) the conditional risk of action i is

    R(a_i | x) = Σ_j λ_ij · P(c_j | x)

and the Bayes-optimal rule takes argmin_i R(a_i | x). With 0-1 loss this is
argmax_j P(c_j | x).

For spam the classes are (ham, spam) and the actions (ham, unsure, spam).

This module imports only numpy: it sits on the filter's fast path.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from spamnb.verdict import ACTIONS, check_cost, check_cutoffs, label_for
from spamnb.verdict import cutoffs_from_costs as _costs_rule

__all__ = [
    "ACTIONS",
    "Cutoffs",
    "action_indices",
    "bayes_decision",
    "conditional_risk",
    "cutoffs_from_costs",
    "spam_loss_matrix",
    "zero_one_loss",
]



def _check_proba_loss(proba, loss):
    proba = np.asarray(proba, dtype=np.float64)
    loss = np.asarray(loss, dtype=np.float64)
    if proba.ndim != 2:
        raise ValueError(f"proba must be 2-D (n_samples, n_classes), got shape {proba.shape}")
    if loss.ndim != 2:
        raise ValueError(f"loss must be 2-D (n_actions, n_classes), got shape {loss.shape}")
    if loss.shape[1] != proba.shape[1]:
        raise ValueError(
            f"loss has {loss.shape[1]} class columns but proba has {proba.shape[1]} classes"
        )
    if not np.all(np.isfinite(proba)) or proba.min(initial=0.0) < 0 or proba.max(initial=0.0) > 1:
        raise ValueError("proba must contain probabilities in [0, 1] (no NaN/inf)")
    if np.isnan(loss).any() or (loss == -np.inf).any():
        raise ValueError("loss must not contain NaN or -inf (+inf marks a forbidden action)")
    return proba, loss


def conditional_risk(proba, loss):
    """Conditional risk of every action for every sample.

    Parameters
    ----------
    proba : array-like of shape (n_samples, n_classes)
        Posteriors P(c_j | x).
    loss : array-like of shape (n_actions, n_classes)
        ``loss[i, j]`` = λ_ij, loss of action i when the truth is class j.
        ``+inf`` marks an action that must never be taken against class j;
        ``0 · inf`` is taken as 0 (an impossible class costs nothing).

    Returns
    -------
    risk : ndarray of shape (n_samples, n_actions)
    """
    proba, loss = _check_proba_loss(proba, loss)
    inf = np.isinf(loss)
    finite_loss = np.where(inf, 0.0, loss)
    risk = proba @ finite_loss.T  # R(a_i | x) = Σ_j λ_ij · P(c_j | x)
    if inf.any():
        # an infinite loss counts only where its class has positive probability
        hit = (proba > 0).astype(np.float64) @ inf.T.astype(np.float64)
        risk[hit > 0] = np.inf
    return risk


def bayes_decision(proba, loss, *, return_risk=False):
    """Minimum-risk action per sample: h*(x) = argmin_i R(a_i | x).

    Ties go to the lowest action index (for :func:`spam_loss_matrix`: ham before
    unsure before spam, i.e. towards delivering mail).

    Returns
    -------
    actions : ndarray of int, shape (n_samples,)
    risk : ndarray of shape (n_samples, n_actions), only if ``return_risk``
    """
    risk = conditional_risk(proba, loss)
    actions = np.argmin(risk, axis=1)
    return (actions, risk) if return_risk else actions


def zero_one_loss(n_classes):
    """0-1 loss: λ_ii = 0, λ_ij = 1 (minimum risk = maximum posterior)."""
    if int(n_classes) != n_classes or n_classes < 1:
        raise ValueError(f"n_classes must be a positive integer, got {n_classes!r}")
    return 1.0 - np.eye(int(n_classes))


def spam_loss_matrix(cost_fp, cost_fn, cost_unsure=None):
    """Loss matrix for classes (ham, spam) and actions (ham, unsure, spam).

    ``cost_fp`` (C_fp) is the loss of filing ham as spam, ``cost_fn`` (C_fn) that
    of letting spam through, ``cost_unsure`` (C_u) that of holding any message.
    Without ``cost_unsure`` the unsure row is +inf, so it is never chosen and the
    action indices stay 0 = ham, 1 = unsure, 2 = spam.

    Returns
    -------
    loss : ndarray of shape (3, 2)
    """
    check_cost("cost_fp", cost_fp)
    check_cost("cost_fn", cost_fn)
    if cost_unsure is None:
        unsure = np.inf
    else:
        check_cost("cost_unsure", cost_unsure)
        unsure = float(cost_unsure)
    return np.array(
        [
            [0.0, float(cost_fn)],  # deliver: loses C_fn when it was spam
            [unsure, unsure],  # hold: loses C_u whatever the truth
            [float(cost_fp), 0.0],  # file as spam: loses C_fp when it was ham
        ]
    )


def cutoffs_from_costs(cost_fp, cost_fn, cost_unsure=None):
    """Spam-probability cut-offs implied by the costs: the rule of
    :func:`spamnb.verdict.cutoffs_from_costs` (where its derivation is written),
    in exact arithmetic when it can be.

    Integer or :class:`fractions.Fraction` costs give exact ``Fraction`` cut-offs;
    otherwise floats.

    Returns
    -------
    (ham_cutoff, spam_cutoff)
        Decide ham when p <= ham_cutoff, spam when p > spam_cutoff, unsure in
        between (ties go as in :func:`bayes_decision`: towards ham).
    """
    check_cost("cost_fp", cost_fp)
    check_cost("cost_fn", cost_fn)
    costs = [cost_fp, cost_fn]
    if cost_unsure is not None:
        check_cost("cost_unsure", cost_unsure)
        costs.append(cost_unsure)
    exact = all(isinstance(c, numbers.Rational) for c in costs)
    conv = Fraction if exact else float
    return _costs_rule(*(conv(c) for c in (cost_fp, cost_fn)),
                       None if cost_unsure is None else conv(cost_unsure))


@dataclass(frozen=True)
class Cutoffs:
    """Ham/spam cut-offs on P(spam | x); labels 'ham', 'unsure' or 'spam'.

    ``p <= ham_cutoff`` -> ham, ``p > spam_cutoff`` -> spam, else unsure.
    With equal cut-offs there is no unsure output.
    """

    ham_cutoff: float
    spam_cutoff: float

    def __post_init__(self):
        check_cutoffs(self.ham_cutoff, self.spam_cutoff)

    def __iter__(self):
        """``ham, spam = cutoffs``: the pair the rules of :mod:`spamnb.verdict` take."""
        return iter((self.ham_cutoff, self.spam_cutoff))

    @classmethod
    def from_costs(cls, cost_fp, cost_fn, cost_unsure=None):
        """Cut-offs of minimum risk, see :func:`cutoffs_from_costs`."""
        return cls(*cutoffs_from_costs(cost_fp, cost_fn, cost_unsure))

    def label(self, p):
        """Label of one spam probability (:func:`spamnb.verdict.label_for`)."""
        return label_for(p, self)

    def labels(self, p, known=None):
        """Vectorised :meth:`label`: array of 'ham' / 'unsure' / 'spam' (``known``: as
        :func:`action_indices`)."""
        p = np.asarray(p, dtype=np.float64)
        if p.size and (not np.all(np.isfinite(p)) or p.min() < 0 or p.max() > 1):
            raise ValueError("spam probabilities must be in [0, 1]")
        idx = action_indices(p, self.ham_cutoff, self.spam_cutoff, known)
        return np.asarray(ACTIONS, dtype=object)[idx]


def action_indices(p, ham_cutoff, spam_cutoff, known=None):
    """:func:`spamnb.verdict.label_for` on an array: the index into :data:`ACTIONS`
    (0 ham, 1 unsure, 2 spam) of each p.

    Ham if p <= ham cut-off, spam if p > spam cut-off, else unsure; unsure wherever
    ``known`` (the tokens of each message the model knows, optional) is 0. The rule
    only compares, so any increasing scale of P(spam) with the cut-offs on the same
    scale decides alike (log-odds, say: ``tools/studies/run_peers.py``); no range check here
    (:meth:`Cutoffs.labels` checks probabilities). ``tests/test_metrics.py`` holds it
    equal to ``label_for`` at and next to the cut-offs.
    """
    p = np.asarray(p, dtype=np.float64)
    idx = np.where(p <= float(ham_cutoff), 0, np.where(p > float(spam_cutoff), 2, 1))
    if known is not None:
        known = np.asarray(known)
        if known.shape != p.shape:
            raise ValueError(f"known has shape {known.shape}, the probabilities {p.shape}")
        idx[known == 0] = 1  # no evidence, no verdict
    return idx
