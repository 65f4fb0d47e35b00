#!/usr/bin/env python3
"""Postfix's spamc content filter against ``spamnb serve --spamd``, end to end.

The README's ``master.cf`` lines (an ``smtpd`` with ``-o content_filter=spamnb:dummy``
and a ``pipe`` service running ``spamc -e sendmail``), run in a private Postfix
instance: a ham and a spam are sent to its smtpd through an SMTP session, each
goes through spamc to spamnb and back into the same instance by ``sendmail``,
and both are delivered to a maildir with spamnb's ``X-Spam-Flag``. Everything
lives in a temporary folder DIR; no system configuration is read or touched:

1. a model: ``--model FILE``, or trained on the shipped corpus (about 20 s);
2. ``spamnb serve --model ... --socket DIR/run/sock --spamd 127.0.0.1:PORT``;
3. a private Postfix (:func:`main_cf`, :func:`master_cf`): config in DIR/etc,
   queue in DIR/spool, data in DIR/data, its log in DIR/maillog (postlogd, no
   syslog), smtpd on a private port of 127.0.0.1 only, delivery by ``virtual(8)``
   to DIR/mail/Maildir for ``bob@spamnb.test`` (an ``inline:`` map: no real user),
   ``postfix -c DIR/etc start``;
4. an SMTP session (``smtplib``) per message: EHLO, MAIL, RCPT, DATA, QUIT;
5. checks: both delivered to the maildir, the spam with ``X-Spam-Flag: YES``, the
   ham without (SpamAssassin's rule), each with spamnb's ``X-Spam-Status`` in
   SpamAssassin's form, and, once spamnb's headers and the headers
   Postfix adds on top (``Return-Path``, ``Delivered-To``, ``Received``) are set
   aside, every byte as sent.

Re-injection: spamc runs ``sendmail`` as ``nobody``; ``sendmail -C DIR`` run by
a user other than root is refused unless DIR is listed in the *system*
``/etc/postfix/main.cf`` (``alternate_config_directories``), which this script
does not touch. ``MAIL_CONFIG`` is honoured instead (pipe(8) exports it, and
master sets it to the instance's config directory), as long as ``postdrop`` is
not set-gid (a set-gid program ignores it): so the instance's
``command_directory`` is DIR/sbin, links to Postfix's commands with ``postdrop``
a plain copy, and the maildrop queue is world-writable (mode 1733, as Postfix had
it before postdrop).

Where Postfix comes from: Debian's package installed (``/usr/sbin/postfix``), or
the package unpacked into a folder (``--postfix-root DIR``, or
``SPAMNB_POSTFIX_ROOT``, or ``--unpack``: ``apt-get download postfix`` and
``dpkg-deb -x`` into ``.postfix-deb/``). Unpacked is how it runs here: on Debian
the package conflicts with every other MTA (installing it removes
``exim4-daemon-heavy``, which ``tools/harnesses/exim_spamd.py`` needs), and its postinst
creates users and starts a system Postfix where it can. An unpacked Postfix finds
its libraries through ``LD_LIBRARY_PATH`` (set in ``import_environment`` and
``export_environment``). The instance runs as ``mail_owner`` ``postfix`` and
``setgid_group`` ``postdrop`` when those exist, else as the system's ``mail``
user and ``daemon`` group (it must not be root, nor share a group with
``default_privs``' ``nobody``); delivery is as ``nobody``.

    python tools/harnesses/postfix_spamc.py --unpack                 # once: .postfix-deb/ (needs root)
    python tools/harnesses/postfix_spamc.py                          # trains a model first (~20 s)
    python tools/harnesses/postfix_spamc.py --model ~/.local/share/spamnb/model.joblib --keep

Exit status: 0 when everything is as expected, 1 when something differs (each
difference is printed), 77 when it cannot run here (not root, no Postfix, no
spamc, or Postfix refusing to start), with the reason.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the project: spamnb, tools
from tools.harnesses.exim_spamd import (DOMAIN, RECIPIENT, ROOT, Unavailable, unpack_debs,  # noqa: E402
                                        as_sent, delivered, drive, free_port, leave, mta_arguments, print_pair,
                                        smtp_send, spamd_check, start_serve, tail, smtp_greets)

UNPACKED = ROOT / ".postfix-deb"
DELIVERY_USER = "nobody"
# header fields Postfix writes on top of a message it delivers to a maildir: smtpd's and
# pickup's Received, virtual(8)'s Return-Path, X-Original-To and Delivered-To
POSTFIX_ADDS = {"return-path", "x-original-to", "delivered-to", "received"}
# and the ones its cleanup drops from a message it receives (message_drop_headers' default
# but for bcc, content-length, resent-bcc: a message with those is not what this is about)
POSTFIX_DROPS = {"return-path"}
SPAMNB_ADDS = {"x-spam-flag", "x-spam-status"}
# spamnb's X-Spam-Status as SpamAssassin's clients read it (spamass-milter: "%*s score=%d")
STATUS = re.compile(rb"(Yes|No), score=(-?\d+\.\d+) required=(-?\d+\.\d+) tests=SPAMNB_(SPAM|HAM|UNSURE) ")


class Postfix:
    """Where a Postfix is: ``prefix`` is "/" for the installed package, else the unpacked one."""

    def __init__(self, prefix: Path):
        self.prefix = prefix
        self.sbin = prefix / "usr" / "sbin"
        self.daemons = prefix / "usr" / "lib" / "postfix" / "sbin"
        self.shlib = prefix / "usr" / "lib" / "postfix"
        self.meta = prefix / "etc" / "postfix"
        self.installed = prefix == Path("/")

    def __repr__(self):
        return "Postfix (installed)" if self.installed else f"Postfix unpacked in {self.prefix}"


def find_postfix(given: str | Path | None = None) -> Postfix:
    """The Postfix to run, or :class:`Unavailable` saying why there is none (or we are not root)."""
    if os.geteuid() != 0:
        raise Unavailable("not root: Postfix's master and its queue need root "
                          "(run as root: sudo python tools/harnesses/postfix_spamc.py)")
    if not shutil.which("spamc"):
        raise Unavailable("spamc is not installed (Debian: apt-get install spamc)")
    env = os.environ.get("SPAMNB_POSTFIX_ROOT")
    cands = [Path(given)] if given else ([Path(env)] if env else []) + [Path("/"), UNPACKED]
    for prefix in cands:
        pf = Postfix(prefix)
        if (pf.sbin / "postfix").is_file() and (pf.daemons / "master").is_file() and (pf.meta / "postfix-files").is_file():
            return pf
    where = " or ".join(str(p) for p in cands)
    raise Unavailable(f"no Postfix in {where} (apt-get install postfix, or, beside another MTA: "
                      "python tools/harnesses/postfix_spamc.py --unpack)")


def unpack(dest: Path = UNPACKED) -> Postfix:
    """Postfix unpacked into ``dest`` (:func:`unpack_debs`): nothing installed."""
    unpack_debs(["postfix"], dest)
    return Postfix(dest)


def accounts() -> tuple[str, str]:
    """(mail_owner, setgid_group): Debian's own when the package made them, else ``mail``/``daemon``."""
    try:
        pwd.getpwnam("postfix"), grp.getgrnam("postdrop")
        return "postfix", "postdrop"
    except KeyError:
        return "mail", "daemon"


