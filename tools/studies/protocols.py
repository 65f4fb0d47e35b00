#!/usr/bin/env python3
"""Is a change an improvement? Two model settings, A and B, on every protocol at once.

A figure from the split a change was tuned on says little; a change is kept when
it helps on several protocols and hurts none beyond its interval. This runs A and
B on the same messages under each protocol and prints, per protocol, (1-AUC)%
and recall at 0.1% and 1% false positives, B minus A with a paired bootstrap
interval (:func:`spamnb.evaluation.metrics.paired_bootstrap`, ham and spam
resampled apart), and a verdict: ``better`` or ``worse`` when the whole interval
is on one side of zero, ``noise`` otherwise. Under each protocol it names A's
worst-ranked messages (``--worst N``: the N highest-scored ham and lowest-scored
spam, each with the spam or ham it is misordered with and its share of
(1-AUC)%), so a figure that is one message (a label error, say) shows as one.

Protocols (the shared corpora in ``../shared/corpora``):

* ``cv10``   SpamAssassin, stratified 10-fold cross-validation, scores pooled;
* ``age``    SpamAssassin by age: train on easy_ham, hard_ham and spam, test on
             the later easy_ham_2 and spam_2;
* ``trec``   trec06c-dev, train on one half, test on the other (md5 of the path),
             every message cut to five headers (the others leak its label);
* ``online`` TREC's online protocol over the first ``--online-n`` messages of the
             longest stream (SpamAssassin, trec06c-dev, enron-ham-dev; shuffled);
* ``enron``  out-of-domain ham: a model trained on SpamAssassin, the share of
             enron-ham-dev's ham it does not file as ham (unsure or spam).

Settings are ``KEY=VALUE``: a :class:`spamnb.model.SpamModel` parameter (prior,
alpha, model_type, features, refine_rounds, refine_margin) or a tokenizer field
(skip_headers and only_headers take comma lists, ``''`` for none)::

    python tools/studies/protocols.py --b prior=learned                 # A: the defaults
    python tools/studies/protocols.py --a skip_headers= --protocols cv10,age,enron
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import re
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the project: spamnb, tools

from tools import shared_corpora  # noqa: E402
from tools.studies.first_day import strip_artefacts  # noqa: E402
from spamnb.evaluation import evaluate, metrics  # noqa: E402
from spamnb.mail.sources import iter_index  # noqa: E402
from spamnb.mail.tokenizer import TokenizerConfig  # noqa: E402
from spamnb.model import SpamModel  # noqa: E402
from spamnb.scale import parallel  # noqa: E402

PROTOCOLS = ("cv10", "age", "trec", "online", "enron")
MODEL_KEYS = {"prior": str, "alpha": float, "model_type": str, "features": str,
              "refine_rounds": int, "refine_margin": float}
FAIR_HEADERS = (b"subject", b"from", b"to", b"content-type", b"content-transfer-encoding")
STATS = {
    "(1-AUC)%": (metrics.one_minus_auc_pct, -1),  # lower is better
    "recall@0.1%": (lambda y, s: 100 * metrics.recall_at_fpr(y, s, 0.001), +1),
    "recall@1%": (lambda y, s: 100 * metrics.recall_at_fpr(y, s, 0.01), +1),
}


def settings(pairs):
    """``KEY=VALUE`` strings -> (SpamModel kwargs, TokenizerConfig kwargs)."""
    model, tok = {}, {}
    for pair in pairs or ():
        key, _, value = pair.partition("=")
        if key in MODEL_KEYS:
            model[key] = MODEL_KEYS[key](value)
        elif key in ("skip_headers", "only_headers"):
            tok[key] = tuple(h.strip().lower() for h in value.split(",") if h.strip())
        elif key in TokenizerConfig._FIELDS:
            default = getattr(TokenizerConfig(), key)
            tok[key] = (value.lower() in ("1", "true", "yes")) if isinstance(default, bool) else type(default)(value)
        else:
            raise SystemExit(f"unknown setting {key!r}")
    return model, tok


def maker(pairs):
    model, tok = settings(pairs)
    return lambda: SpamModel(tokenizer=TokenizerConfig(**tok), **model)


def corpus(name, strip=None):
    index = shared_corpora.require(shared_corpora.SHARED / name)
    return [(m.source, strip(m.raw) if strip else m.raw, m.label) for m in iter_index(index, trusted=True)]


OLDER = re.compile(r"/(easy_ham|hard_ham|spam)\.\d")  # SpamAssassin's 2002 groups
LATER = re.compile(r"/(easy_ham_2|spam_2)\.\d")  # its 2003-2005 ones


def age_split(sa):
    """``(older, later)`` messages of the SpamAssassin corpus: the by-age protocol's
    training (easy_ham, hard_ham, spam) and test (easy_ham_2, spam_2) sets."""
    return [m for m in sa if OLDER.search(m[0])], [m for m in sa if LATER.search(m[0])]


def fair_headers(raw, keep=FAIR_HEADERS):
    """The message with only the header fields ``keep`` (lower-case bytes): by default the
    five trec06c-dev may show (the rest leak its label)."""
    cut = raw.find(b"\n\n")
    if cut < 0:
        return raw
    kept, kept_field = [], False
    for line in raw[:cut].split(b"\n"):
        if line[:1] not in (b" ", b"\t"):
            kept_field = line.split(b":", 1)[0].strip().lower() in keep
        if kept_field:
            kept.append(line)
    return b"\n".join(kept) + raw[cut:]


def run(protocol, make, cache):
    """``(y, scores, sources, ranking)`` of one setting under one protocol: ``ranking`` is
    ``scores`` (log-odds), except for ``enron``, where y is all ham, scores are 0/1 not-ham
    and ranking the log-odds."""
    if protocol == "cv10":
        sc = evaluate.cross_validate(make, cache("spamassassin"), k=10)
    elif protocol == "age":
        sa = cache("spamassassin")
        old, new = age_split(sa)
        sc = evaluate.train_test(make, old, new)
    elif protocol == "trec":
        tc = cache("trec06c-dev", fair_headers)
        half = [int(hashlib.md5(m[0].encode()).hexdigest(), 16) % 2 for m in tc]
        sc = evaluate.train_test(make, [m for m, h in zip(tc, half) if h == 0], [m for m, h in zip(tc, half) if h == 1])
    elif protocol == "online":
        stream = cache("spamassassin") + cache("trec06c-dev") + cache("enron-ham-dev", strip_artefacts)
        stream = stream[:]
        random.Random(1).shuffle(stream)
        sc = evaluate.online(make, stream[: cache.online_n])
    else:  # enron: out-of-domain ham
        model = make()
        parallel.train(model, cache("spamassassin"))
        ham = cache("enron-ham-dev", strip_artefacts)
        verdicts = list(model.classify_many(raw for _, raw, _ in ham))
        return (np.zeros(len(ham), dtype=int), np.array([c.label != "ham" for c in verdicts], dtype=float),
                [src for src, _, _ in ham], np.array([c.score for c in verdicts]))
    return sc.y, sc.score, sc.sources, sc.score


class Cache:
    def __init__(self, online_n):
        self.online_n = online_n
        self._data = {}

    def __call__(self, name, strip=None):
        key = (name, strip)
        if key not in self._data:
            self._data[key] = corpus(name, strip)
        return self._data[key]


def mean_difference(a, b, n=1000, seed=0, level=0.95):
    """Paired bootstrap of mean(b) − mean(a) (the enron protocol's not-ham shares), in %."""
    rng = np.random.default_rng(seed)
    diffs = [100 * (b[idx].mean() - a[idx].mean()) for idx in (rng.integers(0, a.size, a.size) for _ in range(n))]
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(diffs, [tail, 100 - tail])
    return 100 * (b.mean() - a.mean()), low, high


def short(source):
    """A source relative to the shared corpora, where it is under them."""
    rel = os.path.relpath(source, shared_corpora.SHARED)
    return source if rel.startswith("..") else rel


def worst_lines(protocol, y, scores, sources, n):
    """A's ``n`` worst-ranked ham and spam, one line each: score, misordered pairs and
    share of (1-AUC)% (:func:`spamnb.evaluation.metrics.worst_ranked`)."""
    total = metrics.one_minus_auc_pct(y, scores)
    for label, rows, other in zip(("ham", "spam"), metrics.worst_ranked(y, scores, n), ("spam", "ham")):
        for i, pairs, share in rows:
            print(f"{protocol:<8} A's worst {label:<4} {scores[i]:+8.2f} {pairs:6d} {other:<4} "
                  f"{share:.4f} of {total:.4f} (1-AUC)% ({100 * share / total:.0f}%)  {short(sources[i])}")


def enron_worst_lines(scores, not_ham, sources, n):
    """The enron protocol has no spam, hence no pairs: A's ``n`` highest-scored ham, each
    one of the ham it does not file as ham (if it does not)."""
    for i in np.argsort(-scores, kind="mergesort")[:n]:
        what = f"1 of {int(not_ham.sum())} not filed ham" if not_ham[i] else "filed ham"
        print(f"{'enron':<8} A's worst ham  {scores[i]:+8.2f}  {what}  {short(sources[i])}")


def verdict(low, high, sign):
    if low > 0 or high < 0:
        return "better" if (low > 0) == (sign > 0) else "worse"
    return "noise"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", nargs="*", default=[], metavar="KEY=VALUE", help="setting A (default: the defaults)")
    ap.add_argument("--b", nargs="*", default=[], metavar="KEY=VALUE", help="setting B")
    ap.add_argument("--protocols", default=",".join(PROTOCOLS))
    ap.add_argument("--online-n", type=int, default=6000)
    ap.add_argument("--resamples", type=int, default=500)
    ap.add_argument("--worst", type=int, default=1, metavar="N",
                    help="name setting A's N worst-ranked ham and spam of each protocol (0: none)")
    args = ap.parse_args()
    make_a, make_b = maker(args.a), maker(args.b)
    cache = Cache(args.online_n)
    print(f"A: {' '.join(args.a) or 'defaults'}   B: {' '.join(args.b) or 'defaults'}")
    print(f"{'protocol':<8} {'metric':<13} {'A':>9} {'B':>9} {'B-A':>9}  95% interval       verdict")
    for protocol in args.protocols.split(","):
        y, sa, sources, ranking = run(protocol, make_a, cache)
        _, sb, _, _ = run(protocol, make_b, cache)
        if protocol == "enron":
            d, low, high = mean_difference(sa, sb, args.resamples)
            print(f"{protocol:<8} {'not ham %':<13} {100 * sa.mean():9.3f} {100 * sb.mean():9.3f} {d:+9.3f}  "
                  f"[{low:+.3f}, {high:+.3f}]  {verdict(low, high, -1)}", flush=True)
            enron_worst_lines(ranking, sa, sources, args.worst)
            continue
        for name, (stat, sign) in STATS.items():
            d, low, high = metrics.paired_bootstrap(y, sa, sb, stat, n=args.resamples)
            print(f"{protocol:<8} {name:<13} {stat(y, sa):9.3f} {stat(y, sb):9.3f} {d:+9.3f}  "
                  f"[{low:+.3f}, {high:+.3f}]  {verdict(low, high, sign)}", flush=True)
        worst_lines(protocol, y, sa, sources, args.worst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
