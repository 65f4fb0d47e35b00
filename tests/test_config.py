"""Configuration files: lookup order, sources, checks, trust, and the [decision]
table overriding the model's cut-offs on every way of answering, reloaded by a
running server on SIGHUP and `spamnb config reload` without dropping a connection."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time

import pytest

from conftest import filter_message
from spamnb.storage.scorer import fresh_scorer
from spamnb.verdict import Decision
from test_e2e import SPAMNB
from test_fastpath import compiled, messages  # noqa: F401 (compiled: a fixture)
from test_server import start_server

SPAMC = shutil.which("spamc")
needs_spamc = pytest.mark.skipif(SPAMC is None, reason="spamc is not installed (apt-get install spamc; "
                                                       "the README's test command does it when run as root)")
#: cut-offs under which nothing is spam or ham: every message is unsure
ALL_UNSURE = "[decision]\nspam_cutoff = 1.0\nham_cutoff = 0.0\n"


def run(*args, input=None, env=None):
    return subprocess.run(SPAMNB + [str(a) for a in args], input=input, capture_output=True, timeout=120,
                          env={**os.environ, **(env or {})})


def write(path, text, mode=0o644):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.fixture
def system_file():
    return write(__import__("pathlib").Path(os.environ["SPAMNB_SYSTEM_CONFIG"]), "")


@pytest.fixture
def user_file():
    return __import__("pathlib").Path(os.environ["HOME"]) / ".config" / "spamnb" / "config.toml"


@pytest.fixture
def a_spam(compiled):
    sc = fresh_scorer(str(compiled))
    return next(raw for raw in messages() if filter_message(sc, raw, "m")[1] == "spam")


def setting(out, table, key):
    """The line of ``key`` in ``spamnb config``'s output under ``[table]``."""
    section = out.split(f"[{table}]\n", 1)[1].split("\n\n", 1)[0]
    return next(line for line in section.splitlines() if line.startswith((f"{key} ", f"# {key}:")))


# -- lookup order and sources ---------------------------------------------------------


def test_each_source_overrides_the_one_before(system_file, user_file, tmp_path, compiled):
    write(system_file, "[serve]\nmax_bytes = 1000\ntimeout = 5.0\nmax_connections = 7\n[model]\npath = '/srv/spamnb/model.joblib'\n")
    write(user_file, "[serve]\ntimeout = 6.0\nmax_connections = 8\n")
    named = write(tmp_path / "named.toml", "[serve]\nmax_connections = 9\n")
    res = run("config", env={"SPAMNB_CONFIG": str(named), "SPAMNB_MODEL": str(compiled)})
    out = res.stdout.decode()
    assert res.returncode == 0, res.stderr
    assert setting(out, "serve", "max_bytes") == f"max_bytes = 1000  # system file {system_file}:2"
    assert setting(out, "serve", "timeout") == f"timeout = 6.0  # user file {user_file}:2"
    assert setting(out, "serve", "max_connections") == f"max_connections = 9  # config file {named}:2"
    assert setting(out, "model", "path") == f'path = "{compiled}"  # environment $SPAMNB_MODEL'
    assert setting(out, "serve", "pidfile") == "# pidfile: unset (default)"
    assert setting(out, "serve", "socket").startswith("# socket: unset")
    # one command line's settings: an option over all of them
    out = run("config", "--command", "serve --timeout 3 --spamd 783",
              env={"SPAMNB_CONFIG": str(named), "SPAMNB_MODEL": str(compiled)}).stdout.decode()
    assert setting(out, "serve", "timeout") == "timeout = 3.0  # option"
    assert setting(out, "serve", "max_connections") == f"max_connections = 9  # config file {named}:2"
    assert setting(out, "serve", "max_bytes") == f"max_bytes = 1000  # system file {system_file}:2"
    assert setting(out, "spamd", "listen") == 'listen = ["783"]  # option'
    assert setting(out, "model", "path") == f'path = "{compiled}"  # environment $SPAMNB_MODEL'
    assert "[imap]" not in out
    # the global --config wins over $SPAMNB_CONFIG
    other = write(tmp_path / "other.toml", "[serve]\nmax_connections = 10\n")
    out = run("--config", other, "config", env={"SPAMNB_CONFIG": str(named)}).stdout.decode()
    assert setting(out, "serve", "max_connections") == f"max_connections = 10  # config file {other}:2"


