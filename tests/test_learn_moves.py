"""``spamnb learn-moves``: learning from the moves a person makes in a local Maildir++,
run as cron or a systemd timer runs it, with real moves between runs (``os.rename``,
as a rename-based client or ``mv`` moves; a new file and the old one removed, as
mutt saves), and its state file planted, damaged or locked."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import ROOT, gold_labels, SAMPLE_MAILDIR, strip_from_line
from spamnb.cli import main
from spamnb.delivery import maildir_moves
from spamnb.mail.identity import message_key
from spamnb.storage.modelfile import load_model
from test_contrib import NO_ANALYZE, complaints, verify
from test_e2e import README_SPAMNB, SPAMNB

HAM, SPAM = 0, 1
SERVICE = ROOT / "contrib" / "systemd" / "user" / "spamnb-learn-moves.service"
TIMER = ROOT / "contrib" / "systemd" / "user" / "spamnb-learn-moves.timer"


def sample(label, n, start=0):
    names = sorted(name for name, lb in gold_labels().items() if lb == label)
    return [strip_from_line((SAMPLE_MAILDIR / "cur" / name).read_bytes()) for name in names[start:start + n]]


class Maildir:
    """A Maildir++ with INBOX, .Junk, .Unsure, .Trash, .Archive and .Other, and the user's model."""

    def __init__(self, root: Path, model: Path):
        self.root, self.model, self.n = root, model, 0
        for folder in ("", ".Junk", ".Unsure", ".Trash", ".Archive", ".Other"):
            for sub in ("cur", "new", "tmp"):
                (root / folder / sub).mkdir(parents=True, exist_ok=True)

    def dir(self, folder):
        return self.root if folder == "INBOX" else self.root / folder

    def deliver(self, folder, raw, sub="new", info="") -> Path:
        self.n += 1
        path = self.dir(folder) / sub / f"17000{self.n:05d}.M{self.n}P1.host{info}"
        path.write_bytes(raw)
        return path

    def where(self, raw):
        key = message_key(raw)
        return sorted(p for p in self.root.rglob("*") if p.is_file() and p.parent.name in ("cur", "new")
                      and message_key(p.read_bytes()) == key)

    def rename(self, raw, folder, info=":2,S"):
        """Move by rename into ``folder``/cur, setting a flag (the unique name stays)."""
        (src,) = self.where(raw)
        dst = self.dir(folder) / "cur" / (maildir_moves.unique_name(src.name) + info)
        os.rename(src, dst)
        return dst

    def save_as_new(self, raw, folder):
        """Move as mutt saves: a new file with a new unique name, then the old one removed."""
        (src,) = self.where(raw)
        dst = self.deliver(folder, src.read_bytes(), sub="cur", info=":2,S")
        src.unlink()
        return dst

    def run(self, *args):
        res = CliRunner().invoke(main, ["learn-moves", str(self.root), "--model", str(self.model), *args])
        return res.exit_code, res.stderr

    def counts(self):
        return tuple(int(n) for n in load_model(self.model).messages)

    def known(self, raw):
        return load_model(self.model).known(message_key(raw), raw)

    @property
    def state(self) -> Path:
        return Path(maildir_moves.state_path(self.model))

    def files(self):
        """Every file of the Maildir and its bytes: what a run must never change."""
        return {str(p.relative_to(self.root)): p.read_bytes() for p in sorted(self.root.rglob("*")) if p.is_file()}


@pytest.fixture
def box(tmp_path, model_file):
    return Maildir(tmp_path / "Maildir", model_file)


