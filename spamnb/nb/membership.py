"""Which tokens are in a model's vocabulary: one rule for every path.

A token is in the vocabulary while some learned message holds it, that is while
its count in some class is above zero. |V| is in every smoothed estimate (the
multinomial's denominator Σ_w' n_cw' + |V|·λ, the Bernoulli's absent words), so
a token whose counts went back to zero (its last message was forgotten) must
leave the vocabulary, or ``forget`` would not undo ``learn``: the full model
drops it (:meth:`spamnb.model.SpamModel.forget`), the journal's readers leave
it out of |V| and of the message's known tokens
(:meth:`spamnb.storage.scorer.Scorer.score`).

"Zero" allows for float rounding: forgetting subtracts the same feature values
learning added, but in another order, so a count can come back as 1e-17. The
smallest feature value a message adds is far above the bound (presence-l2: 1/√n
for n distinct tokens, 1e-3 at a million), so no real count is ever taken for
zero. Standard library only: the cold path reads this without numpy.
"""

#: Counts at or below this are zero (rounding left by forgetting).
ZERO = 1e-9


def holds(n_ham: float, n_spam: float) -> bool:
    """True while a token with these counts is in the vocabulary."""
    return n_ham > ZERO or n_spam > ZERO
