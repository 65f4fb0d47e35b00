"""The verdict history: what serve (both protocols), filter and imap filter record,
bounded, private, and never in a delivery's way (spamnb.storage.history)."""

from __future__ import annotations

import os
import socket
import sqlite3
import stat
import subprocess
import sys
import time

import pytest

from spamnb.storage import history, locate
from spamnb.web.data import Site
from test_e2e import SPAMNB
from test_fastpath import compiled, messages as sample_messages  # noqa: F401 (compiled: a fixture)
from test_server import sock_path, start_server  # noqa: F401 (sock_path: a fixture)


@pytest.fixture(scope="module")
def messages():
    return sample_messages()


def query(path, sql):
    db = sqlite3.connect(path)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


def rows(path):
    return query(path, "SELECT v.verdict, v.via, v.sender, v.subject, v.user, v.size, v.learned, "
                       "b.id IS NOT NULL FROM verdicts v LEFT JOIN bodies b ON b.id = v.id ORDER BY v.id")


def stopped(proc):
    """Stop a server started by ``start_server``; its stderr."""
    proc.terminate()
    proc.wait(20)
    err = proc.stderr.read().decode()
    proc.stdout.close()
    proc.stderr.close()
    return err


def filter_(model, raw, *args, env=None):
    return subprocess.run(SPAMNB + ["filter", "--model", str(model), *args], input=raw, capture_output=True,
                          env={**os.environ, "SPAMNB_SOCKET": "/nonexistent/socket", **(env or {})})


def test_fields_are_decoded_unfolded_and_bounded():
    raw = (b"From: =?utf-8?q?Jos=C3=A9?= <j@example.org>\r\nSubject: a long\r\n  folded one\r\n"
           b"Message-ID: <x@y>\r\nSubject: second\r\n\r\nbody")
    assert history.fields(raw) == {"sender": "José <j@example.org>", "subject": "a long folded one",
                                   "message_id": "<x@y>"}
    assert len(history.fields(b"Subject: " + b"x" * 5000 + b"\n\nb")["subject"]) == 300
    assert history.fields(b"\xff\xfe not mail at all") == {"sender": "", "subject": "", "message_id": ""}


def test_fields_read_raw_8bit_headers_as_written():
    """About one recent spam in ten has a raw 8-bit Subject: UTF-8 is read as UTF-8, other bytes in
    the message's charset, never as mojibake ("fÃ¼r") or a guessed CJK charset."""
    raw = (b"From: J\xc3\xb6rg <j@example.org>\nSubject: Prognose f\xc3\xbcr Sie\nMessage-ID: <p@x>\n"
           b"Content-Type: text/plain; charset=iso-8859-1\n\nbody")
    assert history.fields(raw) == {"sender": "Jörg <j@example.org>", "subject": "Prognose für Sie",
                                   "message_id": "<p@x>"}
    raw = b"Content-Type: text/plain;\n charset=\"windows-1251\"\nSubject: \xcf\xf0\xe8\xe2\xe5\xf2\n\nbody"
    assert history.fields(raw)["subject"] == "Привет"  # the declared charset, folded parameter and all
    assert history.fields(b"Subject: Gr\xfc\xdfe aus K\xf6ln\n\nbody")["subject"] == "Grüße aus Köln"


def test_cold_filter_records_each_verdict_beside_the_model(compiled, messages):
    for raw in messages[:3]:
        proc = filter_(compiled, raw)
        assert proc.returncode in (0, 1, 2) and proc.stderr == b""
    path = str(compiled) + ".history.sqlite"
    got = rows(path)
    assert len(got) == 3
    assert {r[1] for r in got} == {"filter"}
    assert got[0][3] == history.fields(messages[0])["subject"] and got[0][5] == len(messages[0])
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_history_file_option_and_no_history(compiled, messages, tmp_path):
    other = tmp_path / "h.sqlite"
    assert filter_(compiled, messages[0], "--history", str(other)).returncode in (0, 1, 2)
    assert len(rows(other)) == 1
    assert filter_(compiled, messages[0], "--no-history").returncode in (0, 1, 2)
    assert not os.path.exists(str(compiled) + ".history.sqlite")
    both = filter_(compiled, messages[0], "--no-history", "--history", str(other))
    assert both.returncode == 3 and both.stdout == messages[0]  # a usage error passes the mail through
    assert len(rows(other)) == 1


