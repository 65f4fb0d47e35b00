#!/usr/bin/env python3
"""Model-side accuracy levers, measured: event model, λ, presence vs counts,
TF/length transforms (Rennie et al. 2003), on a fixed tokenization.

Messages are tokenized once (default tokenizer settings, or --only-headers) and
counted once; each variant is then cross-validated on the same folds (md5 of
the path, as the peers in tools/studies/run_peers.py), scores of all folds pooled.

    python tools/studies/model_ablation.py ../shared/corpora/spamassassin/index --folds 10
    python tools/studies/model_ablation.py ../shared/corpora/spamassassin/index --folds 5 --refine --alphas 0.001,0.01,0.03
    python tools/studies/model_ablation.py ../shared/corpora/trec06c-dev/index --folds 2 \
        --only-headers subject,from,to,content-type,content-transfer-encoding
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the project: spamnb, tools

from spamnb.evaluation import metrics
from spamnb.nb import naive_bayes  # noqa: E402
from spamnb.evaluation.folds import hash_folds  # noqa: E402
from spamnb.mail.sources import iter_index  # noqa: E402
from spamnb.mail.tokenizer import TokenizerConfig, tokenize  # noqa: E402
from spamnb.model import refine, transform_features  # noqa: E402
from spamnb.nb.vocabulary import Vocabulary  # noqa: E402
from tools import shared_corpora  # noqa: E402
from tools.studies.tokenizer_ablation import cv_scores  # noqa: E402  (same folds, one definition)


def transform(X, how):
    """Feature transforms of Rennie et al. (2003), applied to a count matrix."""
    X = X.copy()
    if how == "counts":
        return X
    if how == "presence":
        X.data[:] = 1.0
        return X
    if how == "logtf":
        X.data = np.log1p(X.data)  # d_w = log(1 + tf_w)
        return X
    if how in ("presence-l2", "logtf-l2"):
        X.data = np.ones_like(X.data) if how == "presence-l2" else np.log1p(X.data)
        norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
        norms[norms == 0] = 1
        # scale each row to unit length, then to the mean row length so λ keeps its meaning
        scale = np.repeat(1.0 / norms, np.diff(X.indptr)) * norms.mean()
        X.data *= scale
        return X
    raise ValueError(how)


def cv(X, y, fold, make, refine_rounds=0, margin=0.0, unit=False):
    """tokenizer_ablation.cv_scores; with ``unit`` the model's own presence-l2 rows
    (unit length, after the fold's columns are chosen) and training on errors."""
    if not unit:
        return cv_scores(X, y, fold, make)

    def train(est, F, y_train):
        est.fit(F, y_train)
        refine(est, F, y_train, refine_rounds, margin)

    return cv_scores(X, y, fold, make, lambda M: transform_features(M, "presence-l2"), train)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("index")
    ap.add_argument("--folds", type=int, default=10)
    ap.add_argument("--only-headers")
    ap.add_argument("--bigrams", action="store_true")
    ap.add_argument("--alphas", default="1,0.1,0.01,0.001")
    ap.add_argument("--refine", action="store_true",
                    help="instead: the default model (unit-length presence) with training on errors, "
                         "over a grid of λ, rounds and margins")
    args = ap.parse_args()
    args.index = shared_corpora.require(args.index)  # absent: one line, exit 2
    cfg = TokenizerConfig()
    changes = {}
    if args.only_headers:
        changes["only_headers"] = tuple(args.only_headers.split(","))
    if args.bigrams:
        changes["bigrams"] = True
    if changes:
        cfg = TokenizerConfig.from_dict({**cfg.to_dict(), **changes})
    base = os.path.dirname(os.path.abspath(args.index))
    t0 = time.perf_counter()
    msgs = list(iter_index(args.index))
    toks = [tokenize(m.raw, cfg) for m in msgs]
    tok_s = time.perf_counter() - t0
    y = np.array([m.label == "spam" for m in msgs], dtype=np.int64)
    fold = hash_folds([os.path.relpath(m.source, base) for m in msgs], args.folds)
    X = Vocabulary().fit_transform(toks).astype(np.float64)
    print(f"{len(msgs)} messages, {X.shape[1]} tokens, tokenized in {tok_s:.1f} s; {args.folds} folds by md5(path)\n")
    alphas = [float(a) for a in args.alphas.split(",")]
    models = {
        "multinomial": lambda a: naive_bayes.MultinomialNB(alpha=a),
        "bernoulli": lambda a: naive_bayes.BernoulliNB(alpha=a),
        "complement": lambda a: naive_bayes.ComplementNB(alpha=a),
    }
    if args.refine:
        print("| model | λ | refine rounds | margin | (1-AUC)% | recall@0.1%FPR | recall@1%FPR |")
        print("|---|---|---|---|---|---|---|")
        Xb = X.copy()
        Xb.data[:] = 1.0
        for a in alphas:
            for rounds, margin in ((0, 0), (5, 5), (10, 5), (10, 10), (20, 10), (10, 15), (10, 20)):
                s = cv(Xb, y, fold, lambda: naive_bayes.MultinomialNB(alpha=a), rounds, margin, unit=True)
                print(f"| multinomial presence-l2 | {a:g} | {rounds} | {margin:g} | "
                      f"{metrics.one_minus_auc_pct(y, s):.4f} | {100 * metrics.recall_at_fpr(y, s, 0.001):.1f} | "
                      f"{100 * metrics.recall_at_fpr(y, s, 0.01):.1f} |", flush=True)
        return
    print("| model | features | λ | (1-AUC)% | recall@0.1%FPR | recall@1%FPR |")
    print("|---|---|---|---|---|---|")
    for feats in ("counts", "presence", "logtf", "presence-l2", "logtf-l2"):
        Xf = transform(X, feats)
        for name, make in models.items():
            if name == "bernoulli" and feats != "presence":
                continue
            for a in alphas:
                s = cv(Xf, y, fold, lambda: make(a))
                print(f"| {name} | {feats} | {a:g} | {metrics.one_minus_auc_pct(y, s):.3f} | "
                      f"{100 * metrics.recall_at_fpr(y, s, 0.001):.1f} | {100 * metrics.recall_at_fpr(y, s, 0.01):.1f} |",
                      flush=True)


if __name__ == "__main__":
    main()
