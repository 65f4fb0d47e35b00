#!/usr/bin/env python3
"""``spamc -c`` through ``spamnb serve --spamd`` against SpamAssassin's ``spamd -L``.

What a Postfix or procmail setup runs: a new ``spamc -c`` process per message,
the message on stdin, ``SCORE/THRESHOLD`` and exit status 1 (spam) or 0 (not)
back. Two servers answer on loopback, on the same held-out messages:

* ``spamnb``: ``spamnb serve --spamd 127.0.0.1:PORT`` with a model trained on
  the shared SpamAssassin corpus (``../shared/corpora/spamassassin/index``)
  minus the held-out messages (the training is not timed);
* ``spamd``: ``spamd -L`` (local tests only, no network; its stock rules, no
  Bayes database) on PORT+1, with one child per concurrent client.

Measured in one run (the machine is shared: only ratios of paired runs mean much):

1. latency: each held-out message sent once to each server, one ``spamc -c``
   process each, interleaved message by message (which server goes first
   alternates), after untimed warm-up messages (two per client, concurrently). Median and p90 ms per
   message, and the median of the per-message ratios spamnb/spamd (the
   target: at most 0.1).
2. throughput: ``--concurrency`` threads each running ``spamc -c`` over its
   share of the messages, one pass per server in the order spamnb, spamd,
   spamd, spamnb (so a drift in load hits both); messages per second over the
   two passes, and the ratio spamnb/spamd (higher is better for spamnb).

Every answer is checked (exit status 0 or 1, output ``S/T`` with T > 0: spamc
says ``0/0`` when it reached no server); the spam counts by each server are a
sanity line, not an accuracy claim (spamd runs without Bayes or network tests).

Usage::

    python3 tools/benchmarks/bench_spamd.py                     # 200 held-out messages
    python3 tools/benchmarks/bench_spamd.py --n 400 --seed 2 --port 17831 --concurrency 8

Needs ``spamc`` and ``spamd`` (Debian: ``apt-get install spamc spamd``); as
root, spamd runs as ``nobody``. Both servers are stopped on exit and on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the project: spamnb, tools

from tools import shared_corpora  # noqa: E402
from tools.benchmarks.bench_learning import default_spamnb  # noqa: E402
from tools.harnesses.exim_spamd import stop, wait_for  # noqa: E402 (waiting for a server, stopping it: one definition)

ANSWER = re.compile(rb"(-?\d+(?:\.\d+)?)/(\d+(?:\.\d+)?)\n\Z")
WARM_UP = 2  # untimed messages per client before the measures


def split_corpus(index, n, seed, train_dir):
    """Pick ``n`` held-out messages of the index at random; write the rest as a
    training index of its own (files linked, or copied, into ``train_dir``).
    Returns the held-out [(label, path)]."""
    folder = index.parent
    lines = [line.split() for line in index.read_text().splitlines() if line.strip()]
    held = set(random.Random(seed).sample(range(len(lines)), n))
    rows = []
    for i, (label, rel) in enumerate(lines):
        if i in held:
            continue
        dest = train_dir / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(folder / rel, dest)
        except OSError:
            shutil.copyfile(folder / rel, dest)
        rows.append(f"{label} {rel}\n")
    (train_dir / "index").write_text("".join(rows))
    return [(lines[i][0], folder / lines[i][1]) for i in sorted(held)]


def spamc(port, message, *options):
    """One ``spamc`` process (``options``; none: ``-c``) on ``message``, a path or the
    message itself: (seconds, exit status, output)."""
    raw = message if isinstance(message, bytes) else None
    with open(message, "rb") if raw is None else contextlib.nullcontext() as f:
        t = time.perf_counter()
        proc = subprocess.run(["spamc", "-d", "127.0.0.1", "-p", str(port), *(options or ("-c",))], stdin=f,
                              input=raw, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        return time.perf_counter() - t, proc.returncode, proc.stdout


def answered(code, out):
    """Whether spamc got a verdict: exit 0/1 and ``S/T`` with a real threshold."""
    m = ANSWER.match(out)
    return code in (0, 1) and m is not None and float(m.group(2)) > 0


def port_free(port):
    """Whether nothing listens on 127.0.0.1:``port`` (else ``spamc -K`` would find another server)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def wait_ready(name, proc, port, log, t):
    """Wait until the server started at ``t`` answers ``spamc -K`` (180 s after ``t``); exit
    with its log's tail if it does not."""
    try:
        wait_for(f"{name} on port {port}", lambda: subprocess.run(
            ["spamc", "-d", "127.0.0.1", "-p", str(port), "-K"], capture_output=True).returncode == 0,
            proc, Path(log.name), timeout=180 - (time.perf_counter() - t))
    except RuntimeError as e:
        sys.exit(f"{Path(sys.argv[0]).name}: {e}")
    print(f"{name} answers on port {port} {time.perf_counter() - t:.1f} s after its start", file=sys.stderr)


def throughput(port, messages, concurrency):
    """``concurrency`` threads each running ``spamc -c`` over its share of the messages
    (paths, or the messages themselves): (seconds, [(code, out)])."""
    results = [None] * len(messages)

    def work(k):
        for i in range(k, len(messages), concurrency):
            results[i] = spamc(port, messages[i])[1:]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(concurrency)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return time.perf_counter() - t, results


