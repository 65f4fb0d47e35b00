#!/usr/bin/env python3
"""spamass-milter in front of a real Postfix, against ``spamnb serve --spamd``, end to end.

Debian's spamass-milter 0.4 (the milter that runs ``spamc`` for each
message at the end of DATA and acts on the ``X-Spam-*`` headers of its answer)
in a private Postfix instance (:mod:`postfix_spamc`'s, with ``smtpd_milters``
instead of a content filter), spamc pointed at spamnb. Four milter settings,
one run of the milter each, one SMTP session per message:

* ``-m -r -1`` (reject what is tagged spam, change no body): the spam is refused
  at SMTP time (550 5.7.1), the ham and a ham carrying a forged verdict
  (``X-Spam-Flag: YES``, ``X-Spam-Status: Yes, score=99.0``, ``X-Spam-Level``)
  are accepted and delivered with spamnb's ``X-Spam-Status`` and nothing else
  changed, the forged fields gone;
  a short note scored near 0 is accepted too, and refused by ``-r 0`` when the
  milter reads its S as 0 or more (it reads an integer: -0.66 is 0);
* ``-m -r N`` (N = ``--reject``, 3 by default: spamnb's log-odds, just above the
  default T = log 19 = 2.9): the spam (at or above N) refused, the ham accepted;
  then N two above the spam's score: the spam accepted, tagged;
* no option (the milter may replace bodies): both delivered, the spam with
  ``X-Spam-Flag: YES``, and both bodies byte for byte, also a ham whose body
  starts with blank lines (the milter replaces no body but a flagged one's);
  plus a spam whose body starts with blank lines, to show the milter's own bug
  (it drops the blank lines at the start of a body it replaces, whoever
  answered): reported, and only that difference accepted.

What Postfix adds on top (``Return-Path``, ``X-Original-To``, ``Delivered-To``,
``Received``) and the message's own ``Return-Path`` (``message_drop_headers``)
are set aside, as in :mod:`postfix_spamc`. Debian's default ``-i 127.0.0.1``
(pass mail from localhost unscanned) is left out: every message here comes
from 127.0.0.1.

Where the milter comes from: Debian's package installed, or unpacked beside
Postfix (``--unpack``: ``apt-get download spamass-milter libmilter1.0.1`` and
``dpkg-deb -x`` into ``.spamass-milter-deb/``, found through ``LD_LIBRARY_PATH``),
for the same reason as Postfix: installing it would pull in an MTA and start
its service. Needs root (Postfix's master).

    python tools/harnesses/postfix_milter.py --unpack            # once: .postfix-deb/, .spamass-milter-deb/
    python tools/harnesses/postfix_milter.py --unpack-only       # what scripts/test.sh does as root
    python tools/harnesses/postfix_milter.py --model ~/.local/share/spamnb/model.joblib

Exit status: 0 when everything is as expected, 1 when something differs (each
difference is printed), 77 when it cannot run here, with the reason.
"""

from __future__ import annotations

import glob
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the project: spamnb, tools
from tools.harnesses.exim_spamd import (EXIT_UNAVAILABLE, ROOT, Unavailable, as_sent, drive, unpack_debs,  # noqa: E402
                                        free_port, mta_arguments, print_pair, spamd_check, stop, tail)
from tools.harnesses.postfix_spamc import (STATUS, check_delivered, find_postfix, instance, send,  # noqa: E402
                                           split_added, unpack as unpack_postfix)

MILTER_UNPACKED = ROOT / ".spamass-milter-deb"
MILTER_PACKAGES = ("spamass-milter", "libmilter1.0.1")
FORGED = (b"X-Spam-Flag: YES\r\nX-Spam-Status: Yes, score=99.0 required=5.0 tests=FORGED autolearn=no\r\n"
          b"X-Spam-Level: **************************************************\r\n")
# A short note: few tokens, so scored near the prior (unsure with the shipped corpus' model).
# With a Date: Postfix adds one to a message from its own network that has none.
SHORT = (b"From: a@b.example\r\nTo: bob@spamnb.test\r\nSubject: lunch\r\nDate: Mon, 2 Sep 2002 12:00:00 +0000\r\n"
         b"Message-ID: <1@x>\r\n\r\nlunch tomorrow at noon?\r\n")


class Milter:
    """spamass-milter: its program and the environment it runs in."""

    def __init__(self, binary: Path, libdir: Path | None):
        self.binary, self.libdir = binary, libdir

    def env(self):
        return {**os.environ, **({"LD_LIBRARY_PATH": str(self.libdir)} if self.libdir else {})}

    def __repr__(self):
        return f"spamass-milter ({self.binary})"


