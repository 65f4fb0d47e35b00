"""spamass-milter in front of a real Postfix, against ``spamnb serve --spamd``.

Runs ``tools/harnesses/postfix_milter.py``'s exchange with the small test model: with
``-r -1`` and ``-r 3`` the spam is refused at SMTP time and the ham (also one
carrying a forged verdict) accepted; without ``-m`` both bodies come through
byte for byte. Needs root, Postfix and spamass-milter, installed or unpacked
(``python tools/harnesses/postfix_milter.py --unpack``); ``scripts/test.sh`` installs
neither (Postfix would remove Exim, and both packages start services) but, as
root, unpacks both; the test is skipped, with the reason, where they are not there.
"""

from __future__ import annotations

import sys

import pytest

from conftest import ROOT
from test_fastpath import compiled  # noqa: F401 (a fixture)
from test_spamd import spam_and_ham  # noqa: F401 (a fixture)

sys.path.insert(0, str(ROOT))
from tools.harnesses import postfix_milter, postfix_spamc  # noqa: E402

try:
    FOUND = postfix_spamc.find_postfix(), postfix_milter.find_milter()
    WHY_NOT = ""
except postfix_spamc.Unavailable as e:
    FOUND, WHY_NOT = None, str(e)


@pytest.mark.slow  # about 40 s: a private Postfix and spamass-milter, each -r level; .ci/run runs it
@pytest.mark.skipif(FOUND is None, reason=f"{WHY_NOT}; test.sh unpacks Postfix and spamass-milter only as "
                                          "root (installing Postfix would remove another MTA)")
def test_spamass_milter_rejects_spam_at_the_level_and_keeps_bodies(compiled, spam_and_ham):  # noqa: F811
    spam, ham = spam_and_ham
    transcript = []
    pf, milter = FOUND
    problems = postfix_milter.run(compiled, ham, spam, postfix=pf, milter=milter, out=transcript.append)
    text = "\n".join(transcript)
    assert problems == [], text
    note = "short note: spamnb's own CHECK" in text  # when the model scores it near 0
    # -r -1 and -r 3 (and -r 0 the short note, when the milter reads its S as 0 or more)
    assert text.count("-> 550 5.7.1 Blocked by SpamAssassin") in ((2, 3) if note else (2,))
    # ham x3, forged ham, spam below the level, without -m a ham starting with blank lines
    # and a spam (and the short note with -r -1)
    assert text.count("every other byte as sent") == 7 + note
    assert "added by spamnb:    X-Spam-Flag: YES" in text
    assert "the milter dropped the blank lines the body started with" in text


def test_leading_blank_lines_dropped_is_only_that():
    sent = b"Subject: s\r\n\r\n\r\n\r\nbody\r\n"
    assert postfix_milter.leading_blank_lines_dropped(b"Subject: s\nX: y\n\nbody\n", sent)
    assert not postfix_milter.leading_blank_lines_dropped(b"Subject: s\n\nbodY\n", sent)
    assert not postfix_milter.leading_blank_lines_dropped(b"Subject: s\n\nbody\n", b"Subject: s\n\nbody\n")


@pytest.mark.slow  # about 30 s: two private Postfix instances in front of spamnb serve --milter; .ci/run runs it
@pytest.mark.skipif(FOUND is None, reason=f"{WHY_NOT}; test.sh unpacks Postfix only as root (installing Postfix "
                                          "would remove another MTA)")
def test_spamnbs_own_milter_tags_refuses_and_keeps_bodies(compiled, spam_and_ham):  # noqa: F811
    from tools.harnesses import postfix_own_milter

    spam, ham = spam_and_ham
    transcript = []
    problems = postfix_own_milter.run(compiled, ham, spam, postfix=FOUND[0], out=transcript.append)
    text = "\n".join(transcript)
    assert problems == [], text
    # tagging: ham, spam, both starting with blank lines, the forged ham, the ham after the garbage;
    # refusing: the ham
    assert text.count("every other byte as sent") == 7, text
    assert text.count("added by spamnb:    X-Spam-Flag: YES") == 2
    assert text.count("-> 550 5.7.1 Message refused as spam by spamnb") == 1
    assert "a packet claiming 2 GiB sent to the milter's port: closed" in text
