"""Lexing decoded text into word, URL, address, number and CJK tokens.

One concern: turn a ``str`` (already decoded, normalised and, if the caller
wants, case-folded) into token strings.  Nothing here knows about MIME or HTML.

Speed dictates the shape of the hot path (:func:`words`).  A single
``regex.findall`` over the text pays a Unicode-aware match for every word, many
times what ``str.split`` pays per chunk in C, so ASCII text goes through
``split`` + ``strip`` (SpamBayes' whitespace split, with surrounding punctuation
stripped), and only chunks that contain non-ASCII characters are handed to the
Unicode-aware ``regex`` pattern (``\\p{L}``, ``\\p{N}``, CJK scripts).

Every pattern here runs in linear time: character-class runs are possessive or
cannot fail after they start, and the only pattern with a run before a
required character (e-mail addresses) is anchored by a look-behind and bounded,
so a 10 MB line without spaces is scanned once.
"""

import functools
import re

__all__ = [
    "CJK_SCHEMES",
    "crack_url",
    "crack_email",
    "domain_tokens",
    "find_urls",
    "find_emails",
    "has_cjk",
    "skip_token",
    "words",
    "cjk_tokens",
    "shape",
    "clean", "bucket"]

CJK_SCHEMES = ("bigram", "unigram", "uni+bigram", "none", "bigram+run", "unigram+run",
               "run-or-bigram")

# Punctuation stripped from both ends of a whitespace-separated chunk.  '$' and
# '%' are kept so that money and percentages ("$99.95", "50%") stay tokens.
_STRIP = "!\"#&'()*+,-./:;<=>?@[\\]^_`{|}~"
_USTRIP = _STRIP + "\u00a1\u00ab\u00b7\u00bb\u00bf\u2018\u2019\u201c\u201d\u2022\u2026\u2013\u2014\u3001\u3002\u300a\u300b\u3010\u3011\uff01\uff08\uff09\uff0c\uff1a\uff1b\uff1f"

# Han, Kana and Hangul.  The ranges (used by the fast `re` test) and the
# Unicode script properties (used by `regex`) describe the same runs.
_CJK_RANGES = (
    "\u1100-\u11ff\u3040-\u30ff\u3130-\u318f\u31f0-\u31ff\u3400-\u4dbf"
    "\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\U00020000-\U0002fa1f"
)
# Compiled on first use (has_cjk): the astral range makes this class slow to
# compile, a cost every filter start-up would pay if done at import.
_cjk_search = None
_CJK = r"\p{Han}\p{Hiragana}\p{Katakana}\p{Hangul}\u30fc"
# One match is either a CJK run (group 1) or a non-CJK word (group 2): letters,
# marks and digits, with single inner apostrophes/dots/hyphens ("l'été",
# "3.5").  Possessive quantifiers: a failed inner piece never backtracks.
# A CJK run is one script's run (Han, Hiragana, Katakana, Hangul): in
# Japanese the script changes approximate word boundaries; Chinese is all Han.
# One match is either a CJK run (group 1) or a non-CJK word (group 2): letters,
# marks and digits, with single inner apostrophes/dots/hyphens ("l'été",
# "3.5").  Possessive quantifiers: a failed inner piece never backtracks.
_UNI_WORD_PATTERN = (
    r"(\p{Han}++|\p{Hiragana}++|[\p{Katakana}\u30fc]++|\p{Hangul}++)"
    r"|([$\u20ac\u00a3\u00a5]?+[[\p{L}\p{M}\p{N}]--[" + _CJK + r"]]++"
    r"(?:['\u2019.,\-][[\p{L}\p{M}\p{N}]--[" + _CJK + r"]]++)*+%?+)"
)
_uni_word = None


def _uni_findall(chunk):
    """``findall`` of the Unicode word pattern, compiled on first use.

    Importing ``regex`` and compiling this pattern are a visible part of a
    filter start-up; an ASCII message (the per-message filter's common case)
    never needs them.
    """
    global _uni_word
    if _uni_word is None:
        import regex
        _uni_word = regex.compile(_UNI_WORD_PATTERN, regex.V1).findall
    return _uni_word(chunk)


