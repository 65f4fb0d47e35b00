"""HTML -> visible text + tokens for what spam hides in markup.

One concern: an HTML ``str`` in, ``(visible_text, markup_tokens)`` out.  The
parser is the stdlib :class:`html.parser.HTMLParser` (a real tokenizer of
tags, attributes, comments and character references), driven by a small
element stack that tracks what a reader would actually see.

Markup tokens (all namespaced; listed in :mod:`spamnb.tokenizer` too):

- ``url:...``            link targets (``<a href>``, ``<area href>``, ``<form action>``),
  cracked by :func:`spamnb.lexer.crack_url`;
- ``img:...``            image sources (host and parent domains, scheme);
- ``html:tag:NAME``      once per message for tags rare in ham
  (form, script, iframe, object, embed, applet, base, meta refresh, map, marquee...);
- ``html:font:N``        number of ``<font>`` tags, bucketed to a power of two;
- ``html:img:N``         number of images, bucketed;
- ``html:hidden-text``   text inside display:none / visibility:hidden /
  font-size 0 or 1px / same foreground and background colour; that text
  is *not* added to the visible text (hash-buster words are hidden there);
- ``html:tiny-font``     ``<font size=0|1>`` (text kept: ham footers use it);
- ``html:comment-in-word`` / ``html:tag-in-word``  a comment or an inline tag
  splitting a word ("V<!-- -->iagra", "V<b></b>iagra"); the word is joined in
  the visible text;
- ``html:comment``       comments present; ``html:web-bug``  1x1 images;
- ``html:mailto`` / ``html:js-href``  mailto: and javascript: links;
- ``html:parse-error``   the parser gave up and tags were stripped crudely.

Inline elements (``b``, ``font``, ``span``...) do not separate words; block
elements (``p``, ``div``, ``br``, ``td``...) do.
"""

import re

from spamnb.lexer import crack_url

__all__ = ["html_to_text", "looks_like_html"]

_BLOCK = frozenset(
    "address article aside blockquote body br center dd div dl dt fieldset form "
    "h1 h2 h3 h4 h5 h6 head header footer hr html li menu ol p pre section table "
    "tbody td tfoot th thead title tr ul option select textarea caption".split()
)
_VOID = frozenset(
    "area base br col embed hr img input link meta param source track wbr basefont "
    "frame isindex keygen spacer".split()
)
_NOTABLE = frozenset(
    "form input script iframe frame frameset object embed applet base map area "
    "marquee blink textarea button select noscript layer ilayer bgsound".split()
)
# Only elements HTMLParser always closes (CDATA content): an unclosed <head>
# or <title> in sloppy HTML must not hide the whole body.
_INVISIBLE = frozenset(("script", "style"))
_SPECIAL = _NOTABLE | {"a", "img", "meta", "font"}
_TINY_CSS = re.compile(r"font-size:(?:0*\.?0+|1)(?:px|pt)?(?:;|!|$)")
_CSS_COLOR = re.compile(r"(?:^|;)color:([^;!]{1,30})")
_CSS_BG = re.compile(r"background(?:-color)?:([^;!]{1,30})")
_TAG_STRIP = re.compile(r"<[^<>]{0,2000}>")
_NAMED = {"white": "ffffff", "black": "000000", "red": "ff0000", "green": "008000",
          "blue": "0000ff", "yellow": "ffff00", "silver": "c0c0c0", "gray": "808080",
          "grey": "808080"}
_MAX_STACK = 400
_MAX_TAG = 1000
_POP_SEARCH = 40


def _color(value):
    """Normalise a colour to 6 hex digits (or a lower-case name)."""
    v = value.strip().lower().lstrip("#")
    v = _NAMED.get(v, v)
    if len(v) == 3 and all(c in "0123456789abcdef" for c in v):
        v = "".join(c + c for c in v)
    return v


def _bucket(n):
    """Power-of-two bucket of a positive count: 1, 2, 4, 8, ..."""
    return 1 << (n.bit_length() - 1)


_extractor = None


