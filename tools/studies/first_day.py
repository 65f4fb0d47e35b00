#!/usr/bin/env python3
"""The first day: what the default model does with mail it has never seen.

A new user without a model of their own gets the default model, trained on the
shipped SpamAssassin corpus (``corpora/spamassassin.tar.xz``, 5,943 messages,
2002-2005 mailing-list ham and spam). Their own mail is none of it. This script
measures how that model treats *unfamiliar* mail, and which training levers
change that without costing the familiar mail:

* unfamiliar ham: ``../shared/corpora/enron-ham-dev`` (6,383 business messages
  of 2000-2002), with the dataset's artefact headers stripped in memory
  (its README: ``X-From``, ``X-To``, ``X-cc``, ``X-bcc``, ``X-Folder``,
  ``X-Origin``, ``X-FileName``, and the ``...JavaMail.evans@thyme`` Message-IDs).
  Reported: the share filed spam / unsure / ham at the model's cut-offs.
* unfamiliar spam, for the ranking figures ((1-AUC)%, spam recall at 0.1% and
  1% of that ham filed as spam): the only spam outside the training set is
  ``trec06c-dev`` spam (3,885 messages, **Chinese**: a test of headers,
  charsets and markup much more than of words), and the 30 SpamAssassin spam
  held out of the shipped corpus (``corpora/sample-maildir``; familiar in
  kind, and so few that one message is 3.3 points of recall).
* familiar mail: the same variant's stratified K-fold cross-validation on the
  shipped corpus (``spamnb evaluate --index corpora/spamassassin.tar.xz
  --folds K``: the same library call, folds and seed), so that a lever that
  helps unfamiliar ham is seen with what it costs on the mail it learned from.

Each variant trains the model exactly as the default model is built
(:func:`spamnb.storage.modelfile.build_default_model`: a fresh ``SpamModel``,
``parallel.train`` of the shipped index), changing one setting: headers the
tokenizer skips (families that identify the corpus a message came from --
mailing-list machinery, relays, Message-ID domains, the mailbox store -- rather
than whether it is spam), the class prior, or λ. ``spamnb.evaluation.metrics``
has no bootstrap, so intervals here are this script's own percentile bootstrap
(messages resampled; ``--bootstrap 0`` turns it off), and the
differences from the default are paired (the same resampled messages).

    python tools/studies/first_day.py                         # every variant (a few minutes)
    python tools/studies/first_day.py --variants default skip:list-id,precedence prior=uniform skip=corpus+alpha=0.1
    python tools/studies/first_day.py --variants default --top 10 --explain 3 --json out/first_day.json

Exits 2 when the enron or trec06c corpus is not there (tools/shared_corpora.py).

Figures of ``python tools/studies/first_day.py --cross-mailbox`` (10 folds, seed 0): enron ham
filed spam / unsure %; (1-AUC)% and recall at 0.1% FPR against trec06c-dev spam; SA CV
(1-AUC)% and recall at 0.1% FPR (``spamnb evaluate`` prints the same CV figures)::

    default                 0.99 / 25.00   0.689 / 63.9   0.032 / 96.9
    skip=list               0.69 / 19.10   0.648 / 61.5   0.037 / 97.2
    skip=relay              1.11 / 26.96   1.359 / 59.9   0.049 / 95.3
    skip=msgid              1.00 / 24.85   0.728 / 64.8   0.033 / 96.7
    skip=store              1.03 / 26.07   0.688 / 63.7   0.031 / 96.9
    skip=corpus             0.88 / 22.50   1.412 / 55.7   0.085 / 95.3
    skip=format             0.89 / 19.29   0.598 / 65.2   0.032 / 96.9
    skip=list+format        0.64 / 13.25   0.544 / 63.8   0.038 / 97.2
    headers=fair5           0.77 / 15.84   1.720 / 51.7   0.148 / 94.0
    prior=uniform           1.68 / 38.54   0.684 / 67.0   0.031 / 97.0
    alpha=0.1               0.58 / 30.05   1.426 / 39.5   0.018 / 96.2
    alpha=1                 0.69 / 44.85   2.392 /  0.7   0.073 / 90.9
    + one enron mailbox     0.00 / 0.00-0.30 (the other mailbox; same organisation)

The SA CV differences from the default are a few messages (paired bootstrap intervals
include or touch 0) except for skip=relay, skip=corpus, fair5 and alpha=1. No header
lever brings unfamiliar ham near 5% unsure: body words carry most of the push.
"""

from __future__ import annotations

