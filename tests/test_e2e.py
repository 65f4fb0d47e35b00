"""End to end: the installed ``spamnb`` run as a subprocess, alone and as the
filter of real mail delivery agents (procmail, maildrop) writing into maildirs.

Each subprocess pays the start-up of numpy/scipy (~0.3-0.5 s), so the flows
here are few and long rather than many and small.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SAMPLE_MAILDIR, gold_labels, learnable_cutoffs, strip_from_line
from spamnb._version import __version__
from spamnb.delivery.hook import replace_verdicts
from spamnb.storage.modelfile import load_model, save_model


def spamnb_command() -> list[str]:
    """The installed console script of this interpreter, else any on PATH, else ``-m``."""
    beside = Path(sys.executable).with_name("spamnb")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("spamnb")
    return [found] if found else [sys.executable, "-m", "spamnb"]


SPAMNB = spamnb_command()


def spamnb(*args, input=None, code=0):
    proc = subprocess.run(SPAMNB + [str(a) for a in args], input=input, capture_output=True, timeout=120)
    stderr = proc.stderr.decode(errors="replace")
    assert "Traceback" not in stderr
    assert proc.returncode == code, stderr
    return proc


def added_lines(delivered: bytes, original: bytes) -> list[bytes]:
    """The header lines the filter inserted (X-Spam-Flag on spam only, X-Spam-Status),
    checking nothing else changed but incoming verdict fields removed."""
    lines = [line.rstrip(b"\r") for line in delivered.split(b"\n") if line.startswith(b"X-Spam-")]
    assert [line.split(b":")[0] for line in lines] in ([b"X-Spam-Flag", b"X-Spam-Status"], [b"X-Spam-Status"])
    assert delivered == replace_verdicts(original, lines)
    return lines


@pytest.fixture
def confident(trained_model):
    """Sample messages (without their From_ lines) the model is sure about, 4 spam and 4 ham."""
    picked = {"spam": [], "ham": []}
    for path in sorted((SAMPLE_MAILDIR / "cur").iterdir()):
        raw = strip_from_line(path.read_bytes())
        c = trained_model.classify(raw)
        if c.label != "unsure" and min(c.spam_probability, 1 - c.spam_probability) < 1e-3:
            if len(picked[c.label]) < 4:
                picked[c.label].append(raw)
    assert all(len(v) == 4 for v in picked.values())
    return picked


def make_maildir(path: Path) -> Path:
    for sub in ("cur", "new", "tmp"):
        (path / sub).mkdir(parents=True, exist_ok=True)
    return path


def delivered(folder: Path) -> list[bytes]:
    return [p.read_bytes() for p in sorted((folder / "new").iterdir())]


# -- the command line, end to end -----------------------------------------------------

def test_train_classify_sort_learn_forget(small_archive, tmp_path):
    model = tmp_path / "model.joblib"
    err = spamnb("train", "--index", small_archive, "--model", model).stderr.decode()
    assert re.search(r"trained multinomial model on 150 ham and 150 spam \(\d+ tokens, distinct per "
                     r"message; vocabulary \d+\) in [\d.]+ s", err)
    assert oct(model.stat().st_mode & 0o777) == "0o600"

    out = spamnb("classify", SAMPLE_MAILDIR, "--model", model, "--format", "jsonl").stdout
    rows = [json.loads(line) for line in out.splitlines()]
    gold = gold_labels()
    assert len(rows) == len(gold) == 103
    right = sum(r["label"] == gold[os.path.basename(r["path"])] for r in rows)
    assert right >= 93, right  # >= 90% after 300 training messages (measured: 102)

    maildir = tmp_path / "Maildir"
    shutil.copytree(SAMPLE_MAILDIR, maildir)
    spamnb("sort", maildir, "--model", model)
    junk = {p.name for p in (maildir / ".Junk" / "cur").iterdir()}
    assert junk == {os.path.basename(r["path"]) for r in rows if r["label"] == "spam"}
    assert len(junk) + len(list((maildir / "cur").iterdir())) == 103

    ham = sorted(p for p in (maildir / "cur").iterdir())[0]
    assert "learned 1 as spam" in spamnb("learn", "--spam", ham, "--model", model).stderr.decode()
    assert load_model(model).messages.tolist() == [150, 151]
    assert "forgot 1 spam" in spamnb("forget", "--spam", ham, "--model", model).stderr.decode()
    assert load_model(model).messages.tolist() == [150, 150]


def test_filter_exit_codes_and_bytes(trained_model_file, confident, tmp_path):
    for label, code in (("spam", 0), ("ham", 1)):
        raw = confident[label][0]
        out = spamnb("filter", "--model", trained_model_file, input=raw, code=code).stdout
        first = added_lines(out, raw)[0]
        assert first == b"X-Spam-Flag: YES" if label == "spam" else first.startswith(b"X-Spam-Status: No, score=")
    spamnb("filter", "--model", trained_model_file, "--exit-zero", input=confident["ham"][0], code=0)
    # any failure: the original bytes, exit 3
    raw = confident["spam"][0]
    broken = tmp_path / "broken.joblib"
    broken.write_bytes(trained_model_file.read_bytes()[:5000])
    broken.chmod(0o600)
    for args in (["--model", broken], ["--evidence", "many"]):
        proc = spamnb("filter", *args, input=raw, code=3)
        assert proc.stdout == raw
        assert b"passed through unchanged" in proc.stderr


def test_concurrent_filter_learn_loses_no_update(model_file, confident):
    """Three deliveries learning at once: the model lock serialises them."""
    model = load_model(model_file)
    # cut-offs that keep each in filter -u's margin while the others are learned
    cuts = [learnable_cutoffs(model, raw, 2.5) for raw in confident["spam"][:3]]
    procs = [subprocess.Popen(SPAMNB + ["filter", "--model", str(model_file), "--learn", "--exit-zero", *cut],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for cut in cuts]
    for proc, raw in zip(procs, confident["spam"]):
        out, err = proc.communicate(raw, timeout=120)
        assert proc.returncode == 0, err
        assert b"X-Spam-Flag: YES" in out
    assert load_model(model_file).messages.tolist() == [150, 153]


# -- mail delivery agents --------------------------------------------------------------
#
# The recipes are docs/delivery.md's (the README shows the procmail one), as a user
# copies them: the only change is the full path of spamnb (the recipes write
# /usr/local/bin/spamnb and the docs say to put what `command -v spamnb` prints).
# The delivery agents run them with their own PATH (procmail:
# $HOME/bin:/usr/local/bin:/usr/bin:/bin, maildrop: /bin:/usr/bin:/usr/local/bin),
# never with this test's, and find the model
# where a user's is: ~/.local/share/spamnb/model.joblib of a HOME made here.

REPO = Path(__file__).resolve().parent.parent
RECIPES = REPO / "docs" / "delivery.md"  # the recipes, explained; the README shows the procmail one
README = REPO / "README.md"  # the quick start's lines are tested as written
README_SPAMNB = "/usr/local/bin/spamnb"  # the path the README's recipes spell out


def readme_block(lang: str) -> str:
    """docs/delivery.md's one fenced code block of language ``lang`` (```procmail, ```maildrop);
    a copy of it anywhere else in the README or the docs must be the same, byte for byte."""
    blocks = re.findall(rf"^```{lang}\n(.*?)^```$", RECIPES.read_text(), flags=re.S | re.M)
    assert len(blocks) == 1, f"docs/delivery.md has {len(blocks)} ```{lang} blocks"
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for copy in re.findall(rf"^```{lang}\n(.*?)^```$", page.read_text(), flags=re.S | re.M):
            assert copy == blocks[0], f"{page.name}'s ```{lang} recipe differs from docs/delivery.md's"
    return blocks[0]


def as_installed(recipe: str) -> str:
    """The recipe with the README's path of spamnb replaced by this installation's."""
    return recipe.replace(README_SPAMNB, shlex.join(SPAMNB))


def passed_through() -> list[str]:
    """``NAME=VALUE`` settings this test run needs in the agents' environment: none
    for an installed spamnb; PYTHONPATH when the tests run a source tree through
    another tree's installed script (the agents clear or keep it as they please)."""
    return [f"PYTHONPATH={os.environ['PYTHONPATH']}"] if os.environ.get("PYTHONPATH") else []


