#!/usr/bin/env python3
"""What the line per message costs the server (the budget: at most 5% of its per-message time).

Measured in one run, two ways (the machine is shared: only ratios of paired runs mean much):

1. beside ``spamc -c``, as a mail system sees it: two ``spamnb serve --spamd``
   servers on the same model, one writing a line per message (to a file, as
   journald would take it), one with ``--no-log-messages``; each test message
   goes once to each, one ``spamc -c`` process each, interleaved message by
   message (which server goes first alternates). The median of the per-message
   ratios logged/silent, and of the times.
2. in the server alone, without the process start that dominates (1): the
   spamd answer to a CHECK (:func:`spamnb.delivery.spamd_protocol.answer`: model lookup,
   tokenizing, scoring, the reply) with the line written to a file versus with
   no recorder, paired message by message (which goes first alternates), five
   rounds; the ratio of the totals. This
   is the strict form of the budget: the line against the server's own work.

``--metrics``: both servers (and the recorder of (2)) also count the Prometheus
metrics (``serve --metrics``), as a site runs them. ``--against SPAMNB``: before
and after a change, the second server is that other build (say the main branch's)
writing its lines too (and its metrics with ``--metrics``), instead of a silent
one: (1) is then the ratio this build / that build, alternated message by message,
and (2) is left out (it runs this build's code only).

Usage::

    python3 tools/benchmarks/bench_logging.py                  # 200 messages of the shared SpamAssassin corpus
    python3 tools/benchmarks/bench_logging.py --n 400 --port 17841
    python3 tools/benchmarks/bench_logging.py --metrics --against /path/to/main/.venv/bin/spamnb

Needs ``spamc`` (Debian: ``apt-get install spamc``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the project: spamnb, tools

from tools import shared_corpora  # noqa: E402
from tools.benchmarks.bench_learning import default_spamnb  # noqa: E402
from tools.benchmarks.bench_spamd import answered, port_free, spamc, split_corpus, wait_ready  # noqa: E402
from tools.harnesses.exim_spamd import stop  # noqa: E402

BUDGET = 1.05


def in_process(model, paths, log_path, rounds=5, metrics=None):
    """``(seconds silent, seconds logged)`` of spamd_protocol.answer over ``paths``, ``rounds`` times each, alternating;
    ``metrics``: a listen address, to count the metrics as well as write the line."""
    from spamnb.delivery import events, spamd_protocol, usermodels
    from spamnb.storage.filestore import FileBackend

    backend = FileBackend(str(model)).resident()
    backend.view()
    raws = [p.read_bytes() for p in paths]
    sink = open(log_path, "a", buffering=1)
    meter = None
    if metrics:
        from spamnb.delivery.metrics import Metrics

        meter = Metrics(metrics)
    models = {"silent": usermodels.Models(backend), "logged": usermodels.Models(backend, recorder=events.Recorder(
        write=lambda line: sink.write(line + "\n"), metrics=meter))}
    for m in models.values():  # warm up
        for raw in raws[:20]:
            spamd_protocol.answer("CHECK", (1, 5), {"User": "alice"}, raw, m)
    total = {name: 0.0 for name in models}
    for r in range(rounds):  # paired message by message; which goes first alternates
        for i, raw in enumerate(raws):
            for name in (("silent", "logged") if (i + r) % 2 == 0 else ("logged", "silent")):
                t = time.perf_counter()
                spamd_protocol.answer("CHECK", (1, 5), {"User": "alice"}, raw, models[name])
                total[name] += time.perf_counter() - t
    sink.close()
    return total["silent"], total["logged"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200, help="test messages (each sent once to each server)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--port", type=int, default=17841, help="the logging server's port; the silent one gets the next")
    ap.add_argument("--spamnb", default=default_spamnb(), help="spamnb console script to measure")
    ap.add_argument("--corpus", default=str(shared_corpora.SPAMASSASSIN), help="a folder with a TREC index")
    ap.add_argument("--metrics", action="store_true", help="count the Prometheus metrics too (serve --metrics)")
    ap.add_argument("--against", metavar="SPAMNB", help="the second server is this other build, logging too "
                                                        "(before/after a change), not a silent one")
    args = ap.parse_args()
    if shutil.which("spamc") is None:
        sys.exit("bench_logging.py: spamc is not installed (apt-get install spamc)")
    index = Path(shared_corpora.require(args.corpus, option="--corpus"))
    ports = {"logged": args.port, "silent": args.port + 1}
    busy = [str(p) for p in ports.values() if not port_free(p)]
    if busy:
        sys.exit(f"bench_logging.py: port {', '.join(busy)} of 127.0.0.1 is in use: give another --port")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tmp = Path(tempfile.mkdtemp(prefix="bench-logging-"))
    servers = []
    try:
        tests = split_corpus(index, args.n, args.seed, tmp / "train")
        model = tmp / "model" / "model.joblib"
        subprocess.run([args.spamnb, "train", "--index", str(tmp / "train" / "index"), "--model", str(model)],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        logs = {}
        t = time.perf_counter()
        for k, (name, port) in enumerate(ports.items()):
            flag = "--log-messages" if name == "logged" or args.against else "--no-log-messages"
            extra = ["--metrics", f"127.0.0.1:{args.port + 2 + k}"] if args.metrics else []
            logs[name] = open(tmp / f"{name}.log", "wb")
            program = args.against if name == "silent" and args.against else args.spamnb
            servers.append(subprocess.Popen(
                [program, "serve", "--model", str(model), "--socket", str(tmp / name / "socket"),
                 "--spamd", f"127.0.0.1:{port}", flag, *extra], stdout=logs[name], stderr=logs[name],
                start_new_session=True))
        for (name, port), proc in zip(ports.items(), servers):
            wait_ready(name, proc, port, logs[name], t)
        paths = [p for _, p in tests]
        for name in ports:  # untimed warm-up
            for p in paths[:10]:
                spamc(ports[name], p)
        times = {name: [] for name in ports}
        failures = 0
        for i, p in enumerate(paths):
            for name in (("logged", "silent") if i % 2 == 0 else ("silent", "logged")):
                dt, code, out = spamc(ports[name], p)
                times[name].append(dt)
                failures += not answered(code, out)
        lines = sum(1 for line in open(tmp / "logged.log", errors="replace") if " event=message " in line)
        ratios = [a / b for a, b in zip(times["logged"], times["silent"])]
        if args.against:
            print(f"{len(paths)} messages, load {os.getloadavg()[0]:.2f}; {lines} lines logged by this build; "
                  f"{failures} unanswered; metrics {'on' if args.metrics else 'off'}")
            print(f"spamc -c, median ms per message: this build {1000 * statistics.median(times['logged']):.2f}, "
                  f"{args.against} {1000 * statistics.median(times['silent']):.2f}; "
                  f"median per-message ratio this/that {statistics.median(ratios):.3f}")
            return 0 if not failures else 1
        silent, logged = in_process(model, paths, tmp / "inproc.log",
                                    metrics=f"127.0.0.1:{args.port + 4}" if args.metrics else None)
        per = len(paths) * 5
        print(f"{len(paths)} messages, load {os.getloadavg()[0]:.2f}; {lines} lines logged; {failures} unanswered")
        print(f"spamc -c, median ms per message: logged {1000 * statistics.median(times['logged']):.2f}, "
              f"silent {1000 * statistics.median(times['silent']):.2f}; "
              f"median per-message ratio logged/silent {statistics.median(ratios):.3f}")
        print(f"in the server (spamd_protocol.answer), us per message: logged {1e6 * logged / per:.1f}, "
              f"silent {1e6 * silent / per:.1f}; ratio {logged / silent:.3f} (budget {BUDGET})")
        ok = statistics.median(ratios) <= BUDGET and logged / silent <= BUDGET and not failures
        print("within the budget" if ok else "OVER the budget")
        return 0 if ok else 1
    finally:
        for proc in servers:
            stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