import argparse
import collections
import email.parser
import email.policy
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the project: spamnb, tools

from tools import shared_corpora  # noqa: E402
from spamnb.evaluation import evaluate as ev  # noqa: E402
from spamnb.evaluation import metrics  # noqa: E402
from spamnb.mail.sources import iter_index  # noqa: E402
from spamnb.mail.tokenizer import TokenizerConfig  # noqa: E402
from spamnb.model import SpamModel  # noqa: E402
from spamnb.scale import parallel  # noqa: E402
from spamnb.storage.modelfile import build_default_model  # noqa: E402
from spamnb.verdict import label_for  # noqa: E402

ROOT = shared_corpora.ROOT
SHIPPED = ROOT / "corpora" / "spamassassin.tar.xz"
SAMPLE = ROOT / "corpora" / "sample-maildir.index"
ENRON = shared_corpora.SHARED / "enron-ham-dev"

# -- the enron artefact headers (its README) -------------------------------------------

ENRON_ARTEFACTS = (b"x-from", b"x-to", b"x-cc", b"x-bcc", b"x-folder", b"x-origin", b"x-filename")
JAVAMAIL_ID = b"javamail.evans@thyme"
# readme+bcc is the default: the export copies Cc into a Bcc field (all 3,094 messages with
# a Cc), which no delivered message carries; a model that trains on enron ham learns it
# as "ham" (--cross-mailbox). For the SpamAssassin-trained default model it makes no
# difference (the strip table).
STRIP_MODES = ("readme+bcc", "readme", "none")


def strip_artefacts(raw: bytes, mode: str = "readme+bcc") -> bytes:
    """``raw`` without the enron export's artefact header fields (continuation lines
    included). ``readme``: the README's list and the JavaMail Message-IDs; ``readme+bcc``:
    also ``Bcc`` (the export copies Cc there: delivered mail has no Bcc); ``none``: as is."""
    if mode == "none":
        return raw
    drop = set(ENRON_ARTEFACTS) | ({b"bcc"} if mode == "readme+bcc" else set())
    end = raw.find(b"\n\n")
    head, body = (raw[:end + 1], raw[end + 1:]) if end >= 0 else (raw, b"")
    kept, keep = [], True
    for line in head.splitlines(keepends=True):
        if line[:1] in (b" ", b"\t"):  # a continuation belongs to the field above
            if keep:
                kept.append(line)
            continue
        name = line.split(b":", 1)[0].strip().lower()
        keep = name not in drop and not (name == b"message-id" and JAVAMAIL_ID in line.lower())
        if keep:
            kept.append(line)
    return b"".join(kept) + body


# -- the variants --------------------------------------------------------------------

# Header families that say which corpus (list, relay, mailbox) a message came from.
# In the shipped corpus most ham is mailing-list mail: these headers are in 55-92% of
# its ham and 8-61% of its spam (header counts of corpora/spamassassin.tar.xz).
FAMILIES = {
    "list": ("list-id", "list-unsubscribe", "list-subscribe", "list-help", "list-post",
             "list-archive", "list-owner", "x-mailman-version", "x-beenthere", "precedence",
             "errors-to", "sender", "x-mailing-list", "mailing-list", "x-list-admin",
             "x-unsubscription-info", "x-loop", "x-egroups-return", "x-yahoo-profile",
             "x-apparently-to", "mail-followup-to"),
    "relay": ("received", "delivered-to", "return-path", "x-original-to", "envelope-to",
              "x-authentication-warning"),
    "msgid": ("message-id",),
    # how the corpus's mailboxes were kept (x-keywords: 31% of its spam, 0.6% of its ham)
    "store": ("delivery-date", "x-keywords", "x-status", "status", "x-uid", "x-uidl",
              "content-length", "lines"),
}
FAMILIES["corpus"] = sum((FAMILIES[k] for k in ("list", "relay", "msgid", "store")), ())
# Not the corpus's machinery but its habits, found in the explain output of enron ham:
# a Cc of 8 or more addresses is in 130 of its spam and none of its ham (list ham has one
# recipient, the list), and the "Mime-Version" spelling is in 6.2% of its spam, 2.8% of its
# ham and every enron message. Skipping them drops the whole Cc and MIME-Version headers.
FORMAT_HEADERS = ("cc", "mime-version")
HEADER_FAMILIES = ("list", "relay", "msgid", "store")  # what family() names
FAIR_HEADERS = ("subject", "from", "to", "content-type", "content-transfer-encoding")