def test_first_run_records_and_learns_nothing(box):
    """What is in Junk at the first run is the person's past sorting (setup learns it): it
    is recorded, not learned; the state is the user's alone (0600) beside the model."""
    ham, spam = sample("ham", 2), sample("spam", 2)
    for raw in ham:
        box.deliver("INBOX", raw)
    for raw in spam:
        box.deliver(".Junk", raw)
    counts, files = box.counts(), box.files()
    code, err = box.run()
    assert code == 0, err
    assert "first run" in err and "recorded 4 messages in 6 folders" in err
    assert box.counts() == counts and box.files() == files
    assert stat.S_IMODE(box.state.stat().st_mode) == 0o600 and box.state.parent == box.model.parent
    code, err = box.run()
    assert code == 0 and "learned 0 as spam and 0 as ham" in err, err


def test_moves_by_rename_are_learned_once_each(box):
    """Into Junk: spam. Out to INBOX: ham (moved from spam). Back: spam. Junk to Trash,
    Archive to Other, a copy into Junk (new name, or a hard link with the same one):
    nothing. Each run after a move learns it once; the next finds nothing new."""
    a, b, c = sample("ham", 3)
    box.deliver("INBOX", a)
    box.deliver("INBOX", b)
    box.deliver(".Archive", c, sub="cur", info=":2,S")
    assert box.run()[0] == 0
    ham0, spam0 = box.counts()

    box.rename(a, ".Junk")
    code, err = box.run()
    assert code == 0 and "moved from INBOX to .Junk: learning it as spam" in err, err
    assert box.known(a) == SPAM and box.counts() == (ham0, spam0 + 1)
    assert box.run() == (0, f"learned 0 as spam and 0 as ham from your moves in {box.root}; already learned: 0\n")

    box.rename(a, "INBOX", info=":2,RS")  # flags change too
    code, err = box.run()
    assert code == 0 and "moved from .Junk to INBOX: learning it as ham" in err, err
    assert box.known(a) == HAM and box.counts() == (ham0 + 1, spam0)

    box.rename(a, ".Junk")
    assert box.run()[0] == 0
    assert box.known(a) == SPAM and box.counts() == (ham0, spam0 + 1)

    box.rename(a, ".Trash")
    box.rename(c, ".Other")
    (src,) = box.where(b)
    shutil.copyfile(src, box.dir(".Junk") / "cur" / "1800000000.copy.host:2,S")
    os.link(src, box.dir(".Junk") / "new" / src.name)  # a copy keeping the unique name
    code, err = box.run()
    assert code == 0 and "learned 0 as spam and 0 as ham" in err, err
    assert box.known(a) == SPAM and box.known(b) is None and box.known(c) is None
    assert box.counts() == (ham0, spam0 + 1)


def test_moves_as_mutt_saves_and_mail_never_seen_before(box):
    """A new file in Junk and the old one gone (mutt's save) is a move, recognised by the
    message's identity. A message no run saw before: in Junk with spamnb's spam verdict it
    was filed there at delivery (nothing); without one, the person put it there (spam)."""
    a, b = sample("ham", 2)
    s = sample("spam", 2)
    box.deliver("INBOX", a)
    assert box.run()[0] == 0
    ham0, spam0 = box.counts()

    box.save_as_new(a, ".Junk")
    filtered = CliRunner().invoke(main, ["filter", "--model", str(box.model), "--spam-cutoff", "0.0001",
                                         "--ham-cutoff", "0.00005"], input=s[0]).stdout_bytes
    assert b"X-Spam-Flag: YES" in filtered
    box.deliver(".Junk", filtered)  # procmail's recipe filed it: spamnb's own verdict
    box.deliver(".Junk", b)  # delivered to INBOX and moved by the person between two runs
    code, err = box.run()
    assert code == 0, err
    assert "moved from INBOX to .Junk: learning it as spam" in err
    assert "new in .Junk without spamnb's spam verdict: put there by you: learning it as spam" in err
    assert box.known(a) == SPAM and box.known(b) == SPAM and box.known(filtered) is None
    assert box.counts() == (ham0, spam0 + 2)

    box.save_as_new(a, ".Archive")  # out of Junk into kept mail: ham
    box.deliver("INBOX", s[1])  # new mail in INBOX: not a move, whatever it is
    assert box.run()[0] == 0
    assert box.known(a) == HAM and box.known(s[1]) is None
    assert box.counts() == (ham0 + 1, spam0 + 1)


