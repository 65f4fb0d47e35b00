#!/usr/bin/env python3
"""Write the malformed-mail fuzz corpus: one file per kind of hostile input.

Each generator below makes one kind of malformed or hostile message, as
bytes, deterministically (no randomness: a failing case is reproducible by
name). ``tests/test_reliability.py`` imports this file and feeds every kind
to ``spamnb filter`` (fast path, click path, server) and to the tokenizer.

The small kinds are committed in ``tests/data/fuzz/`` (regenerate with
``python3 tools/generators/make_fuzz_corpus.py --out tests/data/fuzz``); the big ones
(a 50 MB message, 10,000 parts, 1,000-deep nesting, a 30 MB attachment, a
gzip bomb) are only generated, into a temporary folder, by the tests
(``--big`` writes them too).

Usage::

    python3 tools/generators/make_fuzz_corpus.py --out tests/data/fuzz        # small kinds
    python3 tools/generators/make_fuzz_corpus.py --out /tmp/fuzz --big        # and the big ones
"""

from __future__ import annotations

import argparse
import base64
import os
import zlib

HEAD = b"From: Someone <someone@example.com>\nTo: you@example.org\nSubject: fuzz\n"
MIME = HEAD + b"MIME-Version: 1.0\n"


def _multipart(boundary: bytes, parts: list[bytes], close: bool = True, ctype=b"multipart/mixed") -> bytes:
    body = b"".join(b"--" + boundary + b"\n" + p for p in parts)
    if close:
        body += b"--" + boundary + b"--\n"
    return MIME + b"Content-Type: " + ctype + b'; boundary="' + boundary + b'"\n\n' + body


def _text_part(text: bytes, headers: bytes = b"Content-Type: text/plain\n") -> bytes:
    return headers + b"\n" + text + b"\n"


def _pseudo_random(n: int, seed: int = 1) -> bytes:
    """Deterministic noise: a linear congruential generator's high bytes."""
    out = bytearray(n)
    x = seed
    for i in range(n):
        x = (1103515245 * x + 12345) & 0x7FFFFFFF
        out[i] = x >> 23
    return bytes(out)


# -- small kinds (committed) ---------------------------------------------------------


def boundary_never_used():
    return MIME + b'Content-Type: multipart/mixed; boundary="NOPE"\n\n' + b"free money, no parts here\n"


def boundary_not_closed():
    return _multipart(b"B1", [_text_part(b"first"), _text_part(b"second, never closed")], close=False)


def boundary_missing_param():
    return MIME + b"Content-Type: multipart/alternative\n\n--x\nContent-Type: text/plain\n\nhi\n--x--\n"


def boundary_empty_and_quoted_junk():
    return MIME + b'Content-Type: multipart/mixed; boundary=""; boundary="a\\"b"\n\n--\n\nbody\n----\n'


def boundary_prefix_of_another():
    inner = _multipart(b"AB", [_text_part(b"inner")]).split(b"\n\n", 1)[1]
    return _multipart(b"A", [b'Content-Type: multipart/mixed; boundary="AB"\n\n' + inner,
                             _text_part(b"outer")])


def preamble_epilogue_only():
    return _multipart(b"P", []) .replace(b"--P--\n", b"preamble text\n--P--\nepilogue text\n")


def bad_base64():
    junk = b"SGVsbG8gd29ybGQ*!*#\n====\nQUJD\nx\n" + b"%%%%\n" * 10 + b"YWJj="
    return _multipart(b"B64", [_text_part(junk, b"Content-Type: text/plain\nContent-Transfer-Encoding: base64\n"),
                               _text_part(b"Zm9v", b"Content-Type: text/html\nContent-Transfer-Encoding: BASE64\n")])


def base64_truncated_tail():
    enc = base64.b64encode("ünïcödé spam text ".encode() * 20)
    return HEAD + b"Content-Type: text/plain; charset=utf-8\nContent-Transfer-Encoding: base64\n\n" + enc[:-3]


def bad_quoted_printable():
    body = b"caf=E9 =ZZ =\n=\n=3\n=3D=3D= \nsoft=\r\nbreak =\n" + b"=" * 50 + b"\n=FF=FE=00\n"
    return HEAD + b"Content-Type: text/plain; charset=iso-8859-1\nContent-Transfer-Encoding: quoted-printable\n\n" + body


def unknown_charset():
    return HEAD + b"Content-Type: text/plain; charset=x-klingon-42\n\nnuqneH \xe4\xf6\xfc \xff\xfe money\n"


def lying_charset_utf8_on_gb2312():
    return HEAD + b"Content-Type: text/plain; charset=utf-8\n\n" + "免费发票，请联系我们".encode("gb2312") + b"\n"


def lying_charset_ascii_on_binary():
    return HEAD + b"Content-Type: text/html; charset=us-ascii\n\n<p>" + bytes(range(128, 256)) + b"</p>\n"


