#!/usr/bin/env python3
"""The filter a user lives with: its own verdicts learned, and the user's corrections.

``learning_curve.py`` learns gold labels, which no filter has: ``spamnb filter -u``
learns each message as what it classified it (not unsure ones), and the user then
moves what it misfiled (``spamnb learn --spam/--ham``: a message the filter learned
under the other class is moved there) and sorts the unsure mail. This runs that
loop over shuffled orders of a corpus, message by message:

1. classify the message (its score, before any learning, is what the ranking
   figures use, as in TREC's protocol);
2. the filter's own learning, one rule of:

   * ``self-all``: learn the verdict unless unsure (today's ``filter -u``);
   * ``self-margin:M``: learn the verdict only when not unsure and its score is
     within M log-odds of the cut-off bounding that verdict (the ham cut-off for
     a ham, the spam cut-off for a spam): a thick threshold on self-labels;
   * ``self-none``: learn nothing;

3. the user, ``--delay`` messages later (0: at once): a misfiled message (FP or
   FN) is learned under its gold label (moved, when the filter learned it), and
   an unsure one is learned under its gold label (sorted). These are the user's
   actions, the burden reported beside the errors.

Learning and moving go through :meth:`SpamModel.learn` and its registry, as
``filter -u`` and ``spamnb learn`` do. Windows, figures and corpus reading are
``learning_curve.py``'s. With corrections at once, ``self-all`` learns every
message under its gold label (the ``all`` regime), ``self-none`` the misfiled and
unsure ones (``errors``): the rules differ only in what they learn of the
messages they filed right, and a delay shows what a wrong self-label costs
while it stands.

The filter starts empty (``--start empty``), as a user who trains from nothing,
or from a trained model: ``--start shipped`` is the default model a new user gets
(the shipped corpus, as ``spamnb`` builds it), ``--start older-sa`` a model of the
2002 SpamAssassin mail (easy_ham, hard_ham, spam), for which the later
``spam_2`` is unfamiliar spam. ``--only REGEX`` keeps the messages whose source
matches (one enron owner, say), and ``--readdress`` gives every spam of the
stream the To: of the stream's own ham owner (the address most often in its
ham's To: and Cc:), as spam sent to that user would carry it. The first weeks
of a new user who gets business mail::

    python tools/studies/living_filter.py --start older-sa --readdress \\
        --corpus ../shared/corpora/enron-ham-dev --corpus ../shared/corpora/spamassassin \\
        --only '/farmer-d/|/spam_2\\.' --limit 3000

Usage::

    python tools/studies/living_filter.py                                   # SpamAssassin, orders 0-2
    python tools/studies/living_filter.py --corpus ../shared/corpora/trec06c-dev
    python tools/studies/living_filter.py --corpus ../shared/corpora/{spamassassin,trec06c-dev,enron-ham-dev} \\
        --seed 1 --limit 6000                                         # the longest stream, one order
"""

from __future__ import annotations

import argparse
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the project: spamnb, tools

from tools import shared_corpora  # noqa: E402
from tools.studies.first_week import owner_address, readdressed  # noqa: E402
from tools.studies.learning_curve import load, shuffled, table_head, table_row, windows  # noqa: E402
from tools.studies.protocols import age_split  # noqa: E402
from spamnb.scale import parallel  # noqa: E402
from spamnb.storage.modelfile import default_seed  # noqa: E402
from spamnb.evaluation.evaluate import Scores  # noqa: E402
from spamnb.model import SpamModel, label_id  # noqa: E402
from spamnb.verdict import evidence, learns_verdict  # noqa: E402

RULES = ("self-all", "self-none", "self-margin:5")
STARTS = ("empty", "shipped", "older-sa")


def starting_model(start):
    """A factory of fresh copies of the model the filter starts from."""
    if start == "empty":
        return SpamModel
    if start == "shipped":
        base = default_seed()  # the default model a new user gets (cached once built)
    else:
        base = SpamModel()
        parallel.train(base, age_split(load(str(shared_corpora.SPAMASSASSIN)))[0])
    state = base.to_state()
    return lambda: SpamModel.from_state(state)


def with_owner(messages):
    """The messages with every spam readdressed to the ham's owner (see the module doc)."""
    ham = [m for m in messages if m[2] == "ham"]
    if not ham:
        raise SystemExit("--readdress: the stream has no ham, hence no owner")
    addr = owner_address(ham)
    print(f"spam readdressed to {addr}")
    return [(src, readdressed(raw, addr), label) if label == "spam" else (src, raw, label)
            for src, raw, label in messages]


