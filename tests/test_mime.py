"""spamnb.mail.mime: parsing with caps, transfer decoding, charsets, RFC 2047."""

import base64

import email.message

import pytest

from spamnb.mail import mime


# -- charsets -------------------------------------------------------------------

@pytest.mark.parametrize("label, codec", [
    ("gb2312", "gb18030"),
    ("GB2312", "gb18030"),
    ('"gbk"', "gb18030"),
    ("euc-cn", "gb18030"),
    ("big5", "big5hkscs"),
    ("ks_c_5601-1987", "cp949"),
    ("euc-kr", "cp949"),
    ("iso-8859-1", "cp1252"),
    ("us-ascii", "cp1252"),
    ("3Diso-8859-1", "cp1252"),   # charset=3Diso-8859-1: a QP-mangled header
    ("utf-8", "utf-8"),
    ("koi8-r", "koi8-r"),
    ("x-no-such-charset", None),
    ("", None),
    (None, None),
])
def test_normalize_charset(label, codec):
    assert mime.normalize_charset(label) == codec


def test_decode_ascii_fast_path():
    assert mime.decode_bytes(b"hello", "gb2312") == ("hello", "")


def test_decode_declared_charset():
    assert mime.decode_bytes("café".encode("cp1252"), "iso-8859-1") == ("café", "")


def test_decode_gbk_labelled_gb2312():
    # U+9555 is in GBK but not in GB2312: the alias to gb18030 decodes it.
    text = "中文镕"
    assert mime.decode_bytes(text.encode("gbk"), "gb2312") == (text, "")


def test_decode_lying_latin1_label_on_chinese():
    text = "这是一封中文邮件，没有正确的字符集标签。"
    assert mime.decode_bytes(text.encode("gb2312"), "iso-8859-1") == (text, "gb18030")


def test_decode_missing_charset_utf8_then_cjk_guess():
    assert mime.decode_bytes("naïve".encode("utf-8"), None) == ("naïve", "utf-8")
    text = "没有字符集的中文邮件正文"
    assert mime.decode_bytes(text.encode("gbk"), None) == (text, "gb18030")


def test_decode_multibyte_char_cut_at_end():
    data = "中文".encode("utf-8")[:-1]  # max_part_bytes cut inside a character
    assert mime.decode_bytes(data, "utf-8") == ("中", "")


def test_decode_garbage_never_raises():
    data = bytes(range(256)) * 3
    text, how = mime.decode_bytes(data, "utf-8")
    assert how == "replace" and isinstance(text, str)
    text, how = mime.decode_bytes(data, "x-bogus")
    assert isinstance(text, str)


# -- headers ----------------------------------------------------------------------

def test_decode_header_rfc2047_b_and_q():
    v = "=?utf-8?B?5Lit5paH?= and =?iso-8859-1?Q?caf=E9?="
    assert mime.decode_header(v) == "中文 and café"


def test_decode_header_adjacent_words_split_a_character():
    raw = "中文标题".encode("gb2312")
    a = base64.b64encode(raw[:3]).decode()
    b = base64.b64encode(raw[3:]).decode()
    v = "=?gb2312?B?%s?=\n =?gb2312?B?%s?=" % (a, b)
    assert mime.decode_header(v) == "中文标题"


def test_decode_header_raw_8bit_uses_fallback():
    # The bytes parser keeps 8-bit header bytes as lone surrogates.
    v = "中文主题".encode("gb2312").decode("ascii", "surrogateescape")
    assert mime.decode_header(v, "gb2312") == "中文主题"
    assert mime.decode_header(v, None) == "中文主题"  # guessed


def test_decode_header_broken_encoded_word():
    v = "=?utf-8?B?####?= tail"
    assert "tail" in mime.decode_header(v)
    assert mime.decode_header("=?x-bogus?Q?abc?=") == "abc"


def test_decode_header_unfolds():
    assert mime.decode_header("a\r\n\tb\n c") == "a b c"


# -- a header as a person reads it ---------------------------------------------------------


