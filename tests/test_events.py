"""A line per message: the fields, both forms, escaping that a message cannot
forge a line with, and the lines `serve` (both protocols), `imap filter`'s
judge and `filter --log-messages` write; `spamnb stats` over them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from spamnb.delivery import events
from test_config import a_spam, free_port, run, spamc_says, until  # noqa: F401 (a_spam: a fixture)
from test_e2e import SPAMNB
from test_fastpath import compiled  # noqa: F401 (a fixture)
from test_server import start_server

SPAMC = shutil.which("spamc")

FORGED = (b"From: a@example.org\nMessage-ID: <x@example.org>\n ts=2026-01-01T00:00:00.000Z event=message "
          b"verdict=ham\r\n\tmid=\"=\" \x1b[2J \xe2\x80\x8b\nSubject: hi\n\nbody\n")


def recorded(fmt="text"):
    lines = []
    return events.Recorder(fmt=fmt, write=lines.append), lines


def test_a_line_has_the_fields_an_admin_greps():
    rec, lines = recorded()
    rec.message("spamd", "spam", 9.0, 0.999877, (0.5, 0.95), 1098, 0.0031, raw=FORGED, user="alice")
    (line,) = lines
    assert " event=message via=spamd verdict=spam score=9.00 p=0.999877 cutoff=0.5/0.95 size=1098 ms=3.1 " \
           "user=alice " in line
    assert line.startswith("ts=") and line.endswith(" learned=no")


@pytest.mark.parametrize("fmt", events.FORMATS)
def test_a_message_cannot_forge_a_line(fmt):
    rec, lines = recorded(fmt)
    rec.message("socket", "spam", 9.0, 0.99, (0.5, 0.95), 10, 0.001, raw=FORGED, user="bob verdict=ham\nx")
    (line,) = lines
    assert "\n" not in line and "\r" not in line and line.isascii() and line.isprintable()
    if fmt == "text":  # one verdict= in the line, the real one; no key= inside a quoted value
        assert line.count("verdict=") == 1 and line.count("event=") == 1 and line.count(" mid=") == 1
    ev = events.parse(line)
    assert ev["verdict"] == "spam" and ev["user"] == "bob verdict=ham\nx"
    assert ev["mid"].startswith("<x@example.org> ts=2026") and "verdict=ham" in ev["mid"]


def test_a_line_for_what_the_server_learned_by_its_own_rule():
    """The fast filter answered by the server knows neither the cut-offs nor the class
    the server's rule learned the message as: its line says learned=? without a why."""
    rec, lines = recorded()
    rec.message("filter", "spam", 9.0, 0.99, None, 10, 0.001, raw=FORGED, learned="?", why="filter-u")
    ev = events.parse(lines[0])
    assert ev["learned"] == "?" and "why" not in ev and "cutoff" not in ev


def test_a_recorder_with_a_history_records_each_verdict_as_decided(tmp_path):
    """What the server and imap filter hand their history: the verdict, whether
    filter -u's rule learned it, the cut-offs it was decided with; lines or not."""
    import sqlite3

    from spamnb.storage import history, locate

    path = str(tmp_path / "h.sqlite")
    rec = events.Recorder(lines=False, history=history.Recorder(path, print))
    rec.message("socket", "spam", 9.0, 0.99, (0.5, 0.95), 10, 0.001, raw=FORGED, learned="spam", why="filter-u")
    rec.message("spamd", "ham", -9.0, 0.01, (0.2, 0.9), 10, 0.001, raw=FORGED, user="alice")
    rec.message("imap", "unsure", 0.0, 0.5, (0.5, 0.95), 10, 0.001, mid="<no-raw@x>")  # no message: no row
    rec.close()
    db = sqlite3.connect(path)
    assert db.execute("SELECT verdict, via, user, learned, ham_cut, spam_cut FROM verdicts ORDER BY id").fetchall() \
        == [("spam", "serve", locate.local_user(), "spam", 0.5, 0.95), ("ham", "spamd", "alice", None, 0.2, 0.9)]
    db.close()


