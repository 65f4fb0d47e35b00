"""One history for a site: the verdict history in the store (spamnb.storage.redishistory),
recorded by two real ``serve --spamd`` hosts, shown by ``spamnb web --store``, against a
real redis-server on a private socket (tests/test_redis_store.py's). Each host runs in a
UTS namespace of its own (``unshare --uts``), so that it has a host name of its own, as
two mail hosts do."""

from __future__ import annotations

import html
import json
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from spamnb.storage import history as sqlhist
from spamnb.storage.history import HistoryError
from spamnb.storage.redishistory import RedisHistory, check_row
from test_e2e import SPAMNB
from test_redis_store import pushed, run, sample_messages, server, url  # noqa: F401 - the fixtures
from test_redis_store import pytestmark as redis_marks
from test_spamd import _free_port, _read_all, request
from webpage import Web
from test_web import csrf_of

pytestmark = redis_marks


def _can_name_hosts():
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    r = subprocess.run([unshare, "--uts", "--map-root-user", "hostname", "probe"], capture_output=True)
    return r.returncode == 0


NAMED = pytest.mark.skipif(not _can_name_hosts(), reason="unshare --uts --map-root-user is not allowed here "
                                                         "(each test host needs a host name of its own)")


class Host:
    """``spamnb serve --spamd --store URL --history-store --allow-tell-served`` under the host name ``name``."""

    def __init__(self, url, folder: Path, name, *extra):
        self.name = name
        self.port = _free_port()
        self.log_path = folder.parent / f"{folder.name}.log"
        cmd = ["unshare", "--uts", "--map-root-user", "sh", "-c", 'hostname "$0" && exec "$@"', name, *SPAMNB,
               "serve", "--socket", str(folder / "s"), "--store", url, "--spamd", f"127.0.0.1:{self.port}",
               "--allow-tell-served", "--history-store", *extra]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log_path.read_text()
            try:
                if self.ask(b"PING SPAMC/1.5\r\n\r\n") == b"SPAMD/1.5 0 PONG\r\n":
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("spamnb serve did not start")

    def ask(self, data):
        with socket.create_connection(("127.0.0.1", self.port), timeout=30) as s:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            return _read_all(s)

    def check(self, raw):
        reply = self.ask(request("CHECK", raw))
        assert reply.startswith(b"SPAMD/1.1 0 EX_OK"), reply
        return float(reply.split(b";")[1].split(b"/")[0])

    def tell(self, raw, label):
        reply = self.ask(request("TELL", raw, Message_class=label, Set="local"))
        assert reply.startswith(b"SPAMD/1.1 0 EX_OK"), reply

    def stop(self):
        self.proc.terminate()
        self.proc.wait(20)
        return self.log_path.read_text("utf-8", "replace")


def history_of(url, **bounds):
    from spamnb.storage.where import open_backend

    return RedisHistory(open_backend(None, url), **bounds)