@pytest.mark.parametrize("value, declared, shown", [
    (b"Prognose f\xc3\xbcr Sie", None, "Prognose für Sie"),  # raw UTF-8: as written
    (b"Personalisierte Prognose f\xc3\xbcr", "iso-8859-1", "Personalisierte Prognose für"),  # UTF-8 first
    (b"=?utf-8?q?Prognose_f=C3=BCr_Sie?=", None, "Prognose für Sie"),
    (b"=?ISO-8859-1?B?R3L832UgYXVzIEv2bG4=?=", None, "Grüße aus Köln"),
    (b"Gr\xfc\xdfe aus K\xf6ln", None, "Grüße aus Köln"),  # Latin-1 is never guessed as Chinese
    (b"\xc4\xe3\xba\xc3", "gb2312", "你好"),  # the message's charset, when it decodes them
    (b"Stra\xc3\x9fe =?utf-8?q?f=C3=BCr?= Sie", None, "Straße für Sie"),  # raw bytes and a word
    (b"bad =?utf-8?q?f=FCr?=", None, "bad für"),  # a word whose bytes are not its charset's
    (b"\xe2\x80\x9cQuoted\xe2\x80\x9d \x80uro", None, "“Quoted” €uro"),  # UTF-8 and one stray byte
    (b"=?utf-8?b?5Lit5paH?=\r\n =?utf-8?b?5qCH6aKY?=\n\t tail", None, "中文标题 tail"),
    (b"a\x1b[2Jred\xe2\x80\xaeevil\x07", None, "a\ufffd[2Jred\ufffdevil\ufffd"),  # no terminal escape, no RLO
    ("Stra\udcc3\udc9fe", None, "Straße"),  # a str read with surrogateescape
    (b"=?utf-8?q?broken", None, "=?utf-8?q?broken"),
])
def test_header_text_is_what_a_person_reads(value, declared, shown):
    assert mime.header_text(value, declared) == shown


def test_header_text_never_raises_and_leaves_the_tokenizers_reading_alone():
    for value in (b"", b"\xff" * 50, b"=?" * 300, b"=?x?b?!!!?=", b"=?utf-8?q?" + bytes(range(256)) + b"?=", 12):
        assert isinstance(mime.header_text(value), str)
    # the tokenizer still guesses (a token may be a guess; a subject shown may not)
    assert mime.decode_header("\xd6\xd0\xce\xc4".encode("latin-1").decode("utf-8", "surrogateescape")) == "中文"
    assert mime.header_text(b"\xd6\xd0\xce\xc4") == "ÖÐÎÄ"


def test_clipped():
    assert mime.clipped("Prognose für Sie", 20) == "Prognose für Sie"
    assert mime.clipped("Prognose für Sie", 9) == "Prognose…" and len(mime.clipped("x" * 99, 9)) == 9



# -- parsing, walking, payloads ---------------------------------------------------

def _nest(n):
    s = b"From: a@b.c\nContent-Type: multipart/mixed; boundary=b0\n\n"
    for i in range(n):
        s += b"--b%d\nContent-Type: multipart/mixed; boundary=b%d\n\n" % (i, i + 1)
    s += b"--b%d\nContent-Type: text/plain\n\ndeepword\n" % n
    return s


def test_walk_depth_cap():
    msg, problems = mime.parse(_nest(30))
    assert problems == []
    items = list(mime.walk(msg, max_depth=5))
    assert "mime:too-deep" in items
    depths = [d for it in items if not isinstance(it, str) for d in [it[1]]]
    assert max(depths) == 5


def test_parse_nesting_beyond_recursion_limit_falls_back():
    msg, problems = mime.parse(_nest(1000))
    assert problems == ["mime:parse-error"]
    assert msg["from"] == "a@b.c"
    assert b"deepword" in mime.payload_bytes(msg, 10**6)


def test_walk_part_cap():
    raw = (b"Content-Type: multipart/mixed; boundary=b\n\n"
           + b"--b\nContent-Type: text/plain\n\nx\n" * 500 + b"--b--\n")
    msg, _ = mime.parse(raw)
    items = list(mime.walk(msg, max_parts=10))
    assert items[-1] == "mime:too-many-parts"
    assert len(items) == 11


def _part(cte, body):
    msg, _ = mime.parse(b"Content-Transfer-Encoding: " + cte + b"\n\n" + body)
    return msg


def test_payload_base64():
    assert mime.payload_bytes(_part(b"base64", base64.b64encode(b"hello world")), 100) == b"hello world"


