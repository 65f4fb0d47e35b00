"""The man pages in man/: generated from the click definitions, committed, readable.

``python tools/generators/make_manpages.py`` writes them; these tests fail when a
command, an option or a help text changed without the pages being regenerated,
when ``man`` warns about a page, and when the wheel would not install them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from conftest import ROOT

GENERATOR = ROOT / "tools" / "generators" / "make_manpages.py"
MAN = ROOT / "man"
REGENERATE = "regenerate them with `python tools/generators/make_manpages.py` and commit man/"


def generator(*args):
    return subprocess.run([sys.executable, str(GENERATOR), *args], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))


def test_regenerating_the_pages_changes_nothing():
    proc = generator("--check")
    assert proc.returncode == 0, f"man/ is out of date with the click definitions: {REGENERATE}\n{proc.stderr}"


def test_a_page_per_command_and_group(tmp_path):
    """spamnb(1), spamnb-COMMAND(1) for each command, spamnb-GROUP-COMMAND(1) inside a group;
    the generator writes the same pages into an empty folder."""
    from click import Group

    from spamnb.cli import main

    names = {"spamnb.1"}
    for name, command in main.commands.items():
        names.add(f"spamnb-{name}.1")
        if isinstance(command, Group):
            names |= {f"spamnb-{name}-{sub}.1" for sub in command.commands}
    assert {p.name for p in MAN.glob("*.1")} == names, REGENERATE
    assert {"spamnb-train.1", "spamnb-filter.1", "spamnb-imap.1", "spamnb-imap-filter.1"} <= names
    proc = generator("--dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)
    for page in tmp_path.iterdir():
        assert page.read_text() == (MAN / page.name).read_text()


def test_a_stale_page_is_found_and_rewritten(tmp_path):
    shutil.copytree(MAN, tmp_path / "man")
    (tmp_path / "man" / "spamnb-train.1").write_text(".TH OLD 1\n")
    (tmp_path / "man" / "spamnb-gone.1").write_text(".TH GONE 1\n")
    proc = generator("--check", "--dir", str(tmp_path / "man"))
    assert proc.returncode == 1
    assert "spamnb-train.1" in proc.stderr and "spamnb-gone.1" in proc.stderr
    assert generator("--dir", str(tmp_path / "man")).returncode == 0
    assert not (tmp_path / "man" / "spamnb-gone.1").exists()
    assert generator("--check", "--dir", str(tmp_path / "man")).returncode == 0


@pytest.mark.skipif(shutil.which("man") is None, reason="man is not installed (Debian's man-db)")
@pytest.mark.parametrize("page", sorted(p.name for p in MAN.glob("*.1")))
def test_man_renders_each_page_without_a_warning(page):
    proc = subprocess.run(["man", "--warnings", "-l", str(MAN / page)], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, MANWIDTH="80", MANPAGER="cat", PAGER="cat"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", f"man --warnings -l man/{page}:\n{proc.stderr}"
    text = proc.stdout
    assert "NAME" in text and "SYNOPSIS" in text and "OPTIONS" in text and "SEE ALSO" in text
    assert "--help" in text  # every command has it: the options really are there


def test_the_pages_say_what_help_says():
    """The filter page carries the procmail recipe as written (a `\\b` block kept line for line)."""
    proc = subprocess.run(["man", "-l", str(MAN / "spamnb-filter.1")], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, MANWIDTH="100", MANPAGER="cat", PAGER="cat"))
    if proc.returncode != 0:
        pytest.skip(f"man cannot render: {proc.stderr.strip()}")
    lines = [x.strip() for x in proc.stdout.splitlines()]
    recipe = [":0fw", "| /usr/local/bin/spamnb filter --exit-zero -u", ":0", "* ^X-Spam-Flag: YES", ".Junk/", ":0",
              "* ^X-Spam-Status: No, .*tests=SPAMNB_UNSURE", ".Unsure/"]
    start = lines.index(recipe[0])
    assert lines[start:start + len(recipe)] == recipe
    assert any("--exit-zero" in x for x in lines)


def test_the_wheel_installs_the_pages_under_share_man_man1(tmp_path):
    """Built as pip builds it (setuptools from PyPI in an isolated build), from a copy of what
    the wheel is made of: each page lands in the wheel's data under share/man/man1."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("bin", "spamnb", "man"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"),
                           str(src)], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 and "No matching distribution found for setuptools" in proc.stderr:
        pytest.skip("pip cannot fetch setuptools for the build (no package index)")
    assert proc.returncode == 0, proc.stderr
    (wheel,) = (tmp_path / "dist").glob("spamnb-*.whl")
    with zipfile.ZipFile(wheel) as z:
        installed = {n.rsplit("/", 1)[1] for n in z.namelist() if "/data/share/man/man1/" in n}
    assert installed == {p.name for p in MAN.glob("*.1")}
