#!/usr/bin/env python3
"""Exim's ``spam =`` ACL condition against ``spamnb serve --spamd``, end to end.

A real Exim (Debian's ``exim4-daemon-heavy``, built with content
scanning) with ``spamd_address`` pointing at spamnb, a ham and a spam sent to
it through an SMTP session, and the ham delivered to a local maildir with the
headers Exim wrote from spamnb's verdict. Everything lives in a temporary
folder; no system configuration is read or touched:

1. a model: ``--model FILE``, or trained on the shipped corpus
   (``spamnb train --index corpora/spamassassin.tar.xz``, about 20 s);
2. ``spamnb serve --model ... --socket DIR/run/sock --spamd 127.0.0.1:PORT``;
3. a private Exim configuration (:func:`exim_config`: ``spamd_address``, an
   ``acl_smtp_data`` that adds ``X-Spam-Score``/``X-Spam-Bar``/``X-Spam-Report``
   to every message and denies spam with 550, an ``accept`` router and an
   ``appendfile`` transport in ``maildir_format`` to DIR/Maildir), and
   ``exim4 -C DIR/exim.conf -bdf``: the daemon in the foreground on a private
   port of 127.0.0.1, its spool, logs and pid file under DIR;
4. an SMTP session (``smtplib``) per message: EHLO, MAIL, RCPT, DATA, QUIT;
5. checks: the ham is answered 250, delivered to DIR/Maildir/new with Exim's
   headers (its score on the ham side of the cut-off, the body as sent); the
   spam is answered 550 by the ACL and delivered nowhere.

The default messages are from ``corpora/sample-maildir``: the held-out sample,
not in the shipped training corpus. Their mbox ``From `` line is dropped
before sending (an SMTP client sends none; Exim puts its own in front when it
asks spamd).

Exim with ``-C`` and root: Exim gives up root for a configuration file named
with ``-C`` in its re-executed delivery processes (it logs "exim user lost
privilege for using -C option"), so they run as the Exim user; the transport
therefore delivers as that user (``Debian-exim``), and DIR, the spool, the log
folder and the maildir are made usable by it. Run by another user, Exim has
no privilege at all: only root and Exim's admin users may start a daemon
("exim: permission denied"), so each session is an ``exim -C ... -odi -bs``
on a socket pair instead (still SMTP, through ``smtplib``), and the config sets
``exim_user``/``exim_group`` to that user (else Exim fails to chown its spool
files to ``Debian-exim``) and delivers as them.

    python tools/harnesses/exim_spamd.py                         # trains a model first (~20 s)
    python tools/harnesses/exim_spamd.py --model ~/.local/share/spamnb/model.joblib
    python tools/harnesses/exim_spamd.py --keep                  # leave DIR (config, logs, maildir) behind

Exit status: 0 when everything is as expected, 1 when something differs
(each difference is printed), 77 when Exim cannot run here (not installed,
built without content scanning, or refusing the configuration), with the reason.
"""

from __future__ import annotations

import argparse
import email.parser
import email.policy
import glob
import grp
import os
import pwd
import re
import shutil
import signal
import smtplib
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "corpora" / "sample-maildir" / "cur"
DEFAULT_HAM = SAMPLE / "easy_ham.00097.e8e276c07ee885c4b8d904c1414412e5:2,S"
DEFAULT_SPAM = SAMPLE / "spam.00012.381e4f512915109ba1e0853a7a8407b2:2,S"
DOMAIN = "spamnb.test"
RECIPIENT = f"bob@{DOMAIN}"
SENDER = "alice@example.org"
EXIT_UNAVAILABLE = 77
SPAM_LINE = re.compile(rb"Spam: (\w+) ; (-?\d+(?:\.\d+)?) / (-?\d+(?:\.\d+)?)")
# logged by every Exim process re-executed with -C; a notice, not a fault
LOST_PRIVILEGE = "exim user lost privilege for using -C option"


class Unavailable(Exception):
    """The MTA cannot run here (Exim; Postfix and Haraka in their scripts); the message says why."""


