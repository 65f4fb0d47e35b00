"""spamnb.mail.signals: evidence about how a message is addressed, linked and laid out."""

from spamnb.mail import mime, signals
from spamnb.mail.tokenizer import DEFAULT_CONFIG, TokenizerConfig, tokenize

ALL_ON = TokenizerConfig(sender_signals=True, link_signals=True, layout_signals=True)
OFF = {"sender_signals": False, "link_signals": False, "layout_signals": False}


def only(**on):
    """A configuration with only the named groups on (layout_signals is a default)."""
    return TokenizerConfig(**{**OFF, **on})
PREFIXES = ("sender:", "link:", "layout:")


def ours(raw, config=ALL_ON):
    return [t for t in tokenize(raw, config) if t.startswith(PREFIXES)]


def test_registered_domain():
    assert signals.registered_domain("mail.Example.com.") == "example.com"
    assert signals.registered_domain("www.shop.example.co.uk") == "example.co.uk"
    assert signals.registered_domain("example.com") == "example.com"
    assert signals.registered_domain("10.1.2.3") == "10.1.2.3"
    assert signals.registered_domain("localhost") == "localhost"


PHISH = (b'From: "PayPal service@paypal.com" <alert@mail.evil.example>\n'
         b"Reply-To: claims@other.example\n"
         b"Return-Path: <bounce@evil.example>\n"
         b"Subject: =?utf-8?B?WW91ciBhY2NvdW50?=\n"
         b"Content-Type: text/html\n\n"
         b'<p>Dear customer</p><a href="https://login.evil.example/x">https://www.paypal.com/signin</a>'
         b'<a href="http://bit.ly/abc">here</a><a href="https://host42.evil.example/">more</a>\n')


def test_sender_tokens_relate_from_to_its_name_reply_to_and_return_path():
    t = ours(PHISH, only(sender_signals=True))
    assert t == ["sender:encoded:subject:b", "sender:name:address", "sender:name:other-domain",
                 "sender:reply-to:other-domain", "sender:return-path:same-domain"]


def test_sender_tokens_same_domain_empty_return_path_and_plain_from():
    raw = (b"From: Bob <bob@lists.example.org>\nReply-To: <list@example.org>\n"
           b"Return-Path: <>\nSubject: =?iso-8859-1?q?caf=E9?=\n\nhello\n")
    assert ours(raw, only(sender_signals=True)) == [
        "sender:encoded:subject:q", "sender:reply-to:same-domain", "sender:return-path:empty"]
    # A display name without an address or a domain in it says nothing.
    assert ours(b"From: Bob Smith <bob@example.com>\n\nhi\n", only(sender_signals=True)) == []


def test_sender_tokens_follow_the_header_selection():
    config = only(sender_signals=True, only_headers=("from", "subject"))
    assert "sender:reply-to:other-domain" not in ours(PHISH, config)
    assert ours(PHISH, only(sender_signals=True, skip_headers=("from", "subject"))) == []


def test_link_tokens():
    t = ours(PHISH, only(link_signals=True))
    # Three links (bucket 2) to two registered domains, bit.ly and evil.example;
    # the first one shows www.paypal.com and goes elsewhere.
    assert t == ["link:count:2", "link:domains:2", "link:tld:ly", "link:tld:example", "link:shortener",
                 "link:host-digits", "link:text-other-domain", "link:sender-domain"]


def test_link_tokens_in_plain_text_and_link_text_of_the_same_domain():
    raw = (b"From: a@example.com\nContent-Type: text/html\n\n"
           b'<a href="https://www.example.com/a">example.com</a>\n')
    t = ours(raw, only(link_signals=True))
    assert "link:text-other-domain" not in t
    assert "link:sender-domain" in t
    raw = b"From: a@example.com\n\nsee https://news.example.net/today and www.example.org\n"
    assert ours(raw, only(link_signals=True)) == [
        "link:count:2", "link:domains:2", "link:tld:net", "link:tld:org", "link:no-sender-domain"]
    assert ours(b"From: a@example.com\n\nno links\n", only(link_signals=True)) == []