def test_an_option_overrides_the_files(system_file, compiled, a_spam):
    write(system_file, ALL_UNSURE)
    assert b"tests=SPAMNB_UNSURE" in run("filter", "--model", compiled, input=a_spam).stdout
    res = run("filter", "--model", compiled, "--spam-cutoff", "0.9", input=a_spam)
    assert b"X-Spam-Status: Yes" in res.stdout and res.returncode == 0
    # the decision is one unit: costs on the command line set it whole, over a file's cut-offs
    res = run("filter", "--model", compiled, "--evidence", "1", "--cost-fp", "10", input=a_spam)
    assert b"X-Spam-Status: Yes" in res.stdout, res.stderr


def test_the_imap_file_is_read_as_the_imap_table(user_file, tmp_path):
    imap = write(user_file.parent / "imap.toml", 'host = "mail.example.org"\nuser = "me"\n', mode=0o600)
    out = run("config").stdout.decode()
    assert setting(out, "imap", "host") == f'host = "mail.example.org"  # imap file {imap}:1'
    write(user_file, '[imap]\nhost = "imap.example.org"\n')
    out = run("config").stdout.decode()
    assert setting(out, "imap", "host") == f'host = "mail.example.org"  # imap file {imap}:1'
    res = run("imap", "filter", "--dry-run", "--password-file", "/nonexistent")
    assert "is read as the [imap] table" in res.stderr.decode()


def test_the_imap_file_keys_the_check_passes_are_the_imap_commands_too(user_file):
    """imap.toml's values come only through the layers: a key `config --check` passes
    (interval, learn_verdicts) is one `imap filter` takes, not an unknown key."""
    write(user_file.parent / "imap.toml", 'host = "mail.example.org"\nuser = "me"\ninterval = 60\n'
                                          'learn_verdicts = false\n', mode=0o600)
    assert run("config", "--check").returncode == 0
    res = run("imap", "filter", "--dry-run", "--password-file", "/nonexistent")
    assert res.returncode == 1 and "unknown key" not in res.stderr.decode(), res.stderr
    assert "/nonexistent" in res.stderr.decode()


# -- checks -----------------------------------------------------------------------------


@pytest.mark.parametrize("text, line, words, command", [
    ("[serve]\nmax_bytes = 5\nmax_conections = 3\n", 3, "unknown key 'max_conections' in [serve]", "info"),
    ("[servve]\nmax_bytes = 5\n", 1, "unknown table [servve]", "info"),
    ("[serve]\n\ntimeout = 'ten'\n", 3, "[serve] timeout: must be a number, got 'ten'", "serve"),
    ("[serve]\nmax_connections = 0\n", 2, "[serve] max_connections: must be at least 1, got 0", "serve"),
    ("[spamd]\nallow_tell = 'yes'\n", 2, "[spamd] allow_tell: must be true or false", "serve"),
    ("[log]\nformat = 'xml'\n", 2, "[log] format: must be one of 'text', 'json', got 'xml'", "serve"),
    ("[decision]\nspam_cutoff = 0.2\nham_cutoff = 0.5\n", 3, "need 0 <= ham_cutoff <= spam_cutoff <= 1",
     "classify"),
    ("[decision]\nspam_cutoff = 0.99\ncost_fp = 5\n", 3, "either costs or cut-offs", "classify"),
    ("[serve\n", 1, "Expected ']'", "info"),
])
def test_check_names_file_and_line(tmp_path, text, line, words, command):
    bad = write(tmp_path / "bad.toml", text)
    res = run("config", "--check", bad)
    err = res.stderr.decode()
    assert res.returncode == 2, err
    assert f"{bad}:{line}: " in err and words in err, err
    # the same file as the system file: a command that takes the key (any command, for an unknown key
    # or a file that is no TOML) refuses it, naming it
    res = run("config", "--check", env={"SPAMNB_SYSTEM_CONFIG": str(bad)})
    assert res.returncode == 2 and f"{bad}:{line}: " in res.stderr.decode()
    res = run(command, env={"SPAMNB_SYSTEM_CONFIG": str(bad)})
    assert res.returncode == 2 and f"{bad}:{line}: " in res.stderr.decode()


