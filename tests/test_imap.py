"""``spamnb imap train`` and ``spamnb imap filter`` against a real IMAP server:
a private Dovecot per test (``tests/dovecot.py``; skipped with the reason when
Dovecot or imapclient is not installed).

Every test that moves mail checks that nothing is lost or duplicated: the
multiset of what the server returns (``BODY.PEEK[]``, hashed) over INBOX and
Junk is the same before and after.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import gold_labels, SAMPLE_MAILDIR, strip_from_line
from spamnb.cli import main
from spamnb.delivery import events, imap
from spamnb.mail.identity import message_key
from spamnb.storage.modelfile import load_model, save_model
from test_e2e import SPAMNB


def sample(label, n, start=0, model=None):
    """``n`` held-out sample messages of gold ``label`` (with ``model``: only those
    it files as ``label``, so that a test knows where each should go)."""
    names = sorted(name for name, lb in gold_labels().items() if lb == label)
    raws = [strip_from_line((SAMPLE_MAILDIR / "cur" / name).read_bytes()) for name in names][start:]
    if model is not None:
        m = load_model(model)
        raws = [raw for raw in raws if m.classify(raw).label == label]
    return raws[:n]


@pytest.fixture
def model(trained_model, tmp_path):
    """The user's own model (a copy of the trained one, with its scorer)."""
    path = tmp_path / "own" / "model.joblib"
    save_model(trained_model, path)
    return path


def account(d, tmp_path):
    pw = tmp_path / "pw"
    if not pw.exists():
        pw.write_text(d.password + "\n")
        pw.chmod(0o600)
    return ["--host", d.host, "--port", str(d.port), "--user", d.user, "--password-file", str(pw),
            "--security", "none"]


def run(d, tmp_path, command, *args, model=None):
    extra = ["--model", str(model)] if model else []
    res = CliRunner().invoke(main, ["imap", command, *account(d, tmp_path), *extra, *map(str, args)])
    return res.exit_code, res.stderr


def contents(d, *folders) -> Counter:
    """What the server holds, as hashes of what it returns, over ``folders``."""
    from dovecot import sha256

    return Counter(sha256(raw) for f in folders for raw in d.fetch_all(f).values())


def flags(d, folder) -> dict:
    with d.client() as c:
        c.select_folder(folder, readonly=True)
        uids = c.search("ALL")
        got = c.get_flags(uids) if uids else {}
    return {uid: set(f) for uid, f in got.items()}


def keys_in(d, folder) -> set:
    return {message_key(raw) for raw in d.fetch_all(folder).values()}


def known(model_path, raw):
    return load_model(model_path).known(message_key(raw), raw)


@pytest.fixture
def inbox(dovecot, model):
    """Five ham and five spam from the held-out sample in INBOX."""
    ham, spam = sample("ham", 5, model=model), sample("spam", 5, model=model)
    for raw in ham + spam:
        dovecot.append("INBOX", raw)
    return ham, spam


# -- train --------------------------------------------------------------------------------


def test_train_reads_each_folder_once_without_changing_flags(dovecot, tmp_path, small_corpus):
    ham = [p.read_bytes() for p in sorted(small_corpus.ham_dir.iterdir())[:30]]
    spam = [p.read_bytes() for p in sorted(small_corpus.spam_dir.iterdir())[:30]]
    dovecot.create_folder("Archive")
    for raw in ham:
        dovecot.append("Archive", raw)
    for raw in spam:
        dovecot.append("Junk", raw)
    before = flags(dovecot, "Archive"), flags(dovecot, "Junk")
    path = tmp_path / "m" / "model.joblib"
    code, err = run(dovecot, tmp_path, "train", "--ham", "Archive", "--spam", "Junk", model=path)
    assert code == 0, err
    assert "trained on 30 ham and 30 spam" in err
    assert (flags(dovecot, "Archive"), flags(dovecot, "Junk")) == before  # no \Seen: BODY.PEEK, EXAMINE
    m = load_model(path)
    assert list(m.messages) == [30, 30]
    assert m.known(message_key(spam[0]), spam[0]) == 1


def test_train_needs_both_classes_and_existing_folders(dovecot, tmp_path):
    code, err = run(dovecot, tmp_path, "train", "--ham", "INBOX", model=tmp_path / "m.joblib")
    assert code == 2 and "--spam FOLDER" in err
    code, err = run(dovecot, tmp_path, "train", "--ham", "Nope", "--spam", "Junk", model=tmp_path / "m.joblib")
    assert code == 1 and "Nope" in err and "Traceback" not in err
    assert not (tmp_path / "m.joblib").exists()


