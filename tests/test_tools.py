"""The folders of the project's own tools (tools/) and the user's scripts (scripts/).

Every script answers --help from where it is (so its imports of its neighbours,
tools.KIND.NAME, and of spamnb resolve), and each folder's README lists each of its files.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import ROOT

TOOLS = ROOT / "tools"
KINDS = ("benchmarks", "studies", "harnesses", "generators")
# imported by the scripts, never run
LIBRARIES = {"tools/shared_corpora.py", "tools/studies/peers.py"}


def python_files(folder):
    return sorted(p for p in folder.glob("*.py") if p.name != "__init__.py")


SCRIPTS = [p for kind in KINDS for p in python_files(TOOLS / kind)
           if p.relative_to(ROOT).as_posix() not in LIBRARIES] + [ROOT / "scripts" / "against_gold.py"]


def test_tools_holds_the_four_kinds_and_scripts_what_a_user_runs():
    assert sorted(p.name for p in TOOLS.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(KINDS)
    extra = sorted(p.name for p in (ROOT / "scripts").iterdir() if p.name != "__pycache__"
                   and p.name not in ("_venv.sh", "against_gold.py", "main.sh", "test.sh"))
    assert extra == [], (
        "scripts/ holds what a user runs (the README's two commands and their helpers): move "
        f"{', '.join(extra)} to tools/benchmarks, tools/studies, tools/harnesses or tools/generators "
        "(git mv), import neighbours as `from tools import shared_corpora` / `from tools.KIND import NAME` "
        "with the project root on sys.path, and list it in that folder's README.md")


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.relative_to(ROOT).as_posix() for p in SCRIPTS])
def test_each_script_answers_help_from_its_place(script, tmp_path):
    """Run as the READMEs say (python PATH --help), from another folder and without
    PYTHONPATH: nothing may depend on the current folder."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip(), "no help printed"
    assert proc.stderr == ""
    assert "scripts/" + script.name not in proc.stdout or script.parent.name == "scripts"  # no old path


@pytest.mark.parametrize("kind", KINDS)
def test_each_folder_readme_lists_each_file_with_its_command(kind):
    readme = (TOOLS / kind / "README.md").read_text(encoding="utf-8")
    for path in python_files(TOOLS / kind):
        assert f"`{path.name}`" in readme, f"tools/{kind}/README.md does not list {path.name}"
        if path.relative_to(ROOT).as_posix() not in LIBRARIES:
            assert f"python tools/{kind}/{path.name}" in readme, f"tools/{kind}/README.md: no command for {path.name}"


def test_the_kinds_import_one_way():
    """Benchmarks may use the studies' and the harnesses' helpers (tools/README.md); nothing
    else imports a benchmark, so each helper has one home and no cycle."""
    imports = [f"{p.relative_to(ROOT)}" for kind in KINDS if kind != "benchmarks" for p in python_files(TOOLS / kind)
               if "tools.benchmarks" in p.read_text(encoding="utf-8")]
    assert imports == []


def test_the_libraries_are_imported_not_run():
    for rel in LIBRARIES:
        assert "__main__" not in (ROOT / rel).read_text(encoding="utf-8"), rel


def test_no_file_names_a_script_at_its_old_place():
    """Docs, code and tests name tools/KIND/NAME.py, never scripts/NAME.py for a moved script."""
    moved = {p.name for kind in KINDS for p in python_files(TOOLS / kind)} | {"shared_corpora.py"}
    files = [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("corpora/*.md"), *ROOT.glob("tools/**/*.py"),
             *ROOT.glob("tools/**/*.md"), *ROOT.glob("spamnb/**/*.py"), *ROOT.glob("tests/*.py"),
             *ROOT.glob("tests/*/README.md")]
    stale = [f"{f.relative_to(ROOT)}: scripts/{name}" for f in files for name in moved
             if f"scripts/{name}" in f.read_text(encoding="utf-8") and f.name != "test_tools.py"]
    assert stale == []