VARIANTS = {
    "default": {},
    "skip=list": {"skip_headers": FAMILIES["list"]},
    "skip=relay": {"skip_headers": FAMILIES["relay"]},
    "skip=msgid": {"skip_headers": FAMILIES["msgid"]},
    "skip=store": {"skip_headers": FAMILIES["store"]},
    "skip=corpus": {"skip_headers": FAMILIES["corpus"]},
    "skip=format": {"skip_headers": FORMAT_HEADERS},
    "skip=list+format": {"skip_headers": FAMILIES["list"] + FORMAT_HEADERS},
    "headers=fair5": {"only_headers": FAIR_HEADERS},
    "prior=uniform": {"prior": "uniform"},
    "alpha=0.1": {"alpha": 0.1},
    "alpha=1": {"alpha": 1.0},
}
MODEL_KEYS = ("alpha", "prior", "model_type", "features", "refine_rounds", "refine_margin")


def variant_settings(name: str) -> dict:
    """A named variant, or ``skip:h1,h2`` / ``hops=N`` / ``alpha=X`` / ``prior=P`` built on the fly,
    or several of those joined by ``+`` (``skip=corpus+alpha=0.1``)."""
    if name in VARIANTS:
        return dict(VARIANTS[name])
    out = {}
    for part in name.split("+"):
        if part in VARIANTS:
            settings = VARIANTS[part]
        elif part.startswith("skip:"):
            settings = {"skip_headers": tuple(h for h in part[5:].split(",") if h)}
        elif part.startswith("hops="):
            settings = {"received_hops": int(part[5:])}
        elif part.startswith("alpha="):
            settings = {"alpha": float(part[6:])}
        elif part.startswith("prior="):
            settings = {"prior": part[6:]}
        else:
            raise SystemExit(f"unknown variant {part!r}: one of {', '.join(VARIANTS)}, skip:H1,H2, "
                             "hops=N, alpha=X, prior=P (joined by +)")
        for key, value in settings.items():
            if key == "skip_headers":
                value = tuple(dict.fromkeys(out.get(key, ()) + tuple(value)))
            out[key] = value
    return out


def model_maker(settings: dict):
    """A function making fresh default models with ``settings`` changed (tokenizer or model)."""
    tok_changes = {k: v for k, v in settings.items() if k not in MODEL_KEYS}
    model_kwargs = {k: v for k, v in settings.items() if k in MODEL_KEYS}
    tok = TokenizerConfig.from_dict({**TokenizerConfig().to_dict(), **tok_changes})

    def make():
        return SpamModel(tokenizer=tok, **model_kwargs)

    make()  # a bad setting fails here, before any mail is read
    return make


def train_default_way(make_model, corpus):
    """Train as :func:`build_default_model` does, with a model from ``make_model``."""
    model = make_model()
    parallel.train(model, parallel.plan(index=[str(corpus)], on_error=lambda *_: None))
    return model


# -- corpora -------------------------------------------------------------------------


def read_index(path, label=None, strip=None):
    """``[(source, raw)]`` of the messages of a TREC index (only ``label``'s when given);
    ``strip``: a function applied to each raw message (in memory)."""
    out = []
    for m in iter_index(str(path), on_error=lambda *_: None):
        if label is None or m.label == label:
            out.append((m.source, strip(m.raw) if strip else m.raw))
    return out


def relative(source, folder) -> str:
    return os.path.relpath(source, folder) if os.path.isabs(source) else source


# -- scoring and metrics ---------------------------------------------------------------


class TokenCache:
    """Token lists of a test set, one tokenization per tokenizer configuration."""

    def __init__(self):
        self._cache = {}

    def tokens(self, model, name, messages):
        key = (name, model.tokenizer)
        if key not in self._cache:
            self._cache[key] = [model.tokens(raw) for _, raw in messages]
        return self._cache[key]


def score(model, token_lists):
    """``(score, P(spam), labels)`` of token lists under ``model`` (the filter's rule:
    a message with no known token is unsure)."""
    s, p, unknown = model.score_tokens(token_lists)
    labels = [label_for(pi, model.cutoffs, known=len(t) - int(u))
              for t, pi, u in zip(token_lists, p, unknown)]
    return s, p, labels


def ranking(ham_scores, spam_scores):
    """(1-AUC)%, recall % at 0.1% and 1% of this ham filed as spam."""
    y = np.r_[np.zeros(len(ham_scores), int), np.ones(len(spam_scores), int)]
    s = np.r_[ham_scores, spam_scores]
    return {"one_minus_auc_pct": metrics.one_minus_auc_pct(y, s),
            "recall_0.1": 100 * metrics.recall_at_fpr(y, s, 0.001),
            "recall_1": 100 * metrics.recall_at_fpr(y, s, 0.01)}


