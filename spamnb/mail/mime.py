"""Parsing raw RFC 5322 bytes and decoding what the tokenizer reads.

One concern: bytes in, ``email.message.Message`` objects and ``str`` out,
never an exception.  Tokens are made elsewhere (:mod:`spamnb.mail.tokenizer`).

Parser policy: ``email.policy.compat32``.  ``policy.default`` builds a header
object (header registry) for every header it reads, several times the cost of
parsing and reading every part's content type with compat32 on both evaluation
corpora, for structure the tokenizer does not use.  compat32 also never raises
on malformed headers, it records defects instead.  It is the parser's
documented default, so ``BytesParser()`` is given no policy: naming compat32
takes either ``email.policy``, whose imports (header registry, content manager)
every filter start-up would pay, or the private ``email._policybase``.

Caps (the tokenizer's configuration carries them, these are the defaults):

- ``MAX_DEPTH`` = 20 levels of nested multiparts / message/rfc822;
  deeper parts are not visited.  The stdlib parser itself recurses once per
  level and hits Python's recursion limit near 1,000 levels; that message is
  then re-parsed headers-only and its body read as one text/plain part.
- ``MAX_PARTS`` = 100 parts visited per message (a 10,000-part bomb costs the
  stdlib parse, linear, and then no more than 100 parts' work).
- ``MAX_PARSE_BYTES`` = 4 MB and ``MAX_PARSE_LINES`` = 100,000 lines: the
  parser reads no more of a message (``mime:truncated``).  The stdlib parser
  pays per line however short the lines are (a message of bare newlines costs
  more than one of text), and the tokenizer reads at most ``max_part_bytes``
  of a part anyway; the largest message in either corpus is 0.3 MB.
- ``MAX_OPEN_MULTIPARTS`` = 40: the stdlib parser checks every line against the
  boundary of every enclosing multipart, so its time is lines x depth
  (quadratic when both grow).  A cheap scan
  (:func:`_too_deep`) counts the multiparts still open at each boundary
  declaration; past the cap the message is parsed headers-only and its body
  read as text, as for the recursion limit above.
"""

import binascii
import codecs
import email.message
import itertools
import re

from spamnb.verdict import VERDICT_FIELDS

__all__ = [
    "MAX_DEPTH",
    "MAX_PARTS",
    "parse",
    "walk",
    "payload_bytes",
    "decode_bytes",
    "decode_header",
    "header_text",
    "readable",
    "clipped",
    "normalize_charset",
    "header_charset",
    "split_params",
]

MAX_DEPTH = 20
MAX_PARTS = 100
MAX_PARSE_BYTES = 4_000_000
MAX_PARSE_LINES = 100_000
MAX_OPEN_MULTIPARTS = 40

# Declared charset -> the codec that decodes what senders actually meant.
# Declared labels are routinely the narrow historical name of a wider,
# backward-compatible encoding that mail software really used.
_ALIASES = {
    "gb2312": "gb18030", "gbk": "gb18030", "x-gbk": "gb18030", "cp936": "gb18030",
    "euc-cn": "gb18030", "gb_2312-80": "gb18030", "chinese": "gb18030",
    "x-euc-cn": "gb18030", "csgb2312": "gb18030", "hz-gb-2312": "hz",
    "big5": "big5hkscs", "x-big5": "big5hkscs", "big-5": "big5hkscs", "cn-big5": "big5hkscs",
    "ks_c_5601-1987": "cp949", "ks_c_5601": "cp949", "euc-kr": "cp949", "korean": "cp949",
    "shift_jis": "cp932", "shift-jis": "cp932", "sjis": "cp932", "x-sjis": "cp932",
    "ms_kanji": "cp932", "euc-jp": "euc_jis_2004",
    "iso-8859-1": "cp1252", "iso8859-1": "cp1252", "latin1": "cp1252", "latin-1": "cp1252",
    "us-ascii": "cp1252", "ascii": "cp1252", "iso-8859-15": "cp1252", "default": "cp1252",
    "windows-1252": "cp1252", "x-user-defined": "cp1252", "unknown-8bit": "cp1252",
    "utf8": "utf-8", "unicode-1-1-utf-7": "utf-7",
}
# Guesses for undeclared or wrongly declared multibyte text, in order.  GB18030
# first: the multibyte mail we evaluate on (trec06c, kept outside the project)
# is Chinese, and GB18030 rejects most byte strings that are not GB; Big5 and
# Shift_JIS reject GB text often.
_CJK_GUESSES = ("gb18030", "big5hkscs", "cp932", "cp949")
_SINGLE_BYTE = frozenset({"cp1252", "latin-1", "iso8859-15"})
_HIGH = bytes(range(0x80, 0x100))
_B64_JUNK = bytes(b for b in range(256)
                  if not (chr(b).isascii() and (chr(b).isalnum() or chr(b) in "+/")))