def exim_config(d: Path, smtp_port: int, spamd_port: int, user: str, group: str | None = None) -> str:
    """The whole private configuration: nothing else is read.

    ``group``: run Exim as ``user``:``group`` (``exim_user``/``exim_group``),
    for a caller who is not root (see the module docstring).
    """
    own = f"exim_user = {user}\nexim_group = {group}\n" if group else ""
    return f"""\
# written by tools/harnesses/exim_spamd.py
{own}primary_hostname = {DOMAIN}
domainlist local_domains = {DOMAIN}
local_interfaces = 127.0.0.1
daemon_smtp_ports = {smtp_port}
spool_directory = {d}/spool
log_file_path = {d}/log/%slog
pid_file_path = {d}/exim.pid
keep_environment =
host_lookup =
rfc1413_hosts =

# spamnb serve --spamd 127.0.0.1:{spamd_port}
spamd_address = 127.0.0.1 {spamd_port}

acl_smtp_rcpt = acl_check_rcpt
acl_smtp_data = acl_check_data

begin acl

acl_check_rcpt:
  accept domains = +local_domains
  deny   message = relay not permitted

acl_check_data:
  warn   spam       = nobody:true
         add_header = X-Spam-Score: $spam_score ($spam_score_int)
         add_header = X-Spam-Bar: $spam_bar
         add_header = X-Spam-Report: $spam_report
  deny   spam       = nobody
         message    = spam (spamnb score $spam_score)
  accept

begin routers

local_maildir:
  driver    = accept
  domains   = +local_domains
  transport = maildir_delivery

begin transports

maildir_delivery:
  driver         = appendfile
  directory      = {d}/Maildir
  maildir_format
  create_directory
  envelope_to_add
  return_path_add
  user           = {user}
"""


def docsnippets():
    """``tests/docsnippets.py``: the pages' set-up as the tests read it, so that a harness runs
    the lines docs/admin.md gives as written (its ``SUBSTITUTE`` says what may change)."""
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        import docsnippets as module
    finally:
        sys.path.remove(str(ROOT / "tests"))
    return module


def unpack_debs(packages, dest: Path) -> list[str]:
    """``apt-get download PACKAGES`` and ``dpkg-deb -x`` each into ``dest`` (emptied
    first): nothing is installed, so an MTA unpacked beside another removes nothing.
    The names of the packages unpacked."""
    with tempfile.TemporaryDirectory(prefix="spamnb-deb-") as tmp:
        os.chmod(tmp, 0o755)  # apt-get download as root hands the files to _apt
        subprocess.run(["apt-get", "download", "-q", *packages], cwd=tmp, check=True)
        shutil.rmtree(dest, ignore_errors=True)
        debs = sorted(glob.glob(os.path.join(tmp, "*.deb")))
        for deb in debs:
            subprocess.run(["dpkg-deb", "-x", deb, str(dest)], check=True)
            print(f"unpacked {os.path.basename(deb)} into {dest}")
    return [os.path.basename(d) for d in debs]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_exim(given: str | None = None) -> str:
    cands = [given] if given else [shutil.which("exim4"), shutil.which("exim"), "/usr/sbin/exim4", "/usr/sbin/exim"]
    for exim in cands:
        if exim and os.access(exim, os.X_OK):
            break
    else:
        raise Unavailable(f"{given or 'exim'} is not installed (Debian: apt-get install exim4-daemon-heavy)")
    try:
        version = subprocess.run([exim, "-bV"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise Unavailable(f"{exim} -bV failed: {e}") from e
    if "Content_Scanning" not in version:
        raise Unavailable(f"{exim} is built without content scanning (no spam = condition): "
                          "Debian's exim4-daemon-heavy has it, exim4-daemon-light does not")
    return exim


def spamd_ask(port: int, request: bytes, timeout: float = 10.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        s.shutdown(socket.SHUT_WR)
        out = []
        while data := s.recv(65536):
            out.append(data)
    return b"".join(out)


def spamd_check(port: int, raw: bytes) -> tuple[bool, float, float]:
    """spamnb's own answer to CHECK: (spam?, S, T)."""
    reply = spamd_ask(port, b"CHECK SPAMC/1.5\r\nContent-length: %d\r\n\r\n" % len(raw) + raw)
    m = SPAM_LINE.search(reply)
    if not m:
        raise RuntimeError(f"spamnb serve --spamd answered CHECK with {reply[:200]!r}")
    return m.group(1) in (b"True", b"Yes"), float(m.group(2)), float(m.group(3))


def as_sent(raw: bytes) -> bytes:
    """The message as an SMTP client sends it: no mbox ``From `` line, CRLF lines."""
    if raw.startswith(b"From "):
        raw = raw.split(b"\n", 1)[1] if b"\n" in raw else b""
    return re.sub(rb"\r?\n", b"\r\n", raw)


def smtp_greets(port: int) -> bool:
    """Whether an SMTP server on 127.0.0.1:``port`` greets with 220 (it is up)."""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        return s.recv(512).startswith(b"220")


def wait_for(what: str, ready, proc: subprocess.Popen, log: Path, timeout: float = 20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode}) before it was ready: "
                               f"{tail(log)}")
        try:
            if ready():
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} not ready after {timeout:.0f} s: {tail(log)}")


