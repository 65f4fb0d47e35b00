#!/usr/bin/env python3
"""What learning costs a delivery: ``filter -u`` beside ``filter``, and ``learn`` on a big model.

Measured in one run, interleaved message by message (the machine is shared:
only medians and ratios of paired runs mean much), each a new process as a
delivery agent starts it:

* cold path (no server): ``spamnb filter`` and ``spamnb filter -u`` on a model
  trained on at least 8,000 messages; each message is new to the model, so
  every ``-u`` appends a record to the journal (the order of the pair
  alternates from message to message);
* through ``spamnb serve``: the same pair with the server answering (and
  learning the ``-u`` ones);
* a cold ``filter`` with the journal just under its bound (messages of
  enron-ham-dev learned into it) against one with no journal: what the
  bound costs every delivery until the next compaction;
* ``spamnb learn --spam MSG`` of one new message on a model of at least a
  million tokens (the whole process), the same learn in-process
  (:func:`spamnb.storage.journal.update`), and bogofilter's ``-s`` of the
  same message on a database trained on the same mail when bogofilter is
  installed.

Targets (the journal's issue): ``filter -u`` at most 2x ``filter`` cold and
1.5x through the server; ``learn`` of one message under 100 ms.

Usage::

    python3 tools/benchmarks/bench_learning.py                 # shared corpora, 40 messages per measure
    python3 tools/benchmarks/bench_learning.py --n 80 --spamnb .venv/bin/spamnb
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the project: spamnb, tools

from tools import shared_corpora  # noqa: E402


def default_spamnb():
    beside = Path(sys.executable).with_name("spamnb")
    return str(beside) if beside.exists() else shutil.which("spamnb")


def stream(names):
    """[(label, absolute path)] of the named shared corpora, in index order."""
    items = []
    for name in names:
        index = shared_corpora.index_path(shared_corpora.SHARED / name)
        if not index.exists():
            print(shared_corpora.absent_line(index.parent), file=sys.stderr)
            raise SystemExit(shared_corpora.EXIT_ABSENT)
        base = index.parent
        for line in index.read_text().splitlines():
            label, rel = line.split(None, 1)
            items.append((label, str((base / rel).resolve())))
    return items


def split(items, n):
    """(training items, n held-out items spread evenly over the stream)."""
    step = max(1, len(items) // n)
    held = set(range(step // 2, len(items), step)[:n])
    return [x for i, x in enumerate(items) if i not in held], [items[i] for i in sorted(held)]


def write_index(items, path):
    path.write_text("".join(f"{label} {p}\n" for label, p in items))
    return path


def timed(args, stdin_path=None, env=None):
    """Wall seconds of one process (its output discarded; a failure stops the run)."""
    with open(stdin_path, "rb") if stdin_path else open(os.devnull, "rb") as f:
        t0 = time.perf_counter()
        proc = subprocess.run(args, stdin=f, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        dt = time.perf_counter() - t0
    if proc.returncode not in (0, 1, 2):
        raise SystemExit(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.decode()[-500:]}")
    return dt


def pair(spamnb, model, held, extra=(), env=None):
    """Median seconds of ``filter`` and ``filter -u`` over the held-out messages, interleaved."""
    plain, learn = [], []
    for i, (_, path) in enumerate(held):
        runs = [("plain", []), ("learn", ["-u"])]
        if i % 2:
            runs.reverse()
        for kind, flag in runs:
            dt = timed([spamnb, "filter", *flag, "--model", str(model), *extra], path, env)
            (plain if kind == "plain" else learn).append(dt)
    return statistics.median(plain), statistics.median(learn)


def fill_journal(model, items):
    """Learn new messages into ``model``'s journal until it is just under its bound: how many."""
    from spamnb.storage import journal

    n = 0
    path = journal.journal_path(model)
    for label, msg in items:
        if os.path.exists(path) and os.path.getsize(path) > 0.95 * journal.MAX_BYTES:
            break
        journal.update(model, [(Path(msg).read_bytes(), label, None)])
        n += 1
    return n


def pair_models(spamnb, a, b, held, env):
    """Median seconds of a cold ``filter`` on model ``a`` and on model ``b``, interleaved."""
    times = {a: [], b: []}
    for i, (_, path) in enumerate(held):
        for model in ((a, b) if i % 2 else (b, a)):
            times[model].append(timed([spamnb, "filter", "--model", str(model)], path, env))
    return statistics.median(times[a]), statistics.median(times[b])


def journal_records(model):
    from spamnb.storage import journal
    from spamnb.storage.modelfile import load_snapshot

    stats = load_snapshot(model).stats
    j = journal.read(model, stats.get("save_id"), stats.get("journal"))
    return 0 if j is None else len(j)


