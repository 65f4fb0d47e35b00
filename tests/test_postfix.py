"""Postfix's spamc content filter (``master.cf``) against ``spamnb serve --spamd``.

Runs the core of ``tools/harnesses/postfix_spamc.py`` with the small test model: a
private Postfix instance (``postfix -c DIR``) whose smtpd hands each message to
a ``pipe`` service running ``spamc -e sendmail``, the ham and the spam delivered
to a maildir with spamnb's ``X-Spam-Status`` (and ``X-Spam-Flag`` on the spam),
every other byte as sent. Needs root
and a Postfix: the installed package, or the package unpacked
(``python tools/harnesses/postfix_spamc.py --unpack`` or ``SPAMNB_POSTFIX_ROOT``).
``scripts/test.sh`` does not install it: on Debian postfix conflicts with every
other MTA (it would remove exim4-daemon-heavy, which tests/test_exim.py needs)
and its postinst starts a system Postfix where it can; as root it unpacks it
(``tools/harnesses/postfix_milter.py --unpack-only``); so the test is skipped, with the
reason, where there is none.
"""

from __future__ import annotations

import sys

import pytest

from conftest import ROOT
from test_fastpath import compiled  # noqa: F401 (a fixture)
from test_spamd import spam_and_ham  # noqa: F401 (a fixture)

sys.path.insert(0, str(ROOT))
try:
    from tools.harnesses import postfix_spamc
finally:
    sys.path.remove(str(ROOT))

try:
    POSTFIX = postfix_spamc.find_postfix()
    WHY_NOT = ""
except postfix_spamc.Unavailable as e:
    POSTFIX, WHY_NOT = None, str(e)


@pytest.mark.slow  # about 13 s: a private Postfix started for it
@pytest.mark.skipif(POSTFIX is None, reason=f"{WHY_NOT}; test.sh does not install postfix (it would remove "
                                            "another MTA and may start a system Postfix)")
def test_postfix_content_filter_flags_ham_and_spam(compiled, spam_and_ham):  # noqa: F811
    spam, ham = spam_and_ham
    transcript = []
    problems = postfix_spamc.run(compiled, ham, spam, postfix=POSTFIX, out=transcript.append)
    text = "\n".join(transcript)
    assert problems == [], text
    assert "added by spamnb:    X-Spam-Status: No, score=" in text
    assert "added by spamnb:    X-Spam-Flag: YES" in text
    assert "status=sent (delivered via spamnb service)" in text
    assert text.count("every other byte as sent") == 2


def test_master_cf_has_the_filter_and_its_pipe():
    cf = postfix_spamc.master_cf(2525, 7830, ROOT)
    assert "127.0.0.1:2525 inet n - n - - smtpd -o content_filter=spamnb:dummy" in cf
    assert "pipe user=nobody argv=/usr/bin/spamc -d 127.0.0.1 -p 7830 -u ${user} -e " in cf
    assert "-oi -f ${sender} ${recipient}" in cf


def test_split_added_sets_aside_postfix_and_spamnb_fields():
    sent = b"Return-Path: <a@b>\nReceived: old\nSubject: x\n\nbody\n"
    got = (b"Return-Path: <e@f>\nDelivered-To: bob@x\nReceived: by mx\n\tid 1\n"
           b"Received: old\nSubject: x\nX-Spam-Status: No, score=-3.00 required=2.94 tests=SPAMNB_HAM x=1\n\nbody\n")
    on_top, spamnb, dropped, left, expected = postfix_spamc.split_added(got, sent)
    assert on_top == [b"Return-Path: <e@f>", b"Delivered-To: bob@x", b"Received: by mx\n\tid 1"]
    assert spamnb == [b"X-Spam-Status: No, score=-3.00 required=2.94 tests=SPAMNB_HAM x=1"]
    assert dropped == [b"Return-Path: <a@b>"]
    assert left == expected == b"Received: old\nSubject: x\n\nbody\n"
    problems = []
    postfix_spamc.check_delivered("ham", got, sent, problems, lambda _: None)
    assert problems == []
    postfix_spamc.check_delivered("ham", got.replace(b"body", b"bodY"), sent, problems, lambda _: None)
    assert len(problems) == 1 and "differs" in problems[0]
    problems = []
    postfix_spamc.check_delivered("ham", got.replace(b"\nX-Spam", b"\nX-Spam-Flag: YES\nX-Spam"), sent, problems,
                                  lambda _: None)
    assert problems == ["ham: X-Spam-Flag [b'YES'], expected []"]
