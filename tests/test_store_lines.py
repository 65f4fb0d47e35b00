"""``serve --spamd --store`` with a real ``redis-server``: a message scanned while the
store holds no model or is down gets its error line (``mail=unscanned``, its size,
user, Message-ID and client address), the reason said once in the log; a TELL into
the emptied store starts its model again; a store URL that names no ACL user says how
to name one."""

from __future__ import annotations

import re
import shutil
import subprocess
import time

import pytest

from spamnb.delivery import events
from test_config import free_port, until
from test_e2e import SPAMNB
from test_redis_store import REDIS_SERVER, RedisServer, pushed, run, sample_messages, redis  # noqa: F401

SPAMC = shutil.which("spamc")
pytestmark = [
    pytest.mark.skipif(REDIS_SERVER is None or redis is None, reason="redis-server or the redis package is missing"),
    pytest.mark.skipif(SPAMC is None, reason="spamc is not installed (apt-get install spamc)"),
]


def spamc(port, raw, *args):
    return subprocess.run([SPAMC, "-d", "127.0.0.1", "-p", str(port), "-u", "alice", "-t", "30", *args],
                          input=raw, capture_output=True, timeout=60)


def start(url, port, tmp_path, *extra):
    proc = subprocess.Popen(SPAMNB + ["serve", "--socket", str(tmp_path / "run" / "socket"), "--store", url,
                                      "--spamd", str(port), *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert until(lambda: spamc(port, b"", "-K").returncode == 0, 60) or proc.poll() is not None
    return proc


def test_an_emptied_store_its_tell_and_its_outage_each_leave_one_clear_line(tmp_path, trained_model_file):
    from spamnb.storage.modelfile import default_cache_path

    cached = default_cache_path()  # the default model a model starts from (the test's own cache)
    cached.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(trained_model_file, cached)
    srv = RedisServer(tmp_path)
    url = srv.url(prefix="site:")
    port = free_port()
    proc = start(url, port, tmp_path, "--allow-tell-served")
    raw = sample_messages()[0]
    mid = events.message_id(raw)
    try:
        assert proc.poll() is None, proc.stderr.read()
        res = spamc(port, raw, "-c")  # the store holds no model: spamc passes the mail (EX_IOERR)
        assert res.stdout.startswith(b"0/0")
        res = spamc(port, raw, "-L", "ham")  # a TELL into the empty store: the model starts again
        assert res.returncode == 0 and b"successfully" in res.stdout, proc.terminate() or proc.stderr.read()
        assert redis.Redis(unix_socket_path=str(srv.sock)).hexists("site:meta", "epoch")
        res = spamc(port, raw, "-c")
        assert res.returncode in (0, 1) and not res.stdout.startswith(b"0/0")  # scanned now
        srv.stop()
        res = spamc(port, raw, "-c")  # the store is down: passed unscanned
        assert res.stdout.startswith(b"0/0")
    finally:
        proc.terminate()
        proc.wait(20)
        if srv.proc.poll() is None:
            srv.stop()
    err = proc.stderr.read().decode()
    lines = [ev for line in err.splitlines() if (ev := events.parse(line))]
    kinds = [(ev["event"], ev.get("kind")) for ev in lines]
    assert kinds == [("error", "ex_ioerr"), ("learn", None), ("message", None), ("error", "ex_ioerr")], kinds
    for ev in (lines[0], lines[3]):
        assert ev["mail"] == "unscanned" and ev["mid"] == mid and ev["user"] == "alice"
        assert int(ev["size"]) == len(raw) and ev["raddr"] == "127.0.0.1"
    assert lines[1]["class"] == "ham" and lines[1]["source"] == "tell" and lines[1]["raddr"] == "127.0.0.1"
    said = [line for line in err.splitlines() if line.startswith("spamnb serve: spamd:")]
    assert said and all(line.count("cannot read the model") <= 1 for line in said), said
    assert any("holds no model" in line for line in said) and any("cannot reach" in line for line in said)
    assert "cannot be reached now" not in err


def test_a_store_url_without_its_acl_user_says_how_to_name_it(tmp_path):
    """An ACL user with a password and Redis' default user off (what docs/many-hosts.md
    sets up): ``unix:///PATH?password_file=`` logs in as nobody and says to write
    ``unix://USER@/PATH``, which works."""
    conf = tmp_path / "redis.conf"
    sock = tmp_path / "redis.sock"
    conf.write_text(f"port 0\nunixsocket {sock}\nunixsocketperm 700\nsave \"\"\nappendonly no\ndir {tmp_path}\n"
                    "user spamnb on >acl-pw-2 ~* &* +@all\nuser default off\n")
    proc = subprocess.Popen([REDIS_SERVER, str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        pw = tmp_path / "pw"
        pw.write_text("acl-pw-2\n")
        pw.chmod(0o600)
        assert until(lambda: sock.exists(), 20)
        time.sleep(0.2)
        res = run("info", "--store", f"unix://{sock}?password_file={pw}")
        err = res.stderr.decode()
        assert res.returncode == 1 and "Traceback" not in err and "acl-pw-2" not in err
        assert "refused the login" in err and "unix://USER@/PATH?password_file=FILE" in err, err
        assert len(err.strip().splitlines()) == 1, err
        res = run("info", "--store", f"unix://spamnb@{sock}?password_file={pw}")
        assert res.returncode == 1 and "holds no model" in res.stderr.decode(), res.stderr  # logged in
        assert re.search("USER@", res.stderr.decode()) is None
    finally:
        proc.terminate()
        proc.wait(20)