# -- filter ---------------------------------------------------------------------------------


def test_filter_moves_spam_to_junk_with_keywords_and_keeps_every_byte(dovecot, inbox, model, tmp_path):
    ham, spam = inbox
    before = contents(dovecot, "INBOX", "Junk")
    code, err = run(dovecot, tmp_path, "filter", model=model)
    assert code == 0, err
    assert "classified 10 (5 spam, 5 ham, 0 unsure), moved 5" in err
    assert contents(dovecot, "INBOX", "Junk") == before  # nothing lost, nothing copied twice
    assert keys_in(dovecot, "INBOX") == {message_key(r) for r in ham}
    assert keys_in(dovecot, "Junk") == {message_key(r) for r in spam}
    assert all(f & {b"$NotJunk"} and not f & {b"\\Seen", b"$Junk"} for f in flags(dovecot, "INBOX").values())
    assert all(b"$Junk" in f for f in flags(dovecot, "Junk").values())
    code, err = run(dovecot, tmp_path, "filter", model=model)  # again: nothing new
    assert code == 0 and "classified 0" in err and "learned 0 as spam and 0 as ham" in err
    assert contents(dovecot, "INBOX", "Junk") == before


def test_mail_the_model_cannot_judge_stays_where_it_is_and_is_judged_at_the_next_pass(dovecot, inbox, model,
                                                                                      tmp_path):
    """The delivery paths' failure boundary, per message: a model damaged after the run
    started (a truncated snapshot) leaves every message where it is, unflagged, one line
    each and exit 1, no traceback; once the model is whole again, the next pass files them."""
    ham, spam = inbox
    before = contents(dovecot, "INBOX", "Junk")
    whole = model.read_bytes()
    state = imap.State.load(imap.state_path(model))
    from spamnb.cli.imap import _judge_and_learn

    judge, learn = _judge_and_learn(str(model))
    model.write_bytes(whole[:len(whole) // 2])  # after the run opened it: judge() meets it
    said = []
    account(dovecot, tmp_path)  # the password file first: the settings check it
    s = imap.settings_from({}, {"host": dovecot.host, "port": dovecot.port, "user": dovecot.user,
                                "security": "none", "password_file": str(tmp_path / "pw")})
    client = imap.connect(s)
    try:
        out = imap.Filter(client, s, state, judge, learn, said.append).run()
    finally:
        client.logout()
    assert out.failed == 10 and sum(out.classified.values()) == 0 and out.moved == 0
    left = [line for line in said if "not filtered, left where it is" in line]
    assert len(left) == 10 and all("\n" not in line and "Traceback" not in line for line in left), said
    assert contents(dovecot, "INBOX", "Junk") == before and keys_in(dovecot, "Junk") == set()
    assert not any(f & {b"$Junk", b"$NotJunk"} for f in flags(dovecot, "INBOX").values())
    code, err = run(dovecot, tmp_path, "filter", model=model)  # the command: a line each, then exit 1
    assert code == 1 and "Traceback" not in err and err.count("not filtered, left where it is") == 10, err
    model.write_bytes(whole)
    code, err = run(dovecot, tmp_path, "filter", model=model)
    assert code == 0 and "classified 10 (5 spam, 5 ham, 0 unsure), moved 5" in err, err
    assert keys_in(dovecot, "Junk") == {message_key(r) for r in spam}
    assert contents(dovecot, "INBOX", "Junk") == before


def test_keywords_a_client_set_are_replaced_and_unmarked_mail_costs_one_store(dovecot, model, tmp_path,
                                                                                monkeypatch):
    """A mail client may have marked new mail already ($Junk on a ham, $NotJunk on a spam):
    the verdict's keyword replaces it. The other keyword is taken off only where it is
    (one STORE per verdict for unmarked mail, not two)."""
    import imapclient

    ham, spam = sample("ham", 3, model=model), sample("spam", 3, model=model)
    dovecot.append("INBOX", ham[0], flags=[b"$Junk"])
    dovecot.append("INBOX", spam[0], flags=[b"$NotJunk", b"\\Flagged"])
    for raw in ham[1:] + spam[1:]:
        dovecot.append("INBOX", raw)
    removed = []
    real = imapclient.IMAPClient.remove_flags
    monkeypatch.setattr(imapclient.IMAPClient, "remove_flags",
                        lambda self, uids, fl, silent=False: removed.append((list(uids), list(fl)))
                        or real(self, uids, fl, silent=silent))
    code, err = run(dovecot, tmp_path, "filter", model=model)
    assert code == 0, err
    assert sorted(fl for _, fl in removed) == [[b"$Junk"], [b"$NotJunk"]]  # one message each
    assert all(len(uids) == 1 for uids, _ in removed)
    assert all(b"$NotJunk" in f and b"$Junk" not in f for f in flags(dovecot, "INBOX").values())
    junk = flags(dovecot, "Junk")
    assert len(junk) == 3 and all(b"$Junk" in f and b"$NotJunk" not in f for f in junk.values())
    assert sum(b"\\Flagged" in f for f in junk.values()) == 1  # the user's own flags stay


def test_the_users_moves_are_learned_and_a_deletion_is_not(dovecot, inbox, model, tmp_path):
    ham, spam = inbox
    assert run(dovecot, tmp_path, "filter", model=model)[0] == 0
    deleted_before = known(model, spam[1])  # learned as spam only if near the cut-off (filter -u's rule)
    junk = {message_key(raw): uid for uid, raw in dovecot.fetch_all("Junk").items()}
    box = {message_key(raw): uid for uid, raw in dovecot.fetch_all("INBOX").items()}
    dovecot.move("INBOX", box[message_key(ham[0])], "Junk")  # "this is spam"
    dovecot.move("Junk", junk[message_key(spam[0])], "INBOX")  # "this is not spam"
    with dovecot.client() as c:  # "delete this spam"
        c.select_folder("Junk")
        c.add_flags([junk[message_key(spam[1])]], [b"\\Deleted"])
        c.uid_expunge([junk[message_key(spam[1])]])
    code, err = run(dovecot, tmp_path, "filter", model=model)
    assert code == 0, err
    assert "learned 1 as spam and 1 as ham" in err
    assert known(model, ham[0]) == 1  # spam
    assert known(model, spam[0]) == 0  # ham (moved, if the filter had learned it as spam)
    assert known(model, spam[1]) == deleted_before  # deleting teaches nothing
    assert message_key(spam[0]) in keys_in(dovecot, "INBOX")  # it stays where the user put it
    back = [f for uid, f in flags(dovecot, "INBOX").items()
            if message_key(dovecot.fetch_all("INBOX")[uid]) == message_key(spam[0])][0]
    assert b"$NotJunk" in back and b"$Junk" not in back
    moved = [f for uid, f in flags(dovecot, "Junk").items()
             if message_key(dovecot.fetch_all("Junk")[uid]) == message_key(ham[0])][0]
    assert b"$Junk" in moved and b"$NotJunk" not in moved  # spamnb had keyworded it ham
    code, err = run(dovecot, tmp_path, "filter", model=model)  # nothing learned twice
    assert "classified 0" in err and "learned 0 as spam and 0 as ham" in err


def test_a_second_copy_of_a_spam_still_in_junk_is_filtered_not_learned_as_ham(dovecot, inbox, model, tmp_path):
    ham, spam = inbox
    assert run(dovecot, tmp_path, "filter", model=model)[0] == 0
    assert run(dovecot, tmp_path, "filter", model=model)[0] == 0  # Junk's arrivals seen
    before = known(model, spam[0])  # None, or spam when learned as a verdict near the cut-off
    dovecot.append("INBOX", spam[0])  # delivered again
    code, err = run(dovecot, tmp_path, "filter", model=model)
    assert code == 0 and "classified 1 (1 spam" in err and "learned 0 as spam and 0 as ham" in err
    assert known(model, spam[0]) == before != 0
    assert Counter(message_key(r) for r in dovecot.fetch_all("Junk").values())[message_key(spam[0])] == 2


def test_verdicts_near_the_cut_off_are_learned_as_filter_u_learns_them(dovecot, inbox, model, tmp_path):
    from spamnb import verdict

    ham, spam = inbox
    m = load_model(model)
    cutoffs = verdict.cutoffs_from(m.cutoffs)
    expect = {message_key(r): c.label for r in ham + spam
              if verdict.learns_verdict((c := m.classify(r)).label, c.score, cutoffs)}
    code, err = run(dovecot, tmp_path, "filter", model=model)
    assert code == 0 and f"learned {len(expect)} of its verdicts" in err
    after = load_model(model)
    for raw in ham + spam:
        got = after.known(message_key(raw), raw)
        assert got == ({"ham": 0, "spam": 1}[expect[message_key(raw)]] if message_key(raw) in expect else None)


def test_no_learn_verdicts_learns_only_corrections(dovecot, inbox, model, tmp_path):
    ham, spam = inbox
    code, err = run(dovecot, tmp_path, "filter", "--no-learn-verdicts", model=model)
    assert code == 0 and "learned 0 of its verdicts" in err
    assert all(known(model, raw) is None for raw in ham + spam)


def test_junk_content_before_the_first_pass_is_not_learned(dovecot, model, tmp_path):
    old = sample("spam", 2, start=10)
    for raw in old:
        dovecot.append("Junk", raw)
    code, err = run(dovecot, tmp_path, "filter", model=model)
    assert code == 0 and "learned 0 as spam" in err
    assert known(model, old[0]) is None


def test_a_server_without_move_copies_and_expunges_only_that_message(make_dovecot, model, tmp_path):
    d = make_dovecot(capabilities_without=("MOVE",))
    with d.client() as c:
        assert not c.has_capability("MOVE") and c.has_capability("UIDPLUS")
    ham, spam = sample("ham", 3, model=model), sample("spam", 3, model=model)
    for raw in ham + spam:
        d.append("INBOX", raw)
    before = contents(d, "INBOX", "Junk")
    code, err = run(d, tmp_path, "filter", model=model)
    assert code == 0, err
    assert contents(d, "INBOX", "Junk") == before
    assert keys_in(d, "Junk") == {message_key(r) for r in spam}
    assert keys_in(d, "INBOX") == {message_key(r) for r in ham}


def test_unsure_mail_goes_to_the_unsure_folder_and_moving_it_back_is_ham(dovecot, model, tmp_path):
    m = load_model(model)
    odd = next(raw for label in ("ham", "spam") for raw in sample(label, 200) if m.classify(raw).label == "unsure")
    dovecot.append("INBOX", odd)
    code, err = run(dovecot, tmp_path, "filter", "--unsure-folder", "Unsure", model=model)
    assert code == 0 and "1 unsure" in err and "-> Unsure" in err
    assert keys_in(dovecot, "Unsure") == {message_key(odd)}
    dovecot.move("Unsure", dovecot.uids("Unsure")[0], "INBOX")
    code, err = run(dovecot, tmp_path, "filter", "--unsure-folder", "Unsure", model=model)
    assert code == 0 and "learned 0 as spam and 1 as ham" in err
    assert known(model, odd) == 0  # ham


def test_large_messages_stay_unread_and_memory_is_bounded_per_round_trip(dovecot, inbox, model, tmp_path,
                                                                       monkeypatch):
    ham, spam = inbox
    big = spam[0].replace(b"\n\n", b"\n\n" + b"x" * 200_000 + b"\n", 1)
    uid = dovecot.append("INBOX", big)
    monkeypatch.setattr(imap, "MAX_MESSAGE", 100_000)
    monkeypatch.setattr(imap, "FETCH_BYTES", 1)  # one body per round trip
    code, err = run(dovecot, tmp_path, "filter", model=model)
    assert code == 0, err
    assert f"INBOX {uid}: " in err and "left as it is" in err
    (line,) = [ev for text in err.splitlines() if (ev := events.parse(text)) and ev["event"] == "error"]
    assert (line["kind"], line["via"], line["mail"]) == ("too_big", "imap", "unscanned") and int(line["size"]) > 200_000
    assert "classified 10 (5 spam, 5 ham, 0 unsure), moved 5" in err
    assert message_key(big) in keys_in(dovecot, "INBOX")


def test_dry_run_changes_nothing(dovecot, inbox, model, tmp_path):
    before = contents(dovecot, "INBOX", "Junk"), flags(dovecot, "INBOX")
    code, err = run(dovecot, tmp_path, "filter", "--dry-run", model=model)
    assert code == 0, err
    assert err.count("(dry run) ") >= 11 and "-> Junk" in err and "moved 5" in err
    assert (contents(dovecot, "INBOX", "Junk"), flags(dovecot, "INBOX")) == before
    assert not os.path.exists(imap.state_path(model))


def test_uidvalidity_change_rescans_without_classifying_or_learning_twice(dovecot, inbox, model, tmp_path):
    assert run(dovecot, tmp_path, "filter", model=model)[0] == 0
    before = contents(dovecot, "INBOX", "Junk"), load_model(model).messages.tolist()
    dovecot.change_uidvalidity("INBOX")
    dovecot.change_uidvalidity("Junk")
    code, err = run(dovecot, tmp_path, "filter", model=model)
    assert code == 0, err
    assert "UIDVALIDITY changed" in err and "classified 0" in err and "learned 0 as spam and 0 as ham" in err
    assert (contents(dovecot, "INBOX", "Junk"), load_model(model).messages.tolist()) == before


# -- dropped connections -------------------------------------------------------------------------


class Died(BaseException):
    """Our process ends here (a kill): nothing after this line runs."""


class Failing:
    """An IMAPClient stand-in that fails once, right after its ``when`` command went
    through: the server drops the session (``kick``) or our process dies (``die``)."""

    def __init__(self, client, server, when, how):
        self._c, self._server, self._when, self._how = client, server, when, how

    def __getattr__(self, name):
        attr = getattr(self._c, name)
        if name != self._when or not callable(attr):
            return attr

        def call(*args, **kw):
            out = attr(*args, **kw)
            self._when = None
            if self._how == "die":
                raise Died(name)
            self._server.kick()
            return out
        return call


def _pass(d, tmp_path, model, client):
    s = imap.settings_from({}, {"host": d.host, "port": d.port, "user": d.user, "security": "none",
                                "password_file": str(tmp_path / "pw")})
    state = imap.State.load(imap.state_path(model))
    from spamnb.cli.imap import _judge_and_learn

    judge, learn = _judge_and_learn(str(model))
    return imap.Filter(client, s, state, judge, learn, lambda text: None).run()


@pytest.mark.parametrize("without, when, how", [
    ((), "move", "die"), ((), "move", "kick"), (("MOVE",), "copy", "die"), (("MOVE",), "copy", "kick"),
    (("MOVE",), "uid_expunge", "die"), ((), "add_flags", "kick"), ((), "fetch", "kick"), ((), "fetch", "die"),
])
def test_a_pass_cut_at_any_step_loses_and_duplicates_nothing(make_dovecot, model, tmp_path, without, when, how):
    d = make_dovecot(capabilities_without=without)
    ham, spam = sample("ham", 3, model=model), sample("spam", 3, model=model)
    for raw in ham + spam:
        d.append("INBOX", raw)
    account(d, tmp_path)
    before = contents(d, "INBOX", "Junk")
    s = imap.settings_from({}, {"host": d.host, "port": d.port, "user": d.user, "security": "none",
                                "password_file": str(tmp_path / "pw")})
    try:
        _pass(d, tmp_path, model, Failing(imap.connect(s), d, when, how))
    except (Died, *imap.connection_errors()):
        pass
    client = imap.connect(s)
    try:
        out = _pass(d, tmp_path, model, client)
    finally:
        client.logout()
    assert contents(d, "INBOX", "Junk") == before
    assert keys_in(d, "Junk") == {message_key(r) for r in spam}
    assert keys_in(d, "INBOX") == {message_key(r) for r in ham}
    assert out.learned == {"spam": 0, "ham": 0, "already": 0}  # spamnb's own moves are never taken for the user's


# -- settings ---------------------------------------------------------------------------------------


def test_config_file_must_be_private_and_is_read(dovecot, inbox, model, tmp_path, monkeypatch):
    conf_home = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(conf_home))
    conf = conf_home / "spamnb" / "imap.toml"
    conf.parent.mkdir(parents=True)
    account(dovecot, tmp_path)
    conf.write_text(f'host = "{dovecot.host}"\nport = {dovecot.port}\nuser = "{dovecot.user}"\n'
                    f'password_file = "{tmp_path / "pw"}"\nsecurity = "none"\n')
    conf.chmod(0o644)
    res = CliRunner().invoke(main, ["imap", "filter", "--model", str(model)])
    assert res.exit_code == 1 and "mode 0600" in res.stderr
    conf.chmod(0o600)
    res = CliRunner().invoke(main, ["imap", "filter", "--model", str(model)])
    assert res.exit_code == 0 and "classified 10" in res.stderr
    conf.write_text(conf.read_text() + "passwd = \"x\"\n")
    res = CliRunner().invoke(main, ["imap", "filter", "--model", str(model)])
    # read as the [imap] table of the configuration files: an unknown key is named with FILE:LINE, exit 2
    assert res.exit_code == 2 and f"{conf}:6: unknown key 'passwd' in [imap]" in res.stderr


def test_no_password_on_the_command_line_and_no_plaintext_beyond_loopback(tmp_path):
    res = CliRunner().invoke(main, ["imap", "filter", "--host", "h", "--user", "u", "--password", "x"])
    assert res.exit_code == 2 and "No such option" in res.stderr
    res = CliRunner().invoke(main, ["imap", "filter", "--host", "h", "--user", "u"])
    assert res.exit_code == 1 and "--password-file FILE or --password-command CMD" in res.stderr
    pw = tmp_path / "pw"
    pw.write_text("x\n")
    res = CliRunner().invoke(main, ["imap", "filter", "--host", "192.0.2.1", "--user", "u", "--password-file",
                                    str(pw), "--security", "none"])
    assert res.exit_code == 1 and "clear text" in res.stderr


def test_tls_checks_the_certificate_and_starttls_works(make_dovecot, model, tmp_path):
    d = make_dovecot(tls=True)
    account(d, tmp_path)
    d.append("INBOX", sample("spam", 1, model=model)[0])
    base = ["--host", "127.0.0.1", "--user", d.user, "--password-file", str(tmp_path / "pw"), "--model", str(model)]
    res = CliRunner().invoke(main, ["imap", "filter", *base, "--port", str(d.tls_port)])  # tls, the default
    assert res.exit_code == 1 and "not trusted" in res.stderr and "--cafile" in res.stderr
    assert res.stderr.count("\n") == 1
    res = CliRunner().invoke(main, ["imap", "filter", *base, "--port", str(d.tls_port), "--cafile", str(d.cert)])
    assert res.exit_code == 0 and "classified 1 (1 spam" in res.stderr, res.stderr
    d.append("INBOX", sample("spam", 1, start=1, model=model)[0])
    res = CliRunner().invoke(main, ["imap", "filter", *base, "--port", str(d.port), "--security", "starttls",
                                    "--cafile", str(d.cert)])
    assert res.exit_code == 0 and "classified 1 (1 spam" in res.stderr, res.stderr


def test_wrong_password_is_one_line(dovecot, tmp_path):
    pw = tmp_path / "bad"
    pw.write_text("wrong\n")
    pw.chmod(0o600)
    res = CliRunner().invoke(main, ["imap", "filter", "--host", dovecot.host, "--port", str(dovecot.port),
                                    "--user", dovecot.user, "--password-file", str(pw), "--security", "none"])
    assert res.exit_code == 1 and "login" in res.stderr and "failed" in res.stderr
    assert res.stderr.count("\n") == 1


def test_password_command(dovecot, inbox, model, tmp_path):
    res = CliRunner().invoke(main, ["imap", "filter", "--host", dovecot.host, "--port", str(dovecot.port),
                                    "--user", dovecot.user, "--password-command", f"echo {dovecot.password}",
                                    "--security", "none", "--model", str(model)])
    assert res.exit_code == 0 and "classified 10" in res.stderr


# -- watch ----------------------------------------------------------------------------------------


def _wait_for(pred, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return False


def _stop(proc):
    """SIGTERM a watching ``imap filter``: ``(exit status, its stderr)``."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(20), proc.stderr.read().decode()
    finally:
        proc.stdout.close()
        proc.stderr.close()


def test_watch_files_new_mail_as_it_arrives_and_survives_a_dropped_connection(dovecot, model, tmp_path):
    args = account(dovecot, tmp_path)
    proc = subprocess.Popen(SPAMNB + ["imap", "filter", *args, "--model", str(model), "--watch", "--interval", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ))
    try:
        spam = sample("spam", 2, model=model)
        assert _wait_for(lambda: dovecot.sessions())  # watching
        dovecot.append("INBOX", spam[0])
        assert _wait_for(lambda: message_key(spam[0]) in keys_in(dovecot, "Junk")), "not filed"
        dovecot.kick()  # the connection drops
        dovecot.append("INBOX", spam[1])
        assert _wait_for(lambda: message_key(spam[1]) in keys_in(dovecot, "Junk"), 40), "not filed after a drop"
    finally:
        code, err = _stop(proc)
    assert code == 0, err
    assert "connection lost" in err and "stopped" in err


def test_the_delivery_filters_filing_in_junk_is_not_a_correction(dovecot, model, tmp_path):
    """procmail's recipe (`spamnb filter -u`, then X-Spam-Flag: YES -> .Junk) and the
    IMAP filter on one mailbox learn what the recipe alone learns; only the user's
    move back of a misfiled ham is a correction."""
    from spamnb.delivery.hook import add_headers
    from spamnb.verdict import header_lines

    assert run(dovecot, tmp_path, "filter", model=model)[0] == 0  # the first pass: Junk's past is read
    env = {**os.environ, "SPAMNB_SOCKET": str(tmp_path / "no-server.sock")}
    for raw in sample("spam", 3, start=5, model=model):
        out = subprocess.run(SPAMNB + ["filter", "-u", "--exit-zero", "--model", str(model)], input=raw,
                             capture_output=True, env=env, timeout=120, check=True).stdout
        assert b"X-Spam-Flag: YES" in out
        dovecot.append("Junk", out)
    ham = sample("ham", 1, start=5, model=model)[0]
    dovecot.append("Junk", add_headers(ham, header_lines("spam", 0.97, 3.5, model.name, required=2.94)))  # a false positive
    alone = load_model(model)  # what the recipe alone learned
    code, err = run(dovecot, tmp_path, "filter", model=model)
    assert code == 0 and "learned 0 as spam and 0 as ham" in err, err
    assert err.count("filed there by spamnb at delivery") == 4 and "you moved it" not in err
    both = load_model(model)
    assert both.registry == alone.registry
    np.testing.assert_array_equal(both.estimator.feature_count_, alone.estimator.feature_count_)
    junk = {message_key(raw): uid for uid, raw in dovecot.fetch_all("Junk").items()}
    dovecot.move("Junk", junk[message_key(ham)], "INBOX")  # the user: "this is not spam"
    code, err = run(dovecot, tmp_path, "filter", model=model)
    assert code == 0 and "learned 0 as spam and 1 as ham" in err, err
    assert known(model, ham) == 0


def test_watch_serves_metrics_and_a_line_per_message(dovecot, model, tmp_path):
    pytest.importorskip("prometheus_client", reason="the metrics extra is not installed (pip install 'spamnb[metrics]')")
    import socket
    import urllib.request

    from spamnb.delivery import events

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = account(dovecot, tmp_path)
    proc = subprocess.Popen(SPAMNB + ["imap", "filter", *args, "--model", str(model), "--watch", "--interval", "2",
                                      "--metrics", f"127.0.0.1:{port}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ))

    def page():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                return r.read().decode()
        except OSError:
            return ""

    try:
        spam = sample("spam", 2, model=model)
        assert _wait_for(lambda: dovecot.sessions())
        for raw in spam:
            dovecot.append("INBOX", raw)
        assert _wait_for(lambda: 'spamnb_messages_total{verdict="spam",via="imap"} 2.0' in page()), page()
    finally:
        code, err = _stop(proc)
    assert code == 0, err
    lines = [ev for line in err.splitlines() if (ev := events.parse(line))]
    assert [ev["verdict"] for ev in lines] == ["spam", "spam"] and all(ev["via"] == "imap" for ev in lines)
    assert lines[0]["user"] == dovecot.user


def test_filter_records_each_verdict_and_its_folder_in_the_history(dovecot, inbox, model, tmp_path):
    import sqlite3

    ham, spam = inbox
    hist = str(model) + ".history.sqlite"
    code, err = run(dovecot, tmp_path, "filter", "--dry-run", model=model)
    assert code == 0 and not os.path.exists(hist)  # a dry run records nothing
    code, err = run(dovecot, tmp_path, "filter", model=model)
    assert code == 0, err
    db = sqlite3.connect(hist)
    got = db.execute("SELECT verdict, via, user, dest FROM verdicts").fetchall()
    db.close()
    assert sorted(got) == sorted([("ham", "imap", dovecot.user, "INBOX")] * len(ham)
                                 + [("spam", "imap", dovecot.user, "Junk")] * len(spam))


def test_moving_a_message_into_or_out_of_junk_marks_its_history_row_corrected(dovecot, inbox, model, tmp_path):
    """The user's moves are corrections in the history (the page's Overview counts them),
    found by Message-ID; a move of a message never recorded marks nothing."""
    import sqlite3

    from spamnb.storage.history import fields

    ham, spam = inbox
    hist = str(model) + ".history.sqlite"
    assert run(dovecot, tmp_path, "filter", model=model)[0] == 0
    stranger = sample("ham", 1, start=20, model=model)[0]  # filed in Junk by hand, never judged
    assert fields(stranger)["message_id"] and fields(ham[0])["message_id"] and fields(spam[0])["message_id"]
    dovecot.append("Junk", stranger)
    junk = {message_key(raw): uid for uid, raw in dovecot.fetch_all("Junk").items()}
    box = {message_key(raw): uid for uid, raw in dovecot.fetch_all("INBOX").items()}
    dovecot.move("INBOX", box[message_key(ham[0])], "Junk")  # "this is spam"
    dovecot.move("Junk", junk[message_key(spam[0])], "INBOX")  # "this is not spam"
    code, err = run(dovecot, tmp_path, "filter", model=model)
    assert code == 0, err
    db = sqlite3.connect(hist)
    got = db.execute("SELECT message_id, verdict, corrected, corrected_t IS NOT NULL, user FROM verdicts "
                     "WHERE corrected IS NOT NULL").fetchall()
    mids = {m for (m,) in db.execute("SELECT message_id FROM verdicts")}
    db.close()
    assert sorted(got) == sorted([(fields(ham[0])["message_id"], "ham", "spam", 1, dovecot.user),
                                  (fields(spam[0])["message_id"], "spam", "ham", 1, dovecot.user)])
    assert fields(stranger)["message_id"] not in mids  # learned as spam, not in the history
    assert os.stat(hist).st_mode & 0o777 == 0o600


# -- the model a run judges with ----------------------------------------------------------------


def test_without_a_model_of_ones_own_the_default_is_opened_once_a_run(dovecot, tmp_path, small_archive,
                                                                       monkeypatch):
    """A user with no model of their own: the default model judges every message of the
    run through one backend (its model kept loaded), not a backend opened again per
    message; the user's own model, made by their first correction, judges from then on,
    and a default model removed meanwhile (a cache cleared) is built again."""
    from spamnb.cli.imap import _judge_and_learn
    from spamnb.storage import filestore, locate

    monkeypatch.setenv("SPAMNB_CORPUS", str(small_archive))
    opened = []
    real = filestore.FileBackend.__init__
    monkeypatch.setattr(filestore.FileBackend, "__init__",
                        lambda self, path, **kw: opened.append(os.fspath(path)) or real(self, path, **kw))
    raws = sample("spam", 6) + sample("ham", 6)
    for raw in raws:
        dovecot.append("INBOX", raw)
    code, err = run(dovecot, tmp_path, "filter")
    assert code == 0 and "classified 12" in err, err
    default = locate.default_cache_path()
    assert sorted(set(opened)) == sorted([default, locate.default_model_path()])
    assert opened.count(default) == 2, opened  # found missing, then built: not one per message
    own = locate.default_model_path()
    assert not os.path.exists(own)  # the default model never learns

    opened.clear()
    judge, learn = _judge_and_learn(None)
    label, p, learns = judge(raws[0])
    assert not learns
    os.unlink(default)  # the cache cleared during a run: built again, as at the start
    assert judge(raws[1])[:2] == judge(raws[1])[:2] and os.path.exists(default)
    learn([(raws[0], "ham" if label == "spam" else "spam")])  # the first correction makes the user's model
    assert os.path.exists(own) and judge(raws[0])[1] != p  # judged by it now
    assert opened.count(default) == 3 and opened.count(own) == 1, opened  # once, then found gone and built


@pytest.mark.parametrize("key, value, said", [
    ("force_plaintext", "no", "force_plaintext: must be true or false"),  # a string, not TOML's false
    ("port", 70000, "port: must be from 1 to 65535"),
    ("interval", "soon", "interval: must be a number"),
])
def test_every_imap_key_of_a_file_is_checked_by_its_row(key, value, said):
    """Each ``[imap]`` key a file gives has its row's kind and bounds: ``force_plaintext =
    "no"`` is refused, not taken as true (which would send the password in clear text)."""
    config = {"host": "mail.example.com", "user": "alice", "password_file": "/nonexistent", "security": "none",
              key: value}
    with pytest.raises(imap.ImapError, match=said):
        imap.settings_from(config, {})
