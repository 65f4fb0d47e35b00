"""The README's Quick start install has the default model.

``pip install .`` into a fresh venv, a fresh HOME with no model and no
``$SPAMNB_CORPUS``: the installed package carries the corpus the default model
is built from (``spamnb/data``), so ``spamnb info`` works and ``spamnb filter``
tags a message, as the README promises. The venv gets this project from the
wheel pip builds; its dependencies (numpy, scipy, ...) are the running
interpreter's, reached through a ``.pth`` line, so the test needs no download
but pip's build backend (setuptools, from PyPI or pip's cache).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from conftest import SAMPLE_MAILDIR

from spamnb.storage import locate

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """``(venv python, its site-packages)``: this checkout installed with ``pip install .``."""
    tmp = tmp_path_factory.mktemp("install")
    venv = tmp / "venv"
    # Without a pip of its own (ensurepip took half this fixture's time): this interpreter's
    # pip installs into it (pip --python), as the venv's own would.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    build = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
                            str(ROOT)], capture_output=True, text=True, timeout=600, cwd=tmp)
    if build.returncode != 0:
        if "No matching distribution found for setuptools" in build.stderr or "Network" in build.stderr:
            pytest.skip(f"pip cannot get the build backend (setuptools): {build.stderr.strip()[-200:]}")
        raise AssertionError(build.stderr)
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # the dependencies, not this checkout: only the folders of numpy & co. (no editable finder runs)
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return py, site


def fresh_env(tmp_path, py):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    return {"PATH": f"{py.parent}:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8"}


def test_the_installed_package_carries_the_corpus_of_the_default_model(installed, tmp_path):
    py, site = installed
    code = ("import spamnb; from spamnb.storage.modelfile import shipped_corpus; "
            "print(spamnb.__file__, shipped_corpus())")
    out = subprocess.run([str(py), "-c", code], capture_output=True, text=True, env=fresh_env(tmp_path, py),
                         cwd=tmp_path, check=True).stdout.split()
    assert out[0].startswith(site)  # the installed copy, not the source tree
    assert out[1] == str(Path(site, "spamnb", "data", "spamassassin.tar.xz"))
    assert Path(out[1]).stat().st_size == (ROOT / "spamnb" / "data" / "spamassassin.tar.xz").stat().st_size
    assert Path(site, "spamnb", "data", "spamassassin.PROVENANCE").exists()  # with its licence notes


@pytest.mark.slow
def test_a_fresh_home_filters_with_the_default_model_built_from_the_install(installed, tmp_path):
    """About 2 minutes: the default model is trained on the whole shipped corpus."""
    py, _ = installed
    env = fresh_env(tmp_path, py)
    spamnb = str(py.parent / "spamnb")
    raw = sorted((SAMPLE_MAILDIR / "cur").iterdir())[0].read_bytes()
    out = subprocess.run([spamnb, "filter"], input=raw, capture_output=True, env=env, cwd=tmp_path, timeout=900)
    assert out.returncode in (0, 1, 2), out.stderr.decode()
    assert b"X-Spam-Status: " in out.stdout and b"model=default" in out.stdout
    assert b"using the default model" in out.stderr
    info = subprocess.run([spamnb, "info"], capture_output=True, env=env, cwd=tmp_path, timeout=120)
    assert info.returncode == 0, info.stderr.decode()
    assert os.path.exists(Path(env["HOME"]) / ".cache" / "spamnb" / f"default-model-{locate.DEFAULT_RECIPE}.joblib")


def quick_start_block() -> str:
    """The README's first Quick start block, as a person pastes it."""
    text = (ROOT / "README.md").read_text()
    return text.split("## Quick start: your own mailbox", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]


@pytest.mark.slow
def test_the_quick_start_works_pasted_into_a_fresh_accounts_shell(tmp_path):
    """About 2 minutes (pip installs spamnb and its dependencies, as the README says). The
    block runs as written, line after line, in a shell with a fresh HOME and the PATH a
    login gives a new account, which has no ``~/.local/bin`` yet (Debian's ``~/.profile``
    adds it only when it exists at login): every line must work there, ``spamnb setup
    --install`` included, not only after the next login."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/games", "HOME": str(home), "LANG": "C.UTF-8",
           # where pip keeps what it downloaded: this user's cache, so a second run downloads nothing
           "PIP_CACHE_DIR": os.environ.get("PIP_CACHE_DIR", str(Path.home() / ".cache" / "pip")),
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    shell = subprocess.run(["bash", "-e"], input=quick_start_block(), capture_output=True, text=True, env=env,
                           cwd=ROOT, timeout=1200)
    said = shell.stdout + shell.stderr
    if shell.returncode != 0 and ("No matching distribution" in said or "NewConnectionError" in said):
        pytest.skip(f"pip cannot reach the package index: {said.strip()[-200:]}")
    assert shell.returncode == 0, said[-2000:]
    assert "command not found" not in said
    spamnb = home / ".local" / "bin" / "spamnb"
    assert f"| {spamnb} filter --exit-zero -u" in (home / ".procmailrc").read_text()
    assert (home / "Maildir" / ".Junk").is_dir() and (home / "Maildir" / ".Unsure").is_dir()
    assert subprocess.run([str(spamnb), "--version"], capture_output=True, env=env).returncode == 0
    assert any((home / ".local" / "share" / "man" / "man1").glob("spamnb*.1"))
