#!/usr/bin/env python3
"""spamnb's own milter (``spamnb serve --milter``) in front of a real Sendmail, end to end.

A private Sendmail (Debian's, 8.17.1.9 on Debian 12; unpacked, not installed) whose ``sendmail.cf``
is made with m4 from Debian's ``sendmail-cf`` macros and holds docs/admin.md's
``INPUT_MAIL_FILTER`` line **as the page writes it** (read from the page by
``tests/docsnippets.py``; only its port is moved to a free one, by that file's
``SUBSTITUTE`` table), started as a daemon (``sendmail -bD``) on a private port of
127.0.0.1. Two settings, one instance each, one SMTP session per message:

* tagging (the default): a ham, a spam, a spam whose body starts with blank lines
  and a ham carrying a forged verdict (``X-Spam-Flag: YES``, ``X-Spam-Status: Yes``,
  ``X-Spam-Level``), all delivered: the spam with ``X-Spam-Flag: YES``, each with
  spamnb's ``X-Spam-Status`` in SpamAssassin's form (its score spamd's for the
  message as sent: Sendmail hands a milter the message without its own
  ``Received:``), the forged fields gone, the bodies byte for byte and every
  header field as sent (but the address fields Sendmail re-folds, below), each
  message's line naming Sendmail's queue id (``qid=``, the ``{i}`` macro);
* ``--milter-reject``: the spam refused at the end of DATA (550 5.7.1), the ham
  delivered.

The instance, all in a temporary folder DIR (no system configuration of Sendmail's
read or touched; host names from /etc/hosts only):

* ``DIR/sendmail.mc`` (:func:`sendmail_mc`): ``confDOMAIN_NAME`` mx.spamnb.test,
  ``LOCAL_DOMAIN(spamnb.test)``, ``QUEUE_DIR`` DIR/queue, a service switch of its
  own (``hosts files``: no DNS), no probing of interfaces, no MSA on port 587
  (``no_default_msa``), load-average limits out of the way (a shared machine), no
  ident lookups; the ``local`` mailer is DIR/deliver, a shell script that writes
  the message into DIR/mail/Maildir (tmp/, then new/), run as ``nobody``
  (``confDEF_USER_ID``); its flags ``Pmn8`` and ``-wA``: a Return-Path (``P``),
  several recipients a run (``m``), no Unix ``From`` line (``n``), 8-bit bodies
  passed as they are (``8``: never made quoted-printable), no passwd lookup for
  ``bob`` (``-w``), no aliases (``-A``: no alias database to build); not the
  macros' default ``9`` (7-bit MIME made 8-bit), and no ``E`` (``>From``
  escapes): a body byte for byte;
* the host name: Sendmail sleeps 60 s at every start when the machine's host
  name has no dot and nothing qualifies it (before it reads its configuration,
  so no option helps); there it runs in a UTS namespace of its own
  (``unshare --uts``) named mx.spamnb.test;
* what Sendmail does to every message it delivers, milter or not, set aside:
  ``Return-Path:`` (the mailer's ``P`` flag: the message's own one replaced) and
  its ``Received:`` on top, and the address fields (``To:``, ``Cc:``, ``From:``,
  ...) re-folded (its ``commaize()``: a list re-wrapped, continuation lines
  indented by eight spaces): accepted when only their white space differs, said.

Where Sendmail comes from: Debian's installed (``/usr/libexec/sendmail/sendmail``
and ``/usr/share/sendmail/cf``), else unpacked into ``.sendmail-deb/`` (``--unpack-only``:
``apt-get download sendmail-bin sendmail-cf m4`` and ``dpkg-deb -x``; scripts/test.sh
does it as root): installing it would remove the other MTA (Exim or Postfix) and
start a system Sendmail. Needs root (the daemon, and delivery as ``nobody``).

    python tools/harnesses/sendmail_own_milter.py --unpack-only      # once, as root: .sendmail-deb/
    python tools/harnesses/sendmail_own_milter.py --model ~/.local/share/spamnb/model.joblib --keep

Exit status: 0 when everything is as expected, 1 when something differs (each
difference is printed), 77 when it cannot run here, with the reason.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the project: spamnb, tools
from tools.harnesses.exim_spamd import (DOMAIN, EXIT_UNAVAILABLE, ROOT, Unavailable, as_sent,  # noqa: E402
                                        delivered, drive, free_port, leave, mta_arguments, print_pair,
                                        smtp_send, spamd_check, start_serve, stop, tail, unpack_debs, wait_for,
                                        docsnippets, smtp_greets)
from tools.harnesses.postfix_milter import FORGED  # noqa: E402
from tools.harnesses.postfix_spamc import SPAMNB_ADDS, STATUS, field_name, fields_of  # noqa: E402

UNPACKED = ROOT / ".sendmail-deb"
PACKAGES = ("sendmail-bin", "sendmail-cf", "m4")  # the daemon, its m4 macros, m4
HOSTNAME = f"mx.{DOMAIN}"
DELIVERY_USER = "nobody"
# what Sendmail writes on top of each message it delivers here, and the sent field it
# drops for its own (a Return-Path: is the mailer's, P flag)
SENDMAIL_ADDS = {"return-path", "received"}
SENDMAIL_DROPS = {"return-path"}
# the fields Sendmail takes as address lists (H_FROM or H_RCPT in its conf.c) and
# writes out again through commaize(): re-folded
ADDRESS_FIELDS = {"from", "sender", "reply-to", "errors-to", "disposition-notification-to", "resent-from",
                  "resent-sender", "resent-reply-to", "to", "cc", "bcc", "resent-to", "resent-cc",
                  "resent-bcc", "apparently-to"}
REJECT = "550 5.7.1 Message refused as spam by spamnb"
QID = re.compile(r"\b2\.0\.0 (\S+) Message accepted for delivery")


class Sendmail:
    """Where a Sendmail is: its daemon, its cf macros' folder and an m4."""

    def __init__(self, binary: Path, cf: Path, m4: str, where: str):
        self.binary, self.cf, self.m4, self.where = binary, cf, m4, where

    def __repr__(self):
        return f"Sendmail ({self.where}: {self.binary})"


