#!/usr/bin/env python3
"""Which of today's spam does the default model miss, and which unfamiliar ham does it hold?

``protocols.py``'s ``modern`` protocol gives the totals: a model trained on what the
default model trains on (:func:`spamnb.storage.modelfile.shipped_corpora`) judges
enron-ham-dev's ham (artefacts stripped) and the 2,687 ``pot-*`` spam of modern-spam-dev
(never shipped nor trained on). This splits them by kind of message, so that a lever can
be aimed at the part that is missed:

* spam by language (the most common of six languages' function words in its text, or
  ``none``: fewer than 5 of them), by how much text it has (words of its text parts:
  0-19 is a picture, a link or an attachment with a line around it), with or without an
  attachment, with or without a link;
* ham by how much text it has, and the ``--worst N`` highest-scored ham and lowest-scored
  spam with their Subject, to read (a gold label can be wrong);
* the frontier: the share of spam caught when both cut-offs are shifted until 1, 2, 5, 10
  or 20% of the ham is not filed ham, with 95% bootstrap intervals (ham and spam
  resampled apart): the slide a prior or a cut-off buys, which a lever must beat.

``--extra INDEX`` adds messages to the training (as ``protocols.py --b-extra``: never
the ``pot-*`` part), e.g. ``corpora/recent-spam.tar.xz``; ``--set KEY=VALUE...`` trains
with other settings (as ``protocols.py --b``), e.g. ``--set style_signals=true``.

Per kind: how many, the share caught (spam) or not filed ham (ham) at the model's own
cut-offs, the share unsure, and the share caught (or not filed ham) with both cut-offs
shifted until 5% of all the ham is not filed ham (``protocols.py``'s frontier figure).

    python tools/studies/modern_misses.py --worst 10
    python tools/studies/modern_misses.py --worst 10 --extra corpora/recent-spam.tar.xz
"""

from __future__ import annotations

import argparse
import collections
import email.header
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the project: spamnb, tools

from spamnb.model import BATCH, batches  # noqa: E402
from tools.studies.protocols import (  # noqa: E402
    SPAM_CUT, Cache, caught, extra, frontier_interval, maker, modern_model, modern_test, shift_for, short)

SHARES = (0.01, 0.02, 0.05, 0.10, 0.20)  # of the ham not filed ham, for the frontier table

# Function words: frequent, short and each language's own (a tie or fewer than 5 is "none").
FUNCTION_WORDS = {
    "en": "the and you your for with this that are have from will our please",
    "de": "und der die das nicht sie ist mit ihre ihr wir auf für eine",
    "pt": "você seu sua para com não uma por mais seus dos das está",
    "nl": "het een van voor niet je uw wij zijn dat met wordt deze",
    "fr": "vous votre les des pour est une dans avec nous pas sur",
    "es": "usted su para con los las una por del está nuestro sus",
}
WORD_SETS = {lang: set(words.split()) for lang, words in FUNCTION_WORDS.items()}


def words(tokens):
    """The words of the text parts (the tokenizer's unprefixed tokens)."""
    return [t for t in tokens if ":" not in t]


def language(ws):
    counts = collections.Counter({lang: sum(w in s for w in ws) for lang, s in WORD_SETS.items()})
    (lang, n), = counts.most_common(1)
    return lang if n >= 5 else "none"


def length(ws):
    n = len(ws)
    return "0-19 words" if n < 20 else "20-99 words" if n < 100 else "100+ words"


def kinds(tokens, spam):
    """The kinds a message of these tokens is counted under: ``(group, kind)`` pairs."""
    ws = words(tokens)
    out = [("text", length(ws))]
    if spam:
        out.append(("language", language(ws)))
        attached = any(t.startswith(("content-disposition:attachment", "filename:ext:")) for t in tokens)
        out.append(("attachment", "attachment" if attached else "no attachment"))
        out.append(("link", "link" if any(t.startswith("url:") for t in tokens) else "no link"))
    return out


def subject(raw):
    m = re.search(rb"^subject:[ \t]*(.*(?:\r?\n[ \t].*)*)", raw, re.I | re.M)
    if not m:
        return "(no subject)"
    text = m.group(1).decode("latin-1")
    try:
        text = str(email.header.make_header(email.header.decode_header(text)))
    except (ValueError, LookupError):
        pass
    return " ".join(text.split())[:70]


