#!/usr/bin/env python3
"""The filter a user lives with: its own verdicts learned, and the user's corrections.

``learning_curve.py`` learns gold labels, which no filter has: ``spamnb filter -u``
learns each message as what it classified it (not unsure ones), and the user then
moves what it misfiled (``spamnb learn --spam/--ham``: a message the filter learned
under the other class is moved there) and sorts the unsure mail. This runs that
loop over shuffled orders of a corpus, message by message:

1. classify the message (its score, before any learning, is what the ranking
   figures use, as in TREC's protocol);
2. the filter's own learning, one rule of:

   * ``self-all``: learn the verdict unless unsure (today's ``filter -u``);
   * ``self-margin:M``: learn the verdict only when not unsure and its score is
     within M log-odds of the cut-off bounding that verdict (the ham cut-off for
     a ham, the spam cut-off for a spam): a thick threshold on self-labels;
   * ``self-spam-margin:M``: as ``self-margin:M``, spam verdicts only;
   * ``self-none``: learn nothing;

3. the user, ``--delay`` messages later (0: at once): a misfiled message (FP or
   FN) is learned under its gold label (moved, when the filter learned it), and
   an unsure one is learned under its gold label (sorted). These are the user's
   actions, the burden reported beside the errors.

Learning and moving go through :meth:`SpamModel.learn` and its registry, as
``filter -u`` and ``spamnb learn`` do. Windows, figures and corpus reading are
``learning_curve.py``'s. With corrections at once, ``self-all`` learns every
message under its gold label (the ``all`` regime), ``self-none`` the misfiled and
unsure ones (``errors``): the rules differ only in what they learn of the
messages they filed right, and a delay shows what a wrong self-label costs
while it stands.

The filter starts empty (``--start empty``), as a user who trains from nothing,
or from a trained model: ``--start shipped`` is the default model a new user gets
(the shipped corpus, as ``spamnb`` builds it), ``--start older-sa`` a model of the
2002 SpamAssassin mail (easy_ham, hard_ham, spam), for which the later
``spam_2`` is unfamiliar spam. ``--only REGEX`` keeps the messages whose source
matches (one enron owner, say), and ``--readdress`` gives every spam of the
stream the To: of the stream's own ham owner (the address most often in its
ham's To: and Cc:), as spam sent to that user would carry it. The first weeks
of a new user who gets business mail::

    python tools/studies/living_filter.py --start older-sa --readdress \\
        --corpus ../shared/corpora/enron-ham-dev --corpus ../shared/corpora/spamassassin \\
        --only '/farmer-d/|/spam_2\\.' --limit 3000

``--start setup`` is the first day after ``spamnb setup``: setup's own
code (:mod:`spamnb.delivery.setup`'s ``propose``, screened by the default model,
and ``train``) learns an INBOX of the owner's ``--setup-ham`` earliest ham
(enron-ham-dev, one ``--owner``) and a ``.Junk`` of the ``--setup-spam`` earliest
spam (modern-spam-dev, read here and never saved, nor any model of it); then the
owner's later ham and the later spam, each by date (or ``--order shuffled``),
interleaved at random by each seed, run as above for ``--limit`` 1,000 messages
with ``filter -u``'s rule. Both classes keep only the header fields
modern-spam-dev's README names (:data:`README_FIELDS`; To: too with
``--readdress``), with LF line ends, and the honeypot's address becomes the
owner's. It prints per window the ham unsure or spam, the spam caught and the
spam in the inbox (the mean over the orders, the lowest and highest), the
messages after the first 100 pooled with exact intervals, and whether issue
32's target holds (``--check``: exit 1 when not)::

    python tools/studies/living_filter.py --start setup --seed 0 --seed 1 --seed 2 --seed 3 --seed 4

Usage::

    python tools/studies/living_filter.py                                   # SpamAssassin, orders 0-2
    python tools/studies/living_filter.py --corpus ../shared/corpora/trec06c-dev
    python tools/studies/living_filter.py --corpus ../shared/corpora/{spamassassin,trec06c-dev,enron-ham-dev} \\
        --seed 1 --limit 6000                                         # the longest stream, one order
"""

from __future__ import annotations

import argparse
import os
import random
import re
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the project: spamnb, tools

