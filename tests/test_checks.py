"""`config --check` applies exactly the checks a command applies at start.

Every configuration key (walked from :data:`spamnb.cli.config.KEYS`, so a new key is
walked too) gets a bad value: `spamnb config --check FILE` names FILE:LINE and exits 2,
and the command that takes the key refuses the same file at start with the same
FILE:LINE (`serve` started for real). A good file passes the check and starts `serve`.
A store URL's password is refused in its user part and its query and never shown; its
password file must be private. The rules a careless change could drop (the fast path's
cache stamps, the cache file's own owner and mode, `true` as an integer) each have a
test here that fails without them.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

import pytest
from click.testing import CliRunner

from spamnb import checks
from spamnb.cli import main
from spamnb.cli.config import KEYS, commands, targets
from spamnb.options import BY_KEY
from spamnb.storage import settings
from test_e2e import SPAMNB
from test_fastpath import compiled  # noqa: F401 (a fixture)

#: The command started to see a key refused at start, first of those that take it.
PREFERRED = ("serve", "imap filter", "imap train", "filter", "web", "learn", "classify")
MESSAGE = b"From: a@example.org\nSubject: hello\n\nhello there\n"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def settings_text(value):
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(settings_text(v) for v in value) + "]"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value)


def bad_values(tmp_path):
    """``(table, key)`` -> a bad value of that key (what `serve` and the others refused at start
    while `config --check` said ok, and the plain wrong types)."""
    open_folder = tmp_path / "open"
    open_folder.mkdir(mode=0o755, exist_ok=True)
    open_folder.chmod(0o755)
    readable = tmp_path / "readable.pw"
    readable.write_text("secret-pw\n")
    readable.chmod(0o644)
    return {
        ("store", "url"): "http://store.example/0",
        ("serve", "socket"): str(open_folder / "socket"),  # a private socket in a folder others can enter
        ("serve", "max_bytes"): 0,
        ("serve", "timeout"): 0.01,
        ("serve", "max_connections"): True,  # bool is an int in Python: not here
        ("serve", "pidfile"): str(tmp_path),  # a folder
        ("spamd", "listen"): ["127.0.0.1:99999"],
        ("spamd", "allow"): ["10.0.0.0/33"],
        ("spamd", "user_models"): str(tmp_path / "missing"),
        ("spamd", "socket_mode"): "999",
        ("spamd", "max_bytes"): 0,
        ("spamd", "trusted_users"): ["spamnb-no-such-user"],
        ("milter", "listen"): ["127.0.0.1:99999"],
        ("milter", "on_error"): "drop",
        ("web", "listen"): "nowhere",
        ("web", "allow"): ["10.0.0.0/33"],
        ("decision", "cost_fp"): -1,
        ("decision", "cost_fn"): 0,
        ("decision", "cost_unsure"): -1,
        ("decision", "spam_cutoff"): 1.5,
        ("decision", "ham_cutoff"): -0.5,
        ("filter", "evidence"): -1,
        ("log", "format"): "xml",
        ("log", "to"): "file",
        ("metrics", "listen"): "nowhere",
        ("metrics", "allow"): ["nowhere"],
        ("history", "path"): str(tmp_path),  # a folder
        ("imap", "host"): "two words",
        ("imap", "port"): 99999,
        ("imap", "password_file"): str(readable),  # readable by others
        ("imap", "security"): "ssl",
        ("imap", "cafile"): str(tmp_path / "missing.pem"),
        ("imap", "interval"): 0,
    }


#: Keys whose only bad values are of the wrong type (walked with one: :func:`wrong_type`), and why.
TYPE_ONLY = {
    ("model", "path"): "a path: whether a model is there and trusted is found when it is loaded (train makes it)",
    ("imap", "model"): "the same as [model] path",
    ("imap", "user"): "any login name",
    ("imap", "password_command"): "a shell command: whether it prints a password is known only by running it",
    ("imap", "folder"): "an IMAP folder name: the server says which exist",
    ("imap", "junk"): "an IMAP folder name (made when missing)",
    ("imap", "unsure_folder"): "an IMAP folder name (made when missing)",
    ("imap", "ham"): "IMAP folder names",
    ("imap", "spam"): "IMAP folder names",
    **{key: "true or false" for key in [("model", "allow_insecure"), ("spamd", "store_users"), ("spamd", "allow_tell"),
                                        ("milter", "reject"),
                                        ("spamd", "allow_tell_served"), ("history", "off"),
                                        ("filter", "exit_zero"), ("filter", "learn"), ("log", "messages"),
                                        ("imap", "force_plaintext"), ("imap", "learn_verdicts"), ("history", "store")]},
}


def test_every_key_has_a_bad_value_or_a_reason_why_not(tmp_path):
    """A new key is walked with a value of the wrong type, and must be put in one list or the other here."""
    bad = bad_values(tmp_path)
    assert not set(bad) & set(TYPE_ONLY)
    assert [k for k in KEYS if k not in bad and k not in TYPE_ONLY] == []


def wrong_type(table, key):
    """A value of the wrong type for a key: the fallback of a key with no value of its own above."""
    kind = BY_KEY[(table, key)].kind
    value = {"bool": "yes", "int": True, "float": "ten"}.get(kind, 5)
    return [value] if kind == "list" else value


#: Rules on two keys at once, each a file and the key its error names.
TOGETHER = [
    ({("spamd", "listen"): ["0.0.0.0:7830"]}, ("spamd", "listen"), "listens beyond this machine"),
    ({("metrics", "listen"): "0.0.0.0:9783"}, ("metrics", "listen"), "listens beyond this machine"),
    ({("imap", "security"): "none", ("imap", "host"): "192.0.2.1"}, ("imap", "security"), "clear text"),
]


def write(path, values):
    """A configuration file of ``{(table, key): value}``; ``{(table, key): line}`` where each is."""
    lines, text = {}, []
    for (table, key), value in values.items():
        if f"[{table}]" not in text:
            text.append(f"[{table}]")
        text.append(f"{key} = {settings_text(value)}")
        lines[(table, key)] = len(text)
    path.write_text("\n".join(text) + "\n")
    path.chmod(0o600)
    return lines


def command_of(table, key):
    paths = [p for p, _ in targets(main, table, key)]
    return next((p for p in PREFERRED if p in paths), paths[0])


def cases(tmp_path):
    """``(name, file, {(table, key): value}, key whose line is named, words)`` for every key, then the rules
    on two keys."""
    bad = bad_values(tmp_path)
    out = []
    for table, key in KEYS:
        value = bad[(table, key)] if (table, key) in bad else wrong_type(table, key)
        words = "[decision] " if table == "decision" else f"[{table}] {key}"  # the decision is one unit
        out.append((f"{table}.{key}", {(table, key): value}, (table, key), words))
    for n, (values, named, words) in enumerate(TOGETHER):
        out.append((f"together{n}", values, named, words))
    return out


def checked(path):
    return CliRunner().invoke(main, ["config", "--check", str(path)])


def test_every_key_with_a_bad_value_is_refused_by_the_check_and_at_start(tmp_path, compiled):
    """Each bad value: `config --check FILE` says FILE:LINE, exit 2; the command that takes the
    key refuses the same file at start naming the same FILE:LINE (`serve`: started for real)."""
    started = []
    for name, values, named, words in cases(tmp_path):
        conf = tmp_path / f"{name}.toml"
        lines = write(conf, values)
        where = f"{conf}:{lines[named]}: "
        res = checked(conf)
        assert res.exit_code == 2 and where in res.stderr and words in res.stderr, (name, res.stderr)
        assert res.stderr.count("\n") == 1, res.stderr
        command = command_of(*named)
        if command == "serve":
            sock = tmp_path / f"s-{name}" / "socket"
            started.append((name, where, subprocess.Popen(
                SPAMNB + ["--config", str(conf), "serve", "--socket", str(sock), "--model", str(compiled)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))
            continue
        res = CliRunner().invoke(main, ["--config", str(conf), *command.split()], input=MESSAGE)
        if command == "filter":  # the message passes through, as for any error
            assert res.exit_code == 3 and res.stdout_bytes == MESSAGE, (name, res.stderr)
        else:
            assert res.exit_code == 2, (name, command, res.stderr)
        assert where in res.stderr and words in res.stderr, (name, command, res.stderr)
    assert {"serve.socket", "spamd.listen", "metrics.listen", "store.url"} <= {n for n, *_ in started}
    for name, where, proc in started:
        try:
            _, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise AssertionError(f"serve started with a bad {name}") from None
        err = err.decode()
        assert proc.returncode == 2 and where in err and "Traceback" not in err, (name, err)


def test_every_check_has_a_bad_value_and_a_key(tmp_path):
    """A check in spamnb.checks is walked above with a value it refuses, and checks a real key."""
    bad = bad_values(tmp_path)
    assert set(checks.CHECKS) <= set(KEYS) and set(checks.CHECKS) <= set(bad)
    for keys, _ in checks.TOGETHER:
        assert set(keys) <= set(KEYS)


@pytest.mark.parametrize("args, words", [
    (["--spamd", "127.0.0.1:99999"], "--spamd 127.0.0.1:99999: give HOST:PORT"),
    (["--spamd", "127.0.0.1:7830", "--allow", "10.0.0.0/33"], "--allow 10.0.0.0/33: not an address"),
    (["--spamd", "0.0.0.0:7830"], "--spamd 0.0.0.0 listens beyond this machine: say who may connect with --allow"),
    (["--spamd", "127.0.0.1:7830", "--spamd-socket-mode", "999"], "--spamd-socket-mode"),
    (["--metrics", "nowhere"], "--metrics nowhere: give HOST:PORT"),
    (["--metrics", "127.0.0.1:9783", "--metrics-allow", "nowhere"], "--metrics-allow nowhere: not an address"),
    (["--pidfile", "/"], "--pidfile"),
])
def test_serve_names_the_option_of_a_bad_value(tmp_path, compiled, args, words):
    res = CliRunner().invoke(main, ["serve", "--socket", str(tmp_path / "s" / "socket"), "--model", str(compiled),
                                    *args])
    assert res.exit_code == 2 and words in res.stderr and ".toml" not in res.stderr, res.stderr


def test_a_unix_socket_path_must_fit_and_hold_nothing_but_a_socket(tmp_path):
    long = str(tmp_path / ("x" * 120))
    (tmp_path / "file").write_text("")
    for check in (checks.listen_address, checks.socket_path):
        with pytest.raises(ValueError, match="at most 107 bytes"):
            check(long)
        with pytest.raises(ValueError, match="exists and is not a socket"):
            check(str(tmp_path / "file"))
    assert checks.listen_address(str(tmp_path / "s.sock")) == ("unix", str(tmp_path / "s.sock"))


def test_serve_names_the_socket_option_in_a_folder_others_can_enter(tmp_path, compiled):
    folder = tmp_path / "open"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    res = CliRunner().invoke(main, ["serve", "--socket", str(folder / "socket"), "--model", str(compiled)])
    assert res.exit_code == 2 and "--socket" in res.stderr and "mode 0700" in res.stderr, res.stderr


def test_a_good_file_passes_the_check_and_starts_serve(tmp_path, compiled):
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    pw = tmp_path / "imap.pw"
    pw.write_text("x\n")
    pw.chmod(0o600)
    spamd_port, metrics_port = free_port(), free_port()
    conf = tmp_path / "good.toml"
    write(conf, {
        ("model", "path"): str(compiled),
        ("decision", "spam_cutoff"): 0.99,
        ("serve", "socket"): str(run_dir / "socket"),
        ("serve", "max_bytes"): 1000000,
        ("serve", "timeout"): 5.0,
        ("serve", "max_connections"): 4,
        ("serve", "pidfile"): str(run_dir / "serve.pid"),
        ("spamd", "listen"): [f"127.0.0.1:{spamd_port}", str(run_dir / "spamd.sock")],
        ("spamd", "allow"): ["10.0.0.0/8"],
        ("spamd", "socket_mode"): "0660",
        ("log", "format"): "json",
        ("metrics", "listen"): f"127.0.0.1:{metrics_port}",
        ("metrics", "allow"): ["192.0.2.0/24"],
        ("history", "path"): str(tmp_path / "h.sqlite"),
        ("imap", "host"): "127.0.0.1",
        ("imap", "port"): 1143,
        ("imap", "security"): "none",
        ("imap", "password_file"): str(pw),
    })
    res = checked(conf)
    assert res.exit_code == 0 and res.stdout.strip() == f"{conf}: ok", res.stderr
    proc = subprocess.Popen(SPAMNB + ["--config", str(conf), "serve"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not (run_dir / "serve.pid").exists():
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "serve did not start"
            time.sleep(0.05)
        with socket.create_connection(("127.0.0.1", spamd_port), timeout=10) as s:
            s.sendall(b"PING SPAMC/1.5\r\n\r\n")
            assert s.recv(100).startswith(b"SPAMD/1.5 0 PONG")
        assert oct((run_dir / "spamd.sock").stat().st_mode & 0o777) == "0o660"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0


# -- the store URL and its password ---------------------------------------------------------------


@pytest.fixture
def password_file(tmp_path):
    pw = tmp_path / "redis.pw"
    pw.write_text("s3cret-pw\n")
    pw.chmod(0o600)
    return pw


@pytest.mark.parametrize("url, words", [
    ("http://store.example/0", "not a store URL"),
    ("redis://:s3cret-pw@store.example:6379/0", "give the password with ?password_file=PATH"),
    ("redis://spamnb:s3cret-pw@store.example/0", "give the password with ?password_file=PATH"),
    ("redis://store.example/0?password=s3cret-pw", "give the password with ?password_file=PATH"),
    ("rediss://store.example/0?prefix=p:&Password=s3cret-pw", "give the password with ?password_file=PATH"),
    ("rediss://store.example/0?ssl_password=s3cret-pw", "give the password with ?password_file=PATH"),
    ("redis://store.example:99999/0", "the port must be a number from 1 to 65535"),
    ("redis://store.example/zero", "the database must be a number"),
    ("redis://store.example/0?prefix=a*b:", "prefix must be"),
    ("redis://store.example/0?prefix=", "prefix must be"),
    ("redis://store.example/0?timeout=0", "timeout must be a number of seconds above 0"),
    ("rediss://store.example/0?ssl_ca_certs=/nonexistent/ca.pem", "cannot read ssl_ca_certs"),
    ("redis://store.example/0?ssl_ca_certs=/etc/hostname", "ssl_ca_certs= is for TLS"),
    ("redis://store.example/0?bogus=1", "unknown parameter bogus="),
    ("unix:///run/redis.sock?db=1&socket_keepalive=1", "unknown parameter socket_keepalive="),
    ("redis://store.example/0?password%00=s3cret-pw", "give the password with ?password_file=PATH"),
    ("redis://store.example/0?db=x", "the database must be a number"),
    ("unix://", "give the socket's path"),
])
def test_a_bad_store_url_is_refused_by_the_check_and_at_start_without_its_password(tmp_path, url, words):
    conf = tmp_path / "store.toml"
    write(conf, {("store", "url"): url})
    for res in (checked(conf), CliRunner().invoke(main, ["--config", str(conf), "info"])):
        assert res.exit_code == 2 and f"{conf}:2: [store] url: " in res.stderr and words in res.stderr, res.stderr
        assert "s3cret" not in res.stderr
    # given as an option: the same sentence, exit 1 as any store error; filter passes the message through
    res = CliRunner().invoke(main, ["info", "--store", url])
    assert res.exit_code == 1 and words in res.stderr and "s3cret" not in res.stderr, res.stderr
    res = CliRunner().invoke(main, ["filter", "--store", url], input=MESSAGE)
    assert res.exit_code == 3 and res.stdout_bytes == MESSAGE and words in res.stderr
    assert "s3cret" not in res.stderr


@pytest.mark.parametrize("url", ["redis://:s3cret-pw@127.0.0.1:6379/0", "redis://127.0.0.1:6379/0?password=s3cret-pw"])
def test_the_fast_filter_passes_mail_through_a_password_in_the_url_without_showing_it(url):
    res = subprocess.run(SPAMNB + ["filter", "--store", url], input=MESSAGE, capture_output=True, timeout=60)
    assert res.returncode == 3 and res.stdout == MESSAGE and b"password_file" in res.stderr, res.stderr
    assert b"s3cret" not in res.stderr and res.stderr.count(b"\n") == 1


@pytest.mark.parametrize("param", ["bogus=1", "password%00=s3cret-pw", "socket_keepalive=1", "ssl_ca_certs=/etc/hostname"])
def test_a_store_url_parameter_the_store_does_not_take_is_one_line_in_every_command(tmp_path, param):
    """`config --check` refuses it by name, and so does each command at start: `info` in one
    line (exit 1), the fast `filter` delivers the message unchanged (exit 3), never redis-py's
    TypeError at the first request nor an 'internal error'."""
    url = f"redis://127.0.0.1:{free_port()}/0?{param}"
    conf = tmp_path / "store.toml"
    write(conf, {("store", "url"): url})
    res = checked(conf)
    assert res.exit_code == 2 and f"{conf}:2: [store] url: " in res.stderr and "s3cret" not in res.stderr, res.stderr
    for args, code, stdin in ((["info", "--store", url], 1, None), (["filter", "--store", url], 3, MESSAGE)):
        r = subprocess.run(SPAMNB + args, input=stdin, capture_output=True, timeout=60)
        assert r.returncode == code and r.stderr.count(b"\n") == 1, (args, r.stderr)
        assert b"Traceback" not in r.stderr and b"internal error" not in r.stderr and b"s3cret" not in r.stderr
        assert param.partition("=")[0].encode() in r.stderr or b"password_file" in r.stderr, r.stderr
        if stdin is not None:
            assert r.stdout == MESSAGE


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_a_store_password_file_others_can_read_is_refused(tmp_path, password_file, mode):
    password_file.chmod(mode)
    url = f"redis://127.0.0.1:{free_port()}/0?password_file={password_file}"
    conf = tmp_path / "store.toml"
    write(conf, {("store", "url"): url})
    res = checked(conf)
    assert res.exit_code == 2 and f"{conf}:2: [store] url: " in res.stderr, res.stderr
    assert "must be yours and mode 0600" in res.stderr and "chmod 600" in res.stderr and "s3cret" not in res.stderr
    res = CliRunner().invoke(main, ["info", "--store", url])
    assert res.exit_code == 1 and "mode 0600" in res.stderr, res.stderr
    password_file.chmod(0o600)
    assert checked(conf).exit_code == 0


def test_a_store_password_file_of_another_user_is_refused(tmp_path, password_file):
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    os.chown(password_file, 65534, 65534)
    url = f"redis://127.0.0.1:{free_port()}/0?password_file={password_file}"
    with pytest.raises(ValueError, match="must be yours"):
        checks.store_url(url)


def test_the_store_reads_its_password_file_only_when_private(tmp_path, password_file):
    """The store's own reading of the file applies the rule on the open file, as the check."""
    from spamnb.storage.redisstore import _read_password
    from spamnb.storage.store import ModelError

    assert _read_password(str(password_file)) == "s3cret-pw"
    password_file.chmod(0o644)
    with pytest.raises(ModelError, match="mode 0600") as exc:
        _read_password(str(password_file))
    assert "s3cret" not in str(exc.value)


