"""The scripts of the README's two commands, run in a sandbox: ``scripts/test.sh``'s
install step with stand-ins for apt-get and id, and the gold comparison that
ends ``scripts/main.sh``."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT

APT_STUB = """#!/bin/bash
# apt-get stand-in: logs its arguments; "install PKG..." makes each package's command.
echo "$*" >> {log}
if [ "$1" = install ]; then
    for arg in "$@"; do
        case "$arg" in
            procmail|maildrop) printf '#!/bin/bash\\n' > {bin}/"$arg"; chmod +x {bin}/"$arg" ;;
            systemd) printf '#!/bin/bash\\n' > {bin}/systemd-analyze; chmod +x {bin}/systemd-analyze ;;
        esac
    done
fi
"""


def run_test_sh(tmp_path: Path, uid: int, have=(), apt=True):
    """``bash scripts/test.sh`` in a copy of the scripts, with a PATH holding only
    stand-ins: ``id`` (says ``uid``), ``apt-get`` (when ``apt``), the commands of
    ``have``, and a ``.venv/bin/python`` that logs what it is asked to run.
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
        stubs["apt-get"] = APT_STUB.format(log=log, bin=bin_)
    for name, text in stubs.items():
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    (repo / ".venv" / "bin" / "python").write_text(f'#!/bin/bash\necho "$*" >> {py_log}\n')
    (repo / ".venv" / "bin" / "python").chmod(0o755)
    os.symlink(shutil.which("dirname"), bin_ / "dirname")
    proc = subprocess.run(["/bin/bash", str(repo / "scripts" / "test.sh"), "-x", "-q"], capture_output=True,
                          text=True, timeout=60, env={"PATH": str(bin_), "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    calls = log.read_text().splitlines() if log.exists() else []
    return proc.stderr, calls, py_log.read_text().splitlines()


def test_test_sh_installs_procmail_maildrop_and_systemd_as_root(tmp_path):
    err, calls, python = run_test_sh(tmp_path, uid=0)
    installs = [c.split() for c in calls if c.startswith("install")]
    assert len(installs) == 1
    assert {"procmail", "maildrop", "systemd"} <= set(installs[0])
    assert "note:" not in err
    assert python[-1] == "-m pytest -x -q"  # then the suite, with the arguments given


def test_test_sh_installs_only_what_is_missing(tmp_path):
    err, calls, _ = run_test_sh(tmp_path, uid=0, have=("procmail", "systemd-analyze"))
    installs = [c.split() for c in calls if c.startswith("install")]
    assert [p for p in installs[0] if not p.startswith("-")] == ["install", "maildrop"]
    _, calls, _ = run_test_sh(tmp_path / "all", uid=0, have=("procmail", "maildrop", "systemd-analyze"))
    assert calls == []  # nothing missing: apt is not touched


def test_test_sh_says_what_it_skips_when_not_root(tmp_path):
    err, calls, python = run_test_sh(tmp_path, uid=1000, have=("procmail",))
    assert calls == []
    lines = err.splitlines()
    assert ("note: maildrop is not installed and not root, so its tests will be skipped "
            "(to run them: apt-get install maildrop as root)") in lines
    assert any(line.startswith("note: systemd-analyze is not installed") and "apt-get install systemd" in line
               for line in lines)
    assert not any("procmail" in line for line in lines)
    assert python[-1] == "-m pytest -x -q"


def test_test_sh_says_so_when_root_has_no_apt(tmp_path):
    err, _, _ = run_test_sh(tmp_path, uid=0, have=("maildrop", "systemd-analyze"), apt=False)
    assert err.splitlines() == ["note: procmail is not installed and there is no apt-get, so its tests will "
                                "be skipped (to run them: apt-get install procmail as root)"]