def charset_garbage_values():
    return (HEAD + b'Content-Type: text/plain; charset="\x00\xff;;=="; charset*=utf-8\'\'%ZZ; '
            b"charset*0*=%E4\n\ncharset soup\n")


def rfc2047_broken_words():
    return (b"From: =?utf-8?b?!!!?= <a@b.c>\nSubject: =?x-unknown?q?caf=E9?= =?utf-8?b?5pys?= "
            b"=?utf-8?q?=ZZ?= =?gb2312?b?" + b"A" * 300 + b"?= =?=?=?==\nTo: =?utf-8?b?\n\nbody\n")


def nul_bytes():
    return b"From: a\x00b@example.com\nSub\x00ject: nul\x00 in header\n\nbody\x00with\x00nuls\n\x00\x00\x00"


def eight_bit_headers():
    return (b"From: J\xf6rg M\xfcller <j@example.de>\nSubject: \xe5\x85\x8d\xe8\xb4\xb9 \xff\xfe\xfd\n"
            b"X-\xe9\xe8: 8-bit name\nTo: \x80\x81\x82@\xc0\xc1.com\n\nbody \xe9t\xe9\n")


def overlong_header_line():
    return HEAD.replace(b"Subject: fuzz", b"Subject: " + b"buy now " * 20_000) + b"\nbody\n"


def overlong_folded_header():
    return HEAD + b"X-Long: start\n" + b"\tcontinued fold line\n" * 10_000 + b"\nbody\n"


def many_headers():
    return HEAD + b"".join(b"X-Header-%d: value %d\n" % (i, i) for i in range(5_000)) + b"\nbody\n"


def header_without_colon_and_continuation_first():
    return b" leading continuation\nnot a header line\nFrom: a@b.c\n\nbody\n"


def header_only_no_newline():
    return b"Subject: a header with no body and no newline"


def header_only_with_newline():
    return b"From: a@b.c\nSubject: headers only\n"


def header_only_crlf():
    return b"From: a@b.c\r\nSubject: headers only\r\n"


def empty():
    return b""


def only_newlines():
    return b"\n\n\n"


def blank_line_first():
    return b"\nSubject: this is body now\n\nmore body\n"


def crlf_message():
    return b"From: a@b.c\r\nSubject: crlf\r\nContent-Type: text/plain\r\n\r\nfree money now\r\n"


def cr_only_line_endings():
    return b"From: a@b.c\rSubject: old mac\r\rbody\rbody\r"


def mixed_line_endings():
    return b"From: a@b.c\r\nSubject: mixed\n\r\nbody\r\nmore\rand\n"


def mbox_from_line():
    return b"From nobody Mon Jan  1 00:00:00 2024\nFrom: a@b.c\nSubject: mbox\n\n>From here\nbody\n"


def not_mail_binary():
    return _pseudo_random(20_000)


def not_mail_text():
    return b"This is just a paragraph of text, not an e-mail at all.\nSecond line: with a colon.\n"


def not_mail_png():
    return b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + _pseudo_random(2_000, 7)


def not_mail_html():
    return b"<html><body><a href=http://x.example/>click</a>" + b"<div>" * 2000 + b"</body></html>"


def html_hostile():
    return (HEAD + b"Content-Type: text/html\n\n<html><!-- unclosed comment <script>" + b"<" * 5000
            + b"<a href='" + b"x" * 5000 + b"<style>" + b"a{" * 2000 + b"&#" * 2000 + b"&#x110000;&#0;"
            + b"<img src=" * 500 + b"\n")


def lexer_hostile():
    return (HEAD + b"\n" + b"a@" * 5000 + b" http://" + b"a." * 5000 + b" www." * 1000
            + b" " + "汉字".encode() * 5000 + b" " + b"x" * 20_000 + b" =?utf-8?b?" * 1000 + b"\n")


def message_rfc822_truncated():
    return _multipart(b"M", [b"Content-Type: message/rfc822\n\nFrom: inner@x\nSubject: inner\n"])


def message_rfc822_not_a_message():
    return _multipart(b"M", [b"Content-Type: message/rfc822\n\n" + _pseudo_random(500, 3)])


def content_type_junk():
    return HEAD + b"Content-Type: ;;;/;/;;\nContent-Transfer-Encoding: x-uuencode\nContent-Disposition: ;filename*=\n\nbody\n"


def attachment_header_only():
    return _multipart(b"AT", [b'Content-Type: application/octet-stream; name="a.exe"\n'
                              b"Content-Disposition: attachment; filename*0*=utf-8''%E4%BD; filename*1=.exe\n"])


def nested_50():
    return nested(50)


def parts_300():
    return many_parts(300)


