#!/usr/bin/env python3
"""spamnb side by side with its peers, on the same folds or split, in one run.

Runs every spamnb model type, scikit-learn's CountVectorizer + MultinomialNB on
the raw bytes, and bogofilter and spamprobe when they are installed (Debian's
packages), each in a fresh process, and prints (and with --out writes) one
markdown table. All protocols and options are those of scripts/run_peers.py.

    python scripts/compare_peers.py ../shared/corpora/spamassassin/index --folds 10 --out sa.md
    python scripts/compare_peers.py ../shared/corpora/trec06c-dev/index --halves \\
        --headers-keep Subject,From,To,Content-Type,Content-Transfer-Encoding --out trec.md
"""

import contextlib
import io
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import run_peers  # noqa: E402

DEFAULT = ["spamnb", "spamnb-bernoulli", "spamnb-complement", "spamnb-counts", "sklearn-nb"]


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    out = None
    if "--out" in argv:
        i = argv.index("--out")
        out = argv[i + 1]
        del argv[i:i + 2]
    if "--peers" not in argv:
        peers = DEFAULT + [tool for tool in ("bogofilter", "spamprobe") if shutil.which(tool)]
        argv += ["--peers", ",".join(peers)]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        run_peers.main(argv)
    text = buf.getvalue()
    command = "python scripts/compare_peers.py " + " ".join(sys.argv[1:] if argv is None else argv)
    sys.stdout.write(text)
    if out:
        with open(out, "w", encoding="utf-8") as f:
            f.write(f"<!-- {command} -->\n{text}")


if __name__ == "__main__":
    main()
