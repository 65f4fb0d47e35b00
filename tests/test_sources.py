"""Tests for spamnb.mail.sources: every kind of mail store, built in tmp_path."""

import io
import os
import re
import tarfile
import zipfile

import pytest

from spamnb.mail import sources
from spamnb.mail.sources import (
    Message,
    SourceError,
    SourceWarning,
    detect_kind,
    iter_index,
    iter_messages,
)

M1 = b"Subject: one\r\n\r\nfirst body\r\n"
M2 = b"From: x@example.com\nSubject: two\n\nsecond\n"
M3 = b"Subject: three\n\n\xff\xfe binary \x00 bytes\n"


def write(path, data=b""):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def collect(spec, **kw):
    errors = []
    msgs = list(iter_messages(spec, on_error=lambda s, e: errors.append((s, e)), **kw))
    return msgs, errors


def sources_of(msgs, root):
    return [os.path.relpath(m.source, root) for m in msgs]


# -- maildir -----------------------------------------------------------------


@pytest.fixture
def maildir(tmp_path):
    md = tmp_path / "Mail"
    write(md / "cur" / "b:2,S", M2)
    write(md / "cur" / "a:2,S", M1)
    write(md / "cur" / ".hidden", b"not a message")
    write(md / "new" / "c", M3)
    write(md / "tmp" / "partial", b"still being delivered")
    write(md / ".Lists" / "cur" / "d:2,", b"Subject: sub\n\n")
    (md / ".Lists" / "new").mkdir()
    return md


def test_maildir_cur_then_new_sorted(maildir):
    assert detect_kind(maildir) == "maildir"
    msgs, errors = collect(str(maildir), label="ham")
    assert sources_of(msgs, maildir) == ["cur/a:2,S", "cur/b:2,S", "new/c"]
    assert [m.raw for m in msgs] == [M1, M2, M3]
    assert all(m.label == "ham" for m in msgs) and errors == []


def test_maildir_subfolders_only_when_recursive(maildir):
    msgs, _ = collect(str(maildir), recursive=True)
    assert sources_of(msgs, maildir) == ["cur/a:2,S", "cur/b:2,S", "new/c", ".Lists/cur/d:2,"]
    assert msgs[-1].raw == b"Subject: sub\n\n"
    assert msgs[0].label is None


def test_maildir_paths_are_what_the_maildir_reader_reads(maildir):
    for recursive in (False, True):
        paths = list(sources.maildir_paths(str(maildir), recursive))
        assert paths == [m.source for m in collect(str(maildir), recursive=recursive)[0]]
    assert not any(os.path.relpath(p, maildir).startswith("tmp") for p in paths)


def test_maildir_paths_skip_subfolders_read_on_their_own(maildir, tmp_path):
    write(maildir / ".Junk" / "cur" / "e:2,S", b"Subject: junk\n\n")
    (maildir / ".Junk" / "new").mkdir()
    everything = [os.path.relpath(p, maildir) for p in sources.maildir_paths(str(maildir), True)]
    assert everything == ["cur/a:2,S", "cur/b:2,S", "new/c", ".Junk/cur/e:2,S", ".Lists/cur/d:2,"]
    link = tmp_path / "junk-link"  # compared by real path
    link.symlink_to(maildir / ".Junk")
    for skip in ([str(maildir / ".Junk")], [str(link)]):
        paths = [os.path.relpath(p, maildir) for p in sources.maildir_paths(str(maildir), True, skip=skip)]
        assert paths == ["cur/a:2,S", "cur/b:2,S", "new/c", ".Lists/cur/d:2,"]


def test_listers_report_a_folder_they_cannot_list(tmp_path):
    errors = []
    report = sources.reporter(on_error=lambda s, e: errors.append((s, type(e))))
    md = tmp_path / "md"
    (md / "cur").mkdir(parents=True)  # no new/
    assert list(sources.maildir_paths(md, report=report)) == []
    assert errors == [(str(md / "new"), FileNotFoundError)]
    with pytest.raises(SourceError, match="cannot read"):
        list(sources.maildir_paths(md, report=sources.reporter(strict=True)))


# -- mbox --------------------------------------------------------------------


MBOX = (
    b"From alice@example.com Mon Jan  1 00:00:00 2024\n" + M2 + b"\n"
    b"From bob@example.com Tue Jan  2 00:00:00 2024\n"
    b"Subject: quoted\n\nline\n>From the start of a body line\nend\n\n"
    b"From carol@example.com Wed Jan  3 00:00:00 2024\n" + M3
)