# A verdict field's name and colon (spamnb.verdict.VERDICT_FIELDS), as the parser reads a name.
_VERDICT_NAME = rb"(?:" + b"|".join(re.escape(n.encode("ascii")) for n in VERDICT_FIELDS) + rb"):"
# A header field at the very top: an RFC 5322 field name, then a colon, as the
# email package reads one (optionally after an mbox "From " line). Verdict fields
# there do not count: spamnb puts its own at the top of input that is not mail,
# which must stay not mail (and tokenize as before) once filtered, and removes
# incoming ones (strip_verdicts), which must not turn mail into not mail.
_FIELD_AT_TOP = re.compile(
    rb"(?:From [^\r\n]*(?:\r\n|\r|\n))?"
    rb"(?:" + _VERDICT_NAME + rb"[^\r\n]*(?:(?:\r\n|\r|\n)[ \t][^\r\n]*)*(?:\r\n|\r|\n))*+"
    rb"[!-9;-~]+:", re.IGNORECASE)
# A verdict field starting a line of the header block (the first, or after a line end).
_VERDICT_LINE = re.compile(rb"(?:\A|(?<=[\r\n]))" + _VERDICT_NAME, re.IGNORECASE)
# What the email package's parser takes for a header line (email.feedparser.headerRE),
# and for a line end: the header block ends at the first line that is neither.
_HEADER_LINE = re.compile(rb"From |[!-9;-~]*:|[\t ]")
_LINE_END = re.compile(rb"\r\n|\r|\n")


def looks_like_mail(raw) -> bool:
    """Whether ``raw`` starts as a message does: with a header field (after an
    optional mbox ``From`` line).

    Empty input, a file of random bytes, a program, a text that is not mail:
    none has a header at the top, and none is evidence about mail. Every message
    of the shipped corpora and of the project's evaluation corpora passes.
    """
    return _FIELD_AT_TOP.match(bytes(raw[:4096])) is not None


def header_block_end(raw: bytes) -> int:
    """Where the parser's header block ends: the offset of the blank line that
    ends it, or of the first line it takes for body (a line without a colon, a
    NUL or 8-bit field name: the parser then starts the body there, with no
    blank line), or the end of the input. Lines end at CRLF, CR or LF, as the
    parser splits them (``\r\r\n`` is two line ends: the second line is blank).

    A ``From `` line is a header line to the parser, but when it is the last one
    (and not the first, the mbox envelope) the parser gives it back to the body
    ("probably the first line of the body"), so the block ends before it; a
    header written after it would make it a misplaced envelope line instead.
    """
    pos, n, last = 0, len(raw), None  # last: where the block's last line starts
    while pos < n:
        m = _LINE_END.search(raw, pos)
        end = m.start() if m else n
        if end == pos or not _HEADER_LINE.match(raw, pos, end):
            break
        last = pos
        if m is None:
            pos = n
            break
        pos = m.end()
    if last and raw.startswith(b"From ", last):
        return last
    return pos


def strip_verdicts(raw: bytes) -> bytes:
    """``raw`` without the verdict fields (:data:`spamnb.verdict.VERDICT_FIELDS`,
    with their continuation lines) of its header block (:func:`header_block_end`):
    what a sender or an earlier filter wrote there is removed, as SpamAssassin and
    Amavis remove it, before spamnb adds its own. Every other byte stays, in
    order; ``raw`` itself when it has none (most mail).

    Removed, not renamed: a renamed field would still read as a verdict to a
    person, and would be a new header name for the tokenizer. The tokenizer
    never reads these fields, so the message's tokens stay as they were.
    """
    end = header_block_end(raw)
    if _VERDICT_LINE.search(raw, 0, end) is None:
        return raw
    out, pos, dropping = [], 0, False
    while pos < end:
        m = _LINE_END.search(raw, pos, end)
        nxt = m.end() if m else end
        if raw[pos:pos + 1] not in (b" ", b"\t"):  # a new field (a continuation keeps the last one's fate)
            dropping = _VERDICT_LINE.match(raw, pos) is not None
        if not dropping:
            out.append(raw[pos:nxt])
        pos = nxt
    out.append(raw[end:])
    return b"".join(out)


