"""Which history file a command records its verdicts in, or marks its corrections in.

Every command that touches the history (filter on its fast and its click path,
serve, imap filter, learn and forget on both their paths, web) follows one rule:
``--history FILE`` (or ``[history] path`` in a configuration file) when given;
nothing with ``--no-history``; else ``MODEL.history.sqlite`` beside the model file
the command uses, named as it was given (the link, not what a symlink points at);
and nothing for a store's model, which has no file to sit beside.

Each case is run as a user runs it, and the files on disk say where it went.
"""

from __future__ import annotations

import os
import re
import socket
import sqlite3
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from spamnb.cli import main
from spamnb.storage import history, locate
from spamnb.storage.modelfile import load_model, save_model
from test_e2e import SPAMNB
from test_fastpath import compiled, messages  # noqa: F401 (compiled: a fixture)
from test_redis_store import REDIS_SERVER, RedisServer, pushed, redis

needs_redis = pytest.mark.skipif(REDIS_SERVER is None or redis is None,
                                 reason="redis-server or the redis package is not installed "
                                        "(apt-get install redis-server; pip install 'spamnb[redis]')")

#: run through the console script with click and numpy unimportable: any hand-over
#: to the click command fails, so what happens is the fast path's alone
FAST = ("import sys\nsys.modules['spamnb.cli'] = sys.modules['numpy'] = None\n"
        "sys.argv = ['spamnb', *sys.argv[1:]]\nfrom spamnb._entry import main\nmain()\n")


def store_prefix(name):
    """A store prefix of a test's name: the store refuses brackets and wildcards in one."""
    return re.sub(r"[^A-Za-z0-9_.,=-]", "_", name[-30:])


@pytest.fixture(scope="module")
def raw():
    return next(m for m in messages() if history.fields(m)["message_id"])


@pytest.fixture(scope="module")
def store_server(tmp_path_factory):
    if REDIS_SERVER is None or redis is None:
        pytest.skip("redis-server or the redis package is not installed")
    srv = RedisServer(tmp_path_factory.mktemp("redis"))
    yield srv
    srv.stop()


@pytest.fixture
def place(tmp_path, compiled, isolated_env):
    """Where things are: ``model`` (a model file with its scorer), ``link`` (a symlink
    to it), ``own`` (the XDG model path), ``default`` (the cached default model's
    path), ``hist`` (a history file named by option or configuration), ``config``
    (the user's configuration file), ``env`` (the environment for commands)."""
    p = {"model": compiled, "link": tmp_path / "link.joblib", "hist": tmp_path / "h" / "named.sqlite",
         "own": isolated_env / "data" / "spamnb" / "model.joblib",
         "default": isolated_env / "cache" / "spamnb" / f"default-model-{locate.DEFAULT_RECIPE}.joblib",
         "config": isolated_env / "home" / ".config" / "spamnb" / "config.toml",
         "env": {**os.environ, "SPAMNB_SOCKET": str(tmp_path / "no-server.sock")}}
    os.symlink(compiled, p["link"])
    p["hist"].parent.mkdir()
    return p


def histories(*roots):
    """Every history (``*.sqlite``) under ``roots``, with its number of rows."""
    found = {}
    for root in roots:
        for path in sorted(root.rglob("*.sqlite")):
            db = sqlite3.connect(path)
            try:
                found[str(path)] = db.execute("SELECT count(*) FROM verdicts").fetchone()[0]
            finally:
                db.close()
    return found


def configure(place, text):
    place["config"].parent.mkdir(parents=True, exist_ok=True)
    place["config"].write_text(text)


def spamnb(place, way, *args, input=None, cwd=None):
    """Run spamnb ``args``: ``fast``, the fast path alone (a process of its own), or
    ``click``, the click command (in this process: the same code, without a start-up)."""
    args = [str(a) for a in args]
    if way == "fast":
        return subprocess.run([sys.executable, "-c", FAST, *args], input=input, capture_output=True, timeout=120,
                              env=place["env"], cwd=cwd)
    here = os.getcwd()
    os.chdir(cwd or here)
    try:
        res = CliRunner().invoke(main, args, input=input, env=place["env"])
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(args, res.exit_code, res.stdout_bytes, res.stderr_bytes)


def prime(place):
    """Let the click command read and check the configuration files once (the fast
    paths use them only then): a filter that records nothing."""
    assert spamnb(place, "click", "filter", "--model", place["model"], "--no-history",
                  input=b"Subject: x\n\nx").returncode in (0, 1, 2)