def test_mbox_three_messages_exact_bytes(tmp_path):
    box = write(tmp_path / "inbox", MBOX)
    assert detect_kind(box) == "mbox"
    msgs, errors = collect(str(box), label="spam")
    assert [m.source for m in msgs] == [f"{box}:#1", f"{box}:#2", f"{box}:#3"]
    assert [m.raw for m in msgs] == [
        M2,  # the blank separator line before the next From_ is not part of it
        b"Subject: quoted\n\nline\n>From the start of a body line\nend\n",
        M3,
    ]
    assert all(m.label == "spam" for m in msgs) and errors == []


# -- MH ----------------------------------------------------------------------


def test_mh_numeric_order_and_subfolders(tmp_path):
    mh = tmp_path / "mh"
    write(mh / "10", M3)
    write(mh / "2", M2)
    write(mh / "1", M1)
    write(mh / "sub" / "1", b"Subject: nested\n\n")
    assert detect_kind(mh) == "mh"
    msgs, _ = collect(str(mh))
    assert sources_of(msgs, mh) == ["1", "2", "10"]  # numeric, not lexical
    assert [m.raw for m in msgs] == [M1, M2, M3]
    msgs, _ = collect(str(mh), recursive=True)
    assert sources_of(msgs, mh) == ["1", "2", "10", "sub/1"]


def test_mh_detected_by_sequences_file(tmp_path):
    mh = tmp_path / "mh"
    write(mh / ".mh_sequences", b"unseen: 3\n")
    write(mh / "3", M1)
    write(mh / "notes.txt", b"MH ignores non-numeric files")
    assert detect_kind(mh) == "mh"
    msgs, _ = collect(str(mh))
    assert [m.raw for m in msgs] == [M1]


# -- tree, single file, stdin -------------------------------------------------


def test_tree_recursive_sorted_skips_hidden_and_index(tmp_path):
    root = tmp_path / "tree"
    write(root / "b" / "x", M2)
    write(root / "a", M1)
    write(root / "b" / "c" / "y", M3)
    write(root / ".git" / "HEAD", b"hidden dir")
    write(root / "b" / ".swp", b"hidden file")
    write(root / "index", b"spam a\n")
    assert detect_kind(root) == "tree"
    msgs, errors = collect(str(root))
    assert sources_of(msgs, root) == ["a", "b/c/y", "b/x"]
    assert [m.raw for m in msgs] == [M1, M3, M2] and errors == []


def test_tree_paths_are_what_the_tree_reader_reads(tmp_path):
    root = tmp_path / "tree"
    write(root / "b" / "x", M2)
    write(root / "a", M1)
    write(root / ".hidden" / "y", M3)
    write(root / "b" / "index", b"ham x\n")
    os.mkfifo(root / "fifo")  # listed, and then skipped by message_file (not a regular file)
    paths = list(sources.tree_paths(root))
    assert [os.path.relpath(p, root) for p in paths] == ["a", "b/x", "fifo"]
    assert [m.source for m in collect(str(root))[0]] == [p for p in paths if not p.endswith("fifo")]
    assert list(sources.message_file(paths[2], "ham")) == []


def test_empty_directory_is_an_empty_tree(tmp_path):
    assert detect_kind(tmp_path) == "tree"
    assert collect(str(tmp_path)) == ([], [])


def test_single_file(tmp_path):
    f = write(tmp_path / "msg.eml", M1)
    assert detect_kind(f) == "file"
    msgs, _ = collect(f, label="ham")  # path-like accepted
    assert msgs == [Message(str(f), M1, "ham")]


def test_stdin_stand_ins():
    assert detect_kind("-") == "stdin"
    msgs = list(iter_messages("-", stdin=io.BytesIO(M3), label="spam"))
    assert msgs == [Message("-", M3, "spam")]

    class TextStdin:  # like sys.stdin: text wrapper with a binary .buffer
        buffer = io.BytesIO(M1)

    assert list(iter_messages("-", stdin=TextStdin())) == [Message("-", M1, None)]
    with pytest.raises(SourceError, match="bytes"):
        list(iter_messages("-", stdin=io.StringIO("text")))


# -- archives ----------------------------------------------------------------


def make_tar(path, members, mode):
    """members: list of (name, bytes or None for a directory)."""
    with tarfile.open(path, mode) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def make_zip(path, members):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members:
            if data is None:
                zf.writestr(name + "/", b"")
            else:
                zf.writestr(name, data)
    return path


