"""spamnb.mail.tokenizer, spamnb.mail.lexer, spamnb.mail.html_text: golden files and unit tests."""

import base64
import json
import pathlib
import subprocess
import sys

import pytest

from conftest import growth_ratios

from spamnb.mail import lexer
from spamnb.mail.html_text import html_to_text, looks_like_html
from spamnb.mail.tokenizer import DEFAULT_CONFIG, TokenizerConfig, iter_tokens, tokenize

GOLDEN = pathlib.Path(__file__).parent / "golden"
TREC_FAIR = ("subject", "from", "to", "content-type", "content-transfer-encoding")


# -- golden files ---------------------------------------------------------------

@pytest.mark.parametrize("eml", sorted(GOLDEN.glob("*.eml")), ids=lambda p: p.stem)
def test_golden(eml):
    expected = eml.with_suffix(".tokens").read_text(encoding="utf-8").split("\n")
    assert expected[-1] == ""
    got = tokenize(eml.read_bytes(), DEFAULT_CONFIG)
    # On an intended change: python3 tools/generators/regen_golden.py, review the diff.
    assert got == expected[:-1]


def test_golden_set_is_complete():
    names = {p.stem for p in GOLDEN.glob("*.eml")}
    assert len(names) >= 12
    assert names == {p.stem for p in GOLDEN.glob("*.tokens")}


def test_golden_facts():
    """A few facts about real messages (the SpamAssassin ones), stated independently of the files."""
    def toks(name):
        return tokenize((GOLDEN / (name + ".eml")).read_bytes())
    t = toks("sa_spam_comment_in_word")
    assert "html:comment-in-word" in t
    assert "seen" in t and "dieting" in t          # se<!--5-->en, dieti<!--D-->ng
    t = toks("sa_spam_big5_rfc2047")
    assert "subject:不看會後悔" in t and "charset:big5" in t
    t = toks("sa_spam_base64_attachment")
    assert "filename:ext:txt" in t and "content-disposition:attachment" in t


def test_golden_facts_chinese():
    """The project's own Chinese messages (tools/generators/make_golden_cn.py): what each
    was written to exercise, stated independently of the .tokens files."""
    def toks(name):
        return tokenize((GOLDEN / (name + ".eml")).read_bytes())
    # GBK encoded words: B in the Subject, Q in the From name, characters GB2312 lacks;
    # the blank line in the folded Subject ends the header block, and the undeclared
    # 8-bit GBK HTML after it is still read
    t = toks("cn_spam_gbk_rfc2047")
    assert "subject:限時特價" in t and "from:name:數碼商城" in t
    assert "content-type:missing" in t and "charset:guess:gb18030" in t
    assert "content-type:plain-as-html" in t and "全場八折" in t
    # the boundary is gone: the multipart's body is read as undeclared text, GBK guessed
    t = toks("cn_ham_gbk_lost_boundary")
    assert "mime:defect:StartBoundaryNotFoundDefect" in t and "subject:周五组会改到下午三点" in t
    assert "charset:none" in t and "charset:guess:gb18030" in t
    assert "他要打印开题报告" in t and "喆明补做的两组数据" in t      # 喆: GBK, not GB2312
    # a folded header line lost its indent: the rest of the headers is body
    t = toks("cn_ham_broken_headers")
    assert "mime:defect:MissingHeaderBodySeparatorDefect" in t and "content-type:missing" in t
    assert "header:Subject" not in t and "charset:guess:gb18030" in t and "记得带伞" in t
    # declared GB2312, raw 8-bit body; GB2312 encoded words; a Chinese URL path
    t = toks("cn_spam_gb2312")
    assert "charset:gb2312" in t and not any(x.startswith("charset:guess:") for x in t)
    assert "from:name:华北企业管理培训中心" in t and "url:path:课程" in t and "名额有限" in t
    # says base64, but the body is raw GB2312: read as 8-bit, not as base64 garbage
    t = toks("cn_spam_base64_lying")
    assert "content-transfer-encoding:base64" in t and "免费停车" in t and "中央空调" in t
    # real base64 of GBK text, declared gbk: decoded with no guess, both alternatives
    t = toks("cn_spam_base64")
    assert t.count("charset:gbk") == 2 and not any(x.startswith("charset:guess:") for x in t)
    assert t.count("一臺起批") == 2 and "subject:原裝手機批發" in t and "img:img.example.net" in t


