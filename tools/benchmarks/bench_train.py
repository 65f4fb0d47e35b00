#!/usr/bin/env python3
"""Benchmark sharded training: parallel speed-up, streaming memory, hashing, per-message costs.

Every figure comes from ``spamnb`` commands run as fresh subprocesses, so start-up
(imports, spawning the worker processes) is counted, as a user would see it.

(a) speed-up   ``spamnb train --index SA/index --jobs 1`` and ``--jobs 2`` (forked
               workers, and loky's fresh interpreters), alternated --repeats times in
               the same run; median wall times and their ratio, and the median of the
               paired ratios (robust on a loaded machine). Beside them the machine's
               ceiling: the same tokenizing split over two independent processes.
(b) memory     peak RSS (``ru_maxrss`` of RUSAGE_CHILDREN, read by a fresh wrapper
               process per run, so it is that one run's largest process) of
               ``spamnb train --no-dedupe --jobs 1`` on an index listing every message of
               ../shared/corpora once (x1) and four times (x4): x4 really counts four
               times as many messages (--no-dedupe), with the same vocabulary. Also the
               default (deduplicating) train on everything, and with --jobs 2.
(c) hashing    ``spamnb evaluate --folds 5`` on SA with and without --hash-features
               2^18, 2^20: (1-AUC)%, train peak RSS and model file size.
(e) vs peer    ``spamnb train --index corpora/spamassassin.tar.xz`` (scripts/main.sh's
               command; --jobs 1 and 2) beside bogofilter's bulk registration (``-n -B``
               ham, ``-s -B`` spam) of the same messages, extracted: the ratio. Also
               ``spamnb train --jobs 1`` on those extracted files: the same input both ways.
(d) costs      in-process, messages in shuffled order (seed 0): worker seconds per message
               (read + tokenize + count), the parent's merge seconds per message, bytes
               shipped per message, and the vocabulary's growth with the number of
               messages, V = K·n^β fitted (Heaps' law; for README "Scale").

    python3 tools/benchmarks/bench_train.py                 # all sections
    python3 tools/benchmarks/bench_train.py --only a --repeats 5

(e) reads the shipped archive; the other sections read
SA, ../shared/corpora/spamassassin beside the repository; (b) and (d) also read
the Chinese corpus, ../shared/corpora/trec06c-dev or --corpus PATH, which is not
shipped (its licence allows research use only). Without SA the script prints one
line and exits 2; without the Chinese corpus, (b) and (d) say so in one line and
measure SA alone (tools/shared_corpora.py).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the project: spamnb, tools

from tools import shared_corpora  # noqa: E402

SA = shared_corpora.SPAMASSASSIN / "index"

# Runs one command and prints its peak RSS (KiB): RUSAGE_CHILDREN of this fresh wrapper
# covers exactly that command and the processes it waited for (the largest one's peak).
_WRAPPER = (
    "import resource, subprocess, sys, time\n"
    "t = time.perf_counter()\n"
    "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)\n"
    "sys.stderr.buffer.write(r.stderr)\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, time.perf_counter() - t, r.returncode)\n"
)


def spamnb(*args):
    return [sys.executable, "-m", "spamnb", *map(str, args)]


def measured(cmd):
    """(wall seconds, peak RSS MiB, stderr) of one command in a fresh wrapper."""
    out = subprocess.run([sys.executable, "-c", _WRAPPER, *cmd], capture_output=True, text=True)
    kib, seconds, code = out.stdout.split()
    if int(code) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{out.stderr}")
    return float(seconds), int(kib) / 1024, out.stderr


def index_of(entries, path, times=1):
    """An index file listing ``entries`` (label, absolute path) ``times`` times over."""
    with open(path, "w") as f:
        for _ in range(times):
            f.writelines(f"{label} {p}\n" for label, p in entries)
    return path


def entries_of(index):
    """``(label, absolute path)`` of every line of a TREC index (sources.index_entries)."""
    from spamnb.mail.sources import index_entries

    base = Path(index).parent
    return [(label, str(base / rel)) for label, rel in index_entries(Path(index).read_text().splitlines(), index)]


# The machine's own ceiling for two processes: the same tokenizing work (every
# message of SA) done by one process, or split over two independent processes
# that never communicate. On a shared VM two vCPUs need not give twice the
# throughput of one (measured here: 1.3-1.7x); spamnb's speed-up is read against it.
_HALF = (  # each process reads only its own share of the files
    "import os, sys\n"
    "from spamnb.mail.sources import index_entries\n"
    "from spamnb.mail.tokenizer import tokenize\n"
    "index, k, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])\n"
    "entries = list(index_entries(open(index).read().splitlines(), index))\n"
    "for _, rel in entries[k::n]:\n"
    "    tokenize(open(os.path.join(os.path.dirname(index), rel), 'rb').read())\n"
)


def _ceiling_run(n, index=SA):
    t = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", _HALF, str(index), str(k), str(n)]) for k in range(n)]
    if any(p.wait() for p in procs):
        raise SystemExit("the ceiling run failed")
    return time.perf_counter() - t


def section_a(tmp, repeats):
    print("## (a) train on SpamAssassin: --jobs 1 vs --jobs 2, and the machine's ceiling\n")
    runs = {"jobs 1": ("1", "multiprocessing"), "jobs 2": ("2", "multiprocessing"),
            "jobs 2 --backend loky": ("2", "loky")}
    times = {name: [] for name in [*runs, "ceiling 1 process", "ceiling 2 processes"]}
    for r in range(repeats):
        order = list(runs) if r % 2 == 0 else list(reversed(runs))
        for name in order:
            jobs, backend = runs[name]
            s, _, err = measured(spamnb("train", "--index", SA, "--jobs", jobs, "--backend", backend,
                                        "--model", tmp / f"a{jobs}{backend}.joblib"))
            times[name].append(s)
            print(f"  repeat {r + 1} {name}: {s:.2f} s  ({err.strip().splitlines()[0]})")
        for n in ((1, 2) if r % 2 == 0 else (2, 1)):
            s = _ceiling_run(n)
            times[f"ceiling {n} process{'es' if n > 1 else ''}"].append(s)
            print(f"  repeat {r + 1} ceiling, {n} process(es) tokenizing: {s:.2f} s")
    med = {name: statistics.median(t) for name, t in times.items()}

    def paired(a, b):
        return statistics.median(x / y for x, y in zip(times[a], times[b]))

    same = same_model(tmp / "a1multiprocessing.joblib", tmp / "a2multiprocessing.joblib") and \
        same_model(tmp / "a1multiprocessing.joblib", tmp / "a2loky.joblib")
    print("\n| run | median s | min s |\n|---|---|---|")
    for name, t in times.items():
        print(f"| {name} | {med[name]:.2f} | {min(t):.2f} |")
    out = {"speedup": med["jobs 1"] / med["jobs 2"], "paired": paired("jobs 1", "jobs 2"),
           "paired_loky": paired("jobs 1", "jobs 2 --backend loky"),
           "ceiling": paired("ceiling 1 process", "ceiling 2 processes"), "identical": same, "times": times}
    print(f"\nspeed-up --jobs 2: {out['speedup']:.2f}x (ratio of medians), {out['paired']:.2f}x (median of "
          f"paired ratios); with loky {out['paired_loky']:.2f}x. Machine ceiling (2 independent "
          f"processes): {out['ceiling']:.2f}x, so --jobs 2 reaches {out['paired'] / out['ceiling']:.0%} of it. "
          f"Models identical: {same}; cpus: {os.cpu_count()}\n")
    return out


SHIPPED = ROOT / "corpora" / "spamassassin.tar.xz"


def section_e(tmp, repeats):
    """spamnb train beside bogofilter's bulk registration on the same messages, same run.

    spamnb reads the shipped archive, as ``scripts/main.sh`` does (its time includes
    the xz decompression); bogofilter cannot read an archive, so it registers the
    same messages extracted beforehand (untimed) into files. Each repeat runs the
    three commands back to back, in an order that alternates between repeats.
    """
    import shutil

    from tools.studies import peers  # tools/studies/peers.py: the peers' commands, one definition

    print("## (e) train on the shipped corpus: spamnb vs bogofilter bulk registration (-n -B / -s -B)\n")
    bogo = shutil.which("bogofilter")
    with tarfile.open(SHIPPED) as t:
        t.extractall(tmp / "shipped", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    index = next((tmp / "shipped").glob("*/index"))
    entries = entries_of(index)
    ham = [p for label, p in entries if label == "ham"]
    spam = [p for label, p in entries if label == "spam"]
    # "files": the same command on the extracted messages bogofilter reads, so that the
    # two trainers start from the same input (the archive's xz decompression and tar
    # parsing, about 0.8 CPU s, are outside the comparison of tokenizers).
    rows = {"spamnb --jobs 1": [], "spamnb --jobs 2": [], "spamnb --jobs 1, files": [], "bogofilter -B": []}
    cpu = {name: [] for name in rows}

    def run(name):
        if name == "bogofilter -B":
            return peers.bogofilter_bulk_train_seconds(ham, spam)
        jobs = name.split("--jobs ")[1][0]
        source = index if name.endswith("files") else SHIPPED
        return measured(spamnb("train", "--index", source, "--jobs", jobs, "--model", tmp / f"e{jobs}.joblib"))[0]

    def children_cpu():
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime

    names = [n for n in rows if bogo or not n.startswith("bogofilter")]
    ceiling = {1: [], 2: []}
    for r in range(repeats):
        for name in (names if r % 2 == 0 else names[::-1]):
            before = children_cpu()
            rows[name].append(run(name))
            cpu[name].append(children_cpu() - before)
            print(f"  repeat {r + 1} {name}: {rows[name][-1]:.2f} s wall, {cpu[name][-1]:.2f} s CPU")
        for n in ((1, 2) if r % 2 == 0 else (2, 1)):
            ceiling[n].append(_ceiling_run(n, index))
            print(f"  repeat {r + 1} ceiling, {n} process(es) tokenizing: {ceiling[n][-1]:.2f} s wall")
    # Wall and CPU seconds (user + system of every process of the run: on a machine
    # other jobs share, CPU time is what one core each costs; wall time also counts
    # the waits for a core; spamnb's CPU includes the small Python wrapper that
    # reads its peak memory). Two views of each ratio: of the medians, and the median
    # of each repeat's own ratio (the trains and bogofilter of one repeat run back to
    # back, so a slow spell of the shared machine hits both).
    for what, table in (("wall", rows), ("CPU", cpu)):
        print(f"\n| trainer | median {what} s | ratio of medians | median of paired ratios |\n|---|---|---|---|")
        bogo_times = table["bogofilter -B"]
        ref = statistics.median(bogo_times) if bogo_times else None
        for name, times in table.items():
            if times:
                m = statistics.median(times)
                if ref:
                    paired = statistics.median(t / b for t, b in zip(times, bogo_times))
                    print(f"| {name} | {m:.2f} | {m / ref:.2f} | {paired:.2f} |")
                else:
                    print(f"| {name} | {m:.2f} | - | - |")
    # What --jobs 2 can gain on this machine right now: the same tokenizing split over two
    # independent processes against one. A shared machine with the kernel's autogroup
    # scheduling gives one session a fair share of the cores, so when other sessions keep
    # both cores busy a second process of the same run buys little, for spamnb and the
    # ceiling alike (docs/tokenizer-speed.md, "--jobs 2").
    jobs = statistics.median(b / a for a, b in zip(rows["spamnb --jobs 1"], rows["spamnb --jobs 2"]))
    ceil = statistics.median(b / a for a, b in zip(ceiling[1], ceiling[2]))
    print(f"\nwall --jobs 2 / --jobs 1: {jobs:.2f} (median of paired ratios); the machine's ceiling, two "
          f"independent tokenizing processes / one: {ceil:.2f}")
    mb = sum(os.path.getsize(p) for _, p in entries) / 1e6
    print(f"\n{len(entries)} messages, {mb:.1f} MB\n")
    return {"wall": rows, "cpu": cpu, "ceiling": ceiling}


def same_model(a, b):
    """Whether two model files hold the same vocabulary and counts, bit for bit."""
    import numpy as np

    from spamnb.storage.modelfile import load_model

    ma, mb = load_model(a), load_model(b)
    return (ma.vocabulary == mb.vocabulary
            and np.array_equal(ma.estimator.feature_count_, mb.estimator.feature_count_)
            and np.array_equal(ma.class_count, mb.class_count) and np.array_equal(ma.doc_freq, mb.doc_freq))


def section_b(tmp, corpora):
    print("## (b) peak memory: streaming\n")
    everything = [e for index in corpora.values() for e in entries_of(index)]
    x1 = index_of(everything, tmp / "x1.index", 1)
    x4 = index_of(everything, tmp / "x4.index", 4)
    rows = []
    for what, idx, extra in [
        ("x1, --no-dedupe, --jobs 1", x1, ["--no-dedupe"]),
        ("x4, --no-dedupe, --jobs 1", x4, ["--no-dedupe"]),
        (f"x1 ({' + '.join(corpora)}), dedupe, --jobs 1", x1, []),
        ("x4, dedupe, --jobs 1", x4, []),
        ("x1, dedupe, --jobs 2", x1, ["--jobs", "2"]),
    ]:
        cmd = spamnb("train", "--index", idx, "--trust-index", "--model", tmp / "b.joblib", *extra)
        s, mib, err = measured(cmd)
        summary = err.strip().splitlines()[0]
        rows.append({"run": what, "seconds": s, "peak_rss_mib": mib, "summary": summary})
        print(f"  {what}: {mib:.0f} MiB, {s:.1f} s  ({summary})")
    base, big = rows[0]["peak_rss_mib"], rows[1]["peak_rss_mib"]
    print("\n| run | peak RSS MiB | seconds |\n|---|---|---|")
    for r in rows:
        print(f"| {r['run']} | {r['peak_rss_mib']:.0f} | {r['seconds']:.1f} |")
    print(f"\nx4 / x1 peak RSS (no dedupe): {big / base:.3f} (+{100 * (big / base - 1):.1f}%)\n")
    return {"rows": rows, "x4_over_x1": big / base, "messages_x1": len(everything)}


def section_c(tmp):
    print("## (c) hashing on SpamAssassin: 5-fold (1-AUC)%, train memory, model size\n")
    rows = []
    for n in (None, 2**18, 2**20):
        extra = [] if n is None else ["--hash-features", n]
        out = subprocess.run(spamnb("evaluate", "--index", SA, "--folds", 5, "--json", *extra),
                             capture_output=True, text=True, check=True)
        auc = json.loads(out.stdout)["one_minus_auc_pct"]
        model = tmp / f"c{n}.joblib"
        s, mib, _ = measured(spamnb("train", "--index", SA, "--model", model, *extra))
        size = model.stat().st_size / 2**20
        rows.append({"hash_features": n, "one_minus_auc_pct": auc, "train_peak_rss_mib": mib,
                     "model_mib": size, "train_seconds": s})
        label = "vocabulary" if n is None else f"hash 2^{n.bit_length() - 1}"
        print(f"  {label}: (1-AUC)% {auc:.4f}, peak RSS {mib:.0f} MiB, model {size:.1f} MiB")
    print("\n| columns | (1-AUC)% | train peak RSS MiB | model file MiB |\n|---|---|---|---|")
    for r in rows:
        n = r["hash_features"]
        label = "exact vocabulary" if n is None else f"hashed, 2^{n.bit_length() - 1}"
        print(f"| {label} | {r['one_minus_auc_pct']:.4f} | {r['train_peak_rss_mib']:.0f} | {r['model_mib']:.1f} |")
    print()
    return {"rows": rows}


def section_d(corpora):
    print("## (d) per-message costs (in-process, --jobs 1)\n")
    from spamnb.scale import parallel as par
    from spamnb.model import SpamModel

    import random

    out = {}
    for name, corpus_index in corpora.items():
        # shuffled (seed 0): the growth curve of the vocabulary must not see all ham first
        entries = entries_of(corpus_index)
        random.Random(0).shuffle(entries)
        index = index_of(entries, Path(tempfile.mkdtemp()) / "index")
        spec = par.CountSpec.of(SpamModel(), keys=True)
        model = SpamModel()
        merger = par.ShardMerger(model.vocabulary, model.registry)
        n = shipped = 0
        work = merge = 0.0
        growth = []
        start = time.perf_counter()
        for shard in par.plan(index=[index], trust_index=True):
            t0 = time.perf_counter()
            counts = par.count_shard(shard, spec)
            t1 = time.perf_counter()
            shipped += len(pickle.dumps(shard, protocol=5)) + len(pickle.dumps(counts, protocol=5))
            t2 = time.perf_counter()
            merger.add(counts)
            t3 = time.perf_counter()
            work += t1 - t0
            merge += t3 - t2
            n += len(counts.y)
            growth.append((n, len(model.vocabulary)))
        t4 = time.perf_counter()
        merger.install(model)
        install = time.perf_counter() - t4
        total = time.perf_counter() - start
        shard_bytes = sum(len(pickle.dumps(s, protocol=5)) for s in par.plan(index=[index], trust_index=True))
        row = {"messages": n, "vocabulary": len(model.vocabulary), "worker_ms_per_msg": 1e3 * work / n,
               "merge_ms_per_msg": 1e3 * merge / n, "install_s": install, "total_s": total,
               "shipped_bytes_per_msg": shipped / n, "shard_description_bytes_per_msg": shard_bytes / n,
               "growth": growth}
        out[name] = row
        print(f"  {name}: {n} messages, vocabulary {len(model.vocabulary)}; worker "
              f"{row['worker_ms_per_msg']:.2f} ms/msg (read+tokenize+count), parent merge "
              f"{row['merge_ms_per_msg']:.3f} ms/msg, install {install:.2f} s; shipped "
              f"{row['shipped_bytes_per_msg'] / 1e3:.1f} kB/msg (paths {row['shard_description_bytes_per_msg']:.0f} B/msg)")
        # Heaps' law V = K n^beta, fitted on the growth curve
        import numpy as np

        g = np.array(growth[len(growth) // 4:], dtype=float)
        beta, logk = np.polyfit(np.log(g[:, 0]), np.log(g[:, 1]), 1)
        row["heaps_beta"], row["heaps_k"] = float(beta), float(np.exp(logk))
        print(f"    vocabulary growth: V ≈ {np.exp(logk):.1f} · n^{beta:.3f} "
              f"(-> {np.exp(logk) * 1e8 ** beta / 1e6:.0f} M tokens at 10^8 messages, if it held)")
    print()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="abcde", help="sections to run, e.g. 'ab'")
    ap.add_argument("--repeats", type=int, default=3, help="paired repeats in (a)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--corpus", default=str(shared_corpora.TREC06C),
                    help="the trec06c-dev folder (with its index), read by (b) and (d) "
                         "(default: ../shared/corpora/trec06c-dev beside the repository)")
    args = ap.parse_args()
    corpora = {"spamassassin": shared_corpora.require(SA)} if set(args.only) - {"e"} else {}
    if "b" in args.only or "d" in args.only:
        trec = shared_corpora.find(args.corpus, chinese=True, option="--corpus")
        if trec:
            corpora["trec06c-dev"] = trec
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if "a" in args.only:
            results["a"] = section_a(tmp, args.repeats)
        if "b" in args.only:
            results["b"] = section_b(tmp, corpora)
        if "c" in args.only:
            results["c"] = section_c(tmp)
        if "d" in args.only:
            results["d"] = section_d(corpora)
        if "e" in args.only:
            results["e"] = section_e(tmp, args.repeats)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