class NotMailError(ValueError):
    """The input is not a mail message (no header field at the top)."""

    def __init__(self):
        super().__init__("not a mail message (no header field at the top)")


def parse(raw):
    """Parse message bytes; never raises.

    Returns ``(message, defect_tokens)`` where ``defect_tokens`` lists
    parse-level trouble as tokens (``mime:parse-error``, ``mime:truncated``).
    """
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raw = bytes(raw)
    raw = bytes(raw)
    problems = []
    cut = _parse_limit(raw)
    if cut < len(raw):
        raw = raw[:cut]
        problems.append("mime:truncated")
    if not _too_deep(raw):
        msg = _parse_simple(raw)
        if msg is not None:
            return msg, problems
        # Imported here: a plain message (the filter's usual one) never needs the
        # feed parser, and a filter start-up saves its import (1-2 ms).
        import email.parser
        try:
            return email.parser.BytesParser().parsebytes(raw), problems
        except RecursionError:
            pass
        except Exception:  # the stdlib parser is lenient; anything here is a bug-class input
            pass
    problems.append("mime:parse-error")
    import email.parser
    try:
        msg = email.parser.BytesParser().parsebytes(raw, headersonly=True)
        # Read the whole body as one text part of the outer message.
        del msg["content-type"]
        del msg["content-transfer-encoding"]
        return msg, problems
    except Exception:
        msg = email.message.Message()
        msg.set_payload(raw.decode("latin-1"))
        return msg, problems


# -- the fast path: one regex over the header block of a single-part message -------------
#
# The common shape of mail (92% of the shipped corpus: 5,470 of its 5,943
# messages; 18,232 of 22,701 in the evaluation corpora with the test messages)
# is one text part under a clean header block. For it the stdlib's feed parser (a generator per
# part, a Python call per line of the whole message for its line splitting and
# boundary checks) was about a quarter of all tokenizing time (1.06 of 3.96 CPU s).
# Here one regex checks and splits the header block and the body is one slice, to
# the very Message the stdlib would build: the same (name, value) pairs in
# _headers (name as written, value after the colon with leading blanks stripped,
# continuation lines kept, the line end stripped: compat32's
# header_source_parse), the envelope line, the body as the payload, no defects.
# Anything else goes to the stdlib parser: a multipart or message/* Content-Type
# (or one that is not ASCII, which compat32 reads through email.header), a header
# block with something the parser records a defect for or reads otherwise (a
# first line that is a continuation, a "From " line below the first, a line with
# no field name, a block that does not end at a blank line). Both give the same
# tokens on every message of the shipped and evaluation corpora and the fuzz
# corpus (tools/benchmarks/token_hashes.py). Parsing the shipped corpus: 0.94-1.01 ->
# 0.56-0.61 CPU s (best of 5, three alternations; docs/tokenizer-speed.md).
_SIMPLE_HEAD = re.compile(
    rb"(From [^\r\n]*)?+(?:\r\n|\r|\n)?+"  # the mbox envelope line (only as the first line)
    rb"((?:[!-9;-~]++:[^\r\n]*+(?:\r\n|\r|\n)(?:[ \t][^\r\n]*+(?:\r\n|\r|\n))*+)++)"  # fields
    rb"(?:\r\n|\r|\n)")  # the blank line that ends the block
_FIELD = re.compile(r"([!-9;-~]+):[ \t]*([^\r\n]*(?:(?:\r\n|\r|\n)[ \t][^\r\n]*)*)")
# A Content-Type the stdlib parser reads into parts (multipart, message/*) or whose
# type it may read otherwise than the fast path (not ASCII: an email.header.Header):
# such a message goes to _parse_multipart, which decides with the stdlib's own methods.
_COMPOUND = re.compile(r"multipart|message|[^\x00-\x7f]", re.I).search