SMALL = {f.__name__: f for f in [
    boundary_never_used, boundary_not_closed, boundary_missing_param, boundary_empty_and_quoted_junk,
    boundary_prefix_of_another, preamble_epilogue_only, bad_base64, base64_truncated_tail,
    bad_quoted_printable, unknown_charset, lying_charset_utf8_on_gb2312, lying_charset_ascii_on_binary,
    charset_garbage_values, rfc2047_broken_words, nul_bytes, eight_bit_headers, overlong_header_line,
    overlong_folded_header, many_headers, header_without_colon_and_continuation_first,
    header_only_no_newline, header_only_with_newline, header_only_crlf, empty, only_newlines,
    blank_line_first, crlf_message, cr_only_line_endings, mixed_line_endings, mbox_from_line,
    not_mail_binary, not_mail_text, not_mail_png, not_mail_html, html_hostile, lexer_hostile,
    message_rfc822_truncated, message_rfc822_not_a_message, content_type_junk, attachment_header_only,
    nested_50, parts_300,
]}


# -- big kinds (generated on demand, never committed) ----------------------------------


def nested(depth: int, body: bytes = b"hello from the bottom\n") -> bytes:
    """Multiparts nested ``depth`` levels deep, each closed properly."""
    out = [MIME + b'Content-Type: multipart/mixed; boundary="b0"\n\n']
    for i in range(1, depth):
        out.append(b'--b%d\nContent-Type: multipart/mixed; boundary="b%d"\n\n' % (i - 1, i))
    out.append(b"--b%d\nContent-Type: text/plain\n\n" % (depth - 1) + body)
    out.extend(b"--b%d--\n" % i for i in reversed(range(depth)))
    return b"".join(out)


def nested_rfc822(depth: int) -> bytes:
    """message/rfc822 parts nested ``depth`` levels deep (the stdlib parser recurses)."""
    return b"".join([MIME + b"Content-Type: message/rfc822\n\n"] * depth) + b"Subject: bottom\n\nhi\n"


def many_parts(n: int) -> bytes:
    return _multipart(b"XX", [_text_part(b"part %d words here" % i) for i in range(n)])


def huge_message(size: int = 50_000_000) -> bytes:
    line = b"the quick brown fox jumps over the lazy dog, buy cheap pills now\n"
    return HEAD + b"Content-Type: text/plain\n\n" + line * (size // len(line))


def huge_newlines(size: int = 50_000_000) -> bytes:
    """The stdlib parser's worst case per byte: every byte a line."""
    return HEAD + b"\n" + b"\n" * size


def deep_and_long(depth: int = 900, lines: int = 100_000) -> bytes:
    """Deep nesting with many lines at the bottom (the parser's lines x depth)."""
    return nested(depth, b"--\n" * lines)


def big_base64_attachment(size: int = 30_000_000) -> bytes:
    data = base64.encodebytes(_pseudo_random(1 << 16) * (size // (1 << 16) + 1))[:size]
    return _multipart(b"ATT", [_text_part(b"see the attached file"),
                               b'Content-Type: application/octet-stream; name="big.bin"\n'
                               b"Content-Transfer-Encoding: base64\n"
                               b'Content-Disposition: attachment; filename="big.bin"\n\n' + data])


def gzip_bomb(expanded: int = 1 << 30) -> bytes:
    """A gzip attachment of ``expanded`` zero bytes (1 GiB -> ~1 MB compressed):
    one 16 MiB gzip member repeated (gunzip joins concatenated members)."""
    member_size = min(expanded, 1 << 24)
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    member = comp.compress(b"\0" * member_size) + comp.flush()
    gz = member * (expanded // member_size)
    assert gz[:2] == b"\x1f\x8b"  # a gzip stream (gunzip would expand it)
    enc = base64.encodebytes(gz)
    return _multipart(b"GZ", [_text_part(b"invoice attached"),
                              b'Content-Type: application/gzip; name="invoice.gz"\n'
                              b"Content-Transfer-Encoding: base64\n"
                              b'Content-Disposition: attachment; filename="invoice.gz"\n\n' + enc,
                              b'Content-Type: text/plain\nContent-Encoding: gzip\n'
                              b"Content-Transfer-Encoding: base64\n\n" + enc])


BIG = {
    "nested_1000": lambda: nested(1000),
    "nested_rfc822_1000": lambda: nested_rfc822(1000),
    "parts_10000": lambda: many_parts(10_000),
    "message_50mb": huge_message,
    "newlines_50mb": huge_newlines,
    "deep_and_long": deep_and_long,
    "base64_attachment_30mb": big_base64_attachment,
    "gzip_bomb_1gib": gzip_bomb,
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder to write NAME.eml files into")
    ap.add_argument("--big", action="store_true", help="also write the big kinds (~200 MB)")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    kinds = dict(SMALL)
    if args.big:
        kinds.update(BIG)
    for name, make in kinds.items():
        with open(os.path.join(args.out, name + ".eml"), "wb") as f:
            f.write(make())
    print(f"wrote {len(kinds)} files to {args.out}")


if __name__ == "__main__":
    main()