def find_sendmail() -> Sendmail:
    """The installed Sendmail, else the unpacked one, or :class:`Unavailable` saying why
    there is none (or we are not root). Runs nothing: :func:`version` does."""
    if os.geteuid() != 0:
        raise Unavailable("not root: the Sendmail daemon and its delivery as nobody need root")
    for prefix, where in ((Path("/"), "installed"), (UNPACKED, f"unpacked in {UNPACKED.relative_to(ROOT)}")):
        cf = prefix / "usr" / "share" / "sendmail" / "cf"
        for binary in (prefix / "usr" / "libexec" / "sendmail" / "sendmail",  # Debian 12
                       prefix / "usr" / "lib" / "sm.bin" / "sendmail"):  # Debian 11 and before
            if binary.is_file() and (cf / "m4" / "cf.m4").is_file():
                m4 = shutil.which("m4") or str(UNPACKED / "usr" / "bin" / "m4")
                if not os.access(m4, os.X_OK):
                    raise Unavailable(f"no m4 for {binary} (apt-get install m4)")
                return Sendmail(binary, cf, m4, where)
    raise Unavailable(f"no Sendmail installed or in {UNPACKED.relative_to(ROOT)} "
                      "(python tools/harnesses/sendmail_own_milter.py --unpack-only, as root)")


def unpack() -> Sendmail:
    """Sendmail's daemon, its macros and m4 unpacked (:func:`unpack_debs`): nothing installed."""
    unpack_debs(PACKAGES, UNPACKED)
    return find_sendmail()


