"""HTML -> visible text + tokens for what spam hides in markup.

One concern: an HTML ``str`` in, ``(visible_text, markup_tokens)`` out.  A
tokenizer of tags, attributes, comments, raw-text elements and character
references (:func:`_scan`, one linear pass in the states of the HTML
tokenizer) emits HTMLParser's events into a small element stack that tracks
what a reader would actually see (:class:`_Evidence`).  The stdlib
:class:`html.parser.HTMLParser` drives the same collector with
``html_to_text(doc, stdlib=True)``: it is the reference the fast pass is
tested against (it gave identical text and tokens on every HTML part of the
full evaluation corpora when this pass was written), kept out of the hot path
because it is the slower of the two (docs/speed.md).

Markup tokens (all namespaced; listed in :mod:`spamnb.mail.tokenizer` too):

- ``url:...``            link targets (``<a href>``, ``<area href>``, ``<form action>``),
  cracked by :func:`spamnb.mail.lexer.crack_url`;
- ``img:...``            image sources (host and parent domains, scheme; ``img:proto:cid``
  alone for an image embedded in the message, see ``crack_url``);
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

import functools
import re

from spamnb.mail.lexer import bucket, crack_url

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
_EFFECT_TAGS = _SPECIAL | _INVISIBLE  # tags whose start always has an effect (the scan's test)
_TINY_CSS = re.compile(r"font-size:(?:0*\.?0+|1)(?:px|pt)?(?:;|!|$)")
_CSS_COLOR = re.compile(r"(?:^|;)color:([^;!]{1,30})")
_CSS_BG = re.compile(r"background(?:-color)?:([^;!]{1,30})")
_TAG_STRIP = re.compile(r"<[^<>]{0,2000}>")
_NAMED = {"white": "ffffff", "black": "000000", "red": "ff0000", "green": "008000",
          "blue": "0000ff", "yellow": "ffff00", "silver": "c0c0c0", "gray": "808080",
          "grey": "808080"}
_MAX_STACK = 400
_MEMO = 1 << 12
_MAX_TAG = 1000
_POP_SEARCH = 40


def _color(value):
    """Normalise a colour to 6 hex digits (or a lower-case name)."""
    v = value.strip().lower().lstrip("#")
    v = _NAMED.get(v, v)
    if len(v) == 3 and all(c in "0123456789abcdef" for c in v):
        v = "".join(c + c for c in v)
    return v


def _start_tag_effects(tag, attrs):
    """``(element change, evidence)`` of a start tag: what it does from its
    name and attributes alone (the parent's state is applied by the caller).

    The element change is None when the element inherits its parent's state,
    else ``(hidden, invisible, fg, bg)``: the first two turn hiding on, a colour
    (6 hex digits or a name) replaces the inherited one unless None.  The
    evidence is None for tags outside _SPECIAL, else ``(tokens, notable tags,
    fonts, images)``.
    """
    change = _element_change(tag, attrs) if attrs or tag in _INVISIBLE else None
    return change, (_tag_evidence(tag, attrs) if tag in _SPECIAL else None)


def _element_change(tag, attrs):
    hidden = False
    fg = bg = None
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
    return hidden, tag in _INVISIBLE, fg, bg


def _tag_evidence(tag, attrs):
    """Evidence from tags that carry links or are rare in ham."""
    a = {k: v for k, v in attrs if v is not None}
    tokens = []
    notable = [tag] if tag in _NOTABLE else []
    fonts = imgs = 0
    if tag == "a" or tag == "area":
        _href_tokens(a.get("href"), tokens)
    elif tag == "img":
        imgs = 1
        src = a.get("src")
        if src:
            tokens.extend(crack_url(src, "img:", path=False))
        if a.get("width", "").strip() in ("0", "1") or a.get("height", "").strip() in ("0", "1"):
            tokens.append("html:web-bug")
    elif tag == "form":
        action = a.get("action")
        if action and "://" in action:
            tokens.extend(crack_url(action, "url:"))
    elif tag == "meta":
        if a.get("http-equiv", "").lower() == "refresh":
            notable.append("meta-refresh")
    elif tag == "font":
        fonts = 1
        if a.get("size", "").strip() in ("0", "1", "-1", "-2", "-3"):
            tokens.append("html:tiny-font")
    return tuple(tokens), tuple(notable), fonts, imgs


def _href_tokens(href, out):
    if not href:
        return
    h = href.strip()
    low = h[:11].lower()
    if low.startswith("mailto:"):
        out.append("html:mailto")
    elif low.startswith("javascript:"):
        out.append("html:js-href")
    elif "://" in h[:12] or low.startswith("www."):
        out.extend(crack_url(h, "url:"))


class _Evidence:
    """Collects visible text and markup evidence from parse events; see the
    module docstring.

    The events are :class:`html.parser.HTMLParser`'s, from either driver
    (:func:`_scan` or :func:`_stdlib_parse`): lower-case tag and attribute
    names, attribute values unquoted and unescaped (``None`` for a bare
    attribute), text with character references converted.
    """

    def __init__(self):
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
        change, evidence = _start_tag_effects(tag, attrs)
        if evidence is not None:
            self.add_evidence(evidence)
        if tag in _VOID or len(self.stack) >= _MAX_STACK:
            return
        if change is None:  # most tags: inherit the parent's state
            self.stack.append((tag,) + self.stack[-1][1:])
        else:
            self.push_changed(tag, change)

    def add_evidence(self, evidence):
        """Count a start tag's :func:`_tag_evidence`."""
        tokens, notable, fonts, imgs = evidence
        self.tokens.extend(tokens)
        self.notable.update(notable)
        self.fonts += fonts
        self.imgs += imgs

    def push_changed(self, tag, change):
        """Open an element whose :func:`_element_change` is not None."""
        _, hidden, invisible, fg, bg = self.stack[-1]
        hides, hides_all, new_fg, new_bg = change
        if new_fg is not None:
            fg = new_fg
        if new_bg is not None:
            bg = new_bg
        hidden = hidden or hides or (fg is not None and fg == bg)
        self.stack.append((tag, hidden, invisible or hides_all, fg, bg))

    def handle_endtag(self, tag):
        self._tag_boundary(tag)
        stack = self.stack
        if stack[-1][0] == tag and len(stack) > 1:  # the usual case: it closes the top
            del stack[-1]
            return
        self.pop_element(tag)

    def pop_element(self, tag):
        """Close ``tag`` when it is not the top element."""
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

    def summary(self):
        out = self.tokens
        out.extend("html:tag:" + t for t in sorted(self.notable))
        if self.fonts:
            out.append("html:font:%d" % bucket(self.fonts))
        if self.imgs:
            out.append("html:img:%d" % bucket(self.imgs))
        if self.hidden_chars:
            out.append("html:hidden-text")
        if self.comments:
            out.append("html:comment")
        return out



def looks_like_html(text):
    """Cheap test for HTML sent as text/plain (common in spam)."""
    head = text[:4096].lower()
    return "<html" in head or "<body" in head or ("<a href" in head and "</a>" in head)


def _sanitize(html):
    """Rewrite ``html`` so that HTMLParser runs in linear time on it.

    The stdlib parser (3.11) rescans to the end of the document for every
    construct it cannot close, so repeating such a construct makes it
    quadratic; unterminated comments,
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


_stdlib_driver = None


def _stdlib_parse(html, ev):
    """Drive ``ev`` with the stdlib :class:`html.parser.HTMLParser` (after
    :func:`_sanitize`): the reference the fast driver, :func:`_scan`, is
    tested against (``tests/test_html.py``), and ``html_to_text(stdlib=True)``."""
    global _stdlib_driver
    if _stdlib_driver is None:
        from html.parser import HTMLParser  # imported only when asked for: the filter never needs it

        class _Driver(HTMLParser):
            def __init__(self, sink):
                super().__init__(convert_charrefs=True)
                self.handle_starttag = sink.handle_starttag
                self.handle_endtag = sink.handle_endtag
                self.handle_data = sink.handle_data
                self.handle_comment = sink.handle_comment

            def updatepos(self, i, j):
                # Line/column bookkeeping is never read here: skip its cost.
                return j

        _stdlib_driver = _Driver
    p = _stdlib_driver(ev)
    p.feed(_sanitize(html))
    p.close()


# -- the fast driver -------------------------------------------------------------------
#
# A single pass over the document in the states of the HTML tokenizer (WHATWG
# "13.2.5 Tokenization"): data, tag open, end tag open, comment, raw text
# (script and style), with the recovery rules of _sanitize built in, emitting
# the same events as HTMLParser.  Why not HTMLParser itself: it was the
# largest single cost of training, and this pass takes well under half its
# time with the same handlers (the figures and their command:
# docs/speed.md).  The stdlib parser stays the reference: tests/test_html.py checks
# that both give the same text and tokens on tricky markup, on the golden
# messages (English and Chinese) and on real mail (every HTML part of the
# shipped SpamAssassin corpus with ``-m slow``).
#
# What the pass does with each construct (HTMLParser's behaviour after _sanitize):
# - text between tags: character references converted (html.unescape);
# - "<" not followed by a letter, "/", "!" or "?" is text, as is a "<" with
#   no ">" before the next "<" (or within _MAX_TAG characters);
# - <!-- ... -->: a comment; an unterminated comment ends the document;
# - other <!...> and <?...> (doctype, CDATA sections, processing instructions): dropped;
# - a tag with an odd number of quotes loses its quotes;
# - </name ...>: an end tag; "</>" nothing; "</" + non-letter: a (bogus) comment;
# - <name attrs>: a start tag; "/>" at the end makes it also an end tag; attributes are parsed
#   only where the handler reads them (tags in _SPECIAL, or attribute text
#   that may hold a style, hidden or colour: _READ_ON_ANY_TAG);
# - <script> / <style>: the content up to the matching end tag is skipped
#   (to the end of the document if there is none).

# The next construct after "<": a comment opener; an end tag (a plain name,
# then any other); a start tag (its name, then nothing but spaces, or any other
# attribute text); "<!...>" or "<?...>".  A construct holds no "<" and
# at most _MAX_TAG characters: a "<" that opens none is text.  No nested
# quantifiers, and every run stops at "<" or ">": linear in the document.
# The plain end tag ("</b>", "</ b >") and the bare start tag ("<p>", "<b >")
# are alternatives of their own, tried before the general ones, because they
# are most of the markup (the shipped corpus's HTML parts, each split whole: of
# 289,793 start and end tags, 193,419) and need no work in Python beyond the name.
_MARKUP = re.compile(r"<(?:(!--)"
                     r"|/(?=[^<>]{0,%d}>)\s*([a-zA-Z][-.a-zA-Z0-9:_]*)\s*>|/([^<>]{0,%d})>"
                     r"|([a-zA-Z][^\t\n\r\f />\x00<]*)(?:\s{0,%d}>|([^<>]{0,%d})>)"
                     r"|[!?][^<>]{0,%d}>)"
                     % (_MAX_TAG, _MAX_TAG, _MAX_TAG, _MAX_TAG, _MAX_TAG))
# An end tag's name: "</ b >" (spaces around a plain name), else a name right
# after "</" ("</b x=1>"); anything else after "</" makes a bogus comment.
_END_NAME = re.compile(r"\s*([a-zA-Z][-.a-zA-Z0-9:_]*)\s*\Z|([a-zA-Z][^\t\n\r\f />\x00]*)")
# One attribute: name, then optionally "=" and a double-quoted, single-quoted
# or bare value.  No nested quantifiers: linear in the tag's length.
_ATTR = re.compile(r"""([^\s/>=][^\s/>=]*)(?:\s*(=)\s*(?:"([^"]*)"|'([^']*)'|([^\s>]*)))?""")
# Attribute names the handlers read on tags that are not in _SPECIAL (a cheap
# test on the attribute text: a false positive only costs parsing the attributes).
_READ_ON_ANY_TAG = re.compile("style|hidden|color", re.I).search