from tools import shared_corpora  # noqa: E402
from tools.studies.first_week import MAILBOXES, by_date, owner_address, readdressed, sent_at  # noqa: E402
from tools.studies.learning_curve import load, shuffled, table_head, table_row, windows  # noqa: E402
from tools.studies.protocols import age_split, fair_headers  # noqa: E402
from spamnb.delivery import setup as first_hour  # noqa: E402
from spamnb.evaluation.metrics import proportion_interval  # noqa: E402
from spamnb.scale import parallel  # noqa: E402
from spamnb.storage.modelfile import default_seed  # noqa: E402
from spamnb.evaluation.evaluate import Scores  # noqa: E402
from spamnb.model import SpamModel, label_id  # noqa: E402
from spamnb.verdict import LABELS, LEARN_MARGIN, evidence, learns_verdict  # noqa: E402

RULES = ("self-all", "self-none", "self-margin:5")
STARTS = ("empty", "shipped", "older-sa", "setup")
FILTER_U = f"self-margin:{LEARN_MARGIN:g}"  # the rule `filter -u` learns by


def starting_model(start):
    """A factory of fresh copies of the model the filter starts from."""
    if start == "empty":
        return SpamModel
    if start == "shipped":
        base = default_seed()  # the default model a new user gets (cached once built)
    else:
        base = SpamModel()
        parallel.train(base, age_split(load(str(shared_corpora.SPAMASSASSIN)))[0])
    state = base.to_state()
    return lambda: SpamModel.from_state(state)


def with_owner(messages):
    """The messages with every spam readdressed to the ham's owner (see the module doc)."""
    ham = [m for m in messages if m[2] == "ham"]
    if not ham:
        raise SystemExit("--readdress: the stream has no ham, hence no owner")
    addr = owner_address(ham)
    print(f"spam readdressed to {addr}")
    return [(src, readdressed(raw, addr), label) if label == "spam" else (src, raw, label)
            for src, raw, label in messages]


def self_learns(rule, label, score, cutoffs):
    """Whether the filter learns its own verdict ``label`` (score in log-odds) under ``rule``:
    ``filter -u``'s own rule (:func:`spamnb.verdict.learns_verdict`) with that margin;
    ``self-spam-margin:M`` learns only its spam verdicts (a ham verdict that is a spam
    in the inbox teaches nothing while the user has not moved it)."""
    if rule == "self-none" or (rule.startswith("self-spam-") and label == "ham"):
        return False
    return learns_verdict(label, score, cutoffs, None if rule == "self-all" else float(rule.partition(":")[2]))


def living(messages, rule, delay=0, make=SpamModel):
    """``(scores, labels, counts)`` of the living filter over ``messages`` in order;
    counts: messages the filter learned itself, user actions, moves among them."""
    model = make()
    cut = tuple(model.cutoffs)
    last = [None, None]

    def tokens(raw, _tokens=model.tokens):  # learn() tokenizes again: reuse this message's tokens
        if last[0] is not raw:
            last[:] = raw, _tokens(raw)
        return last[1]

    model.tokens = tokens
    pending = []  # (due index, raw, gold label): the user's corrections not made yet
    n = {"self-learned": 0, "actions": 0, "moves": 0}
    sources, ys, ss, ps, ks, labels = [], [], [], [], [], []

    def correct_until(i):
        while pending and pending[0][0] <= i:
            _, raw, gold = pending.pop(0)
            n["moves"] += model.learn([(raw, gold)])["moved"]

    for i, (source, raw, gold) in enumerate(messages):
        correct_until(i)
        c = model.classify_tokens(tokens(raw))
        label, k = c.label, evidence(c.n_tokens - c.n_unknown, model.messages)  # before any learning
        if self_learns(rule, label, c.score, cut):
            model.learn([(raw, label)])
            n["self-learned"] += 1
        if label != gold:  # misfiled or unsure: the user moves or sorts it
            n["actions"] += 1
            pending.append((i + delay, raw, gold))
        correct_until(i)
        sources.append(source)
        ys.append(label_id(gold))
        ss.append(c.score)
        ps.append(c.spam_probability)
        ks.append(k)
        labels.append(label)
    scores = Scores(sources, np.asarray(ys), np.asarray(ss), np.asarray(ps), known=np.asarray(ks))
    return scores, labels, n


# -- the first day after `spamnb setup` (--start setup) ---------------------------------------

#: modern-spam-dev's README: its honeypot's relay, filtering and recipient fields tell the
#: classes apart; a stream that learns its spam keeps these fields only, of both classes.
README_FIELDS = (b"subject", b"from", b"content-type", b"content-transfer-encoding")
FIRST_DAY_WINDOWS = [(0, 100), (100, 300), (300, 600), (600, 1000)]
#: The first-day target after the first 100 messages: at most 1% of ham unsure or spam,
#: at least 95% of spam caught (filed spam).
TARGET_AFTER, TARGET_HAM_PCT, TARGET_CAUGHT_PCT = 100, 1.0, 95.0