def test_a_plain_parts_urls_are_found_once(monkeypatch):
    """With link_signals on, the links of a plain part are the URLs its words were taken
    from: each part is scanned for URLs once (link_tokens scanned every one again)."""
    from spamnb.mail import lexer, tokenizer

    calls = []

    def counting(text, *args, **kwargs):
        calls.append(text)
        return lexer.find_urls(text, *args, **kwargs)

    monkeypatch.setattr(tokenizer, "find_urls", counting)
    monkeypatch.setattr(signals, "find_urls", counting, raising=False)
    raw = (b"From: a@example.com\nContent-Type: multipart/mixed; boundary=b\n\n--b\n\n"
           b"see HTTPS://News.Example.NET/today\n--b\n\nand www.example.org or http://bit.ly/x\n--b--\n")
    assert ours(raw, only(link_signals=True)) == [
        "link:count:2", "link:domains:2", "link:tld:ly", "link:tld:net", "link:tld:org", "link:shortener",
        "link:no-sender-domain"]
    assert len(calls) == 2  # one scan a part


def test_layout_tokens():
    assert ours(PHISH, only(layout_signals=True)) == [
        "layout:html-only", "layout:text:0", "layout:text-share:20"]
    alt = (b"From: a@example.com\nContent-Type: multipart/alternative; boundary=b\n\n"
           b"--b\nContent-Type: text/plain\n\nhello there\n"
           b"--b\nContent-Type: text/html\n\n<p>hello there</p>\n--b--\n")
    assert ours(alt, only(layout_signals=True)) == ["layout:text:0", "layout:text-share:50"]
    assert ours(b"From: a@example.com\n\nhi\n", only(layout_signals=True)) == ["layout:plain-only"]


def test_style_script_and_hidden_text_are_not_visible_text():
    raw = (b"From: a@example.com\nContent-Type: text/html\n\n"
           b"<style>p {color: red; margin: 0; padding: 0}</style><p>hi</p>"
           b'<div style="display:none">hash buster words</div>\n')
    assert ours(raw, only(layout_signals=True)) == [
        "layout:html-only", "layout:text:0", "layout:text-share:0"]
    # The same page with its words shown: 17 visible characters of 110.
    raw = raw.replace(b'style="display:none"', b"")
    assert ours(raw, only(layout_signals=True))[-1] == "layout:text-share:10"


def test_defaults_emit_layout_only_and_hostile_input_is_bounded():
    assert ours(PHISH, DEFAULT_CONFIG) == ours(PHISH, only(layout_signals=True)) == [
        "layout:html-only", "layout:text:0", "layout:text-share:20"]
    many = b"From: a@example.com\nContent-Type: text/html\n\n" + b'<a href="http://x.example/">y</a>' * 5000
    t = ours(many)
    assert "link:count:128" in t  # capped at 200 links
    # An unclosed <a tag, repeated: no link (and linear work: the patterns do not nest).
    t = ours(b"From: a@example.com\nContent-Type: text/html\n\n" + b"<a href=x " * 20000)
    assert not [x for x in t if x.startswith("link:")]
    msg, _ = mime.parse(b"From: nobody\n\nhi\n")
    assert signals.from_domain(msg) is None
    assert signals.sender_tokens(msg) == []


def test_url_path_words_keeps_only_word_pieces():
    raw = (b"From: a@example.com\nContent-Type: text/html\n\n"
           b'<a href="http://x.example/c/3/AbCdEfGhIjKlMnOpQrStUvWxYz/unsubscribe.php?id=77">x</a>'
           b" see http://y.example/track/12ab\n")
    on = [t for t in tokenize(raw, TokenizerConfig(url_path_words=True)) if t.startswith("url:")]
    assert on == ["url:proto:http", "url:x.example", "url:path:unsubscribe", "url:path:php",
                  "url:proto:http", "url:y.example", "url:path:track"]
    off = [t for t in tokenize(raw) if t.startswith("url:path:")]
    assert {"url:path:c", "url:path:3", "url:path:skip:a 20", "url:path:77", "url:path:12ab"} <= set(off)
    # Only url:path: tokens are filtered: words and other namespaces stay.
    assert signals.path_words(["c", "url:path:id", "img:x.example", "url:path:www"]) == [
        "c", "img:x.example", "url:path:www"]


