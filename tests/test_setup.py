"""``spamnb setup`` walked as a new user would.

A made Maildir++ in a fresh HOME (shipped sample mail, with the times a real
mailbox has), setup run as a non-root user (a throwaway one made with ``useradd``
when the tests run as root, as tests/test_hardening.py does; else the current
user), then: nothing in the mailbox changed (every file's hash, size and mtime,
every folder's listing and mtime), the model and the configuration are where the
filter looks, and the procmail recipe it printed files mail through real procmail.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import SAMPLE_MAILDIR, strip_from_line
from spamnb.delivery import setup as lib
from spamnb.evaluation.metrics import proportion_interval
from test_e2e import README_SPAMNB, SPAMNB, confident, delivered, passed_through, readme_block  # noqa: F401

USER = "spamnb-newuser"
DAY = 86400


@pytest.fixture(scope="module")
def newcomer():
    """``(uid, gid, name)`` setup runs as: a throwaway user when root, else ourselves."""
    if os.geteuid() != 0:
        me = pwd.getpwuid(os.geteuid())
        return me.pw_uid, me.pw_gid, me.pw_name
    if shutil.which("useradd") is None:
        pytest.skip("useradd is not installed (needed to run setup as a non-root user)")
    try:
        user = pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER],
                       check=True, capture_output=True)
        user = pwd.getpwnam(USER)
    return user.pw_uid, user.pw_gid, user.pw_name


def sample(label):
    lines = (SAMPLE_MAILDIR.parent / "sample-maildir.index").read_text().split("\n")
    return [SAMPLE_MAILDIR.parent / p for lb, _, p in (line.partition(" ") for line in lines) if lb == label]


def put(folder: Path, src: Path, n: int, age_days: float, now: float) -> Path:
    """``src`` delivered ``age_days`` ago: its Maildir name starts with that time, as a
    delivery names it, and the file has that time."""
    t = int(now - age_days * DAY)
    dst = folder / "cur" / f"{t}.M{n}P1.test:2,S"
    dst.write_bytes(src.read_bytes())
    os.utime(dst, (t, t))
    return dst


def maildir_plus(root: Path, now: float) -> Path:
    """A Maildir++ in ``root``: INBOX and .Archive (ham, 5 of it delivered yesterday, 2 spam
    the user never sorted), .Junk, .Trash."""
    md = root / "Maildir"
    for folder in ("", ".Junk", ".Archive", ".Trash"):
        for sub in ("cur", "new", "tmp"):
            (md / folder / sub).mkdir(parents=True)
    ham, spam = sample("ham"), sample("spam")
    for i, src in enumerate(ham[:40]):
        put(md, src, i, 5 + i, now)
    for i, src in enumerate(ham[40:65]):
        put(md / ".Archive", src, 100 + i, 200 + 10 * i, now)
    for i, src in enumerate(ham[65:70]):
        put(md, src, 200 + i, 1, now)  # delivered yesterday: perhaps not read yet
    for i, src in enumerate(ham[70:73]):
        put(md / ".Trash", src, 300 + i, 10, now)
    for i, src in enumerate(spam[:28]):
        put(md / ".Junk", src, 400 + i, 2 + i, now)
    for i, src in enumerate(spam[28:30]):
        put(md, src, 500 + i, 20, now)  # spam left in INBOX: the default model should point at it
    return md


@pytest.fixture
def home(newcomer):
    """A fresh HOME owned by the newcomer, holding :func:`maildir_plus`'s Maildir++."""
    uid, gid, _ = newcomer
    path = Path(tempfile.mkdtemp(prefix="spamnb-setup-", dir="/tmp"))
    maildir_plus(path, time.time())
    for p in [path, *path.rglob("*")]:
        os.lchown(p, uid, gid)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def snapshot(root: Path) -> dict:
    """Every path under ``root``: a file's sha256, size and mtime; a folder's mtime (it
    changes when anything is added, removed or renamed in it, e.g. new/ -> cur/)."""
    out = {}
    for p in sorted([root, *root.rglob("*")]):
        st = p.lstat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        out[str(p.relative_to(root))] = (digest, st.st_size if p.is_file() else None, st.st_mtime_ns, st.st_mode)
    return out