def unpack_missing() -> int:
    """Unpack Sendmail where none is there already: 0, or 77 saying why not."""
    try:
        if os.geteuid() != 0:
            raise Unavailable("not root: --unpack-only needs root")
        try:
            find_sendmail()
        except Unavailable:
            unpack()
    except (Unavailable, OSError, subprocess.CalledProcessError) as e:
        print(f"sendmail_own_milter.py: cannot unpack: {e}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    return 0


def qualified(argv: list[str]) -> list[str]:
    """``argv`` run under a host name with a dot (module doc): as it is when the machine's
    has one, else in a UTS namespace of its own named :data:`HOSTNAME`."""
    if "." in socket.gethostname():
        return argv
    unshare = shutil.which("unshare")
    if unshare is None:
        raise Unavailable(f"the host name {socket.gethostname()!r} has no dot (Sendmail would sleep 60 s"
                          " at each start) and there is no unshare(1) to give it one of its own")
    return [unshare, "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', HOSTNAME, *argv]


def version(sm: Sendmail, d: Path) -> str:
    """Sendmail's version (``-d0.1``), or :class:`Unavailable` when it does not run here
    (a library missing, no milter support, no UTS namespace for its host name)."""
    try:
        r = subprocess.run(qualified([str(sm.binary), "-d0.1", "-C", str(d / "absent.cf"), "-bt"]),
                           capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        raise Unavailable(f"{sm.binary} does not run: {e}") from e
    found = re.search(r"^Version (\S+)", r.stdout, re.M)
    if found is None:
        raise Unavailable(f"{sm.binary} does not run here: {(r.stderr or r.stdout).strip()[:300]}")
    if not re.search(r"\bMILTER\b", r.stdout):
        raise Unavailable(f"{sm.binary} is built without milter support")
    return found.group(1)


def docs_milter_line(d: Path, spamnb: list[str]) -> tuple[str, str]:
    """docs/admin.md's ``INPUT_MAIL_FILTER`` line, read from the page and changed only by
    ``tests/docsnippets.py``'s ``SUBSTITUTE`` (its port a free one), and the address
    ``spamnb serve --milter`` then listens on: (line, address)."""
    snippets = docsnippets()
    line = snippets.Site(d, spamnb).text(snippets.line(snippets.ADMIN, "INPUT_MAIL_FILTER("))
    socket_ = re.search(r"\bS=(inet|unix|local):([^,']+)", line)
    if socket_ is None:
        raise RuntimeError(f"docs/admin.md's line names no S=inet: or S=unix: socket: {line}")
    if socket_.group(1) == "inet":
        port, _, host = socket_.group(2).partition("@")
        return line, f"{host or '127.0.0.1'}:{port}"
    return line, f"unix:{socket_.group(2)}"


def sendmail_mc(d: Path, sm: Sendmail, smtp_port: int, milter_line: str) -> str:
    """The private instance's ``sendmail.mc`` (module doc), with ``milter_line`` as given."""
    nobody = pwd.getpwnam(DELIVERY_USER)
    return f"""\
divert(-1)
# written by tools/harnesses/sendmail_own_milter.py: a private instance, nothing else is read
divert(0)dnl
include(`{sm.cf}/m4/cf.m4')dnl
VERSIONID(`spamnb test instance')dnl
OSTYPE(`linux')dnl
define(`confDOMAIN_NAME', `{HOSTNAME}')dnl
define(`confDONT_PROBE_INTERFACES', `True')dnl
define(`confSERVICE_SWITCH_FILE', `{d}/service.switch')dnl
define(`QUEUE_DIR', `{d}/queue')dnl
define(`ALIAS_FILE', `')dnl
define(`STATUS_FILE', `')dnl
define(`confPID_FILE', `{d}/sendmail.pid')dnl
define(`confDEF_USER_ID', `{nobody.pw_uid}:{nobody.pw_gid}')dnl
define(`confQUEUE_LA', `1000')dnl
define(`confREFUSE_LA', `1000')dnl
define(`confTO_IDENT', `0')dnl
define(`LOCAL_MAILER_PATH', `{d}/deliver')dnl
define(`LOCAL_MAILER_ARGS', `deliver $u')dnl
define(`LOCAL_MAILER_FLAGS', `Pmn8')dnl
MODIFY_MAILER_FLAGS(`LOCAL', `-wA')dnl
FEATURE(`no_default_msa')dnl
FEATURE(`nocanonify')dnl
FEATURE(`accept_unresolvable_domains')dnl
LOCAL_DOMAIN(`{DOMAIN}')dnl
DAEMON_OPTIONS(`Port={smtp_port}, Addr=127.0.0.1, Name=MTA')dnl
{milter_line}
MAILER(`local')dnl
MAILER(`smtp')dnl
"""


class Instance:
    """A running private Sendmail (:func:`instance`): its folder, SMTP and spamd ports, maildir."""

    def __init__(self, d: Path, smtp_port: int, spamd_port: int, milter: str, version: str):
        self.d, self.smtp_port, self.spamd_port, self.milter, self.version = d, smtp_port, spamd_port, milter, version
        self.serve_log = d / "serve.log"
        self.maildir = d / "mail" / "Maildir"


@contextlib.contextmanager
def instance(model: Path, sm: Sendmail, *, workdir: Path | None = None, keep: bool = False, out=print,
             spamnb: list[str] | None = None, serve_options=()):
    """``spamnb serve --spamd --milter`` and a private Sendmail in front of it, started;
    yields an :class:`Instance`, and stops both (and removes the folder unless ``keep``)
    at the end. ``serve_options``: more of ``spamnb serve``'s (``--milter-reject``).

    Raises :class:`Unavailable` when Sendmail cannot run here, RuntimeError when a part
    does not start."""
    spamnb = spamnb or [sys.executable, "-m", "spamnb"]
    d = Path(workdir or tempfile.mkdtemp(prefix="spamnb-sendmail-"))
    serve = daemon = None
    try:
        d.chmod(0o755)  # the delivery program, as nobody, is DIR/deliver and writes under DIR/mail
        for sub in ("run", "queue", "mail/Maildir/tmp", "mail/Maildir/new", "mail/Maildir/cur"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        (d / "run").chmod(0o700)
        (d / "queue").chmod(0o700)
        nobody = pwd.getpwnam(DELIVERY_USER)
        for sub in ("mail", "mail/Maildir", "mail/Maildir/tmp", "mail/Maildir/new", "mail/Maildir/cur"):
            os.chown(d / sub, nobody.pw_uid, nobody.pw_gid)
        release = version(sm, d)
        (d / "service.switch").write_text("hosts files\naliases files\n")
        (d / "deliver").write_text(f"""\
#!/bin/sh
# the local mailer of tools/harnesses/sendmail_own_milter.py's instance: the message into the maildir
f={d}/mail/Maildir/tmp/$(date +%s.%N).$$
cat > "$f" && mv "$f" {d}/mail/Maildir/new/
""")
        (d / "deliver").chmod(0o755)
        milter_line, milter_address = docs_milter_line(d, spamnb)
        spamd_port, smtp_port = free_port(), free_port()
        while smtp_port == spamd_port or milter_address.endswith(f":{smtp_port}"):
            smtp_port = free_port()
        mc, cf = d / "sendmail.mc", d / "sendmail.cf"
        mc.write_text(sendmail_mc(d, sm, smtp_port, milter_line))
        made = subprocess.run([sm.m4, str(mc)], capture_output=True, text=True, timeout=60)
        if made.returncode != 0 or made.stderr.strip():
            raise RuntimeError(f"m4 {mc} failed: {made.stderr.strip()[:400]}")
        cf.write_text(made.stdout)
        cf.chmod(0o644)

        serve = start_serve(spamnb, model, d, spamd_port, out, options=["--milter", milter_address, *serve_options])
        log = d / "sendmail.out"
        with open(log, "wb") as f:
            daemon = subprocess.Popen(qualified([str(sm.binary), "-bD", "-C", str(cf)]), stdout=f,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

        wait_for("sendmail -bD", lambda: smtp_greets(smtp_port), daemon, log)
        out(f"{sm}, version {release}: sendmail -bD -C {cf}: SMTP on 127.0.0.1:{smtp_port},"
            f" delivering as {DELIVERY_USER} to {d / 'mail' / 'Maildir'}")
        out(f"  sendmail.mc: {milter_line}")
        yield Instance(d, smtp_port, spamd_port, milter_address, release)
    finally:
        stop(daemon)
        leave(d, keep=keep, made=workdir is None, out=out, procs=(serve,))


def send(inst: Instance, label: str, msg: bytes, problems: list[str], out, want: int = 250,
         timeout: float = 20.0) -> tuple[Path | None, str | None]:
    """One SMTP session with ``msg``: (the file it was delivered to, Sendmail's queue id),
    None for each it has not (DATA not answered 250, or a problem: added to ``problems``)."""
    before = set(delivered(inst.maildir))
    code, text = smtp_send(inst.smtp_port, msg, out)
    if code != want:
        problems.append(f"{label}: DATA answered {code} {text}, expected {want}")
    if code != 250:
        return None, None
    qid = QID.search(text)
    end = time.monotonic() + timeout
    while not set(delivered(inst.maildir)) - before and time.monotonic() < end:
        time.sleep(0.05)
    new = [p for p in delivered(inst.maildir) if p not in before]
    if len(new) != 1:
        problems.append(f"{label}: {len(new)} new files in {inst.maildir} after {timeout:.0f} s, expected 1"
                        f" (queue: {sorted(p.name for p in (inst.d / 'queue').iterdir())})")
        return None, qid and qid.group(1)
    out(f"  delivered: {new[0].relative_to(inst.d)}")
    return new[0], qid and qid.group(1)


def unfolded(field: bytes) -> bytes:
    """A field with its white space runs made one space (folding included)."""
    return b" ".join(field.split())


def check_delivered(label: str, got: bytes, sent: bytes, problems: list[str], out) -> float | None:
    """A delivered message against the one sent (module doc); its X-Spam-Status score."""
    before = len(problems)
    got, sent = got.replace(b"\r\n", b"\n"), sent.replace(b"\r\n", b"\n")
    head, _, body = got.partition(b"\n\n")
    s_head, _, s_body = sent.partition(b"\n\n")
    fields = fields_of(head)
    spamnb = [f for f in fields if field_name(f) in SPAMNB_ADDS]
    rest = [f for f in fields if field_name(f) not in SPAMNB_ADDS]
    s_fields = fields_of(s_head)
    dropped = [f for f in s_fields if field_name(f) in SENDMAIL_DROPS]
    expected = [f for f in s_fields if field_name(f) not in SENDMAIL_DROPS]
    first = lambda f: f.decode(errors="replace").splitlines()[0] + (" ..." if b"\n" in f else "")  # noqa: E731
    on_top = rest[:len(rest) - len(expected)] if len(rest) >= len(expected) else []
    mine = rest[len(on_top):]
    for f in on_top:
        out(f"  added by Sendmail:     {first(f)}")
    for f in spamnb:
        out(f"  added by spamnb:    {first(f)}")
    for f in dropped:
        out(f"  dropped by Sendmail:   {first(f)}  (its own, the mailer's P flag)")
    flags = [f.split(b":", 1)[1].strip() for f in spamnb if field_name(f) == "x-spam-flag"]
    want = [b"YES"] if label == "spam" else []
    if flags != want:
        problems.append(f"{label}: X-Spam-Flag {flags}, expected {want}")
    statuses = [f.split(b":", 1)[1].strip() for f in spamnb if field_name(f) == "x-spam-status"]
    m = STATUS.match(statuses[0]) if len(statuses) == 1 else None
    if m is None or m.group(1) != (b"Yes" if label == "spam" else b"No"):
        problems.append(f"{label}: X-Spam-Status {statuses}, expected one in SpamAssassin's form"
                        f" ({'Yes' if label == 'spam' else 'No'}, score=S required=T tests=SPAMNB_...)")
    foreign = [field_name(f) for f in on_top if field_name(f) not in SENDMAIL_ADDS]
    if foreign or len(rest) < len(expected):
        problems.append(f"{label}: Sendmail's fields on top are {[field_name(f) for f in on_top]},"
                        f" expected only {sorted(SENDMAIL_ADDS)} ({len(rest)} fields against {len(expected)} sent)")
    refolded = []
    for g, s in zip(mine, expected):
        if g == s:
            continue
        if field_name(g) == field_name(s) in ADDRESS_FIELDS and unfolded(g) == unfolded(s):
            refolded.append(field_name(g))
        else:
            problems.append(f"{label}: the field {first(s)!r} was delivered as {first(g)!r}")
    if refolded:
        out(f"  re-folded by Sendmail: {', '.join(refolded)} (an address list, only its white space)")
    if body != s_body:
        problems.append(f"{label}: the body delivered differs from the one sent ({len(body)} bytes against"
                        f" {len(s_body)})")
    elif len(problems) == before:
        out(f"  every other byte as sent (body {len(s_body)} bytes, LF line ends in the maildir)")
    return float(m.group(2)) if m else None


def run(model: Path, ham: bytes, spam: bytes, *, sendmail: Sendmail | None = None, workdir: Path | None = None,
        keep: bool = False, out=print, spamnb: list[str] | None = None) -> list[str]:
    """Both settings (module doc); the differences from what is expected (none: all well).

    Raises :class:`Unavailable` when Sendmail cannot run here."""
    sm = sendmail or find_sendmail()
    problems: list[str] = []
    ham, spam = as_sent(ham), as_sent(spam)
    forged = ham.replace(b"\r\nSubject:", b"\r\n" + FORGED + b"Subject:", 1)
    blank_spam = spam.replace(b"\r\n\r\n", b"\r\n\r\n\r\n\r\n", 1)
    tagging = [("ham", ham, ham, 250), ("spam", spam, spam, 250),
               ("spam, body starting with blank lines", blank_spam, blank_spam, 250),
               ("forged ham", forged, ham, 250)]
    refusing = [("ham", ham, ham, 250), ("spam", spam, spam, 550)]
    for options, cases in (([], tagging), (["--milter-reject"], refusing)):
        try:
            with instance(model, sm, workdir=workdir, keep=keep, out=out, spamnb=spamnb,
                          serve_options=options) as inst:
                out(f"\nspamnb serve --milter {inst.milter} {' '.join(options)}".rstrip())
                qids = deliver(inst, cases, problems, out)
                check_lines(inst, qids, bool(options), problems, out)
        except RuntimeError as e:
            problems.append(str(e))
    return problems


def deliver(inst: Instance, cases, problems: list[str], out) -> list[str | None]:
    """Each case (label, message, the message as it should arrive, DATA's code) through
    Sendmail; the queue ids of those accepted."""
    qids = []
    for label, msg, clean, want in cases:
        kind = "spam" if label.startswith("spam") else "ham"
        is_spam, s_own, _ = spamd_check(inst.spamd_port, msg)
        out(f"{label}: spamnb's own CHECK of the message as sent: Spam: {is_spam} ; {s_own}")
        if is_spam != (kind == "spam"):
            problems.append(f"{label}: the model itself judges it {'spam' if is_spam else 'not spam'}")
        got, qid = send(inst, label, msg, problems, out, want=want)
        if want != 250:
            continue
        qids.append(qid)
        if got is None:
            continue
        score = check_delivered(kind, got.read_bytes(), clean, problems, out)
        if score is None or label == "forged ham":  # (spamd's CHECK had the forged fields)
            continue
        if abs(score - s_own) > 0.06:  # S has two decimals in X-Spam-Status, one in spamd's answer
            problems.append(f"{label}: X-Spam-Status says score={score}, spamd's CHECK of the message as sent"
                            f" {s_own}")
        else:
            out(f"  score={score}: spamd's for the message as sent ({s_own})")
    return qids


def check_lines(inst: Instance, qids: list[str | None], refusing: bool, problems: list[str], out):
    """spamnb's lines: each delivered message's names its queue id (``qid=``, Sendmail's
    ``{i}``); with ``--milter-reject``, one says the spam was refused."""
    time.sleep(0.2)  # the last line written
    lines = [f"{ln} " for ln in inst.serve_log.read_text(errors="replace").splitlines() if " event=message " in ln]
    named = [qid for qid in qids if qid and any(f" qid={qid} " in ln for ln in lines)]
    out(f"\nspamnb's lines of the messages delivered name Sendmail's queue ids: {len(named)} of {len(qids)}")
    if len(named) != len(qids):
        problems.append(f"spamnb's lines name {len(named)} of the queue ids {qids}"
                        f" (log: {tail(inst.serve_log, 3)})")
    if refusing:
        refused = [ln for ln in lines if " verdict=spam " in ln and " folder=refused " in ln]
        out(f"spamnb's line of the refused spam: {refused[-1].strip() if refused else '(none)'}")
        if len(refused) != 1:
            problems.append(f"--milter-reject: {len(refused)} lines of a refused spam, expected 1")


def main(argv=None) -> int:
    ap = mta_arguments(__doc__)
    ap.add_argument("--unpack-only", action="store_true",
                    help="unpack Sendmail when it is missing (scripts/test.sh, as root), and run nothing")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folders (config, queue, maildir)")
    args = ap.parse_args(argv)
    if args.unpack_only:
        return unpack_missing()

    def go(model, sm):
        print_pair(args.ham, args.spam)
        return run(model, args.ham.read_bytes(), args.spam.read_bytes(), sendmail=sm, keep=args.keep)

    return drive("sendmail_own_milter", "Sendmail and spamnb's milter", args.model, find_sendmail, go)


if __name__ == "__main__":
    sys.exit(main())
