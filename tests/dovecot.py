"""A private Dovecot IMAP server for one test: the harness of the ``spamnb imap`` tests.

:class:`Dovecot` writes its own config into a fresh temporary directory and runs
``dovecot -c CONFIG -F`` as a child process: no system config is read, nothing
in /etc changes, systemd is not involved. It listens on 127.0.0.1 on a free
high port with plaintext IMAP (``ssl = no``, ``disable_plaintext_auth = no``),
knows one user from a ``passwd-file`` (password ``{PLAIN}...``), and keeps
that user's mail in ``DIR/Maildir`` in Dovecot's default Maildir++ layout
(folders are ``DIR/Maildir/.Junk`` etc.; the hierarchy separator LIST reports is
``.``, so a sub-folder is ``Archive.2024``). INBOX's namespace has a ``Junk``
folder with the ``\\Junk`` special use, auto-created and subscribed. The log
goes to ``DIR/dovecot.log``; start-up failures quote its tail.

Who runs what:

* as an ordinary user, Dovecot cannot change users, so every one of its
  processes and the mail user are the current user: ``default_internal_user``,
  ``default_login_user`` and ``default_internal_group`` name the current
  user/group, the passwd-file's uid/gid fields are the current uid/gid, and
  ``imap-login`` and ``anvil`` run without their ``chroot`` (chroot needs root);
* as root, Dovecot runs as it would installed (its own ``dovecot``/``dovenull``
  users, chroots), but it refuses mail access as uid 0 ("Mail access not
  allowed for root", whatever ``first_valid_uid`` says), so the mail user maps to
  ``nobody:nogroup`` (65534) and the Maildir is chowned to it; the temporary
  directory is made 0755 so that uid can reach it.

What Dovecot returns (found with 2.3.19): the Maildir files are stored with LF
line ends (``mail_save_crlf = no``), and ``BODY[]`` is always served with CRLF:
an appended CRLF message comes back byte-identical, an LF-only (or mixed)
one comes back with every line end made CRLF (:func:`as_served`). So "the
message is byte-identical after a move" means: what the server returns after
the move equals what it returned before, not what was appended.

``capabilities_without`` removes capabilities from what the server announces
after login by setting ``imap_capability`` to the full list of the running
server minus those (Dovecot has no "-CAP" syntax): the server is started,
asked for its CAPABILITY, reconfigured and reloaded. The commands stay
implemented (a MOVE still works if a client sends it unannounced); only the
announcement changes, which is what a client has to go by.

Use: the ``dovecot`` fixture (tests/conftest.py) for a default server,
``make_dovecot(capabilities_without=("MOVE",))`` for others, or
``with Dovecot() as server:`` for a module-scoped one. ``server.client()`` is a
logged-in IMAPClient; ``append``, ``uids``, ``fetch_all``, ``move`` act as the
user's mail client; ``kick``, ``sessions``, ``change_uidvalidity`` and
``doveadm`` as the server's administrator.
"""

from __future__ import annotations

import contextlib
import grp
import hashlib
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path


DOVECOT = shutil.which("dovecot") or next(
    (p for p in ("/usr/sbin/dovecot", "/usr/local/sbin/dovecot") if os.access(p, os.X_OK)), None)
DOVEADM = shutil.which("doveadm") or next(
    (p for p in ("/usr/bin/doveadm", "/usr/local/bin/doveadm") if os.access(p, os.X_OK)), None)
NOT_INSTALLED = "dovecot is not installed (apt-get install dovecot-imapd; the README's test command does it when run as root)"
SIEVEC = shutil.which("sievec") or next((p for p in ("/usr/bin/sievec",) if os.access(p, os.X_OK)), None)
NO_SIEVE = ("Pigeonhole (dovecot-sieve: the imap_sieve, sieve_imapsieve and sieve_extprograms plugins, sievec) "
            "is not installed (apt-get install dovecot-sieve)")
NOBODY = 65534  # the mail user's uid and gid when the tests run as root