def table(title, rows, labels, scores, delta, spam):
    """One line per kind: n, share caught or not filed ham, unsure, and at the 5% shift."""
    print(f"\n{title}")
    print(f"| {'kind':<16} | {'n':>5} | {'caught' if spam else 'not ham':>7} % | unsure % | at 5% not ham % |")
    print(f"|{'-' * 18}|{'-' * 7}|{'-' * 11}|{'-' * 10}|{'-' * 17}|")
    for kind in sorted(rows, key=lambda k: -len(rows[k])):
        idx = np.array(rows[kind])
        lab, s = labels[idx], scores[idx]
        hit = (lab == "spam") if spam else (lab != "ham")
        shifted = (s - delta > SPAM_CUT) if spam else (s - delta >= 0)
        print(f"| {kind:<16} | {idx.size:>5} | {100 * hit.mean():9.1f} | {100 * np.mean(lab == 'unsure'):8.1f} "
              f"| {100 * shifted.mean():15.1f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worst", type=int, default=10, metavar="N", help="the N worst ham and spam, to read")
    ap.add_argument("--extra", metavar="INDEX", help="messages added to the training")
    ap.add_argument("--resamples", type=int, default=200)
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="model or tokenizer settings, as protocols.py's --b (default: the defaults)")
    args = ap.parse_args()
    cache = Cache(0)
    more = extra(args.extra)
    model = modern_model(maker(args.set), cache, more)
    test = modern_test(cache)
    is_spam = np.array([label == "spam" for _, _, label in test], dtype=bool)
    # each message tokenized once: its tokens are both scored and sorted into kinds (a batch at a
    # time, as classify_many does, so only a batch's tokens are held)
    verdicts, groups = [], collections.defaultdict(lambda: collections.defaultdict(list))
    for batch in batches(test, BATCH):
        token_lists = [model.tokens(raw) for _, raw, _ in batch]
        for i, tokens in enumerate(token_lists, len(verdicts)):
            for group, kind in kinds(tokens, is_spam[i]):
                groups[("spam" if is_spam[i] else "ham", group)][kind].append(i)
        verdicts += model.classify_token_lists(token_lists)
    scores = np.array([v.score for v in verdicts])
    labels = np.array([v.label for v in verdicts])
    delta = shift_for(scores[~is_spam])
    print(f"trained on {len(cache('shipped')) + len(more)} messages; {np.sum(~is_spam)} ham, {np.sum(is_spam)} spam; "
          f"the 5% shift lowers every score by {delta:.2f} (log-odds)")
    print(f"at the cut-offs: {100 * np.mean(labels[is_spam] == 'spam'):.1f}% of the spam caught, "
          f"{100 * np.mean(labels[~is_spam] != 'ham'):.1f}% of the ham not filed ham "
          f"({100 * np.mean(labels[~is_spam] == 'spam'):.2f}% filed spam)")
    print("\n| ham not filed ham % | spam caught % | 95% interval |\n|---:|---:|---|")
    for share in SHARES:
        low, high = frontier_interval(scores[~is_spam], scores[is_spam], args.resamples, share=share)
        at = caught(scores[is_spam], shift_for(scores[~is_spam], share))
        print(f"| {100 * share:.0f} | {at:.1f} | [{low:.1f}, {high:.1f}] |")
    for (what, group), rows in sorted(groups.items(), key=lambda kv: (kv[0][0] == "ham", kv[0][1])):
        table(f"{what} by {group}", rows, labels, scores, delta, what == "spam")
    order = np.argsort(scores, kind="mergesort")
    top = order[::-1]
    print(f"\nthe {args.worst} highest-scored ham and lowest-scored spam")
    for i in [*top[~is_spam[top]][:args.worst], *order[is_spam[order]][:args.worst]]:
        print(f"{'spam' if is_spam[i] else 'ham':<4} {scores[i]:+8.2f} {labels[i]:<6} {short(test[i][0])}  "
              f"{subject(test[i][1])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
