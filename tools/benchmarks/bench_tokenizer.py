#!/usr/bin/env python3
"""Tokenizing throughput (MB/s, messages/s) on whole corpora, in one process.

Messages are read into memory first; only ``tokenize`` is timed.  Best of
``--repeat`` passes (wall clock and CPU time), since other jobs share the box.

    python3 tools/benchmarks/bench_tokenizer.py                       # both corpora
    python3 tools/benchmarks/bench_tokenizer.py INDEX --profile 25    # + cProfile top 25
    python3 tools/benchmarks/bench_tokenizer.py INDEX --stages --repeat 5   # + CPU s per stage
    python3 tools/benchmarks/bench_tokenizer.py INDEX --html-vs main       # HTML: this tree / main
    python3 tools/benchmarks/bench_tokenizer.py INDEX --vs main --stage "header tokens" --pairs 5
    python3 tools/benchmarks/bench_tokenizer.py INDEX --with link_signals --vs main --stage tokenize

Both corpora are read from ../shared/corpora beside the repository (the Chinese
one, trec06c-dev, is not shipped: its licence allows research use only; --corpus
gives another place). Without INDEX, a corpus that is not there is skipped with
one line; an INDEX given that is not there: one line, exit 2
(tools/shared_corpora.py).

``--vs REV``: the stages (``--stage``, repeatable; default all) of this tree against
revision REV's (its ``spamnb`` package taken out of git), each tree in a process of its
own, alternated ``--pairs`` times, which goes first alternating: the medians of the
best-of-``--repeat`` CPU seconds and the median of the paired ratios (this tree / REV).
The ``tokenize`` stage is the whole tokenizer, what the table's CPU column times.

``--with FIELD`` (repeatable) turns on a setting that is off by default, e.g.
``link_signals``, for every measure (both trees' with ``--vs``).
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the project: spamnb, tools
if os.environ.get("BENCH_TREE"):  # --vs: a pass over another tree takes its spamnb, these tools
    sys.path.insert(0, os.environ["BENCH_TREE"])

from tools import shared_corpora  # noqa: E402
from spamnb.mail.sources import iter_index  # noqa: E402
from spamnb.mail.tokenizer import TokenizerConfig, tokenize  # noqa: E402

def load(index):
    return [m.raw for m in iter_index(index)]


STAGES = ("tokenize", "parse", "header tokens", "body tokens", "  of which HTML to text",
          "  (HTML to text with the stdlib HTMLParser)")


def stages(raws, cfg, repeat, only=STAGES):
    """Best-of-``repeat`` CPU seconds of each stage (of ``only``), the stages run on their own:
    parsing, header tokens, body tokens, and within the bodies HTML to text
    (and the same with the stdlib HTMLParser, the reference driver, for comparison)."""
    from spamnb.mail import html_text, mime, tokenizer

    def best(f):
        times = []
        for _ in range(repeat):
            _cold()
            c0 = time.process_time()
            f()
            times.append(time.process_time() - c0)
        return min(times)

    msgs = [mime.parse(r)[0] for r in raws]
    htmls = []
    if any("HTML" in stage for stage in only):
        real = tokenizer.html_to_text
        tokenizer.html_to_text = lambda h: htmls.append(h) or real(h)  # collect the HTML parts once
        try:
            for m in msgs:
                tokenizer.body_tokens(m, cfg)
        finally:
            tokenizer.html_to_text = real
    runs = {"tokenize": lambda: [tokenize(r, cfg) for r in raws],
            "parse": lambda: [mime.parse(r) for r in raws],
            "header tokens": lambda: [tokenizer.header_tokens(m, cfg) for m in msgs],
            "body tokens": lambda: [tokenizer.body_tokens(m, cfg) for m in msgs],
            "  of which HTML to text": lambda: [html_text.html_to_text(h) for h in htmls],
            "  (HTML to text with the stdlib HTMLParser)":
                lambda: [html_text.html_to_text(h, stdlib=True) for h in htmls]}
    return {stage: best(runs[stage]) for stage in STAGES if stage in only}


def stages_vs(indexes, ref, only, repeat, pairs, settings=()):
    """:func:`stages` of this tree and of revision ``ref``, each pass a process of its own
    (``--emit-stages``), alternated ``pairs`` times: per corpus and stage, the medians and
    the median paired ratio (this tree / ref)."""
    import json
    import statistics
    import subprocess
    import tempfile
    from pathlib import Path

    from tools.benchmarks.token_hashes import ROOT, revision_tree

    with tempfile.TemporaryDirectory(prefix="bench-tokenizer-") as tmp:
        trees = {"ref": revision_tree(ref, Path(tmp) / "ref"), "this": ROOT}
        runs = {"ref": [], "this": []}
        for p in range(pairs):
            for name in (("ref", "this") if p % 2 == 0 else ("this", "ref")):
                cmd = [sys.executable, os.path.abspath(__file__), *map(str, indexes), "--repeat", str(repeat),
                       "--emit-stages", json.dumps(list(only)), *(f"--with={f}" for f in settings)]
                out = subprocess.run(cmd, env={**os.environ, "BENCH_TREE": str(trees[name])},
                                     stdout=subprocess.PIPE, text=True, check=True).stdout
                runs[name].append(json.loads(out))
                print(f"  pair {p + 1} {name}: {out.strip()}", file=sys.stderr, flush=True)
    print(f"| corpus | stage | {ref} CPU s | this tree CPU s | paired ratio (this / {ref}) |")
    print("|---|---|---|---|---|")
    for corpus in runs["this"][0]:
        for stage in runs["this"][0][corpus]:
            theirs = [r[corpus][stage] for r in runs["ref"]]
            mine = [r[corpus][stage] for r in runs["this"]]
            ratio = statistics.median(a / b for a, b in zip(mine, theirs))
            print(f"| {corpus} | {stage.strip()} | {statistics.median(theirs):.3f} | "
                  f"{statistics.median(mine):.3f} | {ratio:.3f} |")


def _cold():
    """Empty the tokenizer's memo caches (:func:`spamnb.mail.tokenizer.clear_memos`; in a
    revision from before it, for ``--vs``, the lexer's two that it had)."""
    from spamnb.mail import lexer, tokenizer

    if hasattr(tokenizer, "clear_memos"):
        tokenizer.clear_memos()
    else:
        lexer.domain_tokens.cache_clear()
        lexer.crack_url.cache_clear()


