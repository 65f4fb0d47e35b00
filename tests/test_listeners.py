"""``serve``'s listeners (the private socket, spamd's, the metrics') against floods
of idle connections, on a real ``spamnb serve`` whose file descriptor limit is
1,024, with the real ``spamc``: no listener's connections can take the others down.
"""

from __future__ import annotations

import os
import re
import resource
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import sample_message
from test_config import free_port
from test_e2e import SPAMNB
from test_fastpath import compiled  # noqa: F401 (a fixture)
from test_spamd import SPAMC, needs_spamc

pytest.importorskip("prometheus_client", reason="the metrics extra is not installed (pip install 'spamnb[metrics]')")

FLOOD = 1100  # more connections than the server may open files
SUMMARY = re.compile(rb"(-?\d+\.\d)/(-?\d+\.\d)\n\Z")  # spamc -c: score/threshold; 0/0 when unscanned


def _limit_files():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))


@pytest.fixture(autouse=True)
def _room_for_the_flood():
    """The test holds ``FLOOD`` sockets itself: raise its own soft limit (a user's is often
    1,024, root's here higher), and skip where the hard limit leaves no room."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = FLOOD + 200
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"the flood needs {need} open files; this user's hard limit is {hard}")
    # all the hard limit allows: in a whole run the process holds other tests' files too
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 4 * need if hard == resource.RLIM_INFINITY else hard), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture
def server(compiled, tmp_path):
    """``serve --spamd --metrics --timeout 2`` under ``ulimit -n 1024``: (process, spamd port, metrics
    port, private socket)."""
    port, mport = free_port(), free_port()
    sock = str(tmp_path / "run" / "socket")
    proc = subprocess.Popen([*SPAMNB, "serve", "--socket", sock, "--model", str(compiled), "--no-history",
                             "--spamd", str(port), "--metrics", f"127.0.0.1:{mport}", "--timeout", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=_limit_files)
    deadline = time.monotonic() + 60
    while not _metrics_answer(mport):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"server did not start: {proc.stderr.read().decode()}")
        time.sleep(0.1)
    yield proc, port, mport, sock
    proc.kill()
    proc.wait(20)
    proc.stderr.close()


def _metrics_answer(mport, timeout=2.0):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=timeout) as r:
            return r.status == 200 and b"spamnb_messages_total" in r.read()
    except (OSError, urllib.error.URLError):
        return False


def _flood(port, first=b""):
    """``FLOOD`` connections to ``port`` (a TCP port, or a Unix socket's path), each sending
    ``first`` and then nothing; the open ones."""
    held = []
    for _ in range(FLOOD):
        c = None
        try:
            if isinstance(port, str):
                c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                c.settimeout(1)
                c.connect(port)
            else:
                c = socket.create_connection(("127.0.0.1", port), timeout=1)
        except OSError:  # the backlog full: the server no longer accepts
            if c is not None:
                c.close()  # not left to the collector: each would hold a descriptor of ours
            continue
        try:
            c.sendall(first)
        except OSError:  # refused at once already
            pass
        held.append(c)
    return held


def _spamc(port, raw):
    """spamc -c -x: the summary line, or a failure (-x: an unscanned message is an error, not passed on)."""
    return subprocess.run([SPAMC, "-c", "-x", "-t", "10", "-d", "127.0.0.1", "-p", str(port)], input=raw,
                          capture_output=True, timeout=60)


def _scanned(res):
    m = SUMMARY.match(res.stdout)
    return res.returncode in (0, 1) and m is not None and (m.group(1), m.group(2)) != (b"0.0", b"0.0")


def _fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


@needs_spamc
def test_idle_metrics_connections_leave_spamd_scanning(server):
    proc, port, mport, sock = server
    spam = sample_message("spam", 0).read_bytes()
    held = _flood(mport, b"GET / HTTP/1.1\r\n")
    try:
        assert proc.poll() is None
        assert _fds(proc.pid) < 400  # bounded: the metrics' 16, spamd's, the reserve
        res = _spamc(port, spam)
        assert _scanned(res) and res.returncode == 1, (res.returncode, res.stdout, res.stderr)
        # the idle ones are closed at their deadline (--timeout 2): the metrics answer again
        deadline = time.monotonic() + 20
        while not _metrics_answer(mport):
            assert time.monotonic() < deadline, "the metrics never answered again"
            time.sleep(0.2)
    finally:
        for c in held:
            c.close()
    assert _scanned(_spamc(port, spam))


@needs_spamc
def test_idle_spamd_connections_are_refused_beyond_the_cap_and_expire(server):
    proc, port, mport, sock = server
    spam = sample_message("spam", 0).read_bytes()
    started = time.monotonic()
    held = _flood(port, b"CHECK SPAMC/1.5\r\n")
    try:
        assert time.monotonic() - started < 30  # refused at once, not queued behind each other
        assert proc.poll() is None
        assert _fds(proc.pid) < 400
        assert _metrics_answer(mport)  # the other listeners answer meanwhile
        refused = 0
        for c in held:  # those beyond the cap and its waiting slots: answered at once, while connecting
            c.setblocking(False)
            try:
                refused += c.recv(100).startswith(b"SPAMD/1.0 75 ")
            except OSError:  # nothing there: served, waiting, or closed at its deadline
                pass
        assert refused >= FLOOD // 2, refused
        # the held ones time out (--timeout 2), those waiting for a slot too (2 s): scanned again
        deadline = time.monotonic() + 30
        while not _scanned(res := _spamc(port, spam)):
            assert time.monotonic() < deadline, (res.returncode, res.stdout, res.stderr)
            time.sleep(0.5)
        assert res.returncode == 1
    finally:
        for c in held:
            c.close()


@needs_spamc
def test_idle_connections_to_the_private_socket_leave_spamd_scanning(server):
    proc, port, mport, sock = server
    held = _flood(sock, b"\x00")  # a request head begun, never finished
    try:
        assert proc.poll() is None and _fds(proc.pid) < 400
        res = _spamc(port, sample_message("spam", 0).read_bytes())
        assert _scanned(res) and res.returncode == 1, (res.returncode, res.stdout, res.stderr)
        assert _metrics_answer(mport)
    finally:
        for c in held:
            c.close()


# -- each bound on its own, in this process ---------------------------------------------------------


def test_metrics_refuse_beyond_their_bound_at_once_and_cut_a_dripping_client():
    from spamnb.delivery import metrics

    log = []
    listener = metrics.Metrics(f"127.0.0.1:{free_port()}").listener(timeout=3.0, log=log.append)
    import threading

    threading.Thread(target=listener.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    port = listener.server_address[1]
    held = []
    try:
        for _ in range(metrics.MAX_CONNECTIONS):
            c = socket.create_connection(("127.0.0.1", port), timeout=5)
            c.sendall(b"GET /metrics HTTP/1.1\r\n")  # then nothing
            held.append(c)
        time.sleep(0.3)
        start = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=5) as extra:
            extra.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            assert extra.recv(100).startswith(b"HTTP/1.0 503 ")
        assert time.monotonic() - start < 1.5  # at once, not when the held ones are cut (3 s)
        # a client sending a byte now and then, each within the read timeout: cut at the deadline
        for c in held:  # first, so that the dripping client is served, not refused at the bound
            c.close()
        held = []
        time.sleep(0.5)
        drip = socket.create_connection(("127.0.0.1", port), timeout=5)
        held = [drip]
        start, got = time.monotonic(), b""
        try:
            for ch in b"GET /metrics HTTP/1.1\r\nX-A: " + b"a" * 80:
                drip.sendall(bytes([ch]))
                time.sleep(0.1)
        except OSError:
            pass
        cut = time.monotonic() - start
        drip.settimeout(5)
        try:
            while chunk := drip.recv(100):
                got += chunk
        except OSError:
            pass
        assert not got.startswith(b"HTTP/1.0 503"), got  # served, then cut: not refused at the bound
        assert cut < 6  # the 3 s deadline (and a poll), not the 10 s of dripping
        assert _metrics_answer(port)
        assert any("too many connections" in line for line in log), log
    finally:
        for c in held:
            c.close()
        listener.shutdown()
        listener.close()


def test_spamd_waits_beyond_its_cap_in_threads_and_refuses_past_them_at_once(compiled, monkeypatch):
    from spamnb.delivery import spamd
    from test_spamd import Served

    monkeypatch.setattr(spamd, "SLOT_WAIT", 6.0)
    s = Served(compiled, timeout=8.0, max_connections=2)
    s.srv.share = None  # one client may hold every slot here: the cap alone (the share: test_hardening)
    held = []
    try:
        for _ in range(4):  # two served, two waiting for a slot
            c = socket.create_connection(("127.0.0.1", s.port), timeout=5)
            c.sendall(b"CHECK SPAMC/1.5\r\n")
            held.append(c)
        deadline = time.monotonic() + 5
        while len(s.srv._waiters) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        start = time.monotonic()
        assert s.ask(b"PING SPAMC/1.5\r\n\r\n", half_close=False).startswith(b"SPAMD/1.0 75 ")
        assert time.monotonic() - start < 3  # refused at once, not after the 6 s wait
    finally:
        for c in held:
            c.close()
    deadline = time.monotonic() + 10
    while s.ask(b"PING SPAMC/1.5\r\n\r\n") != b"SPAMD/1.5 0 PONG\r\n":  # the slots free again
        assert time.monotonic() < deadline
        time.sleep(0.2)
    s.stop()


def test_serve_refuses_to_start_when_its_listeners_need_more_descriptors_than_it_may_open(compiled, tmp_path):
    def low():
        resource.setrlimit(resource.RLIMIT_NOFILE, (150, 150))

    proc = subprocess.run([*SPAMNB, "serve", "--socket", str(tmp_path / "run" / "s"), "--model", str(compiled),
                           "--no-history", "--spamd", str(free_port())], capture_output=True, timeout=120,
                          preexec_fn=low)
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith(b"spamnb: error")]
    assert len(errors) == 1 and b"Traceback" not in proc.stderr, proc.stderr
    assert b"needs 228 file descriptors, but may open only 150" in errors[0]  # 128 + 2 + 32 + 2 + 2 x 32


def test_serve_raises_its_soft_limit_to_what_its_listeners_may_hold(compiled, tmp_path):
    """Under a soft limit lower than its listeners' bounds and a hard one that allows them, serve
    raises the soft limit at start (so that no listener's flood takes the others' descriptors)."""
    def low():
        resource.setrlimit(resource.RLIMIT_NOFILE, (150, 1024))

    sock = tmp_path / "run" / "s"
    proc = subprocess.Popen([*SPAMNB, "serve", "--socket", str(sock), "--model", str(compiled), "--no-history",
                             "--spamd", str(free_port())], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=low)
    try:
        deadline = time.monotonic() + 60
        while not sock.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.05)
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
        soft = int(next(line for line in limits.splitlines() if line.startswith("Max open files")).split()[3])
        assert soft == 228  # 128 + the private socket's 2 + 32, spamd's 2 + 2 x 32
    finally:
        proc.terminate()
        err = proc.communicate(timeout=30)[1]
    assert b"file descriptor limit raised from 150 to 228" in err, err