def _extractor_class():
    """The HTMLParser subclass, defined on first use: ``html.parser`` costs
    ~4 ms to import, which plain-text mail on the filter path need not pay."""
    global _extractor
    if _extractor is not None:
        return _extractor
    from html.parser import HTMLParser

    class _Extractor(HTMLParser):
        """Collects visible text and markup evidence; see the module docstring."""

        def __init__(self):
            super().__init__(convert_charrefs=True)
            self.chunks = []
            self.tokens = []
            self.notable = set()
            # Element stack entries: (tag, hidden, invisible, fg, bg), inherited.
            self.stack = [("", False, False, None, None)]
            self.fonts = 0
            self.imgs = 0
            self.hidden_chars = 0
            self.comments = 0
            self.tail_alnum = False  # visible text so far ends inside a word
            self.pending = None      # "comment"/"tag" seen right after a word

        def updatepos(self, i, j):
            # Line/column bookkeeping (counting newlines of every construct) is
            # never read here; skipping it saves ~5% of HTML time.
            return j

        # -- elements -------------------------------------------------------
        def _tag_boundary(self, tag):
            # a block element ends the word; an inline tag inside a word may split it
            if tag in _BLOCK:
                self.chunks.append("\n")
                self.tail_alnum = False
                self.pending = None
            elif self.tail_alnum:
                self.pending = "tag"

        def handle_starttag(self, tag, attrs):
            self._tag_boundary(tag)
            if tag in _SPECIAL:
                self._special(tag, attrs)
            if tag in _VOID or len(self.stack) >= _MAX_STACK:
                return
            top = self.stack[-1]
            if not attrs and tag not in _INVISIBLE:
                # Fast path (most tags): inherit the parent's state.
                self.stack.append((tag,) + top[1:])
                return
            _, hidden, invisible, fg, bg = top
            if tag in _INVISIBLE:
                invisible = True
            a = dict(attrs)
            style = a.get("style")
            if style:
                s = style.lower().replace(" ", "")
                if "display:none" in s or "visibility:hidden" in s or _TINY_CSS.search(s):
                    hidden = True
                m = _CSS_COLOR.search(s)
                if m:
                    fg = _color(m.group(1))
                m = _CSS_BG.search(s)
                if m:
                    bg = _color(m.group(1))
            if "hidden" in a:
                hidden = True
            color = a.get("color")
            if color and tag == "font":
                fg = _color(color)
            bgcolor = a.get("bgcolor")
            if bgcolor:
                bg = _color(bgcolor)
            if fg is not None and fg == bg:
                hidden = True
            self.stack.append((tag, hidden, invisible, fg, bg))

        def _special(self, tag, attrs):
            """Evidence from tags that carry links or are rare in ham."""
            a = {k: v for k, v in attrs if v is not None}
            if tag in _NOTABLE:
                self.notable.add(tag)
            if tag == "a" or tag == "area":
                self._href(a.get("href"))
            elif tag == "img":
                self.imgs += 1
                src = a.get("src")
                if src:
                    self.tokens.extend(crack_url(src, "img:", path=False))
                if a.get("width", "").strip() in ("0", "1") or a.get("height", "").strip() in ("0", "1"):
                    self.tokens.append("html:web-bug")
            elif tag == "form":
                action = a.get("action")
                if action and "://" in action:
                    self.tokens.extend(crack_url(action, "url:"))
            elif tag == "meta":
                if a.get("http-equiv", "").lower() == "refresh":
                    self.notable.add("meta-refresh")
            elif tag == "font":
                self.fonts += 1
                if a.get("size", "").strip() in ("0", "1", "-1", "-2", "-3"):
                    self.tokens.append("html:tiny-font")

        def handle_endtag(self, tag):
            self._tag_boundary(tag)
            stack = self.stack
            # Pop to the matching open element, if it is near the top (malformed
            # HTML leaves elements unclosed; a bounded search keeps this linear).
            for i in range(len(stack) - 1, max(0, len(stack) - _POP_SEARCH), -1):
                if stack[i][0] == tag:
                    del stack[i:]
                    break

        def handle_data(self, data):
            _, hidden, invisible, _fg, _bg = self.stack[-1]
            if invisible:
                return
            if hidden:
                if not data.isspace():
                    self.hidden_chars += len(data)
                return
            if self.pending and data[:1].isalnum():
                self.tokens.append("html:%s-in-word" % self.pending)
            self.pending = None
            self.chunks.append(data)
            self.tail_alnum = data[-1:].isalnum()

        def handle_comment(self, data):
            self.comments += 1
            if self.tail_alnum:
                self.pending = "comment"

        # -- helpers ----------------------------------------------------------
        def _href(self, href):
            if not href:
                return
            h = href.strip()
            low = h[:11].lower()
            if low.startswith("mailto:"):
                self.tokens.append("html:mailto")
            elif low.startswith("javascript:"):
                self.tokens.append("html:js-href")
            elif "://" in h[:12] or low.startswith("www."):
                self.tokens.extend(crack_url(h, "url:"))

        def summary(self):
            out = self.tokens
            out.extend("html:tag:" + t for t in sorted(self.notable))
            if self.fonts:
                out.append("html:font:%d" % _bucket(self.fonts))
            if self.imgs:
                out.append("html:img:%d" % _bucket(self.imgs))
            if self.hidden_chars:
                out.append("html:hidden-text")
            if self.comments:
                out.append("html:comment")
            return out

    _extractor = _Extractor
    return _extractor