def test_payload_base64_junk_and_missing_padding():
    enc = base64.b64encode(b"hello world!!").rstrip(b"=")
    body = enc[:5] + b"\n*\n" + enc[5:]
    assert mime.payload_bytes(_part(b"BASE64", body), 100).startswith(b"hello world")


def test_payload_base64_header_lies():
    body = "中文正文，不是 base64。".encode("gb2312")
    assert mime.payload_bytes(_part(b"base64", body), 100) == body


def test_payload_quoted_printable():
    assert mime.payload_bytes(_part(b"quoted-printable", b"caf=E9 =\nsoft"), 100) == b"caf\xe9 soft"


def test_payload_truncated_to_max_bytes():
    body = base64.b64encode(b"x" * 10_000)
    assert mime.payload_bytes(_part(b"base64", body), 100) == b"x" * 100
    assert mime.payload_bytes(_part(b"8bit", b"y" * 1000), 10) == b"y" * 10


def test_parse_never_raises_on_odd_inputs():
    for raw in (b"", b"\x00" * 100, b"\n\n\n", bytes(range(256)), b"From nobody\n"):
        msg, problems = mime.parse(raw)
        assert isinstance(msg, email.message.Message) and problems == []  # parsed, not the fallback
        assert list(mime.walk(msg)) == [(msg, 0)]  # one part: the message itself, no cap hit
    # headerless input is all body, byte for byte (as latin-1 text)
    msg, _ = mime.parse(b"\x00" * 100)
    assert msg.get_payload() == "\x00" * 100 and not msg.keys()


# -- the fast path for single-part messages --------------------------------------------------

from pathlib import Path  # noqa: E402

import email.parser  # noqa: E402

