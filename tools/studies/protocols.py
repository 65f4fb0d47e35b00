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
* ``modern`` the first day against today's spam: a model trained on what the
             default model trains on (the shipped corpus) judges enron-ham-dev's ham
             and the 2,687 ``pot-*`` spam of 2022-2026 in modern-spam-dev (never
             shipped nor trained on, so its artefact headers are kept: the model never
             saw them). Besides the ranking figures: spam caught and ham not filed ham
             at the model's own cut-offs, and the catch with both cut-offs shifted until
             5% of the ham is not filed ham (the frontier figure of
             ``first_day_frontier.py``).

A change of what a model learns rather than how: ``--b-extra INDEX`` (a TREC index or an
archive holding one) adds those messages to every training set of B, A's test messages
unchanged (cv10: to each fold's training part; online: learned before the stream, their
own scores left out; trec: cut to its five headers). Messages of modern-spam-dev's
``pot-*`` part are refused: they are what ``modern`` judges. Whether the default model
should also train on ``corpora/recent-spam.tar.xz`` (docs/accuracy.md, "today's spam")::

    python tools/studies/protocols.py --b-extra corpora/recent-spam.tar.xz --resamples 200 --worst 3

Settings are ``KEY=VALUE``: a :class:`spamnb.model.SpamModel` parameter (prior,
alpha, model_type, features, refine_rounds, refine_margin) or a tokenizer field
(skip_headers and only_headers take comma lists, ``''`` for none)::

    python tools/studies/protocols.py --b prior=learned                 # A: the defaults
    python tools/studies/protocols.py --a skip_headers= --protocols cv10,age,enron
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import random
import re
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the project: spamnb, tools

from tools import shared_corpora  # noqa: E402
from tools.studies.first_day import strip_artefacts  # noqa: E402
from spamnb.evaluation import evaluate, metrics  # noqa: E402
from spamnb.evaluation.folds import stratified_kfold  # noqa: E402
from spamnb.mail.sources import iter_index  # noqa: E402
from spamnb.mail.tokenizer import TokenizerConfig  # noqa: E402
from spamnb.model import SpamModel  # noqa: E402
from spamnb.scale import parallel  # noqa: E402
from spamnb.storage.modelfile import shipped_corpus  # noqa: E402
from spamnb.verdict import DEFAULT_COSTS, cutoffs_from_costs  # noqa: E402

PROTOCOLS = ("cv10", "age", "trec", "online", "enron", "modern")
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


_HAM_P, _SPAM_P = cutoffs_from_costs(*DEFAULT_COSTS)  # the default cut-offs: P(spam) 0.5 and 0.95
SPAM_CUT = math.log(_SPAM_P / (1 - _SPAM_P))  # as log-odds (log 19); ham below 0
TARGET = 0.05  # at most 5% of unfamiliar ham unsure or spam (the first-day target)
MODERN_HELD = re.compile(r"/pot-[^/]*$")  # modern-spam-dev's non-commercial part: judged, never trained on


def shipped():
    """What the default model trains on (:func:`spamnb.storage.modelfile.shipped_corpus`)."""
    return [(m.source, m.raw, m.label) for m in iter_index(shipped_corpus(), trusted=True)]


def extra(path):
    """The ``(source, raw, label)`` messages of the index ``path`` (``--a-extra``/``--b-extra``);
    none of the pot-* part of modern-spam-dev, which ``modern`` judges."""
    if not path:
        return []
    messages = [(m.source, m.raw, m.label) for m in iter_index(path, trusted=True)]
    held = [src for src, _, _ in messages if MODERN_HELD.search(src)]
    if held:
        raise SystemExit(f"{path}: {len(held)} messages of modern-spam-dev's pot-* part "
                         f"(e.g. {held[0]}): the modern protocol judges them, nothing trains on them")
    return messages