def as_delivered(raw, keep=README_FIELDS):
    """The message as the study shows it, both classes alike: LF line ends, as a local
    delivery stores mail (2,425 of modern-spam-dev's messages have CRLF, enron's none),
    and only the header fields ``keep``."""
    return fair_headers(raw.replace(b"\r\n", b"\n"), keep)


#: The honeypot's own address, which it put where the recipient's was: in From: (spam
#: "from" the recipient) and in bodies ("Dear phishing@pot"), 1,030 of modern-spam-dev's
#: messages after the header cut. Left as it is, it is a spam token no ham can carry.
HONEYPOT = re.compile(rb"(?i)\b(?:phishing|phish|honey)@pot\b")


def dated(messages, keep, owner=None, readdress=False):
    """``[(source, raw, label, time)]`` by date (``Date:``; none: last), each message
    :func:`as_delivered`; given the ``owner``'s address, the honeypot's address becomes
    theirs (as in spam sent to them), and with ``readdress`` the To: too."""
    out = []
    for source, raw, label in by_date([(src, raw.replace(b"\r\n", b"\n"), lab) for src, raw, lab in messages]):
        if owner:
            raw = HONEYPOT.sub(owner.encode(), readdressed(raw, owner) if readdress else raw)
        out.append((source, as_delivered(raw, keep), label, sent_at(raw)))
    return out


def sorted_mail(ham, spam, n_ham, n_spam):
    """The folders of what the user sorted before running setup: INBOX holds the
    ``n_ham`` earliest ham, ``.Junk`` the ``n_spam`` earliest spam (their dates as
    their times), as :func:`spamnb.delivery.setup.find_mail` would list them; and the
    time setup runs: days after the last of them, so that none is too young to learn."""
    folders = [first_hour.Folder(name, name, "maildir", first_hour.role_of(name),
                                 [(src, raw, t) for src, raw, _, t in mail[:n]])
               for name, mail, n in (("INBOX", ham, n_ham), (".Junk", spam, n_spam))]
    last = max(t for f in folders for *_, t in f.messages if t != float("inf"))
    return folders, last + (first_hour.HAM_MIN_AGE_DAYS + 1) * first_hour.DAY


class _InMemory:
    """Where setup's :func:`~spamnb.delivery.setup.train` puts the model: the study
    keeps it in memory (setup's backend saves it to the user's model file)."""

    def replace(self, model):
        self.model = model


def setup_start(folders, now, screen):
    """``(proposal, model)``: what ``spamnb setup`` proposes from ``folders`` (screened
    by the default model ``screen``) and the model it trains; the default model when
    too little is sorted (setup trains nothing then, and the default model stays)."""
    proposal = first_hour.propose(folders, screen=screen, now=now)
    if not proposal.enough:
        return proposal, screen
    kept = _InMemory()
    first_hour.train(proposal, SpamModel(), kept)
    return proposal, kept.model


def next_messages(ham, spam, seed, n, spam_share=0.5, order="date"):
    """The user's next ``n`` messages ``(source, raw, label)``: the later ham and spam,
    each in date order (``order`` 'date') or shuffled by ``seed`` ('shuffled'),
    interleaved at random by ``seed``: each message is spam with probability
    ``spam_share`` while both classes last."""
    rng = random.Random(seed)
    if order == "shuffled":
        ham, spam = shuffled(ham, seed), shuffled(spam, seed + 1)
    out, h, s = [], 0, 0
    while len(out) < n and (h < len(ham) or s < len(spam)):
        if s < len(spam) and (h == len(ham) or rng.random() < spam_share):
            out.append(spam[s][:3])
            s += 1
        else:
            out.append(ham[h][:3])
            h += 1
    return out


def window_counts(labels, golds, lo, hi):
    """``(ham not filed ham, ham, spam filed spam, spam filed ham, spam)`` of messages lo..hi-1."""
    c = np.zeros(5, dtype=int)
    for label, gold in zip(labels[lo:hi], golds[lo:hi]):
        if gold == "ham":
            c += (label != "ham", 1, 0, 0, 0)
        else:
            c += (0, 0, label == "spam", label == "ham", 1)
    return c


