"""Evidence that outlives a spam campaign: how a message is addressed and linked.

One concern: small generators of namespaced tokens about relations inside a
message (the sender's domains against each other, link text against link
target, the shape of the links and of the HTML), the kind of evidence the
shipped 2002-2005 corpus and today's spam share although their words do not.
Each group is behind a :class:`spamnb.mail.tokenizer.TokenizerConfig` field
(``sender_signals``, ``link_signals``, ``layout_signals``) so that it can be
measured on and off (``tools/studies/protocols.py``; figures in
docs/accuracy.md and at the fields' defaults).

Tokens
    ``sender:reply-to:same-domain`` / ``sender:reply-to:other-domain``
                            Reply-To's registered domain against From's
    ``sender:return-path:same-domain`` / ``...:other-domain`` / ``...:empty``
                            the envelope sender (Return-Path) against From
    ``sender:name:address`` / ``sender:name:other-domain``
                            From's display name holds an address or a domain
                            (another one than the address's: "PayPal
                            service@paypal.com" <x@evil.example>)
    ``sender:encoded:subject:b``, ``sender:encoded:from:q``
                            RFC 2047 encoded words (B or Q) in Subject / From
    ``link:count:N``        links (href targets and URLs in text), power-of-two bucket
    ``link:domains:N``      distinct registered domains linked, bucketed
    ``link:tld:xyz``        each linked registered domain's top-level domain
    ``link:shortener``      a link through a URL shortener
    ``link:host-digits``    a linked host name with a digit run in a label
    ``link:text-other-domain``  a link whose visible text names another domain
                            than its target (the phishing classic)
    ``link:sender-domain`` / ``link:no-sender-domain``
                            whether any link goes to the From domain
    ``layout:html-only``    HTML with no plain-text part; ``layout:plain-only``
    ``layout:text:N``       visible text characters of the HTML, bucketed (x1000)
    ``layout:text-share:N`` visible text per 100 characters of HTML source, in tens
    ``punct:excl:N``        exclamation marks in the visible text: 0, 1, 2, 4, 8 (8 or more)
    ``style:accents:N``     accented Latin letters per 100 letters of the visible text,
                            bucketed; ``style:subject:accents:N`` of the Subject
    ``style:subject:money:N``  currency signs in the Subject: 1, 2, 4, 8 (8 or more)

Filters rather than generators: ``url_path_words`` (:func:`path_words` keeps
only the ``url:path:`` tokens whose piece is a word) and ``fold_web_schemes``
(:func:`fold_web_schemes`: one ``url:proto:web`` for http and https links).
"""

import re

from spamnb.mail import mime
from spamnb.mail.lexer import bucket

__all__ = ["registered_domain", "from_domain", "sender_tokens", "link_tokens", "layout_tokens",
           "path_words", "fold_web_schemes", "exclaim_token", "style_tokens"]


class _Lazy:
    """A pattern compiled on its first use. The patterns below serve only the settings
    that are off by default (sender, link), and compiling them at import took 2.3 ms
    of every cold ``filter``'s start (the tokenizer imports this module)."""

    def __init__(self, *args):
        self.args, self.rx = args, None

    def __getattr__(self, name):  # finditer, search, ...: only attributes an instance lacks come here
        if self.rx is None:
            self.rx = re.compile(*self.args)
        method = getattr(self.rx, name)
        setattr(self, name, method)  # the next uses find it on the instance, not through here
        return method


