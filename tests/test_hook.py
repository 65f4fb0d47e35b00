"""The filter's message surgery (spamnb.delivery.hook): headers only ever *inserted*,
at the end of the header block, with the message's own line ending."""

from __future__ import annotations

import email
import email.policy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st


from spamnb.delivery.hook import add_headers, header_end
from spamnb.mail.mime import strip_verdicts
from spamnb.verdict import may_hold_verdicts

LINES = [b"X-Spam-Flag: YES", b"X-Spam-Status: Yes, probability=0.990000, score=4.60, model=m, version=1"]
ADDED_LF = b"".join(line + b"\n" for line in LINES)
ADDED_CRLF = b"".join(line + b"\r\n" for line in LINES)


# -- golden cases: input -> exact output ------------------------------------------

GOLDEN = [
    pytest.param(b"Subject: hi\nFrom: a@b\n\nbody\n",
                 b"Subject: hi\nFrom: a@b\n" + ADDED_LF + b"\nbody\n", id="lf"),
    pytest.param(b"Subject: hi\r\nFrom: a@b\r\n\r\nbody\r\n",
                 b"Subject: hi\r\nFrom: a@b\r\n" + ADDED_CRLF + b"\r\nbody\r\n", id="crlf"),
    pytest.param(b"Subject: hi\nFrom: a@b\n", b"Subject: hi\nFrom: a@b\n" + ADDED_LF,
                 id="headers-only"),
    pytest.param(b"Subject: hi", b"Subject: hi\n" + ADDED_LF, id="headers-only-unterminated"),
    pytest.param(b"Subject: hi\r\nX: y", b"Subject: hi\r\nX: y\r\n" + ADDED_CRLF,
                 id="headers-only-unterminated-crlf"),
    pytest.param(b"", ADDED_LF, id="empty"),
    pytest.param(b"hello world\n\nmore\n", ADDED_LF + b"hello world\n\nmore\n", id="not-mail"),
    pytest.param(b"\nbody only\n", ADDED_LF + b"\nbody only\n", id="blank-first-line"),
    pytest.param(b"From a@b  Mon Sep  2 16:21:48 2002\nSubject: x\n\nb\n",
                 b"From a@b  Mon Sep  2 16:21:48 2002\nSubject: x\n" + ADDED_LF + b"\nb\n",
                 id="mbox-from-line"),
    pytest.param(b"Subject: a\n long folded\n\tsubject\nTo: c\n\nbody\n\nmore: not a header\n",
                 b"Subject: a\n long folded\n\tsubject\nTo: c\n" + ADDED_LF
                 + b"\nbody\n\nmore: not a header\n", id="folded-header-and-later-blank-lines"),
    pytest.param(b"Subject: hi\nX-Spam-Flag: NO\n\nforged\n", b"Subject: hi\nX-Spam-Flag: NO\n" + ADDED_LF + b"\nforged\n",
                 id="add-headers-only-inserts"),  # removing incoming verdicts is strip_verdicts' job
    # only verdict lines and no header of its own: not mail (spamnb puts its verdict at
    # the top of non-mail, and the result must stay non-mail), so the verdict goes on top
    pytest.param(b"X-Spam-Flag: NO\n\nforged\n", ADDED_LF + b"X-Spam-Flag: NO\n\nforged\n",
                 id="verdict-lines-only"),
    pytest.param(b"Subject: caf\xc3\xa9 \xff\n\n\x00\xfe binary\n",
                 b"Subject: caf\xc3\xa9 \xff\n" + ADDED_LF + b"\n\x00\xfe binary\n", id="non-ascii-bytes"),
    pytest.param(b"Subject: lf first\nX: y\r\n\r\nbody\r\n",
                 b"Subject: lf first\nX: y\r\n" + ADDED_LF + b"\r\nbody\r\n", id="mixed-first-line-lf"),
]


@pytest.mark.parametrize("raw, expected", GOLDEN)
def test_add_headers_golden(raw, expected):
    assert add_headers(raw, LINES) == expected


def test_header_end_positions():
    assert header_end(b"A: 1\n\nb") == (5, b"\n")
    assert header_end(b"A: 1\r\n\r\nb") == (6, b"\r\n")
    assert header_end(b"A: 1\n") == (5, b"\n")
    assert header_end(b"body") == (0, b"\n")
    assert header_end(b"") == (0, b"\n")