def bootstrap(y, s, n, seed=0, base=None):
    """95% percentile intervals of (1-AUC)% and recall at 0.1% FPR over ``n`` resamples of
    the messages (stratified: ham and spam resampled apart); with ``base`` (the default's
    scores of the same messages), also the paired interval of the differences."""
    if not n:
        return {}
    rng = np.random.default_rng(seed)
    ham, spam = np.flatnonzero(y == 0), np.flatnonzero(y == 1)
    rows = collections.defaultdict(list)
    for _ in range(n):
        idx = np.r_[rng.choice(ham, len(ham)), rng.choice(spam, len(spam))]
        yy = y[idx]
        a = (metrics.one_minus_auc_pct(yy, s[idx]), 100 * metrics.recall_at_fpr(yy, s[idx], 0.001))
        rows["auc"].append(a[0])
        rows["r01"].append(a[1])
        if base is not None:
            b = (metrics.one_minus_auc_pct(yy, base[idx]), 100 * metrics.recall_at_fpr(yy, base[idx], 0.001))
            rows["d_auc"].append(a[0] - b[0])
            rows["d_r01"].append(a[1] - b[1])
    return {k: [float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))] for k, v in rows.items()}


def mailbox_rows(messages, folder):
    """Row numbers of each enron mailbox (``ham/farmer-d/...`` -> ``farmer-d``)."""
    rows = collections.defaultdict(list)
    for i, (source, _) in enumerate(messages):
        parts = relative(source, folder).split(os.sep)
        rows[parts[1] if len(parts) > 2 else "?"].append(i)
    return dict(rows)


def filed(labels):
    c = collections.Counter(labels)
    n = len(labels)
    return {k: c[k] for k in ("spam", "unsure", "ham")} | {"n": n}


def cross_validation(make_model, corpus, folds, jobs):
    """``spamnb evaluate --index CORPUS --folds K`` of this variant: the pooled scores and metrics."""
    plan = parallel.plan(index=[str(corpus)], on_error=lambda *_: None)
    result = ev.cross_validate(make_model, plan, k=folds, seed=0, runner=parallel.Runner(jobs=jobs))
    cut = make_model().cutoffs
    summary = metrics.summary(result.y, result.score, result.proba, (cut.ham_cutoff, cut.spam_cutoff),
                              known=result.known)
    return result, summary


# -- evidence ------------------------------------------------------------------------


def family(token: str) -> str:
    """The family of a token, for the explain tables."""
    if ":" not in token:
        return "body word"
    head, _, rest = token.partition(":")
    if head == "header":
        name = rest.lower()
        for fam in HEADER_FAMILIES:
            if name in FAMILIES[fam]:
                return f"{fam} header present"
        return f"header present ({rest})"
    for fam in HEADER_FAMILIES:
        if head in FAMILIES[fam]:
            return f"{fam} header words"
    if head in ("to", "cc", "bcc", "from", "reply-to"):
        kind = rest.split(":", 1)[0]
        return f"{head}:{kind}" if kind in ("count", "name", "addr", "domain") else head
    if head in ("skip", "url", "email", "img", "html", "bi"):
        return "body " + head
    return head


def evidence_by_family(model, token_lists, rows):
    """Mean contribution (log-odds) of each token family over the messages ``rows``."""
    _, weights = model.linear_weights()
    X, _ = model._rows([token_lists[i] for i in rows], grow=False)
    coo = X.tocoo()
    names = model.vocabulary.tokens
    names = list(names() if callable(names) else names)
    total = collections.Counter()
    for j, v in zip(coo.col, coo.data * weights[coo.col]):
        total[family(names[j])] += float(v)
    return {k: v / max(len(rows), 1) for k, v in total.items()}


def subject_of(raw: bytes) -> str:
    msg = email.parser.BytesHeaderParser(policy=email.policy.default).parsebytes(raw)
    return " ".join(str(msg.get("subject", "")).split())[:60]


# -- one variant -----------------------------------------------------------------------