def self_learns(rule, label, score, cutoffs):
    """Whether the filter learns its own verdict ``label`` (score in log-odds) under ``rule``:
    ``filter -u``'s own rule (:func:`spamnb.verdict.learns_verdict`) with that margin."""
    if rule == "self-none":
        return False
    return learns_verdict(label, score, cutoffs, None if rule == "self-all" else float(rule.partition(":")[2]))


def living(messages, rule, delay=0, make=SpamModel):
    """``(scores, labels, counts)`` of the living filter over ``messages`` in order;
    counts: messages the filter learned itself, user actions, moves among them."""
    model = make()
    cut = tuple(model.cutoffs)
    last = [None, None]

    def tokens(raw, _tokens=model.tokens):  # learn() tokenizes again: reuse this message's tokens
        if last[0] is not raw:
            last[:] = raw, _tokens(raw)
        return last[1]

    model.tokens = tokens
    pending = []  # (due index, raw, gold label): the user's corrections not made yet
    n = {"self-learned": 0, "actions": 0, "moves": 0}
    sources, ys, ss, ps, ks, labels = [], [], [], [], [], []

    def correct_until(i):
        while pending and pending[0][0] <= i:
            _, raw, gold = pending.pop(0)
            n["moves"] += model.learn([(raw, gold)])["moved"]

    for i, (source, raw, gold) in enumerate(messages):
        correct_until(i)
        c = model.classify_tokens(tokens(raw))
        label, k = c.label, evidence(c.n_tokens - c.n_unknown, model.messages)  # before any learning
        if self_learns(rule, label, c.score, cut):
            model.learn([(raw, label)])
            n["self-learned"] += 1
        if label != gold:  # misfiled or unsure: the user moves or sorts it
            n["actions"] += 1
            pending.append((i + delay, raw, gold))
        correct_until(i)
        sources.append(source)
        ys.append(label_id(gold))
        ss.append(c.score)
        ps.append(c.spam_probability)
        ks.append(k)
        labels.append(label)
    scores = Scores(sources, np.asarray(ys), np.asarray(ss), np.asarray(ps), known=np.asarray(ks))
    return scores, labels, n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", action="append",
                    help="corpus folder or index (repeatable: concatenated, then shuffled together); "
                         "default SpamAssassin")
    ap.add_argument("--seed", type=int, action="append", help="shuffling seeds (repeatable; default 0 1 2)")
    ap.add_argument("--limit", type=int, default=2000,
                    help="messages of each order (the windows end at 2,000; the messages after it are one more)")
    ap.add_argument("--rule", action="append", help=f"self-learning rules (repeatable; default {' '.join(RULES)})")
    ap.add_argument("--delay", type=int, default=0, help="messages between a verdict and the user's correction")
    ap.add_argument("--start", choices=STARTS, default="empty", help="the model the filter starts from")
    ap.add_argument("--only", metavar="REGEX", help="keep the messages whose source matches")
    ap.add_argument("--readdress", action="store_true", help="give every spam the To: of the ham's owner")
    args = ap.parse_args()
    try:
        only = re.compile(args.only) if args.only else None
    except re.error as exc:
        raise SystemExit(f"--only: not a regular expression: {exc}") from None
    corpora = args.corpus or [str(shared_corpora.SPAMASSASSIN)]
    seeds = args.seed or [0, 1, 2]
    messages = [m for c in corpora for m in load(c) if only is None or only.search(m[0])]
    if args.readdress:
        messages = with_owner(messages)
    make = starting_model(args.start)
    print(f"{' + '.join(corpora)}{f' ({args.only})' if only else ''}: {len(messages)} messages; "
          f"orders {seeds}, first {args.limit} of each; corrections {args.delay} messages later; "
          f"starting {args.start}")
    wins = windows(args.limit)
    print(table_head("rule", " | self-learned  user actions (moves)", wins))
    for rule in args.rule or RULES:
        runs, counts = [], []
        for seed in seeds:
            scores, labels, n = living(shuffled(messages, seed)[: args.limit], rule, args.delay, make)
            runs.append((scores, labels))
            counts.append([n["self-learned"], n["actions"], n["moves"]])
        learned, actions, moves = np.mean(counts, axis=0)
        print(table_row(rule, runs, f" | {learned:12.1f}  {actions:12.1f} ({moves:.1f})", wins), flush=True)
    print("(means over the orders; a difference of a few messages is noise)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