_NO_MORE = (None, None, None, None, None, "")  # no construct, no text: see _scan
# Where _scan's stretches end: the constructs that make it jump ahead (a
# comment, a script or a style element), or a "<" that looks like one.
_JUMPS = re.compile("<(?:!--|[sS][cC][rR][iI][pP][tT]|[sS][tT][yY][lL][eE])")


def _unescape(s):
    """``html.unescape``, imported on first use (html.entities: an import that
    plain-text mail on the filter path need not pay); replaces itself."""
    global _unescape
    from html import unescape as _unescape
    return _unescape(s)


def _attrs(rest):
    """``[(name, value)]`` of a start tag's attribute text, as HTMLParser gives them."""
    if rest.count('"') % 2 or rest.count("'") % 2:
        rest = rest.replace('"', " ").replace("'", " ")
    out = []
    for name, eq, dq, sq, bare in _ATTR.findall(rest):
        value = (dq or sq or bare) if eq else None
        if value and "&" in value:
            value = _unescape(value)
        out.append((name.lower(), value))
    return out


# The same tag text recurs, in a message and across messages (the shipped
# corpus: 70,723 start tags whose name or attributes matter, 19,140 distinct),
# so what a start tag does is memoised, as crack_url is: with 4,096 entries,
# 50,687 of those tags in a pass over the corpus are hits (16,384
# entries: 51,581; unbounded: 51,583); a hostile stream of 1,000-character tags
# can make it hold 4,096 such texts: at most about 16 MB.