# -- property: only an insertion, at a line boundary ---------------------------------

@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300) | st.lists(st.sampled_from(
    [b"A: 1", b"Subject: x", b" cont", b"", b"body", b"From x", b"\r", b"\xff:"]), max_size=8)
    .flatmap(lambda parts: st.sampled_from([b"\n", b"\r\n"]).map(lambda eol: eol.join(parts))))
def test_add_headers_only_inserts(raw):
    out = add_headers(raw, LINES)
    pos, eol = header_end(raw)
    assert out.startswith(raw[:pos]) and out.endswith(raw[pos:])
    inserted = out[pos:len(out) - (len(raw) - pos)]
    # What was inserted: our lines with the message's line ending, plus at most
    # the end of an unterminated last header line.
    assert inserted in (b"".join(line + eol for line in LINES),
                        eol + b"".join(line + eol for line in LINES))
    assert pos == 0 or raw[pos - 1:pos] == b"\n" or pos == len(raw)


def test_added_headers_parse_as_headers():
    raw = b"Subject: hi\r\nMessage-ID: <1@x>\r\n\r\nbody line\r\n"
    msg = email.message_from_bytes(add_headers(raw, LINES), policy=email.policy.default)
    assert msg["X-Spam-Flag"] == "YES"
    assert msg["X-Spam-Status"].startswith("Yes, probability=0.990000")
    assert msg["Subject"] == "hi"
    assert msg.get_content().strip() == "body line"


# -- incoming verdict fields: removed from the header block, nothing else ------------

STRIP = [
    pytest.param(b"Subject: hi\nX-Spam-Flag: YES\nX-Spam-Status: Yes, score=99.0 required=5.0\nTo: b\n\nbody\n",
                 b"Subject: hi\nTo: b\n\nbody\n", id="forged-flag-and-status"),
    pytest.param(b"Subject: hi\r\nx-spam-LEVEL: ****\r\nX-Spam-Report: \r\n\tline one\r\n line two\r\nTo: b\r\n\r\nb\r\n",
                 b"Subject: hi\r\nTo: b\r\n\r\nb\r\n", id="any-case-folded-crlf"),
    pytest.param(b"X-Spam-Score: -10\nX-Spam-Bar: ---\nSubject: s\n\nX-Spam-Flag: YES\n",
                 b"Subject: s\n\nX-Spam-Flag: YES\n", id="first-lines-and-body-text-kept"),
    pytest.param(b"Subject: s\nX-Spam-Flagged: yes\nX-Spam-Flag : YES\n\nb\n",
                 b"Subject: s\nX-Spam-Flagged: yes\nX-Spam-Flag : YES\n\nb\n",
                 id="other-names-and-a-name-the-parser-ends-the-block-at"),
    pytest.param(b"From a@b  Mon Sep  2 16:21:48 2002\nX-Spam-Checker-Version: SA\nSubject: x\n\nb\n",
                 b"From a@b  Mon Sep  2 16:21:48 2002\nSubject: x\n\nb\n", id="mbox-from-line"),
    pytest.param(b"X-Spam-Flag: YES\n\nforged\n", b"\nforged\n", id="verdict-lines-only"),
    pytest.param(b"Subject: no verdict\n\nbody\n", b"Subject: no verdict\n\nbody\n", id="none"),
]


@pytest.mark.parametrize("raw, expected", STRIP)
def test_strip_verdicts_golden(raw, expected):
    assert strip_verdicts(raw) == expected
    assert strip_verdicts(expected) == expected
    if expected != raw:
        assert may_hold_verdicts(raw)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([b"X-Spam-Flag: YES", b"x-spam-status: No", b"X-Spam-Level: **", b"Subject: x",
                                 b" cont", b"", b"body", b"From x", b"\r", b"X-Spam-Other: 1"]), max_size=8)
       .flatmap(lambda parts: st.sampled_from([b"\n", b"\r\n", b"\r"]).map(lambda eol: eol.join(parts))))
def test_strip_verdicts_removes_whole_lines_and_the_client_check_never_misses_one(raw):
    out = strip_verdicts(raw)
    if out != raw:
        assert may_hold_verdicts(raw)  # the filter's client imports the parser only then
    assert strip_verdicts(out) == out
    it = iter(raw)  # what is left is raw with some pieces taken out, in order
    assert all(byte in it for byte in out)
