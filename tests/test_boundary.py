"""The delivery paths' one failure boundary (spamnb.verdict.Boundary), with real files.

Whatever goes wrong once ``spamnb filter`` has read the message -- a damaged model, a
configuration it cannot read -- the message comes out unchanged or filtered, never
lost: exit status 3 (0 with ``--exit-zero``), one line on stderr, no traceback. Each
damage goes through the fast path, the click command and a running ``spamnb serve``.
A malformed value in a Redis store: tests/test_redis_store.py. imap filter: test_imap.py.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from conftest import sample_message
from spamnb.storage import journal, scorer
from spamnb.verdict import Boundary, failure_reason
from test_e2e import SPAMNB
from test_fastpath import compiled  # noqa: F401 - the fixture: a private model with its scorer
from test_server import start_server


def filter_(*args, input, env=None):
    return subprocess.run(SPAMNB + ["filter", *map(str, args)], input=input, capture_output=True, timeout=120,
                          env=env)


def one_line(stderr: bytes) -> bool:
    return stderr.count(b"\n") == 1 and b"Traceback" not in stderr


def damage(path, how):
    """Damage the model at ``path``: its snapshot cut in half, its journal (one learned
    message) followed by a line of garbage, or its scorer replaced by garbage."""
    if how == "truncated-snapshot":
        data = path.read_bytes()
        path.write_bytes(data[:len(data) // 2])
    elif how == "garbage-journal":
        r = subprocess.run(SPAMNB + ["learn", "--spam", "--model", str(path), str(sample_message("ham", 2))],
                           capture_output=True, timeout=120)
        assert r.returncode == 0 and os.path.exists(journal.journal_path(path)), r.stderr
        with open(journal.journal_path(path), "ab") as f:
            f.write(b"this is no journal record\n")
    else:
        scorer_file = scorer.scorer_path(path)
        os.chmod(scorer_file, 0o600)
        with open(scorer_file, "wb") as f:
            f.write(b"SPAMNBSC\x02\x00\x00\x00\x10\x00\x00\x00" + b'{"n": 0, "m": 0}' + b"garbage")


def verdict_or_unchanged(r, raw, exit_zero):
    """The filter's answer is a verdict (the damage is one spamnb repairs or ignores) or the
    message unchanged with the failure's status: never empty, never a traceback."""
    assert b"Traceback" not in r.stderr, r.stderr
    if r.stdout == raw:
        assert r.returncode == (0 if exit_zero else 3) and one_line(r.stderr), (r.returncode, r.stderr)
        assert b"message passed through unchanged" in r.stderr
        return None
    assert r.returncode in ((0,) if exit_zero else (0, 1, 2)), r.stderr
    assert r.stdout.endswith(raw.split(b"\n\n", 1)[1]) and b"X-Spam-Status: " in r.stdout
    return r.stdout


@pytest.mark.parametrize("how", ["truncated-snapshot", "garbage-journal", "garbage-scorer"])
def test_a_damaged_model_through_every_filter_path(compiled, tmp_path, how):
    """The fast path, the click command (``--evidence``) and the server's client give the
    same answer for each damage: a truncated snapshot passes the message through (exit 3,
    0 with --exit-zero, one line); a garbage journal tail is ignored and a garbage scorer
    rebuilt or set aside, and the message is filtered."""
    raw = sample_message("spam", 1).read_bytes()
    damage(compiled, how)
    sock = tmp_path / "run" / "socket"
    answers = set()
    for exit_zero in (False, True):
        more = ["--exit-zero"] if exit_zero else []
        for args in (["--model", compiled, "--socket", tmp_path / "none"],
                     ["--model", compiled, "--socket", tmp_path / "none", "--evidence", "0"]):
            answers.add(verdict_or_unchanged(filter_(*args, *more, input=raw), raw, exit_zero))
    if how != "truncated-snapshot":  # a server needs a model to start with
        proc = start_server(str(sock), compiled)
        try:
            for exit_zero in (False, True):
                r = filter_("--model", compiled, "--socket", sock, *(["--exit-zero"] if exit_zero else []), input=raw)
                answers.add(verdict_or_unchanged(r, raw, exit_zero))
        finally:
            proc.terminate()
            proc.wait(20)
            proc.stdout.close()
            proc.stderr.close()
    assert len(answers) == 1  # every path, the same bytes
    assert (None in answers) == (how == "truncated-snapshot")