def serve(spamnb, model, sock, env):
    """``spamnb serve`` on ``sock``, once it accepts a connection (the socket file is
    bound before the server listens: its existence alone is not readiness)."""
    from tools.harnesses.exim_spamd import stop, wait_for

    def accepts():
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(sock))  # OSError until it listens: wait_for tries again
        return True

    log = sock.with_name(sock.name + ".log")
    with open(log, "wb") as err:
        proc = subprocess.Popen([spamnb, "serve", "--model", str(model), "--socket", str(sock)], env=env,
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_for("spamnb serve", accepts, proc, log, timeout=30)
    except RuntimeError as exc:
        stop(proc)
        raise SystemExit(f"bench_learning.py: {exc}") from None
    return proc


def big_model(spamnb, items, path, env, min_tokens):
    """A model trained on ``items``, with synthetic tokens added when its vocabulary
    is under ``min_tokens`` (said in the output): returns its vocabulary size."""
    import numpy as np

    from spamnb.storage.modelfile import load_model, save_model

    subprocess.run([spamnb, "train", "--index", str(write_index(items, path.with_suffix(".index"))),
                    "--trust-index", "--model", str(path)], env=env, check=True, stderr=subprocess.DEVNULL)
    model = load_model(path)
    real = len(model.vocabulary)
    if real < min_tokens:
        extra = min_tokens - real
        rng = np.random.default_rng(0)
        fc = rng.integers(0, 3, size=(2, extra)).astype(np.float64) * 0.05
        model.add_counts([0, 0], fc, np.ones(extra, dtype=np.int64),
                         tokens=[f"bench:filler:{i}" for i in range(extra)])
        save_model(model, path)
        print(f"  model: {real:,} tokens from the corpora + {extra:,} synthetic ones = {len(model.vocabulary):,}")
    else:
        print(f"  model: {real:,} tokens")
    return len(model.vocabulary)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spamnb", default=default_spamnb())
    ap.add_argument("--n", type=int, default=40, help="messages per measure")
    ap.add_argument("--min-tokens", type=int, default=1_000_000)
    args = ap.parse_args()
    spamnb = args.spamnb
    work = Path(tempfile.mkdtemp(prefix="bench-learning-"))
    env = dict(os.environ, HOME=str(work), XDG_DATA_HOME=str(work / "data"), XDG_CACHE_HOME=str(work / "cache"),
               XDG_RUNTIME_DIR=str(work / "run"))
    (work / "run").mkdir(mode=0o700)
    try:
        items = stream(["spamassassin", "trec06c-dev"])
        train, held = split(items, 2 * args.n)
        print(f"corpus: {len(items):,} messages (spamassassin + trec06c-dev); "
              f"model trained on {len(train):,}, {len(held)} held out")
        model = work / "m.joblib"
        t0 = time.perf_counter()
        subprocess.run([spamnb, "train", "--index", str(write_index(train, work / "train.index")),
                        "--trust-index", "--model", str(model)], env=env, check=True, stderr=subprocess.DEVNULL)
        print(f"  trained in {time.perf_counter() - t0:.1f} s")

        def copy(name):
            """A copy of the model with a scorer of its own (a copied scorer is stale)."""
            from spamnb.storage.modelfile import compile_scorer

            dst = work / name
            shutil.copy2(model, dst)
            compile_scorer(dst)
            return dst

        cold_model = copy("cold.joblib")
        plain, learn = pair(spamnb, cold_model, held[: args.n], env=env)
        print(f"cold path:   filter {plain * 1e3:6.1f} ms   filter -u {learn * 1e3:6.1f} ms   "
              f"ratio {learn / plain:.2f}  (target <= 2.0; {journal_records(cold_model)} records journaled)")

        served_model = copy("served.joblib")
        sock = work / "run" / "s.sock"
        server = serve(spamnb, served_model, sock, env)
        try:
            plain, learn = pair(spamnb, served_model, held[args.n:], ["--socket", str(sock)], env)
        finally:
            server.terminate()
            server.wait()
        print(f"via server:  filter {plain * 1e3:6.1f} ms   filter -u {learn * 1e3:6.1f} ms   "
              f"ratio {learn / plain:.2f}  (target <= 1.5; {journal_records(served_model)} records journaled)")

        empty, full = copy("empty.joblib"), copy("full.joblib")
        filled = fill_journal(full, stream(["enron-ham-dev"]))
        plain, loaded = pair_models(spamnb, empty, full, held[: args.n], env)
        print(f"journal at its bound ({filled} messages, {os.path.getsize(str(full) + '.journal') / 1e6:.2f} MB): "
              f"cold filter {loaded * 1e3:.1f} ms against {plain * 1e3:.1f} ms with none, ratio {loaded / plain:.2f}")

        print("learn of one message on a big model:")
        everything = items + stream(["enron-ham-dev"])
        rest, new = split(everything, args.n)
        big = work / "big.joblib"
        big_model(spamnb, rest, big, env, args.min_tokens)
        procs, inproc = [], []
        from spamnb.storage import journal

        for i, (label, path) in enumerate(new):
            if i % 2:
                procs.append(timed([spamnb, "learn", "--spam", "--model", str(big), path], env=env))
            else:
                raw = Path(path).read_bytes()
                t0 = time.perf_counter()
                journal.update(big, [(raw, "spam", None)])
                inproc.append(time.perf_counter() - t0)
        print(f"  spamnb learn (process): median {statistics.median(procs) * 1e3:.1f} ms, "
              f"max {max(procs) * 1e3:.1f} ms  (target < 100 ms)")
        print(f"  journal.update (in-process): median {statistics.median(inproc) * 1e3:.1f} ms")
        bogo = shutil.which("bogofilter")
        if bogo:
            db = work / "bogo"
            db.mkdir()
            with open(work / "mbox-spam", "wb") as s, open(work / "mbox-ham", "wb") as h:
                for label, path in rest:
                    (s if label == "spam" else h).write(b"From bench\n" + Path(path).read_bytes() + b"\n")
            subprocess.run([bogo, "-d", str(db), "-M", "-s", "-I", str(work / "mbox-spam")], check=True)
            subprocess.run([bogo, "-d", str(db), "-M", "-n", "-I", str(work / "mbox-ham")], check=True)
            peer = [timed([bogo, "-d", str(db), "-s", "-I", path]) for _, path in new]
            print(f"  bogofilter -s (process): median {statistics.median(peer) * 1e3:.1f} ms  "
                  f"(spamnb learn / bogofilter -s: {statistics.median(procs) / statistics.median(peer):.1f}x)")
        else:
            print("  bogofilter is not installed: no peer figure (apt-get install bogofilter)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
