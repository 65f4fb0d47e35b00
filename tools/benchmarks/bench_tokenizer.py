#!/usr/bin/env python3
"""Tokenizing throughput (MB/s, messages/s) on whole corpora, in one process.

Messages are read into memory first; only ``tokenize`` is timed.  Best of
``--repeat`` passes (wall clock and CPU time), since other jobs share the box.

    python3 tools/benchmarks/bench_tokenizer.py                       # both corpora
    python3 tools/benchmarks/bench_tokenizer.py INDEX --profile 25    # + cProfile top 25
    python3 tools/benchmarks/bench_tokenizer.py INDEX --stages --repeat 5   # + CPU s per stage

Both corpora are read from ../shared/corpora beside the repository (the Chinese
one, trec06c-dev, is not shipped: its licence allows research use only; --corpus
gives another place). Without INDEX, a corpus that is not there is skipped with
one line; an INDEX given that is not there: one line, exit 2
(tools/shared_corpora.py).
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the project: spamnb, tools

from tools import shared_corpora  # noqa: E402
from spamnb.mail.sources import iter_index  # noqa: E402
from spamnb.mail.tokenizer import TokenizerConfig, tokenize  # noqa: E402

def load(index):
    return [m.raw for m in iter_index(index)]


def stages(raws, cfg, repeat):
    """Best-of-``repeat`` CPU seconds of each stage, the stages run on their own:
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
    real = tokenizer.html_to_text
    tokenizer.html_to_text = lambda h: htmls.append(h) or real(h)  # collect the HTML parts once
    try:
        for m in msgs:
            tokenizer.body_tokens(m, cfg)
    finally:
        tokenizer.html_to_text = real
    return {"parse": best(lambda: [mime.parse(r) for r in raws]),
            "header tokens": best(lambda: [tokenizer.header_tokens(m, cfg) for m in msgs]),
            "body tokens": best(lambda: [tokenizer.body_tokens(m, cfg) for m in msgs]),
            "  of which HTML to text": best(lambda: [html_text.html_to_text(h) for h in htmls]),
            "  (HTML to text with the stdlib HTMLParser)":
                best(lambda: [html_text.html_to_text(h, stdlib=True) for h in htmls])}


def _cold():
    """Empty the tokenizer's memo caches, so that every pass costs what one pass
    of training costs (a repeated pass would find every host already cracked)."""
    from spamnb.mail import tokenizer

    tokenizer.clear_memos()


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
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also profile one pass and print the top N functions by own time")
    args = ap.parse_args()
    if args.indexes:
        indexes = [shared_corpora.require(i) for i in args.indexes]
    else:
        indexes = [i for i in (shared_corpora.find(shared_corpora.SPAMASSASSIN),
                               shared_corpora.find(args.corpus, chinese=True, option="--corpus")) if i]
        if not indexes:
            sys.exit(shared_corpora.EXIT_ABSENT)
    cfg = TokenizerConfig()
    if args.only_headers is not None:
        cfg = TokenizerConfig(only_headers=tuple(h for h in args.only_headers.split(",") if h))
    print("| corpus | messages | MB | wall s | CPU s | MB/s | messages/s | ms/message | tokens/message |")
    print("|---|---|---|---|---|---|---|---|---|")
    for index in indexes:
        raws = load(index)
        mb = sum(map(len, raws)) / 1e6
        wall, cpu, ntok = bench(raws, cfg, args.repeat)
        name = os.path.basename(os.path.dirname(os.path.abspath(index)))
        print(f"| {name} | {len(raws)} | {mb:.1f} | {wall:.2f} | {cpu:.2f} | {mb / wall:.1f} | "
              f"{len(raws) / wall:.0f} | {1000 * wall / len(raws):.3f} | {ntok / len(raws):.0f} |",
              flush=True)
        if args.stages:
            for stage, cpu_s in stages(raws, cfg, args.repeat).items():
                print(f"|   {stage} | | | | {cpu_s:.2f} | | | | |", flush=True)
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