def looks_like_html(text):
    """Cheap test for HTML sent as text/plain (common in spam)."""
    head = text[:4096].lower()
    return "<html" in head or "<body" in head or ("<a href" in head and "</a>" in head)


def _sanitize(html):
    """Rewrite ``html`` so that HTMLParser runs in linear time on it.

    The stdlib parser (3.11) rescans to the end of the document for every
    construct it cannot close: measured, 20,000 repetitions of ``<a `` took
    67 s and 4x fewer took 3.2 s (quadratic); unterminated comments,
    ``<![CDATA[``, ``<?`` and ``</`` behave alike.  So, in one pass driven by
    ``str.find``:

    - a ``<`` with no ``>`` before the next ``<`` (or within 1,000
      characters) is text: it becomes ``&lt;``;
    - a tag with an odd number of ``"`` or ``'`` loses its quotes;
    - ``<!--`` runs to its ``-->``; an unterminated comment ends the document;
    - other ``<!...>`` and ``<?...>`` (doctype, marked sections) are dropped;
    - script and style content is dropped (the tags stay, for their tokens);
      an unclosed one ends the document.
    """
    low = html.lower()
    out = []
    append = out.append
    i = 0
    n = len(html)
    gt = -1
    while i < n:
        j = html.find("<", i)
        if j < 0:
            append(html[i:])
            break
        append(html[i:j])
        if html.startswith("<!--", j):
            k = html.find("-->", j + 4)
            if k < 0:
                break
            append(html[j:k + 3])
            i = k + 3
            continue
        if gt <= j:  # the next ">" (cached: re-searching from every "<" is quadratic)
            gt = html.find(">", j + 1)
            if gt < 0:
                gt = n + 1
        k = gt if gt <= n else -1
        nxt = html.find("<", j + 1, k) if k >= 0 else -1
        if k < 0 or nxt >= 0 or k - j > _MAX_TAG:
            append("&lt;")
            i = j + 1
            continue
        i = k + 1
        c = html[j + 1:j + 2]
        if c == "!" or c == "?":
            continue
        tag = html[j:k + 1]
        if tag.count('"') % 2 or tag.count("'") % 2:
            tag = tag.replace('"', " ").replace("'", " ")
        append(tag)
        for name in ("script", "style"):
            if low.startswith(name, j + 1) and not low[j + 1 + len(name):j + 2 + len(name)].isalnum():
                end = low.find("</" + name, i)
                if end < 0:
                    return "".join(out) + "</%s>" % name
                append("</%s>" % name)
                e = low.find(">", end)
                i = n if e < 0 else e + 1
                break
    return "".join(out)


def html_to_text(html):
    """Return ``(visible_text, markup_tokens)`` for an HTML document; never raises."""
    p = _extractor_class()()
    try:
        p.feed(_sanitize(html))
        p.close()
    except Exception:
        # HTMLParser is tolerant; if it still fails, strip tags crudely.
        return _TAG_STRIP.sub(" ", html), p.summary() + ["html:parse-error"]
    return "".join(p.chunks), p.summary()
