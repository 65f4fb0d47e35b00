#!/usr/bin/env python3
"""spamnb side by side with its peers, on the same folds or split, in one run.

Runs every spamnb model type, scikit-learn's CountVectorizer + MultinomialNB on
the raw bytes, and bogofilter, spamprobe and CRM114 when they are installed
(Debian's packages; an absent one is skipped with a line on stderr), each in a
fresh process, and prints (and with --out writes) one markdown table. All
protocols and options are those of tools/studies/run_peers.py.

    python tools/studies/compare_peers.py ../shared/corpora/spamassassin/index --folds 10 --out sa.md
    python tools/studies/compare_peers.py ../shared/corpora/trec06c-dev/index --halves \\
        --headers-keep Subject,From,To,Content-Type,Content-Transfer-Encoding --out trec.md
"""

import contextlib
import io
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the project: spamnb, tools
from tools.studies import run_peers  # noqa: E402

DEFAULT = ["spamnb", "spamnb-bernoulli", "spamnb-complement", "spamnb-counts", "sklearn-nb"]
# peer -> (its command, its Debian package): run when the command is installed
TOOLS = {"bogofilter": ("bogofilter", "bogofilter"), "spamprobe": ("spamprobe", "spamprobe"),
         "crm114": ("crm", "crm114")}


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:  # this script's use, then run_peers's options (it exits)
        print(__doc__.strip() + "\n")
        run_peers.main(argv)
    out = None
    if "--out" in argv:
        i = argv.index("--out")
        out = argv[i + 1]
        del argv[i:i + 2]
    skipped = []
    if "--peers" not in argv:
        peers = list(DEFAULT)
        for peer, (command, package) in TOOLS.items():
            if shutil.which(command):
                peers.append(peer)
            else:
                skipped.append(f"compare_peers.py: {peer} skipped: no {command} on PATH "
                               f"(Debian: apt-get install {package})")
        argv += ["--peers", ",".join(peers)]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        run_peers.main(argv)  # an absent corpus exits here, with its one line
    for line in skipped:
        print(line, file=sys.stderr)
    text = buf.getvalue()
    command = "python tools/studies/compare_peers.py " + " ".join(sys.argv[1:] if argv is None else argv)
    sys.stdout.write(text)
    if out:
        with open(out, "w", encoding="utf-8") as f:
            f.write(f"<!-- {command} -->\n{text}")


if __name__ == "__main__":
    main()