def measure(name, args, tests, cache):
    """Train the variant, score the test sets, cross-validate it."""
    settings = variant_settings(name)
    make = model_maker(settings)
    t0 = time.perf_counter()
    model = build_default_model() if not settings and args.corpus == SHIPPED else train_default_way(make, args.corpus)
    out = {"variant": name, "settings": {k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()},
           "train_seconds": time.perf_counter() - t0}
    scored = {}
    for key, messages in tests.items():
        scored[key] = score(model, cache.tokens(model, key, messages))
    hs = scored["enron"][0]
    out["enron_ham"] = filed(scored["enron"][2])
    out["enron_by_mailbox"] = {box: filed([scored["enron"][2][i] for i in rows])
                               for box, rows in args.mailboxes.items()}
    for key in ("trec_spam", "sample_spam"):
        if key in scored:
            ss = scored[key][0]
            out[key] = ranking(hs, ss) | {"caught": filed(scored[key][2])}
            y = np.r_[np.zeros(len(hs), int), np.ones(len(ss), int)]
            out[key]["ci"] = bootstrap(y, np.r_[hs, ss], args.bootstrap if key == "trec_spam" else 0,
                                       base=args.base.get(key) if name != "default" else None)
            if name == "default":
                args.base[key] = np.r_[hs, ss]
    if args.folds:
        t0 = time.perf_counter()
        result, summ = cross_validation(make, args.corpus, args.folds, args.jobs)
        out["cv"] = {k: summ[k] for k in ("n_ham", "n_spam", "one_minus_auc_pct", "n_ham_spam", "n_ham_unsure",
                                          "n_spam_spam", "n_spam_unsure", "n_spam_ham")}
        out["cv"]["recall_0.1"] = summ["recall_at_fpr"]["0.001"]
        out["cv"]["recall_1"] = summ["recall_at_fpr"]["0.01"]
        out["cv"]["ci"] = bootstrap(result.y, result.score, args.bootstrap,
                                    base=args.base.get("cv") if name != "default" else None)
        if name == "default":
            args.base["cv"] = result.score
        out["cv_seconds"] = time.perf_counter() - t0
    return model, scored, out


def cv_with_extra(shipped, extra, k):
    """K-fold CV of the shipped corpus (the folds of ``spamnb evaluate``: stratified, seed 0)
    with ``extra`` messages in every training fold; metrics on the shipped messages only.
    The extra messages form a fold of their own (-1), whose scores are dropped."""
    from spamnb.evaluation.folds import stratified_kfold

    y = np.asarray([1 if label == "spam" else 0 for _, _, label in shipped])
    folds = np.r_[stratified_kfold(y, k, 0), -np.ones(len(extra), int)]
    result = ev.cross_validate(SpamModel, shipped + extra, folds=folds)
    keep = folds >= 0
    cut = SpamModel().cutoffs
    summ = metrics.summary(result.y[keep], result.score[keep], result.proba[keep],
                           (cut.ham_cutoff, cut.spam_cutoff), known=result.known[keep])
    out = {k: summ[k] for k in ("one_minus_auc_pct", "n_ham_spam", "n_ham_unsure", "n_spam_spam",
                                "n_spam_unsure", "n_spam_ham")}
    out["recall_0.1"] = summ["recall_at_fpr"]["0.001"]
    out["recall_1"] = summ["recall_at_fpr"]["0.01"]
    return out