def environment(newcomer, home) -> dict:
    _, _, name = newcomer
    env = {"HOME": str(home), "USER": name, "LOGNAME": name, "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           "LANG": "C.UTF-8"}
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


def as_newcomer(newcomer, fn):
    """``fn()`` in a forked process turned into the newcomer (when root); its exit status."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 70
        try:
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(newcomer[1])
                os.setuid(newcomer[0])
            code = fn()
        except BaseException:  # noqa: BLE001 - told to the parent on stderr
            import traceback

            os.write(2, traceback.format_exc().encode())
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def run_setup(env, home, args, out, err) -> int:
    """``spamnb setup ARGS`` in this process, in ``env``, its output to the files ``out`` and ``err``."""
    from spamnb.cli import main

    saved = dict(os.environ), os.getcwd(), sys.argv, sys.stdout, sys.stderr
    os.environ.clear()
    os.environ.update(env)
    os.chdir(home)
    sys.argv = [SPAMNB[0], "setup", *args]  # what setup names as spamnb's full path
    try:
        with open(out, "w") as o, open(err, "w") as e:
            sys.stdout, sys.stderr = o, e
            try:
                main.main(["setup", *args], prog_name="spamnb")
            except SystemExit as exc:
                return exc.code if isinstance(exc.code, int) else 1
        return 0
    finally:
        os.environ.clear()
        os.environ.update(saved[0])
        os.chdir(saved[1])
        sys.argv, sys.stdout, sys.stderr = saved[2:]


def setup_as(newcomer, home, *args):
    """``spamnb setup ARGS`` as the newcomer in its fresh HOME: ``(status, stdout, stderr)``.

    In a forked process turned into the newcomer, running the click command: the
    tests' interpreter may sit where another user cannot read it (a pyenv under
    /root), and a fork needs no exec. Python imports lazily, so the same run is made
    first here, on a copy of the HOME, for every module it needs to be loaded."""
    out, err = home.parent / f"{home.name}.out", home.parent / f"{home.name}.err"
    env = environment(newcomer, home)
    if os.geteuid() == 0 and not newcomer_can_run_spamnb(newcomer):
        copy = Path(tempfile.mkdtemp(prefix="spamnb-warm-", dir="/tmp")) / "home"
        shutil.copytree(home, copy, symlinks=True)
        try:
            run_setup({**env, "HOME": str(copy)}, copy, args, out, err)
        finally:
            shutil.rmtree(copy.parent, ignore_errors=True)
            out.unlink(missing_ok=True)
            err.unlink(missing_ok=True)
    code = as_newcomer(newcomer, lambda: run_setup(env, home, args, out, err))
    try:
        return code, out.read_text(), err.read_text()
    finally:
        out.unlink(missing_ok=True)
        err.unlink(missing_ok=True)


def newcomer_can_run_spamnb(newcomer) -> bool:
    """Whether the newcomer can run the spamnb script and its interpreter (not when they
    sit under root's home)."""
    paths = [os.path.realpath(SPAMNB[0]), os.path.realpath(sys.executable)]
    return as_newcomer(newcomer, lambda: 0 if all(os.access(p, os.X_OK) for p in paths) else 1) == 0


def printed_recipe(out: str) -> str:
    """The procmail recipe setup printed: up to the first line it says after it."""
    head = "The procmail recipe, for ~/.procmailrc:\n\n"
    start = out.index(head) + len(head)
    ends = [out.find(end, start) for end in ("\nUnsure mail goes to", "\n(spamnb setup --install", "\nwrote ")]
    return out[start:min(i for i in ends if i >= 0)]


@pytest.mark.slow  # about 20 s (the default model in a fresh home); .ci/run runs it
@pytest.mark.skipif(shutil.which("procmail") is None,
                    reason="procmail is not installed (scripts/test.sh installs it when run as root)")
def test_setup_on_a_new_users_maildir_changes_no_mail_and_its_recipe_works(newcomer, home):
    md = home / "Maildir"
    before = snapshot(md)
    code, out, err = setup_as(newcomer, home, "--yes")
    assert code == 0, err
    assert "Traceback" not in err
    assert snapshot(md) == before  # not a byte, a name or a time changed

    assert "it never moves, deletes or changes a message" in out
    assert "~/Maildir/.Junk" in out and "28 messages" in out
    assert "Proposed: learn 65 ham and 28 spam." in out  # .Trash and yesterday's 5 are not ham
    assert "5 messages younger than 3 days" in out
    # the two spam left in INBOX are listed for the user, not learned as ham
    assert "2 kept messages the default model calls spam" in out
    for name in (".M500P1.test:2,S", ".M501P1.test:2,S"):
        assert name in out
    assert "10-fold cross-validation, 65 ham, 28 spam" in out
    assert out.count("(95% interval ") == 2
    assert "with fewer than 100 ham and 30 spam learned, each correction counts" in out  # 28 spam
    model = home / ".local" / "share" / "spamnb" / "model.joblib"
    assert model.is_file() and model.stat().st_uid == newcomer[0]
    assert f'path = "{model}"' in (home / ".config" / "spamnb" / "config.toml").read_text()

    # The recipe is docs/delivery.md's, with this spamnb's full path; it works as printed.
    recipe = printed_recipe(out)
    assert recipe == readme_block("procmail").replace(README_SPAMNB, SPAMNB[0])
    rc = home / ".procmailrc"
    rc.write_text(recipe)
    os.chown(rc, newcomer[0], newcomer[1])
    agent = {"user": newcomer[0], "group": newcomer[1], "extra_groups": []} if os.geteuid() == 0 else {}
    if agent and not newcomer_can_run_spamnb(newcomer):
        # This interpreter is out of the newcomer's reach: procmail runs as root here, as in
        # test_e2e, on the home handed to root (spamnb loads only its own user's or root's model).
        for p in [home, *home.rglob("*")]:
            os.lchown(p, 0, 0)
        agent = {}
    spam, ham = sorted((md / ".Junk" / "cur").iterdir())[0], sorted((md / "cur").iterdir())[0]
    for raw in (strip_from_line(spam.read_bytes()), strip_from_line(ham.read_bytes())):
        got = subprocess.run(["procmail", "-m", f"HOME={home}", *passed_through(), str(rc)], input=raw,
                             env=environment(newcomer, home), capture_output=True, timeout=120, **agent)
        assert got.returncode == 0, got.stderr
    junk, inbox = list((md / ".Junk" / "new").iterdir()), list((md / "new").iterdir())
    assert len(junk) == len(inbox) == 1
    assert b"X-Spam-Flag: YES" in junk[0].read_bytes()
    assert b"X-Spam-Status: No," in inbox[0].read_bytes()


@pytest.mark.slow  # about 15 s (the default model in a fresh home); .ci/run runs it
def test_too_little_sorted_mail_keeps_the_default_model(newcomer, home):
    """With 5 spam sorted, setup says how many more to sort and trains nothing;
    --install writes a recipe where there is none and never over the user's own, and
    makes the folder for unsure mail, which the recipe needs either way."""
    for extra in sorted((home / "Maildir" / ".Junk" / "cur").iterdir())[5:]:
        extra.unlink()
    before = snapshot(home / "Maildir")
    (home / ".mailfilter").write_text("# mine\n")
    code, out, err = setup_as(newcomer, home, "--yes", "--install")
    assert code == 0, err
    assert "sort 5 more spam" in out and "the default model is used" in out
    assert not (home / ".local" / "share" / "spamnb" / "model.joblib").exists()
    assert not (home / ".config" / "spamnb" / "config.toml").exists()
    # no message or folder of the user's changed: --install only added the empty .Unsure the
    # recipe files into (which changed the time of ~/Maildir, whose listing it joined)
    after = snapshot(home / "Maildir")
    made = {name for name in after if name.startswith(".Unsure")}
    assert made == {".Unsure", ".Unsure/cur", ".Unsure/new", ".Unsure/tmp", ".Unsure/maildirfolder"}
    assert f"made the folder {home / 'Maildir' / '.Unsure'}" in out
    assert {k: v for k, v in after.items() if k not in made and k != "."} == \
        {k: v for k, v in before.items() if k != "."}
    # ~/.mailfilter says maildrop: its recipe, not written over the user's file
    assert 'xfilter "' in out and "exists: setup leaves it as it is" in out
    assert (home / ".mailfilter").read_text() == "# mine\n"
    code, out, err = setup_as(newcomer, home, "--yes", "--install", "--delivery", "procmail")
    assert code == 0, err
    assert (home / ".procmailrc").read_text() == printed_recipe(out)
    assert (home / ".procmailrc").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("name, role", [
    (".Junk", "spam"), ("Spam", "spam"), (".Junk.2024", "spam"), ("junk e-mail", "spam"), ("INBOX", "ham"),
    (".Archive", "ham"), (".Sent", "ham"), (".Trash", "skip"), (".Archive.Trash", "skip"), ("Drafts", "skip"),
])
def test_folder_roles(name, role):
    assert lib.role_of(name) == role


def test_proportion_interval_is_exact_and_never_collapses_at_zero():
    assert proportion_interval(0, 30) == pytest.approx((0.0, 11.57), abs=0.01)  # 1 - 0.025 ** (1 / 30)
    low, high = proportion_interval(15, 30)
    assert low < 50 < high and low == pytest.approx(100 - high)
    with pytest.raises(ValueError):
        proportion_interval(3, 2)


@pytest.mark.parametrize("kind", ["procmail", "maildrop", "sieve"])
def test_the_recipes_are_the_docs_own(kind, tmp_path):
    """One recipe per agent: what setup prints is docs/delivery.md's, the path aside."""
    target, text = lib.recipe(kind, README_SPAMNB, str(tmp_path))
    assert text == readme_block(kind)
    assert target == str(tmp_path / {"procmail": ".procmailrc", "maildrop": ".mailfilter",
                                     "sieve": ".dovecot.sieve"}[kind])


def test_the_imap_unit_is_contribs_own(tmp_path):
    """The systemd user unit setup gives is contrib's, comments aside, with this spamnb (and,
    unless turned off, the unsure folder: test_the_imap_unit_files_unsure_mail_unless_turned_off)."""
    contrib = (Path(__file__).resolve().parent.parent / "contrib" / "systemd" / "user" / "spamnb-imap.service")
    lines = [line for line in contrib.read_text().splitlines() if line and not line.startswith("#")]
    _, text = lib.recipe("imap", "/opt/bin/spamnb", str(tmp_path), unsure=None)
    assert [line for line in text.splitlines() if line] == [
        line.replace(README_SPAMNB, "/opt/bin/spamnb") for line in lines]


def test_mh_folders_and_mbox_files_are_found_and_proposed(tmp_path, monkeypatch):
    """~/Mail as MH folders (inbox, spam), ~/mail/* as mbox files (saved, junk): each
    found, counted and given its role; an mbox message's age is its Date. An MH
    folder is listed without reading its messages (setup reads each when it needs it),
    unless one is too young by its file's time (then its header's Date is read)."""
    import builtins
    import mailbox

    from spamnb.mail.sources import iter_messages

    ham = [strip_from_line(p.read_bytes()) for p in sample("ham")[:8]]
    spam = [strip_from_line(p.read_bytes()) for p in sample("spam")[:4]]
    (tmp_path / "Mail").mkdir()
    for name, msgs in (("inbox", ham[:4]), ("spam", spam[:2])):
        box = mailbox.MH(tmp_path / "Mail" / name, create=True)
        for raw in msgs:
            box.add(raw)
    (tmp_path / "mail").mkdir()
    for name, msgs in (("saved", ham[4:]), ("junk", spam[2:])):
        box = mailbox.mbox(tmp_path / "mail" / name)
        for raw in msgs:
            box.add(raw)
        box.close()
    opened, real_open = [], builtins.open
    monkeypatch.setattr(builtins, "open", lambda file, *a, **k: opened.append(str(file)) or real_open(file, *a, **k))
    later = time.time() + 10 * DAY  # the MH files are new: 10 days on (a young one's header is read)
    folders = {f.name: f for f in lib.find_mail(str(tmp_path), env={}, now=later)}
    monkeypatch.setattr(builtins, "open", real_open)
    assert not [p for p in opened if p.startswith(str(tmp_path / "Mail") + "/")]
    assert [source for source, _, _ in folders["~/Mail/inbox"].messages] == [
        m.source for m in iter_messages(str(tmp_path / "Mail" / "inbox"))]  # in the order training reads
    assert {n: (f.kind, f.role, len(f.messages)) for n, f in folders.items()} == {
        "~/Mail/inbox": ("mh", "ham", 4), "~/Mail/spam": ("mh", "spam", 2),
        "~/mail/saved": ("mbox", "ham", 4), "~/mail/junk": ("mbox", "spam", 2)}
    assert all(age > 365 for age in folders["~/mail/saved"].ages(time.time()))  # 2002 mail, by its Date
    proposal = lib.propose(folders.values(), now=later)
    assert (len(proposal.ham), len(proposal.spam), proposal.young) == (8, 4, 0)
    assert not proposal.enough and proposal.shortfall() == "22 more ham (mail you keep) and 6 more spam " \
                                                           "(into a Junk folder)"
    assert proposal.shortfall(lib.FIRST_DAY_HAM, lib.FIRST_DAY_SPAM).startswith("92 more ham")
    assert lib.Proposal(proposal.ham * 13, proposal.spam * 8, 0, []).shortfall(lib.FIRST_DAY_HAM, 30) == ""


def test_an_imap_account_in_the_configuration_gets_the_imap_train_line_and_the_unit(tmp_path):
    """No local mail, an account in ~/.config/spamnb/imap.toml: setup names `imap train`,
    gives the systemd user unit with this spamnb, and --install writes it."""
    config = tmp_path / ".config" / "spamnb"
    config.mkdir(parents=True)
    (config / "imap.toml").write_text('host = "imap.example.org"\nuser = "alice"\npassword_command = "true"\n')
    (config / "imap.toml").chmod(0o600)
    env = {"HOME": str(tmp_path), "USER": "nobody-here", "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           **({"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {})}
    proc = subprocess.run([*SPAMNB, "setup", "--yes", "--install"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "No mail found" in proc.stdout
    assert "An IMAP account is configured (imap.example.org)" in proc.stdout
    assert "spamnb imap train --ham INBOX --spam Junk" in proc.stdout
    unit = tmp_path / ".config" / "systemd" / "user" / "spamnb-imap.service"
    assert f"ExecStart={SPAMNB[0]} imap filter --watch --unsure-folder Unsure\n" in unit.read_text()
    assert "Unsure mail goes to Unsure" in proc.stdout
    assert not (tmp_path / ".local").exists()  # nothing sorted: no model of the user's
    assert not (tmp_path / "Maildir").exists()  # IMAP: no local folder made
    # an unsure folder in the account's settings already: the unit needs no option, and it is named
    unit.unlink()
    with open(config / "imap.toml", "a") as f:
        f.write('unsure_folder = "Later"\n')
    proc = subprocess.run([*SPAMNB, "setup", "--yes", "--install"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"ExecStart={SPAMNB[0]} imap filter --watch\n" in unit.read_text()
    assert "Unsure mail goes to Later" in proc.stdout


@pytest.mark.slow  # about 8 s; .ci/run runs it
def test_without_yes_it_asks_and_a_no_trains_nothing(home):
    """Without --yes each step is asked (click.confirm); answering no to training leaves
    no model and no configuration, and the mailbox as it was."""
    md = home / "Maildir"
    before = snapshot(md)
    env = {"HOME": str(home), "USER": "nobody-here", "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           **({"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {})}
    proc = subprocess.run([*SPAMNB, "setup"], input="n\n", env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Train a model of your own on them? [Y/n]: " in proc.stdout
    assert "Estimated" not in proc.stdout and "The procmail recipe" in proc.stdout
    assert not (home / ".local" / "share" / "spamnb").exists()
    assert not (home / ".config").exists()
    assert snapshot(md) == before


class _Kept:
    def replace(self, model):
        self.model = model


def test_setup_reads_each_message_once(tmp_path, monkeypatch, trained_model):
    """Screening, cross-validation and training all need a message's tokens: setup reads
    each message file once for all three (it read each ham three times and each spam
    twice), and what it proposes, estimates and trains is what reading each anew gives."""
    import builtins
    import collections

    from spamnb.model import SpamModel
    from spamnb.evaluation import evaluate, metrics
    from spamnb.mail.sources import SourceWarning
    from spamnb.scale import parallel

    now = time.time()
    md = maildir_plus(tmp_path, now)
    empty = md / "cur" / f"{int(now - 30 * DAY)}.M600P1.test:2,S"  # not mail: screened, never learned
    empty.write_bytes(b"")
    os.utime(empty, (now - 30 * DAY, now - 30 * DAY))
    screen = trained_model  # in the default model's place (seconds to build in a fresh home)
    opened = collections.Counter()
    real_open = builtins.open

    def counting_open(file, *args, **kwargs):
        if str(file).startswith(str(md)):
            opened[str(file)] += 1
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    folders = lib.find_mail(str(tmp_path), env={})
    proposal = lib.propose(folders, screen=screen, now=now)
    with pytest.warns(SourceWarning, match="not a mail message"):  # the empty file, as before
        est = lib.estimate(proposal, SpamModel)
    kept = _Kept()
    done = lib.train(proposal, SpamModel(), kept)
    monkeypatch.setattr(builtins, "open", real_open)

    older = 40 + 25 + 2 + 1  # INBOX's and .Archive's ham, INBOX's spam, the empty file
    assert (len(proposal.ham), len(proposal.spam), proposal.young) == (older - len(proposal.doubtful), 28, 5)
    assert [source.rsplit(".", 2)[1] for source, _ in proposal.doubtful] == [
        "M500P1", "M501P1"]  # the spam left in INBOX
    assert len(opened) == older + 28  # every message setup screens or learns: not yesterday's, not .Trash
    assert max(opened.values()) == 1, opened.most_common(3)

    # the same as reading each message anew, as setup did
    fresh = [(source, None, label) for source, _, label in proposal.messages()]
    assert done == parallel.train(reference := SpamModel(), fresh, on_error=lambda *_: None)
    assert kept.model.vocabulary == reference.vocabulary
    np.testing.assert_array_equal(kept.model.estimator.feature_count_, reference.estimator.feature_count_)
    np.testing.assert_array_equal(kept.model.estimator.class_count_, reference.estimator.class_count_)
    assert kept.model.registry == reference.registry
    with pytest.warns(SourceWarning, match="not a mail message"):
        scores = evaluate.cross_validate(SpamModel, fresh, k=est["folds"])
    cut = SpamModel().cutoffs
    assert est == {**metrics.decision_intervals(scores.y, scores.proba, cut.ham_cutoff, cut.spam_cutoff,
                                                known=scores.known), "folds": est["folds"]}


# -- the rules setup promises, each held in the default run ---------------------------------------


def test_enough_is_30_ham_and_10_spam_exactly():
    ham, spam = [("h", None, "ham")], [("s", None, "spam")]
    assert lib.Proposal(ham * lib.MIN_HAM, spam * lib.MIN_SPAM, 0, []).enough
    assert (lib.MIN_HAM, lib.MIN_SPAM) == (30, 10)  # the counts the docs and the first-day figures name
    assert not lib.Proposal(ham * (lib.MIN_HAM - 1), spam * lib.MIN_SPAM, 0, []).enough
    assert not lib.Proposal(ham * lib.MIN_HAM, spam * (lib.MIN_SPAM - 1), 0, []).enough
    assert lib.Proposal(ham * 30, spam * 9, 0, []).shortfall() == "1 more spam (into a Junk folder)"


def test_ham_younger_than_3_days_is_left_out(tmp_path):
    """Mail delivered less than 3 days ago may not have been sorted yet: not learned as ham
    (a junk folder's is spam whatever its age)."""
    now = time.time()
    md = tmp_path / "Maildir"
    for folder in ("", ".Junk"):
        for sub in ("cur", "new", "tmp"):
            (md / folder / sub).mkdir(parents=True)
    ham, spam = sample("ham"), sample("spam")
    young = put(md, ham[0], 0, lib.HAM_MIN_AGE_DAYS - 0.01, now)
    old = put(md, ham[1], 1, lib.HAM_MIN_AGE_DAYS + 0.01, now)
    fresh_spam = put(md / ".Junk", spam[0], 2, 0.01, now)
    proposal = lib.propose(lib.find_mail(str(tmp_path), env={}), now=now)
    assert [s for s, _, _ in proposal.ham] == [str(old)] and proposal.young == 1
    assert [s for s, _, _ in proposal.spam] == [str(fresh_spam)]
    assert str(young) not in [s for s, _, _ in proposal.messages()]


def _bare_home(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "USER": "nobody-here", "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           **({"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {})}
    return home, env


def test_install_never_replaces_a_recipe_file_that_is_there(tmp_path):
    """No mail here (nothing to screen: seconds): --install writes the recipe only where
    nothing is, and leaves the user's file, or a link (even one to nowhere), as it is."""
    home, env = _bare_home(tmp_path)
    target = home / ".procmailrc"

    def install():
        return subprocess.run([*SPAMNB, "setup", "--yes", "--install", "--delivery", "procmail"], env=env,
                              capture_output=True, text=True, timeout=120)

    target.write_text("# mine\n")
    proc = install()
    assert proc.returncode == 0, proc.stderr
    assert f"{target} exists: setup leaves it as it is" in proc.stdout
    assert target.read_text() == "# mine\n"
    target.unlink()
    target.symlink_to(tmp_path / "nowhere")
    assert "exists: setup leaves it as it is" in install().stdout
    assert not (tmp_path / "nowhere").exists() and os.readlink(target) == str(tmp_path / "nowhere")
    target.unlink()
    assert f"wrote {target}" in install().stdout and target.read_text() != "# mine\n"


@pytest.mark.parametrize("kind", ["maildrop", "sieve", "imap"])
def test_every_recipe_file_is_written_only_where_nothing_is(tmp_path, kind):
    """The other recipes' files go through the same write (the procmail one above runs the command)."""
    target, text = lib.recipe(kind, "/x/spamnb", str(tmp_path))
    os.makedirs(os.path.dirname(target), exist_ok=True)
    Path(target).write_text("# mine\n")
    assert not lib.write_new(target, text) and Path(target).read_text() == "# mine\n"
    os.unlink(target)
    os.symlink(tmp_path / "nowhere", target)
    assert not lib.write_new(target, text) and not (tmp_path / "nowhere").exists()
    os.unlink(target)
    assert lib.write_new(target, text) and Path(target).read_text() == text
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600


AUDIT = r"""
import os, sys

roots, report = sys.argv[1].split(os.pathsep), sys.argv[2]
found = []
WRITES = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
CHANGES = {"os.rename", "os.remove", "os.rmdir", "os.utime", "os.chmod", "os.chown", "os.truncate", "os.link",
           "os.symlink", "os.mkdir", "os.chflags", "os.setxattr", "os.removexattr", "shutil.move",
           "shutil.rmtree", "shutil.copyfile", "shutil.copymode", "shutil.copystat", "mmap.__new__"}


def under(p):
    try:
        return isinstance(p, (str, bytes, os.PathLike)) and any(
            (os.path.abspath(os.fsdecode(p)) + "/").startswith(r + "/") for r in roots)
    except (TypeError, ValueError):
        return False


def hook(event, args):
    if event == "open" and under(args[0]):
        mode, flags = args[1], args[2] or 0
        if flags & WRITES or (isinstance(mode, str) and set(mode) & set("wax+")):
            found.append(f"open {args[0]} mode={mode} flags={flags:o}")
    elif event in CHANGES and any(under(a) for a in args if not isinstance(a, int)):
        found.append(f"{event} {args}")


sys.addaudithook(hook)
from spamnb.cli import main

try:
    main.main(["setup", "--yes", "--install"], prog_name="spamnb")
except SystemExit as exc:
    code = exc.code
with open(report, "w") as f:
    f.write("".join(f"{line}\n" for line in [code, *found]))
"""


def test_setup_never_opens_mail_for_writing(tmp_path, trained_model_file):
    """Every file open and every change Python makes (its audit events, os.open's flags
    too) while the real `spamnb setup --yes --install` runs on a Maildir++, MH folders
    and mbox files: none opens a message, a folder or a mailbox for writing, or
    changes one. A snapshot of hashes cannot see a read-write open that writes nothing."""
    import mailbox

    home, env = _bare_home(tmp_path)
    maildir_plus(home, time.time())
    # --install makes the folders the recipe files into when they are missing (tested on its
    # own): here they are there, so that any write setup makes in the mail is a defect
    for folder in (".Junk", ".Unsure"):
        for sub in ("cur", "new", "tmp"):
            (home / "Maildir" / folder / sub).mkdir(parents=True, exist_ok=True)
        (home / "Maildir" / folder / "maildirfolder").touch()
    ham, spam = ([strip_from_line(p.read_bytes()) for p in sample(label)] for label in ("ham", "spam"))
    (home / "Mail").mkdir()
    box = mailbox.MH(home / "Mail" / "saved", create=True)
    for raw in ham[:4]:  # the sample holds 73 ham and 30 spam: the Maildir's again, as files of other kinds
        box.add(raw)
    (home / "mail").mkdir()
    for name, msgs in (("kept", ham[4:10]), ("junk", spam[:4])):
        mb = mailbox.mbox(home / "mail" / name)
        for raw in msgs:
            mb.add(raw)
        mb.close()
    old = time.time() - 30 * DAY
    for p in (home / "Mail").rglob("*"):
        os.utime(p, (old, old))
    cache = Path(lib_default_cache(env))  # the default model in its place: no building it (seconds)
    cache.parent.mkdir(parents=True)
    shutil.copyfile(trained_model_file, cache)
    report = tmp_path / "audit"
    mail = [home / "Maildir", home / "Mail", home / "mail"]
    before = {str(m): snapshot(m) for m in mail}
    proc = subprocess.run([sys.executable, "-c", AUDIT, os.pathsep.join(map(str, mail)), str(report)], env=env,
                          cwd=home, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    code, *found = report.read_text().splitlines()
    assert code == "0", proc.stderr
    assert found == [], found
    assert "trained on" in proc.stdout and "~/mail/kept" in proc.stdout and "~/Mail/saved" in proc.stdout, proc.stdout
    assert {str(m): snapshot(m) for m in mail} == before


def lib_default_cache(env):
    from spamnb.storage import locate

    return locate.default_cache_path(env)


# -- unsure mail has a folder of its own -------------------------------------------------------

def unsure_message(model) -> bytes:
    """A sample message ``model`` leaves unsure (the shipped sample has some for the small
    corpus's model), else mail of words it never saw, which is unsure whatever the prior."""
    for path in sorted((SAMPLE_MAILDIR / "cur").iterdir()):
        raw = strip_from_line(path.read_bytes())
        if model.classify(raw).label == "unsure":
            return raw
    raw = b"Subject: zzqxv-never-seen\n\nqqzxv-never-seen wwzxv-never-seen\n"
    assert model.classify(raw).label == "unsure"
    return raw


def setup_in(home: Path, *args) -> subprocess.CompletedProcess:
    """``spamnb setup --yes ARGS`` as this user in ``home`` (with no mail in it: no default
    model needed), checked to succeed."""
    env = {"HOME": str(home), "USER": "nobody-here", "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           **({"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {})}
    proc = subprocess.run([*SPAMNB, "setup", "--yes", *args], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc


def deliver(agent: str, home: Path, raw: bytes):
    """``raw`` delivered by the real ``agent`` through the recipe file setup installed in ``home``."""
    if agent == "procmail":
        cmd, env = ["procmail", "-m", f"HOME={home}", *passed_through(), str(home / ".procmailrc")], {"HOME": str(home)}
    else:  # maildrop takes HOME from the password file: the recipe, as installed, after a HOME line
        rc = home / "mailfilter-test"
        rc.write_text(f'HOME="{home}"\n' + (home / ".mailfilter").read_text())
        rc.chmod(0o600)
        cmd, env = ["maildrop", str(rc)], {"HOME": str(home), **dict(s.split("=", 1) for s in passed_through())}
    got = subprocess.run(cmd, input=raw, env=env, capture_output=True, timeout=120)
    assert got.returncode == 0, got.stderr


@pytest.mark.parametrize("agent", ["procmail", "maildrop"])
@pytest.mark.parametrize("unsure_folder", [True, False], ids=["unsure-folder", "no-unsure-folder"])
def test_the_installed_recipe_files_unsure_mail_into_its_folder(agent, unsure_folder, tmp_path, trained_model,
                                                                trained_model_file, confident):
    """setup --install writes the recipe and makes the folders it files into; the real agent
    then puts spam in .Junk, unsure mail in .Unsure (in INBOX with --no-unsure-folder), ham
    in INBOX, each message once."""
    if shutil.which(agent) is None:
        pytest.skip(f"{agent} is not installed (scripts/test.sh installs it when run as root)")
    home = tmp_path / "home"
    home.mkdir()
    proc = setup_in(home, "--install", "--delivery", agent, *([] if unsure_folder else ["--no-unsure-folder"]))
    md = home / "Maildir"
    assert f"made the folder {md / '.Junk'}" in proc.stdout
    assert (md / ".Unsure").exists() == unsure_folder
    if unsure_folder:
        assert "Unsure mail goes to .Unsure" in proc.stdout
        assert {p.name for p in (md / ".Unsure").iterdir()} == {"cur", "new", "tmp", "maildirfolder"}
    model = home / ".local" / "share" / "spamnb" / "model.joblib"
    model.parent.mkdir(parents=True)
    shutil.copyfile(trained_model_file, model)
    model.chmod(0o600)
    spam, ham, unsure = confident["spam"][0], confident["ham"][0], unsure_message(trained_model)
    for raw in (spam, ham, unsure):
        deliver(agent, home, raw)
    spam_in, unsure_in = delivered(md / ".Junk"), delivered(md / ".Unsure") if unsure_folder else []
    inbox = delivered(md)
    assert len(spam_in) == 1 and b"X-Spam-Flag: YES" in spam_in[0]
    assert [b"tests=SPAMNB_UNSURE " in m for m in (unsure_in if unsure_folder else inbox)].count(True) == 1
    assert len(inbox) == (1 if unsure_folder else 2)  # ham, and unsure mail without its folder
    assert sum(b" tests=SPAMNB_HAM " in m for m in inbox) == 1


def test_the_sieve_recipe_compiles_with_dovecots_sievec(tmp_path):
    """Dovecot's own compiler (Pigeonhole's sievec, with the filter extension the recipe
    needs) accepts the Sieve recipe setup gives, with and without the unsure folder, and
    refuses a broken one (the check can fail)."""
    if shutil.which("sievec") is None:
        pytest.skip("sievec is not installed (Debian's dovecot-sieve)")
    for unsure in (lib.UNSURE_FOLDER, None):
        _, text = lib.recipe("sieve", README_SPAMNB, str(tmp_path), unsure=unsure)
        assert ("fileinto \"Unsure\"" in text) == bool(unsure)
        script = tmp_path / "spamnb.sieve"
        script.write_text(text)
        got = subprocess.run(["sievec", "-P", "sieve_extprograms", "-x", "+vnd.dovecot.filter", str(script),
                              str(tmp_path / "spamnb.svbin")], capture_output=True, text=True, timeout=60)
        assert got.returncode == 0, got.stdout + got.stderr
        script.write_text(text.replace("fileinto \"Junk\"", "fileinto Junk"))
        got = subprocess.run(["sievec", "-P", "sieve_extprograms", "-x", "+vnd.dovecot.filter", str(script),
                              str(tmp_path / "broken.svbin")], capture_output=True, text=True, timeout=60)
        assert got.returncode != 0


def test_install_makes_the_folders_and_subscribes_them(tmp_path):
    """Missing Maildir++ folders are made (cur/, new/, tmp/, maildirfolder) and added to
    Dovecot's and Courier's subscriptions files once; an existing folder and its mail are
    left alone; Sieve uses only an existing ~/Maildir (Dovecot may store mail otherwise)."""
    assert lib.make_folders(str(tmp_path), [".Junk", ".Unsure"], "sieve") == []
    assert not (tmp_path / "Maildir").exists()
    md = tmp_path / "Maildir"
    for sub in ("cur", "new", "tmp"):
        (md / ".Junk" / sub).mkdir(parents=True)
        (md / sub).mkdir(exist_ok=True)
    (md / ".Junk" / "cur" / "1.M1P1.x:2,S").write_bytes(b"Subject: kept\n\nx\n")
    (md / "subscriptions").write_text("Junk")  # no final newline
    (md / "courierimapsubscribed").write_text("INBOX.Junk\n")
    said = lib.make_folders(str(tmp_path), [".Junk", ".Unsure"], "sieve")
    assert said == [f"made the folder {md / '.Unsure'}", f"added Unsure to {md / 'subscriptions'}",
                    f"added INBOX.Unsure to {md / 'courierimapsubscribed'}"]
    assert (md / "subscriptions").read_text() == "Junk\nUnsure\n"
    assert (md / "courierimapsubscribed").read_text() == "INBOX.Junk\nINBOX.Unsure\n"
    assert (md / ".Unsure" / "maildirfolder").is_file() and (md / ".Unsure" / "tmp").is_dir()
    assert [p.name for p in (md / ".Junk" / "cur").iterdir()] == ["1.M1P1.x:2,S"]
    assert lib.make_folders(str(tmp_path), [".Junk", ".Unsure"], "procmail") == []  # all there: nothing
    assert (md / "subscriptions").read_text() == "Junk\nUnsure\n"
    assert lib.make_folders(str(tmp_path), [".Junk", ".Unsure"], "imap") == []
    (md / ".Later").write_text("a file where the folder would go\n")
    assert lib.make_folders(str(tmp_path), [".Later"], "procmail") == [
        f"could not make the folder {md / '.Later'}: Not a directory"]
    assert (md / ".Later").read_text() == "a file where the folder would go\n"


def test_the_imap_unit_files_unsure_mail_unless_turned_off(tmp_path):
    _, text = lib.recipe("imap", "/opt/bin/spamnb", str(tmp_path))
    assert "ExecStart=/opt/bin/spamnb imap filter --watch --unsure-folder Unsure\n" in text
    _, text = lib.recipe("imap", "/opt/bin/spamnb", str(tmp_path), unsure=None)
    assert "ExecStart=/opt/bin/spamnb imap filter --watch\n" in text


# -- arrival time: a copied Maildir is judged by when its mail came ------------------------------

def test_a_copied_maildir_is_judged_by_its_file_names(tmp_path):
    """A Maildir copied without its times (every file's time now): each message's age is
    what its file name says, so setup proposes what it proposed before the copy, and counts
    the messages whose time it took from the name."""
    now = time.time()
    md = maildir_plus(tmp_path, now)
    before = lib.propose(lib.find_mail(str(tmp_path), env={}, now=now), now=now)
    for p in md.rglob("*"):
        if p.is_file():
            os.utime(p, (now, now))
    folders = lib.find_mail(str(tmp_path), env={}, now=now)
    after = lib.propose(folders, now=now)
    assert (len(after.ham), len(after.spam), after.young) == (len(before.ham), len(before.spam), before.young) \
        == (67, 28, 5)
    assert {f.name: f.times_from for f in folders} == {
        "~/Maildir (INBOX)": {lib.FROM_NAME: 47}, "~/Maildir/.Archive": {lib.FROM_NAME: 25},
        "~/Maildir/.Junk": {lib.FROM_NAME: 28}, "~/Maildir/.Trash": {lib.FROM_NAME: 3}}
    # the messages delivered yesterday are still young; a longer --min-age leaves out more
    assert lib.propose(folders, now=now, young_days=10).young == 5 + 5  # and INBOX's of 5 to 9 days
    assert lib.propose(folders, now=now, young_days=0).young == 0


def test_names_without_a_time_fall_back_to_the_date_field(tmp_path):
    """An MH folder (files named 1, 2, ...) copied today: its messages' Date fields say
    2002, so they are ham, not young; only files young by their time have their header
    read. A Date newer than the file, or none, leaves the file's time."""
    import mailbox

    ham = [strip_from_line(p.read_bytes()) for p in sample("ham")[:4]]
    (tmp_path / "Mail").mkdir()
    box = mailbox.MH(tmp_path / "Mail" / "inbox", create=True)
    for raw in ham:
        box.add(raw)
    box.add(b"Subject: no date\n\nhello\n")
    box.add(b"Date: Fri, 01 Jan 2100 00:00:00 +0000\nSubject: from the future\n\nhello\n")
    now = time.time()
    [folder] = lib.find_mail(str(tmp_path), env={}, now=now)
    assert folder.times_from == {lib.FROM_DATE: 4}
    assert lib.propose([folder], now=now).young == 2
    assert all(age > 365 for age in sorted(folder.ages(now))[2:])
    assert lib.name_time("/x/cur/1733312345.M1P2.host,S=10:2,S") == 1733312345.0
    assert [lib.name_time(p) for p in ("/x/1", "/x/cur/12.M1P1.h", "/x/cur/abc.M1", "/x/cur/١٧٣٣٣١٢٣٤٥.M1")] == \
        [None, None, None, None]


def test_setup_says_which_arrival_time_it_used(tmp_path, trained_model_file, monkeypatch):
    """After a copy that lost the times, setup's listing says that the ages come from
    the file names; --min-age changes the days it leaves out."""
    from spamnb.cli import main
    from spamnb.storage import locate
    from click.testing import CliRunner

    now = time.time()
    home = tmp_path / "home"
    md = maildir_plus(home, now)
    for p in md.rglob("*"):
        if p.is_file():
            os.utime(p, (now, now))
    cache = tmp_path / "cache" / "spamnb"  # the small model in the default model's place (no build)
    cache.mkdir(parents=True, mode=0o700)
    shutil.copyfile(trained_model_file, cache / f"default-model-{locate.DEFAULT_RECIPE}.joblib")
    (cache / f"default-model-{locate.DEFAULT_RECIPE}.joblib").chmod(0o600)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    out = CliRunner().invoke(main, ["setup", "--yes", "--min-age", "10"]).output
    assert "~/Maildir (INBOX): ages read 47 from their Maildir file names, as their files are newer" in out
    assert "~/Maildir/.Junk: ages read 28 from their Maildir file names" in out
    assert "-> ham (older than 10 days)" in out
    assert "left out: 10 messages younger than 10 days (perhaps not sorted yet; --min-age changes it)" in out


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_min_age_must_be_a_number_of_days(value, tmp_path):
    """nan and inf pass a float range's bounds; they would learn all the mail or none."""
    proc = subprocess.run([*SPAMNB, "setup", "--yes", "--min-age", value], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "HOME": str(tmp_path)})
    assert proc.returncode == 2
    assert proc.stderr.startswith("spamnb: error: Invalid value for '--min-age'") and proc.stderr.count("\n") == 1
    assert proc.stdout == ""
