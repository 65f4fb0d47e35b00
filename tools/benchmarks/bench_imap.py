#!/usr/bin/env python3
"""``spamnb imap`` against the same work on a maildir: training, one filter pass, round trips.

Measured in one run against a private Dovecot on 127.0.0.1
(``tests/dovecot.py``; plaintext IMAP, no TLS) and, for comparison, the same
messages in maildirs on the same disk:

1. **Training**: ``spamnb imap train --ham Ham --spam Junk`` reading ``--n``
   labelled messages from two IMAP folders, against ``spamnb train --ham
   MAILDIR --spam MAILDIR`` reading the same messages from two maildirs
   (``cur/`` files). Both build a default model (the same settings, one
   process); each is a separate process, the two alternate run by run
   (``--runs`` each), and the figures are medians of wall time, the ratio of
   the medians and the median of each run's own ratio. The two models are
   compared afterwards (messages per class, vocabulary size): the same work,
   except that Dovecot serves every line end as CRLF and the maildir files
   have LF: a MIME part near the tokenizer's ``max_part_bytes`` (200,000 bytes)
   is cut at a different place. With the default messages (seed 0) one ham
   of 195,814 bytes (202,154 as served) has 44 tokens of its tail only from
   the maildir and 1 only over IMAP; the IMAP model's vocabulary is 35 tokens
   smaller, the messages per class are the same.
2. **One filter pass**: with the model trained from the maildirs, ``--new``
   held-out messages (in no training folder) are put in INBOX and timed through
   one ``spamnb imap filter`` pass (the state file removed first, Junk emptied
   first: the pass classifies, keywords and moves, and has nothing else to
   do), against ``spamnb sort MAILDIR`` (classify and move spam to ``.Junk``)
   on the same messages in a maildir's ``new/``. The messages are put back
   before every run (not timed); medians and ratios as above.
3. **Round trips**: one more pass, not timed, with imaplib instrumented in the
   spamnb process: every tagged command it sends (imapclient waits for each
   command's tagged answer before the next, so each is at least one round
   trip), and the bytes it sends and receives. An empty pass is counted too:
   its commands are what any pass costs (login, capabilities, LIST, SELECT and
   SEARCH of both folders, logout); the rest grows with the messages. From
   these, an **estimate** of what a remote provider adds: round trips x RTT at
   30 and 100 ms. It leaves out the connection's set-up (TCP's handshake, TLS's
   one or two round trips, perhaps a slower LOGIN) and the transfer of the
   bytes, which comes on top at the link's bandwidth (the bytes are reported);
   the server's own work on a provider's disks is not in it either.

The messages: the SpamAssassin corpus and the enron-ham-dev ham of
``../shared/corpora`` (enron's artefact headers stripped as
``tools/studies/first_day.py`` does; mbox ``From `` lines dropped: neither a maildir
file nor an appended message has one), made unique by
:func:`spamnb.mail.identity.message_key` (a duplicate would be counted once by
training and skipped by the filter), shuffled with ``--seed``; the first
``--n`` are the training set, the next ``--new`` the new mail (about as much
spam as the pool: ~15%, so the pass moves some). Appending them to Dovecot
(one connection, one APPEND each) is set-up, not timed.

Usage::

    .venv/bin/python tools/benchmarks/bench_imap.py                        # --n 10000 --new 1000 --runs 3
    .venv/bin/python tools/benchmarks/bench_imap.py --n 2000 --new 300 --runs 1 --json out/bench_imap.json

Needs Dovecot (Debian's dovecot-imapd) and imapclient (the ``imap`` or ``test``
extra). The machine is shared: only medians and ratios of interleaved runs
mean much. Dovecot and every temporary directory are removed on exit, Ctrl-C
and SIGTERM included. Exits 2 when a corpus is not there (tools/shared_corpora.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the project (spamnb, tools); tests: dovecot.py

from tools import shared_corpora  # noqa: E402
from tools.benchmarks.bench_learning import default_spamnb  # noqa: E402
from tools.studies.first_day import strip_artefacts  # noqa: E402

ENRON = shared_corpora.SHARED / "enron-ham-dev"
RTTS_MS = (30, 100)

# Run in the spamnb process of the counted passes: imaplib's tagged commands and
# the bytes through its socket, written as JSON to $BENCH_IMAP_COUNTS at exit.
COUNTER = r"""
import atexit, collections, imaplib, json, os, re, sys
counts = collections.Counter()
io = {"sent": 0, "received": 0, "tags": 0}
_new_tag, _send, _read, _readline = (imaplib.IMAP4._new_tag, imaplib.IMAP4.send,
                                     imaplib.IMAP4.read, imaplib.IMAP4.readline)
