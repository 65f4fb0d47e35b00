#!/usr/bin/env python3
"""The Redis store against the model file, through ``spamc`` (docs/many-hosts.md).

Two ``spamnb serve --spamd`` servers on loopback answer the same messages: one
with the model file (``--model``), one with the same model pushed to a private
``redis-server`` (``--store unix://...``, started here on a Unix socket in a
temporary folder, no persistence). Measured in one run (the machine may be
shared: the ratios of paired runs are the figures):

1. latency: each message of the shipped held-out maildir (corpora/sample-maildir)
   sent once to each server by a ``spamc -c`` process, interleaved (which server
   goes first alternates); median ms and the median per-message ratio store/file
   (the goal: at most 1.5);
2. throughput: ``--concurrency`` (8) threads running ``spamc -c`` over the
   messages, a pass per server in the order file, store, store, file; messages
   per second and the ratio store/file;
3. learn latency: ``spamc -L spam`` (TELL) of ``--learn`` messages the model has
   not learned (held-out ones with a line added), to each server (file: the journal; store: one script call);
4. memory per stored token: ``used_memory`` of ``INFO memory`` after the push
   minus before it, over the vocabulary (rspamd's users report about 100 bytes);
5. round trips per message: ``INFO commandstats`` over the latency pass: the
   EVALSHA calls per message (commands run inside a script are not round trips).

With ``--sentinel`` the store is a Sentinel group instead (a primary, a replica and a
Sentinel on private loopback ports, ``redis+sentinel://`` URL,
tools/harnesses/redis_sentinel.py): classifications read the replica (its
``INFO commandstats`` counts them), and each TELL waits for the replica (``WAIT 1``).

Usage::

    python tools/benchmarks/bench_store.py                  # trains on corpora/spamassassin.tar.xz first
    python tools/benchmarks/bench_store.py --model model.joblib --concurrency 8
    python tools/benchmarks/bench_store.py --model model.joblib --sentinel

Needs ``spamc`` and ``redis-server`` (Debian: ``apt-get install spamc redis-server``;
``--sentinel``: ``redis-sentinel`` too) and the redis package (``pip install 'spamnb[redis]'``).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the project: spamnb, tools
SPAMNB = [sys.executable, "-m", "spamnb"]

from tools.benchmarks.bench_spamd import answered, spamc, throughput  # noqa: E402
from tools.harnesses.exim_spamd import free_port, start_serve, stop, wait_for  # noqa: E402
from tools.harnesses.redis_sentinel import Group  # noqa: E402


def start_redis(folder: Path):
    import redis

    sock, log = folder / "redis.sock", folder / "redis.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(["redis-server", "--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700",
                                 "--save", "", "--appendonly", "no", "--dir", str(folder)],
                                stdout=f, stderr=subprocess.STDOUT)
    client = redis.Redis(unix_socket_path=str(sock))

    def ready():
        try:
            return client.ping()
        except redis.exceptions.ConnectionError:
            return False

    try:
        wait_for("redis-server", ready, proc, log, timeout=10)
    except BaseException:
        stop(proc)
        raise
    return proc, client, f"unix://{sock}?prefix=bench:"


def start_spamd(folder: Path, model=None, *options):
    """``spamnb serve --spamd`` on a free port that may learn (TELL) into ``model`` (None:
    ``options`` name the store): (process, port)."""
    port = free_port()
    folder.mkdir()
    return start_serve(SPAMNB, model, folder, port, lambda line: print(line, file=sys.stderr),
                       ["--allow-tell-served", "--max-connections", "64", *options]), port


def timed(port, raw, *options):
    """The seconds of one ``spamc`` (``-c`` unless ``options``); exits when the server
    did not answer as it should (a verdict to ``-c``, exit status 0 to ``-L``)."""
    took, code, out = spamc(port, raw, *options)
    if not (answered(code, out) if not options else code == 0):
        raise SystemExit(f"bench_store.py: spamc {' '.join(options or ('-c',))} got no answer from port {port} "
                         f"(exit status {code}): {out[:200]!r}")
    return took


def rate(port, raws, concurrency):
    """Messages per second through ``concurrency`` spamc -c clients; exits when one got no verdict."""
    wall, results = throughput(port, raws, concurrency)
    if not all(answered(code, out) for code, out in results):
        raise SystemExit(f"bench_store.py: a spamc -c of the throughput pass got no verdict from port {port}")
    return len(raws) / wall


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, help="a model file (default: train one on the shipped corpus)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--learn", type=int, default=40, help="messages learned through each server")
    ap.add_argument("--sentinel", action="store_true",
                    help="the store in a Sentinel group (primary, replica, Sentinel): reads on the replica")
    ap.add_argument("--wait", type=int, default=1,
                    help="--sentinel: replicas each learn waits for (the URL's wait=; 0: none)")
    args = ap.parse_args()
    for tool in ("spamc", "redis-server") + (("redis-sentinel",) if args.sentinel else ()):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is not installed (apt-get install {tool})")
    from spamnb.storage.filestore import FileBackend
    from spamnb.storage.store import ModelError
    from spamnb.storage.where import open_backend

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = tmp / "model.joblib"
        if args.model is not None:  # a copy: the file server learns into it
            try:
                FileBackend(model).replace(FileBackend(args.model).model())
            except (ModelError, OSError) as e:
                raise SystemExit(f"bench_store.py: --model {args.model}: {e}") from None
        else:
            print("training on corpora/spamassassin.tar.xz (not timed)...", file=sys.stderr)
            subprocess.run(SPAMNB + ["train", "--index", str(ROOT / "corpora" / "spamassassin.tar.xz"),
                                     "--model", str(model)], check=True, capture_output=True)
        file_model = FileBackend(model).model()
        raws = [p.read_bytes() for p in sorted((ROOT / "corpora" / "sample-maildir" / "cur").iterdir())]
        redis_proc, group, servers = None, None, []
        try:
            if args.sentinel:
                group = Group(tmp)
                url = group.url(prefix="bench:", wait=args.wait)
                client, reader = group.client(group.ports[0]), group.client(group.ports[1])
            else:
                redis_proc, client, url = start_redis(tmp)
                reader = client
            before = client.info("memory")["used_memory"]
            t = time.perf_counter()
            store = open_backend(None, url)
            store.replace(file_model)
            push_s = time.perf_counter() - t
            after = client.info("memory")["used_memory"]
            n_tokens = len(file_model.vocabulary)
            servers.append(start_spamd(tmp / "f", model))
            servers.append(start_spamd(tmp / "r", None, "--store", url))
            (_, p_file), (_, p_store) = servers
            for raw in raws[:4]:  # warm-up: scripts loaded, models read
                timed(p_file, raw)
                timed(p_store, raw)
            reader.config_resetstat()
            lat_f, lat_s = [], []
            for i, raw in enumerate(raws):
                order = [(p_file, lat_f), (p_store, lat_s)][::1 if i % 2 else -1]
                for port, out in order:
                    out.append(timed(port, raw))
            stats = reader.info("commandstats")
            evalsha = stats.get("cmdstat_evalsha", {}).get("calls", 0)
            ratios = [s / f for s, f in zip(lat_s, lat_f)]
            tp = {"file": [], "store": []}
            for name, port in [("file", p_file), ("store", p_store), ("store", p_store), ("file", p_file)]:
                tp[name].append(rate(port, raws, args.concurrency))
            # messages neither model has learned: held-out ones with a line of their own added
            fresh = [raws[i % len(raws)] + b"\nbench learn %d\n" % i for i in range(2 * args.learn)]
            learn_f = [timed(p_file, raw, "-L", "spam") for raw in fresh[:args.learn]]
            learn_s = [timed(p_store, raw, "-L", "spam") for raw in fresh[args.learn:]]
        except RuntimeError as e:  # a server (redis-server, spamnb serve) that did not start
            raise SystemExit(f"bench_store.py: {e}") from None
        finally:
            for proc, _ in servers:
                stop(proc)
            stop(redis_proc)
            if group is not None:
                group.stop()
        med = statistics.median
        version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()[2]
        where = f"a Sentinel group, reads on its replica, wait={args.wait}" if args.sentinel else "one server"
        print(f"server: Redis {version} ({where}); model: {n_tokens} tokens, {len(file_model.registry)} messages; "
              f"{len(raws)} messages, spamc -c per message")
        print(f"latency        file {med(lat_f) * 1e3:6.1f} ms   store {med(lat_s) * 1e3:6.1f} ms   "
              f"median ratio store/file {med(ratios):.2f} (goal <= 1.5)")
        f_tp, s_tp = statistics.mean(tp["file"]), statistics.mean(tp["store"])
        print(f"throughput     file {f_tp:6.1f} msg/s  store {s_tp:6.1f} msg/s  ratio store/file {s_tp / f_tp:.2f} "
              f"({args.concurrency} concurrent clients)")
        print(f"learn (TELL)   file {med(learn_f) * 1e3:6.1f} ms   store {med(learn_s) * 1e3:6.1f} ms   "
              f"ratio store/file {med(learn_s) / med(learn_f):.2f} ({args.learn} each)")
        print(f"memory         {(after - before) / n_tokens:.1f} bytes per stored token (INFO memory, "
              f"{(after - before) / 1e6:.1f} MB; push took {push_s:.1f} s)")
        print(f"round trips    {evalsha / len(raws) / 1:.2f} EVALSHA per classified message (INFO commandstats, "
              f"{evalsha} over {len(raws)} messages)")


if __name__ == "__main__":
    main()