def tail(path: Path, n: int = 8) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return f"(no {path.name})"


def stop(proc: subprocess.Popen | None, timeout: float = 20.0):
    """SIGTERM ``proc`` (a server stops its children, spamd too), SIGKILL if it lingers
    ``timeout`` s; then SIGKILL what is left of the process group it leads, if it was
    started in one of its own (``start_new_session``)."""
    if proc is None:
        return
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # no group of that id (it led none): ProcessLookupError
    except ProcessLookupError:
        pass
    proc.wait()


class _Piped(smtplib.SMTP):
    """smtplib over a socket already connected (to ``exim -bs``)."""

    def __init__(self, sock):
        self._sock_given = sock
        super().__init__(local_hostname="client.test", timeout=30)

    def _get_socket(self, host, port, timeout):
        return self._sock_given


def smtp_send(port: int | None, raw: bytes, out, bs: list[str] | None = None, bs_log: Path | None = None) \
        -> tuple[int, str]:
    """One SMTP session; the server's replies go to ``out``; the DATA reply is returned.

    To the daemon on ``port``, or (``bs``: the exim command) to ``exim -bs`` on
    a socket pair, its stdin and stdout.
    """
    if bs is None:
        session = smtplib.SMTP("127.0.0.1", port, local_hostname="client.test", timeout=30)
        exim = None
    else:
        mine, its = socket.socketpair()
        with open(bs_log, "ab") as err:
            exim = subprocess.Popen(bs, stdin=its, stdout=its, stderr=err)
        its.close()
        session = _Piped(mine)
        code, text = session.connect("exim -bs")
        out(f"  (exim -bs) -> {code} {text.decode(errors='replace')}")
    try:
        return smtp_session(session, raw, out)
    finally:
        session.close()
        if exim is not None:
            try:
                exim.wait(30)
            except subprocess.TimeoutExpired:
                stop(exim)


def smtp_session(s: smtplib.SMTP, raw: bytes, out) -> tuple[int, str]:
    with s:
        code, text = s.ehlo()
        out(f"  EHLO client.test -> {code} {text.decode(errors='replace').splitlines()[0]}")
        code, text = s.mail(SENDER)
        out(f"  MAIL FROM:<{SENDER}> -> {code} {text.decode(errors='replace')}")
        code, text = s.rcpt(RECIPIENT)
        out(f"  RCPT TO:<{RECIPIENT}> -> {code} {text.decode(errors='replace')}")
        if code != 250:
            return code, text.decode(errors="replace")
        code, text = s.data(raw)
        out(f"  DATA ({len(raw)} bytes) -> {code} {text.decode(errors='replace')}")
        return code, text.decode(errors="replace")


def delivered(maildir: Path) -> list[Path]:
    return sorted(p for sub in ("new", "cur") for p in (maildir / sub).glob("*") if p.is_file()) \
        if maildir.exists() else []