ARCHIVE_MEMBERS = [
    ("box", None),
    ("box/index", b"ham zz\n"),
    ("box/zz", M2),
    ("box/aa", M1),
    ("box/.DS_Store", b"junk"),
    ("box/sub/m", M3),
]


@pytest.mark.parametrize("suffix,mode", [
    (".tar", "w"), (".tar.gz", "w:gz"), (".tgz", "w:gz"),
    (".tar.bz2", "w:bz2"), (".tar.xz", "w:xz"), (".zip", None),
])
def test_archive_members_in_archive_order(tmp_path, suffix, mode):
    path = tmp_path / ("mail" + suffix)
    if mode is None:
        make_zip(path, ARCHIVE_MEMBERS)
    else:
        make_tar(path, ARCHIVE_MEMBERS, mode)
    assert detect_kind(path) == "archive"
    msgs, errors = collect(str(path), label="ham")
    assert [m.source for m in msgs] == [f"{path}:box/zz", f"{path}:box/aa", f"{path}:box/sub/m"]
    assert [m.raw for m in msgs] == [M2, M1, M3]
    assert all(m.label == "ham" for m in msgs) and errors == []


def test_unreadable_archive_is_fatal(tmp_path):
    bad = write(tmp_path / "bad.tar.gz", b"this is not gzip")
    with pytest.raises(SourceError, match="bad.tar.gz"):
        list(iter_messages(str(bad)))
    bad = write(tmp_path / "bad.zip", b"this is not zip")
    with pytest.raises(SourceError, match="bad.zip"):
        list(iter_messages(str(bad)))


def test_truncated_tar_xz_reported_not_fatal(tmp_path):
    big = [(f"m{i}", os.urandom(20000)) for i in range(5)]
    path = make_tar(tmp_path / "t.tar.xz", big, "w:xz")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    msgs, errors = collect(str(path))
    assert 1 <= len(msgs) < 5
    assert [m.raw for m in msgs] == [d for _, d in big[: len(msgs)]]
    assert len(errors) == 1
    with pytest.raises(SourceError, match="t.tar.xz"):
        list(iter_messages(str(path), strict=True))


def test_zip_member_with_bad_crc_skipped(tmp_path):
    path = tmp_path / "m.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("good1", M1)
        zf.writestr("bad", b"CORRUPT-ME-PLEASE")
        zf.writestr("good2", M2)
    raw = path.read_bytes()
    path.write_bytes(raw.replace(b"CORRUPT-ME-PLEASE", b"corrupted-bytes!!"))
    msgs, errors = collect(str(path))
    assert [m.raw for m in msgs] == [M1, M2]
    assert [s for s, _ in errors] == [f"{path}:bad"]
    assert isinstance(errors[0][1], zipfile.BadZipFile)


# -- index files ---------------------------------------------------------------


@pytest.fixture
def corpus(tmp_path):
    root = tmp_path / "corpus"
    write(root / "ham" / "1", M1)
    write(root / "spam" / "with space", M2)
    write(root / "ham" / "2", M3)
    write(root / "index",
          b"# TREC index\n\nham ham/1\nspam spam/with space\n  ham ham/2  \n")
    return root


def test_index_file_labels_and_paths(corpus):
    index = corpus / "index"
    assert detect_kind(index) == "index"
    msgs = list(iter_index(str(index)))
    assert [(os.path.relpath(m.source, corpus), m.label) for m in msgs] == [
        ("ham/1", "ham"), ("spam/with space", "spam"), ("ham/2", "ham")]
    assert [m.raw for m in msgs] == [M1, M2, M3]
    # iter_messages dispatches to the index reader and keeps its labels
    assert list(iter_messages(str(index))) == msgs
    with pytest.raises(SourceError, match="labelled index"):
        iter_messages(str(index), label="spam")


def test_index_missing_target_reported_and_strict(corpus):
    index = write(corpus / "index2", b"ham ham/1\nspam spam/gone\nham ham/2\n")
    errors = []
    msgs = list(iter_index(str(index), on_error=lambda s, e: errors.append((s, e))))
    assert [m.raw for m in msgs] == [M1, M3]
    assert [(os.path.relpath(s, corpus), type(e)) for s, e in errors] == [
        ("spam/gone", FileNotFoundError)]
    with pytest.raises(SourceError, match="spam/gone"):
        list(iter_index(str(index), strict=True))


def test_index_bad_line_names_line_number(corpus):
    index = write(corpus / "index3", b"ham ham/1\n\n# fine\nmaybe ham/2\n")
    with pytest.raises(SourceError, match=r"index3, line 4: expected 'spam PATH' or 'ham PATH'"):
        iter_index(str(index))  # parsed up front, before any message
    index = write(corpus / "index4", b"spam\n")
    with pytest.raises(SourceError, match="line 1"):
        iter_index(str(index))


