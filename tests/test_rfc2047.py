"""spamnb.mail.rfc2047: the standard library's RFC 2047 reading, on the values it takes.

Whatever ``encoded_words`` takes must come out as ``email.header.decode_header``'s
chunks, and ``mime.decode_header`` (what the tokenizer reads) must give the same text
through it as through the standard library alone. Checked on crafted shapes, on every
header value of the golden and fuzz messages (and, ``-m slow``, of the shipped corpus),
and on generated values.
"""

import base64
import email.header
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spamnb.mail import mime, rfc2047

_HERE = Path(__file__).resolve().parent
_CUT = 4000  # the tokenizer's cut before decoding (tokenizer._MAX_RAW_HEADER)


def _stdlib(value):
    """decode_header's chunks, or "raises"."""
    try:
        return email.header.decode_header(value)
    except email.errors.HeaderParseError:
        return "raises"


def _text_through_stdlib(value, fallback, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(rfc2047, "encoded_words", lambda v: None)
        return mime.decode_header(value, fallback)


def _same(value, monkeypatch=None, fallback=None):
    """Asserts that ``value`` gets the standard library's chunks (and text) if it is
    taken; returns whether it is."""
    mine = rfc2047.encoded_words(value)
    if mine is None:
        return False
    assert mine == _stdlib(value), value
    if monkeypatch is not None:
        assert mime.decode_header(value, fallback) == _text_through_stdlib(value, fallback, monkeypatch), value
    return True


def _b(text, charset="utf-8"):
    return "=?%s?B?%s?=" % (charset, base64.b64encode(text.encode(charset)).decode())


# Taken (True) or left to the standard library (False).
_SHAPES = {
    "one b word": (_b("中文"), True),
    "b and q with text between": ("=?utf-8?B?5Lit5paH?= and =?iso-8859-1?Q?caf=E9?=", True),
    "text before and after": ("Re: " + _b("prix réduit") + " <a@example.com>", True),
    "adjacent, no blank": (_b("ab") + _b("cd"), True),
    "adjacent, blanks and tabs": (_b("ab") + " \t " + _b("cd"), True),
    "folded CRLF": (_b("ab") + "\r\n " + _b("cd") + "\r\n\t" + _b("ef"), True),
    "folded LF, blank line": (_b("ab") + "\n\n " + _b("cd"), True),
    "folded, trailing blanks": (_b("ab") + "  \r\n " + _b("cd") + "  ", True),
    "folded text between": (_b("ab") + " x\r\n  y " + _b("cd"), True),
    "text lines": ("a  \r\n b " + _b("cd") + "\r\n  tail \r\n more", True),
    "charsets alternate": (_b("ab", "utf-8") + " " + _b("cd", "iso-8859-1") + " " + _b("ef", "UTF-8"), True),
    "unknown charset": ("=?x-bogus?Q?abc?= =?x-bogus?q?d_e?=", True),
    "charset with language": ("=?utf-8*en?q?hello?=", True),
    "empty charset and text": ("=??q??= x", True),
    "q escapes, underscore, stray =": ("=?utf-8?Q?a=3Db_c=ZZ=4?=", True),
    "q lower-case hex": ("=?latin-1?q?caf=e9?=", True),
    "b missing padding": ("=?utf-8?b?YWJjZA?=", True),
    "b junk characters": ("=?utf-8?b?YW!JjZA==?=", True),
    "b padding inside": ("=?utf-8?b?YQ==YQ==?=", True),
    "cut off after the last word": (_b("ab") + "\r\n =?utf-8?B?Y2Rl", True),
    "other controls": ("\x00" + _b("ab") + "\x7f", True),
    "base64 of junk only": ("=?utf-8?B?####?= tail", True),
    "bad base64": ("=?utf-8?b?Y?= tail", False),
    "b one character too many": ("=?utf-8?b?YWJjZ?=", False),
    "non-ASCII": ("café " + _b("ab"), False),
    "8-bit as surrogates": ("\udce9 " + _b("ab"), False),
    "a vertical tab": (_b("ab") + "\x0b" + _b("cd"), False),
    "a file separator": (_b("ab") + " \x1c " + _b("cd"), False),
    "no word": ("=?utf-8?q?not closed", False),
    "word across a line end": ("=?utf-8?q?a\r\n b?=", False),
    "charset across a line end": ("=?utf\n-8?q?ab?= " + _b("cd"), False),
    "q text with a ?": ("=?utf-8?q?a?b?= " + _b("cd"), False),
    "q text with a blank": ("=?utf-8?q?a b?=", False),
    "blank-only word between two": (_b("ab") + "=?utf-8?q? ?=" + _b("cd"), False),
    "stray =? before a word": ("a=?b " + _b("cd"), False),
    "stray =? between words": (_b("ab") + " =?x " + _b("cd"), False),
    "a word after the last, ecre's only": (_b("ab") + " =?utf-8?q?a?b?=", False),
}


@pytest.mark.parametrize("name", _SHAPES)
def test_crafted_shapes_are_the_stdlib_chunks_or_handed_over(name, monkeypatch):
    value, taken = _SHAPES[name]
    assert _same(value, monkeypatch, "gb2312") is taken
    if not taken:  # what is handed over is still read, by the standard library
        assert isinstance(mime.decode_header(value), str)


def test_what_the_tokenizer_reads():
    assert mime.decode_header("Re: " + _b("prix réduit") + "\r\n " + _b("à 9 €")) == "Re: prix réduità 9 €"
    assert mime.decode_header("=?utf-8?b?Y?= tail") == "=?utf-8?b?Y?= tail"  # the stdlib raises: kept as it is


def _all_same(raws, monkeypatch):
    """Every header value with a "=?" of every part, whole and cut as the tokenizer cuts it."""
    values = taken = 0
    for raw in raws:
        msg, _ = mime.parse(raw)
        fallback = mime.header_charset(msg)
        for step in mime.walk(msg):
            if isinstance(step, str):  # a cap's marker
                continue
            for _, value in step[0].raw_items():
                value = str(value)
                for v in {value, value[:_CUT]}:
                    if "=?" in v:
                        values += 1
                        taken += _same(v, monkeypatch, fallback)
    return values, taken


def test_every_header_value_of_the_golden_and_fuzz_messages(monkeypatch):
    files = sorted((_HERE / "golden").glob("*.eml")) + sorted((_HERE / "data" / "fuzz").glob("*.eml"))
    values, taken = _all_same((p.read_bytes() for p in files), monkeypatch)
    assert values >= 13 and taken >= values - 1  # 12 of 13


@pytest.mark.slow
def test_every_header_value_of_the_shipped_corpus(monkeypatch):
    from spamnb.mail.sources import iter_index

    values, taken = _all_same((m.raw for m in iter_index(_HERE.parent / "corpora" / "spamassassin.tar.xz")),
                              monkeypatch)
    assert values >= 120 and taken >= values - 1  # 119 of 120 (one has a stray "=?")


# -- generated values ------------------------------------------------------------

_CHARSETS = ["utf-8", "UTF-8", "iso-8859-1", "windows-1251", "gb2312", "x-bogus", "utf-8*en", "", "us-ascii"]
_SEPARATORS = ["", " ", "  ", "\t", "\r\n ", "\n\t", "\r\n", " \r\n \r\n ", "\r", " x ", "Re: ", "\r\n y",
               " <a@b.c>", "\xe9", "\udce9", "\x0b", "\x1c", "=?", "?=", "?", "=", "_", "\x00"]


def _word(rng):
    """An encoded word, well or badly formed."""
    charset = rng.choice(_CHARSETS)
    data = bytes(rng.randrange(256) for _ in range(rng.randrange(8)))
    if rng.random() < 0.5:
        text = base64.b64encode(data).decode()
        if rng.random() < 0.3:
            text = text.rstrip("=")
        if rng.random() < 0.2:
            text = text[:rng.randrange(len(text) + 1)]
        if rng.random() < 0.1:
            text += rng.choice(["!", "=", "-", " ", "\r\n", "?"])
        encoding = rng.choice("bB")
    else:
        text = "".join(rng.choice(["=%02X" % b, "=%02x" % b, chr(b) if 33 <= b < 127 else "_"]) for b in data)
        if rng.random() < 0.1:
            text += rng.choice(["=", "=4", "?", " ", "\t", "=\r\n"])
        encoding = rng.choice("qQ")
    return "=?%s?%s?%s?=" % (charset, encoding, text)


def _value(rng):
    pieces = []
    for _ in range(rng.randrange(1, 7)):
        if rng.random() < 0.6:
            pieces.append(rng.choice(_SEPARATORS))
        pieces.append(_word(rng))
    if rng.random() < 0.5:
        pieces.append(rng.choice(_SEPARATORS))
    value = "".join(pieces)
    if rng.random() < 0.1:
        value = value[:rng.randrange(len(value))]  # cut, as the tokenizer cuts
    return value


def test_random_values(monkeypatch):
    rng = random.Random(2047)
    values = [_value(rng) for _ in range(4000)]
    taken = sum(_same(v, monkeypatch, rng.choice([None, "gb2312", "koi8-r"])) for v in values)
    assert taken > len(values) // 4  # the test reaches the fast path, and often
    # and what it hands over is what the standard library reads differently or rejects
    assert sum(_stdlib(v) == "raises" for v in values) > 50


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.sampled_from(_SEPARATORS),
                          st.builds(lambda seed: _word(random.Random(seed)), st.integers(0, 10**9)),
                          st.text(alphabet=" \t\r\n=?_abQBq-8+/", max_size=12)),
                min_size=1, max_size=12))
def test_generated_values(monkeypatch, pieces):
    value = "".join(pieces)
    taken = _same(value, monkeypatch, "gb2312")
    if _stdlib(value) == "raises":
        assert not taken
