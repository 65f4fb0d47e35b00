#!/usr/bin/env python3
"""Measure peer filters (and spamnb runners) on a labelled corpus index.

    python3 tools/studies/run_peers.py ../shared/corpora/spamassassin/index --folds 5
    python3 tools/studies/run_peers.py INDEX --split --peers bogofilter,spamprobe,sklearn-nb
    python3 tools/studies/run_peers.py INDEX --halves \
        --headers-keep Subject,From,To,Content-Type,Content-Transfer-Encoding
    python3 tools/studies/run_peers.py INDEX --peers mymodule:runner   # any runner

Protocols (all keyed by md5 of the path as written in the index, so every
program splits the corpus identically; see spamnb.evaluation.folds.hash_folds):

    --folds K   fold = md5(path) % K; each fold is scored by a model trained
                on the other K-1; the scores of all folds are pooled.
    --split     one 80/20 split: test = (md5(path) % 5 == 0).
    --halves    train on md5(path) % 2 == 0, test on the other half.

Prints a markdown table: (1-AUC)%, FP% and FN% at the peer's default
cut-offs (unsure messages are neither; their share is in the unsure column),
lam% (TREC, "filed as spam or not"), spam recall at 0.1% and at 1% ham
misclassification, mean training seconds per run, classification speed,
and peak memory (max RSS over runs, each run in a fresh process).

INDEX may also be a corpus folder holding an ``index``. The full corpora live
beside the repository in ../shared/corpora; the Chinese one (trec06c-dev) is
not shipped (research use only). An INDEX that is not there: one line, exit 2
(tools/shared_corpora.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))  # the project: spamnb, tools

from tools.studies import peers  # noqa: E402
from tools import shared_corpora  # noqa: E402
from spamnb.evaluation.folds import hash_folds  # noqa: E402
from spamnb.evaluation.metrics import summary  # noqa: E402
from spamnb.mail.sources import SourceError, index_entries  # noqa: E402


def read_index(index_path):
    """(labels 0/1, index paths, absolute paths) from a TREC-style index."""
    base = os.path.dirname(os.path.abspath(index_path))
    try:
        with open(index_path, encoding="utf-8", errors="surrogateescape") as f:
            entries = list(index_entries(f, index_path))
    except (OSError, SourceError) as exc:
        raise SystemExit(str(exc))
    labels = np.array([label == "spam" for label, _ in entries], dtype=np.int8)
    rel = [p for _, p in entries]
    return labels, rel, [os.path.join(base, p) for p in rel]


def plan(keys, protocol, k):
    """List of boolean test masks, one per run."""
    if protocol == "folds":
        folds = hash_folds(keys, k)
        return [folds == f for f in range(k)]
    if protocol == "split":
        return [hash_folds(keys, 5) == 0]
    if protocol == "halves":
        return [hash_folds(keys, 2) == 1]
    raise ValueError(protocol)


def evaluate(peer, y, paths, masks):
    """Run ``peer`` once per mask; pool the test scores; return (summary, stats)."""
    scores = np.full(len(paths), np.nan)
    tested = np.zeros(len(paths), dtype=bool)
    train_s, classify_s, peak = [], [], []
    arr = np.array(paths, dtype=object)
    for mask in masks:
        train = ~mask
        result = peers.run_isolated(
            peer,
            list(arr[train & (y == 0)]), list(arr[train & (y == 1)]), list(arr[mask]),
        )
        scores[mask] = result.scores
        tested |= mask
        train_s.append(result.train_seconds)
        classify_s.append(result.classify_seconds)
        peak.append(result.peak_mb)
    yt, st = y[tested], scores[tested]
    out = summary(yt, st, cutoffs=peer.cutoffs)
    stats = {
        "runs": len(masks),
        "train_s_mean": float(np.mean(train_s)),
        "train_s_total": float(np.sum(train_s)),
        "classify_s_total": float(np.sum(classify_s)),
        "classify_msgs_per_s": float(tested.sum() / np.sum(classify_s)),
        "peak_mb": float(max(peak)),
        "n_test": int(tested.sum()),
    }
    return out, stats


def fmt(x, digits=3):
    return "-" if x is None else f"{x:.{digits}f}"


def table(rows):
    head = ("| peer | (1-AUC)% | FP% | FN% | unsure% | lam% | recall@0.1%FPR | recall@1%FPR | "
            "train s | classify msg/s | peak MB |")
    lines = [head, "|" + "---|" * 11]
    for name, s, st in rows:
        unsure = None
        if "n_ham_unsure" in s:
            unsure = 100.0 * (s["n_ham_unsure"] + s["n_spam_unsure"]) / (s["n_ham"] + s["n_spam"])
        lines.append(
            f"| {name} | {fmt(s['one_minus_auc_pct'])} | {fmt(s.get('fp_pct'), 2)} | "
            f"{fmt(s.get('fn_pct'), 2)} | {fmt(unsure, 2)} | {fmt(s.get('lam_pct'), 3)} | "
            f"{fmt(s['recall_at_fpr']['0.001'], 1)} | {fmt(s['recall_at_fpr']['0.01'], 1)} | "
            f"{fmt(st['train_s_mean'], 2)} | "
            f"{st['classify_msgs_per_s']:.0f} | {st['peak_mb']:.0f} |"
        )
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("index", help="TREC-style index: 'spam PATH' / 'ham PATH' per line")
    proto = ap.add_mutually_exclusive_group(required=True)
    proto.add_argument("--folds", type=int, metavar="K", help="K folds by md5 of path, pooled scores")
    proto.add_argument("--split", action="store_true", help="one 80/20 split by md5 of path")
    proto.add_argument("--halves", action="store_true", help="train on one md5 half, test on the other")
    ap.add_argument("--headers-keep", metavar="NAMES",
                    help="comma-separated header fields to keep in the peers' copies (others dropped)")
    ap.add_argument("--peers", default="bogofilter,spamprobe",
                    help=f"comma-separated: {', '.join(peers.PEERS)} or module:function[:in|:ext]")
    ap.add_argument("--bulk-train-timing", action="store_true",
                    help="also time bogofilter bulk-training on the whole corpus (best of 3)")
    ap.add_argument("--json", metavar="FILE", help="write all figures as JSON")
    args = ap.parse_args(argv)
    args.index = shared_corpora.require(args.index)  # absent: one line, exit 2

    y, keys, paths = read_index(args.index)
    protocol, k = (("folds", args.folds) if args.folds else ("split", 5) if args.split else ("halves", 2))
    if protocol == "folds" and k < 2:
        ap.error("--folds needs K >= 2")
    masks = plan(keys, protocol, k)
    selected = [peers.resolve_peer(p.strip()) for p in args.peers.split(",") if p.strip()]

    with tempfile.TemporaryDirectory(prefix="peers-headers-") as tmp:
        if args.headers_keep:
            keep = [h for h in args.headers_keep.split(",") if h.strip()]
            paths = peers.rewrite_with_headers(paths, keep, tmp)
        rows, report = [], {}
        for peer in selected:
            t0 = time.perf_counter()
            s, st = evaluate(peer, y, paths, masks)
            st["wall_s"] = time.perf_counter() - t0
            rows.append((peer.name, s, st))
            report[peer.name] = {"summary": s, "stats": st}
            print(f"[{peer.name}: {st['wall_s']:.0f} s wall]", file=sys.stderr)
        bulk = None
        if args.bulk_train_timing:
            ham = [p for p, l in zip(paths, y) if l == 0]
            spam = [p for p, l in zip(paths, y) if l == 1]
            bulk = min(peers.bogofilter_bulk_train_seconds(ham, spam) for _ in range(3))

    desc = {"folds": f"{k} folds by md5(path) % {k}, scores pooled",
            "split": "80/20 split, test = md5(path) % 5 == 0",
            "halves": "train md5(path) % 2 == 0, test == 1"}[protocol]
    print(f"{args.index}: {int((y == 0).sum())} ham, {int((y == 1).sum())} spam; {desc}"
          + (f"; headers kept: {args.headers_keep}" if args.headers_keep else ""))
    print()
    print(table(rows))
    if bulk is not None:
        print()
        print(f"bogofilter bulk training on all {len(y)} messages (-n -B ham, -s -B spam; best of 3): {bulk:.2f} s")
    if args.json:
        report["_meta"] = {"index": args.index, "protocol": protocol, "k": k,
                           "headers_keep": args.headers_keep, "bulk_train_s": bulk}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