def wait_for(test, what, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if test():
            return
        time.sleep(0.05)
    raise AssertionError(f"not {what} within {timeout} s")


def messages(n, subject="note"):
    return [(f"From: a{i}@example.org\nTo: b@example.org\nSubject: {subject} {i}\nMessage-ID: <{subject}{i}@ex>\n\n"
             f"meeting agenda lunch tomorrow {i}\n").encode() for i in range(n)]


@NAMED
def test_two_hosts_record_one_history_the_page_shows_both_and_its_correction_reaches_the_other(
        url, model_file, tmp_path):
    """mx1 and mx2 share a store and its history: the page of ``web --store`` lists both hosts'
    verdicts, each saying its host; learning one there changes mx2's next verdict of it; a TELL
    on mx1 marks the row mx2 recorded."""
    pushed(url, model_file)
    hist = history_of(url)
    a, b = sample_messages()[:2]
    hosts = [Host(url, tmp_path / "a", "mx1"), Host(url, tmp_path / "b", "mx2")]
    try:
        hosts[0].check(a)
        before = hosts[1].check(b)
        wait_for(lambda: hist.count() == 2, "two verdicts in the store's history")
        rows = {r["host"]: r for r in hist.rows(hist.ids())}
        assert set(rows) == {"mx1", "mx2"} and all(r["via"] == "spamd" and r["kept"] for r in rows.values())
        web = Web(None, None, where=["--store", url])
        try:
            status, _, page = web.get("/history")
            assert status == 200
            for host in ("mx1", "mx2"):
                assert f" on {host}" in page
            mid = rows["mx2"]["id"]
            label = "ham" if rows["mx2"]["verdict"] == "spam" else "spam"
            status, _, _ = web.get("/learn", data=f"id={mid}&label={label}&csrf={csrf_of(page)}&back=/history"
                                   .encode())
            assert status == 303
            after = hosts[1].check(b)  # mx2's next verdict of the message learned on the page
            assert (after > before) if label == "spam" else (after < before)
            assert hist.rows([mid])[0]["corrected"] == label
            _, _, page = web.get(f"/message/{mid}")
            assert "<dt>Host</dt><dd>mx2</dd>" in page
        finally:
            web.stop()
        other = "ham" if label == "spam" else "spam"
        hosts[0].tell(b, other)  # a TELL on mx1 marks the newest verdict of the message, mx2's second one
        wait_for(lambda: hist.count() == 3, "mx2's second verdict in the history")
        newest = hist.rows(hist.ids(stop=0))[0]
        assert newest["host"] == "mx2" and newest["message_id"] == rows["mx2"]["message_id"]
        wait_for(lambda: hist.rows([newest["id"]])[0]["corrected"] == other, "the TELL's correction in the history")
    finally:
        logs = [h.stop() for h in hosts]
    assert all("Traceback" not in log for log in logs), logs


def test_filter_records_into_the_store_and_options_say_what_is_wrong(url, model_file, tmp_path):
    pushed(url, model_file)
    raw = sample_messages()[0]
    r = run("filter", "--store", url, "--history-store", input=raw)
    assert r.returncode in (0, 1, 2) and b"X-Spam-Status" in r.stdout, r.stderr
    rows = history_of(url).rows(history_of(url).ids())
    assert [(x["via"], x["host"], x["size"]) for x in rows] == [("filter", socket.gethostname(), len(raw))]
    r = run("filter", "--model", model_file, "--history-store", input=raw)  # no store: recorded nowhere, delivered
    assert r.returncode in (0, 1, 2) and b"X-Spam-Status" in r.stdout
    assert b"history not recorded" in r.stderr and b"--store URL" in r.stderr and b"Traceback" not in r.stderr
    r = run("serve", "--model", model_file, "--history-store", "--socket", tmp_path / "s")
    assert r.returncode == 2 and b"give --store URL" in r.stderr
    r = run("serve", "--store", url, "--history-store", "--history", tmp_path / "h", "--socket", tmp_path / "s")
    assert r.returncode == 2 and b"give --history FILE or --history-store, not both" in r.stderr
    r = run("web", "--store", url, "--history", tmp_path / "h")
    assert r.returncode == 2 and b"--history FILE is for a model file" in r.stderr


def test_a_configuration_files_history_store_records_in_the_store(url, model_file, tmp_path):
    """``[history] store = true`` in the configuration file: filter (the fast path hands it to the
    click command) records in the store."""
    pushed(url, model_file)
    config = tmp_path / "config" / "spamnb"
    config.mkdir(parents=True)
    (config / "config.toml").write_text(f'[store]\nurl = "{url}"\n[history]\nstore = true\n')
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config"), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    raw = sample_messages()[0]
    r = subprocess.run(SPAMNB + ["filter"], input=raw, capture_output=True, env=env, timeout=120)
    assert b"X-Spam-Status" in r.stdout, r.stderr
    assert history_of(url).count() == 1
    r = subprocess.run(SPAMNB + ["filter", "--no-history"], input=raw, capture_output=True, env=env, timeout=120)
    assert b"X-Spam-Status" in r.stdout and history_of(url).count() == 1
    # one unit: the command line's --history FILE replaces the file's store = true
    r = subprocess.run(SPAMNB + ["filter", "--history", str(tmp_path / "h.sqlite")], input=raw, capture_output=True,
                       env=env, timeout=120)
    assert b"X-Spam-Status" in r.stdout and history_of(url).count() == 1, r.stderr
    assert sqlhist.open_db(str(tmp_path / "h.sqlite")).execute("SELECT count(*) FROM verdicts").fetchone()[0] == 1
    # a file and the store in one layer: an error naming its line, as config --check says too
    (config / "config.toml").write_text(f'[store]\nurl = "{url}"\n[history]\nstore = true\npath = "/tmp/h"\n')
    r = subprocess.run(SPAMNB + ["config", "--check"], capture_output=True, env=env, timeout=120)
    assert r.returncode == 2 and b"config.toml:5" in r.stderr + r.stdout and b"Traceback" not in r.stderr, r
    assert b"[history] path and [history] store both say the history" in r.stderr + r.stdout


def test_the_history_is_bounded_by_count_and_age(url, model_file):
    """At most max_rows rows; rows older than row_days go; whole messages of the keep_recent most
    recent verdicts that were not unsure stay, and of unsure ones for body_days; every key has a TTL."""
    pushed(url, model_file)
    hist = history_of(url, max_rows=6, row_days=10, keep_recent=2, body_days=3)
    now = time.time()
    msgs = messages(9)
    old = [sqlhist.row(msgs[0], "ham", -5.0, 0.01, via="spamd", t=now - 11 * 86400),  # past row_days
           sqlhist.row(msgs[1], "unsure", 0.1, 0.5, via="spamd", t=now - 4 * 86400)]  # its body past body_days
    hist.write(old)  # the first is past row_days, the second's message past body_days: dropped at once
    assert [(r["subject"], r["kept"]) for r in hist.rows(hist.ids())] == [("note 1", False)]
    hist.write([sqlhist.row(m, "unsure" if i == 2 else "ham", 0.0, 0.5, via="spamd", t=now - 100 + i)
                for i, m in enumerate(msgs[2:], 2)])
    rows = hist.rows(hist.ids())
    assert [r["subject"] for r in rows] == [f"note {i}" for i in range(8, 2, -1)]  # the newest 6
    assert {r["subject"] for r in rows if r["kept"]} == {"note 8", "note 7"}  # keep_recent; note 2 went with its row
    assert hist.client.hlen(hist.k["mid"]) == 2 * 6  # a dropped row's Message-ID keys go with it
    client = hist.client
    for key in hist.keys:
        if client.exists(key):
            assert 0 < client.ttl(key) <= 11 * 86400, key


def test_unsure_bodies_stay_for_body_days_and_leave_the_queue_when_corrected(url, model_file):
    pushed(url, model_file)
    hist = history_of(url, keep_recent=0, body_days=3)
    now = time.time()
    a, b = messages(2, "q")
    hist.write([sqlhist.row(a, "unsure", 0.1, 0.5, via="spamd", t=now - 4 * 86400),
                sqlhist.row(b, "unsure", 0.1, 0.5, via="spamd", t=now)])
    assert [r["subject"] for r in hist.rows(hist.ids("queue"))] == ["q 1"]  # q 0's message is past body_days
    hist.write([], [(b, "spam", None, False)])
    assert hist.count("queue") == 0 and hist.rows(hist.ids(stop=0))[0]["corrected"] == "spam"
    hist.write([], [(b, "spam", None, True)])  # forgotten: back in the queue
    assert hist.count("queue") == 1 and hist.rows(hist.ids(stop=0))[0]["corrected"] is None


@pytest.mark.parametrize("value, what", [
    (b"not json", "not JSON"), (b"[1]", "not a JSON object"), (b'{"t": 1e9, "verdict": "evil"}', "verdict"),
    (b'{"t": "x", "verdict": "ham"}', "time"), (b'{"t": 1e9, "verdict": "ham", "score": "9"}', "score"),
    (b'{"t": 1e9, "verdict": "ham", "size": -1}', "size"), (b'{"t": 1e9, "verdict": "ham", "user": [1]}', "user"),
    (b'{"t": 1e9, "verdict": "ham", "rcpt": {"a": 1}}', "rcpt"),
    (b'{"t": 1e9, "verdict": "ham", "helo": "' + b"x" * 1001 + b'"}', "helo"),
])
def test_a_malformed_row_is_named_never_a_traceback(url, model_file, value, what):
    with pytest.raises(ValueError, match=what):
        check_row(value, 1)
    pushed(url, model_file)
    hist = history_of(url)
    hist.write([sqlhist.row(messages(1)[0], "ham", -3.0, 0.1, via="spamd")])
    hist.client.hset(hist.k["row"], 1, value)
    with pytest.raises(HistoryError, match="malformed history"):
        hist.rows([1])


def test_malformed_history_keys_are_one_line_on_the_page_in_web_and_in_serve(url, model_file, tmp_path):
    pushed(url, model_file)
    hist = history_of(url)
    hist.write([sqlhist.row(m, "ham", -3.0, 0.1, via="spamd") for m in messages(2)])
    hist.client.hset(hist.k["row"], 2, b'{"t": 1, "verdict": "<b>evil</b>"}')
    hist.client.hset(hist.k["fix"], 1, b"spam NaN")
    web = Web(None, None, where=["--store", url])
    try:
        status, _, page = web.get("/history")
        assert status == 500 and "malformed history" in page and "&lt;b&gt;evil" in page and "<b>evil" not in page
        status, _, page = web.get("/message/1")
        assert status == 500 and "its correction" in page
    finally:
        web.stop()
    assert "Traceback" not in web.log
    hist.client.delete(hist.k["t"])
    hist.client.set(hist.k["t"], b"x")
    r = run("web", "--store", url)
    assert r.returncode == 1 and r.stderr.count(b"\n") == 1 and b"is a string, not a zset" in r.stderr
    port = _free_port()
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(SPAMNB + ["serve", "--socket", str(tmp_path / "s" / "s"), "--store", url, "--spamd",
                                          f"127.0.0.1:{port}", "--history-store"], stdout=subprocess.DEVNULL,
                                stderr=out)
    try:
        raw = sample_messages()[0]
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                    s.sendall(request("CHECK", raw))
                    s.shutdown(socket.SHUT_WR)
                    reply = _read_all(s)
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
                time.sleep(0.1)
        assert reply.startswith(b"SPAMD/1.1 0 EX_OK")  # the verdict, whatever the history
        wait_for(lambda: "record(s) not written" in log.read_text(), "the failed record in the log")
    finally:
        proc.terminate()
        proc.wait(20)
    text = log.read_text()
    assert "Traceback" not in text and "WRONGTYPE" in text, text
    assert len(re.findall("not written", text)) == 1


@pytest.mark.parametrize("key, plant, what", [
    ("row", lambda r: {**r, "t": 1e300}, "its time is 1e+300"),
    ("row", lambda r: {**r, "t": 1e12}, "its time is 1000000000000.0"),
    ("fix", None, "its correction's time is 1e+300"),
])
def test_an_out_of_range_time_is_the_page_naming_the_row_until_it_is_removed(url, model_file, key, plant, what):
    """A time no date can show (a row's ``t`` of 1e300 or 1e12, a correction ``spam 1e300``),
    written into the store by someone else: /history and /overview are the error page naming
    the verdict and the one value to remove, never a 500 of OverflowError; once that value
    is removed as the page says, both answer again."""
    pushed(url, model_file)
    hist = history_of(url)
    hist.write([sqlhist.row(m, "ham", -3.0, 0.1, via="spamd") for m in messages(3)])
    if key == "row":
        hist.client.hset(hist.k["row"], 2, json.dumps(plant(json.loads(hist.client.hget(hist.k["row"], 2)))))
    else:
        hist.client.hset(hist.k["fix"], 2, b"spam 1e300")
    name = hist.k[key].decode()
    web = Web(None, None, where=["--store", url])
    try:
        for path in ("/history", "/overview"):
            status, _, page = web.get(path)
            text = html.unescape(page)  # (the page escapes every value it shows)
            assert status == 500 and "malformed history" in text and f"verdict 2 in {name}: {what}" in text, page
            assert "OverflowError" not in text and "out of range" not in text
            assert f"HDEL '{name}' 2" in text  # the one value to remove
        hist.client.hdel(hist.k[key], 2)
        for path in ("/history", "/overview"):
            status, _, page = web.get(path)
            assert status == 200, page
    finally:
        web.stop()
    assert "Traceback" not in web.log and "OverflowError" not in web.log


def test_a_row_checks_every_number_it_holds():
    now = time.time()
    good = {"t": now, "verdict": "ham", "score": -3.0, "p": 0.1, "ham_cut": 0.2, "spam_cut": 0.9, "size": 10}
    assert check_row(json.dumps(good).encode(), 1, now)["t"] == now
    assert check_row(json.dumps({**good, "t": now + 3600}).encode(), 1, now)  # a host's clock a little ahead
    for bad, what in (({"t": 1e300}, "time"), ({"t": 1e12}, "time"), ({"t": now + 2 * 86400}, "time"),
                      ({"t": 1.0}, "time"), ({"t": True}, "time"), ({"p": 2.0}, "p"), ({"ham_cut": -0.1}, "ham_cut"),
                      ({"spam_cut": 1e300}, "spam_cut"), ({"ham_cut": 0.9, "spam_cut": 0.2}, "cut-offs"),
                      ({"size": 2 ** 80}, "size")):
        with pytest.raises(ValueError, match=what):
            check_row(json.dumps({**good, **bad}).encode(), 1, now)


def test_learn_and_forget_through_the_store_mark_the_row_in_its_history(url, model_file, tmp_path):
    from conftest import SAMPLE_MAILDIR

    pushed(url, model_file)
    path = sorted((SAMPLE_MAILDIR / "cur").iterdir())[0]
    r = run("filter", "--store", url, "--history-store", input=path.read_bytes())
    assert b"X-Spam-Status" in r.stdout, r.stderr
    hist = history_of(url)
    row = hist.rows(hist.ids())[0]
    label = "ham" if row["verdict"] == "spam" else "spam"
    r = run("learn", f"--{label}", "--store", url, "--history-store", path)
    assert r.returncode == 0, r.stderr
    assert hist.rows([row["id"]])[0]["corrected"] == label
    r = run("forget", f"--{label}", "--store", url, "--history-store", path)
    assert r.returncode == 0, r.stderr
    assert hist.rows([row["id"]])[0]["corrected"] is None


def test_learning_again_what_the_store_learned_marks_nothing(url, model_file, tmp_path):
    """The store's learn script knows a message learned already: in a batch with a new one,
    only the new one's row is marked; the newer row of the one learned before stays as it
    was, the summary counts it apart, and the store's counts grow by the new one only."""
    backend = pushed(url, model_file)
    old, new = messages(2, "again")
    files = [tmp_path / "old.eml", tmp_path / "new.eml"]
    for f, raw in zip(files, (old, new)):
        f.write_bytes(raw)
    assert run("filter", "--store", url, "--history-store", input=old).returncode in (0, 1, 2)
    assert run("learn", "--spam", "--store", url, "--history-store", files[0]).returncode == 0
    for raw in (old, new):
        assert run("filter", "--store", url, "--history-store", input=raw).returncode in (0, 1, 2)
    before = backend.status().size[1]
    r = run("learn", "--spam", "--store", url, "--history-store", *files)
    assert r.returncode == 0 and r.stderr == b"learned 1 as spam, moved 0; already learned: 1\n", r.stderr
    hist = history_of(url)
    assert [row["corrected"] for row in hist.rows([1, 2, 3])] == ["spam", None, "spam"]
    assert backend.status().size[1] == (before[0], before[1] + 1)
    r = run("learn", "--spam", "--store", url, "--history-store", *files)
    assert r.stderr == b"learned 0 as spam, moved 0; already learned: 2\n", r.stderr
    assert [row["corrected"] for row in hist.rows([1, 2, 3])] == ["spam", None, "spam"]
    assert backend.status().size[1] == (before[0], before[1] + 1)


def test_spamnb_history_lists_the_stores_history_as_the_page_does(url, model_file, tmp_path):
    """``spamnb history --store URL``: every host's verdicts, newest first, searched by the
    page's StoreSite; a --history FILE beside --store is a usage error."""
    pushed(url, model_file)
    hist = history_of(url)
    hist.write([sqlhist.row(m, label, score, 0.5, via="spamd", user=user)
                for m, label, score, user in zip(messages(3, "listed"), ("ham", "spam", "unsure"), (-5.0, 9.0, 0.1),
                                                 ("alice", "bob", "alice"))])
    r = run("history", "--store", url, "--format", "jsonl")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [row["message_id"] for row in rows] == ["<listed2@ex>", "<listed1@ex>", "<listed0@ex>"]
    assert all(row["host"] == socket.gethostname() for row in rows)
    assert r.stderr.decode().startswith("3 of 3 verdicts matching, newest first, in the store ")
    r = run("history", "--store", url, "--user", "alice", "--search", "LISTED 2")
    assert r.returncode == 0 and r.stdout.decode().splitlines()[1].endswith("<listed2@ex>"), r.stdout
    assert len(r.stdout.splitlines()) == 2
    r = run("history", "--store", url, "--history", tmp_path / "h.sqlite")
    assert r.returncode == 2 and b"--history FILE is for a model file" in r.stderr


def test_a_record_is_one_script_call_and_a_flushed_server_gets_the_scripts_again(server, url, model_file):
    """What reaches Redis from the client: one EVALSHA per record (a burst in one pipeline), no
    SCRIPT EXISTS; after SCRIPT FLUSH (a restarted server) the scripts are loaded and sent again."""
    pushed(url, model_file)
    hist = history_of(url)
    c = server.client()
    inner = ("incr", "hset", "zadd", "hget", "hdel", "hexists", "zrem", "zrangebyscore", "zcard", "zrange", "expire")

    def client_calls():
        stats = c.info("commandstats")
        c.config_resetstat()
        return {k[8:]: v["calls"] for k, v in stats.items() if k[8:] not in inner + ("info", "config|resetstat")}

    hist.write([sqlhist.row(m, "ham", -1.0, 0.2, via="spamd") for m in messages(1)])
    client_calls()
    msgs = messages(5, "burst")
    hist.write([sqlhist.row(m, "ham", -1.0, 0.2, via="spamd") for m in msgs], [(msgs[0], "spam", None, False)])
    assert client_calls() == {"evalsha": 6}
    c.script_flush()
    client_calls()
    hist.write([sqlhist.row(m, "ham", -1.0, 0.2, via="spamd") for m in messages(2, "again")])
    assert client_calls() == {"evalsha": 4, "script|load": 3}  # every script the history sends
    assert hist.count() == 8


def test_imap_filter_records_into_the_store(url, model_file, dovecot, tmp_path):
    """``imap filter --store --history-store`` against a real Dovecot: a row per message it
    classified, of its login, in the store's history."""
    from click.testing import CliRunner

    from spamnb.cli import main

    pushed(url, model_file)
    for raw in sample_messages()[:3]:
        dovecot.append("INBOX", raw)
    pw = tmp_path / "pw"
    pw.write_text(dovecot.password + "\n")
    pw.chmod(0o600)
    res = CliRunner().invoke(main, ["imap", "filter", "--host", dovecot.host, "--port", str(dovecot.port),
                                    "--user", dovecot.user, "--password-file", str(pw), "--security", "none",
                                    "--store", url, "--no-learn-verdicts", "--history-store"])
    assert res.exit_code == 0 and "classified 3" in res.stderr, res.stderr
    hist = history_of(url)
    rows = hist.rows(hist.ids())
    assert [(r["via"], r["user"]) for r in rows] == [("imap", dovecot.user)] * 3


def test_every_page_of_web_store_reads_the_store(url, model_file):
    """Unsure, History (a search by text, by verdict, by date), a message, Overview and Model
    over the store; learning an unsure message there takes it out of the queue and teaches the
    store's model."""
    from spamnb.delivery.hook import decide

    backend = pushed(url, model_file)
    hist = history_of(url)
    a, b = sample_messages()[:2]
    unsure = b"From: u@example.org\nSubject: which one\nMessage-ID: <u1@ex>\n\n" + b
    hist.write([sqlhist.row(a, "ham", -9.0, 0.001, via="spamd"), sqlhist.row(unsure, "unsure", 0.2, 0.55, via="spamd")])
    before = decide(backend.view(), unsure).score
    web = Web(None, None, where=["--store", url])
    try:
        status, _, page = web.get("/unsure")
        assert status == 200 and "which one" in page
        today = time.strftime("%Y-%m-%d")
        for query, shown, hidden in (("q=WHICH", "which one", None), ("verdict=ham", None, "which one"),
                                     (f"since={today}&until={today}", "which one", None),
                                     ("until=2001-01-01", None, "which one")):
            status, _, found = web.get(f"/history?{query}")
            assert status == 200, found
            assert shown is None or shown in found
            assert hidden is None or hidden not in found
        status, _, text = web.get("/message/2")
        assert status == 200 and "which one" in text
        for path, word in (("/overview", "Overview"), ("/model", "in the store: 2 verdicts")):
            status, _, text = web.get(path)
            assert status == 200 and word in text, text[-2000:]
        status, _, _ = web.get("/learn", data=f"id=2&label=spam&csrf={csrf_of(page)}&back=/unsure".encode())
        assert status == 303
        assert hist.count("queue") == 0 and hist.rows([2])[0]["corrected"] == "spam"
    finally:
        web.stop()
    assert decide(backend.view(), unsure).score > before
    assert "Traceback" not in web.log


# -- a correction on the page: learned and marked, or neither, whatever the ACL -------------------------


def acl_url(server, url, name, tmp_path, drop=()):
    """A URL logging in to ``server`` as the ACL user ``name``, made exactly as docs/many-hosts.md
    documents the spamnb user (its words read from the page) but for the prefix of ``url``, and
    without the commands in ``drop``."""
    from test_redis_store import documented_acl

    prefix = url.split("prefix=", 1)[1]
    words = documented_acl()
    assert words[:3] == ["ACL", "SETUSER", "spamnb"] and "~spamnb:*" in words
    words = [name if i == 2 else f"~{prefix}*" if w == "~spamnb:*" else f">pw-{name}" if w == ">SPAMNB-PASSWORD"
             else w for i, w in enumerate(words) if w not in drop]
    c = server.client()
    c.execute_command("ACL", "DELUSER", name)
    c.execute_command(*words)
    pw = tmp_path / f"{name}.pw"
    pw.write_text(f"pw-{name}\n")
    pw.chmod(0o600)
    return f"unix://{name}@{server.sock}?prefix={prefix}&password_file={pw}"


UNSURE = (b"From: u@example.org\nTo: me@example.org\nSubject: which one\nMessage-ID: <u1@ex>\n\n"
          b"cheap pills meeting agenda lunch tomorrow\n")


def counts(backend):
    return tuple(int(n) for n in backend.model().messages)


def test_the_scan_page_of_web_store_scores_and_teaches_the_stores_model(url, model_file):
    """A message pasted on `spamnb web --store`'s Scan page is scored by the store's model, with
    its chips; Learn as spam teaches the store (its counts move once, the row of the message in
    the store's history is marked), and again: "already learned"."""
    from spamnb.delivery.hook import decide

    backend = pushed(url, model_file)
    hist = history_of(url)
    hist.write([sqlhist.row(UNSURE, "unsure", 0.2, 0.55, via="spamd")])
    before = counts(backend)
    web = Web(None, None, where=["--store", url])
    try:
        csrf = csrf_of(web.get("/unsure")[2])
        status, _, page = web.scan(csrf, ("message", UNSURE.replace(b"\n", b"\r\n")))
        assert status == 200 and "What moved its score" in page, page[-2000:]
        assert f"= score <b>{decide(backend.view(), UNSURE).score:+.2f}</b>" in page
        raw64 = re.search(r'name="raw64" value="([^"]*)"', page).group(1).encode()
        status, _, page = web.scan(csrf, ("raw64", raw64), ("label", b"spam"))
        assert status == 200 and "Learned as spam: “which one”." in page, page[-2000:]
        assert counts(backend) == (before[0], before[1] + 1)
        assert hist.rows([1])[0]["corrected"] == "spam" and hist.count("queue") == 0
        status, _, page = web.scan(csrf, ("raw64", raw64), ("label", b"spam"))
        assert status == 200 and "“which one” was already learned as spam: nothing changed." in page
        assert counts(backend) == (before[0], before[1] + 1)
    finally:
        web.stop()
    assert "Traceback" not in web.log


@pytest.mark.parametrize("drop", [(), ("+multi", "+exec")], ids=["documented", "no-multi"])
def test_a_correction_on_the_page_as_the_documented_acl_user_is_learned_once_and_marked(
        server, url, model_file, tmp_path, drop):
    """``web --store`` logged in as the spamnb user of docs/many-hosts.md (and the same user
    without ``+multi +exec``): learning an unsure message answers a redirect, the model learns
    it once, its row is marked and leaves the queue."""
    backend = pushed(url, model_file)
    hist = history_of(url)
    hist.write([sqlhist.row(UNSURE, "unsure", 0.2, 0.55, via="spamd")])
    before = counts(backend)
    web = Web(None, None, where=["--store", acl_url(server, url, "page-nomulti" if drop else "page-doc",
                                                    tmp_path, drop)])
    try:
        _, _, page = web.get("/unsure")
        status, _, text = web.get("/learn", data=f"id=1&label=spam&csrf={csrf_of(page)}&back=/unsure".encode())
        assert status == 303, text
        _, _, page = web.get("/history")
        assert "Learned as spam: “which one”." in page and "not marked" not in page
    finally:
        web.stop()
    assert counts(backend) == (before[0], before[1] + 1)
    assert hist.rows([1])[0]["corrected"] == "spam" and hist.count("queue") == 0
    assert "Traceback" not in web.log


def test_a_store_that_refuses_the_mark_refuses_it_before_the_model_learns(server, url, model_file, tmp_path):
    """An ACL that lets the page learn but not mark (no ``+zrem`` here, nor ``+multi``): nothing
    is learned and nothing marked, and the page says so; no command of the mark ran on its own."""
    backend = pushed(url, model_file)
    hist = history_of(url)
    hist.write([sqlhist.row(UNSURE, "unsure", 0.2, 0.55, via="spamd")])
    before = counts(backend)
    web = Web(None, None, where=["--store", acl_url(server, url, "nozrem", tmp_path, ("+zrem", "+multi", "+exec"))])
    try:
        _, _, page = web.get("/unsure")
        status, _, text = web.get("/learn", data=f"id=1&label=spam&csrf={csrf_of(page)}&back=/unsure".encode())
        assert status == 500 and "not learned" in text and "nothing was marked in the history" in text, text
        assert "zrem" in text.lower()
    finally:
        web.stop()
    assert counts(backend) == before
    assert hist.rows([1])[0]["corrected"] is None and hist.count("queue") == 1


def test_a_mark_that_fails_after_the_learn_is_said_and_leaves_the_row_in_the_queue(url, model_file):
    """The store takes the learn, then refuses the mark (another program's value where the
    corrections go, put there in between): a redirect saying "learned, but not marked in the
    history", the row still in the queue and unmarked (the mark is one script that refuses
    before it writes); choosing it again marks it, and the model learned it once."""
    from spamnb.delivery.access import LOOPBACK
    from spamnb.web.app import WebServer
    from spamnb.web.storesite import StoreSite
    from webpage import WebHere

    backend = pushed(url, model_file)
    hist = history_of(url)
    hist.write([sqlhist.row(UNSURE, "unsure", 0.2, 0.55, via="spamd")])
    before = counts(backend)
    real = hist.mark
    planted = []

    def mark(rids, label, check=False):
        if not check and not planted:
            planted.append(hist.client.set(hist.k["fix"], b"not a hash"))
            try:
                return real(rids, label)
            finally:
                hist.client.delete(hist.k["fix"])
        return real(rids, label, check=check)

    hist.mark = mark
    web = WebHere.__new__(WebHere)
    web.logged, web.cookie = [], None
    web.server = WebServer(("127.0.0.1", 0), StoreSite(backend, hist=hist), allowed=LOOPBACK, log=web.logged.append)
    import threading

    threading.Thread(target=web.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    web.at(web.server.url())
    try:
        _, _, page = web.get("/unsure")
        status, _, text = web.get("/learn", data=f"id=1&label=spam&csrf={csrf_of(page)}&back=/unsure".encode())
        assert status == 303, text
        assert hist.rows([1])[0]["corrected"] is None and hist.count("queue") == 1
        assert counts(backend) == (before[0], before[1] + 1)
        _, _, page = web.get("/unsure")
        assert "Learned as spam: “which one”, but not marked in the history" in page and "WRONGTYPE" in page, page
        status, _, _ = web.get("/learn", data=f"id=1&label=spam&csrf={csrf_of(page)}&back=/unsure".encode())
        assert status == 303
        _, _, page = web.get("/history")
        assert "Learned as spam: “which one”." in page
    finally:
        web.stop()
    assert hist.rows([1])[0]["corrected"] == "spam" and hist.count("queue") == 0
    assert counts(backend) == (before[0], before[1] + 1)  # learned once


# -- a correction marks its own message, not another sharing its Message-ID ------------------------------


def twins():
    """Two different messages that share a Message-ID (a spammer's reuse, a list's copy)."""
    head = b"From: a@example.org\nTo: b@example.org\nSubject: %s\nMessage-ID: <same@ex>\n\n"
    return head % b"first" + b"meeting agenda lunch tomorrow\n", head % b"second" + b"cheap pills now\n"


def test_a_correction_marks_its_own_message_not_another_sharing_its_message_id(url, model_file):
    """Two messages share a Message-ID, the second recorded last: a TELL (or learn) of the first
    marks the first's row, not the newest row of that Message-ID; one of the second marks the
    second's. A copy of the first as delivered (spamnb's header added, CRLF) is still the first."""
    pushed(url, model_file)
    hist = history_of(url)
    first, second = twins()
    hist.write([sqlhist.row(first, "ham", -3.0, 0.1, via="spamd", user="u"),
                sqlhist.row(second, "ham", -3.0, 0.1, via="spamd", user="u")])
    delivered = (b"X-Spam-Status: No, score=-3.0\n" + first).replace(b"\n", b"\r\n")
    hist.write([], [(delivered, "spam", "u", False)])
    assert [r["corrected"] for r in hist.rows([1, 2])] == ["spam", None]
    hist.write([], [(second, "spam", None, False)])
    assert [r["corrected"] for r in hist.rows([1, 2])] == ["spam", "spam"]
    hist.write([], [(first, "spam", "u", True)])  # forgotten: the first's mark taken back, only it
    assert [r["corrected"] for r in hist.rows([1, 2])] == [None, "spam"]


def test_rows_recorded_before_they_held_their_messages_key_are_corrected_by_message_id(url, model_file):
    """A row the previous layout recorded (no key in its JSON, its h:mid entries without one) is
    found by its Message-ID alone, as it was; a newer row of another message with that Message-ID
    is not taken for it, and the old row's keys go when it is dropped."""
    pushed(url, model_file)
    hist = history_of(url, max_rows=2)
    first, second = twins()
    cols, body = sqlhist.row(first, "ham", -3.0, 0.1, via="spamd", user="u")
    cols.pop("message_key")
    args = hist._record_args(cols, body, time.time())
    assert b"same@ex>" in args[4] and args[4].endswith(b"same@ex>")  # the old layout's mid keys
    hist._send([(hist._record.sha, args)])
    hist.write([], [(first, "spam", "u", False)])
    assert hist.rows([1])[0]["corrected"] == "spam"
    hist.write([sqlhist.row(second, "ham", -3.0, 0.1, via="spamd", user="u")])  # keyed, the other message
    hist.write([], [(second, "ham", "u", False)])
    assert [r["corrected"] for r in hist.rows([1, 2])] == ["spam", "ham"]
    hist.write([], [(first, "spam", "u", True)])  # the old row is still the first's
    assert [r["corrected"] for r in hist.rows([1, 2])] == [None, "ham"]
    c = hist.client
    hist.write([sqlhist.row(m, "ham", -1.0, 0.2, via="spamd") for m in messages(2, "later")])  # drops 1 and 2
    assert hist.count() == 2 and not any(b"same@ex" in k for k in c.hkeys(hist.k["mid"]))


def test_learn_through_the_store_marks_its_own_message_of_a_shared_message_id(url, model_file, tmp_path):
    """``filter`` records both messages, ``spamnb learn`` of the first marks only its row."""
    pushed(url, model_file)
    first, second = twins()
    for raw in (first, second):
        r = run("filter", "--store", url, "--history-store", input=raw)
        assert b"X-Spam-Status" in r.stdout, r.stderr
    path = tmp_path / "first.eml"
    path.write_bytes(first)
    r = run("learn", "--spam", "--store", url, "--history-store", path)
    assert r.returncode == 0, r.stderr
    hist = history_of(url)
    assert [(r["subject"], r["corrected"]) for r in hist.rows([1, 2])] == [("first", "spam"), ("second", None)]


def test_the_stores_rows_hold_the_envelope_a_milter_saw(url, model_file):
    """Messages through the milter door recorded into the store: each row holds the client's
    address and the envelope, as the file's do; a row without an envelope (spamd over a Unix
    socket, a row an older spamnb recorded) holds none, and its JSON no nulls for it; ``spamnb
    history --store`` lists them and its search finds a recipient."""
    from milter_client import MTA
    from spamnb.storage import redishistory
    from test_milter_door import Milter, crlf

    pushed(url, model_file)
    hist = history_of(url)
    recorder = redishistory.Recorder(hist, print)
    s = Milter(model_file, history=recorder)
    try:
        m = MTA(s.port)
        m.negotiate()
        assert m.message(crlf(messages(1, "env")[0]), rcpts=("bob@example.com", "carol@example.com"))[-1][0] == b"a"
        m.close()
    finally:
        s.stop()
        recorder.close()
    hist.write([sqlhist.row(messages(1, "plain")[0], "ham", -3.0, 0.1, via="spamd", user="alice")])
    env, plain = hist.rows([1, 2])
    assert (env["via"], env["client"], env["helo"], env["env_sender"], env["rcpt"], env["qid"]) == (
        "milter", "192.0.2.9", "client.example.net", "a@example.org", "bob@example.com,carol@example.com", "4ABC123")
    assert env["sender"] == "a0@example.org"  # the From header, not the envelope's
    assert [plain[k] for k in sqlhist.ENVELOPE_COLUMNS] == [None] * 5
    stored = json.loads(hist.client.hget(hist.k["row"], 2))
    assert not set(stored) & set(sqlhist.ENVELOPE_COLUMNS)
    r = run("history", "--store", url, "--format", "jsonl")
    assert r.returncode == 0, r.stderr
    listed = [json.loads(line) for line in r.stdout.splitlines()]
    assert [(x["client"], x["env_sender"], x["qid"]) for x in listed] == [(None, None, None),
                                                                         ("192.0.2.9", "a@example.org", "4ABC123")]
    r = run("history", "--store", url, "--format", "jsonl", "--search", "CAROL@example")  # the page's search
    assert [json.loads(line)["qid"] for line in r.stdout.splitlines()] == ["4ABC123"], r.stderr