_ADDR = _Lazy(r"[^\s<>(),:;\"'\[\]@]{1,64}@([A-Za-z0-9\-]{1,63}(?:\.[A-Za-z0-9\-]{1,63}){0,8})")
_DOMAIN_IN_TEXT = _Lazy(r"(?<![\w.-])((?:[a-z0-9\-]{1,63}\.){1,6}[a-z]{2,24})(?![\w-])", re.I)
_ENCODED_WORD = _Lazy(r"=\?[^?\s]{1,40}\?([bBqQ])\?")
# An <a> tag and the text right after it, then its href: two patterns without
# nested repetition, so that hostile HTML costs linear time.
_A_TAG = _Lazy(r"<a\s([^<>]{0,2000})>([^<]{0,300})", re.I)
_HREF = _Lazy(r"""(?:^|\s)href\s*=\s*["']?([^"'\s>]{1,2000})""", re.I)
_HOST = _Lazy(r"(?:[a-z][a-z0-9+.\-]{0,15}:)?//(?:[^/?#@\s]*@)?([^/?#:\s]{1,253})", re.I)
_DIGIT_LABEL = _Lazy(r"[a-z\-]\d|\d[a-z\-]")
# Second-level labels under which registries sell names (example.co.uk): the
# registered domain is then three labels.  A short list, not the Public Suffix
# List (a dependency for a few hundred kB of data): it covers the forms that
# occur in the evaluation corpora's From and link domains.
_SECOND_LEVEL = frozenset("co com net org gov edu ac or ne go mil gob nic".split())
# URL shorteners: a link through one hides its target (the ones seen in
# modern-spam-dev and the best-known others).
_SHORTENERS = frozenset((
    "bit.ly", "tinyurl.com", "t.co", "goo.gl", "ow.ly", "is.gd", "buff.ly", "rb.gy",
    "cutt.ly", "shorturl.at", "tiny.cc", "rebrand.ly", "t.ly", "s.id", "bl.ink",
    "lnkd.in", "qrco.de", "v.gd", "x.co", "short.io", "tr.im", "snip.ly"))
_MAX_LINKS = 200


def registered_domain(host):
    """The domain a name was registered as: ``mail.example.co.uk`` -> ``example.co.uk``.

    An IP literal is itself; a name of one label is itself.
    """
    host = host.strip(".").lower()
    labels = host.split(".")
    if len(labels) <= 2 or labels[-1].isdigit():
        return host
    if len(labels[-1]) == 2 and labels[-2] in _SECOND_LEVEL:
        return ".".join(labels[-3:])
    return ".".join(labels[-2:])


def _last_address(value):
    """The match of a field's last address: the mailbox of ``"a@b.example" <c@d.example>``."""
    m = None
    for m in _ADDR.finditer(value):
        pass
    return m


def _address_domain(value):
    m = _last_address(value or "")
    return registered_domain(m.group(1)) if m else None


def _first(msg, name):
    for k, v in msg.raw_items():
        if k.lower() == name:
            return v if isinstance(v, str) else str(v)
    return None


def from_domain(msg, fallback=None):
    """The registered domain of the From address, or None."""
    raw = _first(msg, "from")
    return _address_domain(mime.decode_header(raw[:2000], fallback)) if raw else None


def sender_tokens(msg, fallback=None, selected=lambda name: True):
    """Tokens relating From to Reply-To, Return-Path and its own display name.

    ``selected``: a predicate on lower-case header names; a field it refuses is
    not read (the configuration's header selection holds here too).
    """
    out = []
    raw_from = _first(msg, "from") if selected("from") else None
    for name, raw in (("subject", _first(msg, "subject") if selected("subject") else None),
                      ("from", raw_from)):
        # Encoded words: in 1.1% (B) and 1.1% (Q) of the shipped corpus's spam
        # Subjects, 0.0% and 0.1% of its ham's; 12% each of today's spam.
        for kind in sorted({k.lower() for k in _ENCODED_WORD.findall((raw or "")[:2000])}):
            out.append("sender:encoded:%s:%s" % (name, kind))
    if raw_from is None:
        return out
    value = mime.decode_header(raw_from[:2000], fallback)
    m = _last_address(value)
    if not m:
        return out
    domain = registered_domain(m.group(1))
    # Not the From address's top-level domain: .com is in 67% of the shipped
    # corpus's spam From addresses and 35% of its ham's (list mail from .org),
    # but in 98% of business ham: the token would call business mail spam.
    name = (value[:m.start()] + " " + value[m.end():]).lower()
    if "@" in name:
        out.append("sender:name:address")
    for d in _DOMAIN_IN_TEXT.findall(name):
        if registered_domain(d) != domain:
            out.append("sender:name:other-domain")
            break
    for field in ("reply-to", "return-path"):
        raw = _first(msg, field) if selected(field) else None
        if raw is None:
            continue
        if field == "return-path" and raw.strip() in ("<>", ""):
            out.append("sender:return-path:empty")
            continue
        other = _address_domain(mime.decode_header(raw[:2000], fallback))
        if other:
            out.append("sender:%s:%s" % (field, "same-domain" if other == domain else "other-domain"))
    return out


