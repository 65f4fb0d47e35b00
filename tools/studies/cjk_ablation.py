#!/usr/bin/env python3
"""CJK tokenizing schemes measured with the default model (training on errors included).

trec06c-dev with only its fair headers; trained on md5(path) % 2 == 0, tested on
the other half (the protocol of tools/studies/compare_peers.py --halves). Prints
(1-AUC)% and spam recall at 0.1% false positives per scheme.

The corpus is not shipped (its licence allows research use only): it is read
from ../shared/corpora/trec06c-dev beside the repository, or --corpus PATH.
Without it the script prints one line and exits 2 (tools/shared_corpora.py).

    python tools/studies/cjk_ablation.py none bigram uni+bigram
    python tools/studies/cjk_ablation.py --corpus /data/trec06c-dev none
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))  # the project: spamnb, tools

from tools import shared_corpora  # noqa: E402
from spamnb.evaluation import evaluate, metrics  # noqa: E402
from spamnb.evaluation.folds import hash_folds  # noqa: E402
from spamnb.model import SpamModel  # noqa: E402
from spamnb.mail.sources import iter_index  # noqa: E402
from spamnb.mail.tokenizer import TokenizerConfig  # noqa: E402

HEADERS = ("subject", "from", "to", "content-type", "content-transfer-encoding")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("schemes", nargs="*", default=["none", "bigram", "uni+bigram"],
                    help="TokenizerConfig cjk settings (default: none bigram uni+bigram)")
    ap.add_argument("--corpus", default=str(shared_corpora.TREC06C),
                    help="the trec06c-dev folder (with its index), or an index file "
                         "(default: ../shared/corpora/trec06c-dev beside the repository)")
    args = ap.parse_args(argv)
    index = shared_corpora.require(args.corpus, chinese=True, option="--corpus")
    base = os.path.dirname(index)
    msgs = [(os.path.relpath(m.source, base), m.raw, m.label) for m in iter_index(index)]
    fold = hash_folds([m[0] for m in msgs], 2)
    test = fold == 1  # scored by the model trained on the other half
    for cjk in args.schemes:
        tok = TokenizerConfig.from_dict({**TokenizerConfig().to_dict(), "cjk": cjk, "only_headers": HEADERS})
        s = evaluate.cross_validate(lambda: SpamModel(tokenizer=tok), msgs, folds=fold)
        print(f"{cjk}: (1-AUC)% {metrics.one_minus_auc_pct(s.y[test], s.score[test]):.4f}, "
              f"recall@0.1%FPR {100 * metrics.recall_at_fpr(s.y[test], s.score[test], 0.001):.1f}", flush=True)


if __name__ == "__main__":
    main()