# -- filter -----------------------------------------------------------------------------------

BOTH = ("fast", "click")

#: case -> (filter's arguments, the configuration file, where the verdict is recorded, the ways
#: that take it: the fast path hands a symlinked model, which it does not open, to the click command)
FILTER_CASES = {
    "--model": (["--model", "{model}"], "", "{model}.history.sqlite", BOTH),
    "relative --model": (["--model", "model.joblib"], "", "{model}.history.sqlite", BOTH),
    "symlinked --model": (["--model", "{link}"], "", "{link}.history.sqlite", ("click",)),
    "$SPAMNB_MODEL": ([], "", "{model}.history.sqlite", BOTH),
    "own model": ([], "", "{own}.history.sqlite", BOTH),
    "default model": ([], "", "{default}.history.sqlite", BOTH),
    "--history": (["--model", "{model}", "--history", "{hist}"], "", "{hist}", BOTH),
    "[history] path": (["--model", "{model}"], '[history]\npath = "{hist}"\n', "{hist}", BOTH),
    "--no-history": (["--model", "{model}", "--no-history"], "", None, BOTH),
    "--no-history over [history] path": (["--model", "{model}", "--no-history"],
                                         '[history]\npath = "{hist}"\n', None, BOTH),
    "[model] path": ([], '[model]\npath = "{model}"\n', "{model}.history.sqlite", BOTH),
}


def fill(text, place):
    return text.format(**{k: v for k, v in place.items() if k != "env"})


def set_up_model(case, place, trained_model=None):
    if case == "$SPAMNB_MODEL":
        place["env"]["SPAMNB_MODEL"] = str(place["model"])
    elif case == "own model":
        os.makedirs(place["own"].parent, exist_ok=True)
        save_model(load_model(place["model"]), place["own"])
    elif case == "default model":
        save_model(load_model(place["model"]), place["default"])


def arrange(cases, case, place):
    """Set ``case`` of ``cases`` up (its model, its configuration file): its arguments
    and where it records (None: nowhere), filled in."""
    args, config, want, _ = cases[case]
    set_up_model(case, place)
    if config:
        configure(place, fill(config, place))
        prime(place)
    return [fill(a, place) for a in args], want and fill(want, place)


@pytest.mark.parametrize("case,way", [(c, w) for c, v in FILTER_CASES.items() for w in v[-1]])
def test_filter_records_where_the_rule_says(case, way, place, raw, isolated_env, tmp_path):
    args, want = arrange(FILTER_CASES, case, place)
    extra = ["--evidence", "0"] if way == "click" else []  # an option only the click command handles
    proc = spamnb(place, way, "filter", *args, *extra, input=raw, cwd=place["model"].parent)
    assert proc.returncode in (0, 1, 2) and b"X-Spam-Status" in proc.stdout, proc.stderr
    assert histories(tmp_path, isolated_env) == ({want: 1} if want else {})


#: case -> (filter's arguments after --store URL, the configuration file, where it is recorded)
STORE_CASES = {
    "--store": ([], "", None, BOTH),
    "--store, --history": (["--history", "{hist}"], "", "{hist}", BOTH),
    "--store, [history] path": ([], '[history]\npath = "{hist}"\n', "{hist}", BOTH),
    "--store, --no-history": (["--no-history"], "", None, BOTH),
}


@needs_redis
@pytest.mark.parametrize("way", ["fast", "click"])
@pytest.mark.parametrize("case", STORE_CASES)
def test_filter_with_a_store_records_only_in_a_named_file(case, way, place, raw, store_server, isolated_env,
                                                          tmp_path, request):
    url = store_server.url(prefix=f"{store_prefix(request.node.name)}:")
    pushed(url, place["model"])
    args, want = arrange(STORE_CASES, case, place)
    extra = ["--evidence", "0"] if way == "click" else []
    proc = spamnb(place, way, "filter", "--store", url, *args, *extra, input=raw)
    assert proc.returncode in (0, 1, 2) and b"X-Spam-Status" in proc.stdout, proc.stderr
    assert histories(tmp_path, isolated_env) == ({want: 1} if want else {})


# -- serve --------------------------------------------------------------------------------------


