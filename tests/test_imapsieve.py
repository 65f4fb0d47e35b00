"""Learning from moves on Dovecot: the IMAPSieve scripts and settings spamnb ships
(``spamnb.delivery.imapsieve``, contrib/dovecot/) in a real Dovecot with Pigeonhole.

A private Dovecot per test (``tests/dovecot.py`` with ``imapsieve=``: its config
is the shipped settings file, its scripts the shipped ones, compiled with
``sievec``); a mail client moves and copies messages over IMAP (imapclient), and
after each step the user's own model is read: what it learned, and how many
messages of each class it holds. Skipped with the reason when Dovecot or
Pigeonhole (dovecot-sieve) is missing.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import ROOT, gold_labels, SAMPLE_MAILDIR, strip_from_line
from spamnb.delivery import imapsieve, learnqueue
from spamnb.mail.identity import message_key
from spamnb.storage.modelfile import load_model
from test_hardening import forked_as, mallory  # noqa: F401 - the other local user, a fixture

CONTRIB = ROOT / "contrib" / "dovecot"
HAM, SPAM = 0, 1  # the classes as the model's registry and counts hold them


def sample(label, n, start=0):
    names = sorted(name for name, lb in gold_labels().items() if lb == label)
    return [strip_from_line((SAMPLE_MAILDIR / "cur" / name).read_bytes()) for name in names[start:start + n]]


def _mail_user_runs(path) -> bool:
    """Whether Dovecot's mail user (nobody when the tests run as root) can run ``path``
    and its interpreter (not when they sit under root's home, e.g. a pyenv)."""
    if os.geteuid() != 0:
        return True
    import dovecot as harness

    paths = [os.path.realpath(path), os.path.realpath(sys.executable)]
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(harness.NOBODY)
            os.setuid(harness.NOBODY)
            code = 0 if all(os.access(p, os.X_OK) for p in paths) else 1
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def spamnb_for_mail_user(folder: Path) -> str:
    """The spamnb command the pipe program runs: this tree's, or, when the mail user cannot
    run this interpreter (root's pyenv), a launcher running the system's python3 of the
    same version on this tree and its site-packages (skipped when there is none). Either
    way through a wrapper that writes each command line to ``folder/calls``."""
    calls = folder / "calls"
    calls.touch()
    calls.chmod(0o666)
    wrapper = folder / "spamnb-calls"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec {_spamnb(folder)} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def _spamnb(folder):
    script = Path(sys.executable).parent / "spamnb"
    if script.exists() and _mail_user_runs(script):
        return str(script)
    system = shutil.which("python3", path="/usr/bin:/bin")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    if system is None or subprocess.run([system, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                        capture_output=True, text=True).stdout.strip() != version:
        pytest.skip(f"the mail user cannot run {sys.executable}, and there is no /usr/bin/python3 {version}")
    import click

    site = str(Path(click.__file__).resolve().parent.parent)
    launcher = folder / "spamnb"
    launcher.write_text(f"#!/bin/sh\nPYTHONPATH='{ROOT}:{site}' exec {system} -c "
                        "'import sys; from spamnb._entry import main; sys.argv[0] = \"spamnb\"; sys.exit(main())' "
                        '"$@"\n')
    launcher.chmod(0o755)
    return str(launcher)


def mail_user_venv(parent: Path) -> Path:
    """A venv of the system's python3 (of this version) in ``parent``, with this tree and
    its dependencies on its path (a .pth file) and a ``spamnb`` script: what an admin would
    install under /opt, where this interpreter (root's pyenv, a .venv) may be where no other
    user can go. Skipped when there is no /usr/bin/python3 of this version, or when other
    users cannot reach this tree."""
    from spamnb.delivery import mailuser

    system = shutil.which("python3", path="/usr/bin:/bin")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    if system is None or subprocess.run([system, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                        capture_output=True, text=True).stdout.strip() != version:
        pytest.skip(f"no /usr/bin/python3 {version} to make a venv every user can run")
    problem = mailuser.unreachable(ROOT / "spamnb" / "__init__.py", mailuser.READ)
    if problem:
        pytest.skip(f"other users cannot reach this tree: {problem}")
    import click

    venv = parent / "venv"
    subprocess.run([system, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True, timeout=120)
    deps = Path(click.__file__).resolve().parent.parent
    (venv / "lib" / f"python{version}" / "site-packages" / "spamnb-tree.pth").write_text(f"{ROOT}\n{deps}\n")
    script = venv / "bin" / "spamnb"
    script.write_text(f"#!{venv}/bin/python\nfrom spamnb._entry import main\nmain()\n")
    script.chmod(0o755)
    return venv


@pytest.fixture(scope="module")
def runnable():
    """A venv every user can run spamnb from (:func:`mail_user_venv`), in an admin's folder."""
    folder = admin_folder()
    try:
        yield mail_user_venv(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class Mailbox:
    """A Dovecot with the shipped IMAPSieve files, its user's own model, and a look at both."""

    def __init__(self, server, model: Path, calls: Path, spamnb=None):
        self.server, self.model, self.calls, self.spamnb = server, model, calls, spamnb

    def counts(self):
        return tuple(int(n) for n in load_model(self.model, allow_insecure=True).messages)

    def known(self, raw):
        return load_model(self.model, allow_insecure=True).known(message_key(raw), raw)

    @property
    def state(self) -> Path:
        """The mail user's ~/.local/state/spamnb: the learn queue and the learn log."""
        return self.server.home / ".local" / "state" / "spamnb"

    def queued(self):
        """The names of the learns waiting in the queue, oldest first."""
        queue = self.state / "learn-queue"
        return sorted(p.name for p in queue.iterdir() if not p.name.startswith(".")) if queue.exists() else []

    def learn_log(self):
        """The lines of the user's learn log (no syslog needed)."""
        log = self.state / "learn.log"
        return log.read_text().splitlines() if log.exists() else []

    def log(self):
        """What the pipe program wrote to Dovecot's log (its failures)."""
        return [line for line in self.server.log.read_text(errors="replace").splitlines() if "spamnb-learn:" in line]

    def learns(self):
        """The labels of the `spamnb learn` commands the pipe program ran, in order
        (``learn-queue`` for a run that learned the queue)."""
        return [line.split()[1] if line.startswith("learn ") else line.split()[0]
                for line in self.calls.read_text().splitlines()]

    def uid_of(self, folder, raw):
        key = message_key(raw)
        found = [uid for uid, got in self.server.fetch_all(folder).items() if message_key(got) == key]
        assert len(found) == 1, (folder, found)
        return found[0]

    def move(self, raw, src, dst):
        self.server.move(src, self.uid_of(src, raw), dst)

    def copy(self, raw, src, dst):
        self.server.copy(src, self.uid_of(src, raw), dst)


def admin_folder() -> Path:
    """A folder of the admin's that the mail user can read (pytest's tmp_path is 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="spamnb-sieve-"))
    folder.chmod(0o755)
    return folder


def serve_mailbox(make_dovecot, scripts, trained_model_file, calls=None, spamnb=None, **options) -> Mailbox:
    """A Dovecot running the IMAPSieve files in ``scripts``, its user with a model of their
    own (owned by the mail user) and the folders the moves go between."""
    import dovecot as harness

    server = make_dovecot(imapsieve=scripts, **options)
    model = server.home / ".local" / "share" / "spamnb" / "model.joblib"
    model.parent.mkdir(parents=True, mode=0o700)
    shutil.copyfile(trained_model_file, model)
    model.chmod(0o600)
    if server.root:
        for p in (model, model.parent, model.parent.parent, model.parent.parent.parent):
            os.chown(p, harness.NOBODY, harness.NOBODY)
    for name in ("Archive", "Other", "Trash", "Unsure"):
        server.create_folder(name)
    return Mailbox(server, model, calls, spamnb)


def needs_imapsieve():
    import dovecot as harness

    if harness.imapsieve_missing():
        pytest.skip(harness.imapsieve_missing())
    pytest.importorskip("imapclient", reason="imapclient is not installed (it is in the test and imap extras)")


@pytest.fixture
def mailbox(make_dovecot, trained_model_file, request):
    """A user's Dovecot; parametrized indirectly, the options of the server (``home_in_userdb``)."""
    needs_imapsieve()
    folder = admin_folder()
    try:
        scripts = folder / "sieve"
        spamnb = spamnb_for_mail_user(folder)
        imapsieve.install(scripts, spamnb)
        (folder / "calls").write_text("")  # setup ran `spamnb --version` as the mail user: not a learn
        yield serve_mailbox(make_dovecot, scripts, trained_model_file, folder / "calls", spamnb,
                            **getattr(request, "param", {}))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_each_move_into_and_out_of_junk_is_learned_once(mailbox):
    """Into Junk: spam; out of Junk to INBOX: ham (forgotten as spam); back: spam again;
    Junk to Trash: nothing; between two other folders: nothing; a copy into Junk: spam,
    once however often (IMAPSieve calls a MOVE a COPY: the scripts cannot tell them apart)."""
    a, b = sample("ham", 2)
    c = sample("ham", 1, start=5)[0]
    mailbox.server.append("INBOX", a)
    mailbox.server.append("INBOX", b)
    mailbox.server.append("Archive", c)
    ham0, spam0 = mailbox.counts()
    assert mailbox.known(a) is None

    mailbox.move(a, "INBOX", "Junk")
    assert mailbox.known(a) == SPAM and mailbox.counts() == (ham0, spam0 + 1)

    mailbox.move(a, "Junk", "INBOX")
    assert mailbox.known(a) == HAM and mailbox.counts() == (ham0 + 1, spam0)

    mailbox.move(a, "INBOX", "Junk")
    assert mailbox.known(a) == SPAM and mailbox.counts() == (ham0, spam0 + 1)

    mailbox.move(a, "Junk", "Trash")  # deleting spam is no verdict: still spam, once
    assert mailbox.known(a) == SPAM and mailbox.counts() == (ham0, spam0 + 1)
    assert mailbox.server.uids("Junk") == [] and len(mailbox.server.uids("Trash")) == 1

    mailbox.move(c, "Archive", "Other")
    assert mailbox.known(c) is None and mailbox.counts() == (ham0, spam0 + 1)

    mailbox.copy(b, "INBOX", "Junk")
    assert mailbox.known(b) == SPAM and mailbox.counts() == (ham0, spam0 + 2)
    mailbox.copy(b, "INBOX", "Junk")  # a second copy: known already
    assert mailbox.counts() == (ham0, spam0 + 2)
    assert len(mailbox.server.uids("Junk")) == 2 and len(mailbox.server.uids("INBOX")) == 1

    # one learn per event (3 moves, 2 copies); the moves to Trash and to Other ran nothing
    assert mailbox.learns() == ["--spam", "--ham", "--spam", "--spam", "--spam"]
    assert mailbox.log() == []  # nothing failed


def test_moves_out_of_the_unsure_folder(mailbox):
    """Out of Unsure into INBOX: ham. Out of Unsure into Junk: spam, and only spam (the Junk
    rule and the Unsure rule both match; the ham script stops for Junk). Junk to Unsure:
    nothing (the person has not decided)."""
    a, b, c = sample("ham", 3)
    mailbox.server.append("Unsure", a)
    mailbox.server.append("Unsure", b)
    mailbox.server.append("Junk", c)
    ham0, spam0 = mailbox.counts()
    mailbox.move(a, "Unsure", "INBOX")
    assert mailbox.known(a) == HAM and mailbox.counts() == (ham0 + 1, spam0)
    mailbox.move(b, "Unsure", "Junk")
    assert mailbox.known(b) == SPAM and mailbox.counts() == (ham0 + 1, spam0 + 1)
    mailbox.move(c, "Junk", "Unsure")
    assert mailbox.known(c) is None and mailbox.counts() == (ham0 + 1, spam0 + 1)
    assert mailbox.learns() == ["--ham", "--spam"]
    assert mailbox.log() == []


def test_a_failing_learn_never_blocks_or_loses_the_move(mailbox):
    """The model cannot be written: the move happens all the same, the message byte for byte
    where it was moved, nothing learned, and one line in Dovecot's log says why."""
    import dovecot as harness

    a = sample("spam", 1)[0]
    mailbox.server.append("INBOX", a)
    before = mailbox.server.fetch_all("INBOX")
    counts = mailbox.counts()
    folder = mailbox.model.parent
    for p in folder.iterdir():
        p.chmod(0o400)
    folder.chmod(0o500)
    try:
        started = time.monotonic()
        mailbox.move(a, "INBOX", "Junk")
        took = time.monotonic() - started
    finally:
        folder.chmod(0o700)
        for p in folder.iterdir():
            p.chmod(0o600)
    assert mailbox.server.uids("INBOX") == []
    assert list(mailbox.server.fetch_all("Junk").values()) == list(before.values())
    assert mailbox.known(a) is None and mailbox.counts() == counts
    lines = mailbox.log()
    assert mailbox.learns() == ["--spam"]
    assert len(lines) == 1 and "alice: learning as spam failed (the move is done)" in lines[0], lines
    assert "Traceback" not in mailbox.server.log.read_text()
    assert took < 10, took  # not held up to Dovecot's pipe timeout
    del harness


@contextlib.contextmanager
def _unwritable(folder: Path):
    """The model's folder and files read-only for the mail user: every learn fails."""
    for p in folder.iterdir():
        p.chmod(0o400)
    folder.chmod(0o500)
    try:
        yield
    finally:
        folder.chmod(0o700)
        for p in folder.iterdir():
            p.chmod(0o600)


def test_a_failed_learn_is_kept_and_the_next_move_learns_the_queue_in_order(mailbox):
    """The model cannot be written: a move into Junk is done at once, its learn kept in the
    queue; moved back out, that learn waits behind the first. Once the model can be written,
    the next move learns the queue first, oldest first (the message ends as ham, as the
    person last said), then its own; the queue is empty, and each step is a line in the
    user's learn log (no syslog needed)."""
    a, b = sample("spam", 2)
    for raw in (a, b):
        mailbox.server.append("INBOX", raw)
        assert mailbox.known(raw) is None
    ham0, spam0 = mailbox.counts()
    with _unwritable(mailbox.model.parent):
        started = time.monotonic()
        mailbox.move(a, "INBOX", "Junk")
        assert time.monotonic() - started < 5  # the move is not held up
        assert [name.rsplit(".", 1)[1] for name in mailbox.queued()] == ["spam"]
        mailbox.move(a, "Junk", "INBOX")
        assert [name.rsplit(".", 1)[1] for name in mailbox.queued()] == ["spam", "ham"]
    assert mailbox.known(a) is None and mailbox.counts() == (ham0, spam0)
    lines = mailbox.log()
    assert len(lines) == 2 and "alice: learning as spam failed (the move is done)" in lines[0], lines
    assert "alice: learning as ham failed (the move is done; it waits in" in lines[1], lines

    mailbox.move(b, "INBOX", "Junk")
    assert mailbox.known(a) == HAM and mailbox.known(b) == SPAM
    assert mailbox.counts() == (ham0 + 1, spam0 + 1)
    assert mailbox.queued() == [] and len(mailbox.log()) == 2
    assert mailbox.learns() == ["--spam", "learn-queue", "learn-queue"]
    ida, idb = learnqueue.message_id(a), learnqueue.message_id(b)
    said = [line.split()[1:4] for line in mailbox.learn_log()]
    assert said == [["queued", "spam", ida + ":"], ["queued", "ham", ida + ":"], ["failed", "spam", ida + ":"],
                    ["queued", "spam", idb + ":"], ["learned", "spam", ida + ":"], ["learned", "ham", ida + ":"],
                    ["learned", "spam", idb + ":"]], mailbox.learn_log()
    assert "Traceback" not in mailbox.server.log.read_text()


def test_the_retry_command_learns_the_queue_as_the_mail_user(mailbox):
    """`spamnb learn-queue`, as a timer runs it for the mail user, learns what waits and
    empties the queue; `--list` shows what waits, with its label and Message-ID."""
    import dovecot as harness

    a = sample("spam", 1)[0]
    mailbox.server.append("INBOX", a)
    with _unwritable(mailbox.model.parent):
        mailbox.move(a, "INBOX", "Junk")
    assert len(mailbox.queued()) == 1

    def as_mail_user(*args):
        who = {"user": harness.NOBODY, "group": harness.NOBODY, "extra_groups": []} if mailbox.server.root else {}
        return subprocess.run([mailbox.spamnb, "learn-queue", *args], capture_output=True, text=True, timeout=120,
                              cwd="/", env={"HOME": str(mailbox.server.home), "PATH": "/usr/bin:/bin"}, **who)

    listed = as_mail_user("--list")
    assert listed.returncode == 0 and f" waiting spam {learnqueue.message_id(a)}: " in listed.stdout, listed
    assert "1 learn(s) wait in" in listed.stderr and len(mailbox.queued()) == 1
    service = ROOT / "contrib" / "systemd" / "user" / "spamnb-learn-queue.service"
    exec_start = next(line.split("=", 1)[1] for line in service.read_text().splitlines()
                      if line.startswith("ExecStart="))
    program, command, *args = exec_start.split()
    assert (program, command) == ("/usr/local/bin/spamnb", "learn-queue")
    done = as_mail_user(*args)  # what the user timer's service runs
    assert done.returncode == 0 and done.stdout == done.stderr == "", done
    assert mailbox.known(a) == SPAM and mailbox.queued() == []
    assert mailbox.learn_log()[-1].split()[1:3] == ["learned", "spam"]


def _pipe(tmp_path, spamnb_script: str) -> Path:
    fake = tmp_path / "spamnb"
    fake.write_text("#!/bin/sh\n" + spamnb_script)
    fake.chmod(0o755)
    program = tmp_path / imapsieve.PIPE
    program.write_text(imapsieve.pipe_program(str(fake)))
    program.chmod(0o755)
    return program


def log_file(home) -> Path:
    return home / ".local" / "state" / "spamnb" / "learn.log"


def _run_pipe(program, home, label, raw):
    return subprocess.run([str(program), label], input=raw, env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
                          capture_output=True, timeout=60)


def test_the_queue_holds_at_most_200_messages_and_20_mb_the_oldest_dropped(tmp_path):
    """A queue past its bound drops its oldest learns until it is within it, a line each in
    the learn log: at most 200 messages, and 20 MB, wait (the message just kept is dropped
    only when it alone is over)."""
    program = _pipe(tmp_path, "echo 'spamnb: error: the model is locked' >&2; exit 1\n")
    home = tmp_path / "home"
    queue = home / ".local" / "state" / "spamnb" / "learn-queue"
    queue.mkdir(parents=True, mode=0o700)
    old = 1_000_000_000_000_000_000  # 2001: older than any learn queued now
    for i in range(learnqueue.MAX_MESSAGES):
        (queue / f"{old + i}.{i}.spam").write_bytes(b"Message-ID: <old%d@x>\n\nx\n" % i)
    proc = _run_pipe(program, home, "ham", b"Message-ID: <new@x>\nSubject: x\n\nhello\n")
    assert proc.returncode == 0 and b"the model is locked" in proc.stderr
    names = sorted(p.name for p in queue.iterdir() if p.name[0] != ".")
    assert len(names) == learnqueue.MAX_MESSAGES and names[0] == f"{old + 1}.1.spam" and names[-1].endswith(".ham")
    log = log_file(home).read_text()
    assert " dropped spam <old0@x>: the queue is full (at most 200 messages, 20 MB)" in log, log
    assert " queued ham <new@x>: learns wait before it" in log

    for p in queue.iterdir():
        p.unlink()
    for i in range(2):  # 10 MiB each (sparse): 20 MiB, the bound, reached
        with open(queue / f"{old + i}.{i}.spam", "wb") as f:
            f.truncate(learnqueue.MAX_BYTES // 2)
    _run_pipe(program, home, "spam", b"Message-ID: <newer@x>\n\nhello\n")
    names = sorted(p.name for p in queue.iterdir() if p.name[0] != ".")
    assert names[0] == f"{old + 1}.1.spam" and len(names) == 2, names
    assert sum((queue / n).stat().st_size for n in names) <= learnqueue.MAX_BYTES

    huge = b"Message-ID: <huge@x>\n\n" + b"x" * learnqueue.MAX_BYTES
    _run_pipe(program, home, "spam", huge)
    assert sorted(p.name for p in queue.iterdir() if p.name[0] != ".") == []  # all older, then itself
    assert " dropped spam <huge@x>: the queue is full" in log_file(home).read_text()


@pytest.mark.parametrize("head, mid", [
    (b"Message-ID: <a@example.org>\nSubject: x\n", "<a@example.org>"),
    (b"Subject: x\r\nmessage-id:\r\n <folded@example.org>\r\nFrom: y\r\n", "<folded@example.org>"),
    (b"Subject: x\n", "-"),
    (b"Message-ID: <sp ace\x01@x>\n", "<space@x>"),
    (b"Subject: x\n\nMessage-ID: <in-the-body@x>\n", "-"),
])
def test_a_learn_is_a_line_in_the_users_log_with_no_syslog(tmp_path, head, mid):
    """Each learn is a line in ~/.local/state/spamnb/learn.log, written by the pipe program
    itself (this machine may have no /dev/log at all): the time, "learned", the label, the
    Message-ID as spamnb.delivery.learnqueue gives it (printable, no spaces; - without one)
    and what spamnb said. The log is rotated to learn.log.1 at 1 MiB."""
    program = _pipe(tmp_path, "echo 'learned 1 as spam, moved 0, 0 already known' >&2\n")
    raw = head + b"\nhello\n"
    assert learnqueue.message_id(raw) == mid
    log = tmp_path / ".local" / "state" / "spamnb" / "learn.log"
    log.parent.mkdir(parents=True)
    log.write_text("x" * learnqueue.LOG_MAX_BYTES)
    proc = _run_pipe(program, tmp_path, "spam", raw)
    assert proc.returncode == 0 and proc.stderr == b"", proc.stderr
    lines = log.read_text().splitlines()
    assert len(lines) == 1 and lines[0].split(" ", 1)[1] == f"learned spam {mid}: learned 1 as spam, moved 0, " \
                                                            "0 already known", lines
    assert (tmp_path / ".local" / "state" / "spamnb" / "learn.log.1").stat().st_size == learnqueue.LOG_MAX_BYTES


def test_a_retry_learns_oldest_first_stops_at_a_failure_and_drops_what_is_not_mail(tmp_path):
    """learnqueue.retry: oldest first, each removed once learned; not mail: dropped at once,
    never retried; a failure stops the retry there (the rest keep their order); a queue
    others could write to is refused."""
    queue, log = tmp_path / "learn-queue", tmp_path / "learn.log"
    queue.mkdir(mode=0o700)
    mail = b"Message-ID: <%d@x>\nSubject: x\n\nhello\n"
    (queue / "1000000000000000003.3.ham").write_bytes(mail % 3)
    (queue / "1000000000000000001.1.spam").write_bytes(mail % 1)
    (queue / "1000000000000000002.2.spam").write_bytes(b"\x00\x01 not mail")
    (queue / "1000000000000000004.4.spam").write_bytes(mail % 4)
    (queue / ".new.99").write_bytes(mail % 9)  # being written: not yet a learn
    seen = []

    def learn(raw, label):
        seen.append((learnqueue.message_id(raw), label))
        if raw == mail % 4:
            raise learnqueue.Failed("the model is locked")
        return "learned 1"

    done = learnqueue.retry(queue, log, learn)
    assert seen == [("<1@x>", "spam"), ("<3@x>", "ham"), ("<4@x>", "spam")]
    assert (done.learned, done.dropped, done.left, done.failed) == (2, 1, 1, "the model is locked")
    assert sorted(p.name for p in queue.iterdir()) == [".new.99", "1000000000000000004.4.spam"]
    words = [line.split()[1:4] for line in log.read_text().splitlines()]
    assert words == [["learned", "spam", "<1@x>:"], ["dropped", "spam", "-:"], ["learned", "ham", "<3@x>:"],
                     ["failed", "spam", "<4@x>:"]]
    assert "not a mail message" in log.read_text() and "never retried" in log.read_text()
    queue.chmod(0o777)
    with pytest.raises(ValueError, match="not a private folder of yours"):
        learnqueue.retry(queue, log, learn)


def test_the_contrib_files_are_what_install_writes(tmp_path):
    """contrib/dovecot/ is what `spamnb setup --imapsieve DIR` writes for /usr/local/bin/spamnb
    in /etc/dovecot/sieve-spamnb, mode for mode."""
    written = {name: (mode, text) for name, (mode, text) in
               imapsieve.files("/usr/local/bin/spamnb", imapsieve.DEFAULT_DIR).items()}
    shipped = {p.name: (stat.S_IMODE(p.stat().st_mode), p.read_text()) for p in CONTRIB.iterdir()}
    assert shipped == written


def test_setup_imapsieve_writes_the_files_and_keeps_an_admins_edits(tmp_path, runnable):
    """`spamnb setup --imapsieve DIR` writes the four files with this spamnb's full path
    (nothing else: no mail read, no model), says what to add to dovecot.conf, and leaves
    a file already there as it is."""
    SPAMNB = [str(runnable / "bin" / "spamnb")]  # noqa: N806 - one a mail user can run
    env = {"HOME": str(tmp_path / "home"), "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           **({"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {})}
    (tmp_path / "home").mkdir()
    folder = tmp_path / "sieve-spamnb"
    proc = subprocess.run([*SPAMNB, "setup", "--imapsieve", str(folder)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"cp {folder}/90-spamnb-imapsieve.conf /etc/dovecot/conf.d/" in proc.stdout
    assert f"sievec -c {folder}/{imapsieve.CONF} {folder}/report-spam.sieve" in proc.stdout
    got = {p.name: (stat.S_IMODE(p.stat().st_mode), p.read_text()) for p in folder.iterdir()}
    assert got == imapsieve.files(SPAMNB[0], str(folder))
    assert os.listdir(tmp_path / "home") == []  # no model, no configuration, no mail read
    (folder / "report-ham.sieve").write_text("# the admin's own\n")
    proc = subprocess.run([*SPAMNB, "setup", "--imapsieve", str(folder)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and f"{folder}/report-ham.sieve exists: left as it is" in proc.stdout
    assert (folder / "report-ham.sieve").read_text() == "# the admin's own\n"


def test_setup_imapsieve_refuses_a_folder_or_file_others_could_have_written(tmp_path, runnable):
    """Dovecot runs the pipe program as every mail user: a folder others may write to (sticky
    too), or a file there another user owns or may write, is refused in one line and nothing
    is written or kept from it."""
    SPAMNB = [str(runnable / "bin" / "spamnb")]  # noqa: N806 - one a mail user can run

    def setup(folder):
        return subprocess.run([*SPAMNB, "setup", "--imapsieve", str(folder)], capture_output=True, text=True,
                              timeout=120)

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    proc = setup(shared)
    assert proc.returncode == 1 and "writable by nobody else" in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr and list(shared.iterdir()) == []
    folder = tmp_path / "sieve-spamnb"
    folder.mkdir(mode=0o755)
    planted = folder / imapsieve.PIPE
    planted.write_text("#!/bin/sh\nid > /tmp/pwned\n")
    planted.chmod(0o777)
    proc = setup(folder)
    assert proc.returncode == 1 and f"{planted} is writable by group or others" in proc.stderr, proc.stderr
    assert sorted(p.name for p in folder.iterdir()) == [imapsieve.PIPE]
    if os.geteuid() == 0:
        planted.chmod(0o755)
        os.chown(planted, 65534, 65534)
        proc = setup(folder)
        assert proc.returncode == 1 and "owned by uid 65534" in proc.stderr, proc.stderr


def test_the_docs_show_the_settings_as_shipped():
    """docs/delivery.md's block of settings is the shipped file's, comments and blank lines aside."""
    doc = (ROOT / "docs" / "delivery.md").read_text()
    start = doc.index("```\nprotocol imap {") + 4
    block = doc[start:doc.index("```", start)].splitlines()
    conf = [line for line in imapsieve.conf().splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert block == conf


def test_the_documented_commands_run_as_written(runnable):
    """docs/delivery.md's commands for the administrator, run as written (`doveadm reload`
    aside: no Dovecot of the system's runs here) as root, in a private mount namespace whose
    /etc/dovecot is an empty folder of the test's: setup writes the files, the settings are
    copied, and `sievec -c SETTINGS` compiles both scripts, with nothing else configured."""
    import dovecot as harness

    if os.geteuid() != 0 or shutil.which("unshare") is None or not Path("/etc/dovecot").is_dir():
        pytest.skip("needs root, unshare and /etc/dovecot, to run the commands on /etc/dovecot unchanged")
    if harness.SIEVEC is None:
        pytest.skip(harness.NO_SIEVE)
    doc = (ROOT / "docs" / "delivery.md").read_text()
    start = doc.index("```sh\nspamnb setup --imapsieve") + len("```sh\n")
    commands = [line for line in doc[start:doc.index("```", start)].splitlines() if line != "doveadm reload"]
    assert len(commands) == 4 and all("sievec -c " in c for c in commands[2:]), commands
    etc, before = admin_folder(), sorted(os.listdir("/etc/dovecot"))
    try:
        (etc / "conf.d").mkdir(mode=0o755)
        script = "\n".join(["set -e", f"mount --bind {etc} /etc/dovecot", *commands])
        proc = subprocess.run(["unshare", "--mount", "sh", "-c", script], capture_output=True, text=True,
                              timeout=120, env={"PATH": f"{runnable}/bin:/usr/bin:/bin:/usr/sbin:/sbin"}, cwd="/")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert (etc / "conf.d" / imapsieve.CONF).exists()
        assert sorted(p.name for p in (etc / "sieve-spamnb").glob("*.svbin")) == ["report-ham.svbin",
                                                                                   "report-spam.svbin"]
        assert sorted(os.listdir("/etc/dovecot")) == before  # the system's, untouched
    finally:
        shutil.rmtree(etc, ignore_errors=True)


def test_a_learn_that_hangs_holds_the_move_only_until_dovecots_timeout(tmp_path, trained_model_file):
    """spamnb hanging (a model locked for ever, a stuck disk): Dovecot stops the pipe program
    after sieve_pipe_exec_timeout (2 s here, 10 s by default) and the move is done."""
    import dovecot as harness

    if harness.imapsieve_missing():
        pytest.skip(harness.imapsieve_missing())
    pytest.importorskip("imapclient", reason="imapclient is not installed (it is in the test and imap extras)")
    folder = Path(tempfile.mkdtemp(prefix="spamnb-sieve-"))
    folder.chmod(0o755)
    server = None
    try:
        hang = folder / "spamnb"
        hang.write_text("#!/bin/sh\nexec sleep 60\n")
        hang.chmod(0o755)
        imapsieve.install(folder / "sieve", str(hang), check_runs=False)  # `--version` would hang too
        server = harness.Dovecot(imapsieve=folder / "sieve")
        server.extra_config = "plugin {\n  sieve_pipe_exec_timeout = 2s\n}\n"
        server.start()
        a = sample("spam", 1)[0]
        uid = server.append("INBOX", a)
        before = server.fetch_all("INBOX")[uid]
        started = time.monotonic()
        server.move("INBOX", uid, "Junk")
        took = time.monotonic() - started
        assert server.uids("INBOX") == [] and list(server.fetch_all("Junk").values()) == [before]
        assert took < 5, (took, server.log_tail(50))
        log = server.log.read_text()
        assert "alice: stopped by Dovecot (sieve_pipe_exec_timeout): not learned as spam" in log, log
        assert "signal 9" not in log, log  # it ended at Dovecot's SIGTERM, not at the SIGKILL after
        queue = server.home / ".local" / "state" / "spamnb" / "learn-queue"
        assert [p.name.rsplit(".", 1)[1] for p in queue.iterdir() if p.name[0] != "."] == ["spam"]  # kept
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(folder, ignore_errors=True)


def test_the_pipe_program_runs_spamnb_at_a_path_with_a_quote_and_a_space(tmp_path):
    """The pipe program names spamnb by the full path setup was run from, whatever it holds:
    here a space and a quote, which must reach spamnb as one word (no shell syntax error,
    no other command run)."""
    odd = tmp_path / "o'brien's tools"
    odd.mkdir()
    fake = odd / "spamnb"
    said = tmp_path / "args"
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > '{said}'\n")
    fake.chmod(0o755)
    program = tmp_path / imapsieve.PIPE
    program.write_text(imapsieve.pipe_program(str(fake)))
    program.chmod(0o755)
    proc = subprocess.run([str(program), "spam"], input=b"Subject: x\n\nhello\n", capture_output=True, timeout=60,
                          env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})  # its learn log goes there
    assert proc.returncode == 0 and proc.stderr == b"", proc.stderr
    args = said.read_text().splitlines()
    assert args[:1] == ["learn"] and args[1] == "--spam" and len(args) == 3, args



# -- what another local user could make of setup --imapsieve, and users without a home -----------


def test_python_m_setup_writes_a_program_a_mail_user_learns_with(make_dovecot, trained_model_file, runnable):
    """`python3 -m spamnb setup --imapsieve DIR` with no spamnb on PATH: the pipe program runs
    the interpreter with `-I -m spamnb` as separate words, and a real Dovecot's mail user (not
    root: nobody, when root runs the tests) learns a move into Junk into their own model."""
    needs_imapsieve()
    assert shutil.which("spamnb", path="/usr/bin:/bin") is None
    folder = admin_folder()
    try:
        scripts, python = folder / "sieve", runnable / "bin" / "python"
        proc = subprocess.run([str(python), "-m", "spamnb", "setup", "--imapsieve", str(scripts)], cwd=folder,
                              env={"HOME": str(folder), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert f'{python} -I -m spamnb "$@"' in (scripts / imapsieve.PIPE).read_text()
        box = serve_mailbox(make_dovecot, scripts, trained_model_file)
        a = sample("spam", 1)[0]
        box.server.append("INBOX", a)
        ham0, spam0 = box.counts()
        box.move(a, "INBOX", "Junk")
        assert box.known(a) == SPAM and box.counts() == (ham0, spam0 + 1)
        assert box.log() == [] and box.queued() == []
        assert [line.split()[1:3] for line in box.learn_log()] == [["learned", "spam"]]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("form", ["python -m spamnb", "the spamnb script"])
def test_setup_imapsieve_refuses_a_spamnb_a_mail_user_cannot_run(form, tmp_path):
    """A venv in a folder only root may enter (as one built on root's own Python, under /root):
    Dovecot's mail users could run nothing, and every learn would fail. Refused in one line
    naming that folder and what to do, and nothing is written."""
    closed = Path(tempfile.mkdtemp(prefix="spamnb-closed-"))  # 0700
    try:
        venv = mail_user_venv(closed)
        command = [str(venv / "bin" / "python"), "-m", "spamnb"] if form.startswith("python") \
            else [str(venv / "bin" / "spamnb")]
        folder = tmp_path / "sieve-spamnb"
        proc = subprocess.run([*command, "setup", "--imapsieve", str(folder)], cwd=tmp_path, capture_output=True,
                              text=True, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}, timeout=120)
        assert proc.returncode == 1, proc.stdout
        who = "user nobody" if os.geteuid() == 0 else "other users"
        assert f"{who} cannot enter {closed} (mode 0700" in proc.stderr, proc.stderr
        assert "install spamnb where every user can run it, e.g. a venv under /opt" in proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr and not folder.exists()
    finally:
        shutil.rmtree(closed, ignore_errors=True)


def test_the_path_others_must_reach_is_walked_as_the_kernel_walks_it():
    """``link/..`` is the folder above where the link points, not the link's own folder:
    a closed folder reached that way is in the way; links, missing names and the file's
    own bits are each said in one line."""
    from spamnb.delivery import mailuser

    top = Path(tempfile.mkdtemp(prefix="spamnb-walk-"))
    try:
        top.chmod(0o755)
        closed, shown, mine = top / "closed", top / "shown", top / "spamnb"
        (closed / "inner").mkdir(parents=True)
        closed.chmod(0o700)
        (closed / "spamnb").write_text("")
        mine.write_text("")
        mine.chmod(0o644)
        shown.symlink_to(closed / "inner")
        if mailuser.unreachable(top, mailuser.RUN):
            pytest.skip(f"other users cannot reach {tempfile.gettempdir()}")
        assert mailuser.unreachable(mine, mailuser.READ) is None
        assert mailuser.unreachable(f"{shown}/../spamnb", mailuser.READ).startswith(
            f"other users cannot enter {closed} (mode 0700")
        assert mailuser.unreachable(mine, mailuser.RUN).startswith(f"other users cannot run {mine} (mode 0644")
        gone = top / "gone"
        assert mailuser.unreachable(gone / "spamnb", mailuser.READ) == f"{gone}: No such file or directory"
        (top / "loop").symlink_to(top / "loop")
        assert mailuser.unreachable(top / "loop", mailuser.READ) == f"{top / 'loop'}: too many symbolic links"
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_setup_as_a_user_checks_that_others_can_reach_spamnb(mallory, tmp_path):
    """Run by a user who is not root (who cannot try it as another user): every folder on the
    way must be open to others, the files readable and runnable by them. Their own venv in
    their own 0700 folder is refused, naming it; nothing is written."""
    closed = Path(tempfile.mkdtemp(prefix="spamnb-theirs-"))
    try:
        venv = mail_user_venv(closed)
        for top, dirs, files in os.walk(closed):
            for name in [top, *(os.path.join(top, n) for n in dirs + files)]:
                os.lchown(name, mallory.pw_uid, mallory.pw_gid)
        folder = closed / "sieve-spamnb"
        proc = subprocess.run([str(venv / "bin" / "python"), "-m", "spamnb", "setup", "--imapsieve", str(folder)],
                              cwd="/", env={"HOME": str(closed), "PATH": "/usr/bin:/bin"}, capture_output=True,
                              text=True, timeout=120, user=mallory.pw_uid, group=mallory.pw_gid, extra_groups=[])
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert f"a mail user could not run spamnb ({venv}/bin/python -I -m spamnb): other users cannot enter " \
               f"{closed} (mode 0700, uid {mallory.pw_uid})" in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1 and not folder.exists()
    finally:
        shutil.rmtree(closed, ignore_errors=True)


@pytest.fixture
def theirs(mallory):
    """A folder of the other user's, as their home is: theirs, mode 0755."""
    path = Path(tempfile.mkdtemp(prefix="spamnb-mallory-", dir="/tmp"))
    path.chmod(0o755)
    os.chown(path, mallory.pw_uid, mallory.pw_gid)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_setup_imapsieve_refuses_a_spamnb_another_user_can_change(mallory, theirs, tmp_path):
    """Another user's spamnb (their script, or their copy of the package imported with
    PYTHONPATH): Dovecot would run their code as every mail user. Refused in one line
    naming the path, and nothing written."""
    from test_e2e import SPAMNB

    folder = tmp_path / "sieve-spamnb"
    if os.path.basename(SPAMNB[0]) == "spamnb":
        script = theirs / "spamnb"
        shutil.copyfile(SPAMNB[0], script)
        script.chmod(0o755)
        os.chown(script, mallory.pw_uid, mallory.pw_gid)
        proc = subprocess.run([str(script), "setup", "--imapsieve", str(folder)], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 1, proc.stdout
        assert f"refusing to use spamnb {script}: {theirs} is owned by uid {mallory.pw_uid}" in proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr and not folder.exists()
    lib = theirs / "lib"
    shutil.copytree(ROOT / "spamnb", lib / "spamnb", ignore=shutil.ignore_patterns("__pycache__"))
    for p in [lib, *lib.rglob("*")]:
        os.chown(p, mallory.pw_uid, mallory.pw_gid)
    proc = subprocess.run([sys.executable, "-m", "spamnb", "setup", "--imapsieve", str(folder)], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(lib)}, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout
    assert f"refusing to use spamnb's package folder {lib}/spamnb: {theirs} is owned by uid" in proc.stderr
    assert proc.stderr.count("\n") == 1 and not folder.exists()


def test_setup_imapsieve_refuses_a_folder_under_another_users_folder(mallory, theirs, tmp_path):
    """The folder under another user's (their home): they could swap it for their own after
    setup, with their own spamnb-learn. Refused, nothing made there; so is a link they
    planted in a shared folder pointing into theirs."""
    spamnb = tmp_path / "bin" / "spamnb"
    spamnb.parent.mkdir()
    spamnb.write_text("#!/bin/sh\n")
    spamnb.chmod(0o755)
    install = functools.partial(imapsieve.install, check_runs=False)  # the folder is refused, whoever runs it
    with pytest.raises(ValueError, match=f"{theirs} is owned by uid {mallory.pw_uid}"):
        install(theirs / "sieve", str(spamnb))
    assert list(theirs.iterdir()) == []
    (theirs / "made").mkdir()
    os.chown(theirs / "made", 0, 0)  # even a folder of root's in it: they can rename it away
    with pytest.raises(ValueError, match=f"{theirs} is owned by uid {mallory.pw_uid}"):
        install(theirs / "made", str(spamnb))
    assert list((theirs / "made").iterdir()) == []
    shared = Path(tempfile.mkdtemp(prefix="spamnb-shared-", dir="/tmp"))
    try:
        shared.chmod(0o1777)
        forked_as(mallory, lambda: os.symlink(theirs, shared / "sieve") or b"")
        with pytest.raises(ValueError, match=f"symbolic link {shared}/sieve, owned by uid {mallory.pw_uid}"):
            install(shared / "sieve", str(spamnb))
        assert sorted(p.name for p in theirs.iterdir()) == ["made"]
    finally:
        shutil.rmtree(shared, ignore_errors=True)


@pytest.mark.parametrize("mailbox", [{"home_in_userdb": False}], indirect=True)
def test_a_user_without_a_home_learns_nothing_and_the_move_is_done(mailbox):
    """A userdb without a home (virtual users under one vmail uid): Dovecot gives the pipe
    program no HOME, and spamnb would learn into the uid's own home's model, shared by
    every such user. The move is done, nothing learned, one line in Dovecot's log."""
    a = sample("spam", 1)[0]
    mailbox.server.append("INBOX", a)
    counts = mailbox.counts()
    mailbox.move(a, "INBOX", "Junk")
    assert mailbox.server.uids("INBOX") == [] and len(mailbox.server.uids("Junk")) == 1
    assert mailbox.learns() == [] and mailbox.counts() == counts
    lines = mailbox.log()
    assert len(lines) == 1 and "alice: no home of their own (HOME=unset" in lines[0], lines


@pytest.mark.parametrize("home, user, refused", [
    (None, "bob@example.com", True),
    ("/", "bob@example.com", True),
    ("", "bob@example.com", True),
    ("relative/home", "bob@example.com", True),
    ("SYSTEM", "bob@example.com", True),  # every virtual user given the vmail uid's own home
    ("SYSTEM/", "bob@example.com", True),
    ("SYSTEM", None, False),  # the system user itself
    ("SYSTEM", "LOGIN@example.com", False),  # ... logged in with a domain
    ("OWN", "bob@example.com", False),
])
def test_the_pipe_program_learns_only_for_a_home_of_the_users_own(tmp_path, home, user, refused):
    """HOME unset, empty, /, relative, or the uid's own home under another user name (every
    virtual user of one vmail uid would share its model): nothing learned, one line, exit 0."""
    import pwd

    said = tmp_path / "args"
    fake = tmp_path / "spamnb"
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > '{said}'\n")
    fake.chmod(0o755)
    program = tmp_path / imapsieve.PIPE
    program.write_text(imapsieve.pipe_program(str(fake)))
    program.chmod(0o755)
    system = pwd.getpwuid(os.getuid()).pw_dir
    env = {"PATH": "/usr/bin:/bin"}
    if home is not None:
        env["HOME"] = {"SYSTEM": system, "SYSTEM/": system + "/", "OWN": str(tmp_path)}.get(home, home)
    if user is not None:
        env["USER"] = user.replace("LOGIN", pwd.getpwuid(os.getuid()).pw_name)
    with _state_kept_as_it_was(Path(system)):  # HOME the runner's own: its learn log is put back
        proc = subprocess.run([str(program), "spam"], input=b"Subject: x\n\nhello\n", env=env, capture_output=True,
                              timeout=60)
    assert proc.returncode == 0
    if refused:
        assert said.exists() is False and proc.stderr.count(b"\n") == 1, proc.stderr
        assert b"no home of their own" in proc.stderr and b"not learned as spam" in proc.stderr
    else:
        assert proc.stderr == b"" and said.read_text().splitlines()[:2] == ["learn", "--spam"]


@contextlib.contextmanager
def _state_kept_as_it_was(home: Path):
    """The pipe program logs each learn into ``home``'s ~/.local/state/spamnb/learn.log: for a
    test whose HOME is the runner's real one, that log is as it was afterwards."""
    made = [home / ".local", home / ".local" / "state", home / ".local" / "state" / "spamnb"]
    made = [p for p in made if not p.exists()]
    log = home / ".local" / "state" / "spamnb" / "learn.log"
    before = log.read_bytes() if log.exists() else None
    try:
        yield
    finally:
        if before is not None:
            log.write_bytes(before)
        else:
            log.unlink(missing_ok=True)
        for p in reversed(made):
            with contextlib.suppress(OSError):
                p.rmdir()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_the_learn_queue_timer_and_its_service_pass_systemd_analyze_verify(tmp_path):
    from test_contrib import complaints, verify
    from test_e2e import SPAMNB

    for name in ("spamnb-learn-queue.service", "spamnb-learn-queue.timer"):
        text = (ROOT / "contrib" / "systemd" / "user" / name).read_text()
        (tmp_path / name).write_text(text.replace("/usr/local/bin/spamnb", " ".join(SPAMNB)))
    for name in ("spamnb-learn-queue.service", "spamnb-learn-queue.timer"):
        proc = verify("user", tmp_path / name, tmp_path)
        assert proc.returncode == 0 and not complaints(proc, name), proc.stdout + proc.stderr
