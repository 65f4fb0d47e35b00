#!/usr/bin/env python3
"""What recording the history costs a delivery through ``spamnb serve``.

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

With ``--store`` the two servers share a Redis store instead (a private
``redis-server`` on a Unix socket, started here; the model pushed into it): one
records its history in the store (``--history-store``), the other none; the
spamd protocol only (``spamnb filter`` asks a store itself, not the server).
Each round's pass is also timed per message by the spread of the per-round
ratios (their quartiles), printed beside the median.

Usage::

    python3 tools/benchmarks/bench_history.py              # 15 rounds
    python3 tools/benchmarks/bench_history.py --rounds 30 --model M.joblib
    python3 tools/benchmarks/bench_history.py --store --rounds 40 --cold 0

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


def start_redis(tmp, model):
    """A private redis-server on a Unix socket in ``tmp`` with ``model`` pushed into it:
    ``(process, store URL)``."""
    import shutil

    from spamnb.storage.filestore import FileBackend
    from spamnb.storage.redisstore import RedisBackend

    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit("bench_history.py: --store needs redis-server (apt-get install redis-server)")
    sock = tmp / "redis.sock"
    proc = subprocess.Popen([server, "--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700",
                             "--save", "", "--appendonly", "no", "--dir", str(tmp)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"unix://{sock}?prefix=bench:"
    deadline = time.monotonic() + 20
    while not sock.exists():
        if time.monotonic() > deadline:
            proc.terminate()
            raise SystemExit("bench_history.py: redis-server did not start")
        time.sleep(0.05)
    time.sleep(0.2)
    RedisBackend.from_url(url).replace(FileBackend(model).model())
    return proc, url


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
    ap.add_argument("--store", action="store_true",
                    help="the history in a Redis store (a private redis-server) against none, spamd only")
    args = ap.parse_args()
    if args.store:
        args.cold = 0
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
        protos = ("spamd",) if args.store else ("filter", "spamd")
        try:  # each server's socket is DIR/run/sock, its log DIR/serve.log
            if args.store:
                redis_proc, url = start_redis(tmp, model)
                procs.append(redis_proc)
                on, off = ["--store", url, "--history-store"], ["--store", url, "--no-history"]
                served = None
            else:
                on, off, served = [], ["--no-history"], model
            procs.insert(0, start_serve(spamnb_cmd(), served, tmp / "on", on_port, note, on))
            procs.insert(0, start_serve(spamnb_cmd(), served, tmp / "off", off_port, note, off))
            servers = {"on": (tmp / "on" / "run" / "sock", on_port), "off": (tmp / "off" / "run" / "sock", off_port)}
            for sock, port in servers.values():  # warm up: the model's pages, the history's file
                if not args.store:
                    one_pass(lambda raw: via_wire(sock, model, raw), messages[:10])
                one_pass(lambda raw: spamd_check(port, raw), messages[:10])
            times = {(proto, name): [] for proto in protos for name in servers}
            for r in range(args.rounds):
                order = ["on", "off"] if r % 2 == 0 else ["off", "on"]
                for proto in protos:
                    for name in order:
                        sock, port = servers[name]
                        send = ((lambda raw: via_wire(sock, model, raw)) if proto == "filter"
                                else (lambda raw: spamd_check(port, raw)))
                        times[(proto, name)].append(one_pass(send, messages))
        except RuntimeError as e:  # a server that did not start, or a spamd reply without a verdict
            raise SystemExit(f"bench_history.py: {e}") from None
        finally:
            for proc in procs[:2] if args.store else procs:
                stop(proc, timeout=60)  # the history's last rows written before they are counted
        cold_env = {**os.environ, "SPAMNB_SOCKET": str(tmp / "no-server" / "socket")}
        flags = {"on": ["--history", str(tmp / "cold.sqlite")], "off": ["--no-history"]}
        for r in range(args.rounds if args.cold else 0):  # paired: each message on and off, in turn
            for i, raw in enumerate(messages[:args.cold]):
                for name in (["on", "off"] if (r + i) % 2 == 0 else ["off", "on"]):
                    times.setdefault(("cold", name), []).append(one_pass(
                        lambda raw: subprocess.run(spamnb_cmd() + ["filter", "--model", str(model), *flags[name]],
                                                   input=raw, stdout=subprocess.DEVNULL, env=cold_env), [raw]))
        if args.store:
            from spamnb.storage.redishistory import RedisHistory
            from spamnb.storage.redisstore import RedisBackend

            recorded = RedisHistory(RedisBackend.from_url(url)).count()
            stop(procs[2])
        else:
            db = sqlite3.connect(str(model) + ".history.sqlite")
            recorded = db.execute("SELECT count(*) FROM verdicts").fetchone()[0]
            db.close()
    expected = len(protos) * len(messages) * args.rounds + len(protos) * 10  # and the warm-up's
    print(f"{len(messages)} messages x {args.rounds} rounds; load average {os.getloadavg()[0]:.1f}")
    print(f"history {'in the store (--history-store)' if args.store else 'in MODEL.history.sqlite'}")
    print(f"{'protocol':<8} {'history off':>12} {'history on':>12} {'on/off (median of pairs)':>27} "
          f"{'quartiles':>15} {'median +-':>10}")
    worst = 0.0
    for proto in (*protos, "cold")[:len(protos) + (1 if args.cold else 0)]:
        off_t, on_t = times[(proto, "off")], times[(proto, "on")]
        ratios = [a / b for a, b in zip(on_t, off_t)]  # per round; cold: per message
        ratio = statistics.median(ratios)
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratio] * 3
        # the median's own noise: 1.2533 sigma / sqrt(n), sigma estimated from the quartiles (IQR / 1.349)
        noise = 1.2533 * (q[2] - q[0]) / 1.349 / len(ratios) ** 0.5
        if proto != "cold":  # the goal is the server's; the cold line is for information
            worst = max(worst, ratio)
        print(f"{proto:<8} {statistics.median(off_t) * 1e3:>9.2f} ms {statistics.median(on_t) * 1e3:>9.2f} ms "
              f"{ratio:>27.3f} {q[0]:>7.3f}-{q[2]:<7.3f} {noise:>10.3f}")
    print(f"rows recorded by the 'on' server: {recorded} of {expected} sent to it")
    print(f"goal (serve, both protocols): at most 1.10 -> {'met' if worst <= 1.10 else 'NOT met'} "
          f"(worst {worst:.3f})")


if __name__ == "__main__":
    main()
