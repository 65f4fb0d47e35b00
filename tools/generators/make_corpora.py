#!/usr/bin/env python3
"""Build the corpora shipped in ``corpora/`` from ``../shared/corpora``.

Writes, reproducibly (fixed member order, mtimes and owners):

* ``corpora/spamassassin.tar.xz``: the SpamAssassin public corpus with its
  ``index``, minus a held-out sample (written through the link to
  ``spamnb/data/``, where it ships inside the package for the default model);
* ``corpora/sample-maildir/``: that held-out sample as a maildir (``cur/``),
  the mailbox the README's main command classifies, with its gold labels in
  ``corpora/sample-maildir.index`` (TREC index format).

Nothing of ``../shared/corpora/trec06c-dev`` (part of the TREC 2006 Chinese
corpus) is written: its terms allow research use only, not publishing it or any
material portion. The scripts that evaluate on it read it where it is
(``tools/shared_corpora.py``); see ``corpora/README.md``.

The held-out sample is every message whose md5(relative path) is 0 mod 60
(about 100 messages, both classes), so it is stable and unbiased.

Usage: python tools/generators/make_corpora.py [--shared ../shared/corpora] [--out corpora]
"""

import argparse
import hashlib
import io
import os
import shutil
import tarfile

HOLDOUT_MOD = 60


def read_index(folder):
    with open(os.path.join(folder, "index"), encoding="utf-8") as f:
        return [tuple(line.split(None, 1)) for line in f.read().splitlines() if line.strip()]


def held_out(rel):
    return int(hashlib.md5(rel.encode()).hexdigest(), 16) % HOLDOUT_MOD == 0


def add_bytes(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 1_000_000_000
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def write_archive(out_path, name, folder, entries):
    index = "".join(f"{label} {rel}\n" for label, rel in entries).encode()
    # xz, not gzip, though `spamnb train --index` pays for it (issue 33): the shipped
    # archive (36.8 MB as tar) is 5.0 MB as xz -9 and 8.6 MB as gzip -9 (+72% in the
    # wheel); decompressing it costs 0.50-0.53 CPU s against gzip's 0.16-0.18 (bz2:
    # 6.8 MB, 2.1 s), 0.35 s of a train of 8-9 CPU s. Reading the tar stream in larger
    # blocks, or the whole archive at once, saved 3-5% of the 0.9 s the reading takes
    # (interleaved, medians of 7-9): the rest is the decompression and tarfile's header
    # parsing of 5,944 members. Figures: docs/tokenizer-speed.md.
    with tarfile.open(out_path, "w:xz", preset=9) as tar:
        add_bytes(tar, f"{name}/index", index)
        for _, rel in entries:
            with open(os.path.join(folder, rel), "rb") as f:
                add_bytes(tar, f"{name}/{rel}", f.read())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--shared", default=os.path.join(here, "..", "..", "..", "shared", "corpora"))
    ap.add_argument("--out", default=os.path.join(here, "..", "..", "corpora"))
    args = ap.parse_args()

    sa = os.path.join(args.shared, "spamassassin")
    entries = read_index(sa)
    train = [e for e in entries if not held_out(e[1])]
    sample = [e for e in entries if held_out(e[1])]
    write_archive(os.path.join(args.out, "spamassassin.tar.xz"), "spamassassin", sa, train)

    maildir = os.path.join(args.out, "sample-maildir")
    shutil.rmtree(maildir, ignore_errors=True)
    for sub in ("cur", "new", "tmp"):
        os.makedirs(os.path.join(maildir, sub))
    with open(os.path.join(args.out, "sample-maildir.index"), "w", encoding="utf-8") as idx:
        for label, rel in sample:
            name = os.path.basename(rel) + ":2,S"
            shutil.copyfile(os.path.join(sa, rel), os.path.join(maildir, "cur", name))
            idx.write(f"{label} sample-maildir/cur/{name}\n")
    for sub in ("new", "tmp"):
        open(os.path.join(maildir, sub, ".keep"), "w").close()

    n_spam = sum(1 for label, _ in sample if label == "spam")
    print(f"spamassassin: {len(train)} to train, sample maildir: {len(sample)} ({n_spam} spam)")


if __name__ == "__main__":
    main()