_HERE = Path(__file__).resolve().parent
_SHAPES = {
    # taken by the fast path
    "plain": (b"From: a@example.com\nSubject: hi\n\nbody\n", True),
    "crlf": (b"From: a@example.com\r\nSubject: hi\r\n\r\nbody\r\nmore\r\n", True),
    "cr only": (b"From: a@example.com\rSubject: hi\r\rbody\r", True),
    "cr then crlf": (b"Subject: hi\r\r\nbody\n", True),
    "mbox envelope": (b"From someone Mon Jan  1 00:00:00 2002\nSubject: hi\n\nbody\n", True),
    "folded, blanks": (b"Subject:   \n\tfolded\n  twice \nX-Empty:\nTo:b@x\n\nbody", True),
    "8-bit header": (b"Subject: caf\xe9 \xb0\xa1\nFrom: \xc4\xe3 <a@b.cn>\n\n\xc4\xe3\xba\xc3\n", True),
    "text/html": (b"Content-Type: text/html; charset=utf-8\nSubject: x\n\n<p>hi</p>\n", True),
    "no body": (b"Subject: x\n\n", True),
    "odd names": (b"X-!#$%&'*+-.^_`|~9: v\nSubject:x\n\nbody\n", True),
    # left to the email package
    "no blank line": (b"Subject: x\nFrom: a@b", False),
    "no header end": (b"Subject: x\nnot a header\nbody\n", False),
    "first line continued": (b" cont\nSubject: x\n\nbody\n", False),
    "envelope then continuation": (b"From x\n\tcont\nSubject: x\n\nbody\n", False),
    "misplaced envelope": (b"Subject: x\nFrom y\nTo: z\n\nbody\n", False),
    "last line envelope": (b"Subject: x\nFrom y\n\nbody\n", False),
    "no field name": (b"Subject: x\n: empty\n\nbody\n", False),
    "blank before colon": (b"Subject : x\n\nbody\n", False),
    "blank first": (b"\nSubject: x\n\nbody\n", False),
    "message/rfc822": (b"Content-Type: message/rfc822\n\nSubject: inner\n\nx\n", False),
    "8-bit content type": (b"Content-Type: text/plain; name=\xe9\n\nx\n", False),
    "envelope only": (b"From x\n\nbody\n", False),
}
# Multiparts: the same rules, and the parser's own for delimiters, preamble and epilogue.
_ALT = b'Content-Type: multipart/alternative; boundary="=_b.1"\n'
_PLAIN_PART = b"Content-Type: text/plain\n\nplain\n"
_SHAPES.update({
    # taken by the fast path
    "alternative": (_ALT + b"\n--=_b.1\n" + _PLAIN_PART + b"--=_b.1\nContent-Type: text/html\n\n<p>x</p>\n--=_b.1--\n", True),
    "alternative, crlf": (_ALT.replace(b"\n", b"\r\n") + b"\r\npre\r\n\r\n--=_b.1\r\n\r\nx\r\n\r\n--=_b.1--\r\nepi\r\n", True),
    "alternative, cr only": (_ALT.replace(b"\n", b"\r") + b"\r--=_b.1\rX: y\r\rx\r--=_b.1--", True),
    "cr then crlf before a delimiter": (_ALT + b"\n--=_b.1\n\nx\r\r\n--=_b.1--\r\r\n", True),
    "mixed, attachment, blanks": (b"Content-Type: multipart/mixed;\n boundary=b\n\npreamble\n--b \t\n\n--b\n"
                                  b"Content-Type: application/octet-stream\nContent-Transfer-Encoding: base64\n\nAAAA\n"
                                  b"--bx\n--b--  \n--b\nafter the close\n", True),
    "signed": (b'Content-Type: multipart/signed; protocol="x"; boundary="b"\n\n--b\n\nx\n--b\n'
               b"Content-Type: application/pgp-signature\n\nsig\n--b--", True),
    "no preamble line end": (b"Content-Type: multipart/mixed; boundary=b\n\n\n--b\n\nx\n--b--\n", True),
    "8-bit part header": (b"Content-Type: multipart/mixed; boundary=b\n\n--b\nSubject: caf\xe9\n\n\xe9\n--b--\n", True),
    "nested": (b'Content-Type: multipart/mixed; boundary="b"\n\n--b\n'
               b'Content-Type: multipart/alternative; boundary=c\n\n--c\n\nx\n--c--\n\n--b\n\na\n--b--\n', True),
    "nested, epilogue only a line end": (b'Content-Type: multipart/mixed; boundary="b"\r\n\r\n--b\r\n'
                                         b'Content-Type: multipart/related; boundary=c\r\n\r\n--c\r\n\r\nx\r\n'
                                         b'--c--\r\n--b--\r\n', True),
    "nested, no epilogue": (b'Content-Type: multipart/mixed; boundary="b"\n\n--b\n'
                            b'Content-Type: multipart/alternative; boundary=c\n\n--c\n\nx\n--c--\n--b--\n', True),
    # left to the email package
    "nested, inner close at the outer delimiter": (b'Content-Type: multipart/mixed; boundary="b"\n\n--b\n'
                                                   b'Content-Type: multipart/alternative; boundary=c\n\n--c\n\nx\n'
                                                   b'--b--\n', False),
    "no boundary": (b"Content-Type: multipart/mixed\n\n--b\n\nx\n--b--\n", False),
    "no close delimiter": (b"Content-Type: multipart/mixed; boundary=b\n\n--b\n\nx\n", False),
    "no first delimiter": (b"Content-Type: multipart/mixed; boundary=b\n\nx\n--b--\n", False),
    "two delimiters in a row": (b"Content-Type: multipart/mixed; boundary=b\n\n--b\n--b\n\nx\n--b--\n", False),
    "part without a blank line": (b"Content-Type: multipart/mixed; boundary=b\n\n--b\nX: y\n--b--\n", False),
    "part header not clean": (b"Content-Type: multipart/mixed; boundary=b\n\n--b\nnot a field\n\nx\n--b--\n", False),
    "part envelope line": (b"Content-Type: multipart/mixed; boundary=b\n\n--b\nFrom x\n\nx\n--b--\n", False),
    "message/rfc822 part": (b"Content-Type: multipart/mixed; boundary=b\n\n--b\nContent-Type: message/rfc822\n\n"
                            b"Subject: inner\n\nx\n--b--\n", False),
    "digest": (b"Content-Type: multipart/digest; boundary=b\n\n--b\n\nSubject: inner\n\nx\n--b--\n", False),
    "encoded multipart": (b"Content-Type: multipart/mixed; boundary=b\nContent-Transfer-Encoding: base64\n\n"
                          b"--b\n\nx\n--b--\n", False),
})


