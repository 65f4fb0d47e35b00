#!/usr/bin/env python3
"""What recording the history costs a delivery through ``spamnb serve`` (issue 31).

Two servers on the same model, one with its history (``MODEL.history.sqlite``,
the default) and one with ``--no-history``, each on its own private socket
and with ``--spamd`` on its own loopback port. The messages are the shipped
held-out maildir (``corpora/sample-maildir``, 103 messages), each sent as
``spamnb filter`` sends it (the wire protocol, from this process: no process
start in the figure) and as ``spamc -c`` sends it (a spamd ``CHECK``).

Each round sends every message to one server, then to the other (the order
alternates between rounds, so a drift in the machine's load hits both); the
per-message time of a server is its pass's wall time over the messages, so a
history writer that falls behind shows in the passes that follow. The figure
is the median over rounds of (history on) / (history off); the goal is at most
1.1. A third line (``--cold N``) times ``spamnb filter`` without a server, a
process per message, which then opens the history and writes its row itself:
each of N messages on and off in turn every round, the median of the
per-message ratios.
The rows recorded are counted at the end (every message of every round of
the "on" server, none of the other).

Usage::

    python3 tools/benchmarks/bench_history.py              # 15 rounds
    python3 tools/benchmarks/bench_history.py --rounds 30 --model M.joblib

Without ``--model`` a model is trained on the shipped corpus first (about 30 s,
not timed).
"""

from __future__ import annotations

import argparse
import compileall
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from spamnb.delivery import fastfilter  # noqa: E402
from tools.harnesses.exim_spamd import free_port, spamd_check, start_serve, stop  # noqa: E402


def spamnb_cmd():
    exe = Path(sys.executable).with_name("spamnb")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "spamnb"]


def via_wire(sock, model, raw):
    opts = fastfilter.parse_args(["--model", str(model)])
    fastfilter.via_server(str(sock), raw, str(model), False, opts)


def one_pass(send, messages):
    t = time.perf_counter()
    for raw in messages:
        send(raw)
    return (time.perf_counter() - t) / len(messages)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--cold", type=int, default=20, metavar="N",
                    help="also time N messages through `spamnb filter` without a server, one process each "
                         "(its history written by the process itself; 0: skip)")
    ap.add_argument("--model", type=Path, help="a trained model (default: train one on the shipped corpus)")
    args = ap.parse_args()
    if args.model and not args.model.is_file():
        raise SystemExit(f"bench_history.py: --model {args.model}: no such file")
    # the bytecode an installed package has: under PYTHONDONTWRITEBYTECODE each process would compile
    # whatever changed since the last compile, and time that
    compileall.compile_dir(str(ROOT / "spamnb"), quiet=1)
    messages = [p.read_bytes() for p in sorted((ROOT / "corpora" / "sample-maildir" / "cur").iterdir())]
    with tempfile.TemporaryDirectory(prefix="bench-history-") as tmp:
        tmp = Path(tmp)
        os.chmod(tmp, 0o700)
        model = tmp / "model.joblib"
        if args.model:
            subprocess.run(["cp", str(args.model), str(model)], check=True)
            for ext in (".scorer",):
                if Path(str(args.model) + ext).exists():
                    subprocess.run(["cp", str(args.model) + ext, str(model) + ext], check=True)
        else:
            print("training a model on the shipped corpus (not timed)...", file=sys.stderr)
            subprocess.run(spamnb_cmd() + ["train", "--index", str(ROOT / "corpora" / "spamassassin.tar.xz"),
                                           "--model", str(model)], check=True, stderr=subprocess.DEVNULL)
        on_port, off_port = free_port(), free_port()
        for name in ("on", "off"):
            (tmp / name).mkdir()
        procs, note = [], lambda line: print(line, file=sys.stderr)
        try:  # each server's socket is DIR/run/sock, its log DIR/serve.log
            procs.append(start_serve(spamnb_cmd(), model, tmp / "on", on_port, note))
            procs.append(start_serve(spamnb_cmd(), model, tmp / "off", off_port, note, ["--no-history"]))
            servers = {"on": (tmp / "on" / "run" / "sock", on_port), "off": (tmp / "off" / "run" / "sock", off_port)}
            for sock, port in servers.values():  # warm up: the model's pages, the history's file
                one_pass(lambda raw: via_wire(sock, model, raw), messages[:10])
                one_pass(lambda raw: spamd_check(port, raw), messages[:10])
            times = {(proto, name): [] for proto in ("filter", "spamd") for name in servers}
            for r in range(args.rounds):
                order = ["on", "off"] if r % 2 == 0 else ["off", "on"]
                for proto in ("filter", "spamd"):
                    for name in order:
                        sock, port = servers[name]
                        send = ((lambda raw: via_wire(sock, model, raw)) if proto == "filter"
                                else (lambda raw: spamd_check(port, raw)))
                        times[(proto, name)].append(one_pass(send, messages))
        except RuntimeError as e:  # a server that did not start, or a spamd reply without a verdict
            raise SystemExit(f"bench_history.py: {e}") from None
        finally:
            for proc in procs:
                stop(proc, timeout=60)  # the history's last rows written before they are counted
        cold_env = {**os.environ, "SPAMNB_SOCKET": str(tmp / "no-server" / "socket")}
        flags = {"on": ["--history", str(tmp / "cold.sqlite")], "off": ["--no-history"]}
        for r in range(args.rounds if args.cold else 0):  # paired: each message on and off, in turn
            for i, raw in enumerate(messages[:args.cold]):
                for name in (["on", "off"] if (r + i) % 2 == 0 else ["off", "on"]):
                    times.setdefault(("cold", name), []).append(one_pass(
                        lambda raw: subprocess.run(spamnb_cmd() + ["filter", "--model", str(model), *flags[name]],
                                                   input=raw, stdout=subprocess.DEVNULL, env=cold_env), [raw]))
        db = sqlite3.connect(str(model) + ".history.sqlite")
        recorded = db.execute("SELECT count(*) FROM verdicts").fetchone()[0]
        db.close()
    expected = 2 * len(messages) * args.rounds + 2 * 10  # and the warm-up's
    print(f"{len(messages)} messages x {args.rounds} rounds; load average {os.getloadavg()[0]:.1f}")
    print(f"{'protocol':<8} {'history off':>12} {'history on':>12} {'on/off (median of pairs)':>27}")
    worst = 0.0
    for proto in ("filter", "spamd", "cold")[:3 if args.cold else 2]:
        off_t, on_t = times[(proto, "off")], times[(proto, "on")]
        ratio = statistics.median(a / b for a, b in zip(on_t, off_t))  # per round; cold: per message
        if proto != "cold":  # the goal is the server's; the cold line is for information
            worst = max(worst, ratio)
        print(f"{proto:<8} {statistics.median(off_t) * 1e3:>9.2f} ms {statistics.median(on_t) * 1e3:>9.2f} ms "
              f"{ratio:>27.3f}")
    print(f"rows recorded by the 'on' server: {recorded} of {expected} sent to it")
    print(f"goal (serve, both protocols): at most 1.10 -> {'met' if worst <= 1.10 else 'NOT met'} "
          f"(worst {worst:.3f})")


if __name__ == "__main__":
    main()