def _host(url):
    m = _HOST.match(url.strip())
    if m:
        return m.group(1).lower().rstrip(".")
    if url[:4].lower() == "www.":
        return url.split("/", 1)[0].lower().rstrip(".")
    return None


def link_tokens(texts, sender_domain=None):
    """Tokens about a message's links; ``texts``: its text parts as ``(is_html, text,
    visible text, URLs)`` (:func:`spamnb.mail.tokenizer.text_tokens` makes them: a
    plain part's URLs are those its word tokens were taken from, found once)."""
    hosts = []
    mismatch = False
    for is_html, text, _, urls in texts:
        if is_html:
            for m in _A_TAG.finditer(text):
                href = _HREF.search(m.group(1))
                target = _host(href.group(1)) if href else None
                if not target:
                    continue
                hosts.append(target)
                shown = _DOMAIN_IN_TEXT.search(m.group(2))
                if shown and registered_domain(shown.group(1)) != registered_domain(target):
                    mismatch = True
                if len(hosts) >= _MAX_LINKS:
                    break
        else:
            for url in urls[:_MAX_LINKS]:
                host = _host(url)
                if host:
                    hosts.append(host)
    out = []
    if not hosts:
        return out
    out.append("link:count:%d" % bucket(len(hosts)))
    domains = {registered_domain(h) for h in hosts}
    out.append("link:domains:%d" % bucket(len(domains)))
    for d in sorted(domains):
        tld = d.rpartition(".")[2]
        if tld.isalpha():
            out.append("link:tld:" + tld[:24])
    if any(h in _SHORTENERS or registered_domain(h) in _SHORTENERS for h in hosts):
        out.append("link:shortener")
    if any(_DIGIT_LABEL.search(h.partition(".")[0] if h.count(".") > 1 else h) for h in set(hosts)
           if not h.replace(".", "").isdigit()):
        out.append("link:host-digits")
    if mismatch:
        out.append("link:text-other-domain")
    if sender_domain:
        out.append("link:sender-domain" if sender_domain in domains else "link:no-sender-domain")
    return out


