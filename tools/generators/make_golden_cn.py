#!/usr/bin/env python3
"""Write the project's own Chinese golden messages, tests/golden/cn_*.eml.

The tokenizer's golden files need Chinese mail in the shapes real Chinese mail
takes (GB2312 and GBK bodies, RFC 2047 encoded words in GBK, a multipart whose
boundary was lost, a header block broken in two, base64 that is not base64).
The TREC 2006 Chinese corpus has such mail but may not be published, so these
messages are written here, in the project's own words: the text below is
UTF-8 and readable; this script does the encoding (which is what the tests
are about) byte for byte and reproducibly. Names, addresses and numbers are
made up: example domains (RFC 2606), documentation IP ranges (RFC 5737),
555 telephone numbers.

    python3 tools/generators/make_golden_cn.py           # rewrite tests/golden/cn_*.eml
    python3 tools/generators/make_golden_cn.py --check   # exit 1 if a file would change
    python3 tools/generators/regen_golden.py             # then their .tokens files

``--check`` rewrites nothing and exits 1 if any .eml file differs from what
this script writes (tests/test_tokenizer.py runs it).
"""

import argparse
import base64
import pathlib
import sys

GOLDEN = pathlib.Path(__file__).resolve().parents[2] / "tests" / "golden"


def b_word(text, charset):
    """An RFC 2047 "B" encoded word."""
    return "=?%s?B?%s?=" % (charset, base64.b64encode(text.encode(charset.lower())).decode("ascii"))


def q_word(text, charset):
    """An RFC 2047 "Q" encoded word (every byte outside letters and digits as =XX)."""
    raw = text.encode(charset.lower())
    body = "".join(chr(b) if chr(b).isascii() and chr(b).isalnum() else "=%02X" % b for b in raw)
    return "=?%s?Q?%s?=" % (charset, body)


def b64_body(text, charset):
    """A base64 body, 76 characters a line, as mail programs write it."""
    enc = base64.b64encode(text.encode(charset)).decode("ascii")
    return "".join(enc[i:i + 76] + "\n" for i in range(0, len(enc), 76))


def message(headers, body, charset):
    """Header lines (ASCII) and a body encoded with ``charset`` (None: the body
    is ASCII already, e.g. base64)."""
    head = "".join(line + "\n" for line in headers).encode("ascii")
    return head + b"\n" + (body.encode(charset) if charset else body.encode("ascii"))


# -- the messages -----------------------------------------------------------------------------

def ham_gbk_lost_boundary():
    """Ham: a GB2312 encoded-word subject; a multipart/alternative whose
    boundary never occurs, so the body is one undeclared 8-bit GBK text
    (with characters GB2312 lacks: 喆, 堃)."""
    headers = [
        "Return-Path: <lin.xiaoyu@example.edu>",
        "Received: from mail.example.edu (mail.example.edu [198.51.100.23])",
        "\tby mx.example.org (8.13.1/8.13.1) with ESMTP id k2E0815A012345",
        "\tfor <zhao@example.org>; Tue, 14 Mar 2006 08:15:02 +0800",
        "Message-ID: <000c01c64700$1a2b3c40$6401a8c0@lab>",
        'From: "lin" <lin.xiaoyu@example.edu>',
        "To: zhao@example.org",
        "Subject: " + b_word("Re: 周五组会改到下午三点", "gb2312"),
        "Date: Tue, 14 Mar 2006 08:14:40 +0800",
        "MIME-Version: 1.0",
        "Content-Type: multipart/alternative;",
        '\tboundary="----=_NextPart_000_0007_01C64743.2A3B4C50"',
        "X-Priority: 3",
        "X-Mailer: Microsoft Outlook Express 6.00.2900.2180",
    ]
    body = (
        "赵老师：\n"
        "\n"
        "    您好！这周五的组会改到下午三点，地点还是实验楼二〇三室。\n"
        "    上周的测量记录我已经整理好了，喆明补做的两组数据，也放进去了，\n"
        "会前发到您的邮箱。\n"
        "    另外，堃华想借用一下实验室的打印机，他要打印开题报告，\n"
        "不知道方便不方便？\n"
        "\n"
        "                                        小林\n"
        "                                        三月十四日\n"
    )
    return message(headers, body, "gbk")