def test_a_locked_history_skips_the_record_and_delivers(compiled, messages):
    path = str(compiled) + ".history.sqlite"
    history.open_db(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another writer holding the lock, forever
    try:
        t = time.monotonic()
        proc = filter_(compiled, messages[0])
        took = time.monotonic() - t
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert proc.returncode in (0, 1, 2) and b"X-Spam-Status" in proc.stdout
    assert b"history not recorded" in proc.stderr and b"locked" in proc.stderr
    assert rows(path) == []
    assert took < 30  # the wait is BUSY_MS; the rest is the process start on a shared machine


@pytest.mark.parametrize("breakage", ["symlink", "others-write", "group-write", "others-read", "another-user",
                                      "not-sqlite"])
def test_an_unsafe_or_foreign_history_is_not_used(compiled, messages, tmp_path, breakage):
    path = str(compiled) + ".history.sqlite"
    if breakage == "symlink":
        target = tmp_path / "elsewhere.sqlite"
        history.open_db(target).close()
        os.symlink(target, path)
    elif breakage in ("others-write", "group-write", "others-read"):
        history.open_db(path).close()
        os.chmod(path, {"others-write": 0o666, "group-write": 0o620, "others-read": 0o644}[breakage])
    elif breakage == "another-user":
        if os.geteuid() != 0:
            pytest.skip("giving a file to another user needs root")
        history.open_db(path).close()
        os.chown(path, OTHER_UID, -1)  # mode 0600: only the owner's check tells it
    else:
        with open(path, "wb") as f:
            f.write(b"not a database" * 100)
        os.chmod(path, 0o600)
    before = os.stat(path).st_size if breakage != "symlink" else None
    proc = filter_(compiled, messages[0])
    assert proc.returncode in (0, 1, 2) and b"X-Spam-Status" in proc.stdout
    assert b"history not recorded" in proc.stderr and proc.stderr.count(b"\n") == 1, proc.stderr
    if breakage == "symlink":
        assert rows(tmp_path / "elsewhere.sqlite") == []
    else:
        assert os.stat(path).st_size == before and not os.path.exists(path + "-wal")  # nothing written
        assert {"others-read": b"may be read by others", "another-user": b"not to you",
                "group-write": b"may be written by others"}.get(breakage, b"") in proc.stderr


OTHER_UID = 54321  # no user of the machine: a file given to it is another user's


@pytest.mark.parametrize("suffix", history.COMPANIONS)
@pytest.mark.parametrize("breakage", ["others-write", "others-read", "another-user", "symlink"])
def test_an_unsafe_wal_shm_or_journal_beside_the_history_is_refused(tmp_path, suffix, breakage):
    """SQLite reads them as part of the database: each is checked as the history itself."""
    path = str(tmp_path / "h.sqlite")
    history.open_db(path).close()
    companion = path + suffix
    if breakage == "symlink":
        os.symlink(tmp_path / "elsewhere", companion)
    else:
        with open(companion, "wb"):
            pass
        os.chmod(companion, 0o666 if breakage == "others-write" else 0o644 if breakage == "others-read" else 0o600)
        if breakage == "another-user":
            if os.geteuid() != 0:
                pytest.skip("giving a file to another user needs root")
            os.chown(companion, OTHER_UID, -1)
    with pytest.raises(history.HistoryError, match=f"history file {path}{suffix} "):
        history.open_db(path)
    with pytest.raises(history.HistoryError, match=f"{suffix} "):
        history.open_db(path, readonly=True)


@pytest.mark.parametrize("mode", [0o1777, 0o777, 0o770, 0o720])
def test_a_history_in_a_folder_others_may_write_to_is_refused(tmp_path, mode):
    folder = tmp_path / "shared"
    folder.mkdir()
    path = folder / "h.sqlite"
    history.open_db(path).close()
    folder.chmod(mode)
    with pytest.raises(history.HistoryError, match=f"its folder {folder} may be written by others"):
        history.open_db(path)
    with pytest.raises(history.HistoryError, match="may be written by others"):
        history.open_db(path, readonly=True)
    folder.chmod(0o755)
    history.open_db(path).close()  # only ours to write: used


def test_a_world_readable_history_is_refused_and_its_wal_never_made_readable(compiled, messages, sock_path):
    """A privacy-minded user expects no new mail in a file others can read: refused with
    one line (the filter delivers, the server serves without it), no -wal made at all."""
    path = str(compiled) + ".history.sqlite"
    history.open_db(path).close()
    os.chmod(path, 0o644)
    proc = filter_(compiled, messages[0])
    assert proc.returncode in (0, 1, 2) and b"X-Spam-Status" in proc.stdout
    assert proc.stderr.count(b"\n") == 1 and b"may be read by others (mode 0644)" in proc.stderr
    srv = start_server(sock_path, compiled)
    err = stopped(srv)
    assert err.count("may be read by others") == 1, err
    assert not os.path.exists(path + "-wal") and not os.path.exists(path + "-shm")
    os.chmod(path, 0o600)
    assert filter_(compiled, messages[0]).stderr == b""
    for f in (path, path + "-wal", path + "-shm"):
        if os.path.exists(f):
            assert stat.S_IMODE(os.stat(f).st_mode) == 0o600, f
    assert len(rows(path)) == 1


def test_rows_older_than_400_days_are_deleted(tmp_path):
    db = history.open_db(tmp_path / "h.sqlite")
    now = time.time()
    history.write(db, [history.row(b"Subject: s\n\nb", "ham", 0.0, 0.1, via="filter", t=now - days * 86400)
                       for days in (history.ROW_DAYS + 1, history.ROW_DAYS - 1, 0)])
    db.execute("BEGIN")
    history.prune(db, now=now)
    db.execute("COMMIT")
    ages = [round((now - t) / 86400) for (t,) in db.execute("SELECT t FROM verdicts ORDER BY t")]
    assert ages == [history.ROW_DAYS - 1, 0]
    db.close()


def test_recording_prunes_by_itself_every_prune_every_records(tmp_path):
    db = history.open_db(tmp_path / "h.sqlite")
    old = time.time() - (history.ROW_DAYS + 10) * 86400
    raw = b"Subject: s\n\nb"
    history.write(db, [history.row(raw, "ham", 0.0, 0.1, via="filter", t=old)
                       for _ in range(history.PRUNE_EVERY - 1)])
    assert db.execute("SELECT count(*) FROM verdicts").fetchone()[0] == history.PRUNE_EVERY - 1  # not yet
    history.write(db, [history.row(raw, "ham", 0.0, 0.1, via="filter")])  # the PRUNE_EVERY-th record
    assert db.execute("SELECT count(*) FROM verdicts").fetchone()[0] == 1  # the old ones pruned with it
    db.close()


def test_retention_keeps_unsure_bodies_and_only_recent_others(tmp_path):
    path = tmp_path / "h.sqlite"
    db = history.open_db(path)
    now = time.time()
    raw = b"Subject: s\n\nbody\n"
    recs = [history.row(raw, "unsure" if i % 10 == 0 else "ham", 0.0, 0.5, via="filter", t=now - 1000 + i)
            for i in range(100)]
    recs.append(history.row(raw, "unsure", 0.0, 0.5, via="filter", t=now - 40 * 86400))  # too old for a body
    recs.append(history.row(b"x" * (history.MAX_BODY + 1), "unsure", 0.0, 0.5, via="filter"))  # too big
    history.write(db, recs)
    db.execute("BEGIN")
    history.prune(db, keep_recent=5)
    db.execute("COMMIT")
    kept = db.execute("SELECT v.verdict, count(*) FROM bodies b JOIN verdicts v ON v.id = b.id "
                      "GROUP BY v.verdict").fetchall()
    assert dict(kept) == {"unsure": 10, "ham": 5}
    assert db.execute("SELECT count(*) FROM verdicts").fetchone()[0] == 102  # rows stay
    db.close()


def test_serve_records_both_protocols_off_the_delivery_path(compiled, messages, sock_path, tmp_path):
    from spamnb.delivery import fastfilter

    port_sock = socket.socket()
    port_sock.bind(("127.0.0.1", 0))
    port = port_sock.getsockname()[1]
    port_sock.close()
    proc = start_server(sock_path, compiled, "--spamd", f"127.0.0.1:{port}")
    try:
        opts = fastfilter.parse_args(["--model", str(compiled)])
        fastfilter.via_server(sock_path, messages[0], str(compiled), False, opts)
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"CHECK SPAMC/1.5\r\nUser: alice\r\nContent-length: %d\r\n\r\n" % len(messages[1])
                      + messages[1])
            s.shutdown(socket.SHUT_WR)
            while s.recv(4096):
                pass
        path = str(compiled) + ".history.sqlite"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(rows(path)) < 2:
            time.sleep(0.05)
        got = rows(path)
        assert [(r[1], r[4]) for r in got] == [("serve", locate.local_user()), ("spamd", "alice")]
        assert got[0][3] == history.fields(messages[0])["subject"]
        # who connected: spamc's address over TCP; the private socket's client has none
        assert query(path, "SELECT client, helo, env_sender, rcpt, qid FROM verdicts ORDER BY id") == [
            (None,) * 5, ("127.0.0.1", None, None, None, None)]
    finally:
        proc.terminate()
        proc.wait(20)
        proc.stdout.close()
        proc.stderr.close()


