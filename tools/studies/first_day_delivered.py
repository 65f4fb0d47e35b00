#!/usr/bin/env python3
"""The first day after ``spamnb setup``, delivered for real and corrected as docs/setup.md says.

``living_filter.py --start setup`` runs the loop in memory (setup's code, the model's
``learn``). This runs the same owner's same stream through the commands a person runs:

1. a HOME whose ``~/Maildir`` holds the owner's ``--setup-ham`` earliest ham in INBOX and
   the ``--setup-spam`` earliest spam in ``.Junk`` (files named and timed by their Date,
   as a delivery names them), and ``spamnb setup --yes --install`` run in it: the model,
   the procmail recipe (with ``-u`` and the Unsure folder) and the folders;
2. each message of the stream delivered by real procmail through that recipe;
3. the person's corrections, as docs/setup.md's "Correcting it" gives them for mutt:
   a message in the wrong folder (spam in INBOX or Unsure, ham in Junk or Unsure) piped
   to ``spamnb learn --spam -`` (or ``--ham``), as the ``S`` and ``H`` keys do, and
   moved to its folder.

It prints, beside living_filter's table for this stream, how many verdicts differ from
the in-memory run of the same stream (``--compare``). modern-spam-dev is read at run time
and its messages written only into the temporary HOME, removed at the end (as is the
model trained on them)::

    python tools/studies/first_day_delivered.py --owner farmer-d --seed 0 --compare
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the project: spamnb, tools

from tools import shared_corpora  # noqa: E402
from tools.studies.first_week import MAILBOXES, owner_address  # noqa: E402
from tools.studies.learning_curve import load  # noqa: E402
from tools.studies.living_filter import (FILTER_U, README_FIELDS, dated, living, next_messages,  # noqa: E402
                                         print_first_day, setup_start, sorted_mail)
from spamnb.delivery import setup as first_hour  # noqa: E402
from spamnb.model import SpamModel  # noqa: E402
from spamnb.storage.modelfile import default_seed  # noqa: E402
from spamnb.verdict import LABELS  # noqa: E402

FOLDER = {"ham": "", "spam": ".Junk", "unsure": ".Unsure"}


def spamnb_command():
    here = os.path.dirname(sys.executable)
    script = os.path.join(here, "spamnb")
    return [script] if os.path.isfile(script) else [sys.executable, "-m", "spamnb"]


def put(folder, raw, t, n):
    """``raw`` into the maildir ``folder``'s cur/, named and timed as delivered at ``t``."""
    t = int(t) if t != float("inf") else int(time.time()) - 86400 * 30
    path = os.path.join(folder, "cur", f"{t}.M{n}P1.study:2,S")
    with open(path, "wb") as f:
        f.write(raw)
    os.utime(path, (t, t))


def new_files(md):
    return {os.path.join(md, sub, "new", name) for sub in FOLDER.values()
            for name in os.listdir(os.path.join(md, sub, "new"))}


