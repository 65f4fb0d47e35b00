#!/usr/bin/env python3
"""Build the corpora shipped in ``corpora/`` from ``../shared/corpora``.

Writes, reproducibly (fixed member order, mtimes and owners):

* ``corpora/spamassassin.tar.xz``: the SpamAssassin public corpus with its
  ``index``, minus a held-out sample (written through the link to
  ``spamnb/data/``, where it ships inside the package for the default model);
* ``corpora/sample-maildir/``: that held-out sample as a maildir (``cur/``),
  the mailbox the README's main command classifies, with its gold labels in
  ``corpora/sample-maildir.index`` (TREC index format);
* ``corpora/recent-spam.tar.xz``: the 110 ``archive-*`` spam of 2023-2025 in
  ``modern-spam-dev`` (the part its licence lets us publish), each cut by
  :func:`shippable` to what its sender wrote and without attachment content, with its
  ``index``. Not in the package: the default model does not train on it (docs/accuracy.md,
  "today's spam", says why).

Nothing of ``../shared/corpora/trec06c-dev`` (part of the TREC 2006 Chinese
corpus) is written: its terms allow research use only, not publishing it or any
material portion; nor of modern-spam-dev's ``pot-*`` messages (CC BY-NC 4.0: measured,
never shipped nor trained into what ships). The scripts that evaluate on it read it where it is
(``tools/shared_corpora.py``); see ``corpora/README.md``.

The held-out sample is every message whose md5(relative path) is 0 mod 60
(about 100 messages, both classes), so it is stable and unbiased.

Usage: python tools/generators/make_corpora.py [--shared ../shared/corpora] [--out corpora]
"""

import argparse
import hashlib
import io
import os
import re
import shutil
import tarfile

HOLDOUT_MOD = 60
SHIPPABLE_SPAM = re.compile(r"/archive-\d+\.eml$")  # modern-spam-dev's unrestricted part

# What a sender writes. The archive-* spam reached one Gmail mailbox, and its collector
# replaced addresses with "[removed]": the receiver's fields (Received, ARC-*,
# Authentication-Results, Delivered-To, X-Google-*, X-Gm-*: in 108 of the 110) and the
# marker would teach the model that mail delivered by Gmail, or a header naming the
# word "removed", is spam. The ham the default model learns (2002) has none of them.
SENDER_FIELDS = (b"from", b"reply-to", b"to", b"cc", b"subject", b"date", b"mime-version",
                 b"content-type", b"content-transfer-encoding", b"x-mailer")
REMOVED = re.compile(rb"<?\[removed\]>?")


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


def sender_fields(raw):
    """``raw`` with only the header fields its sender wrote (:data:`SENDER_FIELDS`), and
    without its collector's ``[removed]`` marks (in the header and the body); a field
    the marks leave empty goes too (one sent empty stays)."""
    end = re.search(rb"\r?\n\r?\n", raw)
    head, body = (raw[:end.start()], raw[end.start():]) if end else (raw, b"")
    fields = re.split(rb"\r?\n(?=[^ \t])", head)
    kept = []
    for field in fields:
        name, colon, value = field.partition(b":")
        cut = REMOVED.sub(b"", value)
        emptied = cut != value and not cut.strip(b" \t\r\n,;")  # an empty Subject as sent stays
        if colon and name.strip().lower() in SENDER_FIELDS and not emptied:
            kept.append(name + b":" + cut)
    newline = b"\r\n" if b"\r\n" in head else b"\n"
    return newline.join(kept) + REMOVED.sub(b"", body)


def empty_attachments(raw):
    """``raw`` with the encoded content of every part that is not text (or is an
    attachment) taken out, its MIME header kept: spamnb reads only an attachment's type
    and name, and the images and PDFs of the 110 were 5.0 of their 6.0 MB."""
    import email
    import email.policy

    message = email.message_from_bytes(raw, policy=email.policy.compat32)
    for part in message.walk():
        ctype = part.get_content_type()
        attached = str(part.get("content-disposition", "")).lower().startswith("attachment")
        if part.is_multipart() or (ctype in ("text/plain", "text/html") and not attached):
            continue
        payload = part.get_payload()
        if isinstance(payload, str) and payload.strip():
            raw = raw.replace(payload.encode("ascii", "surrogateescape"), b"", 1)
    return raw


def shippable(raw):
    """What ``corpora/recent-spam.tar.xz`` holds of a message (:func:`sender_fields`,
    :func:`empty_attachments`)."""
    return empty_attachments(sender_fields(raw))


def write_archive(out_path, name, folder, entries, cut=None):
    index = "".join(f"{label} {rel}\n" for label, rel in entries).encode()
    # xz, not gzip, though `spamnb train --index` pays for it: the shipped
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
                raw = f.read()
            add_bytes(tar, f"{name}/{rel}", cut(raw) if cut else raw)


def recent_spam(shared):
    """modern-spam-dev's folder and its shippable entries, in the index's order."""
    folder = os.path.join(shared, "modern-spam-dev")
    return folder, [e for e in read_index(folder) if SHIPPABLE_SPAM.search("/" + e[1])]


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
    folder, recent = recent_spam(args.shared)
    write_archive(os.path.join(args.out, "recent-spam.tar.xz"), "recent-spam", folder, recent, shippable)

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
    print(f"spamassassin: {len(train)} to train, sample maildir: {len(sample)} ({n_spam} spam); "
          f"recent spam: {len(recent)}")


if __name__ == "__main__":
    main()