def main_cf(d: Path, pf: Postfix, owner: str, group: str) -> str:
    env = "" if pf.installed else f" LD_LIBRARY_PATH={pf.shlib}"
    uid, gid = pwd.getpwnam(DELIVERY_USER).pw_uid, pwd.getpwnam(DELIVERY_USER).pw_gid
    return f"""\
# written by tools/harnesses/postfix_spamc.py: a private instance, nothing else is read
compatibility_level = 3.6
queue_directory = {d}/spool
data_directory = {d}/data
command_directory = {d}/sbin
daemon_directory = {pf.daemons}
shlib_directory = {pf.shlib}
meta_directory = {pf.meta}
mail_owner = {owner}
setgid_group = {group}
maillog_file = {d}/maillog
maillog_file_prefixes = {d}
import_environment = MAIL_CONFIG MAIL_DEBUG MAIL_LOGTAG TZ LANG=C{env}
export_environment = TZ MAIL_CONFIG LANG{env.split('=')[0]}

inet_interfaces = 127.0.0.1
inet_protocols = ipv4
myhostname = mx.{DOMAIN}
mydomain = {DOMAIN}
mydestination =
mynetworks = 127.0.0.0/8
relayhost =
default_transport = error:no mail leaves this test instance
local_transport = error:no local delivery in this test instance
alias_maps =
alias_database =
biff = no
smtputf8_enable = no

virtual_mailbox_domains = {DOMAIN}
virtual_mailbox_base = {d}/mail
virtual_mailbox_maps = inline:{{ {RECIPIENT}=Maildir/ }}
virtual_uid_maps = static:{uid}
virtual_gid_maps = static:{gid}
"""


