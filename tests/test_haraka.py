"""Haraka's ``spamassassin`` plugin against ``spamnb serve --spamd``.

Runs the core of ``tools/harnesses/haraka_spamd.py`` with the small test model: a real
Haraka (the npm install that script caches in ``~/.cache/spamnb-peers/haraka``;
this test never downloads it), ``config/spamassassin.ini`` with
``reject_threshold=7`` and ``relay_reject_threshold=7``, one SMTP session per
message: the ham queued with Haraka's ``X-Spam-*`` headers carrying spamnb's
score, the highest-scoring sample spam refused with 550 (and from a relaying
client), a spam between T and 7 accepted but flagged. Skipped, with the reason,
where node is missing or Haraka is not cached (``python tools/harnesses/haraka_spamd.py``
caches it once, from npm).
"""

from __future__ import annotations

import sys

import pytest

from conftest import ROOT
from test_fastpath import compiled  # noqa: F401 (a fixture)

sys.path.insert(0, str(ROOT))
try:
    from tools.harnesses import haraka_spamd
finally:
    sys.path.remove(str(ROOT))

# found now: the tests' HOME and XDG_CACHE_HOME are private folders (conftest)
PREFIX = haraka_spamd.cached()
try:
    haraka_spamd.find_node()
    WHY_NOT = "" if PREFIX else (
        f"Haraka {haraka_spamd.HARAKA_VERSION} is not cached in {haraka_spamd.cache_dir()} and the test"
        " suite downloads nothing: run `python tools/harnesses/haraka_spamd.py` once (npm install)")
except haraka_spamd.Unavailable as e:
    WHY_NOT = str(e)


@pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)
def test_haraka_spamassassin_plugin_queues_ham_flags_and_rejects_spam(compiled):  # noqa: F811
    transcript = []
    problems = haraka_spamd.run(compiled, out=transcript.append, prefix=PREFIX)
    text = "\n".join(transcript)
    assert problems == [], text
    assert "reject_threshold=7" in text and "relay_reject_threshold=7" in text
    assert "X-Spam-Status: No, score=" in text
    if "\nrejected: " in text:  # a sample spam scores 7 or more with this model
        assert "-> 550 spam score exceeded threshold" in text
        assert "-> 550 spam score exceeded relay threshold" in text


def test_config_names_spamd_and_the_thresholds(tmp_path):
    haraka_spamd.haraka_config(tmp_path, 2525, 7830)
    ini = (tmp_path / "config" / "spamassassin.ini").read_text().splitlines()
    assert "spamd_socket=127.0.0.1:7830" in ini
    assert "reject_threshold=7" in ini and "relay_reject_threshold=7" in ini
    assert (tmp_path / "config" / "smtp.ini").read_text() == "listen=127.0.0.1:2525\n"
    plugins = (tmp_path / "config" / "plugins").read_text().split()
    assert plugins.index("spamassassin") < plugins.index("spamnb_queue_file")


def test_result_line_is_read_from_harakas_log(tmp_path):
    log = tmp_path / "haraka.log"
    log.write_text('2026-12-01T18:13:55Z [INFO] [X.1] [spamassassin] status=Yes, score=21.0, required=2.9,'
                   ' reject=7, tests="undefined"\n')
    assert haraka_spamd.haraka_results(log, 0) == ['status=Yes, score=21.0, required=2.9, reject=7, tests="undefined"']