def without(sc, sources):
    """``(y, scores, sources)`` of ``sc`` (a :class:`spamnb.evaluation.evaluate.Scores`) minus ``sources``."""
    keep = np.array([src not in sources for src in sc.sources], dtype=bool)
    return sc.y[keep], sc.score[keep], [src for src, k in zip(sc.sources, keep) if k]


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


def run(protocol, make, cache, more=()):
    """``(y, scores, sources, ranking)`` of one setting under one protocol: ``ranking`` is
    ``scores`` (log-odds), except for ``enron``, where y is all ham, scores are 0/1 not-ham
    and ranking the log-odds. ``more``: messages added to every training set (:func:`extra`)."""
    more = list(more)
    if protocol == "cv10":  # the extra messages are a fold of their own, never tested on
        sa = cache("spamassassin")
        folds = stratified_kfold(np.array([label == "spam" for _, _, label in sa], dtype=int), 10, 0)
        sc = evaluate.cross_validate(make, sa + more, folds=np.concatenate([folds, np.full(len(more), -1)]))
    elif protocol == "age":
        sa = cache("spamassassin")
        old, new = age_split(sa)
        sc = evaluate.train_test(make, old + more, new)
    elif protocol == "trec":
        tc = cache("trec06c-dev", fair_headers)
        half = [int(hashlib.md5(m[0].encode()).hexdigest(), 16) % 2 for m in tc]
        train = [m for m, h in zip(tc, half) if h == 0] + [(src, fair_headers(raw), label) for src, raw, label in more]
        sc = evaluate.train_test(make, train, [m for m, h in zip(tc, half) if h == 1])
    elif protocol == "online":  # the extra messages first, learned as the stream's start
        stream = cache("spamassassin") + cache("trec06c-dev") + cache("enron-ham-dev", strip_artefacts)
        stream = stream[:]
        random.Random(1).shuffle(stream)
        sc = evaluate.online(make, more + stream[: cache.online_n])
    elif protocol == "modern":  # the default model's training against enron ham and today's spam
        model = modern_model(make, cache, more)
        test = modern_test(cache)
        verdicts = list(model.classify_many(raw for _, raw, _ in test))
        return (np.array([label == "spam" for _, _, label in test], dtype=int), np.array([c.score for c in verdicts]),
                [src for src, _, _ in test], np.array([c.label for c in verdicts]))
    else:  # enron: out-of-domain ham
        model = make()
        parallel.train(model, cache("spamassassin") + more)
        ham = cache("enron-ham-dev", strip_artefacts)
        verdicts = list(model.classify_many(raw for _, raw, _ in ham))
        return (np.zeros(len(ham), dtype=int), np.array([c.label != "ham" for c in verdicts], dtype=float),
                [src for src, _, _ in ham], np.array([c.score for c in verdicts]))
    y, scores, sources = without(sc, {src for src, _, _ in more})
    return y, scores, sources, scores


def modern_model(make, cache, more=()):
    """The ``modern`` protocol's model: ``make()`` trained on what the default model trains
    on (``cache("shipped")``), then ``more`` (:func:`extra`)."""
    model = make()
    parallel.train(model, cache("shipped") + list(more))
    return model


def modern_test(cache):
    """The ``modern`` protocol's test messages, ``(source, raw, label)``: enron-ham-dev's ham
    (artefacts stripped), then modern-spam-dev's pot-* spam (:data:`MODERN_HELD`)."""
    return cache("enron-ham-dev", strip_artefacts) + [m for m in cache("modern-spam-dev") if MODERN_HELD.search(m[0])]


class Cache:
    def __init__(self, online_n):
        self.online_n = online_n
        self._data = {}

    def __call__(self, name, strip=None):
        key = (name, strip)
        if key not in self._data:
            self._data[key] = shipped() if name == "shipped" else corpus(name, strip)
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


def shift_for(ham_scores, share=TARGET):
    """δ: with score − δ, exactly ``share`` of this ham scores at or above 0 (not ham)."""
    return float(np.quantile(ham_scores, 1 - share))


def caught(spam_scores, delta):
    return 100 * float(np.mean(spam_scores - delta > SPAM_CUT))


