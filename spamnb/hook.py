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
    """The added header fields (without line endings), ASCII only."""
    flag = b"YES" if label == "spam" else b"NO"
    status = (f"{STATUS_WORD[label]}, probability={probability:.6f}, score={score:.2f}, "
              f"model={_ascii(model)}, version={version}")
    lines = [b"X-Spam-Flag: " + flag, b"X-Spam-Status: " + status.encode("ascii")]
    if evidence:
        items = ", ".join(f"{_ascii(tok)}:{c:+.2f}" for tok, c in evidence)
        lines.append(b"X-Spam-Evidence: " + items.encode("ascii"))
    return lines


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
