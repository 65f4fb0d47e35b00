"""``spamnb serve`` and the filter's use of it: same answers as the cold path,
concurrency, reload on change, limits, fallback, privacy and a clean stop."""

from __future__ import annotations

import math
import os
import signal
import socket
import stat
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import sample_message
from spamnb._version import __version__
from spamnb.delivery import fastfilter, server, wire
from spamnb.storage import filestore
from spamnb.storage.filestore import FileBackend
from spamnb.verdict import EXIT_CODES
from test_e2e import SPAMNB
from test_fastpath import ODD_INPUTS, click_filter, compiled, messages  # noqa: F401 (fixture)

START_TIMEOUT = 60



@pytest.fixture
def sock_path(tmp_path):
    return str(tmp_path / "run" / "socket")


def start_server(sock_path, model, *extra):
    proc = subprocess.Popen(SPAMNB + ["serve", "--socket", sock_path, "--model", str(model), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited: {proc.stderr.read().decode()}")
        if os.path.exists(sock_path):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                try:
                    s.connect(sock_path)
                    return proc
                except OSError:
                    pass
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("server did not start")


@pytest.fixture
def serving(request, compiled, sock_path):
    """A server on a private socket for the compiled model; killed at the end whatever happens."""
    extra = getattr(request, "param", ())
    proc = start_server(sock_path, compiled, *extra)

    def stop():
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        proc.stdout.close()
        proc.stderr.close()

    request.addfinalizer(stop)
    return proc


def opts_for(model, *args):
    return fastfilter.parse_args([*args, "--model", str(model)])


def through_server(sock_path, model, raw, *args):
    out, label = fastfilter.via_server(sock_path, raw, str(model), False, opts_for(model, *args))
    return out, label


def cold(model, raw, *args):
    return fastfilter.cold(raw, str(model), False, opts_for(model, *args))


def test_socket_is_private(serving, sock_path):
    assert stat.S_IMODE(os.stat(sock_path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(sock_path)).st_mode) == 0o700
    assert wire.private_socket_dir(sock_path)


def expected_by_hand(model_path, raw, cutoffs=None):
    """What the filter must write for a well-formed LF message, built without spamnb's
    delivery code: the full SpamModel's verdict, the two lines spelled out, inserted
    before the blank line that ends the header block."""
    from spamnb.storage.modelfile import load_model

    model = load_model(model_path)
    c = model.classify(raw, cutoffs=cutoffs)
    word = {"spam": "Yes", "ham": "No", "unsure": "No"}[c.label]
    spam_cut = (cutoffs or model.cutoffs).spam_cutoff
    lines = (("X-Spam-Flag: YES\n" if c.label == "spam" else "")
             + f"X-Spam-Status: {word}, score={c.score:.2f} required={math.log(spam_cut / (1 - spam_cut)):.2f}"
             f" tests=SPAMNB_{c.label.upper()} probability={c.spam_probability:.6f}"
             f" model={os.path.basename(model_path)} version={__version__}\n").encode()
    end = raw.index(b"\n\n") + 1
    return raw[:end] + lines + raw[end:], c.label


def test_server_answers_like_the_cold_path(serving, sock_path, compiled):
    for raw in messages() + ODD_INPUTS:
        assert through_server(sock_path, compiled, raw) == cold(compiled, raw)
    # and both are right by a computation of their own (they share the insertion code)
    for raw in messages():
        raw = raw.split(b"\n", 1)[1] if raw.startswith(b"From ") else raw
        assert through_server(sock_path, compiled, raw) == expected_by_hand(compiled, raw)
    for args in (["--ham-cutoff", "0.2", "--spam-cutoff", "0.8"], ["--cost-unsure", "0.3"], ["--exit-zero"]):
        raw = b"Subject: meeting notes\n\nclick here for the meeting notes, free of charge\n"
        assert through_server(sock_path, compiled, raw, *args) == cold(compiled, raw, *args)


def test_console_script_uses_the_server_with_same_bytes_and_codes(serving, sock_path, compiled):
    for label in ("spam", "ham"):
        raw = sample_message(label, 2).read_bytes()
        for args in ([], ["--exit-zero"]):
            proc = subprocess.run(SPAMNB + ["filter", "--socket", sock_path, "--model", str(compiled), *args],
                                  input=raw, capture_output=True, timeout=60)
            assert (proc.stdout, proc.returncode) == click_filter([*args, "--model", compiled], raw)


def test_server_declines_another_model_and_bad_options(serving, sock_path, compiled, trained_model_file):
    raw = sample_message("spam", 0).read_bytes()
    with pytest.raises(fastfilter.Fallback, match="another model"):
        through_server(sock_path, trained_model_file, raw)
    with pytest.raises(fastfilter.Fallback, match="declined"):  # cut-offs out of order: click reports it
        through_server(sock_path, compiled, raw, "--spam-cutoff", "2")


def test_eight_concurrent_clients(serving, sock_path, compiled):
    raws = messages()[:40]
    want = [cold(compiled, raw) for raw in raws]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda raw: through_server(sock_path, compiled, raw), raws))
    assert got == want
    # and as 8 separate processes at once
    procs = [subprocess.Popen(SPAMNB + ["filter", "--socket", sock_path, "--model", str(compiled)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(8)]
    for proc, raw, (out, label) in zip(procs, raws, want):
        stdout, _ = proc.communicate(raw, timeout=60)
        assert (stdout, proc.returncode) == (out, EXIT_CODES[label])


def test_reload_after_learn_changes_the_answer(serving, sock_path, compiled):
    from click.testing import CliRunner

    from spamnb.cli import main

    path = sample_message("ham", 3)
    raw = path.read_bytes()
    before = through_server(sock_path, compiled, raw)
    res = CliRunner().invoke(main, ["learn", "--spam", str(path), "--model", str(compiled)])
    assert res.exit_code == 0, res.output
    after = through_server(sock_path, compiled, raw)
    assert after != before
    assert after == cold(compiled, raw)  # the fresh scorer agrees with the reloaded server


def test_stale_socket_falls_back_to_the_cold_path(compiled, sock_path):
    os.makedirs(os.path.dirname(sock_path), mode=0o700)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(sock_path)  # a socket file nobody listens on: a server that died
    s.close()
    raw = sample_message("spam", 1).read_bytes()
    with pytest.raises(fastfilter.Fallback):
        through_server(sock_path, compiled, raw)
    proc = subprocess.run(SPAMNB + ["filter", "--socket", sock_path, "--model", str(compiled)],
                          input=raw, capture_output=True, timeout=60)
    assert (proc.stdout, proc.returncode) == click_filter(["--model", compiled], raw)
    # and a new server takes the stale socket over
    proc = start_server(sock_path, compiled)
    try:
        assert through_server(sock_path, compiled, raw) == cold(compiled, raw)
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.parametrize("serving", [("--max-bytes", "2000")], indirect=True)
def test_oversized_request_is_refused_and_the_client_does_the_work(serving, sock_path, compiled):
    small = b"Subject: hi\n\nshort\n"
    assert through_server(sock_path, compiled, small) == cold(compiled, small)
    raw = sample_message("spam", 1).read_bytes()
    assert len(raw) > 2000
    with pytest.raises(fastfilter.Fallback):
        through_server(sock_path, compiled, raw)
    proc = subprocess.run(SPAMNB + ["filter", "--socket", sock_path, "--model", str(compiled)],
                          input=raw, capture_output=True, timeout=60)
    assert (proc.stdout, proc.returncode) == click_filter(["--model", compiled], raw)


@pytest.mark.parametrize("serving", [("--timeout", "0.5")], indirect=True)
def test_stalled_client_is_dropped_and_others_are_served(serving, sock_path, compiled):
    stalled = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stalled.connect(sock_path)
    stalled.sendall(wire.MAGIC)  # then nothing
    raw = sample_message("ham", 0).read_bytes()
    assert through_server(sock_path, compiled, raw) == cold(compiled, raw)  # not blocked by it
    stalled.settimeout(10)
    start = time.monotonic()
    status, label, _, _, reason = wire.read_reply(stalled)  # the server gives up on it and says why
    assert status == wire.DECLINED and label is None and "timed out" in reason
    assert time.monotonic() - start < 5
    stalled.close()


@pytest.mark.parametrize("serving", [("--timeout", "0.5")], indirect=True)
def test_a_client_dripping_bytes_is_dropped_at_the_deadline(serving, sock_path, compiled):
    """The time limit is for the whole request: a byte every 0.1 s never lets one receive
    time out, and still the server gives up 0.5 s after the request began."""
    raw = sample_message("ham", 0).read_bytes()
    request = b"".join(wire.encode_request(str(compiled), "model", None, raw))
    drip = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    drip.connect(sock_path)
    start = time.monotonic()
    reply = b""
    drip.settimeout(0.1)
    for byte in request:
        try:
            drip.sendall(bytes([byte]))
            reply = drip.recv(4096)
        except socket.timeout:
            continue
        except OSError:
            break
        if reply or time.monotonic() - start > 5:
            break
    drip.settimeout(10)
    assert time.monotonic() - start < 3
    status, label, _, _, reason = wire.read_reply(_Prefixed(drip, reply))
    assert status == wire.DECLINED and label is None and "timed out" in reason
    drip.close()


class _Prefixed:
    """A socket whose first bytes were already received."""

    def __init__(self, sock, head):
        self.sock, self.head = sock, head

    def recv(self, n):
        if self.head:
            part, self.head = self.head[:n], self.head[n:]
            return part
        return self.sock.recv(n)

    def settimeout(self, seconds):
        self.sock.settimeout(seconds)


def test_sigterm_stops_cleanly_and_removes_the_socket(serving, sock_path):
    serving.send_signal(signal.SIGTERM)
    assert serving.wait(15) == 0
    assert not os.path.exists(sock_path)


def test_second_server_on_a_live_socket_is_refused(serving, sock_path, compiled):
    proc = subprocess.run(SPAMNB + ["serve", "--socket", sock_path, "--model", str(compiled)],
                          capture_output=True, timeout=60)
    assert proc.returncode == 1 and b"already listening" in proc.stderr
    assert os.path.exists(sock_path)


def test_socket_folder_others_can_enter_is_refused(compiled, tmp_path):
    folder = tmp_path / "open"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    proc = subprocess.run(SPAMNB + ["serve", "--socket", str(folder / "s"), "--model", str(compiled)],
                          capture_output=True, timeout=60)
    assert proc.returncode == 2 and b"--socket" in proc.stderr and b"mode 0700" in proc.stderr  # before any model loads


def test_connections_from_other_users_are_refused(compiled, sock_path, monkeypatch, trained_model):
    """In process, with the peer check told the client is someone else: no answer at all."""
    backend = FileBackend(str(compiled)).resident()
    backend.holder.current = filestore.Loaded(trained_model, filestore.file_state(os.stat(compiled)))
    srv = server.FilterServer(sock_path, backend)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        raw = sample_message("spam", 0).read_bytes()
        assert through_server(sock_path, compiled, raw) == cold(compiled, raw)
        monkeypatch.setattr(server.wire, "peer_uid", lambda conn: os.geteuid() + 1)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(sock_path)
            try:
                wire.send_all(s, wire.encode_request(str(compiled), "model.joblib", None, raw))
                reply = s.recv(100)
            except (BrokenPipeError, ConnectionResetError):  # closed before or with our request unread
                reply = b""
            assert reply == b""  # no answer at all
    finally:
        srv.shutdown()
        srv.remove_socket()
        srv.server_close()


def test_server_without_a_scorer_uses_the_full_model(model_file, sock_path):
    """A model with no scorer beside it (copied by hand): served from the full model, same bytes."""
    assert not os.path.exists(str(model_file) + ".scorer")
    proc = start_server(sock_path, model_file)
    try:
        for raw in messages()[:15] + ODD_INPUTS[:3]:
            out, label = through_server(sock_path, model_file, raw)
            assert (out, EXIT_CODES[label]) == click_filter(["--model", model_file], raw)
    finally:
        proc.kill()
        proc.wait(10)
        proc.stdout.close()
        proc.stderr.close()


# -- running as a service: the socket's folder, the pid file ---------------------------------


def _serve_until_listening(sock_path, model, *extra, umask=None):
    """``spamnb serve`` started with ``umask`` (as a service manager may set it), once
    its socket answers and, with ``--pidfile``, its pid file names it: the file is
    written just after the socket listens, so a connection alone may come first."""
    proc = subprocess.Popen(SPAMNB + ["serve", "--socket", str(sock_path), "--model", str(model), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=(lambda: os.umask(umask)) if umask is not None else None)
    pidfile = Path(extra[extra.index("--pidfile") + 1]) if "--pidfile" in extra else None
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited: {proc.stderr.read().decode()}")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(str(sock_path))
            if pidfile is None or _read_or_none(pidfile) == f"{proc.pid}\n":
                return proc
        except OSError:
            pass
        time.sleep(0.05)
    proc.kill()
    held = f", its pid file holds {_read_or_none(pidfile)!r}" if pidfile else ""
    raise AssertionError(f"server did not start{held}")


def _read_or_none(path):
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def _stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    code = proc.wait(15)
    proc.stdout.close()
    proc.stderr.close()
    return code


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o277, 0o002], ids=lambda u: f"umask{u:03o}")
def test_socket_in_a_new_folder_is_made_0700_with_its_parents(compiled, tmp_path, umask):
    """``--socket`` may name a folder that does not exist yet, parents included: the
    socket's own folder and its missing parents are made 0700 and ours whatever the
    umask (spamnb.storage.store.make_private_folder, as for a model's folders)."""
    sock = tmp_path / "a" / "b" / "run" / "socket"
    proc = _serve_until_listening(sock, compiled, umask=umask)
    try:
        st = os.stat(sock.parent)
        assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
        for parent in (tmp_path / "a", tmp_path / "a" / "b"):
            assert stat.S_IMODE(os.stat(parent).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
        assert wire.private_socket_dir(str(sock))  # so the filter uses it
        raw = sample_message("spam", 1).read_bytes()
        assert through_server(str(sock), compiled, raw) == cold(compiled, raw)
    finally:
        assert _stop(proc) == 0
    assert not sock.exists()


def test_an_existing_folder_of_ours_at_0700_is_used_as_it_is(compiled, tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    proc = _serve_until_listening(run / "socket", compiled)
    assert _stop(proc) == 0
    assert stat.S_IMODE(os.stat(run).st_mode) == 0o700


def test_pidfile_is_written_once_listening_and_removed_on_exit(compiled, tmp_path):
    sock, pidfile = tmp_path / "run" / "socket", tmp_path / "pids" / "spamnb.pid"
    proc = subprocess.Popen(SPAMNB + ["serve", "--socket", str(sock), "--model", str(compiled),
                                      "--pidfile", str(pidfile)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not pidfile.exists():
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline
            time.sleep(0.01)
        # whole from the first moment it is there, and the socket already answers
        assert pidfile.read_text() == f"{proc.pid}\n"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(sock))
        assert stat.S_IMODE(pidfile.stat().st_mode) == 0o644
        assert [p.name for p in pidfile.parent.iterdir()] == ["spamnb.pid"]  # no temporary left
    finally:
        assert _stop(proc) == 0
    assert not pidfile.exists() and not sock.exists()


def test_pidfile_held_by_a_live_server_is_refused(compiled, tmp_path):
    pidfile = tmp_path / "spamnb.pid"
    first = _serve_until_listening(tmp_path / "run1" / "socket", compiled, "--pidfile", str(pidfile))
    try:
        proc = subprocess.run(SPAMNB + ["serve", "--socket", str(tmp_path / "run2" / "socket"),
                                        "--model", str(compiled), "--pidfile", str(pidfile)],
                              capture_output=True, timeout=60)
        assert proc.returncode == 1
        assert f"already running (pid {first.pid}" in proc.stderr.decode()
        assert not (tmp_path / "run2" / "socket").exists()  # refused before it listened
        assert pidfile.read_text() == f"{first.pid}\n"  # still the first server's
    finally:
        assert _stop(first) == 0
    assert not pidfile.exists()


@pytest.mark.parametrize("content", ["dead", "garbage", "empty"])
def test_stale_pidfile_is_taken_over(compiled, tmp_path, content):
    """A pid file left by a server that died (kill -9, a crash) holds no lock: a new
    server replaces it, whatever pid or garbage it holds."""
    pidfile = tmp_path / "spamnb.pid"
    if content == "dead":
        gone = subprocess.Popen(["true"])
        gone.wait()
        pidfile.write_text(f"{gone.pid}\n")
    else:
        pidfile.write_text("not a pid\n" if content == "garbage" else "")
    proc = _serve_until_listening(tmp_path / "run" / "socket", compiled, "--pidfile", str(pidfile))
    try:
        assert pidfile.read_text() == f"{proc.pid}\n"
    finally:
        assert _stop(proc) == 0


def test_pidfile_survives_kill_9_as_stale_only(compiled, tmp_path):
    pidfile = tmp_path / "spamnb.pid"
    sock = tmp_path / "run" / "socket"
    proc = _serve_until_listening(sock, compiled, "--pidfile", str(pidfile))
    proc.kill()
    proc.wait(10)
    proc.stdout.close()
    proc.stderr.close()
    assert pidfile.exists()  # nothing could remove it
    again = _serve_until_listening(sock, compiled, "--pidfile", str(pidfile))  # and the stale socket
    try:
        assert pidfile.read_text() == f"{again.pid}\n"
    finally:
        assert _stop(again) == 0