def layout_tokens(texts):
    """Tokens about the layout of the text parts: ``texts`` as for :func:`link_tokens`."""
    out = []
    kinds = {is_html for is_html, _, _, _ in texts}
    if kinds == {True}:
        out.append("layout:html-only")
    elif kinds == {False}:
        out.append("layout:plain-only")
    html = [(source, visible) for is_html, source, visible, _ in texts if is_html]
    if html:
        # Visible text: what the HTML reader shows (hidden text, style and
        # script left out), spaces not counted.
        seen = sum(len("".join(visible.split())) for _, visible in html)
        total = sum(len(source) for source, _ in html)
        out.append("layout:text:%d" % bucket(seen // 1000))
        out.append("layout:text-share:%d" % (min(100, 100 * seen // max(total, 1)) // 10 * 10))
    return out


def exclaim_token(texts):
    """``punct:excl:N``: exclamation marks in the visible text of ``texts``, bucketed;
    None for a message with no text part.

    Punctuation is the same in every language and era: no "!" in 67% of the
    shipped corpus's ham, 25% of its spam, 85% of enron-ham-dev's business ham
    and 56% of today's spam; 4 or more in 4.7% / 43.4%, 4.7% and 17.3%.
    """
    if not texts:
        return None  # no text part read: nothing counted (an attachment alone)
    n = sum(visible.count("!") for _, _, visible, _ in texts)
    return "punct:excl:%d" % bucket(min(n, 8))


# Letters (any script; no digit or underscore) and currency signs (Unicode's Sc
# category: $, EUR, GBP, YEN... alike). Single-class patterns: linear time.
_LETTERS = _Lazy(r"[^\W\d_]+")
_CURRENCY = _Lazy("[$\u00a2-\u00a5\u058f\u060b\u09f2\u09f3\u0e3f\u17db\u20a0-\u20c0"
                  "\ufdfc\ufe69\uff04\uffe0\uffe1\uffe5\uffe6]")
_LATIN_MEMO = {}
_MAX_STYLE_CHARS = 100_000  # of visible text read: enough for a share, a bounded cost


def _is_latin(char):
    """A letter of the Latin script (by its Unicode name: LATIN SMALL LETTER E WITH ACUTE)."""
    latin = _LATIN_MEMO.get(char)
    if latin is None:
        import unicodedata  # only this setting needs it: imported on first use
        latin = unicodedata.name(char, "").startswith("LATIN ")
        if len(_LATIN_MEMO) < 20_000:  # distinct letters remembered: bounded against hostile mail
            _LATIN_MEMO[char] = latin
    return latin


def _accents(prefix, text, out):
    """``PREFIX:accents:N``: Latin letters outside ASCII (é, ü, ñ, ç, ß...) per 100
    letters, bucketed; none when there is none."""
    words = _LETTERS.findall(text)
    wide = sum(1 for w in words if not w.isascii() for c in w if ord(c) > 127 and _is_latin(c))
    if wide:
        out.append("%s:accents:%d" % (prefix, bucket(100 * wide // sum(map(len, words)))))


def style_tokens(texts, msg=None, fallback=None, selected=lambda name: True):
    """Tokens about how the visible text (``style:``) and the Subject (``style:subject:``)
    are written, whatever their words: accented Latin letters (:func:`_accents`), and
    currency signs in the Subject (``style:subject:money:N``, 1, 2, 4, 8 or more).

    ``texts`` as for :func:`link_tokens`; the Subject is read from ``msg`` unless
    ``selected``, as for :func:`sender_tokens`, refuses it.

    Shares of messages (the shipped corpus's ham / spam, enron-ham-dev's ham,
    today's ``pot-*`` spam): accented letters in the text 4.4 / 5.0, 0.0, 42.3%, 1% or
    more of its letters 0.4 / 2.4, 0.0, 33.1% (German, Dutch, Portuguese, French spam;
    the 2002 ham is English), in the Subject 0.0 / 0.6, 0.0, 22.9%; a currency sign in
    the Subject 0.4 / 7.1, 0.1, 12.3%.
    Measured and left out (docs/accuracy.md): words in capitals (16% or more of the
    cased words: 0.9 / 8.3, 23.4, 4.1%: business mail writes acronyms and headers in
    capitals, today's spam less), digits (16 per 100 characters: 4.6 / 1.3, 11.8,
    1.8%), word count and mean word length (6 letters: 0.8 / 3.8, 19.6, 25.1%): each
    tells 2002 from today rather than ham from spam; currency signs in the text and
    the share of all non-ASCII letters with a token per script (Han, Hangul,
    Cyrillic...): better on today's spam, worse on the online protocol, whose
    stream mixes English and Chinese mail and business ham that quotes prices.
    """
    out = []
    if texts:
        _accents("style", " ".join(visible for _, _, visible, _ in texts)[:_MAX_STYLE_CHARS], out)
    raw = _first(msg, "subject") if msg is not None and selected("subject") else None
    if raw is not None:
        subject = mime.decode_header(raw[:2000], fallback)[:1000]
        _accents("style:subject", subject, out)
        money = len(_CURRENCY.findall(subject))
        if money:
            out.append("style:subject:money:%d" % bucket(min(money, 8)))
    return out


_PATH = "url:path:"
_MIN_PATH_WORD = 3


def path_words(tokens):
    """``tokens`` without the ``url:path:`` pieces that are not words of 3+ letters.

    Today's links carry tracking identifiers (``/c/3/skip...``): cut into pieces
    they make short digit runs, hex and ``skip:`` tokens, and the shipped
    corpus's ham, whose list footers link to archives and message numbers,
    holds more of those than its spam does, so they call today's spam ham.
    """
    return [t for t in tokens
            if not t.startswith(_PATH)
            or (len(t) - len(_PATH) >= _MIN_PATH_WORD and t[len(_PATH):].isalpha())]


_WEB_SCHEMES = frozenset(("url:proto:http", "url:proto:https"))


def fold_web_schemes(tokens):
    """``tokens`` with ``url:proto:http`` and ``url:proto:https`` as ``url:proto:web``.

    https was the exception in 2002 (secure sites and archives the shipped
    corpus's ham links to) and is the rule now (today's spam links over it
    too): the 2002 model reads it as ham, an era's mark and not spam's.
    """
    return ["url:proto:web" if t in _WEB_SCHEMES else t for t in tokens]