def first_day_rows(runs, wins):
    """Per window, the three rates (ham unsure/spam %, spam caught %, spam to inbox %)
    as ``(mean over the runs, lowest, highest, pooled k, pooled n)``; ``runs``: ``(labels, golds)``."""
    rows = []
    for lo, hi in wins:
        counts = np.array([window_counts(labels, golds, lo, hi) for labels, golds in runs])
        rates = []
        for k, n in ((0, 1), (2, 4), (3, 4)):
            per_run = 100.0 * counts[:, k] / np.maximum(counts[:, n], 1)
            rates.append((per_run.mean(), per_run.min(), per_run.max(), counts[:, k].sum(), counts[:, n].sum()))
        rows.append(rates)
    return rows


def target_met(rows_after):
    """Whether the pooled rates after the first 100 meet the first-day target: ``(ham ok, spam ok)``."""
    ham, caught, _ = rows_after
    return 100.0 * ham[3] / max(ham[4], 1) <= TARGET_HAM_PCT, 100.0 * caught[3] / max(caught[4], 1) >= TARGET_CAUGHT_PCT


def print_first_day(title, runs, counts, limit):
    wins = [(lo, min(hi, limit)) for lo, hi in FIRST_DAY_WINDOWS if lo < limit]
    after = (TARGET_AFTER, limit)
    rows = first_day_rows(runs, wins + [after])
    learned, actions, moves = np.mean(counts, axis=0)
    print(f"\n{title}: {len(runs)} orders; per order {learned:.1f} self-learned, "
          f"{actions:.1f} user actions ({moves:.1f} moves)")
    print(f"{'messages':<9} | {'ham unsure/spam %':>20} | {'spam caught %':>20} | {'spam to inbox %':>20}"
          "   (mean over the orders [lowest-highest order])")
    for (lo, hi), rates in zip(wins + [after], rows):
        cells = " | ".join(f"{m:6.1f} [{a:5.1f}-{b:5.1f}]" for m, a, b, _, _ in rates)
        print(f"{f'{lo + 1}-{hi}':<9} | {cells}")
    ham, caught, inbox = rows[-1]
    pooled = [(k, n, proportion_interval(k, n) if n else (0.0, 0.0)) for *_, k, n in (ham, caught, inbox)]
    print(f"pooled {after[0] + 1}-{after[1]}: " + "; ".join(
        f"{what} {100.0 * k / max(n, 1):.2f}% ({k}/{n}, exact 95% {lo:.2f}-{hi:.2f}%)"
        for what, (k, n, (lo, hi)) in zip(("ham unsure/spam", "spam caught", "spam to inbox"), pooled)))
    ham_ok, spam_ok = target_met(rows[-1])
    print(f"target after {TARGET_AFTER}: ham unsure/spam <= {TARGET_HAM_PCT:g}% "
          f"{'met' if ham_ok else 'NOT met'}; spam caught >= {TARGET_CAUGHT_PCT:g}% {'met' if spam_ok else 'NOT met'}")
    return ham_ok and spam_ok


