"""A token in words: ``date:shape:a,_9_a_9_9:9:9_+9`` -> "Date header's shape a,_9_a_9_9:9:9_+9".

The tokenizer's namespaces (:mod:`spamnb.mail.tokenizer`, :mod:`spamnb.mail.signals`,
:mod:`spamnb.mail.html_text`) are short on purpose: a model holds millions of
tokens. A person reading why a message was judged spam (the page's clues,
``spamnb explain``) reads :func:`describe`'s words instead. The words never hide
the token's own text: what the token holds (a word, a host, a shape) is shown as
it is, in quotes.

:func:`lookups` goes the other way, for a word lookup: the tokens a plain word
can be in the model as (a body word, a Subject word, and so on).
"""

from __future__ import annotations

# namespaces whose value is one kind of thing, and what to call it: {q} the value quoted (text
# from the message), {v} as it is (a count, a tag, a setting's word)
PREFIXES = (
    ("url:proto:", "a link using {v}"),
    ("url:path:", "a link's path holding {q}"),
    ("url:ip:", "a link to the IP address {v}"),
    ("url:", "a link to {q}"),
    ("img:proto:", "an image by {v}"),
    ("img:", "an image from {q}"),
    ("email:local:", "an address in the text named {q}"),
    ("email:domain:", "an address in the text at {q}"),
    ("received:ip:", "Received from the IP address {v}"),
    ("received:count:", "Received headers: {v}"),
    ("received:", "Received through {q}"),
    ("html:tag:", "an HTML <{v}> tag"),
    ("html:font:", "HTML <font> tags: about {v}"),
    ("html:img:", "HTML images: about {v}"),
    ("html:", "HTML: {v}"),
    ("content-type:boundary:", "MIME boundary's shape {q}"),
    ("content-type:", "a part of type {v}"),
    ("charset:guess:", "a charset guessed: {v}"),
    ("charset:", "charset {v}"),
    ("content-transfer-encoding:", "a part encoded as {v}"),
    ("content-disposition:", "a part shown as {v}"),
    ("filename:ext:", "an attachment ending in .{v}"),
    ("filename:", "an attachment named {q}"),
    ("mime:", "MIME structure: {v}"),
    ("layout:text-share:", "visible text per 100 characters of HTML: about {v}"),
    ("layout:text:", "visible text of the HTML: about {v} thousand characters"),
    ("layout:", "layout: {v}"),
    ("punct:excl:", "exclamation marks in the text: {v}"),
    ("link:", "links: {v}"),
    ("sender:", "the sender: {v}"),
    ("style:", "style: {v}"),
    ("bi:", "the words {q} together"),
    ("header:", "a header {v}"),
)


def header_title(name: str) -> str:
    """``message-id`` -> ``Message-ID``, ``x-mailer`` -> ``X-Mailer``."""
    return "-".join("ID" if part == "id" else part[:1].upper() + part[1:] for part in name.split("-"))


def quoted(text: str) -> str:
    return f"“{text}”"


def describe(token: str) -> str:
    """``token`` in words, its own text quoted; never raises."""
    if token.startswith("skip:") and " " in token:  # skip:c N, a long word
        first, _, size = token[5:].partition(" ")
        return f"a long word ({size} or more characters) starting {quoted(first)}"
    for prefix, words in PREFIXES:
        if token.startswith(prefix) and len(token) > len(prefix):
            rest = token[len(prefix):]
            return words.format(q=quoted(rest), v=rest)
    name, colon, rest = token.partition(":")
    if not colon or not name or not rest or not name.replace("-", "").isalnum() or name.isdigit():
        return f"the word {quoted(token)}"  # a body word (a time such as 10:30 included)
    field = header_title(name)
    kind, colon, value = rest.partition(":")
    if colon and value:
        if kind in ("addr", "domain"):
            return f"{field} {'address' if kind == 'addr' else 'domain'} {quoted(value)}"
        if kind == "name":
            return f"{field} without a display name" if value == "none" else \
                f"{field}'s display name holding {quoted(value)}"
        if kind == "count":
            return f"addresses in {field}: {value}"
        if kind == "shape":
            return f"{field} header's shape {quoted(value)}"
        if kind == "punct":
            return f"{field} punctuation {quoted(value)}"
        if kind == "skip":
            first, _, size = value.partition(" ")
            return f"a long word in {field} ({size} or more characters) starting {quoted(first)}"
    if name == "message-id" and rest.startswith("@"):
        return f"Message-ID at {quoted(rest[1:])}"
    return f"{quoted(rest)} in the {field} header"


def fold(word: str) -> str:
    """A word as the tokenizer keeps a body word: NFKC, case-folded."""
    import unicodedata

    return unicodedata.normalize("NFKC", word).casefold()


def lookups(word: str, known=None) -> list[str]:
    """The tokens ``word`` is known as. A token with a namespace (``subject:free``,
    ``header:X-Mailer``) is itself only. A plain word is folded as the tokenizer folds body
    words, and is that body word and the same word in every namespace: each token of
    ``known`` (the model's tokens) that ends in ``:word``; without ``known``, the body word
    and the Subject word."""
    if ":" in word:
        return [word]
    low = fold(word)
    if known is None:
        return [low, f"subject:{low}"]
    tail = ":" + low
    return [low] + sorted(tok for tok in known if tok.endswith(tail))
