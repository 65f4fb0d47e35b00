"""Every entrance resolves settings the same way: over the configuration layers (system
file, user file, --config / $SPAMNB_CONFIG, environment, option) and the entrances
(filter's fast path, its click path, through the server, spamd, imap filter against a
private Dovecot, learn), each uses the
same model location, decision and history, and gives the same bytes for one message.

The layer under test names the right model, a decision under which every message is
unsure, and a history file; the layers below it name a store that is not there, costs
(which beside cut-offs would be "costs and cut-offs both") and no history. An entrance
that merged the layers key by key, or let a file's [store] url stand beside a more
specific [model] path, answers otherwise or passes the message through (exit 3)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess

import pytest

from test_config import (SPAMC, a_spam, free_port, needs_spamc, run, spamc_says, system_file,  # noqa: F401
                         until, user_file, write)
from test_fastpath import compiled  # noqa: F401 (a fixture)
from test_e2e import SPAMNB

DECOY = "[store]\nurl = 'redis://127.0.0.1:1/0'\n[decision]\ncost_fp = 20\n[history]\noff = true\n"
LAYERS = ("system", "user", "named", "environment", "option")


def right(model, history):
    return (f"[model]\npath = '{model}'\n[decision]\nspam_cutoff = 1.0\nham_cutoff = 0.0\n"
            f"[history]\npath = '{history}'\n")


@pytest.fixture
def layered(request, compiled, tmp_path):  # noqa: F811
    """``(options, env)`` of one layer naming the right settings over decoys below it."""
    layer = request.param
    history = tmp_path / "verdicts.sqlite"
    system = os.environ["SPAMNB_SYSTEM_CONFIG"]
    user = os.path.join(os.environ["HOME"], ".config", "spamnb", "config.toml")
    named = tmp_path / "named.toml"
    files = {"system": system, "user": user, "named": str(named)}
    env, options = {}, []
    order = ["system", "user", "named"]
    top = order.index(layer) if layer in order else len(order) - 1
    for i, name in enumerate(order[:top + 1]):
        from pathlib import Path

        text = right(compiled, history) if name == layer else DECOY
        if layer in ("environment", "option") and name == "named":
            text = DECOY.replace("[history]\noff = true\n", "")  # what the top layer leaves to it
            text += f"[history]\npath = '{history}'\n" if layer == "environment" else ""
            text = text.replace("cost_fp = 20", "spam_cutoff = 1.0\nham_cutoff = 0.0") if layer == "environment" \
                else text
        write(Path(files[name]), text)
    if top >= 2:
        env["SPAMNB_CONFIG"] = str(named)
    if layer == "environment":
        env["SPAMNB_MODEL"] = str(compiled)
    if layer == "option":
        options = ["--model", str(compiled), "--spam-cutoff", "1.0", "--ham-cutoff", "0.0", "--history", str(history)]
    res = run("config", "--check", env=env)  # checks the files, and keeps them for the fast paths
    assert res.returncode == 0, res.stderr
    return options, env, history


def count(history):
    with sqlite3.connect(history) as db:
        table = next(name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                     if "verdict" in name or "message" in name)
        return db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


@pytest.mark.parametrize("layered", LAYERS, indirect=True)
def test_every_filter_entrance_resolves_the_same(layered, a_spam, tmp_path):
    options, env, history = layered
    fast = run("filter", *options, input=a_spam, env=env)
    click_path = run("filter", "--evidence", "0", *options, input=a_spam, env=env)  # an option only click takes
    assert fast.returncode == 2, fast.stderr  # unsure: the layer's decision, its model
    assert b"tests=SPAMNB_UNSURE" in fast.stdout
    assert (click_path.returncode, click_path.stdout) == (fast.returncode, fast.stdout), click_path.stderr
    assert count(history) == 2  # both recorded in the layer's history
    sock = str(tmp_path / "run" / "socket")
    proc = subprocess.Popen(SPAMNB + ["serve", "--socket", sock, *options], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, **env})
    try:
        assert until(lambda: os.path.exists(sock)), proc.stderr
        served = run("filter", "--socket", sock, *options, input=a_spam, env=env)
        assert (served.returncode, served.stdout) == (fast.returncode, fast.stdout), served.stderr
    finally:
        proc.terminate()
        proc.wait(15)
        proc.stdout.close()
        proc.stderr.close()
    assert count(history) == 3


@needs_spamc
@pytest.mark.parametrize("layered", LAYERS, indirect=True)
def test_spamd_resolves_the_same(layered, a_spam, tmp_path):
    options, env, history = layered
    port = free_port()
    proc = subprocess.Popen(SPAMNB + ["serve", "--socket", str(tmp_path / "run" / "socket"), "--spamd",
                                      f"127.0.0.1:{port}", *options], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, **env})
    try:
        assert until(lambda: spamc_says(port, a_spam) in (0, 1), 60)
        reply = subprocess.run([SPAMC, "-d", "127.0.0.1", "-p", str(port)], input=a_spam, capture_output=True,
                               timeout=30).stdout
        assert b"tests=SPAMNB_UNSURE" in reply  # the layer's decision and model
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)
        proc.stdout.close()
        proc.stderr.close()
    assert count(history) >= 1  # recorded in the layer's history


def verdicts(history):
    """``[(via, verdict, p)]`` of what a history recorded, in order."""
    with sqlite3.connect(history) as db:
        return [(via, v, round(p, 9)) for via, v, p in db.execute("SELECT via, verdict, p FROM verdicts ORDER BY id")]


@pytest.mark.parametrize("layered", LAYERS, indirect=True)
def test_imap_filter_resolves_the_same(layered, a_spam, tmp_path, make_dovecot):
    """``imap filter`` against a private Dovecot: the layer's model, decision (unsure:
    the message stays in INBOX, byte for byte) and history, as ``filter`` decides."""
    options, env, history = layered
    d = make_dovecot()
    d.append("INBOX", a_spam)
    before = sorted(d.fetch_all("INBOX").values())
    pw = tmp_path / "pw"
    pw.write_text(d.password + "\n")
    pw.chmod(0o600)
    res = run("imap", "filter", "--host", d.host, "--port", d.port, "--user", d.user, "--password-file", pw,
              "--security", "none", *options, env=env)
    assert res.returncode == 0, res.stderr
    assert sorted(d.fetch_all("INBOX").values()) == before  # unsure: left where it was, the same bytes
    fast = run("filter", *options, input=a_spam, env=env)
    assert fast.returncode == 2, fast.stderr
    (via_imap, imap_verdict, imap_p), (via_filter, filter_verdict, filter_p) = verdicts(history)
    assert (via_imap, via_filter) == ("imap", "filter")
    assert imap_verdict == filter_verdict == "unsure"  # the layer's decision, in the layer's history
    assert imap_p == pytest.approx(filter_p, abs=1e-6)  # the layer's model


@pytest.mark.parametrize("layered", LAYERS, indirect=True)
def test_learn_resolves_the_same(layered, a_spam, tmp_path, compiled):  # noqa: F811
    options, env, history = layered
    message = tmp_path / "m.eml"
    message.write_bytes(a_spam)
    learn_options = [o for o in options if o not in ("--spam-cutoff", "--ham-cutoff", "1.0", "0.0")]
    res = run("learn", "--ham", *learn_options, message, env=env)
    assert res.returncode == 0, res.stderr
    journal = [p for p in os.listdir(compiled.parent) if p.startswith(compiled.name) and "journal" in p]
    assert journal, os.listdir(compiled.parent)  # learned into the layer's model, not a store or the default


def test_a_system_store_and_a_user_model(system_file, user_file, compiled, a_spam):  # noqa: F811
    """A site's system file names a store; `spamnb setup` wrote the user's own model in the
    user's file: filter uses the user's model, `config --check` is ok, and `config` says
    which one wins."""
    write(system_file, "[store]\nurl = 'redis://127.0.0.1:1/0'\n")
    write(user_file, f"[model]\npath = '{compiled}'\n")
    res = run("config", "--check")
    assert res.returncode == 0, res.stderr
    res = run("filter", input=a_spam)
    assert res.returncode == 0 and b"X-Spam-Flag: YES" in res.stdout, res.stderr
    out = run("config").stdout.decode()
    assert f"where the model is: [model] path from {user_file}:2 replaces [store] url from {system_file}:2" in out
    out = run("config", "--command", f"serve --model {compiled}").stdout.decode()
    assert "where the model is: --model (option) replaces [model] path" in out


def test_two_places_in_one_file_are_refused_with_file_and_line(system_file, a_spam):
    write(system_file, "[model]\npath = '/srv/m.joblib'\n[store]\nurl = 'redis://127.0.0.1:1/0'\n")
    res = run("config", "--check")
    assert res.returncode == 2 and f"{system_file}:4: [model] path and [store] url" in res.stderr.decode()
    res = run("filter", input=a_spam)
    assert res.returncode == 3 and res.stdout == a_spam and f"{system_file}:4:" in res.stderr.decode()