def wait_delivery(logs: list[Path], msg_id: str, maildir: Path, before: set, timeout: float = 20.0) -> list[str]:
    """The logs' lines for ``msg_id`` once it is Completed or in the maildir (or at the timeout)."""
    end = time.monotonic() + timeout
    lines: list[str] = []
    while time.monotonic() < end:
        lines = []
        for log in logs:
            try:
                lines += [ln for ln in log.read_text(errors="replace").splitlines() if msg_id in ln]
            except OSError:
                pass
        if any(ln.endswith(f"{msg_id} Completed") for ln in lines) or set(delivered(maildir)) - before:
            break
        time.sleep(0.1)
    return lines


def run(model: Path, ham: bytes, spam: bytes, *, exim: str | None = None, workdir: Path | None = None,
        keep: bool = False, out=print, spamnb: list[str] | None = None) -> list[str]:
    """Do the whole exchange; return the differences from what is expected (none: all well).

    Raises :class:`Unavailable` when Exim cannot run here.
    """
    exim = find_exim(exim)
    spamnb = spamnb or [sys.executable, "-m", "spamnb"]
    d = Path(workdir or tempfile.mkdtemp(prefix="spamnb-exim-"))
    problems: list[str] = []
    serve = daemon = None
    root = os.geteuid() == 0
    try:
        for sub in ("run", "spool", "log", "Maildir"):
            (d / sub).mkdir(exist_ok=True)
        (d / "run").chmod(0o700)
        group = None
        if root:
            # Exim's delivery processes run as its own user when -C is used (see above)
            user = subprocess.run([exim, "-bP", "exim_user"], capture_output=True, text=True,
                                  timeout=20).stdout.partition("=")[2].strip() or "Debian-exim"
            pw = pwd.getpwnam(user)
            d.chmod(0o711)
            for sub in ("spool", "log", "Maildir"):
                os.chown(d / sub, pw.pw_uid, pw.pw_gid)
        else:
            pw = pwd.getpwuid(os.geteuid())
            user, group = pw.pw_name, grp.getgrgid(os.getegid()).gr_name
        spamd_port, smtp_port = free_port(), free_port()
        conf = d / "exim.conf"
        conf.write_text(exim_config(d, smtp_port, spamd_port, user, group))
        conf.chmod(0o644)

        serve = start_serve(spamnb, model, d, spamd_port, out)

        check = subprocess.run([exim, "-C", str(conf), "-bV"], capture_output=True, text=True, timeout=20)
        if check.returncode != 0:
            raise Unavailable(f"{exim} refuses the private configuration: "
                              f"{(check.stderr or check.stdout).strip()[:300]}")
        exim_log = d / "exim.out"
        bs = None
        if root:
            with open(exim_log, "wb") as f:
                daemon = subprocess.Popen([exim, "-C", str(conf), "-bdf"], stdout=f, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL)

            wait_for("exim -bdf", lambda: smtp_greets(smtp_port), daemon, exim_log)
            out(f"{exim} -C {conf} -bdf: SMTP on 127.0.0.1:{smtp_port}, spamd_address = 127.0.0.1 {spamd_port},"
                f" delivering as {user}")
        else:
            # only root and Exim's admin users may start a daemon: one exim -bs per session
            bs = [exim, "-C", str(conf), "-odi", "-bs"]
            out(f"{' '.join(bs)} (SMTP on its stdin/stdout), spamd_address = 127.0.0.1 {spamd_port},"
                f" running and delivering as {user}")

        maildir = d / "Maildir"
        mainlog = d / "log" / "mainlog"
        for label, raw in (("ham", ham), ("spam", spam)):
            msg = as_sent(raw)
            is_spam, s_own, t_own = spamd_check(spamd_port, msg)
            out(f"\n{label}: spamnb's own CHECK of the message as sent: Spam: {is_spam} ; {s_own} / {t_own}")
            if is_spam != (label == "spam"):
                problems.append(f"{label}: the model itself judges it {'spam' if is_spam else 'not spam'}"
                                f" ({s_own} / {t_own}): pick another message or model")
            before = set(delivered(maildir))
            code, text = smtp_send(smtp_port, msg, out, bs, exim_log)
            if label == "ham":
                if code != 250:
                    problems.append(f"ham: DATA answered {code} {text}, expected 250")
                    continue
                msg_id = text.rpartition("id=")[2].strip()
                lines = wait_delivery([mainlog, exim_log], msg_id, maildir, before)
                for ln in lines:
                    out(f"  log: {ln}")
                new = [p for p in delivered(maildir) if p not in before]
                if len(new) != 1:
                    problems.append(f"ham: {len(new)} new files in {maildir}, expected 1 (log: {tail(mainlog)})")
                    continue
                got = new[0].read_bytes()
                out(f"  delivered: {new[0].relative_to(d)}")
                hdrs = email.parser.BytesHeaderParser(policy=email.policy.compat32).parsebytes(got)
                for name in ("X-Spam-Score", "X-Spam-Bar", "X-Spam-Report"):
                    value = hdrs.get(name)
                    shown = (value or "(missing)").splitlines()
                    out(f"  {name}: {shown[0]}" + (f"  [+{len(shown) - 1} lines]" if len(shown) > 1 else ""))
                    if value is None:
                        problems.append(f"ham: no {name} header in the delivered message")
                score = hdrs.get("X-Spam-Score", "")
                m = re.match(r"\s*(-?\d+(?:\.\d+)?) \((-?\d+)\)", score)
                if not m:
                    problems.append(f"ham: X-Spam-Score {score!r} is not 'S (10*S)'")
                else:
                    s_exim, s_int = float(m.group(1)), int(m.group(2))
                    if s_exim >= t_own:
                        problems.append(f"ham: Exim's $spam_score {s_exim} is not below the cut-off {t_own}")
                    if abs(s_int - 10 * s_exim) > 1:
                        problems.append(f"ham: $spam_score_int {s_int} is not 10 x {s_exim}")
                    bar = (hdrs.get("X-Spam-Bar") or "").strip()
                    if s_exim <= -1 and set(bar) != {"-"}:
                        problems.append(f"ham: $spam_bar {bar!r} for a score of {s_exim}")
                if not (hdrs.get("X-Spam-Report") or "").startswith("spamnb"):
                    problems.append("ham: X-Spam-Report is not spamnb's report")
                body = msg.partition(b"\r\n\r\n")[2].replace(b"\r\n", b"\n")
                if body not in got:
                    problems.append("ham: the delivered body differs from the one sent")
            else:
                if code != 550 or "spam" not in text:
                    problems.append(f"spam: DATA answered {code} {text}, expected 550 from the ACL's deny")
                time.sleep(0.5)
                if set(delivered(maildir)) - before:
                    problems.append("spam: it was delivered")
                rejected = [ln for log in (mainlog, exim_log) for ln in tail(log, 50).split(" | ")
                            if "rejected after DATA" in ln]
                for ln in rejected[-1:]:
                    out(f"  log: {ln}")
                out(f"  delivered: {'nowhere' if not set(delivered(maildir)) - before else 'into the maildir'}")
        panics = [ln for ln in tail(d / "log" / "paniclog", 50).split(" | ")
                  if ln and LOST_PRIVILEGE not in ln and not ln.startswith("(no ")]
        if panics:
            problems.append(f"Exim's panic log: {' | '.join(panics)}")
    except RuntimeError as e:
        problems.append(str(e))
    finally:
        leave(d, keep=keep, made=workdir is None, out=out, procs=(daemon, serve))
    return problems