def test_chinese_golden_messages_are_the_scripts():
    """tests/golden/cn_*.eml are exactly what tools/generators/make_golden_cn.py writes."""
    out = subprocess.run([sys.executable, str(GOLDEN.parent.parent / "tools" / "generators" / "make_golden_cn.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    names = {p.stem for p in GOLDEN.glob("cn_*.eml")}
    assert out.stdout == "0 message(s) differ\n" and len(names) == 6


# -- configuration ----------------------------------------------------------------

def test_config_round_trip_through_json():
    cfg = TokenizerConfig(only_headers=TREC_FAIR, cjk="unigram", bigrams=True)
    d = json.loads(json.dumps(cfg.to_dict()))
    assert d["only_headers"] == list(TREC_FAIR)
    assert TokenizerConfig.from_dict(d) == cfg
    assert TokenizerConfig.from_dict(DEFAULT_CONFIG.to_dict()) == DEFAULT_CONFIG


def test_config_rejects_unknown_keys_and_bad_values():
    with pytest.raises(ValueError, match="unknown tokenizer config keys: nope"):
        TokenizerConfig.from_dict({"nope": 1})
    with pytest.raises(ValueError, match="cjk"):
        TokenizerConfig(cjk="trigram")
    with pytest.raises(ValueError, match="html"):
        TokenizerConfig(html="x")
    with pytest.raises(ValueError, match="max_part_bytes"):
        TokenizerConfig(max_part_bytes=-1)
    with pytest.raises(ValueError, match="only_headers"):
        TokenizerConfig(only_headers="subject")
    with pytest.raises(ValueError):
        TokenizerConfig.from_dict(["not", "a", "dict"])


def test_config_is_hashable_and_normalises_header_names():
    cfg = TokenizerConfig(only_headers=["Subject"], skip_headers=["X-Spam"])
    assert cfg.only_headers == ("subject",) and cfg.skip_headers == ("x-spam",)
    hash(cfg)


# -- header selection ----------------------------------------------------------

MSG = b"""Received: from relay.spam-gw.example.cn (relay [10.1.2.3]) by mx.example.org
Message-ID: <123.abc@spam-gw.example.cn>
From: "Big Sale" <deals@shop.example.com>
To: a@x.org, b@y.org
Subject: Cheap watches!!
X-Mailer: SuperMailer 2.0
Content-Type: text/plain; charset=us-ascii

Buy cheap watches today
"""


def test_default_header_tokens():
    t = tokenize(MSG)
    for tok in ["header:Received", "received:example.cn", "received:spam-gw.example.cn",
                "received:ip:10.1.2.3", "received:ip:10.1.2", "message-id:@spam-gw.example.cn",
                "message-id:shape:9.a", "from:addr:deals@shop.example.com",
                "from:domain:example.com", "from:domain:shop.example.com", "from:name:big",
                "from:name:sale", "to:count:2", "to:domain:x.org", "to:name:none",
                "subject:cheap", "subject:watches", "subject:punct:!!", "x-mailer:supermailer",
                "content-type:text/plain", "charset:us-ascii", "buy", "cheap", "today"]:
        assert tok in t, tok


def test_only_headers_trec_fair_set():
    t = tokenize(MSG, TokenizerConfig(only_headers=TREC_FAIR))
    assert not [x for x in t if x.startswith(("received:", "message-id:", "x-mailer:"))]
    assert "header:Received" not in t and "header:X-Mailer" not in t
    assert "subject:cheap" in t and "from:domain:example.com" in t
    assert "content-type:text/plain" in t and "buy" in t


def test_skip_headers():
    t = tokenize(MSG, TokenizerConfig(skip_headers=("subject", "content-type")))
    assert "subject:cheap" not in t and "header:Subject" not in t
    assert "content-type:text/plain" not in t and "charset:us-ascii" not in t
    assert "from:name:big" in t and "watches" in t


def test_rfc2047_subject_and_8bit_subject():
    raw = ("Subject: =?gb2312?B?%s?=\nContent-Type: text/plain; charset=gb2312\n\nx\n"
           % base64.b64encode("免费发票".encode("gb2312")).decode()).encode()
    bigram = TokenizerConfig(cjk="bigram")
    assert [x for x in tokenize(raw, bigram) if x.startswith("subject:")] == [
        "subject:免费", "subject:费发", "subject:发票"]
    assert [x for x in tokenize(raw) if x.startswith("subject:")] == ["subject:免费发票"]
    raw = b"Subject: " + "免费发票".encode("gb2312") + b"\nContent-Type: text/plain; charset=gb2312\n\nx\n"
    assert [x for x in tokenize(raw, bigram) if x.startswith("subject:")] == [
        "subject:免费", "subject:费发", "subject:发票"]


# -- lexer --------------------------------------------------------------------

def test_words_ascii():
    assert lexer.words("Hello, (world)! a an the $99.95 50% 1,000 x-ray", min_len=3) == [
        "Hello", "world", "the", "$99.95", "50%", "1,000", "x-ray"]


def test_words_length_bounds_and_skip_tokens():
    assert lexer.words("a ab abc abcdefghijkl abcdefghijklm " + "z" * 35, min_len=3) == [
        "abc", "abcdefghijkl", "skip:a 10", "skip:z 30"]
    assert lexer.words("a ab abc", min_len=1) == ["a", "ab", "abc"]
    assert lexer.words("a ab abc") == ["ab", "abc"]
    assert lexer.skip_token("\x00" * 20) == "skip:? 20"


def test_words_unicode_and_prefix():
    assert lexer.words("l'été déjà-vu naïve", prefix="s:") == ["s:l'été", "s:déjà-vu", "s:naïve"]


@pytest.mark.parametrize("scheme, expected", [
    ("bigram", ["中文", "文邮", "邮件"]),
    ("unigram", ["中", "文", "邮", "件"]),
    ("uni+bigram", ["中", "文", "邮", "件", "中文", "文邮", "邮件"]),
    ("none", ["中文邮件"]),
    ("bigram+run", ["中文", "文邮", "邮件", "中文邮件"]),
    ("unigram+run", ["中", "文", "邮", "件", "中文邮件"]),
    ("run-or-bigram", ["中文邮件"]),
])
def test_cjk_schemes(scheme, expected):
    assert lexer.words("中文邮件", cjk=scheme) == expected


def test_cjk_long_runs():
    run = "这是一个很长的没有标点的中文句子"  # 16 characters
    assert lexer.words(run, cjk="none") == ["skip:这 10"]
    assert lexer.words(run, cjk="run-or-bigram") == lexer.words(run, cjk="bigram")
    assert len(lexer.words(run, cjk="bigram")) == 15


def test_cjk_mixed_with_latin_and_punctuation():
    text = "价格3000元，详情请见ABC公司。"
    assert lexer.words(text, cjk="bigram", min_len=3) == [
        "价格", "3000", "元", "详情", "情请", "请见", "ABC", "公司"]
    assert lexer.words(text, cjk="none", min_len=2) == ["价格", "3000", "详情请见", "ABC", "公司"]
    # Runs are split where the script changes (Han / Hiragana / Katakana / Hangul).
    assert lexer.words("ひらがなカタカナ한국어", cjk="bigram") == [
        "ひら", "らが", "がな", "カタ", "タカ", "カナ", "한국", "국어"]
    assert lexer.words("東京へ行くカメラ", cjk="none", min_len=1) == ["東京", "へ", "行", "く", "カメラ"]


def test_crack_url():
    assert list(lexer.crack_url("http://user@www.Example.co.uk:8080/Buy/now.php?id=7%20")) == [
        "url:proto:http", "url:userinfo", "url:port", "url:co.uk", "url:example.co.uk",
        "url:www.example.co.uk", "url:escapes", "url:path:buy", "url:path:now",
        "url:path:php", "url:path:id", "url:path:7", "url:path:20"]
    assert list(lexer.crack_url("https://1.2.3.4/", "img:", path=False)) == [
        "img:proto:https", "img:ip:1.2.3.4", "img:ip:1.2.3", "img:ip:1.2"]
    assert lexer.crack_url("http://3232235777/x")[:2] == ("url:proto:http", "url:ip:numeric")
    assert lexer.crack_url("www.shop.example")[0] == "url:proto:http"


@pytest.mark.parametrize("url, tokens", [
    # An image embedded in the message: its Content-ID is no host, and the "@" in it no userinfo.
    ("cid:part1.06090408.01060107@example.com", ["img:proto:cid"]),
    ("CID:image001.jpg@01C9A1B2.3C4D5E60", ["img:proto:cid"]),
    ("data:image/gif;base64,R0lGODlhAQABAIAAAP", ["img:proto:data"]),  # not host "data", port
    ("mailto:bob@x.example", ["img:proto:mailto"]),
    ("about:blank", ["img:proto:about"]),
    (" cid:x@y", ["img:proto:cid"]),
    ("cid:12345", ["img:proto:cid"]),  # not host "cid", port 12345
    ("file:///C:/x.gif", ["img:proto:file"]),  # with "://": as before
    # No scheme (a "www." host has a dot before any ":"): still read as http.
    ("www.example.com/a.gif", ["img:proto:http", "img:example.com", "img:www.example.com"]),
    ("www.example.com:8080/a.gif", ["img:proto:http", "img:port", "img:example.com", "img:www.example.com"]),
])
def test_crack_url_keeps_a_scheme_without_slashes(url, tokens):
    assert list(lexer.crack_url(url, "img:", path=False)) == tokens


def test_an_embedded_image_is_not_an_http_link():
    _, tokens = html_to_text('<p>logo <img src="cid:part1.06090408@example.com"></p>')
    assert "img:proto:cid" in tokens
    assert not [t for t in tokens if t.startswith("img:") and t != "img:proto:cid"]
    assert "html:img:1" in tokens


@pytest.mark.parametrize("text, urls, rest", [
    ("http:// nothing", [], "http:// nothing"),
    ("go to https://A.example/P?q=1, then", ["https://A.example/P?q=1,"], "go to   then"),
    ("WWW.Example.com and http://www.x.example/www.y", ["WWW.Example.com", "http://www.x.example/www.y"],
     "  and  "),
    ("xftp://f.example/", ["ftp://f.example/"], "x "),
    ("İ http://i.example/", ["http://i.example/"], "İ  "),  # lower() changes the length
    ("mailto:bob@example.com", [], "mailto:bob@example.com"),
    ("visit www. or www.x", ["www.x"], "visit www. or  "),
])
def test_find_urls_edges(text, urls, rest):
    assert lexer.find_urls(text) == (urls, rest)


def test_find_emails_edges():
    assert lexer.find_emails("a@b") == ([], "a@b")
    assert lexer.find_emails("x <a.b+c@d.example>, e@f.example")[0] == [
        ("a.b+c", "d.example"), ("e", "f.example")]
    assert lexer.find_emails("a" * 100 + "@d.example")[0] == [("a" * 64, "d.example")]
    assert lexer.find_emails("@@@ @x.y a@@b.c")[0] == []


def test_find_urls_and_emails():
    urls, rest = lexer.find_urls("see http://a.example/x and www.b.example now")
    assert urls == ["http://a.example/x", "www.b.example"] and rest.split() == ["see", "and", "now"]
    found, rest = lexer.find_emails("mail bob.smith@mail.example.com today")
    assert found == [("bob.smith", "mail.example.com")] and rest.split() == ["mail", "today"]
    assert lexer.crack_email("Bob", "mail.example.com") == [
        "email:local:bob", "email:domain:example.com", "email:domain:mail.example.com"]


def test_nfkc_and_case_folding_options():
    raw = "Content-Type: text/plain; charset=utf-8\n\nＦＲＥＥ Money\n".encode()
    assert "free" in tokenize(raw) and "money" in tokenize(raw)
    t = tokenize(raw, TokenizerConfig(case_fold=False))
    assert "FREE" in t and "Money" in t
    assert "ＦＲＥＥ" in tokenize(raw, TokenizerConfig(nfkc=False, case_fold=False))


def test_token_bigrams_option():
    raw = b"Content-Type: text/plain\n\nbuy cheap watches\n"
    t = tokenize(raw, TokenizerConfig(bigrams=True))
    assert "bi:buy cheap" in t and "bi:cheap watches" in t
    assert not [x for x in tokenize(raw) if x.startswith("bi:")]


# -- HTML --------------------------------------------------------------------------

def test_html_visible_text_and_markup_tokens():
    html = ('<html><head><title>T</title><style>p {color: red}</style>'
            '<script>var hidden = "scriptword";</script></head>'
            '<body bgcolor="#FFFFFF"><p>Buy <b>V</b>iagra V<!-- x -->alium now</p>'
            '<div style="display: none">hashbuster</div>'
            '<font color="white">whiteonwhite</font><font size="1">tiny</font>'
            '<span style="font-size:0px">zero</span> '
            '<a href="http://www.pills.example/buy">here</a>'
            '<img src="http://img.example.net/x.gif" width="1" height="1">'
            '<form action="http://collect.example/post"><input type=text></form>'
            '</body></html>')
    text, toks = html_to_text(html)
    words = text.split()
    assert "Viagra" in words and "Valium" in words and "tiny" in words and "here" in words
    for w in ("hashbuster", "whiteonwhite", "zero", "scriptword"):
        assert w not in text
    for tok in ("html:tag-in-word", "html:comment-in-word", "html:hidden-text", "html:tiny-font",
                "url:pills.example", "url:www.pills.example", "url:path:buy", "img:example.net",
                "img:img.example.net", "html:web-bug", "url:collect.example", "html:tag:form",
                "html:tag:input", "html:tag:script", "html:font:2", "html:img:1", "html:comment"):
        assert tok in toks, tok


def test_html_block_tags_separate_words_inline_tags_do_not():
    assert html_to_text("one<br>two<p>three</p><b>fo</b>ur")[0].split() == ["one", "two", "three", "four"]


def test_html_entities_and_unclosed_head():
    text, _ = html_to_text("<head><title>t</title><body>caf&eacute; &amp; bar&nbsp;baz")
    assert "café" in text and "&" in text and "baz" in text


def test_plain_text_that_is_html():
    assert looks_like_html("<HTML><BODY>hi</BODY></HTML>")
    assert not looks_like_html("if a < b and c > d")
    raw = b"Content-Type: text/plain\n\n<html><body><a href='http://x.example/'>click</a></body></html>\n"
    t = tokenize(raw)
    assert "content-type:plain-as-html" in t and "url:x.example" in t and "click" in t


def test_html_modes():
    raw = b"Content-Type: text/html\n\n<p>Hello <a href='http://x.example/'>world</a></p>\n"
    assert "url:x.example" in tokenize(raw)
    assert "url:x.example" not in tokenize(raw, TokenizerConfig(html="text"))
    assert "hello" in tokenize(raw, TokenizerConfig(html="strip"))
    assert "href='http" not in tokenize(raw, TokenizerConfig(html="strip"))


# -- MIME structure ----------------------------------------------------------------

ALT = b"""From: a@b.example
Content-Type: multipart/mixed; boundary="outer"

--outer
Content-Type: multipart/alternative; boundary="inner"

--inner
Content-Type: text/plain; charset=utf-8
Content-Transfer-Encoding: quoted-printable

plainword caf=C3=A9
--inner
Content-Type: text/html; charset=utf-8

<p>htmlword</p>
--inner--
--outer
Content-Type: application/pdf; name="invoice.pdf.exe"
Content-Disposition: attachment; filename="invoice.pdf.exe"
Content-Transfer-Encoding: base64

""" + base64.b64encode(b"secretattachmentword " * 20) + b"""
--outer--
"""


def test_multipart_parts_and_attachment_not_decoded():
    t = tokenize(ALT)
    for tok in ("content-type:multipart/mixed", "content-type:multipart/alternative",
                "content-type:boundary:a", "content-type:text/plain", "content-type:text/html",
                "content-transfer-encoding:quoted-printable", "charset:utf-8", "plainword", "café",
                "htmlword", "content-type:application/pdf", "content-disposition:attachment",
                "filename:invoice.pdf.exe", "filename:ext:exe", "filename:double-ext"):
        assert tok in t, tok
    assert not [x for x in t if "secretattachmentword" in x]


def test_alternative_modes():
    t = tokenize(ALT, TokenizerConfig(alternative="html"))
    assert "htmlword" in t and "plainword" not in t
    t = tokenize(ALT, TokenizerConfig(alternative="plain"))
    assert "plainword" in t and "htmlword" not in t


def test_max_part_bytes():
    raw = b"Content-Type: text/plain\n\n" + b"early " * 10 + b"x" * 1000 + b" lateword\n"
    assert "lateword" in tokenize(raw)
    t = tokenize(raw, TokenizerConfig(max_part_bytes=100))
    assert "early" in t and "lateword" not in t


def test_part_and_depth_caps():
    raw = (b"Content-Type: multipart/mixed; boundary=b\n\n"
           + b"--b\nContent-Type: text/plain\n\nx\n" * 300 + b"--b--\n")
    # layout: and punct: tokens come last
    t = tokenize(raw, TokenizerConfig(max_parts=50, layout_signals=False, exclaim_signals=False))
    assert t[-1] == "mime:too-many-parts"
    assert t.count("content-type:text/plain") == 49


def test_iter_tokens_matches_tokenize():
    assert list(iter_tokens(ALT)) == tokenize(ALT)


# -- robustness ----------------------------------------------------------------------

@pytest.mark.parametrize("raw", [
    b"", b"\x00" * 1000, bytes(range(256)) * 10, b"not mail at all",
    b"Content-Type: multipart/mixed\n\nno boundary param",
    b"Content-Type: multipart/mixed; boundary=x\n\n--x\n--x\n--x--",
    b"Content-Type: text/plain; charset=utf-99\nContent-Transfer-Encoding: base64\n\n!!!!",
    b"Content-Type: text/html\n\n<<<<>>>><!--<!--<![CDATA[<?<a href='",
    b"Subject: =?utf-8?B?=?= =?=?=\nFrom: <<<@@@>>>\nTo: ,,,,\n\n",
    b"Content-Type: message/rfc822\n\nSubject: inner\n\ninner body",
])
def test_never_raises_on_nasty_inputs(raw):
    t = tokenize(raw)
    assert isinstance(t, list) and all(isinstance(x, str) and "\n" not in x for x in t)
    assert "tokenizer:error" not in t


def test_never_raises_on_random_bytes():
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    prefixes = [b"", b"Content-Type: text/html\n\n",
                b"Content-Type: multipart/mixed; boundary=b\n\n--b\nContent-Transfer-Encoding: base64\n\n",
                b"Subject: =?gb2312?B?", b"Content-Type: text/plain; charset=gb2312\n\n"]

    @hypothesis.settings(max_examples=300, deadline=None)
    @hypothesis.given(st.sampled_from(prefixes), st.binary(max_size=2000))
    def check(prefix, body):
        t = tokenize(prefix + body)
        assert isinstance(t, list)
        assert all("\n" not in x and "\r" not in x for x in t)
        assert "tokenizer:error" not in t
    check()


@pytest.mark.parametrize("unit, head", [
    (b"a", b"Content-Type: text/plain\n\n"),
    (b"a@", b"Content-Type: text/plain\n\n"),
    (b"http://a.", b"Content-Type: text/plain\n\n"),
    ("中文".encode(), b"Content-Type: text/plain; charset=utf-8\n\n"),
    (b"<a ", b"Content-Type: text/html\n\n"),
    (b"<", b"Content-Type: text/html\n\n"),
    (b"<!--", b"Content-Type: text/html\n\n"),
    (b"</", b"Content-Type: text/html\n\n"),
    (b'<a href="', b"Content-Type: text/html\n\n"),
    (b"<script><a", b"Content-Type: text/html\n\n"),
])
def test_single_line_time_grows_linearly(unit, head):
    # One adversarial line, no newlines.  Quadratic behaviour would make the 4x input
    # cost 16x; linear costs 4x, and 8x leaves room for the noise growth_ratio leaves.
    n = 30_000 // len(unit)
    config = TokenizerConfig(max_part_bytes=10**7)
    small, large = head + unit * n, head + unit * (4 * n)
    runs = growth_ratios(lambda: tokenize(small, config), lambda: tokenize(large, config), limit=8)
    assert runs[-1][0] < 8, [f"x{r:.1f}: {t1 * 1e3:.2f} ms -> {t4 * 1e3:.2f} ms" for r, t1, t4 in runs]


def test_tokenizer_imports_stay_lean():
    code = ("import sys, spamnb.mail.tokenizer; "
            "print(sorted(m for m in ('numpy', 'scipy', 'joblib', 'sklearn') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_verdict_headers_are_never_tokens():
    from spamnb.mail.tokenizer import TokenizerConfig, tokenize

    raw = b"Subject: hello there\nFrom: a@example.org\n\nbody words here\n"
    filtered = raw.replace(b"\n\n", b"\nX-Spam-Flag: YES\nX-Spam-Status: Yes, probability=1.0\n"
                                     b"X-Spam-Evidence: cheap:+2.00\n\n", 1)
    assert tokenize(filtered) == tokenize(raw)
    only = TokenizerConfig(only_headers=("subject", "x-spam-flag"))
    assert tokenize(filtered, only) == tokenize(raw, only)


def test_line_ends_do_not_move_where_a_long_part_is_cut():
    """A maildir holds a message with LF, an IMAP server serves it with CRLF: the
    tokens must be the same, also where the part is longer than the tokenizer reads."""
    from spamnb.mail.tokenizer import TokenizerConfig, tokenize

    body = "".join(f"line {i} word{i % 977}\n" for i in range(30_000))  # ~600 kB, over max_part_bytes
    lf = ("Subject: long\nContent-Type: text/plain\n\n" + body).encode()
    crlf = lf.replace(b"\n", b"\r\n")
    qp_lf = ("Subject: long\nContent-Type: text/plain\nContent-Transfer-Encoding: quoted-printable\n\n"
             + body).encode()
    config = TokenizerConfig()
    assert tokenize(lf, config) == tokenize(crlf, config)
    assert tokenize(qp_lf, config) == tokenize(qp_lf.replace(b"\n", b"\r\n"), config)


def test_recipient_counts_and_folded_header_names_are_options():
    raw = MSG.replace(b"Content-Type:", b"Content-type:")
    t = tokenize(raw)
    assert "to:count:2" in t and "header:Content-type" in t and "header:X-Mailer" in t
    t = tokenize(raw, TokenizerConfig(recipient_counts=False, fold_header_names=True))
    assert not [x for x in t if ":count:" in x and not x.startswith("received:")]
    assert "to:addr:a@x.org" in t and "received:count:1" in t
    assert "header:content-type" in t and "header:x-mailer" in t and "header:Content-type" not in t
    # The two options cache their header plans apart.
    assert "header:Content-type" in tokenize(raw)
