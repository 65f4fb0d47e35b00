"""Every message gets one line, the refused and the failed too: real ``spamc``
against ``spamnb serve --spamd`` (a model file, and a Redis store emptied and
stopped), the lines read back by ``spamnb stats``; and the smaller promises of the
same work (syslog without a syslog, a TELL into an empty store, an error said once,
a store URL without its ACL user)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time

import pytest

from spamnb.delivery import events
from test_config import a_spam, free_port, run, until  # noqa: F401 (a_spam: a fixture)
from test_e2e import SPAMNB
from test_fastpath import compiled  # noqa: F401 (a fixture)
from test_server import start_server

SPAMC = shutil.which("spamc")
needs_spamc = pytest.mark.skipif(SPAMC is None, reason="spamc is not installed (apt-get install spamc)")


def spamc(port, raw, *args, user="alice"):
    return subprocess.run([SPAMC, "-d", "127.0.0.1", "-p", str(port), "-u", user, "-t", "30", *args], input=raw,
                          capture_output=True, timeout=60)


def stop(proc):
    proc.terminate()
    proc.wait(20)
    return [ev for line in proc.stderr.read().decode().splitlines() if (ev := events.parse(line))]


def with_mid(raw, mid):
    return f"Message-ID: <{mid}@example.org>\n".encode() + raw


@needs_spamc
def test_refused_and_failed_messages_each_get_a_line_with_what_is_known(compiled, a_spam, tmp_path):
    """Over --max-bytes (answered unscanned), over --spamd-max-bytes (refused), a bad
    request: each an error line with kind=, mail=unscanned, and the size, user, client
    address and Message-ID where the server saw them; stats counts them."""
    port = free_port()
    proc = start_server(str(tmp_path / "run" / "socket"), compiled, "--spamd", str(port), "--max-bytes", "3000",
                        "--spamd-max-bytes", "20000")
    try:
        big = with_mid(a_spam + b"x" * 4000 + b"\n", "big")
        huge = with_mid(a_spam + b"y" * 30000 + b"\n", "huge")
        ok = with_mid(a_spam, "ok")
        assert until(lambda: spamc(port, ok, "-c").returncode == 1)
        res = spamc(port, big, "-s", "100000")  # PROCESS: returned as it came
        assert res.returncode == 0 and res.stdout == big
        res = spamc(port, huge, "-c", "-s", "100000")  # refused (EX_DATAERR): spamc says 0/0
        assert res.stdout.startswith(b"0/0")
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"CHECK SPAMC/1.5\r\nUser: bob\r\nContent-length: nine\r\n\r\nhello")
            assert b"76 Bad header line" in s.recv(4096)
        res = run("filter", "--model", compiled, "--socket", str(tmp_path / "run" / "socket"), input=big)
        assert res.returncode in (0, 1, 2) and b"X-Spam-Status:" in res.stdout  # refused: the filter judged it
    finally:
        lines = stop(proc)
    errors = {ev["kind"]: ev for ev in lines if ev["event"] == "error"}
    assert set(errors) == {"too_big", "ex_dataerr", "ex_protocol", "refused"}, lines
    assert errors["refused"]["via"] == "socket" and int(errors["refused"]["size"]) == len(big)
    assert "mail" not in errors["refused"]  # the filter judges it: not unscanned
    too_big = errors["too_big"]
    assert too_big["mail"] == "unscanned" and int(too_big["size"]) == len(big) and too_big["user"] == "alice"
    assert too_big["raddr"] == "127.0.0.1" and too_big["mid"] == "<big@example.org>"
    assert errors["ex_dataerr"]["mail"] == "unscanned" and int(errors["ex_dataerr"]["size"]) == len(huge)
    assert errors["ex_protocol"]["user"] == "bob" and errors["ex_protocol"]["raddr"] == "127.0.0.1"
    scanned = [ev for ev in lines if ev["event"] == "message" and ev["via"] == "spamd"]
    assert scanned and all(ev["raddr"] == "127.0.0.1" and ev["mid"] == "<ok@example.org>" for ev in scanned)
    log = tmp_path / "log"
    log.write_text("\n".join(events.format_line(ev) for ev in lines) + "\n")
    out = run("stats", log).stdout.decode()
    assert "passed unscanned: 3 (spamd 3)" in out and "errors: 4" in out
    assert "too_big      via spamd          1" in out


@needs_spamc
def test_connections_beyond_the_cap_are_answered_at_once_and_each_has_a_line(compiled, a_spam, tmp_path):
    """--max-connections 1, what serve --help and docs/spamd.md say: one served, one
    more waits up to 2 s for the slot (and is served when it frees), any more are
    answered EX_TEMPFAIL at once, so spamc passes them unscanned; each has a line.
    30 spamc at once while the slot and the wait are held by idle clients: all 30
    answered at once, 30 error lines; then one waiting while the slot frees: served."""
    port = free_port()
    proc = start_server(str(tmp_path / "run" / "socket"), compiled, "--spamd", str(port), "--max-connections", "1",
                        "--timeout", "20")
    try:
        assert until(lambda: spamc(port, a_spam, "-c").returncode == 1)
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]  # the slot, and the one wait
        time.sleep(0.3)
        start = time.monotonic()
        procs = [subprocess.Popen([SPAMC, "-c", "-d", "127.0.0.1", "-p", str(port), "-u", "alice", "-t", "30"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for _ in range(30)]
        for i, p in enumerate(procs):
            p.stdin.write(with_mid(a_spam, f"c{i}"))
            p.stdin.close()
        outs = [p.stdout.read() for p in procs]
        for p in procs:
            p.wait(60)
        took = time.monotonic() - start
        assert all(o.startswith(b"0/0") for o in outs), outs  # EX_TEMPFAIL: passed unscanned
        assert took < 15, took  # at once, not after the 20 s the idle clients hold on for
        idle[1].close()  # the waiter goes (its thread waits out its 2 s, then its place is free)
        time.sleep(2.5)
        result = {}
        waiter = threading.Thread(target=lambda: result.update(r=spamc(port, with_mid(a_spam, "w"), "-c")))
        waiter.start()
        time.sleep(0.5)
        idle[0].close()  # the slot frees within the waiter's 2 s
        waiter.join(60)
        assert result["r"].returncode == 1 and not result["r"].stdout.startswith(b"0/0")
    finally:
        lines = stop(proc)
    busy = [ev for ev in lines if ev["event"] == "error" and ev["kind"] == "ex_tempfail"]
    # the 30, and the idle client that waited its 2 s (the server cannot know it had no mail): a
    # line for the first, the others counted into a line a second (count=), so that a flood of
    # connections costs the accept loop a line a second, not one each
    assert sum(int(ev.get("count", 1)) for ev in busy) == 31 and all(ev["mail"] == "unscanned" for ev in busy)
    assert busy[0]["raddr"] == "127.0.0.1" and "count" not in busy[0] and len(busy) <= 6, busy
    assert [ev["mid"] for ev in lines if ev["event"] == "message"][-1] == "<w@example.org>"


def test_log_to_syslog_without_a_syslog_says_so_once_and_writes_to_stderr(compiled, a_spam, tmp_path):
    """Nothing listens on /dev/log (a container): one warning, then the lines on stderr."""
    cmd = [*SPAMNB, "filter", "--model", str(compiled), "--log-messages", "--log-to", "syslog"]
    if events.syslog_there():
        if os.geteuid() != 0 or shutil.which("unshare") is None:
            pytest.skip("a syslog listens on /dev/log: hiding it needs root and unshare")
        empty = tmp_path / "nothing"
        empty.write_text("")
        cmd = ["unshare", "-m", "sh", "-c", f"mount --bind {empty} /dev/log && exec \"$@\"", "sh", *cmd]
    res = subprocess.run(cmd, input=a_spam, capture_output=True, timeout=120)
    err = res.stderr.decode()
    assert res.returncode == 0 and b"X-Spam-Flag: YES" in res.stdout, err
    assert err.count("warning: --log-to syslog: nothing listens on /dev/log") == 1, err
    (ev,) = [ev for line in err.splitlines() if (ev := events.parse(line))]
    assert ev["event"] == "message" and ev["verdict"] == "spam"


def test_a_message_the_filter_passes_unscanned_has_its_line(tmp_path, a_spam):
    """A model that cannot be read: the message is delivered unchanged, and the
    --log-messages line says so (the fast filter's boundary and the click command's)."""
    bad = tmp_path / "model.joblib"
    bad.write_bytes(b"not a model")
    bad.chmod(0o600)
    res = run("filter", "--model", bad, "--log-messages", input=a_spam)
    assert res.returncode == 3 and res.stdout == a_spam
    (ev,) = [ev for line in res.stderr.decode().splitlines() if (ev := events.parse(line))]
    assert ev["event"] == "error" and ev["via"] == "filter" and ev["mail"] == "unscanned"
    assert int(ev["size"]) == len(a_spam) and ev["mid"] == events.message_id(a_spam) and ev["user"]


def test_stats_counts_forgets_and_never_a_forget_as_a_correction(tmp_path):
    """A ham filed as spam, taught ham on one host, forgotten through another and taught
    again: one false positive. A spam taught spam: none. A forget alone: none."""
    lines = []
    rec = events.Recorder(write=lines.append)
    rec.message("spamd", "spam", 5.0, 0.99, (0.5, 0.95), 100, 0.002, mid="<a@x>", user="alice")
    rec.message("spamd", "spam", 5.0, 0.99, (0.5, 0.95), 100, 0.002, mid="<b@x>", user="alice")
    rec.message("spamd", "ham", -5.0, 0.01, (0.5, 0.95), 100, 0.002, mid="<c@x>", user="alice")
    rec.learned("ham", "tell", mid="<a@x>", user="alice")
    rec.forgotten("ham", "tell", mid="<a@x>", user="alice")
    rec.learned("ham", "tell", mid="<a@x>", user="alice")
    rec.learned("spam", "tell", mid="<b@x>", user="alice")
    rec.learned("ham", "tell", mid="<c@x>")
    rec.forgotten("ham", "tell", mid="<c@x>")
    rec.error("ex_ioerr", "cannot read the model", via="spamd", unscanned=True, size=100, mid="<d@x>")
    rec.error("ex_nouser", "no model of user", via="spamd", mid="<e@x>")  # a TELL: the mail went on scanned
    rec.error("ex_tempfail", "too many connections", via="spamd", unscanned=True, count=4)  # a flood's second
    log = tmp_path / "log"
    log.write_text("\n".join(lines) + "\n")
    out = run("stats", log).stdout.decode()
    assert "spam moved to ham (false positives): 1  (50.00% of spam verdicts)" in out, out
    assert "ham moved to spam (missed spam):     0" in out
    assert "ham   from tell             3" in out and "spam  from tell             1" in out
    assert "forgotten:\n  ham   from tell             2" in out
    assert "passed unscanned: 5 (spamd 5)" in out and "errors: 6" in out


def test_an_error_line_names_what_is_known_in_both_forms():
    for fmt in events.FORMATS:
        lines = []
        rec = events.Recorder(fmt=fmt, write=lines.append)
        rec.error("ex_ioerr", "cannot read", via="spamd", unscanned=True, raw=b"Message-ID: <q@x>\n\nbody\n",
                  user="al ice", raddr="192.0.2.7")
        ev = events.parse(lines[0])
        assert (ev["kind"], ev["mail"], ev["mid"], ev["user"], ev["raddr"]) == \
               ("ex_ioerr", "unscanned", "<q@x>", "al ice", "192.0.2.7")
        assert int(ev["size"]) == len(b"Message-ID: <q@x>\n\nbody\n")