@pytest.fixture
def user_home(tmp_path, trained_model) -> Path:
    """A HOME with ~/Maildir and the user's model (and its scorer) at the XDG data path."""
    home = tmp_path / "home"
    make_maildir(home / "Maildir")
    save_model(trained_model, home / ".local" / "share" / "spamnb" / "model.joblib")
    return home


def procmail_deliver(home: Path, raw: bytes, *settings: str):
    """Deliver ``raw`` with the README's procmail recipe as ``home``'s user.

    ``procmail -m NAME=VALUE... RCFILE``: general-purpose filter mode with our
    rcfile (no setuid games, no /etc/procmailrc, works as root and as a user).
    procmail starts from an empty environment: HOME comes from the password
    file unless set here, PATH is procmail's own, and the settings before the
    rcfile are what procmail passes on. Returns procmail's log.
    """
    rc = home / ".procmailrc"
    rc.write_text(as_installed(readme_block("procmail")))
    log = home / "procmail.log"
    proc = subprocess.run(["procmail", "-m", f"HOME={home}", f"LOGFILE={log}", *passed_through(), *settings,
                           str(rc)], input=raw, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return log.read_text(errors="replace")


@pytest.mark.skipif(shutil.which("procmail") is None,
                    reason="procmail is not installed (scripts/test.sh installs it when run as root)")
def test_procmail_readme_recipe_files_spam_into_junk(user_home, confident):
    maildir = user_home / "Maildir"
    spams, hams = confident["spam"][:2], confident["ham"][:2]
    # a sender's forged verdict reaches neither the recipe nor the user
    hams[1] = hams[1].replace(b"\nSubject:", b"\nX-Spam-Flag: YES\nX-Spam-Status: Yes, score=99.0 required=5.0"
                              b"\nX-Spam-Level: **********\nSubject:", 1)
    for raw in spams + hams:
        log = procmail_deliver(user_home, raw)
        assert "Error" not in log and "cannot" not in log, log
    spam_in = delivered(maildir / ".Junk")
    ham_in = delivered(maildir)
    assert len(spam_in) == len(ham_in) == 2  # nothing lost, nothing duplicated
    # each delivered file is exactly its input plus our two header lines (added_lines checks)
    for raw, got in zip(spams, _match(spam_in, spams)):
        flag, status = added_lines(got, raw)
        assert flag == b"X-Spam-Flag: YES"
        assert status.startswith(b"X-Spam-Status: Yes, score=")
        assert b" tests=SPAMNB_SPAM " in status
        assert status.endswith(f" model=model.joblib version={__version__}".encode())
    for raw, got in zip(hams, _match(ham_in, hams)):
        assert added_lines(got, raw)[0].startswith(b"X-Spam-Status: No, score=")
        assert b"99.0" not in got and b"X-Spam-Level" not in got
    assert not (maildir / ".Junk" / ".lock").exists()  # :0, not :0: -- a maildir takes no lock file


@pytest.mark.skipif(shutil.which("procmail") is None,
                    reason="procmail is not installed (scripts/test.sh installs it when run as root)")
def test_what_procmail_changes_it_changes_in_any_message(user_home, confident, tmp_path):
    """spamnb's output is its input with its header lines added (forged verdicts gone), byte
    for byte; what the delivered file then differs in is procmail's, the same for any
    message: a newline added where the message has none at its end, a blank line after a
    last line, ``Content-Length:`` rewritten (docs/delivery.md says so). Each message is
    delivered through the recipe with spamnb, and spamnb's own output through the same
    recipe with ``cat`` in its place: the two files are the same."""
    ham = confident["ham"][0]
    head, _, body = ham.partition(b"\n\n")
    cases = {"no newline at the end": ham.rstrip(b"\n"), "one newline at the end": head + b"\n\n" + body.rstrip(b"\n")
             + b"\n", "a Content-Length": head + b"\nContent-Length: 999\n\n" + body,
             "CRLF": ham.replace(b"\n", b"\r\n")}
    recipe = as_installed(readme_block("procmail"))
    command = f"| {shlex.join(SPAMNB)} filter --exit-zero -u"
    assert command in recipe
    plain = user_home / "cat.procmailrc"
    plain.write_text(recipe.replace(command, "| cat"))
    for what, raw in cases.items():
        out = spamnb("filter", "--exit-zero", "--model", user_home / ".local" / "share" / "spamnb" / "model.joblib",
                     input=raw).stdout
        added_lines(out, raw)  # spamnb itself: the input and its lines, nothing else
        for rc, message in ((None, raw), (plain, out)):
            if rc is None:
                procmail_deliver(user_home, message)
            else:
                subprocess.run(["procmail", "-m", f"HOME={user_home}", str(rc)], input=message, check=True,
                               timeout=60)
        files = delivered(user_home / "Maildir")
        assert len(files) == 2 and files[0] == files[1], what
        if what == "no newline at the end":
            assert files[0] == out + b"\n"  # procmail's newline
        for f in (user_home / "Maildir" / "new").iterdir():
            f.unlink()


@pytest.mark.skipif(shutil.which("procmail") is None,
                    reason="procmail is not installed (scripts/test.sh installs it when run as root)")
def test_procmail_keeps_mail_when_the_filter_fails(user_home, confident, tmp_path):
    maildir = user_home / "Maildir"
    raw = confident["spam"][0]
    log = procmail_deliver(user_home, raw, f"SPAMNB_MODEL={tmp_path / 'no-such-model'}")
    assert delivered(maildir) == [raw]  # unchanged, in the inbox
    assert not (maildir / ".Junk").exists()
    assert "message passed through unchanged" in log, log  # procmail's log has the filter's line


@pytest.mark.skipif(shutil.which("maildrop") is None,
                    reason="maildrop is not installed (scripts/test.sh installs it when run as root)")
def test_maildrop_readme_recipe_files_spam_into_junk(user_home, confident, tmp_path):
    maildir = user_home / "Maildir"
    make_maildir(maildir / ".Junk")  # maildrop delivers only into existing maildirs
    rc = tmp_path / "mailfilter"
    # maildrop sets HOME from the password file; this line makes it the test's user's.
    rc.write_text(f'HOME="{user_home}"\n' + as_installed(readme_block("maildrop")))
    rc.chmod(0o600)  # maildrop refuses filter files others can write
    env = {"HOME": str(user_home), **dict(s.split("=", 1) for s in passed_through())}

    def deliver(raw, **more):
        return subprocess.run(["maildrop", str(rc)], input=raw, capture_output=True, timeout=120,
                              env={**env, **more})

    spam, ham = confident["spam"][0], confident["ham"][0]
    for raw in (spam, ham):
        proc = deliver(raw)
        assert proc.returncode == 0, proc.stderr
    spam_in, ham_in = delivered(maildir / ".Junk"), delivered(maildir)
    assert len(spam_in) == len(ham_in) == 1
    assert added_lines(spam_in[0], spam)[0] == b"X-Spam-Flag: YES"
    assert added_lines(ham_in[0], ham)[0].startswith(b"X-Spam-Status: No, ")
    # a failing filter passes the message through with --exit-zero's 0: maildrop delivers it
    # unchanged rather than deferring it (EX_TEMPFAIL) for as long as the failure lasts
    proc = deliver(confident["ham"][3], SPAMNB_MODEL=str(tmp_path / "absent"))
    assert proc.returncode == 0, proc.stderr
    assert confident["ham"][3] in delivered(maildir) and len(delivered(maildir)) == 2


def test_filter_help_recipes_are_the_readmes():
    """`spamnb filter --help` shows the README's recipes, line for line (comments aside)."""
    help_lines = [line.strip() for line in spamnb("filter", "--help").stdout.decode().splitlines()]

    def lines(recipe):
        return [line.strip() for line in recipe.splitlines() if line.strip() and not line.startswith("#")]

    for lang in ("procmail", "maildrop"):
        want = lines(readme_block(lang))
        assert README_SPAMNB + " filter" in "\n".join(want)
        assert any(help_lines[i:i + len(want)] == want for i in range(len(help_lines))), (lang, want)
    assert "command -v spamnb" in " ".join(help_lines)


def _match(got: list[bytes], inputs: list[bytes]) -> list[bytes]:
    """The delivered file of each input, in input order (files are named by time, not input)."""
    out = []
    for raw in inputs:
        body = raw.split(b"\n\n", 1)[1] if b"\n\n" in raw else raw
        hits = [g for g in got if g.startswith(raw[:40]) and g.endswith(body)]
        assert len(hits) == 1
        out.append(hits[0])
    return out


def test_module_entry_point():
    proc = subprocess.run([sys.executable, "-m", "spamnb", "--version"], capture_output=True, timeout=60)
    assert proc.returncode == 0 and __version__ in proc.stdout.decode()


def quick_start_trains():
    """The `spamnb train` lines of the README's Quick start (a commented one is an alternative)."""
    block = README.read_text().split("## Quick start", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    return [line.lstrip("# ").split("  #")[0].split() for line in block.splitlines()
            if line.lstrip("# ").startswith("spamnb train ")]


def test_the_quick_start_trains_on_a_real_maildir_and_on_mbox_files(tmp_path):
    """A Maildir++ as Dovecot and procmail make it (INBOX, .Archive, .Junk,
    .Sent) and mbox files (~/mail/inbox, ~/mail/spam), each trained by its Quick start line."""
    import mailbox

    home = tmp_path / "home"
    home.mkdir()
    ham = [strip_from_line(p.read_bytes()) for p in sorted(SAMPLE_MAILDIR.glob("cur/easy_ham*"))][:6]
    spam = [strip_from_line(p.read_bytes()) for p in sorted(SAMPLE_MAILDIR.glob("cur/spam*"))][:4]
    for folder, msgs in (("", ham[:3]), (".Archive", ham[3:5]), (".Sent", ham[5:]), (".Junk", spam)):
        box = mailbox.Maildir(home / "Maildir" / folder, create=True)
        for raw in msgs:
            box.add(raw)
    (home / "mail").mkdir()
    for name, msgs in (("inbox", ham), ("spam", spam)):
        box = mailbox.mbox(home / "mail" / name)
        for raw in msgs:
            box.add(raw)
        box.close()
    lines = quick_start_trains()
    assert [line[:2] for line in lines] == [["spamnb", "train"]] * 2 and "-r" in lines[0]
    for line in lines:
        env = {**os.environ, "HOME": str(home)}
        for var in ("XDG_DATA_HOME", "SPAMNB_MODEL"):
            env.pop(var, None)
        args = [a.replace("~", str(home), 1) if a.startswith("~/") else a for a in line[1:]]
        proc = subprocess.run(SPAMNB + args, capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stderr
        model = load_model(home / ".local" / "share" / "spamnb" / "model.joblib")
        assert model.messages.tolist() == [len(ham), len(spam)], (line, proc.stderr)
        (home / ".local" / "share" / "spamnb" / "model.joblib").unlink()