def html_pairs(raws, cfg, ref, pairs):
    """CPU seconds of ``html_to_text`` over every HTML part, this tree's and
    revision ``ref``'s (its html_text.py taken out of git, loaded beside
    this one), alternated ``pairs`` times in this process: the medians and
    the median paired ratio (this tree / ref)."""
    import importlib.util
    import statistics
    import subprocess
    import tempfile

    from spamnb.mail import html_text, tokenizer

    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    source = subprocess.run(["git", "-C", root, "show", f"{ref}:spamnb/mail/html_text.py"],
                            capture_output=True, check=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ref_html_text.py")
        with open(path, "wb") as f:
            f.write(source)
        spec = importlib.util.spec_from_file_location("ref_html_text", path)
        other = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(other)
    htmls = []
    real = tokenizer.html_to_text
    tokenizer.html_to_text = lambda h: htmls.append(h) or real(h)  # collect the HTML parts once
    try:
        for r in raws:
            tokenize(r, cfg)
    finally:
        tokenizer.html_to_text = real
    differ = sum(html_text.html_to_text(h) != other.html_to_text(h) for h in htmls)

    def one(module):
        _cold()
        getattr(module, "clear_memo", lambda: None)()  # the other revision's own start-tag memo, if it has one
        c0 = time.process_time()
        for h in htmls:
            module.html_to_text(h)
        return time.process_time() - c0

    mine, theirs = [], []
    for _ in range(pairs):
        theirs.append(one(other))
        mine.append(one(html_text))
    ratio = statistics.median(a / b for a, b in zip(mine, theirs))
    return len(htmls), differ, statistics.median(theirs), statistics.median(mine), ratio


def bench(raws, cfg, repeat):
    best_wall = best_cpu = float("inf")
    ntok = 0
    for _ in range(repeat):
        _cold()
        w0, c0 = time.perf_counter(), time.process_time()
        ntok = 0
        for r in raws:
            ntok += len(tokenize(r, cfg))
        best_wall = min(best_wall, time.perf_counter() - w0)
        best_cpu = min(best_cpu, time.process_time() - c0)
    return best_wall, best_cpu, ntok


def _name(index):
    return os.path.basename(os.path.dirname(os.path.abspath(index)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("indexes", nargs="*",
                    help="TREC indexes (default: ../shared/corpora/spamassassin and the --corpus folder)")
    ap.add_argument("--corpus", default=str(shared_corpora.TREC06C),
                    help="the trec06c-dev folder, measured when no INDEX is given "
                         "(default: ../shared/corpora/trec06c-dev beside the repository)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only-headers", help="comma-separated header set")
    ap.add_argument("--stages", action="store_true",
                    help="also the CPU seconds of parsing, header tokens, body tokens and HTML, each alone")
    ap.add_argument("--html-vs", metavar="REV",
                    help="also HTML to text against revision REV's html_text.py, alternated --pairs times "
                         "in this process (CPU medians, median paired ratio, parts whose result differs)")
    ap.add_argument("--pairs", type=int, default=9, help="pairs for --html-vs and --vs (default 9)")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also profile one pass and print the top N functions by own time")
    ap.add_argument("--vs", metavar="REV",
                    help="instead: the stages of this tree against revision REV's, each in a process of "
                         "its own, alternated --pairs times (CPU medians, median paired ratio)")
    ap.add_argument("--with", dest="on", action="append", default=[], metavar="FIELD",
                    help="turn on a TokenizerConfig setting that is off by default, e.g. link_signals (repeatable)")
    ap.add_argument("--stage", action="append", choices=[s.strip() for s in STAGES],
                    help="with --vs: only this stage (repeatable; default all)")
    ap.add_argument("--emit-stages", help=argparse.SUPPRESS)  # internal: one tree's stages, as JSON
    args = ap.parse_args()
    if args.indexes:
        indexes = [shared_corpora.require(i) for i in args.indexes]
    else:
        indexes = [i for i in (shared_corpora.find(shared_corpora.SPAMASSASSIN),
                               shared_corpora.find(args.corpus, chinese=True, option="--corpus")) if i]
        if not indexes:
            sys.exit(shared_corpora.EXIT_ABSENT)
    settings = {field: True for field in args.on}
    if args.only_headers is not None:
        settings["only_headers"] = tuple(h for h in args.only_headers.split(",") if h)
    try:
        cfg = TokenizerConfig(**settings)
    except (TypeError, ValueError) as exc:
        sys.exit(f"bench_tokenizer.py: {exc}")
    if args.emit_stages:
        import json

        only = json.loads(args.emit_stages)
        print(f"  tokenizer: {sys.modules[tokenize.__module__].__file__}", file=sys.stderr)
        print(json.dumps({_name(i): stages(load(i), cfg, args.repeat, only) for i in indexes}))
        return
    if args.vs:
        only = [s for s in STAGES if args.stage is None or s.strip() in args.stage]
        stages_vs(indexes, args.vs, only, args.repeat, args.pairs, args.on)
        return
    print("| corpus | messages | MB | wall s | CPU s | MB/s | messages/s | ms/message | tokens/message |")
    print("|---|---|---|---|---|---|---|---|---|")
    for index in indexes:
        raws = load(index)
        mb = sum(map(len, raws)) / 1e6
        wall, cpu, ntok = bench(raws, cfg, args.repeat)
        name = _name(index)
        print(f"| {name} | {len(raws)} | {mb:.1f} | {wall:.2f} | {cpu:.2f} | {mb / wall:.1f} | "
              f"{len(raws) / wall:.0f} | {1000 * wall / len(raws):.3f} | {ntok / len(raws):.0f} |",
              flush=True)
        if args.stages:
            for stage, cpu_s in stages(raws, cfg, args.repeat, STAGES[1:]).items():  # the whole: above
                print(f"|   {stage} | | | | {cpu_s:.2f} | | | | |", flush=True)
        if args.html_vs:
            parts, differ, ref_s, this_s, ratio = html_pairs(raws, cfg, args.html_vs, args.pairs)
            print(f"HTML to text, {parts} parts, {args.pairs} pairs: {args.html_vs} {ref_s:.3f} CPU s, "
                  f"this tree {this_s:.3f} (medians), paired ratio {ratio:.3f}; {differ} parts differ",
                  flush=True)
        if args.profile:
            import cProfile
            import pstats
            prof = cProfile.Profile()
            prof.enable()
            for r in raws:
                tokenize(r, cfg)
            prof.disable()
            pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(args.profile)


if __name__ == "__main__":
    main()
