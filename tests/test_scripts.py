"""The scripts of the README's two commands, run in a sandbox: ``scripts/test.sh``'s
install step with stand-ins for apt-get and id, and the gold comparison that
ends ``scripts/main.sh``."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT

def tool_pairs():
    """``scripts/test.sh``'s ``(command, package)`` pairs, read from its loop, so these
    tests follow the list as tools are added to it."""
    loop = (ROOT / "scripts" / "test.sh").read_text().split("for pair in ", 1)[1].split("; do", 1)[0]
    return [tuple(pair.split(":")) for pair in loop.replace("\\\n", " ").split()]


PAIRS = tool_pairs()
TOOLS = [command for command, _ in PAIRS]
PACKAGES = {package for _, package in PAIRS}


def all_but(*commands):
    return tuple(t for t in TOOLS if t not in commands)


APT_STUB = """#!/bin/bash
# apt-get stand-in: logs its arguments; "install PKG..." makes each package's commands;
# "-s install PKG" (a simulation) says it would remove postfix when {bin}/remv names PKG.
echo "$*" >> {log}
if [ "$1" = -s ]; then
    [ -f {bin}/remv ] && grep -qx "$3" {bin}/remv && echo "Remv postfix [3.7.11-0+deb12u1]"
    exit 0
fi
if [ "$1" = install ]; then
    for arg in "$@"; do
        case "$arg" in
{cases}
        esac
    done
fi
"""
CASES = "\n".join(f"            {package}) " + " ".join(f"printf '#!/bin/bash\\\\n' > {{bin}}/{c}; chmod +x {{bin}}/{c};"
                                                       for c, p in PAIRS if p == package) + " ;;"
                  for package in sorted(PACKAGES))


def run_test_sh(tmp_path: Path, uid: int, have=(), apt=True, would_remove=(), sbin=()):
    """``bash scripts/test.sh`` in a copy of the scripts, with a PATH holding only
    stand-ins: ``id`` (says ``uid``), ``apt-get`` (when ``apt``), the commands of
    ``have``, and a ``.venv/bin/python`` that logs what it is asked to run; the
    commands of ``sbin`` in the folder it reads as /usr/sbin (``$SBIN``);
    installing a package of ``would_remove`` would remove another (apt-get -s says so).
    Returns (stderr, apt-get's calls, what the venv's python was asked)."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for name in ("test.sh", "_venv.sh"):
        shutil.copy(ROOT / "scripts" / name, repo / "scripts" / name)
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    log, py_log = tmp_path / "apt.log", tmp_path / "python.log"
    (repo / ".venv" / "bin").mkdir(parents=True)
    stubs = {"id": f'#!/bin/bash\necho {uid}\n', **{cmd: "#!/bin/bash\n" for cmd in have}}
    if apt:
        stubs["apt-get"] = APT_STUB.format(log=log, bin=bin_, cases=CASES.format(bin=bin_))
    for name, text in stubs.items():
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    (repo / ".venv" / "bin" / "python").write_text(f'#!/bin/bash\necho "$*" >> {py_log}\n')
    (repo / ".venv" / "bin" / "python").chmod(0o755)
    for tool in ("dirname", "awk", "grep"):
        os.symlink(shutil.which(tool), bin_ / tool)
    if would_remove:
        (bin_ / "remv").write_text("".join(f"{p}\n" for p in would_remove))
    sbin_ = tmp_path / "sbin"
    sbin_.mkdir()
    for name in sbin:
        (sbin_ / name).write_text("#!/bin/bash\n")
        (sbin_ / name).chmod(0o755)
    proc = subprocess.run(["/bin/bash", str(repo / "scripts" / "test.sh"), "-x", "-q"], capture_output=True,
                          text=True, timeout=60, env={"PATH": str(bin_), "HOME": str(tmp_path), "SBIN": str(sbin_)})
    assert proc.returncode == 0, proc.stderr
    calls = log.read_text().splitlines() if log.exists() else []
    return proc.stderr, calls, py_log.read_text().splitlines()


def test_test_sh_installs_the_integration_tools_as_root(tmp_path):
    err, calls, python = run_test_sh(tmp_path, uid=0)
    installs = [c.split() for c in calls if c.startswith("install")]
    assert len(installs) == 1
    assert PACKAGES <= set(installs[0])
    assert "note:" not in err
    assert python[-1] == "-m pytest -x -q"  # then the suite, with the arguments given


