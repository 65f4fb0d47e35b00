"""The delivery hook's message surgery: add the verdict's headers, never lose a byte.

``spamnb filter`` reads one message and writes it back with the header lines
of :func:`spamnb.verdict.header_lines` added at the end of its header block.
This module is the message surgery and the decision of the one pipeline
(:mod:`spamnb.delivery.pipeline`), which every door filters through: :func:`decide`
gives the verdict, :func:`verdict_block` the bytes that carry it, so every way of
answering decides alike and writes the same bytes for the same model.

Verdict fields already in the header block (a sender's forged ``X-Spam-Flag:
YES`` or ``X-Spam-Status: No``, an earlier filter's: :data:`spamnb.verdict.VERDICT_FIELDS`)
are removed first (:func:`spamnb.mail.mime.strip_verdicts`), so the only verdict
the next program reads is spamnb's; the tokenizer never reads those fields, so
the message scores as it came. Everything else is copied byte for byte:
:func:`verdict_block` only *inserts* lines, at the end of the header block.
This module imports nothing heavy (no numpy): it is on the per-message path.
"""

from __future__ import annotations

from spamnb import verdict
from spamnb.mail.mime import header_block_end, looks_like_mail, strip_verdicts
from spamnb.mail.tokenizer import tokenize
from spamnb.storage.scorer import Scorer

def header_end(raw: bytes) -> tuple[int, bytes]:
    """Where new header lines go, and the line ending to write them with.

    The insertion point is where the email package's parser -- the tokenizer's
    -- ends the header block (:func:`spamnb.mail.mime.header_block_end`): the
    blank line after the headers, or the first line it takes for body when a
    header block is broken (a line without a colon, a NUL or 8-bit field name,
    bare CRs). So the verdict is always a header to the parser, never body text
    the tokenizer would read. For a message with no body, the end of the input
    (a missing final newline is then supplied by the inserted text itself).
    Input that is not mail (no header field at the top) gets the headers at the top.
    """
    eol = b"\r\n" if raw.find(b"\r\n") != -1 and raw.find(b"\r\n") <= raw.find(b"\n") else b"\n"
    if not looks_like_mail(raw):
        return 0, eol
    return header_block_end(raw), eol


def verdict_place(raw: bytes) -> tuple[bytes, int, bytes]:
    """``(kept, pos, eol)``: ``raw`` without its incoming verdict fields
    (:func:`spamnb.mail.mime.strip_verdicts`), where spamnb's go in it, and their
    line ending.

    ``pos`` is :func:`header_end` of ``raw`` carried into ``kept``: every removed
    byte lies before it, so it keeps its distance to the end. Not ``header_end(kept)``:
    where a removed field followed a misplaced ``From `` line, that line would
    end ``kept``'s header block and go back to the body, and the message would parse
    (and tokenize) otherwise; spamnb's fields, written where the removed ones
    ended, keep it a header line as it was.
    """
    pos, eol = header_end(raw)
    kept = strip_verdicts(raw)
    if pos:  # mail (not mail: at the top, of kept as of raw)
        pos -= len(raw) - len(kept)
    return kept, pos, eol


def verdict_block(raw: bytes, lines: list[bytes]) -> tuple[bytes, int, bytes]:
    """``(kept, pos, block)``: :func:`verdict_place` of ``raw`` and the bytes
    inserted at ``pos`` in ``kept``, each of ``lines`` ended as the message ends its lines."""
    kept, pos, eol = verdict_place(raw)
    return kept, pos, _block(kept, pos, eol, lines)


def _block(raw, pos, eol, lines):
    block = b"".join(line + eol for line in lines)
    if pos == len(raw) and raw and not raw.endswith(b"\n"):
        block = eol + block  # close the unterminated last header line first
    return block


def add_headers(raw: bytes, lines: list[bytes]) -> bytes:
    """``raw`` with ``lines`` inserted at the end of its header block."""
    pos, eol = header_end(raw)
    return raw[:pos] + _block(raw, pos, eol, lines) + raw[pos:]


def replace_verdicts(raw: bytes, lines: list[bytes]) -> bytes:
    """``raw`` with its incoming verdict fields removed and ``lines`` added
    (:func:`verdict_block`): what every way of answering writes."""
    kept, pos, block = verdict_block(raw, lines)
    return kept[:pos] + block + kept[pos:]


def message_tokens(model, raw):
    """The tokens of ``raw`` under the tokenizer settings of ``model`` (a scorer or a model)."""
    if isinstance(model, Scorer):
        return tokenize(raw, model.tokenizer_config)
    return model.tokens(raw)


def scored(model, raw, n_evidence=0, toks=None):
    """``(score, P(spam|x), evidence, known)`` of ``raw`` under ``model``; ``known``
    counts the message's tokens the model knows (0: no evidence at all).

    ``model`` is a compiled :class:`spamnb.storage.scorer.Scorer` (standard
    library only: the cold path and the server's fast case) or a
    :class:`spamnb.model.SpamModel`; both give the evidence (the
    ``n_evidence`` strongest ``(token, log-odds contribution)`` pairs) when asked.
    ``toks``: the message's :func:`message_tokens`, when the caller has them.
    """
    toks = message_tokens(model, raw) if toks is None else toks  # once, for the score and the evidence
    if isinstance(model, Scorer):
        if n_evidence:
            score, p, known, evidence = model.explain(toks, n_evidence)
            return score, p, evidence, known
        score, p, known = model.score(toks)
        return score, p, None, known
    result = model.classify_tokens(toks)
    evidence = None
    if n_evidence:
        evidence = [(tok, c) for tok, _, c in model.explain(raw, n_evidence, toks=toks).tokens]
    return result.score, result.spam_probability, evidence, result.n_tokens - result.n_unknown


def decide(model, raw, decision=verdict.MODELS_OWN, n_evidence=0, toks=None, name=None) -> verdict.Decided:
    """The verdict of ``raw`` under ``model`` and ``decision`` (a
    :class:`spamnb.verdict.Decision`), with its header lines when the model's ``name``
    is given (:func:`spamnb.verdict.judge`)."""
    score, p, evidence, known = scored(model, raw, n_evidence, toks)
    # after scoring: a store's model reads its settings with the counts, cut-offs included
    return verdict.judge(p, score, known, model.cutoffs, decision, evidence, name)