def _assert_same_message(fast, ref):
    """The two messages hold the same state, their parts too (compared as objects'
    attributes: what the tokenizer may read of them and more)."""
    assert vars(fast).keys() == vars(ref).keys()
    assert fast._headers == ref._headers
    assert (fast._unixfrom, fast.preamble, fast.epilogue, fast.defects, fast._default_type, fast._charset) == \
        (ref._unixfrom, ref.preamble, ref.epilogue, ref.defects, ref._default_type, ref._charset)
    assert fast.is_multipart() == ref.is_multipart()
    if not ref.is_multipart():
        assert fast._payload == ref._payload
        return
    assert len(fast._payload) == len(ref._payload)
    for a, b in zip(fast._payload, ref._payload):
        _assert_same_message(a, b)


def _same_as_stdlib(raw):
    """Whether the fast path takes ``raw``; asserts it builds the stdlib's message if it does."""
    fast = mime._parse_simple(raw)
    if fast is None:
        return False
    _assert_same_message(fast, email.parser.BytesParser().parsebytes(raw))
    return True


@pytest.mark.parametrize("name", _SHAPES)
def test_simple_parse_builds_the_stdlib_message_or_hands_over(name):
    raw, taken = _SHAPES[name]
    assert _same_as_stdlib(raw) is taken
    msg, problems = mime.parse(raw)
    assert msg._headers == email.parser.BytesParser().parsebytes(raw)._headers and problems == []


def test_simple_parse_on_golden_and_fuzz_messages():
    files = sorted((_HERE / "golden").glob("*.eml")) + sorted((_HERE / "data" / "fuzz").glob("*.eml"))
    taken = [p.name for p in files if _same_as_stdlib(p.read_bytes()[:mime._parse_limit(p.read_bytes())])]
    assert "sa_ham_plain.eml" in taken and "crlf_message.eml" in taken
    assert "sa_ham_alternative_qp.eml" in taken
    # nested_50: deeper than the multipart path goes (parse() hands it over before: _too_deep).
    assert "nested_50.eml" not in taken and "header_without_colon_and_continuation_first.eml" not in taken


def test_multipart_parse_is_bounded_in_depth():
    raw = b"".join(b"Content-Type: multipart/mixed; boundary=b%d\n\n--b%d\n" % (i, i) for i in range(60))
    raw += b"\nx\n" + b"".join(b"--b%d--\n" % i for i in reversed(range(60)))
    assert mime._parse_simple(raw) is None
    assert mime._too_deep(raw) and mime.parse(raw)[1] == ["mime:parse-error"]


def _nested(n, body=b"x"):
    raw = b"".join(b"Content-Type: multipart/mixed; boundary=b%d\n\n--b%d\n" % (i, i) for i in range(n))
    return raw + b"\n" + body + b"\n" + b"".join(b"--b%d--\n" % i for i in reversed(range(n)))


def test_the_multipart_path_takes_shallow_nesting_only():
    """Each level of the fast path holds a copy of the rest of the body: a multipart
    inside a multipart (the corpus's deepest) is taken, deeper ones go to the stdlib
    (39 levels of a 3.8 MB message took 160 MB here, 40 MB there)."""
    assert _same_as_stdlib(_nested(mime.FAST_NESTING + 1))
    assert not _same_as_stdlib(_nested(mime.FAST_NESTING + 2))
    deep = _nested(mime.MAX_OPEN_MULTIPARTS - 2)
    _assert_same_message(mime.parse(deep)[0], email.parser.BytesParser().parsebytes(deep))


@pytest.mark.parametrize("params", [b"boundary*0=a; boundary*=b", b"boundary*=b; boundary*0=a",
                                    b"boundary*1=a; boundary*1=b"])
def test_a_hostile_boundary_parameter_is_the_stdlib_paths_to_judge(params):
    """The stdlib's RFC 2231 decoding raises on some repeated boundary* parameters
    (TypeError): the fast path hands such a message over rather than raising, so
    parse() keeps its header and says what is wrong, as before the path existed."""
    raw = b"Subject: hi\nContent-Type: multipart/mixed; " + params + b"\n\n--b\n\nx\n--b--\n"
    msg, problems = mime.parse(raw)
    assert msg["Subject"] == "hi" and problems in ([], ["mime:parse-error"])


@pytest.mark.slow
def test_simple_parse_on_the_shipped_corpus():
    from spamnb.mail.sources import iter_index

    taken = sum(_same_as_stdlib(m.raw) for m in iter_index(_HERE.parent / "corpora" / "spamassassin.tar.xz"))
    assert taken > 5800  # of 5,943: the common shapes are common (5,447 single-part, 424 multipart)