def served(place, *args):
    """Start ``spamnb serve ARGS`` on a private socket, wait until it listens, stop it:
    its stderr. The server opens its history (making the file) before it listens."""
    sock = str(place["model"].parent.parent / "run" / "socket")
    proc = subprocess.Popen(SPAMNB + ["serve", "--socket", sock, *map(str, args)], env=place["env"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(sock)
                break
            except OSError:
                time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read()
    finally:
        proc.terminate()
        proc.wait(30)
    err = proc.stderr.read().decode()
    proc.stderr.close()
    return err


@pytest.mark.parametrize("case", ["--model", "--history", "--no-history", "--store", "--store, --history"])
def test_serve_records_where_the_rule_says(case, place, isolated_env, tmp_path, request):
    if case.startswith("--store"):
        if REDIS_SERVER is None or redis is None:
            pytest.skip("redis-server or the redis package is not installed")
        url = request.getfixturevalue("store_server").url(prefix=f"{store_prefix(request.node.name)}:")
        where = ["--store", url]
        pushed(url, place["model"])
    else:
        where = ["--model", place["model"]]
    extra = {"--history": ["--history", place["hist"]], "--no-history": ["--no-history"],
             "--store, --history": ["--history", place["hist"]]}.get(case, [])
    want = {"--model": f"{place['model']}.history.sqlite", "--history": str(place["hist"]),
            "--store, --history": str(place["hist"])}.get(case)
    err = served(place, *where, *extra)
    assert histories(tmp_path, isolated_env) == ({want: 0} if want else {}), err
    assert (f"recording verdicts in {want}" in err) == bool(want), err


# -- learn and forget ---------------------------------------------------------------------------


def recorded_in(paths, raw):
    """A history at each of ``paths`` holding one verdict of ``raw``."""
    for path in paths:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        db = history.open_db(path)
        history.write(db, [history.row(raw, "ham", -3.0, 0.1, via="filter")])
        db.close()


def marked(paths):
    """The paths among ``paths`` whose verdict is marked corrected."""
    out = []
    for path in paths:
        db = sqlite3.connect(path)
        if db.execute("SELECT count(*) FROM verdicts WHERE corrected IS NOT NULL").fetchone()[0]:
            out.append(path)
        db.close()
    return out


#: case -> (learn's arguments, the configuration file, the history it marks, ways)
LEARN_CASES = {
    "--model": (["--model", "{model}"], "", "{model}.history.sqlite", BOTH),
    "symlinked --model": (["--model", "{link}"], "", "{link}.history.sqlite", ("click",)),
    "$SPAMNB_MODEL": ([], "", "{model}.history.sqlite", BOTH),
    "default model": ([], "", "{default}.history.sqlite", ("click",)),  # the history filter recorded in
    "--history": (["--model", "{model}", "--history", "{hist}"], "", "{hist}", ("click",)),
    "[history] path": (["--model", "{model}"], '[history]\npath = "{hist}"\n', "{hist}", BOTH),
    "--no-history": (["--model", "{model}", "--no-history"], "", None, ("click",)),
    "[model] path": ([], '[model]\npath = "{model}"\n', "{model}.history.sqlite", BOTH),
}


#: forget takes the same path as learn: a few of its cases
FORGET_CASES = ("--model", "[history] path", "--history", "--no-history")


@pytest.mark.parametrize("case,way,command", [(c, w, "learn") for c, v in LEARN_CASES.items() for w in v[-1]]
                         + [(c, w, "forget") for c in FORGET_CASES for w in LEARN_CASES[c][-1]])
def test_learn_and_forget_mark_where_filter_records(case, way, command, place, raw, tmp_path):
    args, want = arrange(LEARN_CASES, case, place)
    msg = tmp_path / "m.eml"
    msg.write_bytes(raw)
    candidates = [fill(p, place) for p in ("{model}.history.sqlite", "{link}.history.sqlite", "{hist}",
                                           "{default}.history.sqlite", "{own}.history.sqlite")]
    recorded_in(candidates, raw)
    if command == "forget":  # learned first (marking nothing), then forgotten: its mark taken back
        where = [a for a, before in zip(args, [None, *args]) if "history" not in f"{a} {before}"]
        proc = spamnb(place, "click", "learn", "--spam", "--no-history", *where, msg)
        assert proc.returncode == 0, proc.stderr
        for path in candidates:
            db = sqlite3.connect(path)
            db.execute("UPDATE verdicts SET corrected = 'spam', corrected_t = 1")
            db.commit()
            db.close()
    extra = ["--strict"] if way == "click" else []  # an option only the click command handles
    proc = spamnb(place, way, command, "--spam", *args, *extra, msg)
    assert proc.returncode == 0 and b"history" not in proc.stderr, proc.stderr
    assert proc.stderr.decode().startswith(("learned 1 as spam", "forgot 1 spam", "spamnb: creating"))
    changed = marked(candidates) if command == "learn" else sorted(set(candidates) - set(marked(candidates)))
    assert changed == ([want] if want else [])


@needs_redis
@pytest.mark.parametrize("case", ["--store", "--store, --history"])
def test_learn_with_a_store_marks_only_a_named_file(case, place, raw, store_server, tmp_path, request):
    url = store_server.url(prefix=f"{store_prefix(request.node.name)}:")
    pushed(url, place["model"])
    msg = tmp_path / "m.eml"
    msg.write_bytes(raw)
    candidates = [fill(p, place) for p in ("{model}.history.sqlite", "{hist}", "{own}.history.sqlite")]
    recorded_in(candidates, raw)
    extra = ["--history", place["hist"]] if case.endswith("--history") else []
    proc = spamnb(place, "click", "learn", "--spam", "--store", url, *extra, msg)
    assert proc.returncode == 0, proc.stderr
    assert marked(candidates) == ([str(place["hist"])] if extra else [])


# -- imap filter --------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["--model", "own model", "--history", "--no-history", "--store", "$SPAMNB_STORE",
                                  "--store, --history"])