def find_milter() -> Milter:
    """The installed spamass-milter, else the unpacked one, or :class:`Unavailable`."""
    if os.access("/usr/sbin/spamass-milter", os.X_OK):
        return Milter(Path("/usr/sbin/spamass-milter"), None)
    binary = MILTER_UNPACKED / "usr" / "sbin" / "spamass-milter"
    libs = glob.glob(str(MILTER_UNPACKED / "usr" / "lib" / "*" / "libmilter.so.*"))
    if binary.is_file() and libs:
        return Milter(binary, Path(libs[0]).parent)
    raise Unavailable(f"no spamass-milter in /usr/sbin or {MILTER_UNPACKED.relative_to(ROOT)} "
                      "(python tools/harnesses/postfix_milter.py --unpack, as root)")


def unpack() -> Milter:
    """The milter and libmilter unpacked (:func:`unpack_debs`): nothing installed."""
    unpack_debs(MILTER_PACKAGES, MILTER_UNPACKED)
    return find_milter()


def unpack_missing() -> int:
    """Unpack Postfix and the milter where neither is there already: 0, or 77 saying why not."""
    try:
        if os.geteuid() != 0:
            raise Unavailable("not root: --unpack-only needs root")
        try:
            find_postfix()
        except Unavailable:
            unpack_postfix()
        try:
            find_milter()
        except Unavailable:
            unpack()
    except (Unavailable, OSError, subprocess.CalledProcessError) as e:
        print(f"postfix_milter.py: cannot unpack: {e}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    return 0


def start_milter(milter: Milter, port: int, spamd_port: int, options: list[str], log: Path) -> subprocess.Popen:
    """spamass-milter in the foreground on 127.0.0.1:``port``, its spamc asking spamnb."""
    cmd = [str(milter.binary), "-p", f"inet:{port}@127.0.0.1", *options, "--", "-d", "127.0.0.1",
           "-p", str(spamd_port)]
    with open(log, "ab") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=milter.env())
    end = time.monotonic() + 20
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"spamass-milter exited ({proc.returncode}): {tail(log)}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            if time.monotonic() > end:
                stop(proc)
                raise RuntimeError(f"spamass-milter not listening on {port}: {tail(log)}") from None
            time.sleep(0.1)


def leading_blank_lines_dropped(got: bytes, sent: bytes) -> bool:
    """Whether ``got``'s body is ``sent``'s without the blank lines it started with."""
    body = lambda m: m.replace(b"\r\n", b"\n").partition(b"\n\n")[2]  # noqa: E731
    return body(sent).startswith(b"\n") and body(got) == body(sent).lstrip(b"\n")


