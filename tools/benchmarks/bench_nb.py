#!/usr/bin/env python3
"""Benchmark spamnb's MultinomialNB / BernoulliNB against scikit-learn's.

Random CSR count matrix (default 100,000 rows x 500,000 features, ~200 nonzeros a
row, integer counts 1..5 stored as float64, uniform columns, 2 classes), seeded. For each model we
time ``fit`` and ``predict_log_proba`` (best of --repeats, alternating spamnb and
scikit-learn on each repeat, tracing off) and measure peak memory as the
tracemalloc peak of a separate call (numpy and scipy allocations are reported to
tracemalloc; the input X, allocated before, is not counted). Prints a markdown table with ratios
spamnb / scikit-learn (<= 1.0 means spamnb is at least as fast / lean).

    python3 tools/benchmarks/bench_nb.py                      # full size
    python3 tools/benchmarks/bench_nb.py --rows 10000 --features 50000 --nnz 50
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc

import numpy as np
import scipy.sparse as sp


def make_data(rows, features, nnz, seed):
    rng = np.random.default_rng(seed)
    counts = rng.poisson(nnz, rows).clip(1, features)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    indices = rng.integers(0, features, indptr[-1], dtype=np.int32)  # uniform columns
    data = rng.integers(1, 6, indptr[-1]).astype(np.float64)
    X = sp.csr_matrix((data, indices, indptr.astype(np.int32)), shape=(rows, features))
    X.sum_duplicates()  # canonical CSR, as spamnb.nb.vocabulary produces
    y = rng.integers(0, 2, rows)
    return X, y


def timed(fn):
    gc.collect()
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def peak_memory(fn):
    """tracemalloc peak of one call (separate from the timed calls: tracing slows them)."""
    gc.collect()
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--features", type=int, default=500_000)
    ap.add_argument("--nnz", type=int, default=200, help="mean nonzeros per row")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--alpha", type=float, default=1.0)
    args = ap.parse_args()

    from sklearn import naive_bayes as sk

    from spamnb.nb import naive_bayes as nb

    X, y = make_data(args.rows, args.features, args.nnz, args.seed)
    print(
        f"X: {X.shape[0]:,} x {X.shape[1]:,} CSR, {X.nnz:,} nonzeros "
        f"({X.data.nbytes / 1e6:.0f} MB data + {X.indices.nbytes / 1e6:.0f} MB indices), "
        f"alpha={args.alpha}; time = best of {args.repeats} alternating runs; "
        f"peak = tracemalloc peak of a separate call\n"
    )
    models = {
        "MultinomialNB": (lambda: nb.MultinomialNB(alpha=args.alpha), lambda: sk.MultinomialNB(alpha=args.alpha)),
        "BernoulliNB": (lambda: nb.BernoulliNB(alpha=args.alpha), lambda: sk.BernoulliNB(alpha=args.alpha)),
    }
    rows = []
    for name, (make_ours, make_sk) in models.items():
        res = {(lib, op): [np.inf, 0] for lib in ("spamnb", "sklearn") for op in ("fit", "predict_log_proba")}
        runs = {key: [] for key in res}  # every timing, for the paired ratios
        fitted = {}
        for lib, make in (("spamnb", make_ours), ("sklearn", make_sk)):
            est = make()
            res[(lib, "fit")][1] = peak_memory(lambda: est.fit(X, y))
            res[(lib, "predict_log_proba")][1] = peak_memory(lambda: est.predict_log_proba(X))
            del est
        for _ in range(args.repeats):  # alternate the libraries: fair on a noisy machine
            for lib, make in (("spamnb", make_ours), ("sklearn", make_sk)):
                est = make()
                dt, _ = timed(lambda: est.fit(X, y))
                res[(lib, "fit")][0] = min(res[(lib, "fit")][0], dt)
                runs[(lib, "fit")].append(dt)
                dt, out = timed(lambda: est.predict_log_proba(X))
                res[(lib, "predict_log_proba")][0] = min(res[(lib, "predict_log_proba")][0], dt)
                runs[(lib, "predict_log_proba")].append(dt)
                fitted[lib] = out
                del est, out
        diff = np.abs(fitted["spamnb"] - fitted["sklearn"]).max()
        for op in ("fit", "predict_log_proba"):
            (t_o, m_o), (t_s, m_s) = res[("spamnb", op)], res[("sklearn", op)]
            paired = np.median(np.array(runs[("spamnb", op)]) / np.array(runs[("sklearn", op)]))
            rows.append((name, op, t_o, t_s, paired, m_o, m_s, diff))
    print(
        "| model | call | spamnb s | sklearn s | time ratio (best) | time ratio (median of pairs) "
        "| spamnb peak MB | sklearn peak MB | memory ratio | max abs diff log-proba |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, op, t_o, t_s, paired, m_o, m_s, diff in rows:
        print(
            f"| {name} | {op} | {t_o:.3f} | {t_s:.3f} | {t_o / t_s:.2f} | {paired:.2f} | "
            f"{m_o / 1e6:.1f} | {m_s / 1e6:.1f} | {m_o / m_s:.2f} | {diff:.1e} |"
        )


if __name__ == "__main__":
    main()