def cross_mailbox(args, tests, cache):
    """The lever "train on more varied mail", in the small: the default model's training
    corpus plus one enron mailbox's ham (artefacts stripped), tested on the other mailbox's
    ham and the same spam. Not a shippable corpus as it is (its own licence, no spam):
    a measure of what varied ham in the training set buys -- an upper bound, as both
    mailboxes are one organisation's mail (its domain, mail system, date format); the
    figure with every token naming it dropped from the tested mail shows part of that."""
    shipped = [(m.source, m.raw, m.label) for m in iter_index(str(args.corpus), on_error=lambda *_: None)]
    out = {}
    print("\n== extra: more varied training ham (shipped corpus + one enron mailbox; the other mailbox tested)")
    for box, rows in args.mailboxes.items():
        others = [i for other, r in args.mailboxes.items() if other != box for i in r]
        extra = [(tests["enron"][i][0], tests["enron"][i][1], "ham") for i in others]
        model = SpamModel()
        parallel.train(model, shipped + extra)
        test = [tests["enron"][i] for i in rows]
        toks = [model.tokens(raw) for _, raw in test]
        lab = score(model, toks)
        e = filed(lab[2])
        # the same organisation: how much of that is its name (enron.com addresses, "enron")?
        blind = filed(score(model, [[t for t in tk if "enron" not in t] for tk in toks])[2])
        res = {"trained_extra_ham": len(extra), "tested": box, "enron_ham": e, "enron_ham_name_blind": blind}
        line = (f"   + {len(extra)} ham of the other mailbox, tested on {box} ({e['n']}): spam {e['spam']} "
                f"({pct(e['spam'], e['n']):.2f}%), unsure {e['unsure']} ({pct(e['unsure'], e['n']):.2f}%) "
                f"[tokens naming enron dropped from the tested mail: spam {blind['spam']}, unsure {blind['unsure']}]")
        for key in ("trec_spam", "sample_spam"):
            if key in tests:
                ss = score(model, cache.tokens(model, key, tests[key]))
                res[key] = ranking(lab[0], ss[0]) | {"caught": filed(ss[2])}
                line += (f"; vs {key}: (1-AUC)% {res[key]['one_minus_auc_pct']:.3f}, "
                         f"R@0.1% {res[key]['recall_0.1']:.1f}, caught {res[key]['caught']['spam']}")
        if args.folds:
            res["cv"] = cv_with_extra(shipped, extra, args.folds)
            c = res["cv"]
            line += (f"\n     SA {args.folds}-fold CV, the extra ham in every training fold: (1-AUC)% "
                     f"{c['one_minus_auc_pct']:.4f}, R@0.1% {c['recall_0.1']:.2f}, R@1% {c['recall_1']:.2f}; "
                     f"ham {c['n_ham_spam']} spam + {c['n_ham_unsure']} unsure; spam {c['n_spam_ham']} ham + "
                     f"{c['n_spam_unsure']} unsure")
        print(line, flush=True)
        out[box] = res
    return out


# -- printing ------------------------------------------------------------------------


def pct(part, whole):
    return 100.0 * part / whole if whole else float("nan")


def ci_text(ci, key, fmt):
    if key not in ci:
        return ""
    lo, hi = ci[key]
    return f" [{lo:{fmt}}, {hi:{fmt}}]"


def print_variant(r):
    e = r["enron_ham"]
    print(f"\n== {r['variant']}  {json.dumps(r['settings']) if r['settings'] else '(the default model)'}")
    print(f"   enron ham ({e['n']}, artefact headers stripped): spam {e['spam']} ({pct(e['spam'], e['n']):.2f}%), "
          f"unsure {e['unsure']} ({pct(e['unsure'], e['n']):.2f}%), ham {e['ham']} ({pct(e['ham'], e['n']):.2f}%)")
    print("   by mailbox: " + "; ".join(
        f"{box} ({x['n']}): spam {pct(x['spam'], x['n']):.2f}%, unsure {pct(x['unsure'], x['n']):.2f}%"
        for box, x in r["enron_by_mailbox"].items()))
    print(f"   {'against':<34} {'(1-AUC)%':>22} {'R@0.1%FPR':>24} {'R@1%FPR':>8} {'spam caught':>12}")
    for key, what in (("trec_spam", "trec06c-dev spam (Chinese)"), ("sample_spam", "SA held-out spam (30)"),
                      ("cv", None)):
        if key not in r:
            continue
        x = r[key]
        ci = x.get("ci", {})
        if key == "cv":
            what = f"SA {r['cv_folds']}-fold CV (own ham)"
            caught = f"{x['n_spam_spam']}/{x['n_spam']}"
        else:
            caught = f"{x['caught']['spam']}/{x['caught']['n']}"
        print(f"   {what:<34} {x['one_minus_auc_pct']:>8.3f}{ci_text(ci, 'auc', '.3f'):<14}"
              f" {x['recall_0.1']:>7.2f}{ci_text(ci, 'r01', '.1f'):<17} {x['recall_1']:>7.2f} {caught:>12}")
        if "d_auc" in ci:
            print(f"   {'':<34} vs default, paired: Δ(1-AUC)%{ci_text(ci, 'd_auc', '+.3f')}"
                  f"  ΔR@0.1%{ci_text(ci, 'd_r01', '+.1f')}")
    if "cv" in r:
        c = r["cv"]
        print(f"   SA CV at the cut-offs: ham {c['n_ham_spam']} spam + {c['n_ham_unsure']} unsure of {c['n_ham']}; "
              f"spam {c['n_spam_ham']} ham + {c['n_spam_unsure']} unsure of {c['n_spam']}")