def test_index_paths_lazily_and_as_iter_index_reads_them(corpus):
    index = corpus / "index"
    paths = list(sources.index_paths(index))
    assert [(os.path.relpath(p, corpus), lb) for p, lb in paths] == [
        ("ham/1", "ham"), ("spam/with space", "spam"), ("ham/2", "ham")]
    assert [(m.source, m.label) for m in iter_index(str(index))] == paths
    # read line by line: a bad line raises only when it is reached
    bad = write(corpus / "index5", b"ham ham/1\r\nmaybe ham/2\n")
    lines = sources.index_paths(bad)
    assert next(lines) == (str(corpus / "ham/1"), "ham")
    with pytest.raises(SourceError, match="index5, line 2"):
        next(lines)
    with pytest.raises(SourceError, match="cannot read index"):
        next(sources.index_paths(corpus / "nope"))


def test_index_of_missing_file(tmp_path):
    with pytest.raises(SourceError, match="nothere"):
        iter_index(str(tmp_path / "nothere"))


# -- archives with an index ----------------------------------------------------


def test_archive_index_in_folder_yields_index_order(tmp_path):
    members = [
        ("spamassassin/ham/b", M2),  # before the index: held until it is read
        ("spamassassin/index", b"spam spam/s\nham ham/a\nham ham/b\nspam spam/missing\n"),
        ("spamassassin/ham/a", M1),
        ("spamassassin/spam/s", M3),
        ("spamassassin/spam/unlisted", b"not in the index"),
    ]
    for suffix, mode in [(".tar.xz", "w:xz"), (".zip", None)]:
        path = tmp_path / ("corpus" + suffix)
        if mode is None:
            make_zip(path, members)
        else:
            make_tar(path, members, mode)
        errors = []
        msgs = list(iter_index(str(path), on_error=lambda s, e: errors.append((s, e))))
        assert [(m.source, m.label, m.raw) for m in msgs] == [
            (f"{path}:spamassassin/spam/s", "spam", M3),
            (f"{path}:spamassassin/ham/a", "ham", M1),
            (f"{path}:spamassassin/ham/b", "ham", M2),
        ]
        assert [s for s, _ in errors] == [f"{path}:spamassassin/spam/missing"]
        # the same archive through iter_messages: unlabelled, archive order, no index
        plain, _ = collect(str(path))
        assert [m.raw for m in plain] == [M2, M1, M3, b"not in the index"]
        assert all(m.label is None for m in plain)


def test_archive_index_at_root_and_repeated_entries(tmp_path):
    members = [("./index", b"ham a\nspam ./a\n"), ("./a", M1)]
    path = make_tar(tmp_path / "r.tar.gz", members, "w:gz")
    msgs = list(iter_index(str(path)))
    assert [(m.label, m.raw) for m in msgs] == [("ham", M1), ("spam", M1)]


def test_archive_without_index(tmp_path):
    path = make_tar(tmp_path / "n.tar", [("a", M1), ("x/y/index", b"ham a\n")], "w")
    with pytest.raises(SourceError, match="no index member"):
        list(iter_index(str(path)))


def test_archive_index_bad_line(tmp_path):
    path = make_zip(tmp_path / "b.zip", [("c/index", b"ham a\nspam\n"), ("c/a", M1)])
    with pytest.raises(SourceError, match=r"c/index, line 2"):
        list(iter_index(str(path)))


def test_shipped_corpus_archive_if_present():
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(here, "corpora", "spamassassin.tar.xz")
    if not os.path.exists(path):
        pytest.skip("corpora/spamassassin.tar.xz not present")
    n = {"ham": 0, "spam": 0}
    for m in iter_index(path, strict=True):
        n[m.label] += 1
    assert n["ham"] + n["spam"] == 5943 and n["spam"] > 1000


# The receiving mailbox's fields, which the recent spam must not carry (corpora/recent-spam.PROVENANCE)
RECEIVER_FIELDS = re.compile(rb"^(received|arc-[a-z-]+|authentication-results|received-spf|delivered-to|"
                             rb"return-path|x-google-[a-z-]+|x-gm-[a-z-]+|x-received|message-id):", re.I | re.M)