def ham_broken_headers():
    """Ham: the continuation of a folded Received line lost its indent, so the
    parser ends the header block there and reads the rest of the headers
    (Subject, the GB2312 Content-Type) as body: an undeclared GB2312 body."""
    headers = [
        "Return-Path: <chen.jing@example.net>",
        "Received: from example.net (localhost.localdomain [127.0.0.1])",
        "        by localhost.localdomain (8.12.8/8.12.8) with ESMTP id",
        "k2F9Q1aB004321        for <wu@example.org>; Wed, 15 Mar 2006 17:26:01 +0800",
        "Received: from 203.0.113.45 ([203.0.113.45])",
        "        by mail.example.org (Postfix) with ESMTP id 5C1E22A03F",
        "        for <wu@example.org>; Wed, 15 Mar 2006 17:25:48 +0800 (CST)",
        "Message-ID: <20060315172548.5C1E22A03F@mail.example.org>",
        "Date: Wed, 15 Mar 2006 17:25:40 +0800",
        'From: "chen jing" <chen.jing@example.net>',
        "To: wu@example.org",
        "Subject: " + b_word("周六去香山的安排", "gb2312"),
        "X-Mailer: Foxmail 6.0 [cn]",
        "Mime-Version: 1.0",
        "Content-Type: text/plain;",
        '        charset="GB2312"',
        "Content-Transfer-Encoding: 8bit",
    ]
    body = (
        "小吴：\n"
        "\n"
        "    周六早上七点半在学校东门集合，一起坐公交去香山。\n"
        "    中午在山顶野餐，每人带一样吃的就行，我带水果。\n"
        "    天气预报说下午可能有小雨，记得带伞。\n"
        "    回来以后一起去吃火锅，位子已经订好了。\n"
        "\n"
        "陈静\n"
    )
    return message(headers, body, "gb2312")


def spam_gb2312():
    """Spam: a raw 8-bit GB2312 body declared as such; GB2312 encoded words in
    From and Subject; a link whose path is Chinese."""
    headers = [
        "Return-Path: <peixun@example.com>",
        "Received: from example.com ([198.51.100.77])",
        "\tby mx.example.org (Postfix) with ESMTP id 7A0D51B2C4",
        "\tfor <sun@example.org>; Thu, 16 Mar 2006 10:03:12 +0800 (CST)",
        "Message-ID: <200603161003.7A0D51B2C4@mx.example.org>",
        "From: " + b_word("华北企业管理培训中心", "GB2312") + " <peixun@example.com>",
        "Subject: " + b_word("三月管理培训班开始报名", "gb2312"),
        "To: sun@example.org",
        'Content-Type: text/plain;charset="GB2312"',
        "Reply-To: peixun@example.com",
        "Date: Thu, 16 Mar 2006 10:14:55 +0800",
        "X-Priority: 2",
        "X-Mailer: Microsoft Outlook Express 6.00.2600.0000",
    ]
    body = (
        "尊敬的企业负责人：\n"
        "    您好！本中心三月开办企业管理培训班，名师授课，学完发证书。\n"
        "    课程包括：财务管理、市场营销、人力资源、团队建设。\n"
        "    详细课程表请看 http://www.example.com/课程/三月.htm\n"
        "    报名电话：010-55550123　传真：010-55550124\n"
        "    名额有限，报满为止！\n"
        "\n"
        "                              华北企业管理培训中心\n"
        "                                  2006年3月\n"
    )
    return message(headers, body, "gb2312")


def spam_gbk_rfc2047():
    """Spam: GBK encoded words (B in Subject, Q in From) with characters GB2312
    lacks; a blank line inside the folded Subject ends the header block, so
    the second encoded word and the Content-Type become body: undeclared
    8-bit GBK HTML."""
    headers = [
        "Return-Path: <shop@example.net>",
        "Received: from example.net ([203.0.113.9])",
        "\tby mx.example.org (Postfix) with ESMTP id 3F9A0C71E2",
        "\tfor <li@example.org>; Fri, 17 Mar 2006 21:40:05 +0800 (CST)",
        "Message-ID: <200603172140.3F9A0C71E2@mx.example.org>",
        "To: li@example.org",
        "From: " + q_word("數碼商城", "gbk") + " <shop@example.net>",
        "Subject: " + b_word("限時特價，數碼相機只要九百九十九元", "GBK"),
    ]
    body = (
        "\n"
        " " + b_word("貨到付款", "GBK") + "\n"
        'Content-Type: text/html;charset="GBK"\n'
        "Content-Transfer-Encoding: 8bit\n"
        "Reply-To: service@example.net\n"
        "Date: Fri, 17 Mar 2006 21:52:30 +0800\n"
        "X-Mailer: Foxmail 5.0 [cn]\n"
        "\n"
        "<html><head><title>數碼商城</title></head>\n"
        "<body>\n"
        "<p><font color=red size=5>全場八折，貨到付款！</font></p>\n"
        "<p>新款數碼相機、手機、隨身聽，全部正品行貨，保修一年。</p>\n"
        '<p>訂購熱線：020-55550188　網址：<a href="http://shop.example.net/cu/">shop.example.net</a></p>\n'
        "</body></html>\n"
    )
    return message(headers, body, "gbk")