# URLs: a scheme or "www." followed by a run of URL characters.  One class run,
# nothing required after it: cannot backtrack.
_URL = re.compile(r"""(?:https?|ftp)://[^\s<>"'`{}|\\^\[\]]+|www\.[^\s<>"'`{}|\\^\[\]]+""", re.I)
_URL_BODY = re.compile(r"""[^\s<>"'`{}|\\^\[\]]+""")
# E-mail addresses: local part ending at the "@" (searched within 64
# characters before it), then the domain.  Both bounded: linear time.
_LOCAL_TAIL = re.compile(r"[\w.+=\-]{1,64}\Z", re.ASCII)
_DOMAIN_AT = re.compile(r"[\w\-]{1,63}(?:\.[\w\-]{1,63}){1,8}", re.ASCII)
_URL_PATH_SPLIT = re.compile(r"[/?&=#.\-_+;:,~%!*()$@]+")
_IPV4 = re.compile(r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}\Z")
_SHAPE_DIGITS = re.compile(r"[0-9]+")
_SHAPE_ALPHA = re.compile(r"[A-Za-z]+")
_URL_DROP = dict.fromkeys(map(ord, "\t\r\n"))
# A scheme not followed by "//" (RFC 3986 "scheme:" without an authority: cid:,
# data:, mailto:, about:): letters, digits, "+" and "-" before the first ":", as a
# browser reads it ("localhost:8080/x" too).  The "." RFC 3986 also allows is left
# out: a link "www.example.com:8080/" keeps its host and port.
_OPAQUE_SCHEME = re.compile(r"\s*([a-z][a-z0-9+\-]{0,31}):")
_UNCLEAN = re.compile(r"[\s\x00-\x1f\x7f]+")


def clean(s, limit=40):
    """Make a free-form header or attribute value safe as a token piece.

    Whitespace and control characters become ``_`` (tokens are written one
    per line), and the value is cut to ``limit`` characters.
    """
    return _UNCLEAN.sub("_", s.strip())[:limit]