def test_fold_web_schemes():
    raw = (b"From: a@example.com\nContent-Type: text/html\n\n"
           b'<a href="https://x.example/">x</a> <img src="https://y.example/i.png"> ftp://z.example/f\n')
    t = [x for x in tokenize(raw, TokenizerConfig(fold_web_schemes=True)) if "proto:" in x]
    assert t == ["url:proto:web", "img:proto:https", "url:proto:ftp"]  # images keep theirs
    assert "url:proto:https" in tokenize(raw)


def test_a_model_file_from_before_the_settings_keeps_its_tokens():
    added = ("sender_signals", "link_signals", "layout_signals", "url_path_words", "fold_web_schemes",
             "exclaim_signals", "style_signals")
    old = {k: v for k, v in TokenizerConfig().to_dict().items() if k not in added}
    config = TokenizerConfig.from_dict(old)
    assert not any(getattr(config, k) for k in added)
    assert ours(PHISH, config) == [] and not [t for t in tokenize(PHISH, config) if t.startswith("punct:")]
    assert TokenizerConfig.from_dict(ALL_ON.to_dict()) == ALL_ON


def test_exclaim_token_counts_visible_marks_only():
    config = only(exclaim_signals=True)
    raw = (b"From: a@example.com\nSubject: Hi!!!\nContent-Type: text/html\n\n"
           b'<p>Act now! Free!!</p><div style="display:none">!!!!!!!!</div><a href="http://x.example/!">x</a>\n')
    assert [t for t in tokenize(raw, config) if t.startswith("punct:")] == ["punct:excl:2"]
    assert "punct:excl:0" in tokenize(b"From: a@example.com\n\nhello\n", config)
    assert "punct:excl:8" in tokenize(b"From: a@example.com\n\n" + b"Buy! " * 40, config)
    attachment = b"From: a@example.com\nContent-Type: application/pdf\n\n%PDF!!!\n"
    assert not [t for t in tokenize(attachment, config) if t.startswith(("punct:", "layout:"))]
    assert [t for t in tokenize(raw) if t.startswith("punct:")] == ["punct:excl:2"]  # a default
    assert not [t for t in tokenize(raw, TokenizerConfig(exclaim_signals=False)) if t.startswith("punct:")]


def test_style_tokens_read_accents_and_the_subjects_currency_in_any_script():
    config = only(style_signals=True)

    def style(raw):
        return [t for t in tokenize(raw, config) if t.startswith("style:")]

    german = ("From: a@example.com\nSubject: =?utf-8?q?Gr=C3=BC=C3=9Fe_=E2=82=AC50_und_=2450?=\n"
              "Content-Type: text/html; charset=utf-8\n\n<p>Bitte best\u00e4tigen Sie Ihr Konto.</p>"
              "<div style=\"display:none\">\u00e4\u00e4\u00e4\u00e4\u00e4\u00e4</div>\n").encode()
    # Visible text only (not the hidden div): 1 accented letter of 26 (3%, bucket 2);
    # Subject: 2 of 8 letters (25%, bucket 16) and two currency signs (EUR and $).
    assert style(german) == ["style:accents:2", "style:subject:accents:16", "style:subject:money:2"]
    # Other scripts are not accents (trec06c-dev's Chinese ham and spam alike), nor
    # are a few accents in a long English text missed: bucket 0.
    assert style("From: a@example.com\nSubject: \u4f60\u597d\n\n\u4f60\u597d \u041c\u043e\u0441\u043a\u0432\u0430\n".encode()) == []
    assert style(("From: a@example.com\n\nCaf\u00e9 " + "plain words " * 60).encode("utf-8")) == [
        "style:accents:0"]
    # The Subject is not read when the configuration skips it; no text, no body token.
    skipped = TokenizerConfig(**{**OFF, "style_signals": True, "skip_headers": ("subject",)})
    assert [t for t in tokenize(german, skipped) if t.startswith("style:")] == ["style:accents:2"]
    assert style(b"From: a@example.com\nSubject: $$$ cash\nContent-Type: application/pdf\n\n%PDF\n") == [
        "style:subject:money:2"]
    assert not [t for t in tokenize(german) if t.startswith("style:")]  # off by default
