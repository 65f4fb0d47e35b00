"""RFC 2047 encoded words: the standard library's reading, without its cost on the common shapes.

:func:`encoded_words` gives exactly what ``email.header.decode_header`` gives
(``(bytes, charset)`` chunks: the decoded words, adjacent words of one charset
joined, the blanks between encoded words dropped, the unencoded text's lines
unfolded its way), or None for a value it leaves to the standard library.
Charsets are not read here: both give the same chunks to
:func:`spamnb.mail.mime.decode_header`, which decodes them (aliases, guesses,
unknown charsets, errors) as before.

Why: machine-written fields are long runs of encoded words. In the modern
spam corpus (modern-spam-dev), 2,643 of 2,797 messages carry an
``X-Microsoft-Antispam-Message-Info`` of about 3,800 characters, some 50
encoded words. The standard library reads a value line by line: a regex split,
list pops, a ``re.sub`` with a callback and a bytes concatenation per word.
Over that corpus's 4,495 values with an encoded word (cut as the tokenizer
cuts them) it took 0.49 CPU s, this decoder 0.15 (median paired ratio 0.31,
9 interleaved passes); header tokens of the corpus 1.54 -> 1.26 CPU s, paired
ratio 0.76; the shipped corpus, 117 such values, 1.0 (docs/tokenizer-speed.md).

What is taken (everything else goes to the standard library, which reads
it as before): an ASCII value without the rarer line and blank characters
(\\v, \\f, \\x1c-\\x1f); at least one encoded word; every word's encoded text
without a blank, a tab or a line end; base64 that decodes; no ``=?`` outside
the words but a cut-off word at the end. Within that, each rule of
``decode_header`` is kept, written where it is applied below. The tests
compare the two on every header value of the shipped, golden and fuzz
messages and on generated values (tests/test_rfc2047.py).

Every check here is a C scan (``in``, ``isascii``) or one regex split: a regex
character class costs 4-10 ns a character, ``in`` a fraction of that, and the
values that matter are 4,000 characters long.
"""

import binascii
import itertools
import operator
import re

__all__ = ["encoded_words"]

# Not in the values taken: with them out, str.splitlines() breaks an ASCII value
# only at CR, LF and CRLF, and str.isspace() and lstrip() see only blank, tab, CR
# and LF, as bytes.isspace() does.
_ODD = ("\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f")
# Not in a word's encoded text: email.header reads line by line, so no part of its
# word holds a line end, and it drops an encoded word whose text is all blanks when
# it stands between two others (a rule for unencoded blanks that it applies to any word).
_NOT_IN_TEXT = (" ", "\t", "\r", "\n")
# email.header.ecre, greedy where ecre is not: ecre's charset runs to the first "?"
# either way, and its encoded text is the shortest up to "?=", this one's up to the
# first "?", which must be followed by "=". So where this one matches, ecre matches
# the same; a word that ecre alone takes has a "?" in its text, which leaves its
# "=?" outside the words found here (checked below). The words found are then
# checked for line ends, so that they are the words of each line, in order.
_WORD = re.compile(r"=\?([^?]*)\?([qQbB])\?([^?]*)\?=")
# email.header.ecre itself, within a line.
_ECRE = re.compile(r"=\?[^?\r\n]*\?[qQbB]\?[^\r\n]*?\?=")
# email.quoprimime.header_decode's escapes.
_HEX = re.compile(r"=[a-fA-F0-9]{2}", re.ASCII)


_charset = operator.itemgetter(0)


def _unhex(match):
    return chr(int(match[0][1:], 16))


def _decoded(encodings, texts):
    """The words' bytes, as email.header decodes them; None when a base64 word does not."""
    try:
        # b: missing padding added ("Postel's law"); q (quoprimime.header_decode): "_" is
        # a blank, then the =XX escapes; its characters (below 256) to bytes as Latin-1.
        return [binascii.a2b_base64(t + "=" * (-len(t) % 4)) if e in "bB"
                else _HEX.sub(_unhex, t.replace("_", " ")).encode("latin-1") if "=" in t
                else t.replace("_", " ").encode("ascii")
                for e, t in zip(encodings, texts)]
    except binascii.Error:  # the standard library raises; the caller keeps the value as it is
        return None


def _unencoded(segment, at_start, between):
    """The unencoded words of the text between two encoded words (or before the first,
    ``at_start``, or after the last), as the standard library's line loop makes them."""
    lines = segment.splitlines()
    # Each line's text before its first encoded word is lstripped; only the first
    # line of a segment after a word is the rest of that word's line.
    words = [line.lstrip() if i or at_start else line for i, line in enumerate(lines)]
    words = [w.encode("ascii") for w in words if w]
    # decode_header drops a word of blanks between two encoded words. (Text of only
    # blanks there is one such word at most: its later lines are lstripped to nothing.)
    if between and len(words) == 1 and words[0].isspace():
        return ()
    return words


def encoded_words(value):
    """``email.header.decode_header(value)`` for the values described above, else None."""
    if not value.isascii() or any(map(value.__contains__, _ODD)):
        return None
    pieces = _WORD.split(value)  # text, (charset, encoding, encoded text, text)...
    last = len(pieces) - 1
    # No word: decode_header's test for one spans lines (its charset may hold a line end).
    if not last:
        return None
    texts = "".join(pieces[3::4])
    charsets = "".join(pieces[1::4])
    if any(map(texts.__contains__, _NOT_IN_TEXT)) or "\r" in charsets or "\n" in charsets:
        return None
    # A "=?" between the words or before them may start a word that ecre takes and
    # _WORD does not, and that might run on into the next: left to the standard library.
    # After the last word it is most often a word cut off (the tokenizer cuts long
    # values before decoding): kept unless ecre finds a word there.
    if "=?" in "".join(pieces[0:last:4]) or "=?" in pieces[last] and _ECRE.search(pieces[last]):
        return None
    decoded = _decoded(pieces[2::4], pieces[3::4])
    if decoded is None:
        return None
    charsets = [c.lower() for c in pieces[1::4]]  # decode_header lower-cases them
    # Adjacent words of one charset are one chunk: unencoded ones joined by a blank,
    # encoded ones directly. An unencoded chunk never joins an encoded one.
    chunks = []
    lead = _unencoded(pieces[0], True, False) if pieces[0] else ()
    if lead:
        chunks.append((b" ".join(lead), None))
    between = "".join(pieces[4:last:4])
    if between and not between.isspace():
        items = []
        for i, word in zip(range(4, last + 1, 4), zip(charsets, decoded)):
            items.append(word)
            items.extend((None, w) for w in _unencoded(pieces[i], False, i < last))
        for charset, group in itertools.groupby(items, _charset):
            parts = [data for _, data in group]
            chunks.append((b" ".join(parts) if charset is None else b"".join(parts), charset))
        return chunks
    # The usual shape: only blanks between the words, which are dropped.
    if charsets.count(charsets[0]) == len(charsets):
        chunks.append((b"".join(decoded), charsets[0]))
    else:
        for charset, group in itertools.groupby(zip(charsets, decoded), _charset):
            chunks.append((b"".join([data for _, data in group]), charset))
    trail = _unencoded(pieces[last], False, False) if pieces[last] else ()
    if trail:
        chunks.append((b" ".join(trail), None))
    return chunks