def first_day(args, seeds, rules):
    """``--start setup``: per owner, setup's model of their sorted mail, then their next messages."""
    ham_corpus = (args.corpus or [str(shared_corpora.SHARED / "enron-ham-dev")])[0]
    limit = args.limit or 1000
    all_ham = load(ham_corpus)
    spam_raw = load(args.spam_corpus)
    screen = default_seed()
    keep = README_FIELDS + ((b"to",) if args.readdress else ())
    print(f"ham {ham_corpus}, spam {args.spam_corpus}; header fields kept in both classes: "
          f"{', '.join(f.decode() for f in keep)}; the honeypot's address in spam replaced by the owner's"
          f"{' (and To: readdressed)' if args.readdress else ''}; "
          f"setup on the {args.setup_ham} earliest ham and {args.setup_spam} earliest spam; then {limit} messages, "
          f"{args.spam_share:.0%} spam, each class {'in date order' if args.order == 'date' else 'shuffled'}, "
          f"interleaved by order {seeds}; corrections {args.delay} messages later")
    met = True
    for owner in args.owner or MAILBOXES:
        mine = [m for m in all_ham if f"/{owner}/" in m[0]]
        if not mine:
            raise SystemExit(f"--owner {owner}: no message of {ham_corpus} has /{owner}/ in its path")
        ham, spam = dated(mine, keep), dated(spam_raw, keep, owner_address(mine), args.readdress)
        folders, now = sorted_mail(ham, spam, args.setup_ham, args.setup_spam)
        proposal, model = setup_start(folders, now, screen)
        state = model.to_state()
        print(f"\n{owner}: setup proposes {len(proposal.ham)} ham and {len(proposal.spam)} spam "
              f"({len(proposal.doubtful)} ham left out as the default model's spam, {proposal.young} too young)"
              + ("" if proposal.enough else "; too few: the default model stays"))
        later_ham, later_spam = ham[args.setup_ham:], spam[args.setup_spam:]
        for rule in rules:
            runs, counts = [], []
            for seed in seeds:
                stream = next_messages(later_ham, later_spam, seed, limit, args.spam_share, args.order)
                scores, labels, n = living(stream, rule, args.delay, lambda: SpamModel.from_state(state))
                runs.append((labels, [LABELS[int(y)] for y in scores.y]))
                counts.append([n["self-learned"], n["actions"], n["moves"]])
            name = f"{rule} (filter -u's rule)" if rule == FILTER_U else rule
            met &= print_first_day(f"{owner}, {name}", runs, counts, limit)
    return 0 if met or not args.check else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", action="append",
                    help="corpus folder or index (repeatable: concatenated, then shuffled together); "
                         "default SpamAssassin")
    ap.add_argument("--seed", type=int, action="append", help="shuffling seeds (repeatable; default 0 1 2)")
    ap.add_argument("--limit", type=int,
                    help="messages of each order (default 2000, the windows' end: the messages after it are one "
                         "more; --start setup: 1000)")
    ap.add_argument("--rule", action="append", help=f"self-learning rules (repeatable; default {' '.join(RULES)})")
    ap.add_argument("--delay", type=int, default=0, help="messages between a verdict and the user's correction")
    ap.add_argument("--start", choices=STARTS, default="empty", help="the model the filter starts from")
    ap.add_argument("--only", metavar="REGEX", help="keep the messages whose source matches")
    ap.add_argument("--readdress", action="store_true", help="give every spam the To: of the ham's owner")
    first = ap.add_argument_group("--start setup: the first day after spamnb setup")
    first.add_argument("--owner", action="append", choices=MAILBOXES,
                       help="the enron-ham-dev mailbox whose ham the user gets (repeatable; default both)")
    first.add_argument("--spam-corpus", default=str(shared_corpora.SHARED / "modern-spam-dev"),
                       help="the spam the user gets (read here, never saved)")
    first.add_argument("--setup-ham", type=int, default=first_hour.MIN_HAM,
                       help="the user's earliest ham sorted before setup (default setup's minimum)")
    first.add_argument("--setup-spam", type=int, default=first_hour.MIN_SPAM,
                       help="the user's earliest spam sorted into .Junk before setup (default setup's minimum)")
    first.add_argument("--spam-share", type=float, default=0.5, help="the share of spam in the later stream")
    first.add_argument("--order", choices=("date", "shuffled"), default="date",
                       help="each class of the later stream in date order or shuffled by the order's seed")
    first.add_argument("--check", action="store_true", help="exit 1 when the first-day target is not met")
    args = ap.parse_args()
    try:
        only = re.compile(args.only) if args.only else None
    except re.error as exc:
        raise SystemExit(f"--only: not a regular expression: {exc}") from None
    seeds = args.seed or [0, 1, 2]
    if args.start == "setup":
        if not 0.0 < args.spam_share < 1.0 or min(args.setup_ham, args.setup_spam) < 1:
            raise SystemExit("--spam-share is between 0 and 1, --setup-ham and --setup-spam at least 1")
        return first_day(args, seeds, args.rule or [FILTER_U])
    args.limit = args.limit or 2000
    corpora = args.corpus or [str(shared_corpora.SPAMASSASSIN)]
    messages = [m for c in corpora for m in load(c) if only is None or only.search(m[0])]
    if args.readdress:
        messages = with_owner(messages)
    make = starting_model(args.start)
    print(f"{' + '.join(corpora)}{f' ({args.only})' if only else ''}: {len(messages)} messages; "
          f"orders {seeds}, first {args.limit} of each; corrections {args.delay} messages later; "
          f"starting {args.start}")
    wins = windows(args.limit)
    print(table_head("rule", " | self-learned  user actions (moves)", wins))
    for rule in args.rule or RULES:
        runs, counts = [], []
        for seed in seeds:
            scores, labels, n = living(shuffled(messages, seed)[: args.limit], rule, args.delay, make)
            runs.append((scores, labels))
            counts.append([n["self-learned"], n["actions"], n["moves"]])
        learned, actions, moves = np.mean(counts, axis=0)
        print(table_row(rule, runs, f" | {learned:12.1f}  {actions:12.1f} ({moves:.1f})", wins), flush=True)
    print("(means over the orders; a difference of a few messages is noise)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