def _parse_simple(raw):
    """The ``Message`` of a single-part message with a clean header block, as the
    stdlib parser builds it (or of a multipart: :func:`_parse_multipart`),
    or None for any other message (see above)."""
    m = _SIMPLE_HEAD.match(raw)
    if m is None or (m.group(1) is None) != (m.start(2) == 0):
        return None  # no blank line after the fields, or an envelope line without its line end
    head = m.group(2).decode("ascii", "surrogateescape")
    headers = [(name, value.rstrip("\r\n")) for name, value in _FIELD.findall(head)]
    msg = email.message.Message()
    msg._headers = headers
    if m.group(1) is not None:
        msg._unixfrom = m.group(1).decode("ascii", "surrogateescape")
    body = raw[m.end():].decode("ascii", "surrogateescape")
    for name, value in headers:
        if len(name) == 12 and name.lower() == "content-type" and _COMPOUND(value):
            try:
                return _parse_multipart(msg, body)
            except Exception:  # noqa: BLE001 - e.g. the stdlib's RFC 2231 decoding of a hostile
                return None  # boundary* (TypeError): the guarded stdlib path below decides
    msg._payload = body
    return msg


# -- the fast path for multiparts ------------------------------------------------------
#
# The next shape: a multipart of text parts and attachments, 424 of the 496
# messages of the shipped corpus that are not single-part (alternative 214,
# signed 97, mixed 59, related 13; 41 with a multipart inside, mixed or related
# around alternative); 1,286 of modern-spam-dev's 1,375. The parse does not
# depend on the subtype (only multipart/digest gives its parts another default
# type, and goes to the stdlib), so every multipart takes it. Parsing the shipped
# corpus, mime.parse on every message, best of 5, five alternations with the
# single-part path alone: 0.59-0.74 -> 0.38-0.50 CPU s, a median paired ratio of
# 0.67 (docs/tokenizer-speed.md).
#
# What the feed parser does with one (email.feedparser, _parsegen), rebuilt:
# the body is cut at the delimiter lines, "--" + boundary then optional "--",
# blanks and a line end (or the end of input) at the start of a line (after CR,
# LF or CRLF); the first delimiter ends the preamble (None when it is the first
# line; else the text before it less its last line end), the close delimiter
# ends the parts and all after its line is the epilogue. Each part is a header
# block (possibly empty) and a blank line, then the payload, less the line end
# that belongs to the next delimiter. Anything that would make the parser take
# another branch or record a defect hands the whole message over to it: no
# boundary, a Content-Transfer-Encoding other than 7bit/8bit/binary on a
# multipart, no first or no close delimiter, two delimiters in a row (the parser
# skips the second), a part whose header block is not clean (as for
# _parse_simple, with no envelope line), a message/* part. The decisions on
# types are the stdlib's own methods (get_content_maintype, get_boundary) on the
# same headers, so they agree with the parser's by construction. Checked as for
# _parse_simple: the same Message, attribute by attribute, on every message of
# the shipped and evaluation corpora and the golden and fuzz messages
# (tests/test_mime.py), and the same tokens (tools/benchmarks/token_hashes.py).
_PART_HEAD = re.compile(
    r"(?:[!-9;-~]++:[^\r\n]*+(?:\r\n|\r|\n)(?:[ \t][^\r\n]*+(?:\r\n|\r|\n))*+)*+"  # fields
    r"(?:\r\n|\r|\n)")  # the blank line that ends the block
# What follows "--boundary" on a delimiter line (the parser's boundaryre, anchored at the line end).
_DELIMITER_END = re.compile(r"(--)?[ \t]*+(?:\r\n|\r|\n|\Z)")


def _chop_line_end(text):
    """``text`` less one line end at its end (the parser's NLCRE_eol)."""
    if text.endswith("\r\n"):
        return text[:-2]
    if text.endswith(("\r", "\n")):
        return text[:-1]
    return text


def _delimiters(body, boundary):
    """``[(start, end), ...]`` of the delimiter lines up to the close one (whose
    start is negated), or None when there is no first or no close delimiter."""
    sep = "--" + boundary
    found, pos = [], body.find(sep)
    while pos >= 0:
        if pos == 0 or body[pos - 1] in "\r\n":
            m = _DELIMITER_END.match(body, pos + len(sep))
            if m is not None:
                if m.group(1):
                    if not found:
                        return None  # a close delimiter first: no start boundary
                    found.append((-pos, m.end()))
                    return found
                found.append((pos, m.end()))
        pos = body.find(sep, pos + 1)
    return None


