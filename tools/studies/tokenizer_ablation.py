#!/usr/bin/env python3
"""Cross-validated comparison of tokenizer configurations.

Every message is tokenized once per configuration (token lists cached in
memory, 2 worker processes), counted with ``spamnb.nb.vocabulary.Vocabulary`` and
scored with ``spamnb.nb.naive_bayes`` models on folds by md5 of the path as
written in the index (``spamnb.evaluation.folds.hash_folds``).  Scores are log-odds of
spam, ``jll[:, 1] - jll[:, 0]`` (probabilities saturate to 1.0 and tie),
pooled over the folds; (1-AUC)% is rank-based with ties counted half.

    python3 tools/studies/tokenizer_ablation.py ../shared/corpora/spamassassin/index
    python3 tools/studies/tokenizer_ablation.py ../shared/corpora/trec06c-dev/index --folds 2 \\
        --only-headers subject,from,to,content-type,content-transfer-encoding

Bogofilter's reference figures: spamassassin, 5 folds by md5: (1-AUC)% 0.025,
recall@0.1%FPR 95.1%; trec06c-dev with the five headers, half/half: 0.060, 97.0%.
"""

import argparse
import multiprocessing
import os
import sys
import time
from dataclasses import replace

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the project: spamnb, tools

from tools import shared_corpora  # noqa: E402
from spamnb.evaluation import metrics
from spamnb.nb import naive_bayes  # noqa: E402
from spamnb.evaluation.folds import hash_folds  # noqa: E402
from spamnb.model import log_odds  # noqa: E402
from spamnb.mail.sources import iter_index  # noqa: E402
from spamnb.mail.tokenizer import TokenizerConfig, tokenize  # noqa: E402
from spamnb.nb.vocabulary import Vocabulary, document_frequency  # noqa: E402

# name -> changes to the base configuration
VARIANTS = {
    "default": {},
    "no-case-fold": {"case_fold": False},
    "no-nfkc": {"nfkc": False},
    "min-len-1": {"min_word_len": 1},
    "min-len-2": {"min_word_len": 2},
    "min-len-3": {"min_word_len": 3},
    "cjk=bigram": {"cjk": "bigram"},
    "received-hops=3": {"received_hops": 3},
    "max-len-20": {"max_word_len": 20},
    "max-len-30": {"max_word_len": 30},
    "html=text": {"html": "text"},
    "html=strip": {"html": "strip"},
    "html=raw": {"html": "raw"},
    "alternative=html": {"alternative": "html"},
    "alternative=plain": {"alternative": "plain"},
    "cjk=unigram": {"cjk": "unigram"},
    "cjk=uni+bigram": {"cjk": "uni+bigram"},
    "cjk=none": {"cjk": "none"},
    "cjk=none,max-len-20": {"cjk": "none", "max_word_len": 20},
    "cjk=none,max-len-30": {"cjk": "none", "max_word_len": 30},
    "cjk=bigram+run": {"cjk": "bigram+run"},
    "cjk=unigram+run": {"cjk": "unigram+run"},
    "cjk=bigram+run,min-len-2": {"cjk": "bigram+run", "min_word_len": 2},
    "cjk=none,min-len-2": {"cjk": "none", "min_word_len": 2},
    "cjk=none,min-len-1": {"cjk": "none", "min_word_len": 1},
    "cjk=none,min-len-2,max-len-8": {"cjk": "none", "min_word_len": 2, "max_word_len": 8},
    "cjk=run-or-bigram,min-len-2": {"cjk": "run-or-bigram", "min_word_len": 2},
    "cjk=run-or-bigram": {"cjk": "run-or-bigram"},
    "received-hops=5": {"received_hops": 5},
    "received-hops=all": {"received_hops": 1000},
    "min-len-2,received-hops=all": {"min_word_len": 2, "received_hops": 1000},
    "bigrams": {"bigrams": True},
    "received-hops=1": {"received_hops": 1},
    "received-hops=10": {"received_hops": 10},
    "headers=trec-fair": {
        "only_headers": ("subject", "from", "to", "content-type", "content-transfer-encoding")},
    "headers=none": {"only_headers": ()},
    "max-part-bytes=20k": {"max_part_bytes": 20_000},
    "max-part-bytes=50k": {"max_part_bytes": 50_000},
    "max-part-bytes=1M": {"max_part_bytes": 1_000_000},
}

_RAWS = []  # inherited by forked workers


def _tokenize_range(args):
    lo, hi, cfg = args
    return [tokenize(_RAWS[i], cfg) for i in range(lo, hi)]