def test_imap_filter_records_where_the_rule_says(case, place, isolated_env, tmp_path):
    """``imap filter`` opens its history before it connects (here to a port where
    nothing listens): the file made says where it records."""
    pw = tmp_path / "pw"
    pw.write_text("x\n")
    pw.chmod(0o600)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    args = ["--host", "127.0.0.1", "--port", port, "--security", "none", "--user", "u", "--password-file", pw]
    if case == "own model":
        set_up_model(case, place)
    elif case.startswith("--store"):
        args += ["--store", "redis://127.0.0.1:1/0"]  # never reached: the IMAP connection fails first
    elif case == "$SPAMNB_STORE":
        place["env"]["SPAMNB_STORE"] = "redis://127.0.0.1:1/0"
    else:
        args += ["--model", place["model"]]
    args += {"--history": ["--history", place["hist"]], "--no-history": ["--no-history"],
             "--store, --history": ["--history", place["hist"]]}.get(case, [])
    want = {"--model": f"{place['model']}.history.sqlite", "own model": f"{place['own']}.history.sqlite",
            "--history": str(place["hist"]), "--store, --history": str(place["hist"])}.get(case)
    proc = spamnb(place, "click", "imap", "filter", *args)
    assert proc.returncode == 1 and b"127.0.0.1" in proc.stderr, proc.stderr
    assert histories(tmp_path, isolated_env) == ({want: 0} if want else {})


# -- web ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["--model", "relative --model", "symlinked --model", "--history"])
def test_web_shows_the_history_filter_records_in(case, place):
    args = {"--model": ["--model", place["model"]], "relative --model": ["--model", "model.joblib"],
            "symlinked --model": ["--model", place["link"]],
            "--history": ["--model", place["model"], "--history", place["hist"]]}[case]
    want = {"--history": str(place["hist"]), "symlinked --model": f"{place['link']}.history.sqlite"}.get(
        case, f"{place['model']}.history.sqlite")
    proc = subprocess.Popen(SPAMNB + ["web", *map(str, args), "--listen", "127.0.0.1:0"], env=place["env"],
                            cwd=place["model"].parent, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        line = proc.stderr.readline().decode()
    finally:
        proc.terminate()
        proc.wait(30)
        proc.stderr.close()
    assert line.startswith("spamnb web: serving ") and line.rstrip("\n").endswith(f" and its history {want}"), line
    assert os.path.isfile(want)


# -- the rule itself ----------------------------------------------------------------------------


@pytest.mark.parametrize("history_option,model_path,want", [
    (None, "/m/model.joblib", "/m/model.joblib.history.sqlite"),  # beside the model, as named
    ("", "m.joblib", "m.joblib.history.sqlite"),                   # an empty option is no option
    ("/h/x.sqlite", "/m/model.joblib", "/h/x.sqlite"),             # --history FILE, [history] path
    (False, "/m/model.joblib", None),                              # --no-history
    (None, None, None),                                            # a store's model: no file to sit beside
    ("/h/x.sqlite", None, "/h/x.sqlite"),                          # ... but a named file records
    (False, None, None),
])
def test_history_path_is_the_one_rule(history_option, model_path, want):
    assert locate.history_path(history_option, model_path) == want