def imapsieve_missing() -> str | None:
    """Why a server with ``imapsieve=`` cannot run here, or None: Dovecot, and Pigeonhole's
    imap_sieve, sieve_imapsieve and sieve_extprograms plugins and ``sievec`` (dovecot-sieve)."""
    if DOVECOT is None:
        return NOT_INSTALLED
    dirs = {Path(DOVECOT).resolve().parent.parent / "lib" / "dovecot" / "modules", Path("/usr/lib/dovecot/modules")}
    needed = ("lib95_imap_sieve_plugin.so", "sieve/lib90_sieve_imapsieve_plugin.so",
              "sieve/lib90_sieve_extprograms_plugin.so")
    if SIEVEC is None or not all(any((d / so).exists() for d in dirs) for so in needed):
        return NO_SIEVE
    return None


def as_served(raw: bytes) -> bytes:
    """What Dovecot 2.3 returns as BODY[] for an appended ``raw`` (found by trying).

    Every line end is CRLF: LF, CRLF and a bare CR each become CRLF (a final
    line without one stays without); NUL becomes 0x80; other bytes, 8-bit
    ones included, are kept.
    """
    return re.sub(rb"\r\n|\r|\n", b"\r\n", raw.replace(b"\x00", b"\x80"))


def sha256(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent():
    """In the child before exec: SIGTERM when the test process dies (Linux), so a
    killed test run leaves no Dovecot behind (its own session keeps it from the
    terminal's signals); the master then stops its children."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class DovecotError(RuntimeError):
    pass


class Dovecot:
    """One private Dovecot serving one user; see the module's docstring.

    ``start()`` returns once the port accepts and the user can log in and
    SELECT INBOX (``timeout`` seconds, else :class:`DovecotError` with the
    log's tail); ``stop()`` ends it and removes the directory (``keep=True``
    keeps it for a post-mortem).
    """

    def __init__(self, user: str = "alice", password: str = "secret", *,
                 capabilities_without: tuple[str, ...] = (), timeout: float = 20.0, keep: bool = False,
                 tls: bool = False, imapsieve: str | os.PathLike | None = None, home_in_userdb: bool = True):
        if DOVECOT is None:
            raise DovecotError(NOT_INSTALLED)
        self.user, self.password = user, password
        # tls: a self-signed certificate for 127.0.0.1 (``self.cert``, its own CA), IMAPS on
        # ``self.tls_port`` and STARTTLS offered on ``self.port``
        self.tls = tls
        self.tls_port: int | None = None
        self.capabilities_without = tuple(c.upper() for c in capabilities_without)
        self.timeout, self.keep = timeout, keep
        self.host = "127.0.0.1"
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        # A short path of our own (not pytest's tmp_path): the UNIX sockets under
        # base_dir must stay under 108 bytes, and as root the mail uid must be able
        # to reach the Maildir, which pytest's 0700 base directory forbids.
        self.dir = Path(tempfile.mkdtemp(prefix="dovecot-"))
        self.config = self.dir / "dovecot.conf"
        self.log = self.dir / "dovecot.log"
        self.output = self.dir / "dovecot.out"
        self.maildir = self.dir / "Maildir"
        self.home = self.dir / "home"
        # the home the userdb gives; home_in_userdb=False: none, as for a virtual user without one
        self.userdb_home: Path | None = self.home if home_in_userdb else None
        self.passwd = self.dir / "passwd"
        self.root = os.geteuid() == 0
        self.extra_config = ""  # more settings, appended to the config (set before start)
        # imapsieve: a folder where spamnb.delivery.imapsieve.install() wrote the scripts and the
        # settings for learning from moves; its settings file is appended to the config as shipped
        self.imapsieve = Path(imapsieve) if imapsieve is not None else None

    # -- configuration -------------------------------------------------------

    def _config_text(self) -> str:
        d = self.dir
        lines = [
            "protocols = imap",
            "listen = 127.0.0.1",
            f"base_dir = {d}/run",
            f"state_dir = {d}/state",
            f"log_path = {self.log}",
            *([f"ssl = yes", f"ssl_cert = <{self.cert}", f"ssl_key = <{self.key}"] if self.tls else ["ssl = no"]),
            "disable_plaintext_auth = no",
            "auth_mechanisms = plain login",
            f"mail_location = maildir:{self.maildir}",
            "passdb {",
            "  driver = passwd-file",
            f"  args = scheme=PLAIN {self.passwd}",
            "}",
            "userdb {",
            "  driver = passwd-file",
            f"  args = {self.passwd}",
            "}",
            "namespace inbox {",
            "  inbox = yes",
            "  mailbox Junk {",
            "    special_use = \\Junk",
            "    auto = subscribe",
            "  }",
            "}",
            "service imap-login {",
            "  inet_listener imap {",
            "    address = 127.0.0.1",
            f"    port = {self.port}",
            "  }",
            "  inet_listener imaps {",
            *(["    address = 127.0.0.1", f"    port = {self.tls_port}"] if self.tls else ["    port = 0"]),
            "  }",
        ]
        if not self.root:  # else: "imap-login: Fatal: chroot(.../run/login) failed"
            lines.append("  chroot =")
        lines.append("}")
        if not self.root:
            user = pwd.getpwuid(os.geteuid()).pw_name
            group = grp.getgrgid(os.getegid()).gr_name
            lines += [
                f"default_internal_user = {user}",
                f"default_internal_group = {group}",
                f"default_login_user = {user}",  # else: "fchown() failed for .../run/login"
                "service anvil {",  # else: "anvil: Fatal: chroot(.../run/empty) failed"
                "  chroot =",
                "}",
            ]
        return "\n".join(lines) + "\n" + self._imapsieve_config() + self.extra_config

    def _imapsieve_config(self) -> str:
        if self.imapsieve is None:
            return ""
        from spamnb.delivery.imapsieve import CONF

        return (self.imapsieve / CONF).read_text()

    def _write_files(self):
        uid, gid = (NOBODY, NOBODY) if self.root else (os.geteuid(), os.getegid())
        self.passwd.write_text(f"{self.user}:{{PLAIN}}{self.password}:{uid}:{gid}::{self.userdb_home or ''}::\n")
        self.passwd.chmod(0o644)  # as root, auth-worker reads it as the dovecot user
        for p in (self.maildir, self.home):
            p.mkdir(exist_ok=True)
            if self.root:
                os.chown(p, uid, gid)
        if self.root:
            self.dir.chmod(0o755)
        self.config.write_text(self._config_text())

    # -- life cycle ----------------------------------------------------------

    def start(self) -> "Dovecot":
        try:
            self._start()
        except BaseException:
            self.stop()  # the error quotes the config and the log's tail
            raise
        return self

    @property
    def cert(self) -> Path:
        return self.dir / "cert.pem"

    @property
    def key(self) -> Path:
        return self.dir / "key.pem"

    def _make_certificate(self):
        """A self-signed certificate valid for 127.0.0.1 and localhost (openssl)."""
        openssl = shutil.which("openssl")
        if openssl is None:
            raise DovecotError("openssl is not installed: no certificate for the TLS server")
        subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                        "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                        "-keyout", str(self.key), "-out", str(self.cert)], check=True, capture_output=True,
                       timeout=60)
        self.key.chmod(0o600)
        self.cert.chmod(0o644)

    def _start(self):
        if self.tls:
            self._make_certificate()
        if self.imapsieve is not None:
            self._check_sieve()
        for attempt in range(3):  # the free port may be taken between our probe and Dovecot's bind
            self.port = _free_port()
            self.tls_port = _free_port() if self.tls else None
            self._write_files()
            if self.imapsieve is not None:
                self.compile_sieve()
            with open(self.output, "wb") as out:  # what it says before its log is open
                self.proc = subprocess.Popen([DOVECOT, "-c", str(self.config), "-F"], stdin=subprocess.DEVNULL,
                                             stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                             preexec_fn=_die_with_parent)
            try:
                self._wait_ready()
                break
            except DovecotError as e:
                self._terminate()
                if attempt == 2 or "Address already in use" not in str(e):
                    raise
        if self.capabilities_without:
            self._drop_capabilities()

    def _check_sieve(self):
        if imapsieve_missing():
            raise DovecotError(imapsieve_missing())

    def compile_sieve(self):
        """Compile the IMAPSieve scripts with this server's settings, as the admin does with
        ``sievec`` (as root their folder is root's: the mail user could not save the binaries)."""
        for name in ("report-spam.sieve", "report-ham.sieve"):
            r = subprocess.run([SIEVEC, "-c", str(self.config), str(self.imapsieve / name)],
                               capture_output=True, text=True, timeout=60)
            if r.returncode:
                self._fail(f"sievec {name} failed: {r.stdout}{r.stderr}")

    def _wait_ready(self):
        deadline = time.monotonic() + self.timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                out = self.output.read_text(errors="replace").strip()
                self._fail(f"dovecot exited with status {self.proc.returncode}: {out}")
            try:
                with self.client() as c:
                    c.select_folder("INBOX")  # LOGIN says OK even when the mail process then fails
                if "Fatal:" in self.log_tail(1000):  # e.g. anvil's, which logins survive
                    self._fail("a process of it failed (Fatal: in its log)")
                return
            except OSError as e:  # refused until it listens
                last = e
                time.sleep(0.05)
            except Exception as e:  # it listens, but LOGIN or SELECT fails: the log says why
                self._fail(f"{type(e).__name__}: {e}")
        self._fail(f"no working LOGIN within {self.timeout:g} s (last error: {last!r})")

    def _fail(self, why: str):
        raise DovecotError(f"private dovecot in {self.dir} did not start: {why}\n"
                           f"--- config {self.config}\n{self.config.read_text()}"
                           f"--- last lines of {self.log}:\n{self.log_tail()}")

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return "(no log)"

    def _terminate(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            # SIGTERM to the master alone takes it ~1 s (it waits for its children);
            # to its whole process group (its own session, see start) usually ~20 ms,
            # and when a child lingers, SIGKILL: nothing of a test server is worth a second
            for sig, wait in ((signal.SIGTERM, 0.3), (signal.SIGKILL, 10)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, sig)
                try:
                    self.proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    pass

    def stop(self):
        self._terminate()
        if not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def _drop_capabilities(self):
        with self.client() as c:
            caps = [cap.decode() for cap in c.capabilities()]
        kept = [cap for cap in caps if cap.upper() not in self.capabilities_without]
        self.extra_config += f"imap_capability = {' '.join(kept)}\n"
        self.config.write_text(self._config_text())
        self.doveadm("reload")
        deadline = time.monotonic() + self.timeout
        while True:  # the reload is asynchronous: wait for new logins to see the new list
            try:
                with self.client() as c:
                    now = {cap.decode().upper() for cap in c.capabilities()}
                if not now & set(self.capabilities_without):
                    return
            except Exception:
                pass
            if time.monotonic() > deadline:
                self._fail(f"capabilities {self.capabilities_without} still announced after reload")
            time.sleep(0.05)

    # -- administration ------------------------------------------------------

    def doveadm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        if DOVEADM is None:
            raise DovecotError("doveadm is not installed (it comes with dovecot-core)")
        r = subprocess.run([DOVEADM, "-c", str(self.config), *args], capture_output=True, text=True, timeout=30)
        if check and r.returncode:
            raise DovecotError(f"doveadm {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}"
                               f"\n--- log tail:\n{self.log_tail()}")
        return r

    def sessions(self) -> list[int]:
        """The pids of the user's IMAP sessions (``doveadm who``)."""
        out = self.doveadm("who", "-1", self.user).stdout.splitlines()[1:]  # the first line is a header
        return [int(line.split()[2]) for line in out if line.split()[:1] == [self.user]]

    def kick(self, timeout: float = 10.0):
        """Drop every IMAP session of the user: their next command fails.

        ``doveadm kick`` only signals the sessions' processes; this returns once
        they are gone, so a client's next command cannot slip in before.
        """
        self.doveadm("kick", self.user)
        deadline = time.monotonic() + timeout
        while self.sessions():
            if time.monotonic() > deadline:
                raise DovecotError(f"{self.user}'s sessions still there {timeout:g} s after doveadm kick"
                                   f"\n--- log tail:\n{self.log_tail()}")
            time.sleep(0.02)

    def uidvalidity(self, folder: str) -> int:
        with self.client() as c:
            return c.folder_status(folder, [b"UIDVALIDITY"])[b"UIDVALIDITY"]

    def change_uidvalidity(self, folder: str, value: int | None = None) -> int:
        """Give ``folder`` a new UIDVALIDITY (old + 1 unless ``value``); messages stay."""
        old = self.uidvalidity(folder)
        new = value if value is not None else old + 1
        self.doveadm("mailbox", "update", "-u", self.user, "--uid-validity", str(new), folder)
        got = self.uidvalidity(folder)
        if got != new:
            raise DovecotError(f"UIDVALIDITY of {folder} is {got} after setting {new} (was {old})")
        return new

    # -- the user's side -----------------------------------------------------

    @contextlib.contextmanager
    def client(self):
        """An IMAPClient logged in as the user (logged out afterwards)."""
        from imapclient import IMAPClient

        c = IMAPClient(self.host, port=self.port, ssl=False, timeout=10)
        try:
            c.login(self.user, self.password)
            yield c
        finally:
            with contextlib.suppress(Exception):
                c.logout()
            with contextlib.suppress(Exception):
                c.shutdown()

    def create_folder(self, folder: str):
        with self.client() as c:
            if not c.folder_exists(folder):
                c.create_folder(folder)

    def append(self, folder: str, raw: bytes, flags=()) -> int:
        """Append ``raw`` to ``folder``; returns its UID (from UIDPLUS' APPENDUID)."""
        with self.client() as c:
            resp = c.append(folder, raw, flags=flags)
        # b'[APPENDUID 1796147216 3] Append completed.'
        return int(resp.split(b"]")[0].split()[-1])

    def uids(self, folder: str) -> list[int]:
        with self.client() as c:
            c.select_folder(folder, readonly=True)
            return sorted(c.search("ALL"))

    def fetch_all(self, folder: str) -> dict[int, bytes]:
        """{uid: the message as the server returns it (BODY.PEEK[], so \\Seen stays as it was)}."""
        with self.client() as c:
            c.select_folder(folder, readonly=True)
            uids = c.search("ALL")
            if not uids:
                return {}
            return {uid: data[b"BODY[]"] for uid, data in c.fetch(uids, ["BODY.PEEK[]"]).items()}

    def copy(self, src: str, uid: int, dst: str) -> int | None:
        """COPY one message (it stays in ``src``); returns its UID in ``dst``."""
        with self.client() as c:
            c.select_folder(src)
            c._imap.untagged_responses.pop("COPYUID", None)
            c.copy([uid], dst)
            copyuid = c._imap.untagged_responses.pop("COPYUID", None)
        return int(copyuid[-1].split()[2]) if copyuid else None

    def move(self, src: str, uid: int, dst: str) -> int | None:
        """Move one message as a user's mail client would; returns its UID in ``dst``.

        MOVE when the server announces it, otherwise COPY, flag \\Deleted and
        UID EXPUNGE (UIDPLUS) that one message.
        """
        with self.client() as c:
            c.select_folder(src)
            c._imap.untagged_responses.pop("COPYUID", None)
            if c.has_capability("MOVE"):
                c.move([uid], dst)
            else:
                c.copy([uid], dst)
                c.add_flags([uid], [b"\\Deleted"])
                c.uid_expunge([uid])
            copyuid = c._imap.untagged_responses.pop("COPYUID", None)  # imaplib files the response code here
        if not copyuid:
            return None
        # [COPYUID uidvalidity source-uids destination-uids]
        return int(copyuid[-1].split()[2])