def test_check_accepts_a_good_file(tmp_path):
    good = write(tmp_path / "good.toml", "[decision]\nspam_cutoff = 0.99\n[spamd]\nlisten = ['127.0.0.1:7830']\n"
                                         "allow = ['10.0.0.0/8']\n[log]\nformat = 'json'\n[imap]\nport = 993\n")
    res = run("config", "--check", good)
    assert res.returncode == 0 and res.stdout.decode().strip() == f"{good}: ok"


def test_a_file_others_can_write_is_refused(system_file, compiled, a_spam):
    write(system_file, ALL_UNSURE, mode=0o666)
    res = run("config", "--check")
    assert res.returncode == 2 and "others could change" in res.stderr.decode()
    # filter never loses the message: it passes it through, exit 3
    res = run("filter", "--model", compiled, input=a_spam)
    assert res.returncode == 3 and res.stdout == a_spam
    assert "others could change" in res.stderr.decode()


def test_a_broken_file_passes_filtered_mail_through(system_file, compiled, a_spam):
    write(system_file, "[filter]\nexit_zero = 3\n")
    for extra in ([], ["--evidence", "2"]):
        res = run("filter", "--model", compiled, *extra, input=a_spam)
        assert res.returncode == 3 and res.stdout == a_spam, res.stderr
        assert "[filter] exit_zero: must be true or false" in res.stderr.decode()


# -- [decision] on every path -------------------------------------------------------------


def test_decision_overrides_the_model_on_every_local_path(system_file, compiled, a_spam, tmp_path):
    msg = tmp_path / "msg.eml"
    msg.write_bytes(a_spam)

    def classified():
        return run("classify", "--model", compiled, "--format", "tsv", msg).stdout.split(b"\n")[0].split(b"\t")[1]

    assert classified() == b"spam"
    write(system_file, ALL_UNSURE)
    assert classified() == b"unsure"
    # filter: the fast path (scorer + journal) and the full click path (--evidence)
    for extra in ([], ["--evidence", "1"]):
        res = run("filter", "--model", compiled, *extra, input=a_spam)
        assert res.returncode == 2 and b"tests=SPAMNB_UNSURE" in res.stdout, (extra, res.stderr)
    # sort: nothing is filed as spam
    md = tmp_path / "Maildir"
    for sub in ("cur", "new", "tmp"):
        (md / sub).mkdir(parents=True)
    (md / "new" / "1.eml").write_bytes(a_spam)
    res = run("sort", "--model", compiled, md)
    assert res.returncode == 0 and (md / "new" / "1.eml").exists(), res.stderr
    # imap filter's judge
    from spamnb.cli.imap import _judge_and_learn

    judge, _ = _judge_and_learn(str(compiled), decision=Decision(spam_cutoff=1.0, ham_cutoff=0.0))
    assert judge(a_spam)[0] == "unsure"


