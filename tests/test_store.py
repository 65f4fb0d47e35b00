"""Tests for spamnb.storage.store: atomic saves, trust checks on load, the model lock."""

import multiprocessing
import os
import pickle
import signal
import stat
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from spamnb.storage.locate import default_model_path
from spamnb.storage.store import ModelError, load_checked, model_lock, save_atomic

is_root = hasattr(os, "geteuid") and os.geteuid() == 0
needs_root = pytest.mark.skipif(not is_root, reason="os.chown to another user needs root")


def model_like():
    """Something shaped like a real model: arrays, a token list, scalars."""
    rng = np.random.default_rng(0)
    return {
        "feature_count": rng.integers(0, 50, size=(2, 5000)).astype(np.float64),
        "class_count": np.array([4150.0, 1896.0]),
        "tokens": [f"token{i}" for i in range(5000)],
        "alpha": 1.0,
    }


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], np.ndarray):
            np.testing.assert_array_equal(a[k], b[k])
        else:
            assert a[k] == b[k]


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


class Bomb:
    """Pickling it raises: a save that fails midway through the stream."""

    def __reduce__(self):
        raise RuntimeError("cannot pickle this")


# -- saving ------------------------------------------------------------------


@pytest.mark.parametrize("compress", [0, 3])
def test_roundtrip_and_mode_0600(tmp_path, compress):
    path = tmp_path / "model.joblib"
    obj = model_like()
    save_atomic(obj, path, compress=compress)
    assert mode(path) == 0o600
    assert_same(load_checked(path), obj)
    assert [p.name for p in tmp_path.iterdir()] == ["model.joblib"]  # no temp left


def test_save_creates_private_parent_folders(tmp_path):
    path = tmp_path / "data" / "spamnb" / "model.joblib"
    save_atomic([1, 2], str(path))
    assert load_checked(str(path)) == [1, 2]
    assert mode(path.parent) == 0o700


def test_failed_save_leaves_old_file_and_no_temp(tmp_path):
    path = tmp_path / "model.joblib"
    save_atomic({"version": 1}, path)
    before = path.read_bytes()
    # the big array is written before the Bomb explodes, so the temp file was non-empty
    with pytest.raises(ModelError, match=rf"cannot save model to {path}: RuntimeError: cannot pickle"):
        save_atomic([np.zeros(100_000), Bomb()], path)
    assert path.read_bytes() == before
    assert load_checked(path) == {"version": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["model.joblib"]


def test_interrupted_save_cleans_up_and_propagates(tmp_path):
    class Interrupt:
        def __reduce__(self):
            raise KeyboardInterrupt

    path = tmp_path / "model.joblib"
    save_atomic("old", path)
    with pytest.raises(KeyboardInterrupt):
        save_atomic([np.zeros(1000), Interrupt()], path)
    assert load_checked(path) == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["model.joblib"]


def test_process_killed_midway_keeps_old_model(tmp_path):
    # A SIGKILL during joblib.dump: nothing can clean up, the old model must survive.
    path = tmp_path / "model.joblib"
    save_atomic({"version": 1}, path)
    code = textwrap.dedent(f"""
        import os, signal
        import numpy as np
        from spamnb.storage.store import save_atomic
        class Die:
            def __reduce__(self):
                os.kill(os.getpid(), signal.SIGKILL)
        save_atomic([np.ones(200_000), Die()], {str(path)!r})
    """)
    proc = subprocess.run([sys.executable, "-c", code])
    assert proc.returncode == -signal.SIGKILL
    assert load_checked(path) == {"version": 1}
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "model.joblib"]
    assert len(leftovers) == 1 and leftovers[0].startswith(".model.joblib.")
    assert leftovers[0].endswith(".tmp")


def test_save_keeps_existing_mode_minus_group_world_write(tmp_path):
    path = tmp_path / "model.joblib"
    save_atomic(1, path)
    os.chmod(path, 0o640)
    save_atomic(2, path)
    assert mode(path) == 0o640
    os.chmod(path, 0o666)
    save_atomic(3, path)
    assert mode(path) == 0o644
    assert load_checked(path) == 3


