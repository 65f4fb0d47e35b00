#!/usr/bin/env python3
"""Does the tokenizer still give every message the same tokens? One digest per message.

A speed change to the tokenizer must not change what it emits: each message's
token multiset (the sorted token list, so order does not count: the model
counts tokens, it does not read them in order) is hashed, under the default
configuration and a few others that take other paths through the code, for
every message of:

- the shipped corpus (``corpora/spamassassin.tar.xz``) and the sample maildir;
- the golden messages (``tests/golden/*.eml``) and the fuzz corpus (the committed
  small kinds and, with ``--big``, the generated big ones of
  ``tools/generators/make_fuzz_corpus.py``);
- the evaluation corpora beside the repository (``../shared/corpora/*/index``),
  those that are there (one line says which are not).

Compared with another revision's tokenizer: its ``spamnb`` package is taken out
of git (``git archive REV spamnb``) into a temporary folder and both trees hash
the same messages in their own process::

    python3 tools/benchmarks/token_hashes.py                  # this tree against main
    python3 tools/benchmarks/token_hashes.py --ref HEAD~1 --big
    python3 tools/benchmarks/token_hashes.py --write FILE     # this tree's digests (JSON lines)
    python3 tools/benchmarks/token_hashes.py --against FILE   # this tree against a written file
    # a speed change across a kept token change: leave out the namespaces it added
    python3 tools/benchmarks/token_hashes.py --ref d10ff10 --ignore layout: --ignore punct:excl:

Prints the messages whose digests differ (with the tokens only one side has, for
the first few) and exits 1 if any does, 0 if none.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter
from pathlib import Path

# the project's tools, appended: the spamnb of a tree given on PYTHONPATH (another revision's) comes first
sys.path.append(str(Path(__file__).resolve().parents[2]))
from tools import shared_corpora  # noqa: E402 (where the evaluation corpora live)

ROOT = shared_corpora.ROOT
SHARED = shared_corpora.SHARED

# Configurations besides the default, each taking another branch of the tokenizer
# (name -> TokenizerConfig keyword arguments); hashed on the shipped corpus, the
# golden and fuzz messages, and on trec06c-dev (the one corpus of multibyte text).
VARIANTS = {
    "fair-headers": {"only_headers": ["subject", "from", "to", "content-type", "content-transfer-encoding"]},
    "cjk-bigram+bigrams": {"cjk": "bigram", "bigrams": True},
    "html-text+plain": {"html": "text", "alternative": "plain", "fold_header_names": True},
    "html-strip+html": {"html": "strip", "alternative": "html", "case_fold": False, "nfkc": False},
    "html-raw+short-parts": {"html": "raw", "max_part_bytes": 3000, "received_hops": 1,
                             "min_word_len": 1, "max_word_len": 20, "max_parts": 5, "max_depth": 2},
    # the settings that are off by default: their tokens, and the URLs a plain part's words and links share
    "signals-on": {"sender_signals": True, "link_signals": True, "url_path_words": True, "fold_web_schemes": True},
    "links-unfolded": {"link_signals": True, "case_fold": False, "nfkc": False},
}
VARIANT_CORPORA = ("shipped", "golden", "fuzz", "trec06c-dev")
# and today's mail, whose links those settings read, for the two with link_signals on
LINK_CORPORA = ("modern-spam-dev", "enron-ham-dev")


def _corpora(big):
    """``(corpus name, iterator of (source, raw))`` for every corpus that is there."""
    from spamnb.mail.sources import iter_index, iter_messages

    yield "shipped", ((m.source, m.raw) for m in iter_index(ROOT / "corpora" / "spamassassin.tar.xz"))
    yield "sample-maildir", ((m.source, m.raw) for m in iter_messages(str(ROOT / "corpora" / "sample-maildir")))
    yield "golden", ((p.name, p.read_bytes()) for p in sorted((ROOT / "tests" / "golden").glob("*.eml")))
    fuzz = ((p.name, p.read_bytes()) for p in sorted((ROOT / "tests" / "data" / "fuzz").glob("*.eml")))
    if big:
        spec = importlib.util.spec_from_file_location("make_fuzz_corpus", ROOT / "tools" / "generators" / "make_fuzz_corpus.py")
        gen = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(gen)
        fuzz = (*fuzz, *((name, make()) for name, make in gen.BIG.items()))
    yield "fuzz", fuzz
    for index in sorted(SHARED.glob("*/index")):
        yield index.parent.name, ((m.source, m.raw) for m in iter_index(index))


def emit(big, out, ignore=()):
    """Write ``{"corpus", "config", "source", "digest"}`` lines for every message (this tree),
    tokens starting with one of ``ignore`` left out."""
    import spamnb.mail.tokenizer as tk

    print(f"tokenizer: {tk.__file__}", file=sys.stderr)
    configs = {"default": tk.DEFAULT_CONFIG, **{k: tk.TokenizerConfig(**v) for k, v in VARIANTS.items()}}
    for corpus, messages in _corpora(big):
        names = [n for n in configs if n == "default" or corpus in VARIANT_CORPORA
                 or (corpus in LINK_CORPORA and VARIANTS[n].get("link_signals"))]
        for source, raw in messages:
            for name in names:
                tokens = sorted(t for t in tk.tokenize(raw, configs[name]) if not t.startswith(ignore))
                digest = hashlib.blake2b("\n".join(tokens).encode("utf-8", "surrogatepass"),
                                         digest_size=12).hexdigest()
                out.write(json.dumps({"corpus": corpus, "config": name, "source": source,
                                      "digest": digest}) + "\n")
    missing = [c for c in ("spamassassin", "trec06c-dev", "enron-ham-dev", "modern-spam-dev")
               if not (SHARED / c / "index").exists()]
    if missing:
        print(f"token_hashes: not hashed (no such corpus in {SHARED}): {', '.join(missing)}", file=sys.stderr)


def revision_tree(rev, dest):
    """Another revision's ``spamnb`` package, taken out of git into the new folder ``dest``
    (run it with ``PYTHONPATH=dest``: the same interpreter and libraries as this tree)."""
    dest = Path(dest)
    dest.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "spamnb"],
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as t:
        t.extractall(dest, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return dest


def _run_emit(tree, big, path, ignore=()):
    """Hash every message with the ``spamnb`` package found in ``tree``, into ``path``."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, __file__, "--emit", str(path)] + (["--big"] if big else [])
    cmd += [f"--ignore={prefix}" for prefix in ignore]
    return subprocess.Popen(cmd, env=env)


