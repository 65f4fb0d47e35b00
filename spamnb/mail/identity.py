"""A message's identity: what learn, forget and training recognise a message by.

Standard library only: the filter's fast path (``filter -u``) and the journal's
learner (:mod:`spamnb.storage.journal`) compute it without numpy.
"""

from __future__ import annotations

import re

try:  # hashlib.blake2b itself, without hashlib's OpenSSL start (milliseconds of every cold filter process)
    from _blake2 import blake2b
except ImportError:  # an interpreter built without it
    from hashlib import blake2b

KEY_BYTES = 16  # length of a message key (a BLAKE2b digest)

#: What learning (or forgetting) did to one message given, known by its identity: every
#: backend's learn says one per message (``outcomes``, in the order given). ``already``:
#: learned as that class before; ``duplicate``: a copy of a message given earlier in the
#: same call (the first copy's outcome says what happened to it).
LEARNED, MOVED, ALREADY, DUPLICATE, FORGOTTEN = "learned", "moved", "already", "duplicate", "forgotten"
#: The outcomes that changed the model: only these are a correction to record.
CHANGED = frozenset((LEARNED, MOVED, FORGOTTEN))
#: The count each outcome adds to, in a learn's counts.
COUNTS = {LEARNED: "learned", MOVED: "moved", ALREADY: "unchanged", DUPLICATE: "duplicates", FORGOTTEN: "forgotten"}


class MovesLearned(dict):
    """The user's moves learned (``imap filter``, ``learn-moves``): counted by class
    (``spam``, ``ham``) those that changed the model, apart (``already``) those learned so
    before; :meth:`said` is the line that tells them."""

    def __init__(self):
        super().__init__(spam=0, ham=0, already=0)

    def count(self, labels, outcomes):
        """Count moves learned as ``labels``, the learn's ``outcomes`` of them in order."""
        for label, outcome in zip(labels, outcomes):
            self[label if outcome in CHANGED else ALREADY] += 1

    def said(self, where="") -> str:
        return (f"learned {self['spam']} as spam and {self['ham']} as ham from your moves{where}; "
                f"already learned: {self['already']}")


# The header fields of a message's identity: those its author's mail program
# writes, which nothing on the way changes. Delivery agents add trace fields
# (Received, Return-Path, Delivered-To) above them, filters (spamnb's own
# X-Spam-*) and mail clients (Status, X-Status, X-Keywords, Content-Length)
# add theirs below: none of those is part of the identity.
IDENTITY_FIELDS = frozenset({b"message-id", b"date", b"from", b"sender", b"to", b"cc", b"subject"})

_FIELD = re.compile(rb"([!-9;-~]+)[ \t]*:")  # a header field's name (RFC 5322; obsolete space before ':')
_MBOX_QUOTED = re.compile(rb"^>+(?=From )", re.M)  # ">From " / ">>From ": an mbox's quoting


def message_key(raw: bytes) -> bytes:
    """Identity of a message for learn/forget and for duplicates in training.

    A digest of the message's :data:`IDENTITY_FIELDS` (Message-ID, Date, From,
    Sender, To, Cc, Subject: unfolded, blanks collapsed, in name order) and its
    normalised body; a message with none of those fields (not mail) is known by
    its whole normalised content. What delivery agents, filters and mail
    clients change is left out:

    * an mbox ``From `` line at the top, and mbox quoting of body lines
      (``>From `` and ``>>From `` are read as ``From ``);
    * CRLF or LF line ends, blank lines and blanks at the end;
    * header fields added above or below the original ones (trace fields,
      verdicts, a client's status), and the order of the fields.

    Two different messages that share a Message-ID (spammers reuse them, and
    2633 of the 3533 ham in trec06c-dev repeat an earlier one) differ in their
    body or their other fields, so they keep different keys. The key is a
    16-byte BLAKE2b digest, so the registry stays small whatever the message.
    """
    text = raw.replace(b"\r\n", b"\n")
    if text.startswith(b"From "):  # the mbox envelope line, not the message's
        nl = text.find(b"\n")
        text = text[nl + 1:] if nl != -1 else b""
    head, body = b"", text
    if _FIELD.match(text):  # a header block, up to the first blank line
        cut = text.find(b"\n\n")
        head, body = (text, b"") if cut == -1 else (text[:cut], text[cut + 2:])
    if b">From " in body:
        body = _MBOX_QUOTED.sub(b"", body)
    body = body.rstrip(b" \t\r\n")
    fields = _identity_fields(head)
    if fields:
        ident = b"key2\0" + b"\0".join(fields) + b"\0\0" + body
    else:
        ident = b"key2-content\0" + head + b"\0\0" + body
    return blake2b(ident, digest_size=KEY_BYTES).digest()


def tally(outcomes) -> dict:
    """A learn's counts of ``outcomes`` (:data:`COUNTS`' keys, each present), with the
    outcomes themselves under ``outcomes``: what a backend's learn returns."""
    done = dict.fromkeys(COUNTS.values(), 0)
    for outcome in outcomes:
        done[COUNTS[outcome]] += 1
    done["outcomes"] = list(outcomes)
    return done


def _identity_fields(head: bytes) -> list[bytes]:
    """``name:value`` of the header block's :data:`IDENTITY_FIELDS`, unfolded and
    with blanks collapsed, sorted by name (same-named fields keep their order)."""
    fields = []
    current = None  # the value (a list of parts) of the identity field being read
    for line in head.split(b"\n"):
        if line[:1] in (b" ", b"\t"):  # a continuation line
            if current is not None:
                current.append(line)
            continue
        m = _FIELD.match(line)
        name = m.group(1).lower() if m else None
        if name in IDENTITY_FIELDS:
            current = [line[m.end():]]
            fields.append((name, current))
        else:
            current = None
    fields.sort(key=lambda f: f[0])  # stable: same-named fields stay in order
    return [name + b":" + b" ".join(b" ".join(parts).split()) for name, parts in fields]


_LEGACY_MESSAGE_ID = re.compile(rb"^message-id:[ \t]*(<[^>\r\n]{1,500}>)", re.I | re.M)


def legacy_message_key(raw: bytes) -> bytes:
    """The key models of format version 1 stored: Message-ID and the body's exact
    bytes, else the message's exact bytes (kept to find their messages again)."""
    import hashlib  # (sha256: models of that format only)

    cuts = [i for i in (raw.find(b"\n\n"), raw.find(b"\r\n\r\n")) if i != -1]
    head, body = raw, b""
    if cuts:
        i = min(cuts)
        head, body = raw[:i], raw[i + (4 if raw.startswith(b"\r\n\r\n", i) else 2):]
    m = _LEGACY_MESSAGE_ID.search(head)
    if m:
        ident = b"mid:" + m.group(1).strip() + b"\0" + hashlib.sha256(body).digest()
    else:
        ident = b"sha256:" + hashlib.sha256(raw).digest()
    return blake2b(ident, digest_size=KEY_BYTES).digest()