def test_save_into_unwritable_place(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file, not a folder")
    with pytest.raises(ModelError, match="cannot save model to .*file/model.joblib"):
        save_atomic(1, blocker / "model.joblib")


# -- loading -----------------------------------------------------------------


def test_missing_model_names_path(tmp_path):
    path = tmp_path / "nope.joblib"
    with pytest.raises(ModelError, match=f"no model at {path}"):
        load_checked(path)


def test_not_a_regular_file(tmp_path):
    with pytest.raises(ModelError, match="not a regular file"):
        load_checked(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ModelError, match="not a regular file"):  # and does not hang
        load_checked(fifo)


@pytest.mark.parametrize("bad_mode", [0o620, 0o602, 0o666])
def test_refuses_group_or_world_writable(tmp_path, bad_mode):
    path = tmp_path / "model.joblib"
    save_atomic("ok", path)
    os.chmod(path, bad_mode)
    with pytest.raises(ModelError) as err:
        load_checked(path)
    msg = str(err.value)
    assert str(path) in msg and "writable by group or others" in msg
    assert f"chmod go-w {path}" in msg and "--allow-insecure-model" in msg
    assert load_checked(path, allow_insecure=True) == "ok"


def test_refuses_model_in_writable_folder_unless_sticky(tmp_path):
    folder = tmp_path / "shared"
    path = folder / "model.joblib"
    save_atomic("ok", path)
    os.chmod(folder, 0o777)
    with pytest.raises(ModelError, match="its folder .*shared is writable by group or others"):
        load_checked(path)
    assert load_checked(path, allow_insecure=True) == "ok"
    os.chmod(folder, 0o1777)  # like /tmp: others cannot replace our file
    assert load_checked(path) == "ok"


@needs_root
def test_refuses_foreign_owned_file(tmp_path):
    path = tmp_path / "model.joblib"
    save_atomic("ok", path)
    os.chown(path, 1, 1)  # daemon
    with pytest.raises(ModelError) as err:
        load_checked(path)
    msg = str(err.value)
    assert str(path) in msg and "owned by uid 1" in msg and "--allow-insecure-model" in msg
    assert load_checked(path, allow_insecure=True) == "ok"


@needs_root
def test_refuses_model_in_foreign_owned_folder(tmp_path):
    folder = tmp_path / "theirs"
    path = folder / "model.joblib"
    save_atomic("ok", path)
    os.chown(folder, 1, 1)
    with pytest.raises(ModelError, match="its folder .*theirs is owned by uid 1"):
        load_checked(path)
    assert load_checked(path, allow_insecure=True) == "ok"


def test_root_owned_files_are_trusted_for_other_users(tmp_path):
    # A system-wide model installed by root may be used by everyone.
    code = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))!r})
        import spamnb.storage.store as store
        store.os.geteuid = lambda: 1000      # pretend to be an ordinary user
        print(store.load_checked({str(tmp_path / "model.joblib")!r}))
    """)
    save_atomic("system model", tmp_path / "model.joblib")
    if not is_root:
        pytest.skip("needs a root-owned file")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "system model"


@pytest.mark.parametrize("compress", [0, 3])
def test_truncated_model_is_a_model_error(tmp_path, compress):
    path = tmp_path / "model.joblib"
    save_atomic(model_like(), path, compress=compress)
    data = path.read_bytes()
    for cut in (len(data) // 2, 10, 0):
        path.write_bytes(data[:cut])
        with pytest.raises(ModelError, match=f"{path} is not a spamnb model file, or it is corrupt or truncated"):
            load_checked(path)


def test_garbage_is_a_model_error(tmp_path):
    path = tmp_path / "model.joblib"
    rng = np.random.default_rng(42)
    for _ in range(20):
        path.write_bytes(rng.bytes(int(rng.integers(1, 4000))))
        with pytest.raises(ModelError, match="not a spamnb model file, or it is corrupt or truncated"):
            load_checked(path)
    path.write_bytes(b"\x80\x04K\x01")  # pickle opcodes with no STOP
    with pytest.raises(ModelError, match="corrupt or truncated"):
        load_checked(path)


def test_model_from_missing_module_is_a_model_error(tmp_path):
    path = tmp_path / "model.joblib"
    # A pickle of a class in a module that does not exist (e.g. renamed since).
    path.write_bytes(b"\x80\x04\x95\x1c\x00\x00\x00\x00\x00\x00\x00\x8c\x0bno_such_mod"
                     b"\x94\x8c\x03Cls\x94\x93\x94)\x81\x94.")
    with pytest.raises(ModelError, match="incompatible version"):
        load_checked(path)
    path.write_bytes(pickle.dumps(0).replace(b"K\x00", b"\x8c\x06spamnb\x8c\x05Nope_\x93"))
    with pytest.raises(ModelError, match="incompatible version"):
        load_checked(path)


# -- locking -----------------------------------------------------------------


def _increment_many(path, n):
    for _ in range(n):
        with model_lock(path):
            value = load_checked(path)
            save_atomic(value + 1, path)


def test_lock_serialises_two_writer_processes(tmp_path):
    path = str(tmp_path / "counter.joblib")
    save_atomic(0, path)
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_increment_many, args=(path, 50)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert load_checked(path) == 100


def test_lock_file_mode_and_timeout(tmp_path):
    path = tmp_path / "model.joblib"
    with model_lock(path) as lock_path:
        assert lock_path == f"{path}.lock"
        assert mode(lock_path) == 0o600
        # flock locks belong to the open file, so a second open conflicts even in-process
        with pytest.raises(ModelError, match=f"timed out after 0.05s waiting for the lock on model {path}"):
            with model_lock(path, timeout=0.05):
                pass
        with pytest.raises(ModelError, match="timed out"):
            with model_lock(path, shared=True, timeout=0):
                pass
    with model_lock(path, timeout=0):  # released
        pass


def test_shared_locks_coexist_and_block_writers(tmp_path):
    path = tmp_path / "model.joblib"
    with model_lock(path, shared=True), model_lock(path, shared=True, timeout=0):
        with pytest.raises(ModelError, match="timed out"):
            with model_lock(path, timeout=0.02):
                pass


def test_lock_refuses_symlinked_lock_file(tmp_path):
    path = tmp_path / "model.joblib"
    os.symlink(tmp_path / "elsewhere", f"{path}.lock")
    with pytest.raises(ModelError, match="cannot open lock file"):
        with model_lock(path):
            pass
    assert not (tmp_path / "elsewhere").exists()


# -- default path --------------------------------------------------------------


def test_default_model_path():
    assert default_model_path({"SPAMNB_MODEL": "/m/x.joblib", "XDG_DATA_HOME": "/d"}) == "/m/x.joblib"
    assert default_model_path({"SPAMNB_MODEL": "", "XDG_DATA_HOME": "/d", "HOME": "/h"}) == \
        "/d/spamnb/model.joblib"
    assert default_model_path({"XDG_DATA_HOME": "relative", "HOME": "/h"}) == \
        "/h/.local/share/spamnb/model.joblib"
    assert default_model_path({"HOME": "/h"}) == "/h/.local/share/spamnb/model.joblib"