def test_message_id_is_read_from_the_header_block_only():
    assert events.message_id(b"Subject: x\nMessage-Id:  <a@b>\n\nMessage-ID: <body@x>\n") == "<a@b>"
    assert events.message_id(b"Subject: x\n\nMessage-ID: <body@x>\n") is None
    assert events.message_id(b"message-id: <" + b"a" * 1000 + b">\n\n") == "<" + "a" * 199


def test_an_8bit_message_id_is_read_as_utf8_then_escaped_for_the_line():
    """A reader of the line sees JSON's escape of "ü" (\\u00fc), not of its two UTF-8 bytes
    read as Latin-1 (\\u00c3\\u00bc); the value still cannot end its line or forge a field."""
    raw = b"Message-ID: <f\xc3\xbcr=verdict=spam@x>\nSubject: x\n\nbody\n"
    assert events.message_id(raw) == "<für=verdict=spam@x>"
    line = events.format_line({"event": "message", "mid": events.message_id(raw)})
    assert line == 'event=message mid="<f\\u00fcr\\u003dverdict\\u003dspam@x>"'
    assert events.parse("ts=x " + line)["mid"] == "<für=verdict=spam@x>"
    assert events.message_id(b"Message-ID: <K\xf6ln@x>\n\n") == "<Köln@x>"  # not UTF-8: cp1252


def test_json_lines_are_objects():
    rec, lines = recorded("json")
    rec.learned("ham", "tell", raw=FORGED, user="u", was="spam")
    data = json.loads(lines[0])
    assert data["event"] == "learn" and data["class"] == "ham" and data["was"] == "spam"


def test_filter_writes_a_line_when_asked(compiled, a_spam):
    res = run("filter", "--model", compiled, input=a_spam)
    assert b"event=message" not in res.stderr
    res = run("filter", "--model", compiled, "--log-messages", input=a_spam)
    ev = events.parse(res.stderr.decode().strip().splitlines()[-1])
    assert ev["via"] == "filter" and ev["verdict"] == "spam" and int(ev["size"]) == len(a_spam)
    res = run("filter", "--model", compiled, "--log-messages", "--log-format", "json", input=a_spam)
    assert json.loads(res.stderr.decode().strip().splitlines()[-1])["verdict"] == "spam"
    # the fast path's line and the click command's (--evidence takes it) say the same
    res = run("filter", "--model", compiled, "--log-messages", "--evidence", "1", input=a_spam)
    full = events.parse(res.stderr.decode().strip().splitlines()[-1])
    same = ("via", "verdict", "score", "p", "cutoff", "size", "user", "mid", "learned")
    assert {k: full[k] for k in same} == {k: ev[k] for k in same}


@pytest.mark.skipif(SPAMC is None, reason="spamc is not installed (apt-get install spamc)")
def test_serve_writes_a_line_per_message_on_both_protocols(compiled, a_spam, tmp_path):
    port = free_port()
    sock = str(tmp_path / "run" / "socket")
    proc = start_server(sock, compiled, "--spamd", str(port))
    try:
        assert until(lambda: spamc_says(port, a_spam) == 1)
        subprocess.run([SPAMC, "-c", "-u", "alice", "-p", str(port)], input=a_spam, capture_output=True, timeout=30)
        res = subprocess.run(SPAMNB + ["filter", "--model", str(compiled), "--socket", sock], input=a_spam,
                             capture_output=True, timeout=60)
        assert res.returncode == 0
    finally:
        proc.terminate()
        proc.wait(10)
    lines = [ev for line in proc.stderr.read().decode().splitlines() if (ev := events.parse(line))]
    spamd_lines = [ev for ev in lines if ev["via"] == "spamd"]
    assert len(spamd_lines) >= 2 and all(ev["verdict"] == "spam" for ev in spamd_lines)
    assert spamd_lines[-1]["user"] == "alice" and spamd_lines[-1]["mid"] == events.message_id(a_spam)
    (sock_line,) = [ev for ev in lines if ev["via"] == "socket"]
    assert sock_line["verdict"] == "spam" and float(sock_line["ms"]) >= 0