def master_cf(smtp_port: int, spamd_port: int, d: Path, smtpd_options: str = "-o content_filter=spamnb:dummy") -> str:
    return f"""\
# written by tools/harnesses/postfix_spamc.py
# service type  private unpriv chroot wakeup maxproc command + args
127.0.0.1:{smtp_port} inet n - n - - smtpd {smtpd_options}
spamnb    unix  -  n  n  -  -  pipe user={DELIVERY_USER} argv=/usr/bin/spamc -d 127.0.0.1 -p {spamd_port} -u ${{user}} -e {d}/sbin/sendmail -oi -f ${{sender}} ${{recipient}}
pickup    unix  n  -  n  60  1  pickup
cleanup   unix  n  -  n  -  0  cleanup
qmgr      unix  n  -  n  300  1  qmgr
rewrite   unix  -  -  n  -  -  trivial-rewrite
bounce    unix  -  -  n  -  0  bounce
defer     unix  -  -  n  -  0  bounce
trace     unix  -  -  n  -  0  bounce
verify    unix  -  -  n  -  1  verify
flush     unix  n  -  n  1000?  0  flush
proxymap  unix  -  -  n  -  -  proxymap
showq     unix  n  -  n  -  -  showq
error     unix  -  -  n  -  -  error
retry     unix  -  -  n  -  -  error
discard   unix  -  -  n  -  -  discard
virtual   unix  -  n  n  -  -  virtual
anvil     unix  -  -  n  -  1  anvil
scache    unix  -  -  n  -  1  scache
postlog   unix-dgram n  -  n  -  1  postlogd
"""


def commands(d: Path, pf: Postfix):
    """DIR/sbin: links to Postfix's commands, but postdrop a plain (not set-gid) copy (see the docstring)."""
    sbin = d / "sbin"
    sbin.mkdir()
    for cmd in pf.sbin.iterdir():
        if cmd.name == "postdrop":
            shutil.copyfile(cmd, sbin / cmd.name)
            (sbin / cmd.name).chmod(0o755)
        else:
            (sbin / cmd.name).symlink_to(cmd)


def fields_of(head: bytes) -> list[bytes]:
    """A header block (LF line ends) as whole fields, continuation lines included."""
    fields: list[bytes] = []
    for line in head.split(b"\n"):
        if fields and line[:1] in (b" ", b"\t"):
            fields[-1] += b"\n" + line
        else:
            fields.append(line)
    return fields


def field_name(f: bytes) -> str:
    return f.split(b":", 1)[0].strip().lower().decode(errors="replace")