def run(model: Path, ham: bytes, spam: bytes, *, postfix=None, milter: Milter | None = None, reject: int = 3,
        workdir: Path | None = None, keep: bool = False, out=print, spamnb: list[str] | None = None) -> list[str]:
    """The three settings (module doc); the differences from what is expected (none: all well)."""
    pf = postfix or find_postfix()
    milter = milter or find_milter()
    problems: list[str] = []
    milter_port = []

    def smtpd_options(ports):
        port = free_port()
        while port in ports:
            port = free_port()
        milter_port.append(port)
        return f"-o smtpd_milters=inet:127.0.0.1:{port}"

    ham, spam = as_sent(ham), as_sent(spam)
    forged = ham.replace(b"\r\nSubject:", b"\r\n" + FORGED + b"Subject:", 1)
    blank_first = spam.replace(b"\r\n\r\n", b"\r\n\r\n\r\n\r\n", 1)  # a body starting with two blank lines
    blank_ham = ham.replace(b"\r\n\r\n", b"\r\n\r\n\r\n\r\n", 1)
    try:
        with instance(model, pf, workdir=workdir, keep=keep, out=out, spamnb=spamnb,
                      smtpd_options=smtpd_options) as inst:
            scores = {}
            for label, msg in (("ham", ham), ("spam", spam)):
                is_spam, s_own, t_own = spamd_check(inst.spamd_port, msg)
                scores[label] = s_own
                out(f"{label}: spamnb's own CHECK of the message as sent: Spam: {is_spam} ; {s_own} / {t_own}")
                if is_spam != (label == "spam"):
                    problems.append(f"{label}: the model itself judges it {'spam' if is_spam else 'not spam'}")
            if not scores["ham"] < reject <= scores["spam"] - 1:  # the milter's own headers move S a little
                problems.append(f"-r {reject} does not separate this ham ({scores['ham']}) and spam"
                                f" ({scores['spam']}) with a margin of 1: pick other messages or --reject")
            above = int(scores["spam"]) + 2  # a level this spam stays under
            note = []
            is_spam, s_short, _ = spamd_check(inst.spamd_port, SHORT)
            if not is_spam and s_short > -1:  # near the ham cut-off's log-odds, 0: -r 0's trap
                out(f"short note: spamnb's own CHECK of the message as sent: Spam: False ; {s_short}")
                note = [("short note", SHORT, SHORT, 250)]
            else:
                out(f"(the short note scores {s_short} with this model: its cases are left out)")
            delivered_score = {}

            def truncated():  # -r 0 refuses what the milter reads as 0 or more: %d of "-0.66" is 0
                return 550 if int(delivered_score["short note"]) >= 0 else 250
            settings = [(["-m", "-r", "-1"], [("ham", ham, ham, 250), ("forged ham", forged, ham, 250),
                                               *note, ("spam", spam, spam, 550)]),
                        *([(["-m", "-r", "0"], [("short note", SHORT, SHORT, truncated)])] if note else []),
                        (["-m", "-r", str(reject)], [("ham", ham, ham, 250), ("spam", spam, spam, 550)]),
                        (["-m", "-r", str(above)], [("spam", spam, spam, 250)]),  # below the level: tagged only
                        ([], [("ham", ham, ham, 250), ("ham, body starting with blank lines", blank_ham, blank_ham, 250),
                              ("spam", spam, spam, 250),
                              ("spam, body starting with blank lines", blank_first, blank_first, 250)])]
            for options, cases in settings:
                log = inst.d / "milter.log"
                proc = start_milter(milter, milter_port[0], inst.spamd_port, options, log)
                out(f"\nspamass-milter {' '.join(options)} -- -d 127.0.0.1 -p {inst.spamd_port}"
                    f"  (smtpd_milters = inet:127.0.0.1:{milter_port[0]})")
                try:
                    for label, msg, clean, want in cases:
                        out(f"{label}:")
                        got = send(inst, label, msg, problems, out, want=want() if callable(want) else want)
                        if got is None:
                            continue
                        got = got.read_bytes()
                        kind = "spam" if label.startswith("spam") else "ham"
                        if label.startswith("spam,"):
                            seen = []
                            check_delivered(kind, got, clean, seen, out)
                            if seen and leading_blank_lines_dropped(got, clean):
                                out("  the milter dropped the blank lines the body started with"
                                    " (its bug, whoever answers): use -m")
                            else:
                                problems += [f"{label}: {p}" for p in seen] or [
                                    f"{label}: the body came through whole: the milter's bug is fixed?"]
                            continue
                        check_delivered(kind, got, clean, problems, out)
                        status = [f for f in split_added(got.replace(b"\r\n", b"\n"), clean)[1]
                                  if f.lower().startswith(b"x-spam-status:")]
                        m = STATUS.match(status[0].split(b":", 1)[1].strip()) if status else None
                        if m:
                            delivered_score[label] = float(m.group(2))
                            out(f"  score={m.group(2).decode()} required={m.group(3).decode()}"
                                f" tests=SPAMNB_{m.group(4).decode()}")
                finally:
                    stop(proc)
    except RuntimeError as e:
        problems.append(str(e))
    return problems


def main(argv=None) -> int:
    ap = mta_arguments(__doc__)
    ap.add_argument("--reject", type=int, default=3, help="the -r level on spamnb's log-odds (default: 3)")
    ap.add_argument("--unpack", action="store_true",
                    help="apt-get download postfix, spamass-milter and libmilter and unpack them, then run")
    ap.add_argument("--unpack-only", action="store_true",
                    help="unpack what is missing of them (scripts/test.sh, as root), and run nothing")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (config, logs, maildir)")
    args = ap.parse_args(argv)
    if args.unpack_only:
        return unpack_missing()

    def check():
        if args.unpack:
            if os.geteuid() != 0:
                raise Unavailable("not root: --unpack and the instance need root")
            unpack_postfix()
            unpack()
        return find_postfix(), find_milter()

    def go(model, found):
        print_pair(args.ham, args.spam)
        pf, milter = found
        return run(model, args.ham.read_bytes(), args.spam.read_bytes(), postfix=pf, milter=milter,
                   reject=args.reject, keep=args.keep)

    return drive("postfix_milter", "Postfix, spamass-milter and spamnb", args.model, check, go)


if __name__ == "__main__":
    sys.exit(main())