# Multiparts inside multiparts the fast path takes: the shipped corpus has one
# inside another at most (41 messages); each level holds a copy of the rest of the
# body, so deeper nesting (a sender's choice, up to MAX_OPEN_MULTIPARTS) goes to
# the stdlib, which peaks at 40 MB where 39 levels here took 160 MB for a 3.8 MB
# message.
FAST_NESTING = 2


def _parse_multipart(msg, body, depth=0):
    """``msg`` (its headers set) with its multipart ``body`` parsed as the
    stdlib parser would, or None when it is not a shape taken here (see above)."""
    if depth > FAST_NESTING:
        return None
    if msg.get_content_maintype() != "multipart" or msg.get_content_type() == "multipart/digest":
        return None
    if str(msg.get("content-transfer-encoding", "8bit")).lower() not in ("7bit", "8bit", "binary"):
        return None
    boundary = msg.get_boundary()
    if boundary is None:
        return None
    delims = _delimiters(body, boundary)
    if delims is None:
        return None
    parts = []
    for (_, start), (end, _) in zip(delims, delims[1:]):
        end = abs(end)
        m = _PART_HEAD.match(body, start, end)
        if start == end or m is None:
            return None  # two delimiters in a row, or not a clean header block
        part = email.message.Message()
        part._headers = [(name, value.rstrip("\r\n")) for name, value in _FIELD.findall(body, start, m.end())]
        maintype = part.get_content_maintype()
        if maintype == "message":
            return None
        if maintype == "multipart":
            # A multipart inside (mixed around alternative, related around
            # alternative): its body ends at this multipart's next delimiter, as
            # the parser's stack of boundaries ends it, and its epilogue loses
            # the line end that belongs to that delimiter ("" becomes None).
            if _parse_multipart(part, body[m.end():end], depth + 1) is None:
                return None
            part.epilogue = None if part.epilogue == "" else _chop_line_end(part.epilogue)
        else:
            part._payload = _chop_line_end(body[m.end():end])
        parts.append(part)
    first = delims[0][0]
    if first:
        msg.preamble = _chop_line_end(body[:first])
    msg.epilogue = body[delims[-1][1]:]
    msg._payload = parts
    return msg


# Anything the stdlib parser takes for a line end (it splits on \r, \n and \r\n).
_EOL = re.compile(rb"\r\n?|\n")


def _parse_limit(raw):
    """How many bytes of ``raw`` the parser reads: at most ``MAX_PARSE_BYTES``
    and ``MAX_PARSE_LINES`` lines, cut after a line end when there is one."""
    cut = min(len(raw), MAX_PARSE_BYTES)
    if raw.count(b"\n", 0, cut) + raw.count(b"\r", 0, cut) > MAX_PARSE_LINES:
        # Bounded: stops at the MAX_PARSE_LINES-th line end.
        for m in itertools.islice(_EOL.finditer(raw, 0, cut), MAX_PARSE_LINES - 1, MAX_PARSE_LINES):
            cut = m.end()
    elif cut < len(raw):
        nl = raw.rfind(b"\n", 0, cut)
        if nl > 0:
            cut = nl + 1
    return cut


# A boundary declaration (anywhere: over-counting only errs on the safe side),
# or a close delimiter line "--BOUNDARY--".
_BOUNDARY_EVENT = re.compile(
    rb'boundary[ \t]*=[ \t]*(?:"([^"\r\n]{1,200})"|([^\s;"]{1,200}))'
    rb'|^--([^\r\n]{1,200}?)--[ \t]*\r?$', re.I | re.M)


def _too_deep(raw, cap=MAX_OPEN_MULTIPARTS):
    """Whether more than ``cap`` multiparts would be open at once (linear scan).

    A multipart opens at its boundary declaration and closes at its close
    delimiter; a missing close delimiter keeps it open, so the count is an
    upper bound of the parser's nesting.
    """
    if raw.lower().count(b"boundary") <= cap:  # fast exit: not even cap declarations
        return False
    open_ = {}
    total = 0
    for m in _BOUNDARY_EVENT.finditer(raw):
        declared = m.group(1) or m.group(2)
        if declared is not None:
            open_[declared] = open_.get(declared, 0) + 1
            total += 1
            if total > cap:
                return True
        elif open_.get(m.group(3)):
            open_[m.group(3)] -= 1
            total -= 1
    return False