def skip_token(word):
    """Summary for an overlong word, SpamBayes style: first char and length/10.

    >>> skip_token("abcdefghijklmnopqrstuvwxyz")
    'skip:a 20'
    """
    c = word[0]
    if not c.isprintable() or c.isspace():
        c = "?"
    return "skip:%s %d" % (c, len(word) // 10 * 10)


def has_cjk(text):
    """True when ``text`` contains a Han, Kana or Hangul character."""
    global _cjk_search
    if _cjk_search is None:
        _cjk_search = re.compile("[" + _CJK_RANGES + "]").search
    return _cjk_search(text) is not None


def cjk_tokens(run, scheme):
    """Tokens for a run of CJK characters (no spaces between words).

    ``"bigram"``: overlapping character pairs (a lone character stays a unigram),
    ``"unigram"``: single characters, ``"uni+bigram"``: both,
    ``"none"``: the run is one word (subject to the word length bounds).
    ``"bigram+run"`` / ``"unigram+run"``: as named, and :func:`words` adds
    the whole run as a word too; ``"run-or-bigram"`` (handled in
    :func:`words`): a run up to the maximum word length is one word, a
    longer one is cut into bigrams.
    """
    if scheme.endswith("+run"):
        scheme = scheme[:-4]
    n = len(run)
    if scheme == "bigram":
        if n == 1:
            return [run]
        return [run[i:i + 2] for i in range(n - 1)]
    if scheme == "unigram":
        return list(run)
    if scheme == "uni+bigram":
        return list(run) + [run[i:i + 2] for i in range(n - 1)]
    return [run]


def words(text, min_len=2, max_len=12, cjk="none", prefix=""):
    """Lex running text into word tokens, each with ``prefix`` prepended.

    ASCII chunks: split on whitespace, strip surrounding punctuation, keep
    words of ``min_len``..``max_len`` characters; longer ones become one
    :func:`skip_token`.  Non-ASCII chunks: the Unicode pattern splits CJK runs
    (tokenized by :func:`cjk_tokens`) from other letter/digit words.
    URLs and e-mail addresses should have been taken out first
    (:func:`find_urls`, :func:`find_emails`).
    """
    strip = _STRIP
    if text.isascii():
        # Fast path (most mail): list comprehensions, no per-token branching
        # in Python beyond the length test.  Skip tokens come last.
        ws = [w.strip(strip) for w in text.split()]
        if prefix:
            out = [prefix + w for w in ws if min_len <= len(w) <= max_len]
        else:
            out = [w for w in ws if min_len <= len(w) <= max_len]
        out.extend([prefix + skip_token(w) for w in ws if len(w) > max_len])
        return out
    out = []
    append = out.append
    with_run = cjk.endswith("+run")
    run_or_bigram = cjk == "run-or-bigram"
    for w in text.split():
        if w.isascii():
            w = w.strip(strip)
            n = len(w)
            if n > max_len:
                append(prefix + skip_token(w))
            elif n >= min_len:
                append(prefix + w)
            continue
        for run, word in _uni_findall(w):
            if run:
                if run_or_bigram:
                    if len(run) <= max_len:
                        append(prefix + run)
                    else:
                        for t in cjk_tokens(run, "bigram"):
                            append(prefix + t)
                    continue
                if cjk != "none":
                    for t in cjk_tokens(run, cjk):
                        append(prefix + t)
                    if not with_run:
                        continue
                # The whole run (a phrase between punctuation) as a word.
                word = run
            n = len(word)
            if n > max_len:
                append(prefix + skip_token(word))
            elif n >= min_len:
                append(prefix + word)
    return out


def _cut(text, spans):
    """``text`` with the sorted, disjoint ``spans`` replaced by a space each."""
    out = []
    last = 0
    for a, b in spans:
        out.append(text[last:a])
        last = b
    out.append(text[last:])
    return " ".join(out)


def find_urls(text, lowered=False):
    """Return ``(urls, text_without_urls)``; cheap when there is no URL.

    ``str.find`` locates each ``://`` and ``www.`` (C speed), a short regex
    match takes the URL's extent.  A regex scan for the same URLs was the
    slowest step of plain-text tokenizing, since most text holds no URL.
    ``lowered``: the caller has just lower-cased ``text``, so the test for it
    is skipped (``islower()`` reads the whole text: a third of this
    function's time on the shipped corpus's bodies, 0.055 of 0.163 CPU s).
    """
    low = text if lowered or text.islower() else text.lower()
    if "://" not in text and "www." not in low:
        return [], text
    if len(low) != len(text):  # lower() changed lengths (e.g. U+0130): no shared offsets
        urls = _URL.findall(text)
        return urls, (_URL.sub(" ", text) if urls else text)
    urls = []
    spans = []
    pos = 0
    i = low.find("://")
    j = low.find("www.")
    while i >= 0 or j >= 0:
        if j >= 0 and (i < 0 or j < i):
            e = _URL_BODY.match(text, j).end()  # "www." itself always matches
            if e > j + 4:  # something after "www."
                spans.append((j, e))
            pos = e
        else:
            pos = i + 3
            for scheme in ("https", "http", "ftp"):
                if low.endswith(scheme, max(0, i - len(scheme)), i):
                    m = _URL_BODY.match(text, pos)
                    if m:
                        start = max(i - len(scheme), spans[-1][1] if spans else 0)
                        spans.append((start, m.end()))
                        pos = m.end()
                    break
        if 0 <= i < pos:
            i = low.find("://", pos)
        if 0 <= j < pos:
            j = low.find("www.", pos)
    if not spans:
        return [], text
    urls = [text[a:b] for a, b in spans]
    return urls, _cut(text, spans)


def find_emails(text):
    """Return ``([(local, domain), ...], text_without_addresses)``.

    Each ``@`` (found by ``str.find``) is tried once: the local part is the
    run of address characters just before it (at most 64), the domain a
    dotted name just after it.
    """
    at = text.find("@")
    if at < 0:
        return [], text
    found = []
    spans = []
    pos = 0
    while at >= 0:
        m = _LOCAL_TAIL.search(text, max(pos, at - 64), at)
        d = _DOMAIN_AT.match(text, at + 1) if m else None
        if d:
            found.append((m.group(), d.group()))
            spans.append((m.start(), d.end()))
            pos = d.end()
        at = text.find("@", max(at + 1, pos))
    if not spans:
        return [], text
    return found, _cut(text, spans)


# The same hosts and links recur across messages (SpamAssassin corpus: 168,114
# domain_tokens calls for 20,688 distinct arguments, 42,095 crack_url calls for
# 19,507), so both functions are memoised and return tuples.
_MEMO = 1 << 14


@functools.lru_cache(maxsize=_MEMO)
def domain_tokens(host, prefix, levels=4):
    """``prefix + domain`` for the registered domain and up to ``levels`` labels (a tuple).

    ``mail.example.co.uk`` -> ``co.uk``, ``example.co.uk``, ``mail.example.co.uk``.
    Dotted-quad hosts give the address and its /24 and /16 prefixes, under
    ``prefix + "ip:"``.
    """
    host = host.strip(".").lower()
    if not host:
        return ()
    # Callers pass hosts without whitespace or control characters
    # (regex-extracted, or cleaned once by crack_url): no per-token clean().
    if host[-1].isdigit() and _IPV4.match(host):
        a = host.split(".")
        return (prefix + "ip:" + host, prefix + "ip:" + ".".join(a[:3]),
                prefix + "ip:" + ".".join(a[:2]))
    i = host.rfind(".")
    if i < 0:
        return (prefix + host[:63],)
    out = []
    for _ in range(levels - 1):  # suffixes of 2, 3, ... labels (rfind, no split/join)
        i = host.rfind(".", 0, i)
        if i < 0:
            out.append(prefix + host[:80])
            break
        out.append(prefix + host[i + 1:][:80])
    return tuple(out)


@functools.lru_cache(maxsize=_MEMO)
def crack_url(url, prefix="url:", path=True):
    """Tokens for one URL (a tuple): scheme, host and its parent domains, path pieces.

    A URL with no ``://`` is read as ``http`` (``www.example.com/x``), unless it
    starts with a scheme of its own (``cid:``, ``data:``, ``mailto:``...): then
    the scheme is its only token (a Content-ID is no host, the ``@`` in it no
    user info).

    Obfuscation that spam uses gets its own token: user info before the host
    (``http://bank.com@evil.example/``), a numeric host, a port, %-escapes.

    >>> crack_url("http://www.Example.com:8080/buy/now.html?id=7")[:4]
    ('url:proto:http', 'url:port', 'url:example.com', 'url:www.example.com')
    """
    # A browser drops ASCII tab, CR and LF anywhere in a URL (WHATWG URL parsing),
    # and HTML attributes wrap long links; so does this (tokens never hold newlines).
    url = url.translate(_URL_DROP).lower()
    scheme, sep, rest = url.partition("://")
    if not sep:
        opaque = _OPAQUE_SCHEME.match(url)
        if opaque:  # cid:, data:, mailto:, about:...: a scheme, but no host to crack
            return (prefix + "proto:" + clean(opaque.group(1), 10),)
        scheme, rest = "http", url  # "www.example.com/...", "host:8080/...": read as http
    out = [prefix + "proto:" + clean(scheme, 10)]
    cut = len(rest)
    for ch in "/?#":
        i = rest.find(ch)
        if 0 <= i < cut:
            cut = i
    netloc, tail = rest[:cut], rest[cut:]
    if "@" in netloc:
        out.append(prefix + "userinfo")
        netloc = netloc.rpartition("@")[2]
    host, colon, _port = clean(netloc, 100).partition(":")
    if colon:
        out.append(prefix + "port")
    if "%" in host:
        out.append(prefix + "escaped-host")
    if host.isdigit():
        out.append(prefix + "ip:numeric")
    else:
        out.extend(domain_tokens(host, prefix))
    if path and tail:
        if "%" in tail:
            out.append(prefix + "escapes")
        pieces = [p for p in _URL_PATH_SPLIT.split(tail) if p]
        for p in pieces[:10]:
            if len(p) > 20:
                out.append(prefix + "path:" + skip_token(p))
            else:
                out.append(prefix + "path:" + p)
    return tuple(out)


def crack_email(local, domain, prefix="email:"):
    """Tokens for an address found in running text: local part and domains."""
    local = local.lower()
    out = [prefix + "local:" + (local if len(local) <= 20 else skip_token(local))]
    out.extend(domain_tokens(domain, prefix + "domain:", levels=3))
    return out


def shape(s, limit=30):
    """Shape of an identifier: digit runs -> ``9``, letter runs -> ``a``.

    >>> shape("023501c4fdf8$d08a5560")
    '9a9a9$a9a9'
    """
    return clean(_SHAPE_ALPHA.sub("a", _SHAPE_DIGITS.sub("9", s)), limit)


def bucket(n):
    """Power-of-two bucket of a count: 0, 1, 2, 4, 8, ... (counts as tokens)."""
    return 1 << (n.bit_length() - 1) if n > 0 else 0