def test_shipped_recent_spam_is_spam_of_today_without_its_collection_marks():
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(here, "corpora", "recent-spam.tar.xz")
    if not os.path.exists(path):
        pytest.skip("corpora/recent-spam.tar.xz not present")
    messages = list(iter_index(path, strict=True))
    assert len(messages) == 110 and {m.label for m in messages} == {"spam"}
    assert all(re.search(r"/archive-\d+\.eml$", m.source) for m in messages)  # never pot-* (CC BY-NC)
    for m in messages:
        head = re.split(rb"\r?\n\r?\n", m.raw, maxsplit=1)[0]
        assert b"[removed]" not in m.raw, m.source
        assert not RECEIVER_FIELDS.search(head), m.source
    assert all(re.search(rb"^subject:", m.raw, re.I | re.M) for m in messages)  # as sent, even empty


def test_the_recent_spam_cut_takes_out_attachment_content_and_no_token(monkeypatch):
    """make_corpora.py's cut of the recent spam: what it takes out of attachments changes no
    token of any of the 110 (spamnb reads an attachment's type and name only)."""
    from conftest import ROOT
    from spamnb.mail.tokenizer import tokenize

    monkeypatch.syspath_prepend(str(ROOT))
    from tools import shared_corpora
    from tools.generators.make_corpora import recent_spam, sender_fields, shippable

    if not (shared_corpora.SHARED / "modern-spam-dev" / "index").exists():
        pytest.skip("../shared/corpora/modern-spam-dev not present")
    folder, entries = recent_spam(str(shared_corpora.SHARED))
    assert len(entries) == 110
    before = after = 0
    for _, rel in entries:
        with open(os.path.join(folder, rel), "rb") as f:
            raw = f.read()
        cut = sender_fields(raw)
        before, after = before + len(cut), after + len(shippable(raw))
        assert sorted(tokenize(shippable(raw))) == sorted(tokenize(cut)), rel
    assert after < before / 10  # the images and PDFs were most of it


# -- errors ----------------------------------------------------------------------


def test_missing_path_is_a_source_error(tmp_path):
    with pytest.raises(SourceError, match="no such file or directory: .*nope"):
        iter_messages(str(tmp_path / "nope"))


def test_bad_label_rejected(tmp_path):
    with pytest.raises(ValueError):
        iter_messages(str(tmp_path), label="maybe")


def test_unreadable_entries_skipped_and_reported(tmp_path, monkeypatch):
    root = tmp_path / "tree"
    write(root / "1ok", M1)
    write(root / "2denied", M2)
    write(root / "4ok", M3)
    (root / "3vanished").symlink_to(root / "does-not-exist")
    os.mkfifo(root / "5fifo")  # not a regular file: silently not a message
    real = sources._read_file

    def read_file(path):  # permission bits do not stop root, so fake the denial
        if path.endswith("2denied"):
            raise PermissionError(13, "Permission denied", path)
        return real(path)

    monkeypatch.setattr(sources, "_read_file", read_file)
    msgs, errors = collect(str(root))
    assert [m.raw for m in msgs] == [M1, M3]
    assert [(os.path.basename(s), type(e)) for s, e in errors] == [
        ("2denied", PermissionError), ("3vanished", FileNotFoundError)]

    with pytest.raises(SourceError, match="2denied: Permission denied"):
        list(iter_messages(str(root), strict=True))

    with pytest.warns(SourceWarning) as caught:
        assert len(list(iter_messages(str(root)))) == 2
    assert [str(w.message).rsplit("/", 1)[1] for w in caught] == [
        "2denied: Permission denied", "3vanished: No such file or directory"]


def test_mbox_entry_error_reported(tmp_path, monkeypatch):
    box = write(tmp_path / "inbox", MBOX)
    import mailbox

    real = mailbox.mbox.get_bytes

    def get_bytes(self, key, from_=False):
        if key == 1:
            raise OSError(5, "Input/output error")
        return real(self, key, from_)

    monkeypatch.setattr(mailbox.mbox, "get_bytes", get_bytes)
    msgs, errors = collect(str(box))
    assert [m.source for m in msgs] == [f"{box}:#1", f"{box}:#3"]
    assert [s for s, _ in errors] == [f"{box}:#2"]


def test_detect_kind_index_vs_message(tmp_path):
    assert detect_kind(write(tmp_path / "i", b"\n# c\nspam a/b\n")) == "index"
    assert detect_kind(write(tmp_path / "m", b"Received: from x\nspam a/b\n")) == "file"
    assert detect_kind(write(tmp_path / "e", b"")) == "file"


def test_sources_module_needs_no_numpy():
    import subprocess
    import sys

    code = "import sys, spamnb.mail.sources; assert 'numpy' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