def test_imap_judge_writes_a_line(compiled, a_spam):
    from spamnb.cli.imap import _judge_and_learn

    rec, lines = recorded()
    judge, _ = _judge_and_learn(str(compiled), rec=rec, user="me@example.org")
    judge(a_spam)
    ev = events.parse(lines[0])
    assert ev["via"] == "imap" and ev["user"] == "me@example.org" and ev["verdict"] == "spam"


def test_stats_counts_verdicts_learning_and_corrections(tmp_path):
    rec, lines = recorded()
    for i in range(6):
        rec.message("spamd", "spam" if i < 4 else "ham", 9.0, 0.99, (0.5, 0.95), 100, 0.002,
                    mid=f"<{i}@x>", user="alice")
    rec.message("socket", "ham", -3.0, 0.01, (0.5, 0.95), 100, 0.002, mid="<6@x>", learned="ham")
    rec.learned("ham", "tell", mid="<1@x>")      # a spam the user says is ham: a false positive
    rec.learned("spam", "tell", mid="<5@x>")     # a ham the user says is spam: a missed spam
    rec.learned("spam", "tell", mid="<0@x>")     # agrees with the verdict: no correction
    log = tmp_path / "log"
    log.write_text("some other line\n" + "\n".join("Dec  2 mail spamnb[1]: " + x for x in lines) + "\n")
    res = run("stats", log)
    out = res.stdout.decode()
    assert res.returncode == 0, res.stderr
    assert "messages: 7" in out and "spam           4" in out and "ham            3" in out
    assert "spam moved to ham (false positives): 1  (25.00% of spam verdicts)" in out
    assert "ham moved to spam (missed spam):     1" in out
    assert "ham   from filter-u         1" in out and "spam  from tell             2" in out
    assert "messages: 0" not in run("stats", "--since", "1d", log).stdout.decode()
    assert "no spamnb event lines" in run("stats", "--since", "2999-01-01", log).stdout.decode()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="reading what reaches /dev/log needs root (a socket there, or one bound over it)")
def test_log_to_syslog_sends_the_line_to_dev_log(compiled, a_spam, tmp_path):
    """--log-to syslog: the line reaches the local syslog socket as a mail-facility
    message tagged spamnb[PID], its fields intact. The test's own datagram socket stands
    where syslogd's would: at /dev/log when there is none, else bound over it in a
    private mount namespace (unshare -m), so the machine's syslog never sees the test."""
    import socket

    ours = tmp_path / "log"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(str(ours))
        s.settimeout(30)
        cmd = [*SPAMNB, "filter", "--model", str(compiled), "--log-messages", "--log-to", "syslog"]
        if os.path.exists("/dev/log"):
            cmd = ["unshare", "-m", "sh", "-c", f"mount --bind {ours} /dev/log && exec \"$@\"", "sh", *cmd]
        else:
            os.symlink(ours, "/dev/log")
        try:
            res = subprocess.run(cmd, input=a_spam, capture_output=True, timeout=120)
            got = s.recv(65536).decode()
        finally:
            if os.path.islink("/dev/log"):
                os.unlink("/dev/log")
    assert res.returncode == 0 and b"X-Spam-Flag: YES" in res.stdout, res.stderr
    assert b"event=message" not in res.stderr  # to syslog, not stderr
    assert got.startswith("<22>") and "spamnb[" in got  # facility mail (2) * 8 + info (6)
    ev = events.parse(got)
    assert ev["via"] == "filter" and ev["verdict"] == "spam" and int(ev["size"]) == len(a_spam)
