#!/usr/bin/env python3
"""Is the first-day target a cut-off away? Unfamiliar ham against unfamiliar spam.

The first-day target: a new user's model leaves at most 5% of unfamiliar ham unsure
or spam *and* catches far more than 45% of unfamiliar spam. Any lever that makes
the model judge unfamiliar mail more kindly (a prior, a cut-off, evidence
shrunk towards the prior) files more unfamiliar ham as ham and catches less
unfamiliar spam; the question is whether one moves that trade or only slides
along it. So this script scores, with one model trained on the older
SpamAssassin mail (easy_ham, hard_ham, spam: 2002), mail it never saw of both
classes:

* unfamiliar ham: enron-ham-dev's 6,383 business messages (artefact headers
  stripped, as ``first_day.py`` does);
* unfamiliar spam: the later ``spam_2`` (1,396 messages, 2003-2005: English
  spam of newer campaigns, the only such spam here), and trec06c-dev's 3,885
  Chinese spam (a test of headers and charsets more than of words);
* familiar ham of the same kind: the later ``easy_ham_2``, for the by-age
  (1-AUC)% (``protocols.py``'s ``age`` protocol, the same split).

Per lever it prints, at the model's own cut-offs, the share of enron ham not
filed ham (unsure / spam) and the share of ``spam_2`` caught (and let into the
inbox); then the **frontier figure**: the shift δ of both cut-offs (a prior
change in log-odds: score − δ) that leaves exactly 5% of enron ham not filed
ham, and the share of ``spam_2`` still caught at that shift, with a 95%
bootstrap interval (enron ham and spam_2 resampled apart). A lever that moves
the trade raises that catch; one that only slides along it leaves it where the
plain shift has it.

Levers: the defaults; any ``protocols.py`` setting (``KEY=VALUE``, retrained);
and three ways of shrinking weak evidence, applied to the trained model's
log-odds weights when scoring:

* ``length=all``  a message's row is scaled to unit length over *all* its
  tokens, the unknown ones included (they weigh 0), instead of over the tokens
  the model knows: mostly-unknown mail stays near the prior;
* ``floor=D``     tokens whose weight is under D in log-odds count as 0;
* ``min_df=K``    tokens seen in fewer than K training messages count as 0;

and ``shift=D``, every score lowered by D (a prior with D less log-odds of spam).

``--train all`` trains on the whole corpus instead, as the default model is: the
enron figures are then the shipped model's, spam_2 is training mail (its
columns are blank) and the frontier is trec06c-dev spam's.

    python tools/studies/first_day_frontier.py
    python tools/studies/first_day_frontier.py --lever length=all --lever floor=1 --lever recipient_counts=false
    python tools/studies/first_day_frontier.py --train all --lever default --lever shift=1.01

Exits 2 when a corpus is not there (tools/shared_corpora.py).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the project: spamnb, tools

from tools.studies import protocols  # noqa: E402
from tools.studies.first_day import strip_artefacts  # noqa: E402
from spamnb.evaluation import metrics  # noqa: E402
from spamnb.model import binary_features, transform_features  # noqa: E402
from spamnb.scale import parallel  # noqa: E402

from tools.studies.protocols import SPAM_CUT, caught, frontier_interval, shift_for  # noqa: E402
# the README's table: shift=-1.01 is the shipped model's prior (-0.72) on the 2002 model (-1.73)
DEFAULT_LEVERS = ("default", "shift=-1.01", "prior=uniform", "recipient_counts=false", "fold_header_names=true",
                  "length=all", "floor=1", "min_df=2", "alpha=0.1")
SCORING_LEVERS = ("length", "floor", "min_df", "shift")
SCORED = ("enron", "new", "trec")  # the sets each model judges


def split(lever):
    """``(model settings, scoring settings)`` of one lever."""
    if lever == "default":
        return [], {}
    key, _, value = lever.partition("=")
    if key == "length":
        if value not in ("known", "all"):
            raise SystemExit(f"length is known or all, not {value!r}")
        return [], {key: value}
    if key in SCORING_LEVERS:
        try:
            return [], {key: float(value)}
        except ValueError:
            raise SystemExit(f"{key} takes a number, not {value!r}") from None
    protocols.settings([lever])  # a model setting: exits on an unknown one
    return [lever], {}


def known_rows(model, token_lists):
    """The feature rows the model scores: unit length over the tokens it knows."""
    X, _ = model.vocabulary.transform(token_lists, binary=binary_features(model.features))
    return transform_features(X.tocsr(), model.features)


def distinct(token_lists):
    return np.array([len(set(t)) for t in token_lists])


def over_all_tokens(X, n_distinct):
    """``X`` rescaled to unit length over all of each message's ``n_distinct`` tokens, the
    unknown ones included: × sqrt(k / (k + u)), k known and u unknown (``length=all``)."""
    X = X.copy()
    known = np.diff(X.indptr)
    X.data *= np.repeat(np.sqrt(known / np.maximum(n_distinct, 1)), known)
    return X


class Trained:
    """One model setting trained once, with its log-odds weights and the rows of the
    sets it judges: the scoring levers (length, floor, min_df, shift) only reweigh them."""

    def __init__(self, model, data):
        self.model = model
        self.bias, self.weights = model.linear_weights()
        self.rows, self.distinct = {}, {}
        for name in SCORED:
            toks = [model.tokens(raw) for _, raw, _ in data[name]]
            self.rows[name], self.distinct[name] = known_rows(model, toks), distinct(toks)

    def scores(self, name, scoring):
        """Log-odds of set ``name``: bias + Σ_w f(x)_w · weight_w, with the scoring lever's weights."""
        weights = self.weights.copy()
        if "floor" in scoring:
            weights[np.abs(weights) < scoring["floor"]] = 0.0
        if "min_df" in scoring:
            weights[self.model.doc_freq[: len(weights)] < scoring["min_df"]] = 0.0
        X = self.rows[name]
        if scoring.get("length") == "all":
            X = over_all_tokens(X, self.distinct[name])
        return self.bias - scoring.get("shift", 0.0) + X @ weights