def test_serve_no_history_records_nothing(compiled, messages, sock_path):
    from spamnb.delivery import fastfilter

    proc = start_server(sock_path, compiled, "--no-history")
    try:
        opts = fastfilter.parse_args(["--model", str(compiled)])
        fastfilter.via_server(sock_path, messages[0], str(compiled), False, opts)
    finally:
        proc.terminate()
        proc.wait(20)
        proc.stdout.close()
        proc.stderr.close()
    assert not os.path.exists(str(compiled) + ".history.sqlite")


def test_recorder_never_blocks_and_counts_what_it_drops(tmp_path, monkeypatch):
    logged = []
    rec = history.Recorder(tmp_path / "h.sqlite", logged.append)
    monkeypatch.setattr(history, "write", lambda *a, **k: time.sleep(0.5))  # a writer stuck on a slow disk
    rec.queue.maxsize = 3
    t = time.monotonic()
    for _ in range(50):
        rec.add(b"Subject: x\n\nb", "ham", -3.0, 0.01, via="serve")
    assert time.monotonic() - t < 0.4
    assert rec.dropped >= 40 and any("dropped" in line for line in logged)


def test_serve_with_an_unusable_history_serves_without_it(compiled, messages, sock_path):
    from spamnb.delivery import fastfilter

    path = str(compiled) + ".history.sqlite"
    history.open_db(path).close()
    os.chmod(path, 0o666)
    proc = start_server(sock_path, compiled)
    try:
        opts = fastfilter.parse_args(["--model", str(compiled)])
        out, label = fastfilter.via_server(sock_path, messages[0], str(compiled), False, opts)
        assert b"X-Spam-Status" in out
    finally:
        err = stopped(proc)
    assert "not recording the history" in err and "may be written by others" in err
    assert rows(path) == []


