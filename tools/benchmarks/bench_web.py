#!/usr/bin/env python3
"""``spamnb web``'s list pages, this tree against another revision (the review's N+1).

The Unsure and History pages show a page of rows (25), each with the clues of
its message. A history of ``--rows`` messages of the shipped corpus (every
third recorded as unsure, the rest as the corpus labels them; the bodies kept
as ``spamnb`` keeps them: every unsure one and the 200 most recent others) and
a model trained on the same corpus. Each tree (the reference's ``spamnb``
package taken out of git, run by the same interpreter and libraries:
``python -m spamnb web`` with ``PYTHONPATH``) serves its own copy of both.

First the two trees' pages are compared: every page (list pages, a message,
the Overview, the Model page), a choice (learn a message as spam) and the
pages after it, with the CSRF token (random per server) and the folder of
each tree's copy masked. Exit status 1
if any answer differs. Then each round asks each server (which goes first
alternates) for pages 0..``--pages``-1 of /unsure and of /history; per page:
the client's wall time (loopback HTTP, one request at a time) and the
server's CPU time (all its threads, /proc/PID/stat). Figures: medians over
rounds and the median of the paired ratios (this tree / reference: below 1
is faster).

Usage::

    python3 tools/benchmarks/bench_web.py --ref main --rows 1000 --rounds 15
    python3 tools/benchmarks/bench_web.py --model M.joblib   # skip training (about 30 s)

Linux only (/proc).
"""

from __future__ import annotations

import argparse
import math
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the project: spamnb, tools

from tools.benchmarks.bench_ref import SHIPPED, alternate, proc_cpu, report, run, spamnb  # noqa: E402
from tools.benchmarks.bench_spamd import stop  # noqa: E402
from tools.benchmarks.token_hashes import revision_tree  # noqa: E402

CSRF = re.compile(r'name="csrf" value="[0-9a-f]+"')


def make_history(path, rows):
    """``rows`` verdicts of the shipped corpus, oldest first, a minute apart, ending now."""
    from spamnb.mail.sources import iter_index
    from spamnb.storage import history

    records, t0 = [], time.time() - 60 * rows
    for i, msg in enumerate(iter_index(str(SHIPPED), on_error=lambda *_: None)):
        if i == rows:
            break
        label = "unsure" if i % 3 == 0 else msg.label
        score = {"unsure": 0.5, "spam": 20.0, "ham": -20.0}[label]
        records.append(history.row(msg.raw, label, score, 1 / (1 + math.exp(-score)), via="filter",
                                   t=t0 + 60 * i))
    db = history.open_db(path)
    try:
        history.write(db, records)  # the retention of a real history: the bodies spamnb keeps
        history.prune(db)
    finally:
        db.close()
    return len(records)