def test_a_message_delivered_twice_and_moved_twice_is_learned_once(box):
    a = sample("ham", 1)[0]
    first, second = box.deliver("INBOX", a), box.deliver("INBOX", a)
    assert box.run()[0] == 0
    ham0, spam0 = box.counts()
    for path in (first, second):
        os.rename(path, box.dir(".Junk") / "cur" / (path.name + ":2,S"))
    code, err = box.run()
    assert code == 0 and "learned 1 as spam and 0 as ham" in err, err
    assert box.counts() == (ham0, spam0 + 1)


def test_moves_learned_already_are_said_apart_and_mark_nothing(box):
    """The same moves learned twice (their state put back, as when another way, IMAP or a
    Sieve script, learned them first): the second run says they were learned already,
    changes no count, and leaves their rows in the history as they were."""
    from spamnb.storage import history

    a, b = sample("ham", 2)
    box.deliver("INBOX", a)
    box.deliver("INBOX", b)
    assert box.run()[0] == 0
    box.rename(a, ".Junk")
    box.rename(b, ".Junk")
    seen = box.state.read_bytes()
    code, err = box.run()
    assert code == 0 and err.endswith(f"learned 2 as spam and 0 as ham from your moves in {box.root}; "
                                      f"already learned: 0\n"), err
    counts = box.counts()
    where = str(box.model) + ".history.sqlite"
    for raw in (a, b):  # a newer row of each, delivered again since
        history.record_now(where, raw, "ham", -3.0, 0.05, via="filter", log=print)
    box.state.write_bytes(seen)
    code, err = box.run()
    assert code == 0 and err.endswith(f"learned 0 as spam and 0 as ham from your moves in {box.root}; "
                                      f"already learned: 2\n"), err
    assert box.counts() == counts
    db = history.open_db(where, create=False)
    try:
        assert db.execute("SELECT corrected FROM verdicts").fetchall() == [(None,), (None,)]
    finally:
        db.close()


def test_moves_out_of_the_unsure_folder(box):
    """Unsure mail has a folder of its own: out of it into kept mail is ham, into Junk spam;
    out of Junk into it, nothing (the person has not decided)."""
    a, b = sample("ham", 2)
    s = sample("spam", 1)[0]
    box.deliver(".Unsure", a)
    box.deliver(".Unsure", s)
    box.deliver(".Junk", b)
    assert box.run()[0] == 0
    ham0, spam0 = box.counts()
    box.rename(a, "INBOX")
    box.save_as_new(s, ".Junk")
    box.rename(b, ".Unsure")
    code, err = box.run()
    assert code == 0 and "moved from .Unsure to INBOX: learning it as ham" in err, err
    assert box.known(a) == HAM and box.known(s) == SPAM and box.known(b) is None
    assert box.counts() == (ham0 + 1, spam0 + 1)


def test_out_of_junk_into_an_unsure_folder_of_another_name_teaches_nothing(box):
    """--unsure-folder names the folder whatever its name (here .Other, which setup's roles
    take for kept mail): out of Junk into it is still no decision, out of it into INBOX ham."""
    a, b = sample("ham", 2)
    box.deliver(".Junk", a)
    box.deliver(".Other", b)
    assert box.run("--unsure-folder", ".Other")[0] == 0
    counts = box.counts()
    box.rename(a, ".Other")
    code, err = box.run("--unsure-folder", ".Other")
    assert code == 0 and "learned 0 as spam and 0 as ham" in err, err
    assert box.known(a) is None and box.counts() == counts
    box.rename(b, "INBOX")
    code, err = box.run("--unsure-folder", ".Other")
    assert code == 0 and "moved from .Other to INBOX: learning it as ham" in err, err
    assert box.known(b) == HAM