def tokenize_all(cfg, workers):
    n = len(_RAWS)
    if workers <= 1:
        return [tokenize(r, cfg) for r in _RAWS]
    step = 200
    jobs = [(lo, min(n, lo + step), cfg) for lo in range(0, n, step)]
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        out = []
        for chunk in pool.imap(_tokenize_range, jobs):
            out.extend(chunk)
    return out


def cv_scores(X, y, fold, make, transform=None, train=None):
    """Pooled out-of-fold log-odds; each fold's model sees only its training columns.

    ``transform(M)``: the feature transform of a fold's rows, applied after its
    columns are chosen (default none); ``train(est, F, y)``: how to fit (default
    ``est.fit``).
    """
    transform = transform or (lambda M: M)
    score = np.empty(len(y))
    for f in np.unique(fold):
        tr, te = fold != f, fold == f
        Xtr = X[tr]
        cols = np.flatnonzero(document_frequency(Xtr))
        est = make()
        F = transform(Xtr[:, cols])
        if train is None:
            est.fit(F, y[tr])
        else:
            train(est, F, y[tr])
        score[te] = log_odds(est.predict_joint_log_proba(transform(X[te][:, cols])))
    return score


MODELS = {
    # name: (features, factory); "-mean" ranks by log-odds per distinct token of
    # the message (a length normalisation: long messages otherwise get extreme
    # log-odds and dominate the misordered pairs).
    "mnb-presence": ("presence", lambda a: naive_bayes.MultinomialNB(alpha=a)),
    "mnb-presence-mean": ("presence-mean", lambda a: naive_bayes.MultinomialNB(alpha=a)),
    "mnb-counts": ("counts", lambda a: naive_bayes.MultinomialNB(alpha=a)),
    "cnb-presence": ("presence", lambda a: naive_bayes.ComplementNB(alpha=a)),
    "bnb": ("presence", lambda a: naive_bayes.BernoulliNB(alpha=a)),
}


def read_index(index):
    """(labels 0/1, index paths, raw messages) of a TREC-style index."""
    base = os.path.dirname(os.path.abspath(index))
    msgs = list(iter_index(index))
    return (np.array([m.label == "spam" for m in msgs], dtype=np.int64),
            [os.path.relpath(m.source, base) for m in msgs], [m.raw for m in msgs])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("index")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--only-headers", help="comma-separated base header set (e.g. the trec06c fair set)")
    ap.add_argument("--variants", default=";".join(VARIANTS),
                    help="semicolon-separated variant names (default: all): %s" % "; ".join(VARIANTS))
    ap.add_argument("--models", default="mnb-presence,mnb-counts")
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    args.index = shared_corpora.require(args.index)  # absent: one line, exit 2

    base_cfg = TokenizerConfig()
    if args.only_headers is not None:
        base_cfg = replace(base_cfg, only_headers=tuple(h for h in args.only_headers.split(",") if h))
    y, keys, raws = read_index(args.index)
    _RAWS[:] = raws
    fold = hash_folds(keys, args.folds)
    models = args.models.split(",")
    print(f"{len(y)} messages ({int(y.sum())} spam), {args.folds} folds by md5(path), "
          f"α = {args.alpha:g}; base config: only_headers={base_cfg.only_headers}\n")
    head = "| config | " + " | ".join(f"{m} (1-AUC)% | {m} R@0.1% " for m in models) + \
        "| tokens/msg | vocab | tokenize s |"
    print(head)
    print("|" + "---|" * (1 + 2 * len(models) + 3), flush=True)
    for name in args.variants.split(";"):
        changes = dict(VARIANTS[name])
        if "only_headers" in changes and args.only_headers is not None and name != "headers=none":
            continue  # the base already fixes the header set
        cfg = replace(base_cfg, **changes)
        t0 = time.perf_counter()
        toks = tokenize_all(cfg, args.workers)
        tok_s = time.perf_counter() - t0
        X = Vocabulary().fit_transform(toks).astype(np.float64)
        cells = []
        for m in models:
            feats, factory = MODELS[m]
            Xf = X
            if feats.startswith("presence"):
                Xf = X.copy()
                Xf.data[:] = 1.0
            s = cv_scores(Xf, y, fold, lambda: factory(args.alpha))
            if feats == "presence-mean":
                s = s / np.maximum(np.diff(X.indptr), 1)
            cells.append(f"{metrics.one_minus_auc_pct(y, s):.3f}")
            cells.append(f"{100 * metrics.recall_at_fpr(y, s, 0.001):.1f}")
        ntok = sum(map(len, toks)) / len(toks)
        print(f"| {name} | " + " | ".join(cells) + f" | {ntok:.0f} | {X.shape[1]} | {tok_s:.1f} |",
              flush=True)


if __name__ == "__main__":
    main()