def new_tag(self):  # every tagged command takes one, imaplib's and imapclient's own alike
    io["tags"] += 1
    return _new_tag(self)
def send(self, data):
    io["sent"] += len(data)
    m = re.match(rb"[A-Z]+[0-9]+ ((?:UID )?[A-Z]+)", bytes(data))
    if m and bytes(data).startswith(self.tagpre):
        counts[m.group(1).decode()] += 1
    return _send(self, data)
def read(self, size):
    data = _read(self, size)
    io["received"] += len(data)
    return data
def readline(self):
    data = _readline(self)
    io["received"] += len(data)
    return data
imaplib.IMAP4._new_tag, imaplib.IMAP4.send = new_tag, send
imaplib.IMAP4.read, imaplib.IMAP4.readline = read, readline
@atexit.register
def _dump():
    with open(os.environ["BENCH_IMAP_COUNTS"], "w") as f:
        json.dump({"commands": dict(counts), **io}, f)
sys.argv = ["spamnb", *sys.argv[1:]]
from spamnb._entry import main
main()
"""


# -- the messages ---------------------------------------------------------------------


def load_pool(seed):
    """[(label, raw)]: SpamAssassin and enron ham, unique by message key, shuffled."""
    from spamnb.delivery.spamd_protocol import envelope_split
    from spamnb.mail.identity import message_key
    from spamnb.mail.sources import iter_index

    sa = shared_corpora.require(shared_corpora.SPAMASSASSIN)
    enron = shared_corpora.require(ENRON)
    pool, seen = [], set()
    for index, strip in ((sa, None), (enron, strip_artefacts)):
        for m in iter_index(index, on_error=lambda *_: None):
            raw = envelope_split(m.raw)[1]  # no mbox From line: IMAP stores none
            raw = strip(raw) if strip else raw
            key = message_key(raw)
            if key not in seen:
                seen.add(key)
                pool.append((m.label, raw))
    random.Random(seed).shuffle(pool)
    return pool


def write_maildir(folder: Path, messages, sub="cur"):
    """A fresh maildir holding ``messages`` (raw bytes) in ``sub``."""
    shutil.rmtree(folder, ignore_errors=True)
    for s in ("cur", "new", "tmp"):
        (folder / s).mkdir(parents=True)
    info = ":2,S" if sub == "cur" else ""
    for i, raw in enumerate(messages):
        (folder / sub / f"1700000000.M{i}P1.bench{info}").write_bytes(raw)


# -- the IMAP side ----------------------------------------------------------------------


def empty_folder(client, folder):
    client.select_folder(folder)
    uids = client.search("ALL")
    if uids:
        client.add_flags(uids, [b"\\Deleted"], silent=True)
        client.expunge()


def append_all(client, folder, messages):
    """Append on one connection (the harness's ``append`` logs in once per message)."""
    for raw in messages:
        client.append(folder, raw)


def count_in(client, folder) -> int:
    return int(client.folder_status(folder, [b"MESSAGES"])[b"MESSAGES"])


# -- running and timing ---------------------------------------------------------------------


class Runner:
    """Runs commands one at a time; ends the one running when we are stopped."""

    def __init__(self, env):
        self.env = env
        self.current: subprocess.Popen | None = None

    def run(self, cmd, extra_env=None):
        """(wall seconds, CPU seconds of the process, stderr text); exits on a failure."""
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        self.current = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, env={**self.env, **(extra_env or {})})
        out, err = self.current.communicate()
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        code, self.current = self.current.returncode, None
        text = (out + err).decode(errors="replace")
        if code:
            raise SystemExit(f"bench_imap: {' '.join(map(str, cmd))} failed ({code}):\n{text}")
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return wall, cpu, text

    def stop(self):
        if self.current is not None and self.current.poll() is None:
            self.current.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.current.wait(10)
            if self.current.poll() is None:
                self.current.kill()