def test_dry_run_learns_and_records_nothing(box):
    a = sample("ham", 1)[0]
    box.deliver("INBOX", a)
    assert box.run()[0] == 0
    state = box.state.read_bytes()
    box.rename(a, ".Junk")
    code, err = box.run("--dry-run")
    assert code == 0 and "learning it as spam" in err and "would learn 1 as spam and 0 as ham" in err
    assert box.known(a) is None and box.state.read_bytes() == state
    assert box.run()[0] == 0 and box.known(a) == SPAM


def with_subject(raw: bytes, subject: bytes) -> bytes:
    """``raw`` with its Subject field replaced by ``subject`` (bytes as a message holds them)."""
    head, sep, body = raw.partition(b"\n\n")
    lines = [line for line in head.split(b"\n") if not line.lower().startswith(b"subject:")]
    return b"\n".join([*lines, b"Subject: " + subject]) + sep + body


def test_moves_name_raw_utf8_and_encoded_subjects_as_written(box):
    """A raw UTF-8 Subject (as about one recent spam in ten has) and an RFC 2047 one are named as
    written in each line, the dry run's too: never escaped, never "fÃ¼r"."""
    a, b = sample("ham", 2)
    a = with_subject(a, "Prognose für Sie".encode())
    b = with_subject(b, b"=?utf-8?q?Gr=C3=BC=C3=9Fe_aus_K=C3=B6ln?=")
    box.deliver("INBOX", a)
    box.deliver("INBOX", b)
    assert box.run()[0] == 0
    box.rename(a, ".Junk")
    box.rename(b, ".Junk")
    for args in (("--dry-run",), ()):
        code, err = box.run(*args)
        assert code == 0, err
        assert "moved from INBOX to .Junk: learning it as spam: Prognose für Sie\n" in err, err
        assert "moved from INBOX to .Junk: learning it as spam: Grüße aus Köln\n" in err, err
        assert "\\u00" not in err and "Ã" not in err
    assert box.known(a) == SPAM and box.known(b) == SPAM


def _moved_after_first_run(box):
    a = sample("ham", 1)[0]
    box.deliver("INBOX", a)
    assert box.run()[0] == 0
    box.rename(a, ".Junk")
    return a


@pytest.mark.parametrize("how", ["world-writable", "group-writable", "another user's"])
def test_a_planted_state_is_refused_and_teaches_nothing(box, how):
    """A state another user could have written says what to learn: refused with one line,
    nothing learned, the state and the mail left as they are."""
    a = _moved_after_first_run(box)
    if how == "another user's":
        if os.geteuid() != 0:
            pytest.skip("giving a file to another user needs root")
        os.chown(box.state, 65534, 65534)
    else:
        box.state.chmod(0o666 if how == "world-writable" else 0o620)
    state, files, counts = box.state.read_bytes(), box.files(), box.counts()
    code, err = box.run()
    assert code == 1 and err.startswith("spamnb: error: refusing to load moves state") and err.count("\n") == 1
    assert "learned as spam or ham" in err and "Traceback" not in err
    assert box.state.read_bytes() == state and box.files() == files and box.counts() == counts
    assert box.known(a) is None


@pytest.mark.parametrize("content", [b"{not json", b"", b"\xff\xfe", b"[]", b'{"version": 1}',
                                     b'{"version": 1, "maildirs": {"/x": {"a": ["INBOX", null]}}}',
                                     b'{"version": 99, "maildirs": {}}'])
def test_a_damaged_state_is_refused_and_teaches_nothing(box, content):
    a = _moved_after_first_run(box)
    box.state.write_bytes(content)
    files, counts = box.files(), box.counts()
    code, err = box.run()
    assert code == 1 and err.startswith("spamnb: error: ") and err.count("\n") == 1, err
    assert "move it away to start afresh" in err and "Traceback" not in err
    assert box.state.read_bytes() == content and box.files() == files and box.counts() == counts
    box.state.unlink()  # as the message says: the next run starts afresh, learning nothing
    code, err = box.run()
    assert code == 0 and "first run" in err and box.known(a) is None


