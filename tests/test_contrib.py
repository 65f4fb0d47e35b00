"""The systemd units of ``contrib/systemd/``: systemd accepts them, and the
command each one runs starts a server that ``spamnb filter`` uses.

As for the README's delivery recipes, a unit is tested as a user installs it:
``/usr/local/bin/spamnb`` replaced by the installed command's full path.
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

from conftest import ROOT, sample_message
from spamnb.delivery import fastfilter
from spamnb.storage.modelfile import save_model
from test_e2e import README_SPAMNB, SPAMNB

UNITS = {"user": ROOT / "contrib" / "systemd" / "user" / "spamnb.service",
         "system": ROOT / "contrib" / "systemd" / "system" / "spamnb@.service"}
SPAMD_UNIT = ROOT / "contrib" / "systemd" / "system" / "spamnb-spamd.service"
MILTER_UNIT = ROOT / "contrib" / "systemd" / "system" / "spamnb-milter.service"
IMAP_UNIT = ROOT / "contrib" / "systemd" / "user" / "spamnb-imap.service"
NO_ANALYZE = "systemd-analyze is not installed (Debian's systemd package; scripts/test.sh installs it when root)"


def installed(unit: Path) -> str:
    text = unit.read_text()
    assert README_SPAMNB + " serve" in text or README_SPAMNB + " imap" in text
    return text.replace(README_SPAMNB, shlex.join(SPAMNB))


def user_name() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name


def verify(kind: str, path: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """``systemd-analyze [--user] verify PATH``: parses the unit as systemd would load it
    (unknown keys and bad values are warnings on stderr; a missing ExecStart program
    an error), without a running systemd."""
    env = dict(os.environ)
    args = ["systemd-analyze", "verify", str(path)]
    if kind == "user":  # a user manager's paths (%t) come from XDG_RUNTIME_DIR
        runtime = tmp_path / "xdg-runtime"
        runtime.mkdir(mode=0o700, exist_ok=True)
        env["XDG_RUNTIME_DIR"] = str(runtime)
        args.insert(1, "--user")
    return subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)


def complaints(proc: subprocess.CompletedProcess, name: str) -> list[str]:
    """The lines of systemd-analyze's output about our unit (it may also talk about the host's)."""
    return [line for line in (proc.stdout + proc.stderr).splitlines() if name.split("@")[0] in line]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason=NO_ANALYZE)
@pytest.mark.parametrize("kind", sorted(UNITS))
def test_units_pass_systemd_analyze_verify(kind, tmp_path):
    # the template is checked as an instance for the user running the tests (User=%i must exist)
    name = UNITS[kind].name.replace("@.", f"@{user_name()}.")
    unit = tmp_path / name
    unit.write_text(installed(UNITS[kind]))
    proc = verify(kind, unit, tmp_path)
    assert proc.returncode == 0 and not complaints(proc, name), proc.stdout + proc.stderr
    # the check can fail: the same unit with a mistake in it is reported
    unit.write_text(installed(UNITS[kind]).replace("Type=simple", "Type=simple\nRestartSecs=5"))
    proc = verify(kind, unit, tmp_path)
    assert any("RestartSecs" in line for line in complaints(proc, name)), proc.stdout + proc.stderr


def exec_start(kind: str, runtime: Path) -> tuple[list[str], Path]:
    """The unit's ExecStart as argv, its specifiers expanded the way systemd would,
    with the runtime folder (``%t``, ``/run`` for the system unit) under ``runtime``;
    and the RuntimeDirectory= systemd would make before starting it."""
    lines = dict(line.split("=", 1) for line in installed(UNITS[kind]).splitlines()
                 if "=" in line and not line.startswith("#"))
    command, rundir = lines["ExecStart"], lines["RuntimeDirectory"]
    if kind == "user":
        command = command.replace("%t", str(runtime))
    else:
        command = command.replace("%i", user_name()).replace("/run/", f"{runtime}/")
        rundir = rundir.replace("%i", user_name())
    assert "%" not in command
    return shlex.split(command), runtime / rundir


@pytest.mark.parametrize("kind", sorted(UNITS))
def test_unit_command_starts_a_server_that_the_filter_uses(kind, tmp_path, trained_model, isolated_env):
    """What the unit runs, run here: the server serves the user's model on the unit's
    socket, the filter given that socket is answered by it, and SIGTERM (systemctl
    stop) stops it cleanly."""
    model = isolated_env / "data" / "spamnb" / "model.joblib"  # the user's model: serve has no --model
    save_model(trained_model, model)
    argv, rundir = exec_start(kind, tmp_path / "run")
    rundir.mkdir(parents=True)
    rundir.chmod(0o700)  # RuntimeDirectoryMode=0700, as systemd makes it
    sock = Path(argv[argv.index("--socket") + 1])
    assert sock.parent == rundir
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: os.umask(0o077))  # UMask=0077
    try:
        deadline = time.monotonic() + 60
        while not sock.exists():
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
        raw = sample_message("spam", 1).read_bytes()
        opts = fastfilter.parse_args(["--socket", str(sock)])
        out, label = fastfilter.via_server(str(sock), raw, str(model), False, opts)  # the server answers
        assert (out, label) == fastfilter.cold(raw, str(model), False, opts)
        filt = subprocess.run(SPAMNB + ["filter", "--exit-zero", "--socket", str(sock)], input=raw,
                              capture_output=True, timeout=60)
        assert (filt.returncode, filt.stdout) == (0, out)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(15)
        proc.stdout.close()
        proc.stderr.close()
    assert code == 0 and not sock.exists()


def spamd_unit_here(tmp_path: Path) -> str:
    """The spamd unit as installed, run by this user, with its folders under ``tmp_path``."""
    return (installed(SPAMD_UNIT).replace("User=spamnb", f"User={user_name()}")
            .replace("/var/lib/spamnb", str(tmp_path / "lib")).replace("/run/", f"{tmp_path}/run/"))


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason=NO_ANALYZE)
@pytest.mark.parametrize("path", [SPAMD_UNIT, MILTER_UNIT], ids=lambda p: p.stem)
def test_spamd_and_milter_units_pass_systemd_analyze_verify(tmp_path, path):
    unit = tmp_path / path.name
    unit.write_text(installed(path).replace("User=spamnb", f"User={user_name()}"))
    proc = verify("system", unit, tmp_path)
    assert proc.returncode == 0 and not complaints(proc, unit.name), proc.stdout + proc.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason=NO_ANALYZE)
def test_many_hosts_drop_in_passes_systemd_analyze_verify(tmp_path):
    """docs/many-hosts.md's drop-in for the spamd unit, read from the page (its program
    substituted by docsnippets' table), laid out as installed: the shipped unit in a folder,
    the drop-in in FOLDER/spamnb-spamd.service.d/, where systemd-analyze verify, given the
    unit's path, looks for drop-ins. Nothing is said of either file. The check can fail: a
    copy of the drop-in with an unknown key in its [Unit] is reported by its file and line,
    and one whose ExecStart names a program that is not there is refused."""
    import docsnippets

    page_path = "/etc/systemd/system/spamnb-spamd.service.d/store.conf"
    units = tmp_path / "units"
    unit = units / SPAMD_UNIT.name
    drop_in = units / f"{SPAMD_UNIT.name}.d" / Path(page_path).name
    assert Path(page_path).parent.name == drop_in.parent.name  # the page's drop-in is for this unit
    drop_in.parent.mkdir(parents=True)
    unit.write_text(installed(SPAMD_UNIT).replace("User=spamnb", f"User={user_name()}"))
    text = docsnippets.Site(tmp_path / "site", SPAMNB).text(docsnippets.files()[page_path])
    assert "[Unit]\n" in text and shlex.join(SPAMNB) + " " in text, text

    drop_in.write_text(text)
    proc = verify("system", unit, tmp_path)
    assert proc.returncode == 0 and not complaints(proc, unit.name), proc.stdout + proc.stderr

    drop_in.write_text(text.replace("[Unit]\n", "[Unit]\nWantz=network-online.target\n"))
    proc = verify("system", unit, tmp_path)
    assert any(f"{drop_in}:" in line and "Wantz" in line for line in complaints(proc, unit.name)), \
        proc.stdout + proc.stderr

    missing = tmp_path / "nowhere" / "spamnb"
    drop_in.write_text(text.replace(shlex.join(SPAMNB) + " ", f"{missing} "))
    proc = verify("system", unit, tmp_path)
    assert proc.returncode != 0 and str(missing) in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def unit_answer(tmp_path, text, address, trained_model, ask):
    """Run a system unit's ExecStart (``text``: the unit as installed here, its folders under
    tmp_path; its listen ``address`` moved to a free port) with the model the configuration
    names, and ``ask(sock)`` it once it listens: the answer, after the server stopped on
    SIGTERM with status 0."""
    import socket

    lines = dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = shlex.split(lines["ExecStart"].replace(address, f"127.0.0.1:{port}"))
    (tmp_path / "lib" / "users").mkdir(parents=True, mode=0o700)
    save_model(trained_model, tmp_path / "lib" / "model.joblib")
    (tmp_path / "run" / lines["RuntimeDirectory"]).mkdir(parents=True, mode=0o700)
    assert "--model" not in argv  # where the model is: the configuration's, as the unit's comment says
    system = tmp_path / "etc" / "spamnb.toml"
    system.parent.mkdir(mode=0o755)
    system.write_text(f'[model]\npath = "{tmp_path / "lib" / "model.joblib"}"\n')
    system.chmod(0o644)
    env = {**os.environ, "SPAMNB_SYSTEM_CONFIG": str(system)}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            preexec_fn=lambda: os.umask(0o077))
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                    reply = ask(sock)
                break
            except ConnectionRefusedError:
                time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(15)
        proc.stdout.close()
        proc.stderr.close()
    assert code == 0
    return reply


def test_milter_unit_command_answers_a_milter_negotiation(tmp_path, trained_model):
    """The milter unit's ExecStart (its port moved off 11332, its folders under tmp_path)
    answers an MTA's option negotiation, and stops on SIGTERM."""
    import struct

    text = (installed(MILTER_UNIT).replace("User=spamnb", f"User={user_name()}")
            .replace("/var/lib/spamnb", str(tmp_path / "lib")).replace("/run/", f"{tmp_path}/run/"))

    def negotiate(sock):
        sock.sendall(struct.pack("!LcLLL", 13, b"O", 6, 0x1FF, 0x1FFFFF))
        return sock.recv(64)

    reply = unit_answer(tmp_path, text, "127.0.0.1:11332", trained_model, negotiate)
    assert reply[:5] == b"\x00\x00\x00\x0dO"


