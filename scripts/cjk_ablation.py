#!/usr/bin/env python3
"""CJK tokenizing schemes measured with the default model (training on errors included).

trec06c-dev with only its fair headers; trained on md5(path) % 2 == 0, tested on
the other half (the protocol of scripts/compare_peers.py --halves). Prints
(1-AUC)% and spam recall at 0.1% false positives per scheme.

    python scripts/cjk_ablation.py none bigram uni+bigram
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from spamnb.evaluation import evaluate, metrics  # noqa: E402
from spamnb.evaluation.folds import hash_folds  # noqa: E402
from spamnb.model import SpamModel  # noqa: E402
from spamnb.mail.sources import iter_index  # noqa: E402
from spamnb.mail.tokenizer import TokenizerConfig  # noqa: E402

INDEX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "corpora",
                     "trec06c-dev", "index")
HEADERS = ("subject", "from", "to", "content-type", "content-transfer-encoding")


def main(schemes):
    base = os.path.dirname(INDEX)
    msgs = [(os.path.relpath(m.source, base), m.raw, m.label) for m in iter_index(INDEX)]
    fold = hash_folds([m[0] for m in msgs], 2)
    test = fold == 1  # scored by the model trained on the other half
    for cjk in schemes:
        tok = TokenizerConfig.from_dict({**TokenizerConfig().to_dict(), "cjk": cjk, "only_headers": HEADERS})
        s = evaluate.cross_validate(lambda: SpamModel(tokenizer=tok), msgs, folds=fold)
        print(f"{cjk}: (1-AUC)% {metrics.one_minus_auc_pct(s.y[test], s.score[test]):.4f}, "
              f"recall@0.1%FPR {100 * metrics.recall_at_fpr(s.y[test], s.score[test], 0.001):.1f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["none", "bigram", "uni+bigram"])