def print_summary(results):
    print("\n== summary (enron: % of 6,383 ham, U%: unsure % per mailbox; trec: vs 3,885 Chinese spam; "
          "SA30: the 30 held-out SpamAssassin spam; CV: the shipped corpus, FP+U: its ham filed spam or unsure)")
    boxes = list(results[0]["enron_by_mailbox"])
    w = max(24, *(len(r["variant"]) for r in results))
    head = (f"{'variant':<{w}} {'enron spam%':>11} {'unsure%':>8} {'ham%':>7} "
            + "".join(f"{'U% ' + b[:8]:>12}" for b in boxes) + f" | {'trec 1-AUC':>10} "
            f"{'R@0.1':>6} {'R@1':>6} | {'SA30 R@1':>8} | {'CV 1-AUC':>8} {'CV R@0.1':>8} {'CV FP+U':>7}")
    print(head)
    for r in results:
        e = r["enron_ham"]
        t = r.get("trec_spam", {})
        s = r.get("sample_spam", {})
        c = r.get("cv", {})
        print(f"{r['variant']:<{w}} {pct(e['spam'], e['n']):>11.2f} {pct(e['unsure'], e['n']):>8.2f} "
              f"{pct(e['ham'], e['n']):>7.2f} "
              + "".join(f"{pct(r['enron_by_mailbox'][b]['unsure'], r['enron_by_mailbox'][b]['n']):>12.2f}"
                        for b in boxes)
              + f" | {t.get('one_minus_auc_pct', float('nan')):>10.3f} "
              f"{t.get('recall_0.1', float('nan')):>6.1f} {t.get('recall_1', float('nan')):>6.1f} | "
              f"{s.get('recall_1', float('nan')):>8.1f} | {c.get('one_minus_auc_pct', float('nan')):>8.4f} "
              f"{c.get('recall_0.1', float('nan')):>8.2f} "
              f"{(c.get('n_ham_spam', 0) + c.get('n_ham_unsure', 0)) if c else float('nan'):>7}")


def print_top_hams(model, enron, scored, n_top, n_explain, folder):
    """The highest-scoring enron ham, and the strongest tokens of the first few."""
    s, p, labels = scored
    order = np.argsort(-s, kind="stable")[:n_top]
    print(f"\n== the {n_top} highest-scoring enron ham (default model)")
    print(f"   {'P(spam)':>9} {'score':>7} {'filed':<7} file (subject)")
    for i in order:
        source, raw = enron[i]
        print(f"   {p[i]:>9.5f} {s[i]:>7.2f} {labels[i]:<7} {relative(source, folder)} ({subject_of(raw)})")
    for i in order[:n_explain]:
        source, raw = enron[i]
        ev_ = model.explain(raw, 10)
        print(f"\n   {relative(source, folder)}: score {ev_.score:.2f} = prior/bias {ev_.prior:.2f} + tokens; "
              "the 10 strongest:")
        for token, times, contrib in ev_.tokens:
            print(f"     {contrib:>+7.3f}  {token[:50]:<50} ({family(token)})")
        fam = collections.Counter()
        for token, _, contrib in ev_.tokens:
            fam[family(token)] += contrib
        print("     by family: " + ", ".join(f"{k} {v:+.2f}" for k, v in fam.most_common()))


def print_families(model, token_lists, scored, top=14):
    """Which token families push unfamiliar ham towards spam: mean contribution per message."""
    s, p, labels = scored
    rows = [i for i, lab in enumerate(labels) if lab != "ham"]
    allrows = list(range(len(labels)))
    fam_bad = evidence_by_family(model, token_lists, rows)
    fam_all = evidence_by_family(model, token_lists, allrows)
    print(f"\n== token families in enron ham, mean log-odds per message (default model; "
          f"positive = towards spam)")
    print(f"   {'family':<44} {'filed unsure/spam (' + str(len(rows)) + ')':>26} {'all (' + str(len(allrows)) + ')':>12}")
    keys = sorted(set(fam_bad) | set(fam_all), key=lambda k: -abs(fam_bad.get(k, 0)))[:top]
    for k in keys:
        print(f"   {k[:44]:<44} {fam_bad.get(k, 0):>+26.3f} {fam_all.get(k, 0):>+12.3f}")
    return {"unsure_or_spam": fam_bad, "all": fam_all}


def strip_sensitivity(model, enron_raw):
    """The default model's enron figures with each way of stripping the artefact headers."""
    print("\n== enron ham under the default model, by what is stripped")
    out = {}
    for mode in STRIP_MODES:
        toks = [model.tokens(strip_artefacts(raw, mode)) for _, raw in enron_raw]
        e = filed(score(model, toks)[2])
        out[mode] = e
        print(f"   strip {mode:<11} spam {e['spam']:>4} ({pct(e['spam'], e['n']):.2f}%)  "
              f"unsure {e['unsure']:>5} ({pct(e['unsure'], e['n']):.2f}%)  ham {e['ham']:>5} "
              f"({pct(e['ham'], e['n']):.2f}%)")
    return out