def spam_base64_lying():
    """Spam: says base64, but the body is raw 8-bit GB2312 (decoded somewhere on
    the way, the header left as it was): read as 8-bit text."""
    headers = [
        "Return-Path: <zulin@example.com>",
        "Received: from smtp.example.com (smtp.example.com [192.0.2.61])",
        "\tby mx.example.org (Postfix) with ESMTP id 9E2B40D3A1",
        "\tfor <zhou@example.org>; Sat, 18 Mar 2006 09:12:40 +0800 (CST)",
        "From: " + b_word("王先生", "gb2312") + " <zulin@example.com>",
        "To: zhou@example.org",
        "Subject: " + b_word("市中心写字楼出租", "gb2312"),
        "Date: Sat, 18 Mar 2006 09:20:13 +0800",
        "X-Priority: 3",
        "MIME-Version: 1.0",
        "X-Mailer: XMail-3.0",
        "Content-Type: text/plain;",
        '\tcharset="gb2312"',
        "Content-Transfer-Encoding: base64",
        "Message-Id: <20060318011240.9E2B40D3A1@smtp.example.com>",
    ]
    body = (
        "各位老板：\n"
        "\n"
        "    市中心商务区写字楼招租，交通方便，离地铁站步行五分钟。\n"
        "    面积从八十平方米到六百平方米，可以按需分割。\n"
        "    价格：每平方米每天三元起，物业费另计。\n"
        "    免费停车，二十四小时保安，中央空调。\n"
        "\n"
        "看房请联系王先生：139-5555-0162\n"
        "电子邮件：zulin@example.com\n"
    )
    return message(headers, body, "gb2312")


def spam_base64():
    """Spam: multipart/alternative, a text and an HTML part, each base64 of GBK
    text declared charset="gbk" (GBK-only characters: 們, 裝, 貨, 臺, ...)."""
    boundary = "=_part_20060319_4412"
    text = (
        "各位朋友們好：\n"
        "    本公司常年批發原裝手機，全部正品，價格比商場低三成。\n"
        "    一臺起批，全國貨到付款，壞機包換。\n"
        "    詳情請看：http://www.example.net/shouji/\n"
        "    聯繫電話：0755-5555-0199\n"
    )
    html = (
        "<html><body>\n"
        "<p>各位朋友們好：</p>\n"
        "<p>本公司常年批發<b>原裝手機</b>，全部正品，價格比商場低三成。</p>\n"
        "<p><font color=#ff0000>一臺起批，全國貨到付款，壞機包換。</font></p>\n"
        '<p>詳情請看：<a href="http://www.example.net/shouji/">www.example.net</a></p>\n'
        '<img src="http://img.example.net/shouji/1.jpg" width=300 height=200>\n'
        "</body></html>\n"
    )
    headers = [
        "Return-Path: <sales@example.net>",
        "Received: from mail.example.net (mail.example.net [198.51.100.140])",
        "\tby mx.example.org (Postfix) with ESMTP id 1D4E6F0B27",
        "\tfor <he@example.org>; Sun, 19 Mar 2006 14:05:51 +0800 (CST)",
        "Message-ID: <1142748351.4412@mail.example.net>",
        "From: " + b_word("手機批發", "gbk") + " <sales@example.net>",
        "To: he@example.org",
        "Subject: " + b_word("原裝手機批發，貨到付款", "gbk"),
        "Date: Sun, 19 Mar 2006 14:05:51 +0800",
        "MIME-Version: 1.0",
        "Content-Type: multipart/alternative;",
        '\tboundary="%s"' % boundary,
    ]
    body = (
        "--%s\n" % boundary
        + 'Content-Type: text/plain; charset="gbk"\n'
        + "Content-Transfer-Encoding: base64\n\n"
        + b64_body(text, "gbk")
        + "\n--%s\n" % boundary
        + 'Content-Type: text/html; charset="gbk"\n'
        + "Content-Transfer-Encoding: base64\n\n"
        + b64_body(html, "gbk")
        + "\n--%s--\n" % boundary
    )
    return message(headers, body, None)


MESSAGES = {
    "cn_ham_gbk_lost_boundary": ham_gbk_lost_boundary,
    "cn_ham_broken_headers": ham_broken_headers,
    "cn_spam_gb2312": spam_gb2312,
    "cn_spam_gbk_rfc2047": spam_gbk_rfc2047,
    "cn_spam_base64_lying": spam_base64_lying,
    "cn_spam_base64": spam_base64,
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only report differences")
    ap.add_argument("--out", type=pathlib.Path, default=GOLDEN, help="folder to write (default tests/golden)")
    args = ap.parse_args(argv)
    changed = []
    for name, make in MESSAGES.items():
        target = args.out / (name + ".eml")
        data = make()
        if not target.exists() or target.read_bytes() != data:
            changed.append(target.name)
            if not args.check:
                target.write_bytes(data)
    verb = "differ" if args.check else "written"
    print("%d message(s) %s%s" % (len(changed), verb, (": " + ", ".join(changed)) if changed else ""))
    return 1 if (args.check and changed) else 0


if __name__ == "__main__":
    sys.exit(main())