def test_decision_applies_through_the_server(system_file, compiled, a_spam, tmp_path):
    sock = str(tmp_path / "run" / "socket")
    proc = start_server(sock, compiled)
    try:
        write(system_file, ALL_UNSURE)
        res = run("filter", "--model", compiled, "--socket", sock, input=a_spam)  # checks the file
        assert res.returncode == 2 and b"tests=SPAMNB_UNSURE" in res.stdout
        # the server's answer, asked by the fast client, which sends the files' decision
        from spamnb.delivery import fastfilter

        opts = fastfilter.settings_of(["--model", str(compiled)])
        out, label = fastfilter.via_server(sock, a_spam, str(compiled), False, opts)
        assert label == "unsure" and b"tests=SPAMNB_UNSURE" in out
        res = run("filter", "--model", compiled, "--socket", sock, input=a_spam)  # the fast path
        assert res.returncode == 2 and b"tests=SPAMNB_UNSURE" in res.stdout
    finally:
        proc.terminate()
        proc.wait(10)


def spamc_says(port, raw):
    """spamc -c's exit status: 1 spam, 0 not spam."""
    return subprocess.run([SPAMC, "-c", "-d", "127.0.0.1", "-p", str(port)], input=raw, capture_output=True,
                          timeout=30).returncode


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def until(check, seconds=10.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


@needs_spamc
def test_spamd_takes_the_decision_and_rereads_it_on_sighup(system_file, compiled, a_spam, tmp_path):
    port = free_port()
    sock = str(tmp_path / "run" / "socket")
    write(system_file, ALL_UNSURE)
    proc = start_server(sock, compiled, "--spamd", str(port), "--pidfile", str(tmp_path / "pid"))
    try:
        assert until(lambda: spamc_says(port, a_spam) in (0, 1))
        assert spamc_says(port, a_spam) == 0  # unsure: not spam to spamc
        # a connection open across the reload is served to its end
        half = socket.create_connection(("127.0.0.1", port))
        body = a_spam
        half.sendall(f"CHECK SPAMC/1.5\r\nContent-length: {len(body)}\r\n\r\n".encode() + body[:50])
        write(system_file, "")
        proc.send_signal(signal.SIGHUP)
        assert until(lambda: spamc_says(port, a_spam) == 1), "SIGHUP did not reload the decision"
        half.sendall(body[50:])
        reply = half.recv(4096)
        half.close()
        assert reply.startswith(b"SPAMD/1.1 0 EX_OK") and b"Spam: " in reply
        # without systemd or kill: spamnb config reload finds the server by its socket, or its pid file
        write(system_file, ALL_UNSURE)
        res = run("config", "reload", "--socket", sock)
        assert res.returncode == 0, res.stderr
        assert until(lambda: spamc_says(port, a_spam) == 0)
        write(system_file, "")
        assert run("config", "reload", "--pidfile", tmp_path / "pid").returncode == 0
        assert until(lambda: spamc_says(port, a_spam) == 1)
        # a bad key of another command's (imap's) is no reason to keep the old decision
        write(system_file, ALL_UNSURE + "[imap]\nport = 'x'\n")
        proc.send_signal(signal.SIGHUP)
        assert until(lambda: spamc_says(port, a_spam) == 0), "a bad [imap] key stopped serve's reload"
        write(system_file, "")
        proc.send_signal(signal.SIGHUP)
        assert until(lambda: spamc_says(port, a_spam) == 1)
        # a broken file keeps the decision in force
        write(system_file, "[decision]\nspam_cutoff = 'high'\n")
        proc.send_signal(signal.SIGHUP)
        time.sleep(1)
        assert spamc_says(port, a_spam) == 1 and proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(10)
    assert b"configuration not reloaded" in proc.stderr.read()


def test_a_users_own_decision_overrides_the_sites_for_spamd(compiled, a_spam, tmp_path):
    from test_spamd import Served, request

    users = tmp_path / "users"
    for name in ("alice", "bob"):
        (users / name).mkdir(parents=True)
        shutil.copy(compiled, users / name / "model.joblib")
    write(users / "alice" / "config.toml", ALL_UNSURE)
    write(users / "bob" / "config.toml", "[decision]\nspam_cutoff = 'x'\n")  # broken: the site's applies
    served = Served(compiled, user_models=str(users))
    try:
        served.models.decision = Decision(spam_cutoff=0.9)
        assert b"Spam: False" in served.ask(request("CHECK", a_spam, User="alice"))
        assert b"Spam: True ; " in served.ask(request("CHECK", a_spam, User="bob"))
        assert b"Spam: True ; " in served.ask(request("CHECK", a_spam))
        assert any("the site's decision applies" in line for line in served.log_lines)
        write(users / "alice" / "config.toml", "")  # changed: reread, and empty: the site's again
        assert b"Spam: True ; " in served.ask(request("CHECK", a_spam, User="alice"))
    finally:
        served.stop()


def test_decision_keys_reach_every_deciding_command_but_train():
    """The value each click command runs with is the one resolver's (options.settled)."""
    import click

    from spamnb.cli import main
    from spamnb.cli.config import DECIDING, commands
    from spamnb.cli.options import LAYERS, settled
    from spamnb.storage import settings

    layers = settings.Layers([(settings.SYSTEM, "f", {"decision": {"spam_cutoff": 0.99}}, {})], env={})

    def runs_with(path):
        root = click.Context(main, info_name="spamnb")
        root.params, root.meta[LAYERS] = {"config_file": None}, layers
        parent = root
        for word in path.split()[:-1]:
            parent = click.Context(main.commands[word], info_name=word, parent=parent)
        cmd = commands(main)[path]
        ctx = click.Context(cmd, info_name=path.split()[-1], parent=parent)
        ctx.params = {p.name: p.get_default(ctx) for p in cmd.params}
        with ctx:
            return settled(ctx)

    for path in DECIDING:
        assert runs_with(path)["spam_cutoff"] == 0.99, path
    assert runs_with("train")["spam_cutoff"] != 0.99 and "spam_cutoff" not in runs_with("imap train")


def test_the_fast_path_uses_files_only_as_the_click_command_checked_them(user_file, compiled, a_spam):
    from spamnb.delivery import fastfilter
    from spamnb.storage import settings

    def opts():
        return fastfilter.settings_of(["--model", str(compiled)])

    def delivered():
        """(filtered, passed through): exit 0-2 with the verdict's headers, or exit 3 unchanged."""
        res = run("filter", "--model", compiled, input=a_spam)
        return res.returncode != 3 and res.stdout != a_spam, res.returncode == 3 and res.stdout == a_spam

    assert opts()["spam_cutoff"] is None  # no file: nothing to read
    write(user_file, "[decision]\nspam_cutoff = 0.99\n")
    assert opts() is None  # not checked yet: the click command reads it, once
    assert delivered() == (True, False)
    assert os.path.exists(settings.cache_path()) and opts()["spam_cutoff"] == 0.99
    write(user_file, "[decision]\nspam_cutoff = 0.9\n")
    assert opts() is None
    assert delivered() == (True, False) and opts()["spam_cutoff"] == 0.9
    user_file.chmod(0o666)  # the same bytes, now writable by others: refused on every path
    assert opts() is None and delivered() == (False, True)
    user_file.chmod(0o644)
    assert delivered() == (True, False) and opts()["spam_cutoff"] == 0.9
    write(user_file, "[decision]\nspam_cutof = 0.9\n")  # a key the click command does not know
    assert delivered() == (False, True) and opts() is None
    user_file.unlink()
    assert opts()["spam_cutoff"] is None and delivered() == (True, False)


def test_the_history_key_reaches_every_recording_path(system_file, compiled, a_spam, tmp_path):
    """[history] path: where filter records, on the fast path and the click path, and
    --no-history on the command line still wins over it (no usage error)."""
    import sqlite3

    hist = tmp_path / "kept" / "h.sqlite"
    hist.parent.mkdir()
    write(system_file, f'[history]\npath = "{hist}"\n')
    env = {"SPAMNB_SOCKET": str(tmp_path / "no-server.sock")}
    for extra in ([], [], ["--evidence", "1"]):  # the first run checks the file; then fast; then click
        res = run("filter", "--model", compiled, *extra, input=a_spam, env=env)
        assert res.returncode == 0 and b"X-Spam-Status: Yes" in res.stdout, res.stderr
    res = run("filter", "--model", compiled, "--no-history", input=a_spam, env=env)
    assert res.returncode == 0 and res.stderr == b"", res.stderr
    db = sqlite3.connect(hist)
    assert db.execute("SELECT count(*), min(via) FROM verdicts").fetchone() == (3, "filter")
    db.close()
    assert not os.path.exists(str(compiled) + ".history.sqlite")
    assert f'path = "{hist}"' in setting(run("config").stdout.decode(), "history", "path")


def test_learn_and_forget_use_the_configured_model_and_history_on_every_path(user_file, compiled, a_spam, tmp_path):
    """[model] path and [history] path reach learn and forget, on the fast path as on
    the click path: with a model at the default place too, the configured one learns,
    and the correction is marked in the configured history."""
    import sqlite3

    from spamnb.storage import history, locate
    from spamnb.storage.modelfile import load_model, save_model

    mine, default = tmp_path / "mine.joblib", locate.default_model_path()
    hist = tmp_path / "h.sqlite"
    for path in (mine, default):  # each with a fresh scorer: the fast path's condition
        os.makedirs(os.path.dirname(path), exist_ok=True)
        save_model(load_model(compiled), path)
    write(user_file, f'[model]\npath = "{mine}"\n[history]\npath = "{hist}"\n')
    env = {"SPAMNB_SOCKET": str(tmp_path / "no-server.sock")}
    res = run("filter", input=a_spam, env=env)  # the click command checks the files; then the fast path
    assert res.returncode == 0, res.stderr
    ham = a_spam.replace(b"Subject:", b"Subject: told-ham", 1)
    msg = tmp_path / "m.eml"
    msg.write_bytes(ham)
    assert run("filter", input=ham, env=env).returncode == 0
    before = os.stat(default).st_mtime_ns, os.path.exists(str(default) + ".journal")
    for command in ("learn", "forget", "learn"):
        res = run(command, "--ham", msg, env=env)
        assert res.returncode == 0 and b"history" not in res.stderr, res.stderr
    assert (os.stat(default).st_mtime_ns, os.path.exists(str(default) + ".journal")) == before
    assert os.path.exists(str(mine) + ".journal")
    db = sqlite3.connect(hist)
    assert db.execute("SELECT message_id, corrected FROM verdicts WHERE corrected IS NOT NULL").fetchall() == [
        (history.fields(ham)["message_id"], "ham")]
    db.close()
    assert run("learn", "--ham", "--no-history", msg, env=env).returncode == 0  # the click path takes it too


def test_learn_with_the_history_in_the_store_never_marks_the_files_history(user_file, compiled, a_spam, tmp_path):
    """``[history] store = true`` is the click command's to honour (the store's history):
    learn's fast path, which records in a file only, leaves it to the click command, so the
    correction is never marked in the file beside the model."""
    import sqlite3

    from spamnb.storage.modelfile import load_model, save_model

    mine = tmp_path / "mine.joblib"
    save_model(load_model(compiled), mine)
    env = {"SPAMNB_SOCKET": str(tmp_path / "no-server.sock")}
    assert run("filter", "--model", mine, input=a_spam, env=env).returncode == 0  # a row in the file's history
    write(user_file, "[history]\nstore = true\n")
    msg = tmp_path / "m.eml"
    msg.write_bytes(a_spam)
    for command in ("learn", "forget", "learn"):  # the first checks the changed file; then a fast path's turn
        res = run(command, "--ham", "--model", mine, msg, env=env)
        assert res.returncode == 0, res.stderr
    db = sqlite3.connect(str(mine) + ".history.sqlite")
    assert db.execute("SELECT count(*), count(corrected) FROM verdicts").fetchone() == (1, 0)
    db.close()