def clear_memo():
    """Empty the memo of start tags' effects (a benchmark's cold pass)."""
    _start_tag.cache_clear()

@functools.lru_cache(maxsize=_MEMO)
def _start_tag(tag, rest):
    """:func:`_start_tag_effects` of a tag and its attribute text."""
    return _start_tag_effects(tag, _attrs(rest) if rest else ())


def _scan(doc, ev):
    """Drive ``ev`` through ``doc`` in one linear pass (see the comment above).

    The document is read in stretches between the constructs that make the
    pass jump ahead: a comment, a script or style element (:data:`_JUMPS`).
    Each stretch is cut by one ``_MARKUP.split`` into text and constructs (a
    list made in C, instead of a match object per construct); the construct
    that ends it is matched alone.  Cutting text at a "<" that opens nothing
    changes no result: the two pieces are seen as the whole would be.

    The common events are handled here, inline, instead of by calls to
    ``ev``'s handlers: a tag's word boundary and its push or pop; text in a
    visible element; a comment.  The handlers (:class:`_Evidence`, driven by the
    stdlib parser in the tests) stay the reference: the same text and tokens on
    every construct (tests/test_html.py), the same token multiset on every
    message (tools/benchmarks/token_hashes.py).  Why: the per-event calls and
    match objects were most of this pass.  Every HTML part of the shipped
    corpus (1,313, 9.8 MB), 9 pairs alternated in one process, CPU medians
    (python tools/benchmarks/bench_tokenizer.py corpora/spamassassin.tar.xz
    --html-vs d10ff10): 1.398 -> 1.004 s, a paired ratio of 0.725 (a later run,
    5 pairs: 1.132 -> 0.905 s, 0.771; 0 parts differ); the steps
    one by one (5 pairs each): the events inline 0.94, with the bare and plain
    tag alternatives and the start-tag memo 0.79-0.81, read in stretches 0.77.
    """
    chunks = ev.chunks
    tokens = ev.tokens
    add_text = chunks.append
    stack = ev.stack
    push, pop = stack.append, stack.pop
    block = _BLOCK
    void = _VOID
    invisible_tags = _INVISIBLE
    effect_tags = _EFFECT_TAGS
    read_any = _READ_ON_ANY_TAG
    split = _MARKUP.split
    match = _MARKUP.match
    next_jump = _JUMPS.search
    tail_alnum = ev.tail_alnum
    pending = ev.pending
    hidden_chars = ev.hidden_chars
    comments = ev.comments
    low = None
    n = len(doc)
    i = look = 0  # i: where the next stretch starts; look: where to seek its end
    try:
        while i < n:
            jm = next_jump(doc, look)
            if jm is None:
                parts = split(doc[i:] if i else doc)
                parts += _NO_MORE  # the text after the last construct, with no construct
                end = n
            else:
                c = jm.start()
                m = match(doc, c)
                if m is None:  # "<script" that opens nothing: text, in this stretch
                    look = c + 1
                    continue
                parts = split(doc[i:c]) if i < c else [""]
                parts += m.groups()
                parts.append("")
                end = m.end()
            jump = None  # where the pass resumes after a comment or a script
            it = iter(parts)
            for text, comment, name, inner, tag, rest in zip(it, it, it, it, it, it):
                if text:  # ev.handle_data
                    if "&" in text:
                        text = _unescape(text)
                    top = stack[-1]
                    if top[2]:  # invisible
                        pass
                    elif top[1]:  # hidden
                        if not text.isspace():
                            hidden_chars += len(text)
                    else:
                        if pending is not None and text[:1].isalnum():
                            tokens.append("html:%s-in-word" % pending)
                        pending = None
                        add_text(text)
                        tail_alnum = text[-1:].isalnum()
                if tag is not None:  # a start tag: ev.handle_starttag
                    tag = tag.lower()
                    if tag in block:
                        add_text("\n")
                        tail_alnum = False
                        pending = None
                    elif tail_alnum:
                        pending = "tag"
                    change = None
                    if tag in effect_tags or (rest is not None and read_any(rest)):
                        change, evidence = _start_tag(tag, rest or "")
                        if evidence is not None:
                            ev.add_evidence(evidence)
                    if tag not in void and len(stack) < _MAX_STACK:
                        if change is None:
                            top = stack[-1]
                            push((tag, top[1], top[2], top[3], top[4]))
                        else:
                            ev.push_changed(tag, change)
                    if rest and rest[-1] == "/" and (len(rest) == 1 or rest[-2] in " \t\n\r\f\"'"):
                        name = tag  # <br/>: start and end
                    elif tag in invisible_tags:  # only ever the construct that ends a stretch
                        if low is None:
                            low = doc.lower()
                        k = low.find("</" + tag, end)
                        if k >= 0:
                            k = low.find(">", k)
                        jump = n if k < 0 else k + 1  # unclosed: the rest is script or style
                        name = tag
                    else:
                        continue
                elif name is not None:  # "</b>"
                    name = name.lower()
                elif inner is not None:  # any other "</...>"
                    if inner.count('"') % 2 or inner.count("'") % 2:
                        inner = inner.replace('"', " ").replace("'", " ")  # as for a start tag
                    found = _END_NAME.match(inner)
                    if not found:
                        if inner:  # "</3>": a bogus comment
                            comments += 1
                            if tail_alnum:
                                pending = "comment"
                        continue
                    name = (found.group(1) or found.group(2)).lower()
                elif comment:  # "<!--" (only ever the construct that ends a stretch): ev.handle_comment
                    k = doc.find("-->", end)
                    if k < 0:
                        return  # an unterminated comment ends the document
                    comments += 1
                    if tail_alnum:
                        pending = "comment"
                    jump = k + 3
                    continue
                else:  # "<!...>" / "<?...>": dropped
                    continue
                # An end tag: ev.handle_endtag
                if name in block:
                    add_text("\n")
                    tail_alnum = False
                    pending = None
                elif tail_alnum:
                    pending = "tag"
                if stack[-1][0] == name and len(stack) > 1:  # the usual case: it closes the top
                    pop()
                else:
                    ev.pop_element(name)
            i = look = end if jump is None else jump
    finally:
        ev.tail_alnum = tail_alnum
        ev.pending = pending
        ev.hidden_chars = hidden_chars
        ev.comments = comments


def html_to_text(html, *, stdlib=False):
    """Return ``(visible_text, markup_tokens)`` for an HTML document; never raises.

    ``stdlib=True`` parses with :class:`html.parser.HTMLParser` instead of the
    fast single pass (same results; tests and benchmarks compare the two).
    """
    ev = _Evidence()
    try:
        (_stdlib_parse if stdlib else _scan)(html, ev)
    except Exception:
        # Both drivers are tolerant; if one still fails, strip tags crudely.
        return _TAG_STRIP.sub(" ", html), ev.summary() + ["html:parse-error"]
    return "".join(ev.chunks), ev.summary()