def split_added(got: bytes, sent: bytes) -> tuple[list[bytes], list[bytes], list[bytes], bytes, bytes]:
    """Take a delivered message apart against the one sent (both with LF line ends).

    Returns (the fields on top, before the first one of ``sent``'s own;
    spamnb's fields, wherever they are; ``sent``'s fields that Postfix drops
    (``message_drop_headers``, by default Return-Path among them); the delivered
    message without the first two; ``sent`` without the third). All is well when
    the last two are equal.
    """
    head, sep, body = got.partition(b"\n\n")
    fields = fields_of(head)
    spamnb = [f for f in fields if field_name(f) in SPAMNB_ADDS]
    rest = [f for f in fields if field_name(f) not in SPAMNB_ADDS]
    s_head, s_sep, s_body = sent.partition(b"\n\n")
    s_fields = fields_of(s_head)
    dropped = [f for f in s_fields if field_name(f) in POSTFIX_DROPS]
    expected = b"\n".join(f for f in s_fields if field_name(f) not in POSTFIX_DROPS) + s_sep + s_body
    for i in range(len(rest) + 1):
        left = b"\n".join(rest[i:]) + sep + body
        if left == expected:
            return rest[:i], spamnb, dropped, left, expected
    return [], spamnb, dropped, b"\n".join(rest) + sep + body, expected


def check_delivered(label: str, got: bytes, sent: bytes, problems: list[str], out):
    on_top, spamnb, dropped, left, expected = split_added(got.replace(b"\r\n", b"\n"),
                                                          sent.replace(b"\r\n", b"\n"))
    first = lambda f: f.decode(errors="replace").splitlines()[0] + (" ..." if b"\n" in f else "")  # noqa: E731
    for f in on_top:
        out(f"  added by Postfix:   {first(f)}")
    for f in spamnb:
        out(f"  added by spamnb:    {first(f)}")
    for f in dropped:
        out(f"  dropped by Postfix: {first(f)}  (message_drop_headers)")
    flags = [f.split(b":", 1)[1].strip() for f in spamnb if field_name(f) == "x-spam-flag"]
    want = [b"YES"] if label == "spam" else []  # SpamAssassin's rule: the flag on spam only
    if flags != want:
        problems.append(f"{label}: X-Spam-Flag {flags}, expected {want}")
    statuses = [f.split(b":", 1)[1].strip() for f in spamnb if field_name(f) == "x-spam-status"]
    if len(statuses) != 1 or not STATUS.match(statuses[0]) or \
            STATUS.match(statuses[0]).group(1) != (b"Yes" if label == "spam" else b"No"):
        problems.append(f"{label}: X-Spam-Status {statuses}, expected one in SpamAssassin's form"
                        f" ({'Yes' if label == 'spam' else 'No'}, score=S required=T tests=SPAMNB_...)")
    if left != expected:
        problems.append(f"{label}: the delivered message, spamnb's and Postfix's headers aside, differs from"
                        f" the one sent ({len(left)} bytes against {len(expected)})")
        return
    foreign = [field_name(f) for f in on_top if field_name(f) not in POSTFIX_ADDS]
    if foreign:
        problems.append(f"{label}: Postfix added {foreign} on top, not only {sorted(POSTFIX_ADDS)}")
    else:
        out(f"  every other byte as sent ({len(expected)} bytes, LF line ends in the maildir)")


def out_log(maillog: Path, queue_id: str, out):
    """The log's lines for ``queue_id`` and for the copy spamc's sendmail put back (pickup's queue id)."""
    log = maillog.read_text(errors="replace").splitlines() if maillog.exists() else []
    ids = [queue_id]
    start = next((i for i, ln in enumerate(log) if f" {queue_id}: " in ln), len(log))
    for ln in log[start:]:  # the next message pickup took from the maildrop: spamc's sendmail's
        m = re.search(r"postfix/pickup\[\d+\]: ([0-9A-F]+): uid=", ln)
        if m:
            ids.append(m.group(1))
            break
    for ln in log:
        if any(f" {i}: " in ln for i in ids):
            out(f"  log: {ln.split(' ', 3)[3] if ln.count(' ') > 3 else ln}")