def start_serve(spamnb, model, d: Path, spamd_port: int, out, options=()) -> subprocess.Popen:
    """``spamnb serve --spamd 127.0.0.1:PORT`` on ``model`` (None: ``options`` name it,
    ``--store URL``) with ``options`` besides, its socket DIR/run/sock and its log
    DIR/serve.log, once it answers PING (what every harness's MTA and the benchmarks
    then talk to; its private socket listens by then too). Not ready in 60 s: stopped,
    and RuntimeError with its log's tail."""
    serve_log = d / "serve.log"
    named = ["--model", str(model)] if model is not None else []
    with open(serve_log, "wb") as f:
        serve = subprocess.Popen([*spamnb, "serve", *named, "--socket", str(d / "run" / "sock"),
                                  "--spamd", f"127.0.0.1:{spamd_port}", *options], stdout=f,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        wait_for("spamnb serve", lambda: b"PONG" in spamd_ask(spamd_port, b"PING SPAMC/1.5\r\n\r\n", 2),
                 serve, serve_log, timeout=60)
    except BaseException:
        stop(serve)
        raise
    out(f"spamnb serve --spamd 127.0.0.1:{spamd_port} ({' '.join(options) if model is None else f'model {model}'})")
    return serve


def leave(d: Path, *, keep: bool, made: bool, out, procs=()) -> None:
    """A run's end: its processes stopped, then its folder kept (said) or, when the run
    made it, removed."""
    for proc in procs:
        stop(proc)
    if keep:
        out(f"\nkept: {d}")
    elif made:
        shutil.rmtree(d, ignore_errors=True)


def main(argv=None) -> int:
    ap = mta_arguments(__doc__)
    ap.add_argument("--exim", help="the exim binary (default: exim4 or exim on PATH, or in /usr/sbin)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (config, logs, maildir)")
    args = ap.parse_args(argv)

    def go(model, exim):
        print_pair(args.ham, args.spam)
        return run(model, args.ham.read_bytes(), args.spam.read_bytes(), exim=exim, keep=args.keep)

    return drive("exim_spamd", "Exim and spamnb", args.model, lambda: find_exim(args.exim), go)


def mta_arguments(doc: str) -> argparse.ArgumentParser:
    """An MTA script's parser with the options they all take: --model, --ham, --spam."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="a spamnb model (default: train one on the shipped corpus)")
    ap.add_argument("--ham", type=Path, default=DEFAULT_HAM, help="the ham to send (default: %(default)s)")
    ap.add_argument("--spam", type=Path, default=DEFAULT_SPAM, help="the spam to send (default: %(default)s)")
    return ap


def drive(prog, what, model, check, go) -> int:
    """An MTA script's run after its arguments: ``check()`` what the run needs
    (before the model is trained, about 20 s), a model (``model``, else one
    trained on the shipped corpus), ``go(model, checked) -> problems``, then
    :func:`finish`. :class:`Unavailable` at any step: one line and
    :data:`EXIT_UNAVAILABLE`. SIGTERM exits, so ``run``'s finally stops the servers."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        checked = check()
        with tempfile.TemporaryDirectory(prefix=f"spamnb-{prog}-model-") as tmp:
            model = model_or_trained(model, tmp)
            t0 = time.monotonic()
            problems = go(model, checked)
    except Unavailable as e:
        print(f"{prog}.py: cannot run: {e}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    return finish(problems, what, t0)


def print_pair(ham: Path, spam: Path) -> None:
    """Which ham and spam a run sends (relative to the repository when inside it)."""
    for label, path in (("ham: ", ham), ("spam:", spam)):
        print(f"{label} {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


def model_or_trained(model, tmp):
    """``model``, else a model trained on the shipped corpus into ``tmp`` (about 20 s)."""
    if model is not None:
        return model
    started = time.monotonic()
    model = Path(tmp) / "model.joblib"
    print("training a model on corpora/spamassassin.tar.xz ...")
    subprocess.run([sys.executable, "-m", "spamnb", "train", "--index",
                    str(ROOT / "corpora" / "spamassassin.tar.xz"), "--model", str(model)],
                   check=True, stdout=subprocess.DEVNULL)
    print(f"trained in {time.monotonic() - started:.1f} s")
    return model


def finish(problems, what, t0) -> int:
    """The run's last lines, and its exit status: 0 when all was as expected."""
    print(f"\n{what}: {time.monotonic() - t0:.1f} s")
    for p in problems:
        print(f"DIFFERS: {p}", file=sys.stderr)
    print("all as expected" if not problems else f"{len(problems)} difference(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