def _read(path):
    with open(path) as f:
        return {(r["corpus"], r["config"], r["source"]): r["digest"] for r in map(json.loads, f)}


def _tokens_of(tree, corpus, config, source, big):
    """The token list of one message under ``tree``'s tokenizer (for the report)."""
    code = ("import json, sys; sys.argv[1:] = []; import token_hashes as th, spamnb.mail.tokenizer as tk\n"
            f"corpus, config, source, big = {corpus!r}, {config!r}, {source!r}, {big!r}\n"
            "cfg = tk.DEFAULT_CONFIG if config == 'default' else tk.TokenizerConfig(**th.VARIANTS[config])\n"
            "raw = next(r for c, ms in th._corpora(big) if c == corpus for s, r in ms if s == source)\n"
            "print(json.dumps(tk.tokenize(raw, cfg)))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(ROOT / "tools" / "benchmarks")])}
    return json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                     text=True, check=True).stdout)


def compare(base, mine, base_tree, big, show=5):
    """Print the differences; the number of messages that differ."""
    bad = sorted(k for k in base.keys() | mine.keys() if base.get(k) != mine.get(k))
    per = Counter((c, cfg) for c, cfg, _ in {k for k in base.keys() | mine.keys()})
    for (corpus, config), n in sorted(per.items()):
        diff = sum(1 for c, cfg, _ in bad if (c, cfg) == (corpus, config))
        print(f"{corpus:16} {config:22} {n:6} messages, {diff} differ")
    for key in bad[:show]:
        corpus, config, source = key
        print(f"\nDIFFERS {corpus} [{config}] {source}")
        if key not in base or key not in mine:
            print("  only on one side:", "base" if key in base else "this tree")
            continue
        if base_tree is not None:
            a = Counter(_tokens_of(base_tree, corpus, config, source, big))
            b = Counter(_tokens_of(ROOT, corpus, config, source, big))
            print("  only before:", sorted((a - b).elements())[:20])
            print("  only now:   ", sorted((b - a).elements())[:20])
    return len(bad)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default="main", help="the git revision to compare with (default: main)")
    ap.add_argument("--against", type=Path, help="compare with digests written by --write instead")
    ap.add_argument("--write", type=Path, help="write this tree's digests to FILE and stop")
    ap.add_argument("--big", action="store_true", help="also hash the big generated fuzz kinds (slower)")
    ap.add_argument("--ignore", action="append", default=[], metavar="PREFIX",
                    help="leave out tokens starting with PREFIX on both sides (namespaces a kept "
                         "change added); repeatable")
    ap.add_argument("--emit", type=Path, help=argparse.SUPPRESS)  # internal: one tree's digests
    args = ap.parse_args()
    ignore = tuple(args.ignore)
    if args.emit:
        with open(args.emit, "w") as f:
            emit(args.big, f, ignore)
        return 0
    with tempfile.TemporaryDirectory(prefix="token-hashes-") as tmp:
        tmp = Path(tmp)
        if args.write:
            return _run_emit(ROOT, args.big, args.write, ignore).wait()
        base_tree = None
        if args.against:
            base_file = args.against
            procs = []
        else:
            base_tree = revision_tree(args.ref, tmp / "base")
            base_file = tmp / "base.jsonl"
            procs = [_run_emit(base_tree, args.big, base_file, ignore)]
        procs.append(_run_emit(ROOT, args.big, tmp / "mine.jsonl", ignore))
        if any(p.wait() for p in procs):
            print("token_hashes: hashing failed (above)", file=sys.stderr)
            return 2
        n = compare(_read(base_file), _read(tmp / "mine.jsonl"), base_tree, args.big)
    print(f"\n{n} message digests differ" if n else "\nevery message gives the same tokens")
    return 1 if n else 0


if __name__ == "__main__":
    sys.exit(main())
