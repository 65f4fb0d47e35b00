#!/usr/bin/env python3
"""After the first day: how many of their own messages the default model needs.

The default model leaves a fifth of unfamiliar business ham unsure
(``first_day_frontier.py``). A user sorts those into ham (``spamnb learn --ham``,
an IMAP move back, ``filter -u``'s corrections) or trains on the mail they
already have (``spamnb train``); either way the model learns their mail. This
script measures how fast that pays: per enron-ham-dev mailbox (two owners,
artefact headers stripped), the model trained on the whole SpamAssassin corpus
as the default model is learns the owner's first N messages by date as ham
(``SpamModel.learn``, as ``spamnb learn`` adds them: no training on errors),
then judges the owner's later mail (every message after the first
``max(N)``, the same for every N) and the *other* owner's mail. Reported: the
share not filed ham (unsure / spam), and what learning a user's ham costs on
spam the model never saw: trec06c-dev's Chinese spam as it is, and the same
spam **readdressed to the owner** (both: the half never learned) (its To: replaced by the owner's address,
the one most often in the mailbox's To: and Cc:). The readdressed spam is
the test that matters: much of what a few learned messages teach is the
owner's own address and domain (``to:domain:enron.com``), which every spam
sent to them carries as well, and that costs nothing only once their spam is
learned too: ``--spam K`` has the model also learn K of that readdressed
spam (from one half of it; the other half is the one judged, for every row).

    python tools/studies/first_week.py
    python tools/studies/first_week.py --learn 0,10,30,100 --spam 0,10

Exits 2 when a corpus is not there (tools/shared_corpora.py).
"""

from __future__ import annotations

import argparse
import collections
import email
import email.utils
import itertools
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the project: spamnb, tools

from tools.studies import protocols  # noqa: E402
from tools.studies.first_day import strip_artefacts  # noqa: E402
from spamnb.model import SpamModel  # noqa: E402
from spamnb.scale import parallel  # noqa: E402

MAILBOXES = ("farmer-d", "williams-w3")


def sent_at(raw: bytes) -> float:
    """The message's Date as a POSIX time; +inf when it has none that parses (sorted last)."""
    head = raw.split(b"\n\n", 1)[0].decode("latin-1")
    for line in head.splitlines():
        if line.lower().startswith("date:"):
            try:
                return email.utils.parsedate_to_datetime(line[5:].strip()).timestamp()
            except (TypeError, ValueError, IndexError, OverflowError):
                break
    return math.inf


def by_date(messages):
    return sorted(messages, key=lambda m: (sent_at(m[1]), m[0]))


def owner_address(messages) -> str:
    """The address most often in the mailbox's To: and Cc: fields."""
    seen = collections.Counter()
    for _, raw, _ in messages:
        fields = email.message_from_bytes(raw.split(b"\n\n", 1)[0] + b"\n\n")
        for _, addr in email.utils.getaddresses(fields.get_all("to", []) + fields.get_all("cc", [])):
            if "@" in addr:
                seen[addr.lower()] += 1
    return seen.most_common(1)[0][0]


def readdressed(raw: bytes, addr: str) -> bytes:
    """``raw`` with its To: field (continuation lines too) replaced by ``To: addr``."""
    head, sep, body = raw.partition(b"\n\n")
    lines, skipping = [], False
    for line in head.split(b"\n"):
        if skipping and line[:1] in (b" ", b"\t"):
            continue
        skipping = line[:3].lower() == b"to:"
        if not skipping:
            lines.append(line)
    lines.append(b"To: " + addr.encode())
    return b"\n".join(lines) + sep + body


def shares(model, token_lists):
    """``(ham %, unsure %, spam %)`` of messages (their tokens) as the model files them."""
    labels = collections.Counter(c.label for c in model.classify_token_lists(token_lists))
    return tuple(100 * labels[label] / len(token_lists) for label in ("ham", "unsure", "spam"))


def numbers(text, option):
    """Sorted distinct counts from ``1,10,100``; one line and exit on anything else."""
    try:
        counts = sorted({int(n) for n in text.split(",")})
    except ValueError:
        raise SystemExit(f"{option} takes whole numbers separated by commas, not {text!r}") from None
    if counts[0] < 0:
        raise SystemExit(f"{option} counts are 0 or more")
    return counts


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--learn", default="0,10,30,100,300,1000",
                    help="how many of the owner's first messages to learn, comma-separated")
    ap.add_argument("--spam", default="0,10",
                    help="how many spam readdressed to the owner to learn besides, comma-separated")
    args = ap.parse_args()
    counts, spam_counts = numbers(args.learn, "--learn"), numbers(args.spam, "--spam")
    cache = protocols.Cache(0)
    enron = cache("enron-ham-dev", strip_artefacts)
    trec_spam = [raw for _, raw, label in cache("trec06c-dev") if label == "spam"]
    base = SpamModel()
    parallel.train(base, cache("spamassassin"))
    state = base.to_state()
    mail = {box: by_date([m for m in enron if f"/{box}/" in m[0]]) for box in MAILBOXES}
    print("default-model training (the whole SpamAssassin corpus), then the owner's first N messages learned as ham")
    print(f"{'owner':<12} {'N':>5} {'spam':>5}   {'own later mail not ham (unsure/spam)':>38}   "
          f"{'other owner not ham':>22}   {'trec spam caught':>16}   {'readdressed: caught / to inbox':>30}")

    def tokens(raws):  # once per set: every model here has the default model's tokenizer
        return [base.tokens(raw) for raw in raws]

    trec_test = tokens(trec_spam[1::2])
    for box, other in (MAILBOXES, MAILBOXES[::-1]):
        later = tokens(raw for _, raw, _ in mail[box][counts[-1]:])
        others = tokens(raw for _, raw, _ in mail[other])
        if not later:
            raise SystemExit(f"{box} has {len(mail[box])} messages: none left after learning {counts[-1]}")
        addr = owner_address(mail[box])
        to_owner = [readdressed(raw, addr) for raw in trec_spam]
        spam_pool, spam_test = to_owner[0::2], tokens(to_owner[1::2])
        if spam_counts[-1] > len(spam_pool):
            raise SystemExit(f"--spam: at most {len(spam_pool)} (half of trec06c-dev's spam)")
        print(f"{box}: {len(mail[box])} messages, owner {addr}")
        for n, k in itertools.product(counts, spam_counts):
            model = SpamModel.from_state(state)
            learned = [(raw, "ham") for _, raw, _ in mail[box][:n]] + [(raw, "spam") for raw in spam_pool[:k]]
            if learned:
                model.learn(learned)
            _, u, s = shares(model, later)
            _, ou, os_ = shares(model, others)
            caught = shares(model, trec_test)[2]
            inbox, _, rs = shares(model, spam_test)
            print(f"{box:<12} {n:>5} {k:>5}   {u + s:>21.1f}% ({u:.1f}/{s:.2f}) of {len(later):<5}"
                  f"   {ou + os_:>14.1f}% ({ou:.1f}/{os_:.2f})   {caught:>15.1f}%"
                  f"   {rs:>20.1f}% / {inbox:>5.1f}%", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
