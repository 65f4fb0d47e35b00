#!/usr/bin/env python3
"""This tree against another revision: ``train``, ``classify`` of a folder, the server per message.

A speed change (to the tokenizer or the training pipeline) must show where
users meet it. Each measure runs this tree's ``spamnb`` and a reference revision's
(its ``spamnb`` package taken out of git into a temporary folder and run by the same
interpreter and libraries, ``python -m spamnb`` with ``PYTHONPATH`` set), alternating
which goes first, and reports medians and the median of the paired ratios (this tree
/ reference: below 1 is faster), in CPU seconds (user + system of every process of
the run: what the work costs, one core each; on a shared machine wall time also
counts the waits for a core) and in wall seconds:

* ``train``     ``spamnb train --index corpora/spamassassin.tar.xz`` with ``--jobs 1``
                and ``--jobs 2``; the two trees' models are compared (same vocabulary,
                same counts, bit for bit).
* ``classify``  ``spamnb classify FOLDER`` of the shipped corpus's 5,943 messages
                written as files (one model, trained by the reference); the two
                trees' outputs are compared (same labels and scores).
* ``setup``     ``spamnb setup --yes`` in a fresh home holding a Maildir++ made of
                ``--mailbox`` of the shipped corpus's messages (INBOX and .Archive: ham
                older than 3 days, a few spam never sorted and yesterday's ham; .Junk:
                spam), the default model built beforehand (untimed); the two trees'
                outputs and models are compared.
* ``server``    ``spamnb serve --spamd`` of each tree with the same model on loopback,
                and ``spamc -c`` (one process per message, as an MTA or procmail runs
                it) sending each of the ``--n`` messages once per pass; passes alternate
                between the servers. Per message: the server's own CPU time (all its
                threads, read from /proc/PID/stat: reading, tokenizing and scoring,
                not the client's start) and spamc's median latency. ``--user NAME``: spamc
                sends ``-u NAME``, a user with no model of their own (the servers get an
                empty ``--user-models`` folder, or with ``--store`` ``--store-users``);
                ``--store``: the model is served from a private ``redis-server`` (on a Unix
                socket in the temporary folder), and the commands it runs are counted.
* ``filter``    ``spamnb filter --model M < message``, one process per message as a delivery
                agent runs it, for ``--filter-n`` messages a pass: cold (the fast path, no
                server) and through each tree's own ``spamnb serve`` (``--socket``), both
                trees' bytecode compiled first; CPU (all of the process) and wall time a
                message, and the outputs compared byte for byte.
* ``imap``      ``spamnb imap filter --dry-run --store URL`` of ``--imap-n`` messages in the
                INBOX of a private Dovecot (``tests/dovecot.py``) for a login with no model
                of its own in the store (the shared one judges): the process's CPU and wall
                time a pass, and the connections it made to the store.

Usage::

    python3 tools/benchmarks/bench_ref.py --ref main --repeats 5
    python3 tools/benchmarks/bench_ref.py --ref HEAD~3 --only server,classify --n 1000
    python3 tools/benchmarks/bench_ref.py --only server --user nobody --store --repeats 5
    python3 tools/benchmarks/bench_ref.py --only imap --imap-n 300 --repeats 5
    python3 tools/benchmarks/bench_ref.py --ref main --only setup --mailbox 3000 --repeats 5
    python3 tools/benchmarks/bench_ref.py --ref main --only filter --filter-n 40 --repeats 5

Linux only (/proc); the server measure needs ``spamc`` (Debian: ``apt-get install
spamc``) and says so in one line without it; ``--store`` and ``imap`` need
``redis-server`` and the redis package, ``imap`` Dovecot and imapclient. Exit status 1 if the trees' models or
verdicts differ.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the project: spamnb, tools; tests: dovecot.py

from tools.benchmarks.bench_filter import extract  # noqa: E402 (the shipped corpus as files)
from tools.benchmarks.bench_spamd import answered, port_free, spamc, wait_ready  # noqa: E402
from tools.benchmarks.bench_train import same_model  # noqa: E402
from tools.benchmarks.token_hashes import revision_tree  # noqa: E402
from tools.harnesses.exim_spamd import stop  # noqa: E402

SHIPPED = ROOT / "corpora" / "spamassassin.tar.xz"
MEASURES = ("train", "classify", "setup", "server", "filter", "imap")
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def spamnb(tree, *args):
    return [sys.executable, "-m", "spamnb", *map(str, args)], {**os.environ, "PYTHONPATH": str(tree)}


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(tree, *args, out=None, env=None, stderr=False):
    """One whole ``spamnb`` process of ``tree`` (``env``: more variables): (CPU s, wall s, stdout,
    and stderr after it with ``stderr``)."""
    cmd, base = spamnb(tree, *args)
    env = {**base, **(env or {})}
    cpu, t = children_cpu(), time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tree)
    wall, cpu = time.perf_counter() - t, children_cpu() - cpu
    if proc.returncode:
        sys.exit(f"bench_ref.py: {' '.join(args[:1])} of {tree} failed: {proc.stderr.decode(errors='replace')[-500:]}")
    return cpu, wall, proc.stdout + proc.stderr if stderr else proc.stdout


def report(title, table, unit="s"):
    """Medians of each tree and the median of the paired ratios, per figure."""
    print(f"\n### {title}\n\n| figure | reference | this tree | paired ratio (this / ref) |\n|---|---|---|---|")
    out = {}
    for what, (ref, mine) in table.items():
        ratio = statistics.median(m / r for m, r in zip(mine, ref) if r)
        out[what] = ratio
        print(f"| {what} | {statistics.median(ref):.3f} {unit} | {statistics.median(mine):.3f} {unit} | {ratio:.3f} |")
    return out


def alternate(repeats, trees, once):
    """``once(name, tree)`` for both trees per repeat, which goes first alternating."""
    names = list(trees)
    for r in range(repeats):
        for name in (names if r % 2 == 0 else names[::-1]):
            once(name, trees[name])


def measure_train(trees, repeats, tmp):
    ok = True
    for jobs in ("1", "2"):
        cpu = {n: [] for n in trees}
        wall = {n: [] for n in trees}

        def once(name, tree):
            c, w, _ = run(tree, "train", "--index", SHIPPED, "--jobs", jobs, "--model", tmp / f"{name}{jobs}.joblib")
            cpu[name].append(c)
            wall[name].append(w)
            print(f"  train --jobs {jobs} {name}: {c:.2f} s CPU, {w:.2f} s wall", file=sys.stderr)

        alternate(repeats, trees, once)
        report(f"spamnb train --index corpora/spamassassin.tar.xz --jobs {jobs}",
               {"CPU": (cpu["reference"], cpu["this tree"]), "wall": (wall["reference"], wall["this tree"])})
        same = same_model(tmp / f"reference{jobs}.joblib", tmp / f"this tree{jobs}.joblib")
        ok &= same
        print(f"\nmodels identical: {same}")
    return ok


def measure_classify(trees, repeats, tmp, folder, model):
    cpu = {n: [] for n in trees}
    wall = {n: [] for n in trees}
    outputs = {}

    def once(name, tree):
        c, w, out = run(tree, "classify", folder, "--model", model, "--format", "tsv")
        cpu[name].append(c)
        wall[name].append(w)
        outputs[name] = out
        print(f"  classify {name}: {c:.2f} s CPU, {w:.2f} s wall", file=sys.stderr)

    alternate(repeats, trees, once)
    n = len(os.listdir(folder))
    report(f"spamnb classify FOLDER ({n} messages)",
           {"CPU": (cpu["reference"], cpu["this tree"]), "wall": (wall["reference"], wall["this tree"])})
    same = outputs["reference"] == outputs["this tree"]
    print(f"\nverdicts identical: {same}")
    return same


def setup_mailbox(home, files, now):
    """A home with a Maildir++ of ``files`` ``[(label, path)]``, as a user who sorted it
    keeps it: ham in INBOX and .Archive (one every 5 to 365 days back, every 40th
    delivered yesterday), spam in .Junk (every 50th left in INBOX, never sorted)."""
    md = home / "Maildir"
    for folder in ("", ".Archive", ".Junk"):
        for sub in ("cur", "new", "tmp"):
            (md / folder / sub).mkdir(parents=True)
    for i, (label, path) in enumerate(files):
        if label == "spam":
            folder, days = (md if i % 50 == 0 else md / ".Junk"), 5 + i % 60
        else:
            folder, days = (md if i % 2 else md / ".Archive"), (1 if i % 40 == 0 else 5 + i % 360)
        dst = folder / "cur" / f"{1600000000 + i}.M{i}P1.bench:2,S"
        shutil.copyfile(path, dst)
        t = now - (days + 0.25) * 86400  # a quarter day off: the ages setup prints do not round otherwise
        os.utime(dst, (t, t))


def measure_setup(trees, repeats, tmp, files):
    cpu = {n: [] for n in trees}
    wall = {n: [] for n in trees}
    outputs = {}
    template, home, cache = tmp / "setup-template", tmp / "setup-home", tmp / "setup-cache"
    setup_mailbox(template, files, time.time())

    def once(name, tree, timed=True):
        shutil.rmtree(home, ignore_errors=True)
        shutil.copytree(template, home)  # setup writes its model and configuration there
        env = {"HOME": str(home), "USER": "bench-setup-nobody", "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
               "LANG": "C.UTF-8", "XDG_CACHE_HOME": str(cache), "PYTHONPATH": str(tree)}
        c, t = children_cpu(), time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "spamnb", "setup", "--yes"], env=env, cwd=home,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        w, c = time.perf_counter() - t, children_cpu() - c
        if proc.returncode:
            sys.exit(f"bench_ref.py: setup of {tree} failed: {proc.stderr.decode(errors='replace')[-500:]}")
        outputs[name] = proc.stdout, proc.stderr
        shutil.copyfile(home / ".local" / "share" / "spamnb" / "model.joblib", tmp / f"setup-{name}.joblib")
        if timed:
            cpu[name].append(c)
            wall[name].append(w)
            print(f"  setup {name}: {c:.2f} s CPU, {w:.2f} s wall", file=sys.stderr)

    for name, tree in trees.items():  # untimed: each tree's default model built into the cache
        once(name, tree, timed=False)
    alternate(repeats, trees, once)
    report(f"spamnb setup --yes (a Maildir++ of {len(files)} messages)",
           {"CPU": (cpu["reference"], cpu["this tree"]), "wall": (wall["reference"], wall["this tree"])})
    same = outputs["reference"] == outputs["this tree"] and same_model(tmp / "setup-reference.joblib",
                                                                      tmp / "setup-this tree.joblib")
    print(f"\noutputs and models identical: {same}")
    return same


def proc_cpu(pid):
    """CPU seconds of process ``pid`` so far, all its threads (utime + stime of /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


#: the store's commands counted per message: the scoring script's calls, and the question whether
#: a user has a model (the commands a script runs inside Redis are not round trips)
ROUND_TRIPS = ("evalsha", "hexists")


def store_commands(client):
    """``({command: calls so far}`` of :data:`ROUND_TRIPS`, the connections the store accepted)."""
    stats = client.info("commandstats")
    calls = {c: stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ROUND_TRIPS}
    return calls, client.info("stats")["total_connections_received"]


def measure_server(trees, repeats, tmp, paths, model, port, user=None, store=None):
    if shutil.which("spamc") is None:
        print("\n(server not measured: spamc is not installed; apt-get install spamc)")
        return True
    ports = {name: port + i for i, name in enumerate(trees)}
    busy = [str(p) for p in ports.values() if not port_free(p)]
    if busy:
        sys.exit(f"bench_ref.py: port {', '.join(busy)} of 127.0.0.1 is in use: give another --port")
    servers = {}
    ok = True
    try:
        where = ["--store", store[1], "--store-users"] if store else ["--model", model]
        if user and not store:
            where += ["--user-models", _folder(tmp / "users")]  # empty: no user has a model
        ask = ("-c", "-u", user) if user else ()
        for name, tree in trees.items():
            cmd, env = spamnb(tree, "serve", *where, "--socket", tmp / name / "socket",
                              "--spamd", f"127.0.0.1:{ports[name]}", "--no-history", "--no-log-messages")
            log = open(tmp / f"{name}.log", "w")
            t = time.perf_counter()
            servers[name] = subprocess.Popen(cmd, env=env, stdout=log, stderr=log, cwd=tree, start_new_session=True)
            wait_ready(name, servers[name], ports[name], log, t)
            for path in paths[:5]:  # warm-up, untimed
                spamc(ports[name], path, *ask)
        cpu = {n: [] for n in trees}
        latency = {n: [] for n in trees}
        commands = {c: {n: [] for n in trees} for c in ROUND_TRIPS}
        answers = {}

        def once(name, tree):
            pid = servers[name].pid
            before, sent = proc_cpu(pid), store_commands(store[0])[0] if store else {}
            results = [spamc(ports[name], path, *ask) for path in paths]
            cpu[name].append(1000 * (proc_cpu(pid) - before) / len(paths))
            for c, calls in (store_commands(store[0])[0] if store else {}).items():
                commands[c][name].append((calls - sent[c]) / len(paths))
            latency[name].append(1000 * statistics.median(s for s, _, _ in results))
            answers[name] = [(code, out) for _, code, out in results]
            if not all(answered(code, out) for code, out in answers[name]):
                sys.exit(f"bench_ref.py: {name}'s server did not answer every message (log: {tmp / name}.log)")
            print(f"  server {name}: {cpu[name][-1]:.2f} ms CPU, {latency[name][-1]:.2f} ms spamc per message",
                  file=sys.stderr)

        alternate(repeats, trees, once)
        report(f"spamnb serve --spamd{' --store' if store else ''}, per message ({len(paths)} messages a pass, "
               f"spamc -c{' -u ' + user if user else ''})",
               {"server CPU": (cpu["reference"], cpu["this tree"]),
                "spamc latency (median)": (latency["reference"], latency["this tree"])}, unit="ms")
        if store:
            print("\ncommands to the store per message (median of the passes): " + ", ".join(
                f"{c} reference {statistics.median(commands[c]['reference']):.2f}, this tree "
                f"{statistics.median(commands[c]['this tree']):.2f}" for c in ROUND_TRIPS))
        ok = answers["reference"] == answers["this tree"]
        print(f"\nanswers identical: {ok}")
    finally:
        for proc in servers.values():
            stop(proc)
    return ok


def measure_filter(trees, repeats, tmp, paths, model):
    """A delivery agent's ``spamnb filter``: one process per message, cold and through the server."""
    import compileall

    for tree in trees.values():  # neither tree pays for compiling its modules in the runs timed
        compileall.compile_dir(str(Path(tree) / "spamnb"), quiet=1)
    home = _folder(tmp / "filter-home")  # no configuration file, no server on the default socket
    env = {k: str(_folder(home / k)) for k in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_RUNTIME_DIR")}
    env["SPAMNB_SYSTEM_CONFIG"] = str(home / "none.toml")
    raws = [path.read_bytes() for path in paths]
    servers, sockets = {}, {}
    ok = True
    try:
        for name, tree in trees.items():
            sockets[name] = tmp / name / "filter-socket"
            cmd, base = spamnb(tree, "serve", "--model", model, "--socket", sockets[name], "--no-history",
                               "--no-log-messages")
            log = open(tmp / f"{name}-filter-serve.log", "w")
            servers[name] = subprocess.Popen(cmd, env={**base, **env}, stdout=log, stderr=log, cwd=tree,
                                             start_new_session=True)
            t = time.monotonic()
            while not sockets[name].exists():
                if servers[name].poll() is not None or time.monotonic() - t > 120:
                    sys.exit(f"bench_ref.py: {name}'s server did not start (log: {log.name})")
                time.sleep(0.1)
        ways = {"cold": lambda name: [], "server": lambda name: ["--socket", sockets[name]]}
        cpu = {w: {n: [] for n in trees} for w in ways}
        wall = {w: {n: [] for n in trees} for w in ways}
        outputs = {w: {} for w in ways}

        def once(name, tree):
            for way, extra in ways.items():
                cmd, base = spamnb(tree, "filter", "--model", model, "--no-history", *extra(name))
                c0, walls, outs = children_cpu(), [], []
                for raw in raws:
                    t = time.perf_counter()
                    proc = subprocess.run(cmd, input=raw, env={**base, **env}, cwd=tree, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE)
                    walls.append(time.perf_counter() - t)
                    if proc.returncode not in (0, 1, 2) or proc.stderr:
                        sys.exit(f"bench_ref.py: {name}'s filter ({way}) failed: {proc.stderr.decode()[-300:]}")
                    outs.append((proc.returncode, proc.stdout))
                cpu[way][name].append(1000 * (children_cpu() - c0) / len(raws))
                wall[way][name].append(1000 * statistics.median(walls))
                outputs[way][name] = outs
                print(f"  filter {way} {name}: {cpu[way][name][-1]:.1f} ms CPU, {wall[way][name][-1]:.1f} ms wall "
                      "a message", file=sys.stderr)

        alternate(repeats, trees, once)
        for way in ways:
            report(f"spamnb filter --model M < message, {way}{' (--socket: the tree' + chr(39) + 's spamnb serve)' if way == 'server' else ''}, "
                   f"per message ({len(raws)} messages a pass, one process each)",
                   {"CPU": (cpu[way]["reference"], cpu[way]["this tree"]),
                    "wall (median)": (wall[way]["reference"], wall[way]["this tree"])}, unit="ms")
            same = outputs[way]["reference"] == outputs[way]["this tree"]
            ok &= same
            print(f"\noutputs identical: {same}")
    finally:
        for proc in servers.values():
            stop(proc)
    return ok


def measure_imap(trees, repeats, tmp, paths, store):
    import dovecot

    if dovecot.DOVECOT is None:
        print(f"\n(imap not measured: {dovecot.NOT_INSTALLED})")
        return True
    client, url = store
    d = dovecot.Dovecot().start()
    try:
        pw = tmp / "imap-password"
        pw.write_text(d.password + "\n")
        pw.chmod(0o600)
        with d.client() as c:
            for path in paths:
                c.append("INBOX", path.read_bytes())
        account = ["--host", d.host, "--port", d.port, "--user", d.user, "--password-file", pw, "--security", "none"]
        home = _folder(tmp / "imap-home")  # the filter's state and lock, and no configuration file of yours
        env = {k: str(_folder(home / k)) for k in ("XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME")}
        cpu, wall, made = ({n: [] for n in trees} for _ in range(3))

        def once(name, tree):
            connections = store_commands(client)[1]
            c, w, out = run(tree, "imap", "filter", *account, "--store", url, "--dry-run", "--no-learn-verdicts",
                            "--no-log-messages", env=env, stderr=True)
            if f"classified {len(paths)} " not in out.decode(errors="replace"):
                sys.exit(f"bench_ref.py: {name}'s imap filter did not classify every message: {out[-300:]!r}")
            cpu[name].append(c)
            wall[name].append(w)
            made[name].append(store_commands(client)[1] - connections)
            print(f"  imap filter {name}: {c:.2f} s CPU, {w:.2f} s wall, {made[name][-1]} connections to the store",
                  file=sys.stderr)

        alternate(repeats, trees, once)
        report(f"spamnb imap filter --dry-run --store, a pass of {len(paths)} messages (the shared model judging)",
               {"CPU": (cpu["reference"], cpu["this tree"]), "wall": (wall["reference"], wall["this tree"])})
        print(f"\nconnections to the store a pass: reference {statistics.median(made['reference']):.0f}, "
              f"this tree {statistics.median(made['this tree']):.0f}")
    finally:
        d.stop()
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default="main", help="the git revision to compare with (default: main)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each tree per measure (alternating)")
    ap.add_argument("--only", default=",".join(m for m in MEASURES if m not in ("imap", "filter")),
                    help=f"measures, comma-separated: {', '.join(MEASURES)} (default: all but filter and imap)")
    ap.add_argument("--n", type=int, default=600, help="messages sent to the servers a pass (spread over the corpus)")
    ap.add_argument("--port", type=int, default=17861, help="the reference server's port; this tree's gets the next")
    ap.add_argument("--user", help="server: spamc -u USER, a user with no model of their own")
    ap.add_argument("--store", action="store_true", help="server: the model in a private redis-server")
    ap.add_argument("--imap-n", type=int, default=300, help="imap: messages in the INBOX (default 300)")
    ap.add_argument("--filter-n", type=int, default=40, help="filter: messages a pass, a process each (default 40)")
    ap.add_argument("--mailbox", type=int, default=3000,
                    help="messages in setup's Maildir++ (spread over the corpus; default 3000)")
    args = ap.parse_args()
    only = [m.strip() for m in args.only.split(",") if m.strip()]
    unknown = set(only) - set(MEASURES)
    if unknown:
        sys.exit(f"bench_ref.py: unknown measure {', '.join(sorted(unknown))} (choose from {', '.join(MEASURES)})")
    with tempfile.TemporaryDirectory(prefix="bench-ref-") as tmp:
        tmp = Path(tmp)
        for name in ("reference", "this tree"):
            (tmp / name).mkdir(mode=0o700)  # a server's socket folder must be private
        trees = {"reference": revision_tree(args.ref, tmp / "ref"), "this tree": ROOT}
        print(f"## this tree ({ROOT}) against {args.ref}, {args.repeats} alternated runs each; cpus: {os.cpu_count()}")
        ok = True
        if "train" in only:
            ok &= measure_train(trees, args.repeats, tmp)
        if {"classify", "setup", "server", "filter", "imap"} & set(only):
            folder = _folder(tmp / "all")
            files = extract(SHIPPED, folder)
            if "setup" in only:
                n = min(args.mailbox, len(files))
                ok &= measure_setup(trees, args.repeats, tmp, [files[i * len(files) // n] for i in range(n)])
        if {"classify", "server", "filter", "imap"} & set(only):
            step = max(1, len(files) // args.n)
            chosen = [path for _, path in files[::step][: args.n]]
            model = tmp / "model.joblib"
            run(trees["reference"], "train", "--index", SHIPPED, "--model", model)
            if "classify" in only:
                ok &= measure_classify(trees, args.repeats, tmp, folder, model)
            store = redis_proc = None
            try:
                if "imap" in only or args.store and "server" in only:
                    from tools.benchmarks.bench_store import start_redis

                    redis_proc, client, url = start_redis(_folder(tmp / "redis"))
                    run(trees["this tree"], "store", "push", model, url)  # a failure exits: the finally stops redis
                    store = client, url
                if "server" in only:
                    ok &= measure_server(trees, args.repeats, tmp, chosen, model, args.port, args.user,
                                         store if args.store else None)
                if "filter" in only:
                    step = max(1, len(files) // args.filter_n)
                    ok &= measure_filter(trees, args.repeats, tmp, [p for _, p in files[::step][:args.filter_n]],
                                         model)
                if "imap" in only:
                    ok &= measure_imap(trees, args.repeats, tmp, chosen[:args.imap_n], store)
            finally:
                stop(redis_proc)
    return 0 if ok else 1


def _folder(path):
    path.mkdir()
    return path


if __name__ == "__main__":
    sys.exit(main())
