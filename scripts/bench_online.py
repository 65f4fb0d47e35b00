#!/usr/bin/env python3
"""The TREC online protocol, spamnb beside bogofilter in the same run.

In one shuffled order (--seed), every message is classified and then trained
on its gold label. bogofilter does it as a user would: one process to
classify (``bogofilter -t``) and one to register (``-s`` / ``-n``) per message.
spamnb runs ``spamnb evaluate --online`` (one process for the whole run, as the
library's online protocol is incremental: a step costs the message's tokens).

Several indexes are concatenated, then shuffled together: the longest stream the
corpora make (the target is measured "over your longest stream"), and a corpus of
one class (enron-ham-dev, ham only) then still meets both classes throughout.

    python scripts/bench_online.py ../shared/corpora/spamassassin/index --seed 1
    python scripts/bench_online.py ../shared/corpora/{spamassassin,trec06c-dev,enron-ham-dev}/index
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import shared_corpora  # noqa: E402
from spamnb.evaluation import metrics  # noqa: E402
from spamnb.mail.sources import iter_index  # noqa: E402


def bogofilter_online(items):
    """(seconds, scores) of bogofilter classifying then registering each message."""
    bogo = shutil.which("bogofilter")
    scores = []
    with tempfile.TemporaryDirectory(prefix="bench-online-") as db:
        t0 = time.perf_counter()
        for path, label in items:
            with open(path, "rb") as f:
                raw = f.read()
            out = subprocess.run([bogo, "-C", "-d", db, "-t", "--terse-format=%c %.12e"],
                                 input=raw, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout
            # the first message meets an empty database: bogofilter then refuses to score
            scores.append(float(out.split()[-1]) if out.strip() else 0.5)
            subprocess.run([bogo, "-C", "-d", db, "-s" if label == "spam" else "-n"], input=raw, check=True)
        return time.perf_counter() - t0, np.array(scores)


def spamnb_online(index_path, seed, workdir):
    """(seconds, evaluate's JSON summary) of ``spamnb evaluate --online`` on the shuffled index."""
    import json

    t0 = time.perf_counter()
    # the shuffled index is this script's own, naming absolute paths: trusted
    out = subprocess.run([sys.executable, "-m", "spamnb", "evaluate", "--index", index_path, "--online",
                          "--trust-index", "--json"], stdout=subprocess.PIPE, check=True, cwd=workdir).stdout
    return time.perf_counter() - t0, json.loads(out)


def stream(indexes, seed, limit):
    """(path, label) of the indexes' messages concatenated, shuffled with ``seed``, the first ``limit``."""
    msgs = [m for index in indexes for m in iter_index(index)]
    order = np.random.default_rng(seed).permutation(len(msgs))[:limit]
    return [(msgs[i].source, msgs[i].label) for i in order]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("index", nargs="+", help="index file(s): concatenated, then shuffled together")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--limit", type=int, default=None, help="only the first N messages of the shuffled order")
    args = ap.parse_args()
    args.index = [shared_corpora.require(i) for i in args.index]  # absent: one line, exit 2
    items = stream(args.index, args.seed, args.limit)
    y = np.array([lb == "spam" for _, lb in items], dtype=int)
    with tempfile.TemporaryDirectory(prefix="bench-online-") as tmp:
        shuffled = os.path.join(tmp, "index")
        with open(shuffled, "w", encoding="utf-8") as f:
            f.writelines(f"{lb} {os.path.abspath(p)}\n" for p, lb in items)
        s_sec, s = spamnb_online(shuffled, args.seed, tmp)
    rows = [("spamnb (evaluate --online)", s_sec, s["one_minus_auc_pct"], s["recall_at_fpr"]["0.001"])]
    if shutil.which("bogofilter"):
        b_sec, b_scores = bogofilter_online(items)
        rows.append(("bogofilter (-t, then -s/-n, per message)", b_sec,
                     metrics.one_minus_auc_pct(y, b_scores), 100 * metrics.recall_at_fpr(y, b_scores, 0.001)))
    n_spam = int(y.sum())
    print(f"{len(items)} messages ({n_spam} spam, {len(items) - n_spam} ham) of {', '.join(args.index)}, "
          f"shuffled with seed {args.seed}, classify then train on each\n")
    print("| filter | seconds | ms per message | (1-AUC)% | recall@0.1%FPR |")
    print("|---|---|---|---|---|")
    for name, sec, auc, rec in rows:
        print(f"| {name} | {sec:.1f} | {1000 * sec / len(items):.2f} | {auc:.3f} | {rec:.1f} |")
    if len(rows) == 2:
        print(f"\nspamnb / bogofilter time ratio: {rows[0][1] / rows[1][1]:.2f}")


if __name__ == "__main__":
    main()