class Instance:
    """A running private Postfix (:func:`instance`): its folder, smtpd and spamd ports, maildir."""

    def __init__(self, d: Path, smtp_port: int, spamd_port: int):
        self.d, self.smtp_port, self.spamd_port = d, smtp_port, spamd_port
        self.maildir = d / "mail" / "Maildir"
        self.maillog = d / "maillog"


@contextlib.contextmanager
def instance(model: Path, pf: Postfix, *, workdir: Path | None = None, keep: bool = False, out=print,
             spamnb: list[str] | None = None, smtpd_options=lambda ports: "-o content_filter=spamnb:dummy",
             serve_options=()):
    """``spamnb serve --spamd`` and a private Postfix in front of it, started; yields
    an :class:`Instance`, and stops both (and removes the folder unless ``keep``) at the end.
    ``smtpd_options(ports)`` gives the smtpd service's options; ``ports`` is the list
    of ports already taken, which it may extend with its own. ``serve_options``: more of
    ``spamnb serve``'s options (``--milter 127.0.0.1:PORT``).

    Raises :class:`Unavailable` when Postfix cannot run here, RuntimeError when a part
    does not start.
    """
    spamnb = spamnb or [sys.executable, "-m", "spamnb"]
    d = Path(workdir or tempfile.mkdtemp(prefix="spamnb-postfix-"))
    serve = None
    started = False
    etc = d / "etc"
    env = {**os.environ, "MAIL_CONFIG": str(etc)}
    if not pf.installed:
        env["LD_LIBRARY_PATH"] = str(pf.shlib)
    postfix_cmd = [str(pf.sbin / "postfix"), "-c", str(etc)]
    try:
        d.chmod(0o755)
        for sub in ("run", "etc", "spool", "mail"):  # data (owned by mail_owner): made by postfix check
            (d / sub).mkdir(exist_ok=True)
        (d / "run").chmod(0o700)
        owner, group = accounts()
        nobody = pwd.getpwnam(DELIVERY_USER)
        os.chown(d / "mail", nobody.pw_uid, nobody.pw_gid)
        commands(d, pf)
        spamd_port, smtp_port = free_port(), free_port()
        (etc / "main.cf").write_text(main_cf(d, pf, owner, group))
        (etc / "master.cf").write_text(master_cf(smtp_port, spamd_port, d, smtpd_options([spamd_port, smtp_port])))

        serve = start_serve(spamnb, model, d, spamd_port, out, options=serve_options)

        # postfix check makes the queue's folders (post-install create-missing); then maildrop open to spamc's sendmail
        pi = subprocess.run([*postfix_cmd, "check"], capture_output=True, text=True, env=env, timeout=60)
        if pi.returncode != 0:
            raise Unavailable(f"postfix -c {etc} check failed: {(pi.stderr or pi.stdout).strip()[:400]}"
                              f" (log: {tail(d / 'maillog')})")
        (d / "spool" / "maildrop").chmod(0o1733)
        (d / "spool" / "public").chmod(0o755)  # postdrop, as nobody, wakes pickup through public/pickup
        st = subprocess.run([*postfix_cmd, "start"], capture_output=True, text=True, env=env, timeout=60)
        if st.returncode != 0:
            raise Unavailable(f"postfix -c {etc} start failed: {(st.stderr or st.stdout).strip()[:600]}"
                              f" (log: {tail(d / 'maillog')})")
        started = True
        out(f"{pf}: postfix -c {etc} start: smtpd on 127.0.0.1:{smtp_port},"
            f" mail_owner {owner}, delivering as {DELIVERY_USER} to {d / 'mail' / 'Maildir'}")
        for line in (etc / "master.cf").read_text().splitlines()[2:4]:
            out(f"  master.cf: {line}")

        end = time.monotonic() + 20
        while True:
            try:
                if smtp_greets(smtp_port):
                    break
            except OSError:
                pass
            if time.monotonic() > end:
                raise RuntimeError(f"Postfix's smtpd not answering on {smtp_port}: {tail(d / 'maillog')}")
            time.sleep(0.1)
        yield Instance(d, smtp_port, spamd_port)
    finally:
        if started:
            subprocess.run([*postfix_cmd, "stop"], capture_output=True, env=env, timeout=60)
            pid_file = d / "spool" / "pid" / "master.pid"
            for _ in range(100):
                if not pid_file.exists():
                    break
                time.sleep(0.1)
        leave(d, keep=keep, made=workdir is None, out=out, procs=(serve,))


