#!/usr/bin/env python3
"""Online per-message time as the stream grows: the first N messages against the first 4N.

TREC's online protocol (``spamnb.evaluation.evaluate.online``, the code behind
``spamnb evaluate --online``; every message learned) runs once, in this process, over
the first 4N messages of a long stream: the shared corpora's indexes concatenated and
shuffled with --seed (if they hold fewer than 4N messages, they are repeated, each
pass shuffled anew: a repeat brings no new tokens, so prefer enough messages).

Timed: each message's *step*, classify + learn (``Scores.step_seconds``); reading
the file and tokenizing are excluded (the protocol tokenizes a message before its
step and times that apart). A step must cost the message's tokens, not the
vocabulary or the messages seen before, so the mean over the first 4N should be
within --target times the mean over the first N.

    python tools/benchmarks/bench_online_growth.py                   # N = 4000: 16,000 messages
    python tools/benchmarks/bench_online_growth.py --n 2000 --index ../shared/corpora/spamassassin/index
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the project: spamnb, tools

from spamnb.evaluation import evaluate as ev  # noqa: E402
from spamnb.mail.sources import index_paths  # noqa: E402
from spamnb.model import MODEL_TYPES, SpamModel  # noqa: E402

CORPORA = os.environ.get("SPAMNB_CORPORA", "/work/shared/corpora")
DEFAULT_INDEXES = [os.path.join(CORPORA, c, "index") for c in ("spamassassin", "trec06c-dev", "enron-ham-dev")]


def stream(indexes, n, seed):
    """(path, label) of the first ``n`` messages: the indexes concatenated, shuffled,
    repeated (reshuffled each pass) while shorter than ``n``; and the number of passes."""
    entries = [entry for index in indexes for entry in index_paths(index)]
    if not entries:
        raise SystemExit("no messages in the given indexes")
    rng = np.random.default_rng(seed)
    out, passes = [], 0
    while len(out) < n:
        out += [entries[i] for i in rng.permutation(len(entries))]
        passes += 1
    return out[:n], len(entries), passes


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4000, help="N: compare the first N messages with the first 4N")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--index", action="append", help="index file (repeatable); default: the shared corpora")
    ap.add_argument("--model-type", choices=list(MODEL_TYPES), default="multinomial")
    ap.add_argument("--target", type=float, default=1.3, help="largest ratio that passes")
    args = ap.parse_args()
    indexes = args.index or DEFAULT_INDEXES
    n, total = args.n, 4 * args.n
    items, n_entries, passes = stream(indexes, total, args.seed)

    models, vocab_at = [], {}

    def make_model():
        models.append(SpamModel(model_type=args.model_type))
        return models[-1]

    def messages():  # read lazily; pulled after the step before has learned
        for i, (path, label) in enumerate(items):
            if i in (n, total // 2):
                vocab_at[i] = len(models[0].vocabulary)
            with open(path, "rb") as f:
                yield path, f.read(), label
        vocab_at[total] = len(models[0].vocabulary)

    t0 = time.perf_counter()
    result = ev.online(make_model, messages())
    wall = time.perf_counter() - t0
    steps = result.step_seconds * 1000
    first, whole = steps[:n].mean(), steps.mean()
    ratio = whole / first
    print(f"online protocol (evaluate.online, learn every message), {args.model_type}: the first {total} "
          f"messages of {', '.join(indexes)} ({n_entries} messages"
          f"{f', repeated {passes} times' if passes > 1 else ''}), shuffled with seed {args.seed}")
    print(f"timed: each message's classify + learn; reading and tokenizing excluded "
          f"(tokenizing {result.tokenize_seconds:.1f} s; whole run {wall:.1f} s)\n")
    print("| messages | vocabulary after | ms per message (mean) | median |")
    print("|---|---:|---:|---:|")
    print(f"| first {n} | {vocab_at[n]:,} | {first:.3f} | {np.median(steps[:n]):.3f} |")
    print(f"| first {total} | {vocab_at[total]:,} | {whole:.3f} | {np.median(steps):.3f} |")
    quarters = " / ".join(f"{q.mean():.3f}" for q in np.split(steps, 4))
    print(f"\nmean ms per message by quarter ({n} each): {quarters}")
    ok = ratio <= args.target
    print(f"ratio first {total} / first {n}: {ratio:.2f}x (target <= {args.target}x): {'PASS' if ok else 'FAIL'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