def ms(seconds):
    return f"{1000 * seconds:.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200, help="held-out messages (each sent once per measure)")
    ap.add_argument("--seed", type=int, default=1, help="picks the held-out messages")
    ap.add_argument("--port", type=int, default=17831, help="spamnb's port; spamd gets the next one")
    ap.add_argument("--concurrency", type=int, default=8, help="spamc clients at once for the throughput")
    ap.add_argument("--spamnb", default=default_spamnb(), help="spamnb console script to measure")
    ap.add_argument("--corpus", default=str(shared_corpora.SPAMASSASSIN), help="a folder with a TREC index")
    args = ap.parse_args()
    for tool in ("spamc", "spamd"):
        if shutil.which(tool) is None:
            sys.exit(f"bench_spamd.py: {tool} is not installed (apt-get install spamc spamd)")
    index = Path(shared_corpora.require(args.corpus, option="--corpus"))
    ports = {"spamnb": args.port, "spamd": args.port + 1}
    busy = [str(port) for port in ports.values() if not port_free(port)]
    if busy:
        sys.exit(f"bench_spamd.py: port {', '.join(busy)} of 127.0.0.1 is in use: give another --port")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the finally below stops the servers

    tmp = Path(tempfile.mkdtemp(prefix="bench-spamd-"))
    servers, logs, keep = [], {}, False
    try:
        tests = split_corpus(index, args.n, args.seed, tmp / "train")
        model = tmp / "model" / "model.joblib"
        t = time.perf_counter()
        subprocess.run([args.spamnb, "train", "--index", str(tmp / "train" / "index"), "--model", str(model)],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print(f"trained spamnb on {index} minus the {args.n} held-out messages in "
              f"{time.perf_counter() - t:.1f} s", file=sys.stderr)

        run = tmp / "run"
        run.mkdir()
        user = ["-u", "nobody"] if os.geteuid() == 0 else []
        commands = {
            "spamnb": [args.spamnb, "serve", "--model", str(model), "--socket", str(tmp / "sock" / "socket"),
                       "--spamd", f"127.0.0.1:{ports['spamnb']}"],
            "spamd": ["spamd", "-L", *user, "--nouser-config", "-i", "127.0.0.1", "-p", str(ports["spamd"]),
                      "-m", str(args.concurrency), "--min-children", str(args.concurrency),
                      "--pidfile", str(run / "spamd.pid"), "-s", "stderr"],
        }
        logs.update({name: open(tmp / f"{name}.log", "wb") for name in commands})
        t = time.perf_counter()
        for name, cmd in commands.items():  # each in a process group of its own, for stop()
            servers.append(subprocess.Popen(cmd, stdout=logs[name], stderr=logs[name], start_new_session=True))
        for name, proc in zip(commands, servers):
            wait_ready(name, proc, ports[name], logs[name], t)

        paths = [p for _, p in tests]
        for name in commands:  # untimed: every spamd child (and spamnb thread) answers a few first
            throughput(ports[name], paths[:WARM_UP * args.concurrency], args.concurrency)
        load = os.getloadavg()[0]

        # 1. latency, interleaved message by message
        times = {name: [] for name in commands}
        verdicts = {name: [] for name in commands}
        failures = {name: 0 for name in commands}
        for i, p in enumerate(paths):
            for name in (("spamnb", "spamd") if i % 2 == 0 else ("spamd", "spamnb")):
                dt, code, out = spamc(ports[name], p)
                times[name].append(dt)
                verdicts[name].append(code)
                failures[name] += not answered(code, out)

        # 2. throughput, ABBA
        walls = {name: 0.0 for name in commands}
        for name in ("spamnb", "spamd", "spamd", "spamnb"):
            wall, results = throughput(ports[name], paths, args.concurrency)
            walls[name] += wall
            failures[name] += sum(not answered(code, out) for code, out in results)

        n_spam = sum(label == "spam" for label, _ in tests)
        ratio = statistics.median(a / b for a, b in zip(times["spamnb"], times["spamd"]))
        rate = {name: 2 * len(paths) / walls[name] for name in commands}
        print(f"\n{len(paths)} held-out messages of {index} ({n_spam} spam by its labels), seed {args.seed}; "
              f"one `spamc -c` process per message; load average {load:.1f} at the start, "
              f"{os.getloadavg()[0]:.1f} at the end\n")
        print(f"| server | median ms | p90 ms | messages/s, {args.concurrency} clients |")
        print("|---|---:|---:|---:|")
        for name in commands:
            p90 = statistics.quantiles(times[name], n=10)[-1]
            print(f"| {name} | {ms(statistics.median(times[name]))} | {ms(p90)} | {rate[name]:.1f} |")
        print(f"\nspamnb/spamd: median of the per-message latency ratios {ratio:.3f} "
              f"(target <= 0.1: {'met' if ratio <= 0.1 else 'NOT met'}); "
              f"throughput {rate['spamnb'] / rate['spamd']:.1f}x")
        spam = {name: sum(code == 1 for code in verdicts[name]) for name in commands}
        print(f"sanity: spam by spamnb {spam['spamnb']}, by spamd {spam['spamd']} of {len(paths)}; answers that "
              f"were not a verdict: spamnb {failures['spamnb']}, spamd {failures['spamd']} (of {3 * len(paths)} each)")
        if any(failures.values()):
            keep = True
            sys.exit(f"bench_spamd.py: some answers were not verdicts; the servers' logs: {tmp}/*.log")
    finally:
        for proc in servers:
            stop(proc)
        for log in logs.values():
            log.close()
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)

if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # the servers are stopped by then
        sys.exit("bench_spamd.py: interrupted")