def test_one_run_at_a_time(box):
    """A run while another holds the lock (a slow timer run, and cron's next) says so and
    does nothing; once the lock is free the move is learned."""
    from spamnb.storage.store import try_lock

    a = _moved_after_first_run(box)
    state = box.state.read_bytes()
    fd = try_lock(str(box.state) + ".lock")
    try:
        code, err = box.run()
    finally:
        os.close(fd)
    assert code == 1 and "another spamnb learn-moves is running for this model" in err
    assert box.known(a) is None and box.state.read_bytes() == state
    assert box.run()[0] == 0 and box.known(a) == SPAM


def test_a_failed_learn_is_redone_by_the_next_run(box):
    """The model's journal cannot be written (a folder in its place: root cannot write it
    either): the run fails with one line and records nothing, so the next run finds the
    move and learns it."""
    from spamnb.storage.journal import journal_path

    a = _moved_after_first_run(box)
    state = box.state.read_bytes()
    blocked = Path(journal_path(box.model))
    assert not blocked.exists()
    blocked.mkdir()
    try:
        code, err = box.run()
    finally:
        blocked.rmdir()
    assert code == 1 and err.splitlines()[-1].startswith("spamnb: error: journal") and "Traceback" not in err, err
    assert box.state.read_bytes() == state and box.known(a) is None
    assert box.run()[0] == 0 and box.known(a) == SPAM