def last_line(text):
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def summarise(times):
    """{name: median} and the median of the per-run ratios imap / maildir."""
    med = {k: statistics.median(v) for k, v in times.items()}
    paired = statistics.median(a / b for a, b in zip(times["imap"], times["maildir"]))
    return med, paired


def interleaved(runs, do):
    """``do(kind)`` for kind in imap/maildir, ``runs`` times, the first of each run alternating."""
    times = {"imap": [], "maildir": []}
    cpu = {"imap": [], "maildir": []}
    for r in range(runs):
        for kind in (("imap", "maildir") if r % 2 == 0 else ("maildir", "imap")):
            wall, c = do(kind)
            times[kind].append(wall)
            cpu[kind].append(c)
            print(f"  run {r + 1} {kind:8s} {wall:7.2f} s wall, {c:6.2f} s CPU", file=sys.stderr, flush=True)
    return times, cpu


def model_facts(path):
    from spamnb.storage.modelfile import load_model

    m = load_model(path)
    return {"ham": int(m.messages[0]), "spam": int(m.messages[1]), "vocabulary": len(m.vocabulary)}


# -- the run --------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10000, help="training messages (default 10000)")
    ap.add_argument("--new", type=int, default=1000, help="new messages of the filter pass (default 1000)")
    ap.add_argument("--runs", type=int, default=3, help="timed runs of each command (default 3)")
    ap.add_argument("--seed", type=int, default=0, help="shuffle of the message pool (default 0)")
    ap.add_argument("--spamnb", default=default_spamnb(), help="the spamnb command measured")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    if min(args.n, args.new, args.runs) < 1:
        ap.error("--n, --new and --runs must be at least 1")

    from dovecot import Dovecot

    def on_term(*_):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)

    tmp = Path(tempfile.mkdtemp(prefix="bench-imap-"))
    # private config, data and cache: no user's imap.toml or model is read or written
    env = {k: v for k, v in os.environ.items() if k != "SPAMNB_MODEL"}
    env.update(XDG_CONFIG_HOME=str(tmp / "config"), XDG_DATA_HOME=str(tmp / "data"),
               XDG_CACHE_HOME=str(tmp / "cache"))
    runner = Runner(env)
    d = None
    try:
        t = time.perf_counter()
        pool = load_pool(args.seed)
        if args.n + args.new > len(pool):
            raise SystemExit(f"bench_imap: --n {args.n} + --new {args.new} is more than the "
                             f"{len(pool)} distinct messages of the corpora")
        train, new = pool[:args.n], [raw for _, raw in pool[args.n:args.n + args.new]]
        ham = [raw for lb, raw in train if lb == "ham"]
        spam = [raw for lb, raw in train if lb == "spam"]
        new_spam = sum(lb == "spam" for lb, _ in pool[args.n:args.n + args.new])
        train_bytes = sum(map(len, ham)) + sum(map(len, spam))
        new_bytes = sum(map(len, new))
        print(f"{len(pool)} distinct messages read; training {len(ham)} ham + {len(spam)} spam "
              f"({train_bytes / 1e6:.1f} MB), new {len(new)} ({new_spam} of them spam, "
              f"{new_bytes / 1e6:.1f} MB) [{time.perf_counter() - t:.0f} s]", file=sys.stderr, flush=True)

        write_maildir(tmp / "train" / "ham", ham)
        write_maildir(tmp / "train" / "spam", spam)
        d = Dovecot().start()
        pw = tmp / "password"
        pw.write_text(d.password + "\n")
        pw.chmod(0o600)
        account = ["--host", d.host, "--port", str(d.port), "--user", d.user, "--password-file", str(pw),
                   "--security", "none"]
        t = time.perf_counter()
        with d.client() as c:
            for folder in ("Ham", "Junk"):
                if not c.folder_exists(folder):
                    c.create_folder(folder)
            append_all(c, "Ham", ham)
            append_all(c, "Junk", spam)
            held = {f: count_in(c, f) for f in ("Ham", "Junk")}
        if held != {"Ham": len(ham), "Junk": len(spam)}:
            raise SystemExit(f"bench_imap: Dovecot holds {held} after appending {len(ham)} ham and {len(spam)} spam")
        print(f"appended {args.n} messages to Dovecot in {time.perf_counter() - t:.0f} s (set-up, not timed)",
              file=sys.stderr, flush=True)

        # spamnb with imaplib instrumented (COUNTER): {commands, tags, sent, received}
        def counted(cmd):
            out = tmp / "counts.json"
            runner.run([sys.executable, "-c", COUNTER, *cmd[1:]], {"BENCH_IMAP_COUNTS": str(out)})
            got = json.loads(out.read_text())
            if sum(got["commands"].values()) != got["tags"]:  # a command line not recognised
                print(f"bench_imap: {got['tags']} tags but commands {got['commands']}", file=sys.stderr)
            return got

        # -- 1. training ----------------------------------------------------------------
        models = {"imap": tmp / "imap-model.joblib", "maildir": tmp / "maildir-model.joblib"}
        commands = {
            "imap": [args.spamnb, "imap", "train", "--ham", "Ham", "--spam", "Junk", *account,
                     "--model", str(models["imap"])],
            "maildir": [args.spamnb, "train", "--ham", str(tmp / "train" / "ham"), "--spam",
                        str(tmp / "train" / "spam"), "--model", str(models["maildir"])],
        }
        print(f"training on {args.n} messages, {args.runs} runs each, alternating", file=sys.stderr, flush=True)
        train_times, train_cpu = interleaved(args.runs, lambda kind: runner.run(commands[kind])[:2])
        facts = {kind: model_facts(path) for kind, path in models.items()}
        train_counts = counted(commands["imap"])  # untimed: its round trips and bytes
        same_model = facts["imap"] == facts["maildir"]

        # -- 2. one filter pass --------------------------------------------------------------
        model = models["maildir"]
        state = Path(str(model) + ".imap.json")
        sortdir = tmp / "sort"
        filter_cmd = [args.spamnb, "imap", "filter", *account, "--model", str(model)]
        sort_cmd = [args.spamnb, "sort", str(sortdir), "--model", str(model)]
        with d.client() as c:
            empty_folder(c, "Junk")  # the training spam: the pass must have nothing to baseline

        def imap_ready(messages):
            state.unlink(missing_ok=True)
            with d.client() as c:
                empty_folder(c, "INBOX")
                empty_folder(c, "Junk")
                append_all(c, "INBOX", messages)

        outputs = {}

        def filter_run(kind):
            if kind == "imap":
                imap_ready(new)
                wall, cpu, text = runner.run(filter_cmd)
                with d.client() as c:
                    outputs[kind] = (last_line(text), count_in(c, "Junk"))
            else:
                write_maildir(sortdir, new, sub="new")
                wall, cpu, text = runner.run(sort_cmd)
                junk = sortdir / ".Junk"
                outputs[kind] = (last_line(text), sum(1 for _ in junk.glob("*/*")) if junk.exists() else 0)
            return wall, cpu

        print(f"one filter pass over {len(new)} new messages, {args.runs} runs each, alternating",
              file=sys.stderr, flush=True)
        filter_times, filter_cpu = interleaved(args.runs, filter_run)

        # -- 3. round trips, counted in untimed passes ----------------------------------------
        imap_ready([])
        empty = counted(filter_cmd)
        imap_ready(new)
        full = counted(filter_cmd)
        fixed, total = empty["tags"], full["tags"]
        per100 = (total - fixed) / len(new) * 100
        per1000 = fixed + (total - fixed) / len(new) * 1000  # a pass of 1,000 new messages

        # -- the report -------------------------------------------------------------------------
        tmed, tpaired = summarise(train_times)
        fmed, fpaired = summarise(filter_times)
        load = os.getloadavg()
        print()
        print(f"spamnb = {args.spamnb}; --n {args.n} --new {args.new} --runs {args.runs} --seed {args.seed}; "
              f"load average at the end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1 / 5 / 15 min)")
        print()
        print("| measure | IMAP (127.0.0.1) s | maildir s | ratio of medians | median of paired ratios |")
        print("|---|---:|---:|---:|---:|")
        print(f"| train on {args.n} messages | {tmed['imap']:.2f} | {tmed['maildir']:.2f} | "
              f"{tmed['imap'] / tmed['maildir']:.2f} | {tpaired:.2f} |")
        print(f"| filter pass over {len(new)} new | {fmed['imap']:.2f} | {fmed['maildir']:.2f} | "
              f"{fmed['imap'] / fmed['maildir']:.2f} | {fpaired:.2f} |")
        print()
        print(f"CPU seconds of the spamnb process (medians): train {statistics.median(train_cpu['imap']):.2f} "
              f"IMAP / {statistics.median(train_cpu['maildir']):.2f} maildir; filter pass "
              f"{statistics.median(filter_cpu['imap']):.2f} / {statistics.median(filter_cpu['maildir']):.2f}")
        fi, fm = facts["imap"], facts["maildir"]
        print(f"models: IMAP {fi}, maildir {fm}: " + ("the same" if same_model else (
            "the same messages per class, " if (fi["ham"], fi["spam"]) == (fm["ham"], fm["spam"]) else "DIFFERENT: ")
            + f"vocabularies differ by {fi['vocabulary'] - fm['vocabulary']:+d} tokens (see the docstring)"))
        print(f"filter pass: IMAP '{outputs['imap'][0]}', {outputs['imap'][1]} in Junk; "
              f"sort '{outputs['maildir'][0]}', {outputs['maildir'][1]} in .Junk")
        print()
        print(f"round trips of the filter pass (tagged commands): {total} for {len(new)} new messages, "
              f"{fixed} for an empty pass: {per100:.1f} per 100 messages beyond the fixed {fixed}")
        print(f"  commands of the pass: {json.dumps(dict(sorted(full['commands'].items())))}")
        print(f"  bytes: received {full['received']:,} (the new messages: {new_bytes:,} as stored), "
              f"sent {full['sent']:,}")
        print(f"estimate for a remote provider, a pass of 1,000 new messages ({per1000:.0f} round trips; "
              "connection set-up, the server's own time and the transfer of the bytes come on top):")
        for rtt in RTTS_MS:
            print(f"  RTT {rtt} ms: + {per1000 * rtt / 1000:.1f} s")
        received_per1000 = full["received"] / len(new) * 1000
        print(f"  transfer: {received_per1000 / 1e6:.1f} MB per 1,000 messages received: "
              f"{received_per1000 * 8 / 10e6:.1f} s at 10 Mbit/s, {received_per1000 * 8 / 100e6:.1f} s at 100 Mbit/s")
        tc = train_counts["tags"]
        print(f"round trips of training on {args.n} messages: {tc} "
              f"({json.dumps(dict(sorted(train_counts['commands'].items())))}); received "
              f"{train_counts['received']:,} bytes ({train_bytes:,} as stored): estimate at RTT "
              + ", ".join(f"{rtt} ms + {tc * rtt / 1000:.1f} s" for rtt in RTTS_MS)
              + f", transfer {train_counts['received'] * 8 / 10e6:.0f} s at 10 Mbit/s")
        if args.json:
            figures = {
                "args": vars(args), "load": load, "train": {"times": train_times, "cpu": train_cpu, "models": facts},
                "filter": {"times": filter_times, "cpu": filter_cpu, "outputs": outputs},
                "round_trips": {"train": train_counts, "empty_pass": empty, "pass": full, "per_100": per100,
                                "per_1000_pass": per1000},
                "bytes": {"train": train_bytes, "new": new_bytes},
            }
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    except KeyboardInterrupt:
        print("\nbench_imap: interrupted; cleaning up", file=sys.stderr)
        sys.exit(130)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the clean-up is not cut short
        runner.stop()
        if d is not None:
            d.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