@pytest.mark.parametrize("url, shown", [
    ("redis://:pw1@h:6379/0", "redis://:***@h:6379/0"),
    ("rediss://user:pw1@h/0?prefix=p:&password=pw2", "rediss://user:***@h/0?prefix=p:&password=***"),
    ("redis://h/0?PASSWORD=pw2#x", "redis://h/0?password=***#x"),
    ("unix://:pw1@/run/redis.sock?db=1&password=pw2", "unix://:***@/run/redis.sock?db=1&password=***"),
    ("redis://user@h/0?password_file=/p", "redis://user@h/0?password_file=/p"),
    ("rediss://h/0?ssl_keyfile=/k&SSL_Password=k3y", "rediss://h/0?ssl_keyfile=/k&ssl_password=***"),
    ("redis://h/0?password%00=pw3&pass%20word=pw4", "redis://h/0?password%00=***&pass word=***"),
])
def test_redact_hides_the_password_of_the_user_part_and_of_the_query(url, shown):
    assert checks.redact(url) == shown


def test_spamnb_config_never_shows_a_store_urls_password(tmp_path):
    conf = tmp_path / "store.toml"
    write(conf, {("store", "url"): "redis://:s3cret-pw@store.example/0"})
    res = CliRunner().invoke(main, ["--config", str(conf), "config"])
    assert res.exit_code == 2 and "s3cret" not in res.stderr + res.stdout