def test_spamd_unit_command_answers_spamc_requests(tmp_path, trained_model):
    """The unit's ExecStart (its port moved off 783, its folders under tmp_path)
    serves the spamd protocol with the model the unit names, and stops on SIGTERM."""
    raw = sample_message("spam", 1).read_bytes()

    def check(sock):
        sock.sendall(b"CHECK SPAMC/1.5\r\nUser: nobody-here\r\nContent-length: %d\r\n\r\n" % len(raw) + raw)
        return sock.makefile("rb").read()

    reply = unit_answer(tmp_path, spamd_unit_here(tmp_path), "127.0.0.1:783", trained_model, check)
    assert reply.startswith(b"SPAMD/1.1 0 EX_OK\r\nSpam: ")


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason=NO_ANALYZE)
def test_imap_unit_passes_systemd_analyze_verify(tmp_path):
    unit = tmp_path / IMAP_UNIT.name
    unit.write_text(installed(IMAP_UNIT))
    proc = verify("user", unit, tmp_path)
    assert proc.returncode == 0 and not complaints(proc, unit.name), proc.stdout + proc.stderr


def test_imap_unit_command_is_the_readmes_and_parses():
    """The unit runs `spamnb imap filter --watch` with the config file's settings: that
    command line is accepted (its --help is what the unit runs, plus --help)."""
    lines = dict(line.split("=", 1) for line in installed(IMAP_UNIT).splitlines()
                 if "=" in line and not line.startswith("#"))
    argv = shlex.split(lines["ExecStart"])
    assert argv[-3:] == ["imap", "filter", "--watch"]
    res = subprocess.run(argv + ["--help"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "--watch" in res.stdout
