"""A model without its compiled scorer (``cp model.joblib``): the filter says so,
rebuilds the scorer when that is safe, and never loses or changes mail doing it;
``spamnb info`` shows the scorer's state.

Through the installed command, as a delivery runs it (helpers of test_fastpath).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys

import pytest

from conftest import sample_message
from spamnb.model import SpamModel
from spamnb.mail.sources import iter_index
from spamnb.storage import modelfile, scorer, store
from spamnb.storage.modelfile import compile_scorer, load_and_compile, save_model
from test_e2e import SPAMNB
from test_fastpath import click_filter, compiled  # noqa: F401 (fixture)

HEAVY = ("numpy", "scipy", "joblib", "click")


def deliver(model, raw, *args):
    """The installed ``spamnb filter --model MODEL`` (no server)."""
    return subprocess.run(SPAMNB + ["filter", "--model", str(model), *args], input=raw, capture_output=True,
                          timeout=120, env={**os.environ, "SPAMNB_SOCKET": "/nonexistent/socket"})


def heavy_modules_of_a_delivery(model, raw):
    """The heavy modules one delivery imported (none on the fast path), and its output."""
    code = ("import os, sys\n"
            "real_exit = os._exit\n"
            "def report(code):\n"
            "    sys.stderr.write('HEAVY=' + ','.join(sorted(m for m in "
            f"{HEAVY!r} if m in sys.modules)))\n"
            "    sys.stderr.flush()\n"
            "    real_exit(code)\n"
            "os._exit = report\n"
            f"sys.argv = ['spamnb', 'filter', '--model', {str(model)!r}]\n"
            "from spamnb._entry import main\nmain()\n")
    proc = subprocess.run([sys.executable, "-c", code], input=raw, capture_output=True, timeout=120,
                          env={**os.environ, "SPAMNB_SOCKET": "/nonexistent/socket"})
    err = proc.stderr.decode()
    return err.rsplit("HEAVY=", 1)[1].split(",") if "HEAVY=" in err else ["<full path>"], proc


@pytest.fixture
def copied(compiled, tmp_path):
    """The compiled model copied elsewhere with cp, without its scorer."""
    path = tmp_path / "copy" / "model.joblib"
    path.parent.mkdir(mode=0o700)
    shutil.copyfile(compiled, path)
    path.chmod(0o600)
    return path


@pytest.fixture
def raw():
    return sample_message("spam", 1).read_bytes()


def test_a_copied_model_gets_its_scorer_back_at_the_first_delivery(copied, raw):
    want = click_filter(["--model", copied], raw)
    proc = deliver(copied, raw)
    assert (proc.stdout, proc.returncode) == want  # the same mail out, the same status
    err = proc.stderr.decode().splitlines()
    assert err == [f"spamnb filter: the compiled scorer of {copied} was missing: rebuilt it "
                   "(this delivery loaded the whole model; the next ones use the scorer)"]
    assert scorer.state(copied) == "fresh"
    assert stat.S_IMODE(os.stat(scorer.scorer_path(copied)).st_mode) == 0o600
    # the next delivery takes the fast path: no numpy, no click, nothing said
    heavy, proc = heavy_modules_of_a_delivery(copied, raw)
    assert heavy == [""], heavy
    assert (proc.stdout, proc.returncode) == want
    assert proc.stderr.decode() == "HEAVY="


def test_a_model_copied_with_its_scorer_is_stale_and_rebuilt(compiled, tmp_path, raw):
    path = tmp_path / "copy" / "model.joblib"
    path.parent.mkdir()
    shutil.copyfile(compiled, path)  # cp of both: another inode, so the scorer names another file
    shutil.copyfile(scorer.scorer_path(compiled), scorer.scorer_path(path))
    assert scorer.state(path) == "stale"
    proc = deliver(path, raw)
    assert (proc.stdout, proc.returncode) == click_filter(["--model", path], raw)
    assert b"was stale (compiled for another model file): rebuilt it" in proc.stderr
    assert scorer.state(path) == "fresh"
    # the rebuilt scorer is the one save_model writes: same weights, same keys
    a, b = scorer.load_scorer(scorer.scorer_path(path)), scorer.load_scorer(scorer.scorer_path(compiled))
    assert (a.bias, list(a._keys), list(a._weights)) == (b.bias, list(b._keys), list(b._weights))


@pytest.mark.parametrize("breakage", ["damaged", "untrusted"])
def test_a_damaged_or_untrusted_scorer_is_replaced(compiled, raw, breakage):
    path = scorer.scorer_path(compiled)
    if breakage == "damaged":
        open(path, "wb").write(b"SPAMNBSC" + b"\0" * 100)
    else:
        os.chmod(path, 0o666)
    assert scorer.state(compiled) == breakage
    proc = deliver(compiled, raw)
    assert (proc.stdout, proc.returncode) == click_filter(["--model", compiled], raw)
    assert b"rebuilt it" in proc.stderr
    assert scorer.state(compiled) == "fresh"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_no_rebuild_for_an_untrusted_model(copied, raw):
    """--allow-insecure-model lets the filter use a group-writable model, never compile it."""
    copied.chmod(0o664)
    proc = deliver(copied, raw, "--allow-insecure-model")
    assert (proc.stdout, proc.returncode) == click_filter(["--model", copied, "--allow-insecure-model"], raw)
    err = proc.stderr.decode()
    assert "was missing; not rebuilt (refusing to load model" in err and "every delivery loads" in err
    assert len(err.splitlines()) == 1
    assert not os.path.exists(scorer.scorer_path(copied))
    # and without the flag the model is refused as before: mail passed through, exit 3
    proc = deliver(copied, raw)
    assert proc.returncode == 3 and proc.stdout == raw
    assert not os.path.exists(scorer.scorer_path(copied))


def test_a_scorer_that_cannot_be_written_loses_no_mail(copied, raw):
    os.mkdir(scorer.scorer_path(copied))  # something in the way that a rename cannot replace
    proc = deliver(copied, raw)
    assert (proc.stdout, proc.returncode) == click_filter(["--model", copied], raw)
    assert b"not rebuilt (cannot write the scorer" in proc.stderr


def test_models_that_can_have_no_scorer_are_not_rebuilt_and_not_noted(small_corpus, tmp_path, raw):
    model = SpamModel(alpha=0.0)  # infinite weights: only the full path scores it
    model.learn((m.raw, m.label) for m in iter_index(str(small_corpus.index)))
    path = tmp_path / "zero.joblib"
    save_model(model, path)
    proc = deliver(path, raw)
    assert (proc.stdout, proc.returncode) == click_filter(["--model", path], raw)
    assert proc.stderr == b""
    assert not os.path.exists(scorer.scorer_path(path))


# -- in process: the cases a test run as root cannot make through the command -----------------


def test_not_rebuilt_in_a_folder_we_cannot_write(copied, monkeypatch):
    monkeypatch.setattr(modelfile.os, "access", lambda path, mode: False)
    model, note = load_and_compile(copied, "missing")
    assert model.messages.tolist() == [150, 150]
    assert note == (f"the compiled scorer of {copied} was missing; not rebuilt (cannot write the scorer of "
                    f"{copied}: its folder {copied.parent} is not writable by you), so every delivery loads "
                    f"the whole model (slow); rebuild it with `spamnb info --rebuild-scorer --model "
                    f"{copied}` as a user who can write its folder")
    assert not os.path.exists(scorer.scorer_path(copied))


def test_any_failure_of_the_rebuild_leaves_the_model_usable(copied, monkeypatch):
    """The rebuild is a shortcut: whatever goes wrong in it, the caller gets the model."""
    def boom(*args, **kw):
        raise RuntimeError("boom")

    monkeypatch.setattr(scorer, "write_scorer", boom)
    model, note = load_and_compile(copied, "stale")
    assert model.messages.tolist() == [150, 150]
    assert note.startswith(f"the compiled scorer of {copied} was stale (compiled for another model file); "
                           "not rebuilt (RuntimeError: boom), so every delivery loads the whole model")


def test_no_rebuild_while_a_learner_holds_the_lock(copied):
    with store.model_lock(copied):
        model, note = load_and_compile(copied, "missing")
    assert model is not None and note is None  # the learner's save writes a scorer of its own
    assert not os.path.exists(scorer.scorer_path(copied))


def test_a_model_replaced_while_it_is_read_gets_no_scorer(copied, trained_model, monkeypatch):
    """The scorer is keyed to the file its weights came from: if the file changes
    while it is loaded (a writer that ignores the lock), nothing is written."""
    real_load = modelfile.load_snapshot

    def load_then_replace(path, **kw):
        model = real_load(path, **kw)
        other = trained_model.__class__.from_state(trained_model.to_state())
        other.learn([(sample_message("ham", 4).read_bytes(), "spam")])
        store.save_atomic(other.to_state(), path)  # no scorer: as a foreign writer would
        return model

    monkeypatch.setattr(modelfile, "load_snapshot", load_then_replace)
    model, outcome = compile_scorer(copied)
    assert outcome == "changed"
    assert not os.path.exists(scorer.scorer_path(copied))


# -- spamnb info -----------------------------------------------------------------------------


def info(*args):
    proc = subprocess.run(SPAMNB + ["info", *map(str, args)], capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = dict(line.split(":", 1) for line in proc.stdout.decode().splitlines())
    return rows["scorer"].strip(), proc.stderr.decode()


def test_info_shows_the_scorers_state_and_rebuilds_it(compiled, copied, small_corpus, tmp_path):
    assert info("--model", compiled)[0] == f"fresh ({scorer.scorer_path(compiled)})"
    state, _ = info("--model", copied)
    assert state.startswith("missing: each delivery loads the whole model until it is rebuilt")
    shutil.copyfile(scorer.scorer_path(compiled), scorer.scorer_path(copied))
    assert info("--model", copied)[0].startswith("stale (compiled for another model file): ")
    state, err = info("--model", copied, "--rebuild-scorer")
    assert err == f"scorer of {copied}: rebuilt\n"
    assert state == f"fresh ({scorer.scorer_path(copied)})"
    hashed = SpamModel(hash_features=4096)
    hashed.learn((m.raw, m.label) for m in iter_index(str(small_corpus.index)))
    save_model(hashed, tmp_path / "hashed.joblib")
    assert info("--model", tmp_path / "hashed.joblib")[0].startswith("none: its features are hashed")


def test_info_rebuild_refuses_an_untrusted_model(copied):
    copied.chmod(0o664)
    proc = subprocess.run(SPAMNB + ["info", "--model", str(copied), "--allow-insecure-model",
                                    "--rebuild-scorer"], capture_output=True, timeout=120)
    assert proc.returncode == 1 and b"writable by group or others" in proc.stderr
    assert not os.path.exists(scorer.scorer_path(copied))


def test_a_resident_server_serves_the_rebuilt_scorer_at_once(copied, raw):
    """spamnb serve / web keep a ModelHolder: after rebuilding a copied model's scorer it
    serves that scorer, not the whole model it loaded to rebuild it (until the next save)."""
    from spamnb.storage.filestore import ModelHolder
    from spamnb.storage.scorer import Scorer

    said = []
    holder = ModelHolder(copied, log=said.append)
    model = holder.get().model
    assert isinstance(model, Scorer), type(model)
    assert any("was missing: rebuilt it" in line for line in said)
    assert scorer.state(copied) == "fresh"
    assert holder.get().model is model  # and it stays: nothing changed on disk