def test_test_sh_installs_only_what_is_missing(tmp_path):
    err, calls, _ = run_test_sh(tmp_path, uid=0, have=all_but("maildrop"))
    installs = [c.split() for c in calls if c.startswith("install")]
    assert [p for p in installs[0] if not p.startswith("-")] == ["install", "maildrop"]
    _, calls, _ = run_test_sh(tmp_path / "all", uid=0, have=TOOLS)
    assert calls == []  # nothing missing: apt is not touched


def test_test_sh_says_what_it_skips_when_not_root(tmp_path):
    err, calls, python = run_test_sh(tmp_path, uid=1000, have=("procmail",))
    assert calls == []
    lines = err.splitlines()
    assert ("note: maildrop is not installed and not root, so its tests will be skipped "
            "(to run them: apt-get install maildrop as root)") in lines
    assert any(line.startswith("note: systemd-analyze is not installed") and "apt-get install systemd" in line
               for line in lines)
    assert any(line.startswith("note: dovecot is not installed") and "apt-get install dovecot-imapd" in line
               for line in lines)
    assert not any("procmail" in line for line in lines)
    assert python[-1] == "-m pytest -x -q"


def test_test_sh_never_installs_what_would_remove_another_package(tmp_path):
    err, calls, _ = run_test_sh(tmp_path, uid=0, have=all_but("dovecot", "exim4"),
                                would_remove=("exim4-daemon-heavy",))
    installs = [c.split() for c in calls if c.startswith("install")]
    assert [p for p in installs[0] if not p.startswith("-")] == ["install", "dovecot-imapd"]
    assert err.splitlines() == ["note: exim4 is not installed: installing exim4-daemon-heavy would remove postfix, "
                                "so its tests will be skipped"]


def test_test_sh_says_so_when_root_has_no_apt(tmp_path):
    err, _, _ = run_test_sh(tmp_path, uid=0, have=all_but("procmail"), apt=False)
    assert err.splitlines() == ["note: procmail is not installed and there is no apt-get, so its tests will "
                                "be skipped (to run them: apt-get install procmail as root)"]


# -- scripts/main.sh ends with the comparison against the gold labels ----------------------

from conftest import SAMPLE_INDEX, SAMPLE_MAILDIR, gold_labels  # noqa: E402
from test_e2e import SPAMNB  # noqa: E402


