#!/usr/bin/env python3
"""spamnb's own milter (``spamnb serve --milter``) in front of a real Postfix, end to end.

The private Postfix instance of :mod:`postfix_spamc`, its smtpd with
``smtpd_milters = inet:127.0.0.1:PORT``, ``milter_protocol = 6`` and
``milter_default_action = accept`` (what docs/admin.md tells a site to write),
PORT being ``spamnb serve --milter``'s. Two settings, one instance each, one
SMTP session per message:

* tagging (the default): a ham, a spam, a ham and a spam whose bodies start with
  blank lines, and a ham carrying a forged verdict (``X-Spam-Flag: YES``,
  ``X-Spam-Status: Yes``, ``X-Spam-Level``), all delivered: the spam with
  ``X-Spam-Flag: YES``, each with spamnb's ``X-Spam-Status`` in SpamAssassin's form,
  the forged fields gone and, spamnb's and Postfix's own fields aside, every other
  byte as sent (the bodies byte for byte, blank lines first too: spamass-milter's
  bug is not this door's). Then garbage and a packet claiming 2 GiB at the milter's
  port, and a ham after them: still scanned;
* ``--milter-reject``: the spam refused at the end of DATA (550 5.7.1), the ham
  delivered.

Needs root, and Postfix (installed, or unpacked: ``python
tools/harnesses/postfix_milter.py --unpack-only``); spamc (the instance's spamd
port is asked for the model's own verdict first).

    python tools/harnesses/postfix_own_milter.py --model ~/.local/share/spamnb/model.joblib

Exit status: 0 when everything is as expected, 1 when something differs (each
difference is printed), 77 when it cannot run here, with the reason.
"""

from __future__ import annotations

import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the project: spamnb, tools
from tools.harnesses.exim_spamd import (as_sent, docsnippets, drive, mta_arguments,  # noqa: E402
                                        print_pair, spamd_check)
from tools.harnesses.postfix_milter import FORGED  # noqa: E402
from tools.harnesses.postfix_spamc import check_delivered, find_postfix, instance, send  # noqa: E402


def milter_options(port: int) -> str:
    """The smtpd service's options: the ``main.cf`` lines docs/admin.md gives, read from the
    page and run as written but for the milter's port (``SUBSTITUTE``'s 11332), moved to
    ``port``, as ``-o``."""
    snippets = docsnippets()
    block = [text for _, text in snippets.blocks(snippets.ADMIN) if text.startswith("smtpd_milters =")]
    assert len(block) == 1, f"docs/admin.md has {len(block)} main.cf blocks starting with smtpd_milters ="
    assert 11332 in snippets.SUBSTITUTE["ports"]  # the one value moved, as the table allows
    options = []
    for ln in block[0].splitlines():
        if ln.strip():
            name, _, value = (part.strip() for part in ln.partition("="))
            options.append(f"-o {name}={value.replace(':11332', f':{port}')}")
    return " ".join(options)


def docs_serve_options(root: Path) -> tuple[list[str], int]:
    """The options of docs/admin.md's ``spamnb serve --milter`` line as the page writes them,
    changed only by ``SUBSTITUTE`` (the port a free one, ``/var/lib/...`` under ``root``, its
    folders made), and the port: ``(options, port)``."""
    snippets = docsnippets()
    site = snippets.Site(root, ["spamnb"])
    argv = site.command(snippets.line(snippets.ADMIN, "spamnb serve --milter "))
    assert argv[:2] == ["spamnb", "serve"], argv
    for value in argv[2:]:
        if value.startswith(str(root)):
            Path(value).mkdir(parents=True, exist_ok=True)
    return argv[2:], site.port(11332)


def poke(port: int, data: bytes) -> None:
    """Send ``data`` to the milter's port and read until it closes (at most 10 s)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        try:
            while s.recv(4096):
                pass
        except OSError:
            pass


def run(model: Path, ham: bytes, spam: bytes, *, postfix=None, workdir: Path | None = None, keep: bool = False,
        out=print, spamnb: list[str] | None = None) -> list[str]:
    """Both settings (module doc); the differences from what is expected (none: all well)."""
    pf = postfix or find_postfix()
    problems: list[str] = []
    ham, spam = as_sent(ham), as_sent(spam)
    forged = ham.replace(b"\r\nSubject:", b"\r\n" + FORGED + b"Subject:", 1)
    blank_ham = ham.replace(b"\r\n\r\n", b"\r\n\r\n\r\n\r\n", 1)
    blank_spam = spam.replace(b"\r\n\r\n", b"\r\n\r\n\r\n\r\n", 1)
    tagging = [("ham", ham, ham, 250), ("spam", spam, spam, 250),
               ("ham, body starting with blank lines", blank_ham, blank_ham, 250),
               ("spam, body starting with blank lines", blank_spam, blank_spam, 250),
               ("forged ham", forged, ham, 250)]
    refusing = [("ham", ham, ham, 250), ("spam", spam, spam, 550)]
    for options, cases in (([], tagging), (["--milter-reject"], refusing)):
        root = Path(tempfile.mkdtemp(prefix="spamnb-postfix-milter-"))
        served, port = docs_serve_options(root)  # admin.md's command line, as the page writes it
        try:
            with instance(model, pf, workdir=workdir, keep=keep, out=out, spamnb=spamnb,
                          smtpd_options=lambda ports: milter_options(port),
                          serve_options=[*served, *options]) as inst:
                out(f"\nspamnb serve {' '.join([*served, *options])}  (smtpd_milters = inet:127.0.0.1:{port})")
                for label, msg in (("ham", ham), ("spam", spam)):
                    is_spam = spamd_check(inst.spamd_port, msg)[0]
                    if is_spam != (label == "spam"):
                        problems.append(f"{label}: the model itself judges it {'spam' if is_spam else 'not spam'}")
                deliver(inst, cases, problems, out)
                if not options:
                    for what, junk in (("garbage", b"GET / HTTP/1.0\r\n\r\n"),
                                       ("a packet claiming 2 GiB", b"\x80\x00\x00\x00O")):
                        poke(port, junk)
                        out(f"\n{what} sent to the milter's port: closed")
                    time.sleep(0.2)
                    deliver(inst, [("ham after the garbage", ham, ham, 250)], problems, out)
        except RuntimeError as e:
            problems.append(str(e))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return problems


def deliver(inst, cases, problems, out):
    for label, msg, clean, want in cases:
        out(f"{label}:")
        got = send(inst, label, msg, problems, out, want=want)
        if got is not None:
            check_delivered("spam" if label.startswith("spam") else "ham", got.read_bytes(), clean, problems, out)


def main(argv=None) -> int:
    ap = mta_arguments(__doc__)
    ap.add_argument("--keep", action="store_true", help="keep the temporary folders (config, logs, maildir)")
    args = ap.parse_args(argv)

    def go(model, pf):
        print_pair(args.ham, args.spam)
        return run(model, args.ham.read_bytes(), args.spam.read_bytes(), postfix=pf, keep=args.keep)

    return drive("postfix_own_milter", "Postfix and spamnb's milter", args.model, find_postfix, go)


if __name__ == "__main__":
    sys.exit(main())