def frontier_interval(enron, spam, n, seed=0, share=TARGET):
    """95% percentile interval of the catch at the shift that leaves ``share`` of the ham not
    filed ham (5%), enron ham and spam resampled apart."""
    rng = np.random.default_rng(seed)
    values = [caught(rng.choice(spam, spam.size), shift_for(rng.choice(enron, enron.size), share))
              for _ in range(n)]
    return np.percentile(values, [2.5, 97.5])


def modern_lines(y, a, b, labels_a, labels_b, resamples):
    """The modern protocol's figures at the cut-offs: spam caught and ham not filed ham at
    each model's own, and spam caught with both shifted to 5% of ham not filed ham."""
    ham, spam = y == 0, y == 1
    for name, part, want, sign in (("spam caught %", spam, "spam", +1), ("ham not ham %", ham, None, -1)):
        fa = (labels_a[part] == want) if want else (labels_a[part] != "ham")
        fb = (labels_b[part] == want) if want else (labels_b[part] != "ham")
        d, low, high = mean_difference(fa.astype(float), fb.astype(float), resamples)
        print(f"{'modern':<8} {name:<13} {100 * fa.mean():9.3f} {100 * fb.mean():9.3f} {d:+9.3f}  "
              f"[{low:+.3f}, {high:+.3f}]  {verdict(low, high, sign)}", flush=True)
    for tag, s in (("A", a), ("B", b)):
        at = caught(s[spam], shift_for(s[ham]))
        low, high = frontier_interval(s[ham], s[spam], min(resamples, 200))
        print(f"{'modern':<8} {tag} caught at 5% not ham: {at:.1f} [{low:.1f}, {high:.1f}]", flush=True)
    # B slid to A's own operating point: what B catches for the ham A holds at its cut-offs
    share = float(np.mean(labels_a[ham] != "ham"))
    at = caught(b[spam], shift_for(b[ham], share))
    low, high = frontier_interval(b[ham], b[spam], min(resamples, 200), share=share)
    print(f"{'modern':<8} B caught at A's {100 * share:.1f}% not ham: {at:.1f} [{low:.1f}, {high:.1f}]", flush=True)


def verdict(low, high, sign):
    if low > 0 or high < 0:
        return "better" if (low > 0) == (sign > 0) else "worse"
    return "noise"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", nargs="*", default=[], metavar="KEY=VALUE", help="setting A (default: the defaults)")
    ap.add_argument("--b", nargs="*", default=[], metavar="KEY=VALUE", help="setting B")
    ap.add_argument("--a-extra", metavar="INDEX", help="messages added to every training set of A")
    ap.add_argument("--b-extra", metavar="INDEX", help="messages added to every training set of B")
    ap.add_argument("--protocols", default=",".join(PROTOCOLS))
    ap.add_argument("--online-n", type=int, default=6000)
    ap.add_argument("--resamples", type=int, default=500)
    ap.add_argument("--worst", type=int, default=1, metavar="N",
                    help="name setting A's N worst-ranked ham and spam of each protocol (0: none)")
    args = ap.parse_args()
    make_a, make_b = maker(args.a), maker(args.b)
    cache = Cache(args.online_n)
    more_a, more_b = extra(args.a_extra), extra(args.b_extra)
    print(f"A: {' '.join(args.a) or 'defaults'}{' + ' + args.a_extra if more_a else ''}   "
          f"B: {' '.join(args.b) or 'defaults'}{' + ' + args.b_extra if more_b else ''}")
    print(f"{'protocol':<8} {'metric':<13} {'A':>9} {'B':>9} {'B-A':>9}  95% interval       verdict")
    for protocol in args.protocols.split(","):
        y, sa, sources, ranking = run(protocol, make_a, cache, more_a)
        _, sb, _, ranking_b = run(protocol, make_b, cache, more_b)
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
        if protocol == "modern":
            modern_lines(y, sa, sb, ranking, ranking_b, args.resamples)
        worst_lines(protocol, y, sa, sources, args.worst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
