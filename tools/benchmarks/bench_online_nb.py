#!/usr/bin/env python3
"""Benchmark the online protocol's inner loop: classify one message, then learn it.

TREC's online evaluation calls ``predict_log_proba`` and then ``partial_fit`` on a
1-row CSR for every message in turn, so each step must cost in proportion to the
message's tokens, not to the vocabulary. Seeded random rows of ~300 nonzeros
(integer counts 1..3): each step brings |V|/steps new columns (new tokens, all in
that row) and draws the rest from the columns seen so far (Zipf-like ranks). The
vocabulary grows to --vocab columns.

Variants, per model:

* ``spamnb grow``   - spamnb as the pipeline uses it: the model grows with the
  vocabulary (partial_fit on a row wider than the model adds the columns) and
  prediction sees the known columns only (unknown tokens dropped);
* ``spamnb fixed``  - spamnb with all --vocab columns from the start;
* ``sklearn fixed`` - scikit-learn's same-named estimator on the same fixed-width
  rows (its partial_fit cannot add columns and recomputes every log-probability:
  O(K·|V|) per step). The max abs difference of the log posteriors between
  ``spamnb fixed`` and ``sklearn fixed`` over all steps checks that the two agree.

Times are µs per step (median and mean over the steps; predict and partial_fit
separately and their sum). Rows are built before timing.

    python3 tools/benchmarks/bench_online_nb.py                         # 3000 steps, |V| -> 200,000
    python3 tools/benchmarks/bench_online_nb.py --steps 6000 --models multinomial
"""

from __future__ import annotations

import argparse
import gc
import time

import numpy as np
import scipy.sparse as sp


def make_rows(steps, vocab, nnz, seed):
    """Per step: (columns, counts, label, vocabulary size before and after the step)."""
    rng = np.random.default_rng(seed)
    out = []
    before = 0
    for i in range(steps):
        after = vocab * (i + 1) // steps
        new = np.arange(before, after)
        n_old = max(0, min(nnz - new.size, before))
        # Zipf-like reuse of the seen columns: rank r drawn with weight ~ 1/r
        old = np.unique((before * rng.random(n_old) ** 3).astype(np.int64)) if n_old else new[:0]
        cols = np.concatenate([old, new]).astype(np.int32)
        data = rng.integers(1, 4, cols.size).astype(np.float64)
        out.append((cols, data, int(rng.integers(0, 2)), before, after))
        before = after
    return out


def csr_row(cols, data, width):
    keep = cols < width
    c, d = cols[keep], data[keep]
    return sp.csr_matrix((d, c, np.array([0, c.size], dtype=np.int32)), shape=(1, width))


def run(make, rows, vocab, grow):
    """Classify-then-learn loop; returns (predict µs, learn µs, log posteriors) per step.

    Step 0 only learns (with ``classes``): there is nothing to classify with yet.
    """
    # rows built before timing
    pred_rows = [csr_row(c, d, before if grow else vocab) for c, d, _, before, _ in rows]
    learn_rows = [csr_row(c, d, after if grow else vocab) for c, d, _, _, after in rows]
    est = make().partial_fit(learn_rows[0], [rows[0][2]], classes=[0, 1])
    n = len(rows) - 1
    t_pred, t_learn, post = np.zeros(n), np.zeros(n), np.zeros((n, 2))
    gc.collect()
    gc.disable()
    try:
        for i in range(1, len(rows)):
            t0 = time.perf_counter()
            post[i - 1] = est.predict_log_proba(pred_rows[i])[0]
            t1 = time.perf_counter()
            est.partial_fit(learn_rows[i], [rows[i][2]])
            t2 = time.perf_counter()
            t_pred[i - 1], t_learn[i - 1] = t1 - t0, t2 - t1
    finally:
        gc.enable()
    return t_pred * 1e6, t_learn * 1e6, post


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--vocab", type=int, default=200_000, help="final vocabulary size")
    ap.add_argument("--nnz", type=int, default=300, help="nonzeros per row")
    ap.add_argument("--alpha", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--models", default="multinomial,complement,bernoulli")
    args = ap.parse_args()

    from sklearn import naive_bayes as sk

    from spamnb.nb import naive_bayes as nb

    names = {"multinomial": "MultinomialNB", "complement": "ComplementNB", "bernoulli": "BernoulliNB"}
    rows = make_rows(args.steps, args.vocab, args.nnz, args.seed)
    mean_nnz = np.mean([r[0].size for r in rows])
    print(f"{args.steps} steps, vocabulary growing to {args.vocab:,}, {mean_nnz:.0f} nonzeros a row, "
          f"alpha={args.alpha}; µs per step (median / mean)\n")
    print("| model | variant | predict_log_proba | partial_fit | step total | max abs diff log-proba vs sklearn |")
    print("|---|---|---:|---:|---:|---:|")
    for key in args.models.split(","):
        name = names[key]
        ours = lambda: getattr(nb, name)(alpha=args.alpha)  # noqa: E731
        theirs = lambda: getattr(sk, name)(alpha=args.alpha, force_alpha=True)  # noqa: E731
        results = {
            "spamnb grow": run(ours, rows, args.vocab, grow=True),
            "spamnb fixed": run(ours, rows, args.vocab, grow=False),
            "sklearn fixed": run(theirs, rows, args.vocab, grow=False),
        }
        ref = results["sklearn fixed"][2]
        for variant, (tp, tl, post) in results.items():
            # equal infinities (a class not seen yet has learned prior 0) count as no difference
            with np.errstate(invalid="ignore"):
                diff = np.where(post == ref, 0.0, np.abs(post - ref)).max()
            diff = float("nan") if variant == "spamnb grow" else diff
            tot = tp + tl
            print(f"| {name} | {variant} | {np.median(tp):.0f} / {tp.mean():.0f} | "
                  f"{np.median(tl):.0f} / {tl.mean():.0f} | {np.median(tot):.0f} / {tot.mean():.0f} | "
                  f"{'-' if np.isnan(diff) else f'{diff:.1e}'} |")


if __name__ == "__main__":
    main()