_PEAK = """
import resource, subprocess, sys
proc = subprocess.run(sys.argv[1:], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, timeout=300)
print(proc.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def _peak(*args) -> tuple:
    """``(exit status, stderr, peak RSS in MB)`` of ``spamnb ARGS``, run from a small process
    of its own (a child's peak counts the memory of the process that forked it)."""
    proc = subprocess.run([sys.executable, "-c", _PEAK, *SPAMNB, *map(str, args)], capture_output=True,
                          text=True, timeout=330)
    code, kb = proc.stdout.split()
    return int(code), proc.stderr, int(kb) / 1024


def test_large_mail_moved_into_junk_is_skipped_in_bounded_memory(box):
    """What an attacker sends: 8 messages of 32 MB, in Junk between two runs (as a
    person who moves them there, or a recipe, leaves them). The run stays within a few
    MB of a run that learns one small move (it reads none of them: each is over what
    the tokenizer reads), says one line for each, records them as seen, and learns the
    small move beside them; the next run says nothing of them."""
    a, b = sample("ham", 2)
    box.deliver("INBOX", a)
    box.deliver("INBOX", b)
    assert box.run()[0] == 0
    box.rename(a, ".Junk")
    code, err, baseline = _peak("learn-moves", box.root, "--model", box.model)
    assert code == 0 and "learned 1 as spam" in err, err
    box.rename(b, ".Junk")
    big = []
    for i in range(8):
        path = box.deliver(".Junk", f"From: x{i}@example.com\nSubject: big {i}\n\n".encode())
        os.truncate(path, 32 * 2**20)  # sparse: 32 MB to read, no disk
        big.append(path)
    code, err, peak = _peak("learn-moves", "-q", box.root, "--model", box.model)
    assert code == 0 and "Traceback" not in err, err
    assert peak < baseline + 48, f"peak RSS {peak:.0f} MB, a run that learns one small move {baseline:.0f} MB"
    lines = err.splitlines()
    assert len(lines) == 8 and all("not learned" in line and "over the 4000000" in line for line in lines), err
    assert sorted(line.split(": ")[-1].split(" holds")[0] for line in lines) == sorted(map(str, big))
    assert box.known(b) == SPAM
    assert box.run() == (0, f"learned 0 as spam and 0 as ham from your moves in {box.root}; already learned: 0\n")


_DIES = r"""
import os, signal, sys
from spamnb.delivery import maildir_moves, pipeline
from spamnb.mail.identity import message_key

how, keys = sys.argv[1], sys.argv[2]
maildir_moves.BATCH_MESSAGES = 2
learn, calls = pipeline.learn, []

def dying(store, items, **kw):
    calls.append(len(items))
    past = sum(calls) > 4  # this learn takes the run past its fourth message
    if past and how == "out of memory":
        raise MemoryError
    if past and how == "killed before a learn":
        os.kill(os.getpid(), signal.SIGKILL)
    done = learn(store, items, **kw)
    with open(keys, "a") as f:
        f.writelines(message_key(raw).hex() + "\n" for raw, _ in items)
    if past:
        os.kill(os.getpid(), signal.SIGKILL)
    return done

pipeline.learn = dying
from spamnb.cli import main
main(sys.argv[3:])
"""


@pytest.mark.parametrize("how", ["killed before a learn", "killed after a learn", "out of memory"])
def test_a_run_that_dies_midway_is_resumed_by_the_next(box, tmp_path, monkeypatch, how):
    """Seven moves into Junk, learned two at a time; the run dies at the batch that takes it
    past four messages (a SIGKILL before or after the model learned it, or a MemoryError:
    one line, status 1).
    What the first two batches learned is recorded: the next run learns the rest (and,
    when the kill came between a learn and its record, that batch again, which changes
    nothing), and every message is in the model once."""
    from spamnb.delivery import pipeline

    moved = sample("ham", 7)
    for raw in moved:
        box.deliver("INBOX", raw)
    assert box.run()[0] == 0
    ham0, spam0 = box.counts()
    for raw in moved:
        box.rename(raw, ".Junk")
    keys = tmp_path / "learned"
    proc = subprocess.run([sys.executable, "-c", _DIES, how, str(keys), "learn-moves", "-q", str(box.root),
                           "--model", str(box.model)], capture_output=True, text=True, timeout=300)
    if how == "out of memory":
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stderr.startswith("spamnb: error: out of memory in a run over ") and "recorded" in proc.stderr
    else:
        assert proc.returncode == -9, proc.stderr
    first = keys.read_text().split() if keys.exists() else []
    assert len(first) == (6 if how == "killed after a learn" else 4)
    assert all(box.known(raw) == SPAM for raw in moved if message_key(raw).hex() in first)

    learn, again = pipeline.learn, []
    monkeypatch.setattr(pipeline, "learn", lambda store, items, **kw: again.extend(
        message_key(raw).hex() for raw, _ in items) or learn(store, items, **kw))
    code, err = box.run()
    assert code == 0 and "Traceback" not in err, err
    assert sorted(set(first[:4]) | set(again)) == sorted(message_key(raw).hex() for raw in moved)
    assert not set(first[:4]) & set(again) and len(again) == 7 - 4
    assert all(box.known(raw) == SPAM for raw in moved) and box.counts() == (ham0, spam0 + 7)
    assert box.run() == (0, f"learned 0 as spam and 0 as ham from your moves in {box.root}; already learned: 0\n")


def test_not_a_maildir(tmp_path, model_file):
    code = CliRunner().invoke(main, ["learn-moves", str(tmp_path), "--model", str(model_file)])
    assert code.exit_code == 1 and "is not a Maildir" in code.stderr and "Traceback" not in code.stderr


def installed(unit: Path) -> str:
    text = unit.read_text()
    return text.replace(README_SPAMNB, shlex.join(SPAMNB))


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason=NO_ANALYZE)
def test_the_timer_and_its_service_pass_systemd_analyze_verify(tmp_path):
    for unit in (SERVICE, TIMER):
        (tmp_path / unit.name).write_text(installed(unit))
    for unit in (SERVICE, TIMER):
        proc = verify("user", tmp_path / unit.name, tmp_path)
        assert proc.returncode == 0 and not complaints(proc, unit.name), proc.stdout + proc.stderr