def measure(lever, data, train, resamples, trained):
    """One lever's figures; with ``train == "all"`` spam_2 is training mail, so its
    columns are None (the frontier is then the trec06c-dev spam's). ``trained``: the
    :class:`Trained` models by model setting, filled as needed."""
    settings, scoring = split(lever)
    key = tuple(settings)
    if key not in trained:
        model = protocols.maker(settings)()
        parallel.train(model, data[train])
        trained[key] = Trained(model, data)
    t = trained[key]
    s = {name: t.scores(name, scoring) for name in SCORED}
    prior = t.bias - scoring.get("shift", 0.0)
    y_new = np.array([label == "spam" for _, _, label in data["new"]], dtype=int)
    spam2 = s["new"][y_new == 1] if train == "old" else None
    unfamiliar = spam2 if spam2 is not None else s["trec"]
    delta = shift_for(s["enron"])
    low, high = frontier_interval(s["enron"], unfamiliar, resamples)
    return {
        "lever": lever, "prior": prior,
        "enron_unsure": 100 * float(np.mean((s["enron"] >= 0) & (s["enron"] <= SPAM_CUT))),
        "enron_spam": 100 * float(np.mean(s["enron"] > SPAM_CUT)),
        "caught": None if spam2 is None else caught(spam2, 0.0),
        "inbox": None if spam2 is None else 100 * float(np.mean(spam2 < 0)),
        "trec": caught(s["trec"], 0.0),
        "age_auc": None if spam2 is None else metrics.one_minus_auc_pct(y_new, s["new"]),
        "delta": delta,
        "caught_5": caught(unfamiliar, delta), "ci": (low, high),
        "trec_5": caught(s["trec"], delta),
    }


def cell(value, fmt, width):
    return f"{'-':>{width}}" if value is None else f"{value:>{width}{fmt}}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lever", action="append", metavar="LEVER",
                    help=f"default, KEY=VALUE (a protocols.py setting), length=all, floor=D or min_df=K "
                         f"(repeatable; default: {' '.join(DEFAULT_LEVERS)})")
    ap.add_argument("--train", choices=("old", "all"), default="old",
                    help="old: easy_ham, hard_ham, spam (default); all: the whole corpus, as the default "
                         "model (spam_2 is then familiar: the frontier is trec06c-dev spam's)")
    ap.add_argument("--resamples", type=int, default=200)
    args = ap.parse_args()
    levers = args.lever or list(DEFAULT_LEVERS)
    for lever in levers:
        split(lever)  # a bad lever fails before minutes of training
    cache = protocols.Cache(0)
    sa = cache("spamassassin")
    data = {
        "all": sa,
        **dict(zip(("old", "new"), protocols.age_split(sa))),
        "enron": cache("enron-ham-dev", strip_artefacts),
        "trec": [m for m in cache("trec06c-dev") if m[2] == "spam"],
    }
    if args.train == "old":
        print("model trained on easy_ham, hard_ham, spam; scored: enron ham, spam_2 (+ easy_ham_2), trec06c-dev spam")
    else:
        print("model trained on the whole SpamAssassin corpus; scored: enron ham, trec06c-dev spam")
    frontier = "spam_2 caught [95%]" if args.train == "old" else "trec caught [95%]"
    print(f"{'lever':<24} {'prior':>6} {'enron not ham':>15} {'spam_2 caught':>14} {'inbox':>6} {'trec':>6} "
          f"{'age (1-AUC)%':>12}   | shift δ for 5%: {'δ':>5} {frontier:>22} {'trec':>6}")
    trained = {}
    for lever in levers:
        r = measure(lever, data, args.train, args.resamples, trained)
        not_ham = f"{r['enron_unsure'] + r['enron_spam']:.1f} ({r['enron_unsure']:.1f}/{r['enron_spam']:.2f})"
        print(f"{r['lever']:<24} {r['prior']:>+6.2f} {not_ham:>15} {cell(r['caught'], '.1f', 13)}% "
              f"{cell(r['inbox'], '.1f', 5)}% {r['trec']:>5.1f}% {cell(r['age_auc'], '.3f', 12)}   |"
              f"                 {r['delta']:>5.2f} "
              f"{r['caught_5']:>7.1f} [{r['ci'][0]:.1f}, {r['ci'][1]:.1f}]    {r['trec_5']:>5.1f}%", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