def send(inst: Instance, label: str, msg: bytes, problems: list[str], out, timeout: float = 30.0,
         want: int = 250) -> Path | None:
    """One SMTP session with ``msg``; the file it was delivered to, or None (DATA
    answered ``want`` but 250, or a problem: added to ``problems``)."""
    before = set(delivered(inst.maildir))
    code, text = smtp_send(inst.smtp_port, msg, out)
    if code != want:
        problems.append(f"{label}: DATA answered {code} {text}, expected {want}")
    if code != 250:
        return None
    queue_id = text.rpartition(" ")[2].strip()
    end = time.monotonic() + timeout
    while not set(delivered(inst.maildir)) - before and time.monotonic() < end:
        time.sleep(0.1)
    time.sleep(0.2)  # virtual's log line after the file
    out_log(inst.maillog, queue_id, out)
    new = [p for p in delivered(inst.maildir) if p not in before]
    if len(new) != 1:
        problems.append(f"{label}: {len(new)} new files in {inst.maildir} after {timeout:.0f} s, expected 1"
                        f" (log: {tail(inst.maillog)})")
        return None
    out(f"  delivered: {new[0].relative_to(inst.d)}")
    return new[0]


def run(model: Path, ham: bytes, spam: bytes, *, postfix: Postfix | None = None, workdir: Path | None = None,
        keep: bool = False, out=print, spamnb: list[str] | None = None, timeout: float = 30.0) -> list[str]:
    """Do the whole exchange; return the differences from what is expected (none: all well).

    Raises :class:`Unavailable` when Postfix cannot run here.
    """
    pf = postfix or find_postfix()
    problems: list[str] = []
    try:
        with instance(model, pf, workdir=workdir, keep=keep, out=out, spamnb=spamnb) as inst:
            for label, raw in (("ham", ham), ("spam", spam)):
                msg = as_sent(raw)
                is_spam, s_own, t_own = spamd_check(inst.spamd_port, msg)
                out(f"\n{label}: spamnb's own CHECK of the message as sent: Spam: {is_spam} ; {s_own} / {t_own}")
                if is_spam != (label == "spam"):
                    problems.append(f"{label}: the model itself judges it {'spam' if is_spam else 'not spam'}"
                                    f" ({s_own} / {t_own}): pick another message or model")
                got = send(inst, label, msg, problems, out, timeout)
                if got is not None:
                    check_delivered(label, got.read_bytes(), msg, problems, out)
    except RuntimeError as e:
        problems.append(str(e))
    return problems


def main(argv=None) -> int:
    ap = mta_arguments(__doc__)
    ap.add_argument("--postfix-root", help="an unpacked postfix package (default: $SPAMNB_POSTFIX_ROOT, "
                                           f"the installed one, or {UNPACKED.relative_to(ROOT)})")
    ap.add_argument("--unpack", action="store_true",
                    help=f"apt-get download postfix and unpack it into {UNPACKED.relative_to(ROOT)}, then run")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (config, log, maildir)")
    args = ap.parse_args(argv)

    def check():
        if args.unpack:
            if os.geteuid() != 0:
                raise Unavailable("not root: --unpack and the instance need root")
            unpack()
        return find_postfix(args.postfix_root)

    def go(model, pf):
        print_pair(args.ham, args.spam)
        return run(model, args.ham.read_bytes(), args.spam.read_bytes(), postfix=pf, keep=args.keep)

    return drive("postfix_spamc", "Postfix, spamc and spamnb", args.model, check, go)


if __name__ == "__main__":
    sys.exit(main())
