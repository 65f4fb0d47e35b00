"""Exim's ``spam =`` ACL condition against ``spamnb serve --spamd``.

Runs the core of ``tools/harnesses/exim_spamd.py`` with the small test model: a real
Exim (Debian's ``exim4-daemon-heavy``) with a private ``-C`` configuration,
one SMTP session per message, the ham delivered to a maildir with the headers
Exim wrote from spamnb's answer, the spam refused with 550 by the ACL. Skipped,
with the reason, where Exim is not installed or has no content scanning.
"""

from __future__ import annotations

import sys

import pytest

from conftest import ROOT
from test_fastpath import compiled  # noqa: F401 (a fixture)
from test_spamd import spam_and_ham  # noqa: F401 (a fixture)

sys.path.insert(0, str(ROOT))
try:
    from tools.harnesses import exim_spamd
finally:
    sys.path.remove(str(ROOT))

try:
    EXIM = exim_spamd.find_exim()
    WHY_NOT = ""
except exim_spamd.Unavailable as e:
    EXIM, WHY_NOT = None, str(e)


@pytest.mark.skipif(EXIM is None, reason=f"{WHY_NOT} (apt-get install exim4-daemon-heavy)")
def test_exim_spam_acl_delivers_ham_and_refuses_spam(compiled, spam_and_ham):  # noqa: F811
    spam, ham = spam_and_ham
    transcript = []
    problems = exim_spamd.run(compiled, ham, spam, exim=EXIM, out=transcript.append)
    text = "\n".join(transcript)
    assert problems == [], text
    assert "-> 550 spam (spamnb score" in text
    assert "X-Spam-Report: spamnb" in text


def test_as_sent_drops_the_mbox_line_and_uses_crlf():
    assert exim_spamd.as_sent(b"From a@b  Mon Sep 2 2002\nSubject: x\n\nhi\n") == b"Subject: x\r\n\r\nhi\r\n"
    assert exim_spamd.as_sent(b"Subject: x\r\n\r\nhi\r\n") == b"Subject: x\r\n\r\nhi\r\n"


def test_config_names_spamd_and_the_acl():
    conf = exim_spamd.exim_config(ROOT, 2525, 7830, "alice", "users")
    assert "spamd_address = 127.0.0.1 7830" in conf
    assert "exim_user = alice\nexim_group = users" in conf
    assert "deny   spam       = nobody\n" in conf
