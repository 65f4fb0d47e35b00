"""Where the scripts find the evaluation corpora kept outside the project, and
what they do when one is not there.

The full evaluation corpora live beside the repository, in
``<repo>/../shared/corpora`` (CI has them there), each a folder with a TREC
``index`` file (lines ``ham PATH`` / ``spam PATH``, relative to the folder).
The Chinese one, ``trec06c-dev`` (part of the TREC 2006 Chinese spam corpus),
is never shipped: its terms allow research use only, not publishing it or any
material portion (``corpora/README.md``). Scripts that evaluate on it read
``<repo>/../shared/corpora/trec06c-dev`` unless given ``--corpus PATH`` (a
folder with an ``index``, or an index file or archive).

A corpus that is not there: the script prints one line on stderr saying where
it looked and how to give it, and exits with ``EXIT_ABSENT`` (2): nothing was
measured, which a caller (a shell loop, CI) must be able to tell from a
measurement (0) and from a failure (1). A script that measures the Chinese
corpus beside others by default (``bench_tokenizer.py``, ``bench_train.py``)
prints the same line and measures the others.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "corpora"
TREC06C = SHARED / "trec06c-dev"
SPAMASSASSIN = SHARED / "spamassassin"
EXIT_ABSENT = 2


def index_path(corpus) -> Path:
    """A corpus folder's ``index``; an index file or archive as it is."""
    p = Path(os.path.abspath(os.fspath(corpus)))
    return p / "index" if p.is_dir() else p


def absent_line(corpus, prog=None, chinese=None, option=None) -> str:
    """The one line a script prints for a corpus that is not there (``chinese``:
    whether it stands for trec06c-dev, None: whether its path names it;
    ``option``: the script's option that gives the corpus, if it has one)."""
    prog = prog or os.path.basename(sys.argv[0]) or "script"
    where = index_path(corpus)
    give = f"pass {option} PATH" if option else "give its path"
    if chinese or (chinese is None and "trec06c" in str(where)):
        why = ("trec06c-dev is not shipped (research-use licence): put it at "
               f"{TREC06C} or {give}, see corpora/README.md")
    else:
        why = f"the evaluation corpora live beside the repository, in {SHARED}"
    return f"{prog}: skipped: no corpus at {where}; {why}"


def find(corpus, prog=None, chinese=None, option=None) -> str | None:
    """The corpus's index path, or None after printing :func:`absent_line`."""
    where = index_path(corpus)
    if where.exists():
        return str(where)
    print(absent_line(corpus, prog, chinese, option), file=sys.stderr, flush=True)
    return None


def require(corpus, prog=None, chinese=None, option=None) -> str:
    """The corpus's index path; exits with EXIT_ABSENT (after the line) when it is not there."""
    found = find(corpus, prog, chinese, option)
    if found is None:
        sys.exit(EXIT_ABSENT)
    return found