def test_serve_records_without_its_log_lines(compiled, messages, sock_path):
    """The history is handed each message where the line per message is written
    (spamnb.delivery.events), lines or not (--no-log-messages)."""
    from spamnb.delivery import fastfilter

    proc = start_server(sock_path, compiled, "--no-log-messages")
    try:
        opts = fastfilter.parse_args(["--model", str(compiled)])
        fastfilter.via_server(sock_path, messages[0], str(compiled), False, opts)
        path = str(compiled) + ".history.sqlite"
    finally:
        err = stopped(proc)
    assert [(r[0] in ("ham", "spam", "unsure"), r[1]) for r in rows(path)] == [(True, "serve")]  # written at the stop
    assert "event=message" not in err and "recording verdicts in" in err


# -- corrections learned outside the page ----------------------------------------------


def learn_cli(way, model, label, *files, command="learn"):
    """``spamnb learn`` by its fast path (run where click and numpy cannot import: any
    fall-back to the click command fails) or by the click command (``--strict``)."""
    args = [command, f"--{label}", "--model", str(model), *map(str, files)]
    if way == "click":
        return subprocess.run(SPAMNB + [args[0], "--strict", *args[1:]], capture_output=True)
    code = ("import sys\nsys.modules['spamnb.cli'] = sys.modules['numpy'] = None\n"
            f"sys.argv = ['spamnb', *{args!r}]\nfrom spamnb._entry import main\nmain()\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True)


def corrections(path):
    return query(path, "SELECT message_id, verdict, corrected, corrected_t IS NOT NULL FROM verdicts "
                       "WHERE corrected IS NOT NULL ORDER BY id")


@pytest.mark.parametrize("way", ["fast", "click"])
def test_spamnb_learn_marks_the_row_of_each_message_it_learns(compiled, messages, tmp_path, way):
    """`spamnb learn` is the user's correction: the row of each message learned (by its
    Message-ID, in the history beside the model) says so, as the page's choice does;
    a message never filtered has no row, and nothing else is marked."""
    path = str(compiled) + ".history.sqlite"
    judged = messages[:3]
    for raw in judged:
        assert filter_(compiled, raw).returncode in (0, 1, 2)
    verdicts = [r[0] for r in rows(path)]
    told = ["ham" if v == "spam" else "spam" for v in verdicts]
    files = []
    for i, raw in enumerate([*judged, messages[5]]):
        assert history.fields(raw)["message_id"]
        files.append(tmp_path / f"{i}.eml")
        files[-1].write_bytes(raw)
    proc = learn_cli(way, compiled, told[0], files[0], files[3])  # [3]: never filtered
    assert proc.returncode == 0 and proc.stderr.decode().startswith(f"learned 2 as {told[0]}"), proc.stderr
    assert b"history" not in proc.stderr
    assert corrections(path) == [(history.fields(judged[0])["message_id"], verdicts[0], told[0], 1)]
    assert len(rows(path)) == 3 and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    kind = {"spam": "false positive", "ham": "false negative", "unsure": "unsure taught"}[verdicts[0]]
    assert list(Site(str(compiled), False, path).corrections().values()) == [{kind: 1}]  # the Overview's chart
    # forget undoes learn exactly, the history's mark included; forgetting under the
    # other class (nothing learned so) leaves a mark alone
    assert learn_cli(way, compiled, told[1], files[1]).returncode == 0
    assert len(corrections(path)) == 2
    proc = learn_cli(way, compiled, told[0], files[0], command="forget")
    assert proc.returncode == 0 and b"history" not in proc.stderr, proc.stderr
    assert corrections(path) == [(history.fields(judged[1])["message_id"], verdicts[1], told[1], 1)]
    other = "ham" if told[1] == "spam" else "spam"
    learn_cli(way, compiled, other, files[1], command="forget")
    assert len(corrections(path)) == 1


@pytest.mark.parametrize("way", ["fast", "click"])
def test_learning_again_what_was_learned_marks_nothing(compiled, messages, tmp_path, way):
    """A message learned as spam, delivered again (a newer row of it), then learned as spam
    again in a batch with a new one: the model changes for the new one only, so its row
    alone is marked; the newer row of the one learned already stays as it was, and the
    summary counts it apart. Learning the batch once more changes and marks nothing."""
    from spamnb.storage.modelfile import load_model

    path = str(compiled) + ".history.sqlite"
    old, new = messages[0], messages[1]
    files = [tmp_path / "old.eml", tmp_path / "new.eml"]
    for f, raw in zip(files, (old, new)):
        f.write_bytes(raw)
    assert filter_(compiled, old).returncode in (0, 1, 2)
    assert learn_cli(way, compiled, "spam", files[0]).returncode == 0
    for raw in (old, new):  # the old one comes again: a newer row of it
        assert filter_(compiled, raw).returncode in (0, 1, 2)
    counts = load_model(compiled).messages.tolist()
    proc = learn_cli(way, compiled, "spam", *files)
    assert proc.returncode == 0 and proc.stderr == b"learned 1 as spam, moved 0; already learned: 1\n", proc.stderr
    assert load_model(compiled).messages.tolist() == [counts[0], counts[1] + 1]
    marks = query(path, "SELECT id, corrected FROM verdicts ORDER BY id")
    assert marks == [(1, "spam"), (2, None), (3, "spam")]
    proc = learn_cli(way, compiled, "spam", *files)
    assert proc.stderr == b"learned 0 as spam, moved 0; already learned: 2\n", proc.stderr
    assert query(path, "SELECT id, corrected FROM verdicts ORDER BY id") == marks
    assert load_model(compiled).messages.tolist() == [counts[0], counts[1] + 1]
    proc = subprocess.run(SPAMNB + ["learned", "--spam", "--model", str(compiled), *map(str, files)],
                          capture_output=True)  # the journal's learning, read back
    assert proc.returncode == 0 and proc.stdout.decode().count(": learned as spam\n") == 2, proc


def test_the_overview_counts_the_three_kinds_of_correction_web_md_describes(tmp_path):
    """Spam taught as ham, ham as spam, unsure either way: the Overview's kinds, each named in
    docs/web.md's table; a verdict taught as it stood is no correction and is left out."""
    import re

    from conftest import ROOT
    from spamnb.web.data import CORRECTIONS

    path = tmp_path / "h.sqlite"
    pairs = [("spam", "ham"), ("ham", "spam"), ("unsure", "spam"), ("unsure", "ham"), ("spam", "spam"),
             ("ham", "ham")]
    db = history.open_db(path)
    try:
        history.write(db, [history.row(f"Subject: {i}\n\nbody {i}\n".encode(), verdict, 0.0, 0.5, via="filter")
                           for i, (verdict, _) in enumerate(pairs)])
        for i, (_, taught) in enumerate(pairs, 1):
            history.mark(db, i, taught)
    finally:
        db.close()
    (day, kinds), = Site(str(tmp_path / "m"), False, str(path)).corrections().items()
    assert kinds == {"false positive": 1, "false negative": 1, "unsure taught": 2}
    table = (ROOT / "docs" / "web.md").read_text().split("### Overview")[1].split("###")[0]
    assert set(re.findall(r"^\| ([a-z ]+) \| (?:spam|ham|unsure) \|", table, re.M)) == set(CORRECTIONS)


def test_spamnb_learn_without_a_history_or_behind_a_locked_one_learns(compiled, messages, tmp_path):
    """No history: none is made. A locked one: the learning stands, a line says the
    correction was not recorded, and the wait is bounded."""
    path = str(compiled) + ".history.sqlite"
    msg = tmp_path / "m.eml"
    msg.write_bytes(messages[0])
    proc = learn_cli("fast", compiled, "spam", msg)
    assert proc.returncode == 0 and proc.stderr.startswith(b"learned 1 as spam") and not os.path.exists(path)
    assert filter_(compiled, messages[1]).returncode in (0, 1, 2)
    msg.write_bytes(messages[1])
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        for way in ("fast", "click"):
            t = time.monotonic()
            proc = learn_cli(way, compiled, "ham" if way == "fast" else "spam", msg)
            took = time.monotonic() - t
            assert proc.returncode == 0 and b"\nlearned " in proc.stderr  # the second moves it
            assert b"correction not recorded" in proc.stderr and b"locked" in proc.stderr
            assert took < 30  # BUSY_MS of waiting; the rest is the process start on a shared machine
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert corrections(path) == []


def test_a_history_made_before_corrections_gets_its_index_at_the_first(tmp_path):
    """Rows are found by Message-ID through an index; a history made before has none
    until its first correction makes it. Newest row of the Message-ID (and the user
    when given), and a correction to the class it already has is not made again."""
    path = str(tmp_path / "h.sqlite")
    db = history.open_db(path)
    db.execute("DROP INDEX verdicts_mid")
    raw = b"Message-ID: <a@b>\r\nSubject: s\r\n\r\nbody"
    history.write(db, [history.row(raw, "ham", -5, 0.01, via="spamd", user=u, t=t)
                       for u, t in (("alice", 1.0), ("alice", 2.0), ("bob", 3.0))])
    db.close()
    history.correct_now(path, [raw], "spam", log=print, user="alice")
    db = sqlite3.connect(path)
    assert db.execute("SELECT name FROM sqlite_master WHERE name = 'verdicts_mid'").fetchone()
    got = db.execute("SELECT user, t, corrected FROM verdicts ORDER BY id").fetchall()
    first = db.execute("SELECT corrected_t FROM verdicts WHERE corrected IS NOT NULL").fetchone()
    assert got == [("alice", 1.0, None), ("alice", 2.0, "spam"), ("bob", 3.0, None)]
    db.close()
    history.correct_now(path, [raw], "spam", log=print, user="alice")
    history.correct_now(path, [raw], "ham", log=print)  # any user's: the newest
    db = sqlite3.connect(path)
    assert db.execute("SELECT corrected_t FROM verdicts WHERE user = 'alice' AND corrected IS NOT NULL"
                      ).fetchone() == first
    assert db.execute("SELECT user, corrected FROM verdicts WHERE id = 3").fetchone() == ("bob", "ham")
    db.close()


def twins():
    """Two different messages that share a Message-ID (a spammer's reuse, a list's copy)."""
    head = b"From: a@example.org\nTo: b@example.org\nSubject: %s\nMessage-ID: <same@ex>\n\n"
    return head % b"first" + b"meeting agenda lunch tomorrow\n", head % b"second" + b"cheap pills now\n"


@pytest.mark.parametrize("way", ["fast", "click"])
def test_learn_marks_its_own_message_not_another_sharing_its_message_id(compiled, tmp_path, way):
    """Both messages filtered, the second last: `spamnb learn` of the first marks the first's
    row, not the newest row of the Message-ID; a copy of it as delivered (spamnb's header
    added, CRLF line ends) is still the first; a TELL-like correction of the second marks
    the second's."""
    path = str(compiled) + ".history.sqlite"
    first, second = twins()
    for raw in (first, second):
        assert filter_(compiled, raw).returncode in (0, 1, 2)
    msg = tmp_path / "first.eml"
    msg.write_bytes((b"X-Spam-Status: No, score=-3.0\n" + first).replace(b"\n", b"\r\n"))
    proc = learn_cli(way, compiled, "spam", msg)
    assert proc.returncode == 0 and b"history" not in proc.stderr, proc.stderr
    assert query(path, "SELECT subject, corrected FROM verdicts ORDER BY id") == [("first", "spam"), ("second", None)]
    history.correct_now(path, [second], "ham", log=print)
    assert query(path, "SELECT subject, corrected FROM verdicts ORDER BY id") == [("first", "spam"), ("second", "ham")]


#: The table of a history of version 2, as spamnb made it before rows held the envelope.
SCHEMA_V2 = """
CREATE TABLE IF NOT EXISTS verdicts (
    id INTEGER PRIMARY KEY,
    t REAL NOT NULL,            -- seconds since the epoch
    verdict TEXT NOT NULL,      -- spam, ham, unsure: as delivered
    score REAL,                 -- log-odds
    p REAL,                     -- P(spam|message)
    sender TEXT, subject TEXT, message_id TEXT,
    user TEXT,                  -- the spamd User, the IMAP account, the local user
    size INTEGER,
    via TEXT,                   -- serve, spamd, filter, imap
    dest TEXT,                  -- where it went, when spamnb knows (an IMAP folder)
    learned TEXT,               -- the label filter -u's rule learned it as, at delivery
    corrected TEXT,             -- the label the user taught: the page, an IMAP move, TELL, spamnb learn
    corrected_t REAL,
    now_verdict TEXT,           -- after the last re-scoring on the page
    now_score REAL,
    ham_cut REAL, spam_cut REAL, -- the cut-offs the verdict was decided with (re-scoring uses them)
    message_key BLOB            -- the message's identity (spamnb.mail.identity.message_key): its corrections
);
CREATE INDEX IF NOT EXISTS verdicts_t ON verdicts (t);
CREATE INDEX IF NOT EXISTS verdicts_verdict ON verdicts (verdict, id);
CREATE TABLE IF NOT EXISTS bodies (id INTEGER PRIMARY KEY, raw BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS verdicts_mid ON verdicts (message_id, id);
"""


def old_history(path, version, records):
    """A history of ``version`` (1: rows without their message's key; 2: without the
    envelope) at ``path``, made as spamnb made it then, holding the verdicts of ``records``
    (``(t, raw)``, ham, user u, via spamd), each kept whole."""
    import re

    schema = SCHEMA_V2
    if version == 1:
        schema = re.sub(r"\n\s*message_key BLOB[^\n]*", "", schema).replace("spam_cut REAL,", "spam_cut REAL")
    db = sqlite3.connect(path)
    db.executescript(schema + f"PRAGMA user_version = {version};")
    for t, raw in records:
        cols, body = history.row(raw, "ham", -3.0, 0.1, via="spamd", user="u", t=t)
        for k in history.ENVELOPE_COLUMNS + (("message_key",) if version == 1 else ()):
            cols.pop(k)
        cur = db.execute(f"INSERT INTO verdicts ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                         list(cols.values()))
        db.execute("INSERT INTO bodies (id, raw) VALUES (?, ?)", (cur.lastrowid, body))
    db.commit()
    db.close()
    os.chmod(path, 0o600)


def test_a_history_whose_rows_lack_their_messages_key_is_upgraded_and_its_rows_found_by_message_id(tmp_path):
    """A history of version 1 (no message_key column): opened for writing, it gets the column
    (and the envelope's: version 3); its old rows keep none and a correction finds them by Message-ID alone, the
    newest as before; a row recorded since holds its key and is not taken for another message."""
    path = str(tmp_path / "h.sqlite")
    first, second = twins()
    old_history(path, 1, [(1e9, first), (1e9 + 1, second)])
    history.correct_now(path, [first], "spam", log=print, user="u")  # old rows: by Message-ID, the newest
    assert query(path, "PRAGMA user_version") == [(3,)]
    assert query(path, "SELECT subject, corrected, message_key FROM verdicts ORDER BY id") == [
        ("first", None, None), ("second", "spam", None)]
    history.record_now(path, second, "spam", 3.0, 0.9, log=print, via="spamd", user="u")
    history.correct_now(path, [first], "ham", log=print, user="u")  # the new row is the other message's
    got = query(path, "SELECT subject, corrected, message_key IS NOT NULL FROM verdicts ORDER BY id")
    assert got == [("first", None, 0), ("second", "ham", 0), ("second", None, 1)]
    history.correct_now(path, [second], "spam", log=print, user="u")  # its own row, the newest
    assert query(path, "SELECT corrected FROM verdicts WHERE id = 3") == [("spam",)]


def test_a_history_of_version_2_gets_the_envelope_columns_once_and_keeps_its_rows(tmp_path):
    """A history made before rows held the envelope (version 2): read-only it is read as it is;
    opened for writing it gets the envelope's columns (version 3), once, its rows and messages
    intact and without an envelope (NULL); a verdict recorded since holds its envelope."""
    path = str(tmp_path / "h.sqlite")
    first, second = twins()
    old_history(path, 2, [(1e9, first), (1e9 + 1, second)])
    every = "SELECT * FROM verdicts ORDER BY id"
    before, bodies = query(path, every), query(path, "SELECT id, raw FROM bodies ORDER BY id")
    history.open_db(path, readonly=True).close()
    assert query(path, "PRAGMA user_version") == [(2,)]
    db = history.open_db(path, create=False)
    history.upgrade(db)  # a second process that opened it at the same time: nothing more to add
    db.close()
    history.open_db(path).close()
    assert query(path, "PRAGMA user_version") == [(3,)]
    columns = [c[1] for c in query(path, "PRAGMA table_info(verdicts)")]
    assert columns[-5:] == list(history.ENVELOPE_COLUMNS) and len(columns) == len(set(columns))
    assert [r[:-5] for r in query(path, every)] == before and [r[-5:] for r in query(path, every)] == [(None,) * 5] * 2
    assert query(path, "SELECT id, raw FROM bodies ORDER BY id") == bodies
    history.record_now(path, first, "spam", 3.0, 0.9, log=print, via="milter", user="bob", raddr="192.0.2.9",
                       envelope={"helo": "client.example.net", "sender": "a@example.org", "rcpt": "bob@example.com",
                                 "qid": "4ABC123"})
    history.correct_now(path, [second], "spam", log=print, user="u")  # an old row, found by its key
    got = query(path, "SELECT subject, client, helo, env_sender, rcpt, qid, corrected FROM verdicts ORDER BY id DESC")
    assert got == [("first", "192.0.2.9", "client.example.net", "a@example.org", "bob@example.com", "4ABC123", None),
                   ("second", None, None, None, None, None, "spam"), ("first", None, None, None, None, None, None)]


def test_envelope_columns_are_one_bounded_line_each():
    """What a client sends in its envelope is recorded as the header fields are: one line, no
    control or bidirectional character, at most 300 characters; what is not known, nothing."""
    got = history.envelope_columns("192.0.2.9\r\nX", {"helo": "evil\x1b[2J\u202ename", "sender": "a" * 5000,
                                                       "rcpt": "b@x,\n c@y", "qid": "", "other": "ignored"})
    assert got == {"client": "192.0.2.9 X", "helo": "evil\ufffd[2J\ufffdname", "env_sender": "a" * 300,
                   "rcpt": "b@x, c@y", "qid": None}
    assert history.envelope_columns("\ud800x", None) == {"client": "\ufffdx", "helo": None, "env_sender": None,
                                                         "rcpt": None, "qid": None}
    assert history.envelope_columns() == dict.fromkeys(history.ENVELOPE_COLUMNS)


# -- spamnb history: the history listed and searched from the command line ----------------


def listed(path, days_ago=(10, 1, 0)):
    """A history at ``path`` of three verdicts ``days_ago`` days old: Bob's spam with a hostile
    Subject (an escape, a right-to-left override, a tab), Alice's ham from José, her unsure
    taught as spam, which came through the milter (its envelope recorded)."""
    now = time.time()
    raws = [b"From: spam@bad.example\nSubject: Cheap \x1b[31mPILLS\xe2\x80\xae now\tforever " + b"and ever " * 9
            + b"\nMessage-ID: <b2@x>\n\nbuy\n",
            b"From: =?utf-8?q?Jos=C3=A9?= <j@example.org>\nSubject: =?utf-8?q?caf=C3=A9_menu?=\n"
            b"Message-ID: <a1@x>\n\nhi\n",
            b"From: who@example.org\nSubject: maybe\nMessage-ID: <c3@x>\n\nhmm\n"]
    db = history.open_db(path)
    try:
        smtp = [{}, {}, {"via": "milter", "raddr": "192.0.2.9", "envelope": {
            "helo": "mx.lists.example.net", "sender": "bounces@lists.example.net",
            "rcpt": "alice@example.com,carol@example.com", "qid": "4ABC123"}}]
        history.write(db, [history.row(raw, label, score, 0.5, user=user, t=now - ago * 86400,
                                       **{"via": "filter", **kw})
                           for raw, label, score, user, ago, kw in zip(raws, ("spam", "ham", "unsure"),
                                                                       (20.5, -8.0, 0.3), ("bob", "alice", "alice"),
                                                                       days_ago, smtp)])
        history.mark(db, 3, "spam")
    finally:
        db.close()
    return raws


def spamnb_history(*args, code=0):
    from test_cli import run

    return run(["history", *map(str, args)], code=code)


def test_history_lists_the_newest_first_one_printable_line_each(tmp_path):
    path = tmp_path / "h.sqlite"
    listed(path)
    res = spamnb_history("--history", path)
    head, *lines = res.stdout.splitlines()
    assert head.split() == ["time", "verdict", "score", "taught", "from", "subject", "message-id"]
    assert [line.split()[2:5] for line in lines] == [["unsure", "+0.30", "spam"], ["ham", "-8.00", "-"],
                                                    ["spam", "+20.50", "-"]]
    assert "José <j@example.org>" in lines[1] and "café menu" in lines[1]  # decoded
    hostile = lines[2]
    assert "\x1b" not in hostile and "\u202e" not in hostile and "\t" not in hostile
    assert "Cheap \ufffd[31mPILLS\ufffd now forever and" in hostile and "…  <b2@x>" in hostile  # clipped, Message-ID whole
    assert len({line.rindex("  <") for line in lines}) == 1  # the Message-IDs line up
    assert res.stderr == f"3 of 3 verdicts matching, newest first, in {path}\n"


def test_history_searches_as_the_page_does(tmp_path):
    """--verdict, --search, --user, --since/--until (a day or a time ago), --limit: the rows the
    page's search gives, through its own query."""
    import json

    path = tmp_path / "h.sqlite"
    listed(path)

    def mids(*args):
        res = spamnb_history("--history", path, "--format", "jsonl", *args)
        return [json.loads(line)["message_id"] for line in res.stdout.splitlines()]

    assert mids() == ["<c3@x>", "<a1@x>", "<b2@x>"]
    assert mids("--verdict", "spam") == ["<b2@x>"]
    assert mids("--search", "café") == ["<a1@x>"] and mids("--search", "EXAMPLE.ORG") == ["<c3@x>", "<a1@x>"]
    assert mids("--user", "alice") == ["<c3@x>", "<a1@x>"] and mids("--user", "carol") == []
    assert mids("--since", "2d") == ["<c3@x>", "<a1@x>"] and mids("--since", "12h") == ["<c3@x>"]
    assert mids("--until", "2d") == ["<b2@x>"]
    today = time.strftime("%Y-%m-%d")
    assert mids("--since", today, "--until", today) == ["<c3@x>"]
    assert mids("--limit", "1") == ["<c3@x>"]
    site = Site(str(tmp_path / "m"), False, str(path))
    assert [r["message_id"] for r in site.search(user="alice", since=time.time() - 2 * 86400)[0]] == \
        mids("--user", "alice", "--since", "2d")
    # the envelope's sender and recipients are searched too, From still the header's
    assert mids("--search", "lists.example") == ["<c3@x>"] and mids("--search", "CAROL@") == ["<c3@x>"]
    assert [r["message_id"] for r in site.search(q="carol@")[0]] == ["<c3@x>"]
    row = json.loads(spamnb_history("--history", path, "--format", "jsonl", "--limit", "1").stdout)
    assert (row["verdict"], row["corrected"], row["user"], row["kept"]) == ("unsure", "spam", "alice", True)
    assert (row["via"], row["sender"], row["client"], row["helo"], row["env_sender"], row["rcpt"], row["qid"]) == (
        "milter", "who@example.org", "192.0.2.9", "mx.lists.example.net", "bounces@lists.example.net",
        "alice@example.com,carol@example.com", "4ABC123")
    older = json.loads(spamnb_history("--history", path, "--format", "jsonl").stdout.splitlines()[1])
    assert [older[k] for k in ("client", "helo", "env_sender", "rcpt", "qid")] == [None] * 5  # none known
    tsv = spamnb_history("--history", path, "--format", "tsv").stdout.splitlines()
    assert all(line.count("\t") == 23 for line in tsv) and "\x1b" not in tsv[2]
    assert tsv[0].split("\t")[-5:] == ["192.0.2.9", "mx.lists.example.net", "bounces@lists.example.net",
                                       "alice@example.com,carol@example.com", "4ABC123"]
    assert tsv[1].split("\t")[-5:] == [""] * 5


def test_history_reads_the_file_beside_the_model_and_says_what_is_wrong_in_one_line(tmp_path):
    model = tmp_path / "model.joblib"
    listed(str(model) + ".history.sqlite")
    assert spamnb_history("--model", model).stdout.count("\n") == 4  # the history beside the model as named
    res = spamnb_history("--model", tmp_path / "other.joblib", code=1)
    assert res.stderr.startswith("spamnb: error: no history at ") and res.stderr.count("\n") == 1
    assert not (tmp_path / "other.joblib.history.sqlite").exists()  # reading makes none
    for bad in ("yesterday", "7y", "-3d"):
        res = spamnb_history("--model", model, "--since", bad, code=2)
        assert "neither a day (YYYY-MM-DD) nor a time ago" in res.stderr and "Traceback" not in res.stderr
    os.chmod(str(model) + ".history.sqlite", 0o644)
    res = spamnb_history("--model", model, code=1)
    assert "may be read by others" in res.stderr and res.stderr.count("\n") == 1
    os.chmod(str(model) + ".history.sqlite", 0o600)
    db = sqlite3.connect(str(model) + ".history.sqlite")
    db.execute("UPDATE verdicts SET t = 1e300 WHERE id = 2")
    db.commit()
    db.close()
    res = spamnb_history("--model", model, code=1)
    assert "malformed row (verdict 2" in res.stderr and res.stderr.count("\n") == 1