# -- the configuration rows of the hardening audit ----------------------------------------------


def _cached_user_file():
    user = settings.files()[1][1]
    os.makedirs(os.path.dirname(user), mode=0o755, exist_ok=True)
    os.chmod(os.path.dirname(user), 0o755)
    with open(user, "w") as f:
        f.write("[decision]\nspam_cutoff = 0.99\n")
    os.chmod(user, 0o644)
    res = CliRunner().invoke(main, ["config", "--check"])
    assert res.exit_code == 0, res.stderr
    layers = settings.read_cache()
    assert layers is not None and layers.get("decision", "spam_cutoff") == 0.99
    return user


def test_the_cache_is_stale_when_the_files_folder_changes_mode(tmp_path):
    """The fast path's cache stands for the files and their folders as read: a folder made
    writable by others (its mode) makes the file untrusted, so the cache must not stand."""
    user = _cached_user_file()
    os.chmod(os.path.dirname(user), 0o777)
    assert settings.read_cache() is None
    res = CliRunner().invoke(main, ["config", "--check"])  # and the click path refuses the file
    assert res.exit_code == 2 and "others could change" in res.stderr


def test_the_cache_is_stale_when_the_files_folder_changes_owner(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("changing a folder's owner needs root")
    user = _cached_user_file()
    os.chown(os.path.dirname(user), 65534, 65534)  # nobody's folder now
    assert settings.read_cache() is None
    res = CliRunner().invoke(main, ["config", "--check"])
    assert res.exit_code == 2 and "others could change" in res.stderr


@pytest.mark.parametrize("how", ["group-writable", "world-writable", "another owner"])
def test_a_cache_file_others_could_write_is_never_read(tmp_path, how):
    """The cache says which files were checked and what they hold: one another user could
    have written (its mode, its owner) is ignored, whatever it says."""
    _cached_user_file()
    cache = settings.cache_path()
    if how == "another owner":
        if os.geteuid() != 0:
            pytest.skip("changing a file's owner needs root")
        os.chown(cache, 65534, 65534)
    else:
        os.chmod(cache, 0o620 if how == "group-writable" else 0o602)
    assert settings.read_cache() is None


@pytest.mark.parametrize("table, key", [(t, k) for (t, k) in KEYS
                                        if BY_KEY[(t, k)].kind == "int"])
def test_true_is_no_integer(tmp_path, table, key):
    """``true`` for an integer key is refused, although Python's bool is an int (and 1 in range)."""
    conf = tmp_path / "c.toml"
    write(conf, {(table, key): True})
    res = checked(conf)
    assert res.exit_code == 2 and f"[{table}] {key}: must be an integer, got True" in res.stderr, res.stderr


def test_every_command_that_takes_a_key_is_a_command():
    known = set(commands(main))
    for (table, key) in KEYS:
        assert targets(main, table, key), (table, key)
        assert command_of(table, key) in known


# -- a key's check stops only the commands that take it ---------------------------------------------


@pytest.mark.parametrize("table, key, value", [
    ("imap", "password_file", "readable"),  # readable by others: imap's key only
    ("imap", "port", "993"),  # of the wrong type
    ("serve", "socket", "open"),  # filter asks a server there only when private, else filters itself
])
def test_a_bad_key_of_another_command_in_the_user_file_never_stops_filter(tmp_path, compiled, monkeypatch,
                                                                          table, key, value):
    """The real `spamnb filter` (fast path, then click's) filters with a user file holding a bad key
    it does not take: the mail is scored, not passed through (exit 3), twice (no cache of a bad
    file); `config --check` still reports the key, and the command that takes it refuses it."""
    home = tmp_path / "config"
    (home / "spamnb").mkdir(parents=True, mode=0o700)
    value = {"readable": str(tmp_path / "readable.pw"), "open": str(tmp_path / "open" / "socket")}.get(value, value)
    (tmp_path / "readable.pw").write_text("pw\n")
    (tmp_path / "readable.pw").chmod(0o644)
    (tmp_path / "open").mkdir(mode=0o755)
    (tmp_path / "open").chmod(0o755)
    conf = home / "spamnb" / "config.toml"
    lines = write(conf, {("model", "path"): str(compiled), (table, key): value})
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    for _ in range(2):
        proc = subprocess.run(SPAMNB + ["filter"], input=MESSAGE, capture_output=True, timeout=120)
        assert proc.returncode in (0, 1, 2), proc.stderr
        assert b"X-Spam-Status: " in proc.stdout and proc.stdout.endswith(MESSAGE.split(b"\n\n", 1)[1])
        assert proc.stderr == b"", proc.stderr
    where = f"{conf}:{lines[(table, key)]}: [{table}] {key}"
    res = CliRunner().invoke(main, ["config", "--check"])
    assert res.exit_code == 2 and where in res.stderr, res.stderr
    taker = {"imap": ["imap", "filter", "--dry-run"], "serve": ["serve"]}[table]
    res = CliRunner().invoke(main, taker)
    assert res.exit_code == 2 and where in res.stderr, res.stderr