# -- main --------------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), metavar="VARIANT",
                    help="variants, the first one explained (default: every named one): " + ", ".join(VARIANTS)
                    + "; or skip:H1,H2, hops=N, alpha=X, prior=P, several joined by +")
    ap.add_argument("--corpus", type=os.path.abspath, default=str(SHIPPED),
                    help="training corpus (TREC index or archive; default: the shipped one)")
    ap.add_argument("--enron", default=str(ENRON), help="enron-ham-dev folder or index")
    ap.add_argument("--trec", default=str(shared_corpora.TREC06C), help="trec06c-dev folder or index")
    ap.add_argument("--strip", choices=STRIP_MODES, default="readme+bcc",
                    help="enron headers stripped: the README's artefacts (readme), also Bcc (the default), "
                    "or none")
    ap.add_argument("--folds", type=int, default=10, help="cross-validation folds on the corpus (0: none)")
    ap.add_argument("--jobs", type=int, default=1, help="processes tokenizing for the cross-validation")
    ap.add_argument("--bootstrap", type=int, default=300, help="bootstrap resamples (0: no intervals)")
    ap.add_argument("--top", type=int, default=10, help="highest-scoring enron ham to name")
    ap.add_argument("--explain", type=int, default=3, help="of those, how many to explain")
    ap.add_argument("--cross-mailbox", action="store_true",
                    help="also: the default settings trained with one enron mailbox's ham added, "
                    "tested on the other's (the 'more varied training mail' lever)")
    ap.add_argument("--json", help="also write every figure here")
    args = ap.parse_args(argv)
    args.corpus = os.path.abspath(args.corpus)
    args.corpus = SHIPPED if args.corpus == str(SHIPPED) else args.corpus
    args.base = {}
    names = args.variants
    for name in names:
        variant_settings(name)  # fail on a typo before the long run

    enron_index = shared_corpora.find(args.enron, option="--enron")
    if enron_index is None:
        return shared_corpora.EXIT_ABSENT
    trec_index = shared_corpora.find(args.trec, chinese=True, option="--trec")
    if trec_index is None:
        return shared_corpora.EXIT_ABSENT
    enron_folder = os.path.dirname(enron_index)
    enron_raw = read_index(enron_index, "ham")
    tests = {
        "enron": [(src, strip_artefacts(raw, args.strip)) for src, raw in enron_raw],
        "trec_spam": read_index(trec_index, "spam"),
    }
    if SAMPLE.exists() and args.corpus == SHIPPED:
        tests["sample_spam"] = read_index(SAMPLE, "spam")
    print(f"corpus {args.corpus}; enron ham {len(tests['enron'])} (strip: {args.strip}); "
          f"trec06c-dev spam {len(tests['trec_spam'])} (Chinese); "
          f"SA held-out spam {len(tests.get('sample_spam', []))}; CV {args.folds or 'none'}-fold, seed 0; "
          f"bootstrap {args.bootstrap}")

    args.mailboxes = mailbox_rows(tests["enron"], enron_folder)
    cache = TokenCache()
    results, report = [], {}
    for name in names:
        t0 = time.perf_counter()
        model, scored, r = measure(name, args, tests, cache)
        r["cv_folds"] = args.folds
        r["seconds"] = time.perf_counter() - t0
        results.append(r)
        print_variant(r)
        print(f"   ({r['seconds']:.0f} s)", flush=True)
        if name == names[0]:
            enron_tokens = cache.tokens(model, "enron", tests["enron"])
            print_top_hams(model, tests["enron"], scored["enron"], args.top, args.explain, enron_folder)
            report["families"] = print_families(model, enron_tokens, scored["enron"])
            report["strip"] = strip_sensitivity(model, enron_raw)
            s = scored["enron"][0]
            report["top_hams"] = [relative(tests["enron"][i][0], enron_folder)
                                  for i in np.argsort(-s, kind="stable")[:args.top]]
    if args.cross_mailbox:
        report["cross_mailbox"] = cross_mailbox(args, tests, cache)
    print_summary(results)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"variants": results, **report}, f, indent=1, default=float)
    return 0


if __name__ == "__main__":
    sys.exit(main())
