#!/usr/bin/env python3
"""The TREC online protocol, spamnb beside bogofilter in the same run.

In one shuffled order (--seed), every message is classified and then trained
on its gold label. bogofilter does it as a user would: one process to
classify (``bogofilter -t``) and one to register (``-s`` / ``-n``) per message.
CRM114 likewise: one ``crm`` process classifying the message from stdin and one
learning it, with the classifier settings of Debian's mailfilter.cf (see
``peers.run_crm114``). CRM114's own practice is to learn only errors and messages
within its thick threshold (mailfilter.crm's --learnspam/--learnnonspam without
--force): that is a second, separately labelled CRM114 row, which runs the
learning process only for those messages. A filter whose command is not installed
is skipped with a line on stderr.
spamnb runs ``spamnb evaluate --online`` (one process for the whole run, as the
library's online protocol is incremental: a step costs the message's tokens).

Several indexes are concatenated, then shuffled together: the longest stream the
corpora make (the target is measured "over your longest stream"), and a corpus of
one class (enron-ham-dev, ham only) then still meets both classes throughout.

    python tools/benchmarks/bench_online.py ../shared/corpora/spamassassin/index --seed 1
    python tools/benchmarks/bench_online.py ../shared/corpora/{spamassassin,trec06c-dev,enron-ham-dev}/index

``--worst N`` then names the N hams spamnb scored highest in the second half of
the stream (the model has learned thousands of messages by then: what is still
scored high is not a cold start) and the tokens that put each there: the
model's :meth:`explain` evidence at that moment, the model of all messages
before it (learning every message, the model at step i is the counts of
messages 0..i-1 whatever their order, so the replay learns them in chunks).
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the project: spamnb, tools

from tools.studies import peers  # noqa: E402
from tools import shared_corpora  # noqa: E402
from spamnb.evaluation import metrics  # noqa: E402
from spamnb.mail.sources import iter_index  # noqa: E402


def bogofilter_online(items):
    """(seconds, scores) of bogofilter classifying then registering each message."""
    bogo = shutil.which("bogofilter")
    scores = []
    with tempfile.TemporaryDirectory(prefix="bench-online-") as db:
        t0 = time.perf_counter()
        for path, label in items:
            with open(path, "rb") as f:
                raw = f.read()
            out = subprocess.run([bogo, "-C", "-d", db, "-t", "--terse-format=%c %.12e"],
                                 input=raw, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout
            # the first message meets an empty database: bogofilter then refuses to score
            scores.append(float(out.split()[-1]) if out.strip() else 0.5)
            subprocess.run([bogo, "-C", "-d", db, "-s" if label == "spam" else "-n"], input=raw, check=True)
        return time.perf_counter() - t0, np.array(scores)


def crm114_online(items, train_on_error=False):
    """(seconds, scores, messages learned) of CRM114 classifying then learning each message.

    Two processes per message, as a user's mail delivery agent and training
    command would run them: ``crm`` classifying the message on stdin (the spam
    score is -pR), then ``crm`` learning it into spam.css or nonspam.css. Both
    files start empty (an empty text learned into each, as mailtrainer.crm starts
    them), so the first message scores 0. With ``train_on_error`` the second process runs
    only when mailfilter.crm would learn the message: misfiled, or within pR 5 of
    the decision (``peers.crm114_needs_learning``).
    """
    crm = shutil.which("crm")
    scores, learned = [], 0
    with tempfile.TemporaryDirectory(prefix="bench-online-crm114-") as db:
        t0 = time.perf_counter()
        for css in ("nonspam.css", "spam.css"):
            subprocess.run([crm, "-u", db, peers.CRM114_LEARN, f"--css={css}"], input=b"", check=True)
        for path, label in items:
            with open(path, "rb") as f:
                raw = f.read()
            out = subprocess.run([crm, "-u", db, peers.CRM114_CLASSIFY], input=raw,
                                 stdout=subprocess.PIPE, check=True).stdout
            score = peers.crm114_score(out)
            scores.append(score)
            if not train_on_error or peers.crm114_needs_learning(score, label == "spam"):
                css = "spam.css" if label == "spam" else "nonspam.css"
                subprocess.run([crm, "-u", db, peers.CRM114_LEARN, f"--css={css}"], input=raw, check=True)
                learned += 1
        return time.perf_counter() - t0, np.array(scores), learned


def spamnb_online(index_path, seed, workdir, scores=None):
    """(seconds, evaluate's JSON summary) of ``spamnb evaluate --online`` on the shuffled index
    (``scores``: also write each message's score there, ``evaluate --scores``)."""
    import json

    t0 = time.perf_counter()
    # the shuffled index is this script's own, naming absolute paths: trusted
    out = subprocess.run([sys.executable, "-m", "spamnb", "evaluate", "--index", index_path, "--online",
                          "--trust-index", "--json"] + (["--scores", scores] if scores else []),
                         stdout=subprocess.PIPE, check=True, cwd=workdir).stdout
    return time.perf_counter() - t0, json.loads(out)


def worst_hams(items, scores, n, chunk=500):
    """The ``n`` hams of the second half of ``items`` with the highest online ``scores``,
    each with its evidence then: ``[(index, path, score, Evidence)]``, highest first."""
    from spamnb.model import SpamModel

    half = len(items) // 2
    hams = [i for i in range(half, len(items)) if items[i][1] == "ham"]
    chosen = sorted(hams, key=lambda i: -scores[i])[:n]
    wanted = set(chosen)
    model, toks, ys, found = SpamModel(), [], [], {}
    for i, (path, label) in enumerate(items[: max(chosen) + 1]):
        with open(path, "rb") as f:
            raw = f.read()
        t = model.tokens(raw)
        if i in wanted or len(toks) >= chunk:
            model.learn_tokens(toks, ys)
            toks, ys = [], []
        if i in wanted:
            found[i] = model.explain(raw, 40, toks=t)
        toks.append(t)
        ys.append(label)
    return [(i, items[i][0], scores[i], found[i]) for i in chosen]


def header(path, name):
    """One header field of the message at ``path``, decoded for a reader (first 70 characters)."""
    import email
    import email.errors
    import email.header
    import email.policy

    with open(path, "rb") as f:
        msg = email.message_from_binary_file(f, policy=email.policy.compat32)
    value = msg.get(name)
    if value is None:
        return ""
    try:
        text = str(email.header.make_header(email.header.decode_header(value)))
    except (UnicodeError, LookupError, email.errors.HeaderParseError):
        text = str(value)
    return " ".join(text.split())[:70]


def stream(indexes, seed, limit):
    """(path, label) of the indexes' messages concatenated, shuffled with ``seed``, the first ``limit``."""
    msgs = [m for index in indexes for m in iter_index(index)]
    order = np.random.default_rng(seed).permutation(len(msgs))[:limit]
    return [(msgs[i].source, msgs[i].label) for i in order]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("index", nargs="+", help="index file(s): concatenated, then shuffled together")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--limit", type=int, default=None, help="only the first N messages of the shuffled order")
    ap.add_argument("--worst", type=int, default=0, metavar="N",
                    help="also name the N hams of the stream's second half spamnb scored highest, with "
                         "the tokens that put them there")
    args = ap.parse_args()
    args.index = [shared_corpora.require(i) for i in args.index]  # absent: one line, exit 2
    items = stream(args.index, args.seed, args.limit)
    y = np.array([lb == "spam" for _, lb in items], dtype=int)
    with tempfile.TemporaryDirectory(prefix="bench-online-") as tmp:
        shuffled = os.path.join(tmp, "index")
        with open(shuffled, "w", encoding="utf-8") as f:
            f.writelines(f"{lb} {os.path.abspath(p)}\n" for p, lb in items)
        scores_path = os.path.join(tmp, "scores.tsv") if args.worst else None
        s_sec, s = spamnb_online(shuffled, args.seed, tmp, scores_path)
        if args.worst:
            with open(scores_path, encoding="utf-8") as f:
                online_scores = [float(line.split("\t")[1]) for line in f if not line.startswith("#")]
    rows = [("spamnb (evaluate --online)", s_sec, s["one_minus_auc_pct"], s["recall_at_fpr"]["0.001"],
             s["recall_at_fpr"]["0.01"])]

    def row(name, sec, scores):
        return (name, sec, metrics.one_minus_auc_pct(y, scores), 100 * metrics.recall_at_fpr(y, scores, 0.001),
                100 * metrics.recall_at_fpr(y, scores, 0.01))

    bogo_sec = None
    if shutil.which("bogofilter"):
        bogo_sec, b_scores = bogofilter_online(items)
        rows.append(row("bogofilter (-t, then -s/-n, per message)", bogo_sec, b_scores))
    else:
        print("bench_online.py: bogofilter skipped: no bogofilter on PATH (Debian: apt-get install bogofilter)",
              file=sys.stderr)
    if shutil.which("crm"):
        c_sec, c_scores, _ = crm114_online(items)
        rows.append(row("crm114 (classify, then learn, per message)", c_sec, c_scores))
        c_sec, c_scores, learned = crm114_online(items, train_on_error=True)
        rows.append(row(f"crm114 TRAIN-ON-ERROR (learns only misfiled or pR within ±{peers.CRM114_THRESHOLD:g}: "
                        f"{learned} of {len(items)})", c_sec, c_scores))
    else:
        print("bench_online.py: crm114 skipped: no crm on PATH (Debian: apt-get install crm114)", file=sys.stderr)
    n_spam = int(y.sum())
    print(f"{len(items)} messages ({n_spam} spam, {len(items) - n_spam} ham) of {', '.join(args.index)}, "
          f"shuffled with seed {args.seed}, classify then train on each (but the TRAIN-ON-ERROR row)\n")
    print("| filter | seconds | ms per message | (1-AUC)% | recall@0.1%FPR | recall@1%FPR |")
    print("|---|---|---|---|---|---|")
    for name, sec, auc, rec, rec1 in rows:
        print(f"| {name} | {sec:.1f} | {1000 * sec / len(items):.2f} | {auc:.3f} | {rec:.1f} | {rec1:.1f} |")
    if bogo_sec is not None:
        print(f"\nspamnb / bogofilter time ratio: {rows[0][1] / bogo_sec:.2f}")
    if args.worst:
        n_ham = len(items) - n_spam
        print(f"\nThe {args.worst} hams of messages {len(items) // 2 + 1}-{len(items)} spamnb scored highest "
              f"(rank among the {n_ham} hams of the whole stream by online score); the tokens for spam "
              "(log-odds contribution, occurrences) in the model of the messages before it:")
        rank = {i: r + 1 for r, i in enumerate(sorted((i for i in range(len(items)) if items[i][1] == "ham"),
                                                        key=lambda i: -online_scores[i]))}
        for i, path, score, ev in worst_hams(items, online_scores, args.worst):
            toks = ", ".join([f"{t} {c:+.2f} x{k}" for t, k, c in ev.tokens if c > 0][:10])
            print(f"\n#{i + 1} (ham rank {rank[i]}) score {score:+.2f} (explain: {ev.score:+.2f}, prior "
                  f"{ev.prior:+.2f}) {path}\n  From: {header(path, 'From')}\n  Subject: {header(path, 'Subject')}"
                  f"\n  List-Id: {header(path, 'List-Id')}\n  for spam: {toks}")


if __name__ == "__main__":
    main()
