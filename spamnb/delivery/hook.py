"""The delivery hook's message surgery: add spam headers, never lose a byte.

``spamnb filter`` reads one message and writes it back with two (or three)
header fields added at the end of its header block, in the style of
SpamAssassin, so rules written for SpamAssassin's headers keep working::

    X-Spam-Flag: YES
    X-Spam-Status: Yes, probability=0.999874, score=9.0, model=model.joblib, version=0.1.0
    X-Spam-Evidence: url:example.biz:+2.31, subject:free:+1.87, ...   (with --evidence)

Everything else is copied byte for byte: :func:`add_headers` only *inserts*
lines, at :func:`header_end`. Header fields already in the message (a sender's
forged ``X-Spam-Flag: NO``, say) are kept as they are; ours come last in the
header block.
This module imports nothing heavy: it is on the per-message path.
"""

from __future__ import annotations

import json
import re

EXIT_SPAM, EXIT_HAM, EXIT_UNSURE, EXIT_ERROR = 0, 1, 2, 3
EXIT_CODES = {"spam": EXIT_SPAM, "ham": EXIT_HAM, "unsure": EXIT_UNSURE}
STATUS_WORD = {"spam": "Yes", "ham": "No", "unsure": "Unsure"}
# Long added fields (the evidence) are folded to lines of about this many characters.
FOLD_WIDTH = 78

# A header field line (RFC 5322 field name, then a colon) or an mbox "From " line.
_FIELD = re.compile(rb"[!-9;-~]+:|From ")


def header_end(raw: bytes) -> tuple[int, bytes]:
    """Where new header lines go, and the line ending to write them with.

    The insertion point is the start of the blank line that ends the header
    block; for a message with no body, the end of the input (a missing final
    newline is then supplied by the inserted text itself). Input that does not
    start with a header field (not mail at all) gets the headers at the top.
    """
    eol = b"\r\n" if raw.find(b"\r\n") != -1 and raw.find(b"\r\n") <= raw.find(b"\n") else b"\n"
    if not _FIELD.match(raw):
        return 0, eol
    pos = 0
    while True:
        nl = raw.find(b"\n", pos)
        if nl == -1:
            return len(raw), eol  # headers only, last line unterminated
        line = raw[pos:nl + 1]
        if line in (b"\n", b"\r\n"):
            return pos, eol
        pos = nl + 1
        if pos == len(raw):
            return pos, eol  # headers only


def header_lines(label: str, probability: float, score: float, model: str, version: str,
                 evidence=None) -> list[bytes]:
    """The added header lines (without line endings), ASCII only; a folded
    field's continuation lines are separate items starting with a tab."""
    flag = b"YES" if label == "spam" else b"NO"
    status = (f"{STATUS_WORD[label]}, probability={probability:.6f}, score={score:.2f}, "
              f"model={_ascii(model)}, version={version}")
    lines = [b"X-Spam-Flag: " + flag, b"X-Spam-Status: " + status.encode("ascii")]
    if evidence:
        items = [f"{_ascii(tok)}:{c:+.2f}" for tok, c in evidence]
        lines.extend(_folded("X-Spam-Evidence: ", items))
    return lines


def _folded(name: str, items: list[str], width: int = FOLD_WIDTH) -> list[bytes]:
    """One header field as physical lines: ``items`` joined by ", ", folded
    before an item (continuation lines start with a tab) once a line would pass
    ``width`` characters, so no line nears RFC 5322's 998-character limit."""
    out, line = [], name
    for i, item in enumerate(items):
        piece = item + ("," if i < len(items) - 1 else "")
        fresh = line in (name, "\t")  # nothing on this line yet: never fold here
        if not fresh and len(line) + 1 + len(piece) > width:
            out.append(line)
            line, fresh = "\t", True
        line += ("" if fresh else " ") + piece
    out.append(line)
    return [x.encode("ascii") for x in out]


def _ascii(text: str) -> str:
    """Header-safe text: non-ASCII and control characters as JSON escapes."""
    return json.dumps(text, ensure_ascii=True)[1:-1].replace(",", "\\u002c")


def add_headers(raw: bytes, lines: list[bytes]) -> bytes:
    """``raw`` with ``lines`` inserted at the end of its header block."""
    pos, eol = header_end(raw)
    block = b"".join(line + eol for line in lines)
    if pos == len(raw) and raw and not raw.endswith(b"\n"):
        block = eol + block  # close the unterminated last header line first
    return raw[:pos] + block + raw[pos:]