class Server:
    """One tree's ``spamnb web`` on 127.0.0.1 (any free port), logged to a file."""

    def __init__(self, tree, model, hist, log):
        cmd, env = spamnb(tree, "web", "--model", model, "--history", hist, "--listen", "127.0.0.1:0")
        self.log = Path(log)
        self.folder = str(Path(model).parent)  # the Model page names its files: masked to compare
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=out, cwd=tree, start_new_session=True)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and self.proc.poll() is None:
            m = re.search(r"open (http://\S+)", self.log.read_text(errors="replace"))
            if m:
                break
            time.sleep(0.1)
        else:
            stop(self.proc)
            sys.exit(f"bench_web.py: spamnb web of {tree} did not start: {self.log.read_text()[-800:]}")
        self.base, token = m.group(1).split("/?token=")
        # the printed address sends a browser to the page's own (/s/KEY/); a revision before that
        # kept the token in a cookie instead
        self.root, self.cookie, self.csrf = "", None, None
        headers = self.open(f"/?token={token}")[2]
        self.root = headers["Location"][:-1]
        self.cookie = (headers["Set-Cookie"] or "").split(";")[0] or None

    def open(self, path, data=None):
        """``(status, body, headers)`` of one request at the page's address, redirects not followed."""
        req = urllib.request.Request(self.base + self.root + path, data=data,
                                     headers={"Cookie": self.cookie} if self.cookie else {})
        try:
            with urllib.request.build_opener(NoRedirect).open(req, timeout=120) as r:
                return r.status, r.read().decode(), r.headers
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(), exc.headers

    def get(self, path, data=None):
        """``(status, body)``, redirects not followed (the CSRF token and the page's address masked)."""
        status, body, _ = self.open(path, data)
        found = CSRF.search(body)
        if found:
            self.csrf = found.group(0).split('value="')[1][:-1]
        body = CSRF.sub('name="csrf" value="-"', body).replace(self.folder, "SITE")
        return status, body.replace(self.root, "") if self.root else body


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def compare(servers, pages):
    """Every page and a choice, on each server: whether the answers are the same."""
    paths = ["/", *(f"/{kind}?page={p}" for kind in ("unsure", "history") for p in range(pages)),
             "/history?verdict=spam", "/history?q=a&verdict=ham&page=1", "/message/1", "/message/2",
             "/message/999999", "/overview", "/model?older_than=30&max_messages=2"]
    answers = {}
    for name, server in servers.items():
        got = [server.get(path) for path in paths]
        unsure = re.findall(r'<tr id="m(\d+)"', got[1][1])
        got.append(server.get("/learn", f"id={unsure[0]}&label=spam&back=/unsure&csrf={server.csrf}".encode()))
        got += [server.get(path) for path in ("/unsure", "/history?verdict=unsure", f"/message/{unsure[0]}")]
        answers[name] = got
    same = [a == b for a, b in zip(*answers.values())]
    for path, ok in zip([*paths, "POST /learn", "/unsure", "/history?verdict=unsure", "/message/N"], same):
        if not ok:
            print(f"  differs: {path}", file=sys.stderr)
    return all(same)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default="main", help="the git revision to compare with (default: main)")
    ap.add_argument("--rows", type=int, default=1000, help="verdicts in the history (default 1000)")
    ap.add_argument("--rounds", type=int, default=15, help="rounds, each tree once a round (alternating)")
    ap.add_argument("--pages", type=int, default=8, help="pages of each list asked for a round (default 8)")
    ap.add_argument("--model", help="a model file to serve (default: one trained on the shipped corpus)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-web-") as tmp:
        tmp = Path(tmp)
        trees = {"reference": revision_tree(args.ref, tmp / "ref"), "this tree": ROOT}
        model = Path(args.model).resolve() if args.model else tmp / "model.joblib"
        if not args.model:
            run(ROOT, "train", "--index", SHIPPED, "--model", model)
        hist = tmp / "history.sqlite"
        n = make_history(hist, args.rows)
        servers = {}
        try:
            for i, (name, tree) in enumerate(trees.items()):
                mine = tmp / f"site{i}"
                mine.mkdir(mode=0o700)
                shutil.copy(model, mine / "model.joblib")
                shutil.copy(hist, mine / "history.sqlite")
                servers[name] = Server(tree, mine / "model.joblib", mine / "history.sqlite", tmp / f"web{i}.log")
            print(f"## spamnb web, this tree ({ROOT}) against {args.ref}: a history of {n} verdicts, "
                  f"{args.rounds} alternated rounds of {args.pages} pages of /unsure and of /history")
            same = compare(servers, args.pages)
            print(f"\npages identical: {same}")
            wall = {name: [] for name in trees}
            cpu = {name: [] for name in trees}
            lists = [f"/{kind}?page={p}" for p in range(args.pages) for kind in ("unsure", "history")]

            def once(name, tree):
                server = servers[name]
                before, t = proc_cpu(server.proc.pid), time.perf_counter()
                for path in lists:
                    status, _ = server.get(path)
                    if status != 200:
                        sys.exit(f"bench_web.py: {name} answered {status} to {path} (log: {server.log})")
                wall[name].append(1000 * (time.perf_counter() - t) / len(lists))
                cpu[name].append(1000 * (proc_cpu(server.proc.pid) - before) / len(lists))
                print(f"  {name}: {wall[name][-1]:.1f} ms wall, {cpu[name][-1]:.1f} ms server CPU a page",
                      file=sys.stderr)

            for name in trees:  # warm-up, untimed (the model's first load, the history's pages cached)
                once(name, None)
                wall[name].clear()
                cpu[name].clear()
            alternate(args.rounds, trees, once)
            report("a list page (25 rows with their clues), per page",
                   {"wall (client)": (wall["reference"], wall["this tree"]),
                    "server CPU": (cpu["reference"], cpu["this tree"])}, unit="ms")
        finally:
            for server in servers.values():
                stop(server.proc)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