def run_delivered(home, stream, spamnb, env):
    """Deliver ``stream`` through the installed recipe, correcting as the docs say: the labels."""
    md = os.path.join(home, "Maildir")
    rc = os.path.join(home, ".procmailrc")
    labels, actions = [], 0
    seen = new_files(md)
    for i, (_, raw, gold) in enumerate(stream):
        got = subprocess.run(["procmail", "-m", f"HOME={home}", rc], input=raw, env=env, capture_output=True,
                             timeout=120)
        if got.returncode != 0:
            raise SystemExit(f"procmail failed on message {i}: {got.stderr.decode(errors='replace')}")
        now = new_files(md)
        [path] = now - seen
        seen = now
        where = os.path.basename(os.path.dirname(os.path.dirname(path)))
        label = {".Junk": "spam", ".Unsure": "unsure"}.get(where, "ham")
        labels.append(label)
        if label != gold:  # the person's S or H key: learn from the piped message, then file it
            actions += 1
            with open(path, "rb") as f:
                piped = f.read()
            learned = subprocess.run([*spamnb, "learn", f"--{gold}", "-"], input=piped, env=env, capture_output=True,
                                     timeout=300)
            if learned.returncode != 0:
                raise SystemExit(f"spamnb learn failed: {learned.stderr.decode(errors='replace')}")
            target = os.path.join(md, FOLDER[gold], "cur", os.path.basename(path) + ":2,S")
            os.rename(path, target)
            seen.discard(path)
        if (i + 1) % 100 == 0:
            print(f"  {i + 1} delivered, {actions} corrections", file=sys.stderr, flush=True)
    return labels, actions


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--owner", action="append", choices=MAILBOXES, help="default both")
    ap.add_argument("--seed", type=int, action="append", help="orders (default 0)")
    ap.add_argument("--limit", type=int, default=1000)
    ap.add_argument("--corpus", default=str(shared_corpora.SHARED / "enron-ham-dev"))
    ap.add_argument("--spam-corpus", default=str(shared_corpora.SHARED / "modern-spam-dev"))
    ap.add_argument("--setup-ham", type=int, default=first_hour.MIN_HAM)
    ap.add_argument("--setup-spam", type=int, default=first_hour.MIN_SPAM)
    ap.add_argument("--compare", action="store_true", help="also run living_filter's in-memory loop on each stream")
    args = ap.parse_args()
    if shutil.which("procmail") is None:
        print("first_day_delivered.py: skipped: procmail is not installed", file=sys.stderr)
        return shared_corpora.EXIT_ABSENT
    all_ham, spam_raw = load(args.corpus), load(args.spam_corpus)
    spamnb = spamnb_command()
    screen = default_seed() if args.compare else None
    seeds = args.seed or [0]
    met = True
    for owner in args.owner or MAILBOXES:
        mine = [m for m in all_ham if f"/{owner}/" in m[0]]
        ham, spam = dated(mine, README_FIELDS), dated(spam_raw, README_FIELDS, owner_address(mine))
        for seed in seeds:
            stream = next_messages(ham[args.setup_ham:], spam[args.setup_spam:], seed, args.limit)
            tmp = tempfile.mkdtemp(prefix="spamnb-first-day-")
            try:
                home = os.path.join(tmp, "home")
                md = os.path.join(home, "Maildir")
                for sub in ("", ".Junk"):
                    for d in ("cur", "new", "tmp"):
                        os.makedirs(os.path.join(md, sub, d))
                for n, (_, raw, _, t) in enumerate(ham[:args.setup_ham]):
                    put(md, raw, t, n)
                for n, (_, raw, _, t) in enumerate(spam[:args.setup_spam]):
                    put(os.path.join(md, ".Junk"), raw, t, 1000 + n)
                env = {"HOME": home, "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
                       "XDG_CACHE_HOME": os.path.join(tmp, "cache"),
                       **({"SPAMNB_CORPUS": os.environ["SPAMNB_CORPUS"]} if "SPAMNB_CORPUS" in os.environ else {})}
                started = time.time()
                done = subprocess.run([*spamnb, "setup", "--yes", "--install", "--delivery", "procmail"], env=env,
                                      capture_output=True, text=True, timeout=1800)
                if done.returncode != 0:
                    raise SystemExit(f"spamnb setup failed: {done.stderr}")
                proposed = next(line for line in done.stdout.splitlines() if line.startswith("Proposed:"))
                print(f"\n{owner}, order {seed}: spamnb setup --yes --install: {proposed}", flush=True)
                labels, actions = run_delivered(home, stream, spamnb, env)
                golds = [gold for _, _, gold in stream]
                met &= print_first_day(f"{owner}, order {seed}, delivered by procmail, corrected with spamnb learn "
                                       "(the filter's own learning and the moves are not counted here)",
                                       [(labels, golds)], [[0, actions, 0]], args.limit)
                print(f"({time.time() - started:.0f} s)")
                if args.compare:
                    folders, now = sorted_mail(ham, spam, args.setup_ham, args.setup_spam)
                    _, model = setup_start(folders, now, screen)
                    state = model.to_state()
                    scores, memory, _ = living(stream, FILTER_U, 0, lambda: SpamModel.from_state(state))
                    differ = sum(a != b for a, b in zip(labels, memory))
                    assert [LABELS[int(y)] for y in scores.y] == golds
                    print(f"verdicts that differ from living_filter's in-memory run of this stream: {differ} of "
                          f"{len(labels)}")
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
