"""spamnb's own milter in front of a real Sendmail, through docs/admin.md's line.

Runs ``tools/harnesses/sendmail_own_milter.py``'s exchange with the small test model:
a private Sendmail whose ``sendmail.mc`` holds the page's ``INPUT_MAIL_FILTER`` line
as written (read by tests/docsnippets.py, its port a free one), in front of
``spamnb serve --milter``; the ham and the spam delivered with ``X-Spam-Status``,
the spam with ``X-Spam-Flag: YES``, bodies byte for byte; with ``--milter-reject``
the spam refused with 550 at the end of DATA. Needs root and Sendmail, installed or
unpacked (``python tools/harnesses/sendmail_own_milter.py --unpack-only``, which
``scripts/test.sh`` runs as root: installing Debian's sendmail would remove the other
MTA and start a system one); skipped, with the reason, where they are not there.
"""

from __future__ import annotations

import sys

import pytest

from conftest import ROOT
from test_fastpath import compiled  # noqa: F401 (a fixture)
from test_spamd import spam_and_ham  # noqa: F401 (a fixture)

sys.path.insert(0, str(ROOT))
from tools.harnesses import sendmail_own_milter  # noqa: E402

try:
    FOUND = sendmail_own_milter.find_sendmail()
    WHY_NOT = ""
except sendmail_own_milter.Unavailable as e:
    FOUND, WHY_NOT = None, str(e)


@pytest.mark.slow  # about 5 s: two private Sendmail daemons in front of spamnb serve --milter; .ci/run runs it
@pytest.mark.skipif(FOUND is None, reason=f"{WHY_NOT}; test.sh unpacks Sendmail only as root (installing it "
                                          "would remove another MTA)")
def test_sendmail_with_the_docs_line_tags_refuses_and_keeps_bodies(compiled, spam_and_ham):  # noqa: F811
    spam, ham = spam_and_ham
    transcript = []
    try:
        problems = sendmail_own_milter.run(compiled, ham, spam, sendmail=FOUND, out=transcript.append)
    except sendmail_own_milter.Unavailable as e:  # found, but it does not run here (a library, a namespace)
        pytest.skip(str(e))
    text = "\n".join(transcript)
    assert problems == [], text
    assert "sendmail.mc: INPUT_MAIL_FILTER(`spamnb', `S=inet:" in text
    # tagging: ham, spam, spam starting with blank lines, the forged ham; refusing: the ham
    assert text.count("every other byte as sent") == 5, text
    assert text.count("added by spamnb:    X-Spam-Flag: YES") == 2
    assert text.count("added by spamnb:    X-Spam-Status: ") == 5
    assert text.count("-> 550 5.7.1 Message refused as spam by spamnb") == 1
    assert "name Sendmail's queue ids: 4 of 4" in text and "name Sendmail's queue ids: 1 of 1" in text