def classify_sample(model, fmt, cwd=ROOT):
    """``spamnb classify corpora/sample-maildir`` as main.sh runs it (from the repository root)."""
    proc = subprocess.run(SPAMNB + ["classify", "--model", str(model), "--format", fmt,
                                    os.path.relpath(SAMPLE_MAILDIR, cwd)],
                          capture_output=True, text=True, timeout=120, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def expected_report(model):
    """The report's numbers, computed here from classify's jsonl and the gold labels."""
    import json

    gold = gold_labels()
    table = {g: {f: 0 for f in ("ham", "unsure", "spam")} for g in ("ham", "spam")}
    for line in classify_sample(model, "jsonl").splitlines():
        row = json.loads(line)
        table[gold[os.path.basename(row["path"])]][row["label"]] += 1
    return table


def against_gold(classified: Path, index=SAMPLE_INDEX, cwd=ROOT):
    import sys

    return subprocess.run([sys.executable, str(ROOT / "scripts" / "against_gold.py"), str(classified),
                           os.path.relpath(index, cwd)], capture_output=True, text=True, timeout=60, cwd=cwd)


@pytest.mark.parametrize("fmt", ["table", "tsv", "jsonl"])
def test_against_gold_counts_what_classify_filed(trained_model_file, tmp_path, fmt):
    t = expected_report(trained_model_file)
    out = tmp_path / "classified"
    out.write_text(classify_sample(trained_model_file, fmt))
    proc = against_gold(out)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    n_ham, n_spam = sum(t["ham"].values()), sum(t["spam"].values())
    assert (n_ham, n_spam) == (73, 30)
    right = t["ham"]["ham"] + t["spam"]["spam"]
    assert lines[0] == "against the gold labels of corpora/sample-maildir.index (103 messages):"
    assert lines[2].split() == ["gold", "ham", *map(str, t["ham"].values())]
    assert lines[3].split() == ["gold", "spam", *map(str, t["spam"].values())]
    assert lines[4].startswith(f"accuracy: {right} of 103 filed right ({100 * right / 103:.1f}%;")
    assert lines[5].startswith(f"false positives (ham filed as spam): {t['ham']['spam']} of 73 ham (")
    assert lines[6].startswith(f"false negatives (spam filed as ham): {t['spam']['ham']} of 30 spam (")
    assert lines[7] == f"unsure: {t['ham']['unsure'] + t['spam']['unsure']} ({t['ham']['unsure']} ham, " \
                       f"{t['spam']['unsure']} spam)"


def test_against_gold_refuses_an_incomplete_comparison(trained_model_file, tmp_path):
    out = tmp_path / "classified"
    rows = classify_sample(trained_model_file, "tsv").splitlines()
    out.write_text("\n".join(rows[1:]) + "\n")  # one message missing
    proc = against_gold(out)
    assert proc.returncode == 1 and "1 gold message(s) not classified" in proc.stderr
    out.write_text("\n".join(rows) + "\n/elsewhere/msg\tspam\t0.99\t5.0\n")
    proc = against_gold(out)
    assert proc.returncode == 1 and "1 classified message(s) without a gold label" in proc.stderr


def test_main_sh_ends_with_the_comparison_against_the_gold_labels(trained_model_file, tmp_path):
    """scripts/main.sh in a sandbox: its venv step is a no-op and its `spamnb train`
    copies the test model instead of training for 15 s; classify is the real one."""
    import sys

    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for name in ("main.sh", "_venv.sh", "against_gold.py"):
        shutil.copy(ROOT / "scripts" / name, repo / "scripts" / name)
    (repo / "corpora").mkdir()
    os.symlink(SAMPLE_MAILDIR, repo / "corpora" / "sample-maildir")
    shutil.copy(SAMPLE_INDEX, repo / "corpora" / "sample-maildir.index")
    venv = repo / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text(f'#!/bin/bash\n[ "$1 $2" = "-m pip" ] && exit 0\nexec {sys.executable} "$@"\n')
    (venv / "spamnb").write_text(
        "#!/bin/bash\n"
        f'if [ "$1" = train ]; then mkdir -p out && cp {trained_model_file} out/model.joblib && exit 0; fi\n'
        f'exec {shlex.join(SPAMNB)} "$@"\n')
    for f in venv.iterdir():
        f.chmod(0o755)
    proc = subprocess.run(["bash", str(repo / "scripts" / "main.sh")], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["label", "P(spam)", "score", "message"]  # the table, as before
    assert sum(line.split()[-1].startswith("corpora/sample-maildir/cur/") for line in lines[1:104]) == 103
    assert lines[104] == ""  # a blank line between the table and the comparison
    report = lines[105:]
    out = tmp_path / "classified"
    out.write_text(classify_sample(trained_model_file, "table"))
    assert report == against_gold(out).stdout.splitlines()
    assert report[0] == "against the gold labels of corpora/sample-maildir.index (103 messages):"


def test_test_sh_finds_the_daemons_in_sbin_off_a_users_path(tmp_path):
    """dovecot and exim4 install to /usr/sbin, not on a user's PATH."""
    err, calls, _ = run_test_sh(tmp_path, uid=1000, have=all_but("dovecot", "exim4"), sbin=("dovecot", "exim4"))
    assert calls == [] and err == ""
    assert "SBIN:-/usr/sbin:/sbin" in (ROOT / "scripts" / "test.sh").read_text()  # where they are, by default


@pytest.mark.slow
def test_the_docs_classify_example_is_what_classify_prints(tmp_path):
    """The `classify` example of docs/cli.md, run as it is written, on the
    model its `train --index corpora/spamassassin.tar.xz` line makes (about a minute):
    the same header, first row and summary (all but the rate, which is the machine's)."""
    import re

    page = (ROOT / "docs" / "cli.md").read_text()
    block = re.search(r"## classify: one line per message\n\n```sh\n(.*?)```", page, re.S).group(1).splitlines()
    command = block[0].removeprefix("$ ").split()
    assert command[:2] == ["spamnb", "classify"] and command[-1] == "model.joblib"
    model = tmp_path / "model.joblib"
    train = subprocess.run(SPAMNB + ["train", "--index", "corpora/spamassassin.tar.xz", "--model", str(model)],
                           capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert train.returncode == 0, train.stderr
    proc = subprocess.run(SPAMNB + [*command[1:-1], str(model)], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert block[1:3] == out[:2]
    summary = re.sub(r" \(\d+ messages/s\)", "", proc.stderr.strip().splitlines()[-1])
    assert re.sub(r" \(\d+ messages/s\)\s+\(on stderr\)$", "", block[-1]) == summary