def walk(msg, max_depth=MAX_DEPTH, max_parts=MAX_PARTS):
    """Yield ``(part, depth)`` depth-first, iteratively, within the caps.

    Yields the string ``"mime:too-deep"`` / ``"mime:too-many-parts"`` (instead
    of a pair) once when a cap stops the walk.  ``Message.walk`` is not used:
    it recurses.
    """
    stack = [(msg, 0)]
    seen = 0
    too_deep = False
    while stack:
        part, depth = stack.pop()
        seen += 1
        if seen > max_parts:
            yield "mime:too-many-parts"
            return
        yield part, depth
        if part.is_multipart():
            children = part.get_payload()
            if not isinstance(children, list):
                continue
            if depth >= max_depth:
                if not too_deep:
                    too_deep = True
                    yield "mime:too-deep"
                continue
            stack.extend((c, depth + 1) for c in reversed(children)
                         if isinstance(c, email.message.Message))


def _lf(text: str, n: int) -> str:
    """The first ``n`` characters of ``text`` with CRLF read as LF."""
    head = text[: 2 * n]
    return (head.replace("\r\n", "\n") if "\r\n" in head else head)[:n]


def payload_bytes(part, max_bytes, cte=None):
    """The part's body with its Content-Transfer-Encoding undone, at most ``max_bytes``.

    Lenient: base64 with junk, missing padding or a truncated tail decodes
    what it can; quoted-printable never fails; unknown encodings are read raw.
    Only a prefix of the encoded text is decoded, so a huge part costs no
    more than ``max_bytes`` of work.
    """
    # The raw payload: a str holding the original bytes (the bytes parser maps
    # each non-ASCII byte to a lone surrogate).  Message.get_payload() would
    # instead decode 8-bit text with the declared charset's strict codec and
    # errors="replace" (GBK text labelled gb2312 loses characters), so the
    # attribute is read directly; compat32 has kept it for two decades.
    body = getattr(part, "_payload", None)
    if body is None:
        body = part.get_payload()
    if isinstance(body, list):
        return b""
    if not isinstance(body, str):
        body = str(body)
    if cte is None:
        cte = part.get("content-transfer-encoding")
    cte = str(cte or "").strip().lower()
    try:
        if cte == "base64":
            enc = body[: max_bytes * 4 // 3 + max_bytes // 32 + 8].encode("utf-8", "surrogateescape")
            data = enc.translate(None, _B64_JUNK)
            spaces = len(enc) - len(enc.translate(None, b" \t\r\n="))
            if (len(enc) - len(data) - spaces) * 20 > len(enc):
                # More than 5% of the characters cannot be base64: the body
                # was decoded on the way and the header lies (seen in trec06c).
                return body[:max_bytes].encode("utf-8", "surrogateescape")
            # Padding was deleted with the junk; restore it for the tail group
            # (one leftover character carries no whole byte: drop it).
            rem = len(data) % 4
            data = data[:-1] if rem == 1 else data + b"=" * ((4 - rem) % 4)
            return binascii.a2b_base64(data)[:max_bytes]
        # Line ends do not count towards the limit: the same message read from a
        # maildir (LF) and over IMAP (CRLF) must be cut at the same text.
        if cte == "quoted-printable":
            enc = _lf(body, max_bytes * 3)
            return binascii.a2b_qp(enc.encode("utf-8", "surrogateescape"))[:max_bytes]
        return _lf(body, max_bytes).encode("utf-8", "surrogateescape")
    except (binascii.Error, ValueError, UnicodeError):
        return body[:max_bytes].encode("utf-8", "replace")


def normalize_charset(name):
    """Map a declared charset label to a Python codec name, or ``None``.

    Aliases (gb2312 -> gb18030, big5 -> big5hkscs, ks_c_5601 -> cp949,
    iso-8859-1 -> cp1252, ...) widen narrow labels; unknown labels give None.
    """
    if not name:
        return None
    name = name.strip().strip("\"'").lower()
    if name.startswith("3d"):  # "charset=3Diso-8859-1": QP-mangled header
        name = name[2:]
    name = _ALIASES.get(name, name)
    try:
        codec = codecs.lookup(name).name
    except (LookupError, ValueError):
        return None
    return "cp1252" if codec in ("iso8859-1", "ascii") else codec


def _strict(data, codec):
    """Strict decode, forgiving only a multibyte character cut at the very end
    (parts are truncated to ``max_part_bytes``).  None on failure."""
    try:
        return data.decode(codec)
    except UnicodeDecodeError as e:
        if e.start >= len(data) - 3 and e.end >= len(data):
            try:
                return data[:e.start].decode(codec)
            except UnicodeDecodeError:
                return None
        return None
    except LookupError:
        return None


def decode_bytes(data, declared=None):
    """Decode body or header bytes to ``str``; never raises.

    Returns ``(text, how)``; ``how`` is ``""`` when the declared charset (or
    ASCII) worked, else the name of the codec that did (a token-worthy fact).
    Order: declared (aliased), UTF-8, a CJK guess when the bytes look
    multibyte, then the declared charset or cp1252 with replacement characters.
    """
    if data.isascii():
        return data.decode("ascii"), ""
    codec = normalize_charset(declared)
    high = len(data) - len(data.translate(None, _HIGH))
    # A single-byte label on text that is mostly high bytes is a lie
    # (GB2312 mail labelled iso-8859-1): skip straight to the guesses.
    lying = codec in _SINGLE_BYTE and high * 4 > len(data)
    if codec and not lying:
        text = _strict(data, codec)
        if text is not None:
            return text, ""
    if codec != "utf-8":
        text = _strict(data, "utf-8")
        if text is not None:
            return text, "utf-8"
    if high * 8 > len(data):
        for guess in _CJK_GUESSES:
            text = _strict(data, guess)
            if text is not None:
                return text, guess
    try:
        return data.decode(codec or "cp1252", "replace"), "replace"
    except LookupError:
        return data.decode("cp1252", "replace"), "replace"


def split_params(value):
    """``'text/plain; charset="x"; name=a'`` -> (``'text/plain'``, {param: value}).

    A small, linear parser for the common case; RFC 2231 continuations
    (``name*0*=``) are left to the stdlib.
    """
    head, _, rest = value.partition(";")
    params = {}
    if rest:
        for item in rest.split(";"):
            k, eq, v = item.partition("=")
            if eq:
                params.setdefault(k.strip().lower(), v.strip().strip("\"'").strip())
    return head.strip().lower(), params


def header_charset(msg):
    """The charset to assume for raw 8-bit header bytes: the message's own.

    The stdlib's ``get_param`` only where RFC 2231 syntax (``charset*=``)
    needs it: it decodes every parameter of the header, and costs several
    times :func:`split_params`, which finds the same charsets otherwise.
    """
    raw = msg.get("content-type")
    if isinstance(raw, str) and "*" not in raw:
        return split_params(" ".join(raw.split()))[1].get("charset")
    try:
        cs = msg.get_param("charset")
    except Exception:
        return None
    if isinstance(cs, tuple):  # RFC 2231 value
        cs = cs[2]
    return cs if isinstance(cs, str) else None


def _encoded_words(value):
    """:func:`spamnb.mail.rfc2047.encoded_words`, imported on first use (most headers
    hold no encoded word, and most messages none); replaces itself."""
    global _encoded_words
    from spamnb.mail.rfc2047 import encoded_words as _encoded_words
    return _encoded_words(value)


def _word_chunks(value):
    """The ``(bytes or str, charset or None)`` chunks of a value holding ``=?``: its RFC 2047
    encoded words decoded to their bytes, as ``email.header.decode_header`` gives them.
    The common shapes are read by rfc2047, which gives the standard library's chunks
    (tests/test_rfc2047.py); the rest by the stdlib. Over modern-spam-dev's 4,495 values
    with an encoded word :func:`decode_header` takes 0.23 CPU s instead of 0.61
    (docs/tokenizer-speed.md)."""
    parts = _encoded_words(value)
    if parts is None:
        import email.header
        try:
            parts = email.header.decode_header(value)
        except Exception:
            parts = [(value, None)]
    return parts


def decode_header(value, fallback=None):
    """Decode a header value for the tokenizer: RFC 2047 encoded words and raw 8-bit
    bytes (:func:`decode_bytes`: guessed as a CJK charset when they look like one, a
    guess a token can afford; what a person reads is :func:`header_text`'s).

    Folding whitespace is unfolded.  Never raises: a broken encoded word is
    left as it is.
    """
    if not isinstance(value, str):
        try:
            value = str(value)
        except Exception:
            return ""
    if "=?" in value:
        out = []
        for chunk, cs in _word_chunks(value):
            if isinstance(chunk, str):
                chunk = chunk.encode("utf-8", "surrogateescape")
            out.append(decode_bytes(chunk, cs or fallback)[0])
        value = "".join(out)  # unencoded chunks keep their own spaces
    elif not value.isascii():
        value = decode_bytes(value.encode("utf-8", "surrogateescape"), fallback)[0]
    if "\n" in value or "\r" in value:
        value = " ".join(value.split())
    return value


# -- a header as a person reads it ------------------------------------------------------

# Characters a header shown to a person must not carry: they would reorder the text
# around them (bidirectional overrides and isolates, a "Subject" that reads backwards).
_BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
# A value cut in segments: ASCII runs, where encoded words may stand, and the words holding
# other characters (RFC 2047 puts an encoded word between blanks, never inside such a word).
_NOT_ASCII_WORD = re.compile(r"(\S*[^\x00-\x7f]\S*)")


def _as_cp1252(exc):
    """The ``spamnb.cp1252`` error handler: bytes that are not UTF-8 read as cp1252."""
    return exc.object[exc.start:exc.end].decode("cp1252", "replace"), exc.end


codecs.register_error("spamnb.cp1252", _as_cp1252)


def readable(data: bytes, *charsets) -> str:
    """``data`` as text a person can read: decoded by the first of ``charsets`` (labels, as
    :func:`normalize_charset` reads them; None skipped) that decodes it whole, else as UTF-8
    where it is and cp1252 (Latin-1 with Windows' characters in 0x80-0x9f) for the bytes
    that are not (a UTF-8 subject with one stray byte, or Latin-1 text). Never raises. No
    guess beyond these: a guessed CJK charset turns "Köln" in Latin-1 into Chinese."""
    if data.isascii():
        return data.decode("ascii")
    for label in charsets:
        codec = normalize_charset(label)
        text = _strict(data, codec) if codec else None
        if text is not None:
            return text
    return data.decode("utf-8", "spamnb.cp1252")


def header_text(value, declared=None) -> str:
    """A header value as a person reads it: on the page, in a report line, in the history,
    in a log line (which escapes it again for grep). One line; never raises.

    ``value``: the value's bytes as the message holds them (folded or not), or a str read
    from them with surrogateescape. Raw 8-bit bytes are read as UTF-8 when they are, else in
    the message's ``declared`` charset (its Content-Type's) when that decodes them, else as
    UTF-8 and cp1252 for the bytes that are not UTF-8 (:func:`readable`): a raw UTF-8
    "für" is "für", never "fÃ¼r". RFC 2047 encoded words are decoded (the tokenizer's
    reading of them, :func:`_word_chunks`), each by its own charset, else the same way. Control characters and the
    bidirectional ones are shown as U+FFFD: a Subject cannot move a terminal's cursor."""
    if not isinstance(value, bytes):
        value = str(value).encode("utf-8", "surrogateescape")
    text = " ".join(readable(value, "utf-8", declared).split())
    if "=?" in text:
        text = "".join(_words_read(seg) if seg.isascii() else seg for seg in _NOT_ASCII_WORD.split(text))
    return _shown(text)


def one_line(text: str) -> str:
    """A value that is text already (an SMTP envelope's address, a HELO name) as
    :func:`header_text` shows a header's: blanks of any kind as one space, control and
    bidirectional characters (and lone surrogates, which no file or database can hold) as
    U+FFFD. Never raises."""
    return _shown(" ".join(text.split()))


def _shown(text: str) -> str:
    if text.isprintable():
        return text
    import unicodedata

    return "".join("\ufffd" if c in _BIDI_CONTROLS or unicodedata.category(c) in ("Cc", "Cs") else c for c in text)


def _words_read(segment: str) -> str:
    """An ASCII segment of a value with its encoded words decoded, its blanks at either end
    kept (the segment stands between words that are not ASCII)."""
    core = segment.strip()
    if "=?" not in core:
        return segment
    lead, trail = segment[:len(segment) - len(segment.lstrip())], segment[len(segment.rstrip()):]
    out = []
    for chunk, cs in _word_chunks(core):
        if isinstance(chunk, str):  # no encoded word found: the text as it was
            chunk = chunk.encode("utf-8", "surrogateescape")
        out.append(readable(chunk, cs, "utf-8"))
    return lead + "".join(out) + trail


def clipped(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters: cut with "…" when longer."""
    return text if len(text) <= width else text[:max(width - 1, 0)] + "…"