def test_the_service_command_runs(tmp_path, box):
    """The service's ExecStart, %h expanded, is a run over ~/Maildir."""
    lines = dict(line.split("=", 1) for line in installed(SERVICE).splitlines()
                 if "=" in line and not line.startswith("#"))
    argv = shlex.split(lines["ExecStart"].replace("%h", str(box.root.parent)))
    res = subprocess.run(argv + ["--model", str(box.model)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "first run over" in res.stderr, res.stderr
    assert json.loads(box.state.read_text())["maildirs"]


def test_the_units_setup_writes_are_contribs_own():
    """What setup --install writes is contrib/systemd/user's pair, comments aside, with this
    spamnb; another junk folder is named in the command."""
    written = maildir_moves.units("/opt/bin/spamnb")
    for unit in (SERVICE, TIMER):
        lines = [line for line in unit.read_text().splitlines() if line and not line.startswith("#")]
        assert [line for line in written[unit.name].splitlines() if line] == [
            line.replace(README_SPAMNB, "/opt/bin/spamnb") for line in lines]
    assert "ExecStart=/opt/bin/spamnb learn-moves --junk .Spam %h/Maildir\n" in \
        maildir_moves.units("/opt/bin/spamnb", ".Spam")[SERVICE.name]


def _setup(home, *args):
    env = {"HOME": str(home), "USER": "nobody-here", "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           **({"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {})}
    proc = subprocess.run([*SPAMNB, "setup", "--yes", *args], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("kind", ["procmail", "sieve"])
def test_setup_says_how_corrections_are_learned_and_install_writes_the_timer(tmp_path, kind):
    """With each local delivery setup says how a correction is made and learned; --install
    writes the timer and its service (never over the user's own); with Sieve it says what
    the administrator's IMAPSieve would do instead."""
    folder = tmp_path / ".config" / "systemd" / "user"
    out = _setup(tmp_path, "--delivery", kind)
    assert "move a message the filter got wrong into .Junk" in out and "learn-moves" in out
    assert not folder.exists()
    assert ("spamnb setup --imapsieve /etc/dovecot/sieve-spamnb" in out) == (kind == "sieve")
    folder.mkdir(parents=True)
    (folder / TIMER.name).write_text("# mine\n")
    out = _setup(tmp_path, "--delivery", kind, "--install")
    assert f"wrote {folder / SERVICE.name}" in out and f"{folder / TIMER.name} exists" in out
    assert (folder / TIMER.name).read_text() == "# mine\n"
    assert (folder / SERVICE.name).read_text() == maildir_moves.units(SPAMNB[0])[SERVICE.name]
    assert stat.S_IMODE((folder / SERVICE.name).stat().st_mode) == 0o600


def test_moves_made_over_imap_in_a_dovecot_maildir(make_dovecot, model_file):
    """A user of a Dovecot server whose Maildir is on the host they log into learns their
    moves without the administrator: Dovecot 2.3 moves a message's file under the same
    name (a hard link, then the old one removed), and a move into Trash teaches nothing."""
    server = make_dovecot()
    a, b = sample("ham", 2)
    for raw in (a, b):
        server.append("INBOX", raw)
    box = Maildir.__new__(Maildir)
    box.root, box.model, box.n = server.maildir, model_file, 0
    assert box.run()[0] == 0
    ham0, spam0 = box.counts()

    def move(raw, src, dst):
        key = message_key(raw)
        (uid,) = [u for u, got in server.fetch_all(src).items() if message_key(got) == key]
        server.move(src, uid, dst)

    move(a, "INBOX", "Junk")
    code, err = box.run()
    assert code == 0 and "moved from INBOX to .Junk: learning it as spam" in err, err
    assert box.known(a) == SPAM and box.counts() == (ham0, spam0 + 1)
    move(a, "Junk", "INBOX")
    server.create_folder("Trash")
    move(b, "INBOX", "Trash")
    code, err = box.run()
    assert code == 0 and "learned 0 as spam and 1 as ham" in err, err
    assert box.known(a) == HAM and box.known(b) is None and box.counts() == (ham0 + 1, spam0)
