#!/usr/bin/env python3
"""The first messages of a stream: errors while the model learns from few messages.

A new user's filter starts from little and learns as mail arrives, so what the
first hundreds of messages do matters more than the batch figures say. This
runs TREC's online protocol (classify each message, then learn it) over
several shuffled orders of a corpus and counts, in the windows of messages
1-100, 101-500 and 501-2,000, the messages the filter's cut-offs get wrong:
ham filed as spam (FP), spam filed as ham (FN) and unsure ones; with the
whole run's (1-AUC)% and recall at 0.1% false positives. Each variant is one
way of learning:

* the class prior: ``learned`` N_c/N (log 0 while a class is empty: an
  infinite score) or ``laplace`` (N_c + 1)/(N + 2);
* the training regime: every message (``all``), only errors (``errors``), or
  errors and messages within a thick threshold of the boundary (``margin``);
* λ, the smoothing of the counts.

A corpus is read as ``tools/studies/protocols.py`` reads it: trec06c-dev cut to its
five fair headers (the others leak the label), enron-ham-dev without the
export's artefact headers. ``tools/studies/living_filter.py`` runs the same windows
for a filter that learns its own verdicts and a user's corrections.

Usage::

    python tools/studies/learning_curve.py                       # SpamAssassin, 3 orders
    python tools/studies/learning_curve.py --corpus ../shared/corpora/trec06c-dev --seeds 3
"""

from __future__ import annotations

import argparse
import os
import random
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the project: spamnb, tools

from tools import shared_corpora  # noqa: E402
from tools.studies.first_day import strip_artefacts  # noqa: E402
from tools.studies.protocols import fair_headers  # noqa: E402
from spamnb.evaluation import evaluate, metrics  # noqa: E402
from spamnb.mail.sources import iter_index  # noqa: E402
from spamnb.model import SpamModel  # noqa: E402
from spamnb.verdict import LABELS, label_for  # noqa: E402

WINDOWS = [(0, 100), (100, 500), (500, 2000)]


def windows(limit):
    """WINDOWS, and the messages after 2,000 as one more window for a longer run."""
    return WINDOWS + [(WINDOWS[-1][1], limit)] if limit > WINDOWS[-1][1] else WINDOWS


def variants(names):
    table = {
        "learned, all": dict(prior="learned", train_on="all"),
        "laplace, all": dict(prior="laplace", train_on="all"),
        "laplace, errors": dict(prior="laplace", train_on="errors"),
        "laplace, margin 5": dict(prior="laplace", train_on="margin", margin=5.0),
        "laplace, all, λ=0.1": dict(prior="laplace", train_on="all", alpha=0.1),
    }
    return {n: table[n] for n in names} if names else table


def run(messages, prior, train_on, margin=0.0, alpha=None):
    kw = {"prior": prior} if alpha is None else {"prior": prior, "alpha": alpha}
    make = lambda: SpamModel(**kw)  # noqa: E731
    scores = evaluate.online(make, messages, train_on=train_on, margin=margin)
    cut = make().cutoffs
    labels = [label_for(p, cut, known=int(k)) for p, k in zip(scores.proba, scores.known)]
    return scores, labels


def load(corpus):
    """``[(source, raw, label)]`` of a corpus folder or index, as protocols.py reads it
    (trec06c-dev: the five fair headers; enron-ham-dev: no artefact headers); exits
    with shared_corpora.EXIT_ABSENT when it is not there."""
    index = shared_corpora.require(corpus)
    strip = fair_headers if "trec06c" in index else strip_artefacts if "enron" in index else None
    return [(m.source, strip(m.raw) if strip else m.raw, m.label) for m in iter_index(index, trusted=True)]


def shuffled(messages, seed):
    order = messages[:]
    random.Random(seed).shuffle(order)
    return order


def window_errors(scores, labels, lo, hi):
    fp = fn = unsure = 0
    for y, lab in zip(scores.y[lo:hi], labels[lo:hi]):
        gold = LABELS[int(y)]
        if lab == "unsure":
            unsure += 1
        elif lab != gold:
            fp += gold == "ham"
            fn += gold == "spam"
    return fp, fn, unsure


def summary(runs, wins=WINDOWS):
    """Means over the runs (``(scores, labels)`` each) of each window's (FP, FN, unsure),
    of (1-AUC)% and of recall at 0.1% false positives (in %)."""
    per_window = np.zeros((len(wins), 3))
    aucs, recalls = [], []
    for scores, labels in runs:
        for w, (lo, hi) in enumerate(wins):
            per_window[w] += window_errors(scores, labels, lo, hi)
        aucs.append(metrics.one_minus_auc_pct(scores.y, scores.score))
        recalls.append(metrics.recall_at_fpr(scores.y, scores.score, 0.001) * 100)
    return per_window / len(runs), np.mean(aucs), np.mean(recalls)


def table_head(first="variant", extra="", wins=WINDOWS):
    head = "".join(f" | {lo + 1}-{hi}: FP FN unsure" for lo, hi in wins)
    return f"{first:<22}{head} | (1-AUC)%  recall@0.1%FPR{extra}"


def table_row(name, runs, extra="", wins=WINDOWS):
    per_window, auc, recall = summary(runs, wins)
    cells = "".join(f" | {fp:5.1f} {fn:5.1f} {un:6.1f}" + " " * 6 for fp, fn, un in per_window)
    return f"{name:<22}{cells} | {auc:8.3f}  {recall:6.2f}{extra}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=str(shared_corpora.SPAMASSASSIN))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--limit", type=int, default=2000, help="messages of each order (the windows end at 2,000)")
    ap.add_argument("--variant", action="append", help="only these variants (repeatable)")
    args = ap.parse_args()
    corpus = load(args.corpus)
    print(f"{args.corpus}: {len(corpus)} messages; {args.seeds} shuffled orders, first {args.limit} of each")
    wins = windows(args.limit)
    print(table_head(wins=wins))
    for name, kw in variants(args.variant).items():
        runs = [run(shuffled(corpus, seed)[: args.limit], **kw) for seed in range(args.seeds)]
        print(table_row(name, runs, wins=wins), flush=True)
    print("(means over the orders; a difference of one or two messages is noise)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