def test_a_model_damaged_under_a_running_server_passes_the_message_through(compiled, tmp_path):
    """The server holds the model; the file is truncated under it: the server declines
    (it never answers from a model it cannot reload), the client tries by itself, and the
    message comes out unchanged, one line, exit 3 (0 with --exit-zero)."""
    raw = sample_message("ham", 1).read_bytes()
    sock = tmp_path / "run" / "socket"
    proc = start_server(str(sock), compiled)
    try:
        assert filter_("--model", compiled, "--socket", sock, input=raw).returncode in (0, 1, 2)
        damage(compiled, "truncated-snapshot")
        for more, code in (([], 3), (["--exit-zero"], 0)):
            r = filter_("--model", compiled, "--socket", sock, *more, input=raw)
            assert (r.returncode, r.stdout) == (code, raw) and one_line(r.stderr), r.stderr
    finally:
        proc.terminate()
        proc.wait(20)
        proc.stdout.close()
        proc.stderr.close()


@pytest.mark.parametrize("how", ["a-folder", "not-utf8", "not-toml", "others-can-write"])
def test_a_configuration_that_cannot_be_read_passes_the_message_through(compiled, tmp_path, how):
    """`spamnb filter` with a user configuration file it cannot read: the message unchanged,
    one line naming the file, exit 3, and 0 with --exit-zero (maildrop's xfilter then
    delivers it instead of deferring it)."""
    raw = sample_message("spam", 2).read_bytes()
    conf = tmp_path / "xdg" / "spamnb" / "config.toml"
    conf.parent.mkdir(parents=True, mode=0o700)
    if how == "a-folder":
        conf.mkdir()
    elif how == "not-utf8":
        conf.write_bytes(b"[filter]\nexit_zero = \xff\n")
    elif how == "not-toml":
        conf.write_text("[filter\nexit_zero = yes\n")
    else:
        conf.write_text("[filter]\n")
        conf.chmod(0o666)
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "xdg"), "SPAMNB_SOCKET": str(tmp_path / "none")}
    env.pop("SPAMNB_CONFIG", None)
    for more, code in (([], 3), (["--exit-zero"], 0)):
        r = filter_("--model", compiled, *more, input=raw, env=env)
        assert (r.returncode, r.stdout) == (code, raw), r.stderr
        assert one_line(r.stderr) and str(conf).encode() in r.stderr and b"passed through unchanged" in r.stderr


def test_bad_options_pass_the_message_through_with_exit_zeros_status(compiled):
    raw = sample_message("ham", 2).read_bytes()
    for more, code in (([], 3), (["--exit-zero"], 0)):
        r = filter_("--model", compiled, "--evidence", "many", *more, input=raw)
        assert (r.returncode, r.stdout) == (code, raw) and one_line(r.stderr), r.stderr


def test_the_boundary_catches_what_a_path_raises_and_lets_an_exit_pass():
    seen = []
    with Boundary(lambda reason, exc: seen.append(reason) or "failed") as b:
        {}["missing"]
    assert b.result == "failed" and seen == ["internal error (KeyError: 'missing')"]
    with pytest.raises(SystemExit):
        with Boundary(lambda reason, exc: seen.append(reason)):
            raise SystemExit(2)
    with pytest.raises(KeyboardInterrupt):  # a server or an IMAP pass stops on Ctrl-C
        with Boundary(lambda reason, exc: None):
            raise KeyboardInterrupt
    with Boundary(lambda reason, exc: reason, interrupts=True) as b:  # a filter process delivers its message
        raise KeyboardInterrupt
    assert b.result == "interrupted"
    assert failure_reason(ValueError("two\nlines")) == "internal error (ValueError: two lines)"
    assert failure_reason(FileNotFoundError(2, "No such file or directory", "/x")) == \
        "/x: No such file or directory"
