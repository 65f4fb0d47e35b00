#!/usr/bin/env python3
"""Haraka's ``spamassassin`` plugin against ``spamnb serve --spamd``, end to end.

The README's Haraka settings, run: a real Haraka (from npm, pinned to
:data:`HARAKA_VERSION`) with ``config/spamassassin.ini`` pointing at spamnb,
messages sent to it through SMTP sessions, and what Haraka did with each.
Everything but the npm install lives in a temporary folder DIR:

1. Haraka: ``npm install --prefix DIR/npm Haraka@VERSION``, then moved to the
   cache ``~/.cache/spamnb-peers/haraka/VERSION`` (``$XDG_CACHE_HOME``), so a
   second run downloads nothing (``--no-install``: the cache or nothing);
2. a model: ``--model FILE``, or trained on the shipped corpus (about 20 s);
3. ``spamnb serve --model ... --socket DIR/run/sock --spamd 127.0.0.1:PORT``;
4. a Haraka configuration written by hand (:func:`haraka_config`): SMTP on a
   private port of 127.0.0.1, the plugins ``relay`` (127.0.0.2 may relay),
   ``rcpt_to.in_host_list`` (accepts mail for spamnb.test), ``spamassassin``
   with :data:`SPAMASSASSIN_INI` and ``spamnb_queue_file``, a plugin of four
   lines of this script's own (:data:`QUEUE_PLUGIN`) that writes each accepted
   message to DIR/queue; ``node .../Haraka/bin/haraka -c DIR`` runs it in the
   foreground;
5. the messages, from ``corpora/sample-maildir`` (the held-out sample; the
   mbox ``From `` line dropped, :func:`exim_spamd.as_sent`), chosen by
   spamnb's own ``CHECK`` of each (:func:`choose`): a ham, the spam spamnb
   scores highest (over the reject threshold 7 if any sample is), and a spam
   between T (2.9) and 7 if there is one;
6. one SMTP session (``smtplib``) per message, and checks: the ham is
   accepted (250) and queued with Haraka's ``X-Spam-*`` headers showing
   spamnb's score; the high spam is refused with 550 "spam score exceeded
   threshold" and queued nowhere, and again from 127.0.0.2 (a relaying client:
   "exceeded relay threshold"); the spam between T and 7 is accepted but
   flagged (``X-Spam-Flag: YES``, ``Precedence: junk``).

What the plugin compares (haraka-plugin-spamassassin 1.1.2, ``index.js``):
it sends ``HEADERS SPAMC/1.4`` and parses ``Spam: (True|False) ; S / T``
(one decimal each, as spamnb writes them); it rejects when S >= reject_threshold,
or, for a relaying connection, first S >= relay_reject_threshold; S is the
one-decimal text of spamnb's log-odds (6.96 is "7.0": rejected at 7). The flag
(``Precedence: junk``) is spamd's True, i.e. spamnb's S > T; T is only logged.

    python tools/harnesses/haraka_spamd.py                       # trains a model first (~20 s)
    python tools/harnesses/haraka_spamd.py --model ~/.local/share/spamnb/model.joblib
    python tools/harnesses/haraka_spamd.py --keep                # leave DIR (config, logs, queue) behind

Exit status: 0 when everything is as expected, 1 when something differs
(each difference is printed), 77 when Haraka cannot run here (no node or npm,
or not cached and npm cannot install it), with the reason.
"""

from __future__ import annotations

import argparse
import email.parser
import email.policy
import os
import re
import shutil
import smtplib
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the project: spamnb, tools
from tools.harnesses import exim_spamd  # noqa: E402
from tools.harnesses.exim_spamd import (DOMAIN, ROOT, SAMPLE, Unavailable, as_sent, drive, free_port,  # noqa: E402
                                        leave, spamd_check, start_serve, tail, wait_for, smtp_greets)

HARAKA_VERSION = "3.3.4"  # npm's latest of major 3 when this was written
PLUGIN_VERSION = "1.1.2"  # haraka-plugin-spamassassin, as Haraka 3.3.4 installs it
REJECT = 7.0
RELAY_FROM = "127.0.0.2"  # the relay plugin lets this address relay (relay_acl_allow)
DEFAULT_HAM = exim_spamd.DEFAULT_HAM
DEFAULT_FLAGGED = exim_spamd.DEFAULT_SPAM  # 5.6 with the shipped corpus's model: between T and 7

SPAMASSASSIN_INI = """\
spamd_socket=127.0.0.1:{port}
reject_threshold={reject:g}
relay_reject_threshold={reject:g}
add_headers=true
modern_status_syntax=1
"""

QUEUE_PLUGIN = """\
// written by tools/harnesses/haraka_spamd.py: each accepted message to $HARAKA/queue/UUID.eml
'use strict'
const fs = require('node:fs')
const path = require('node:path')

exports.register = function () {
  this.register_hook('queue', 'to_file')
  this.register_hook('queue_outbound', 'to_file') // what a relaying client's mail goes to
}

exports.to_file = function (next, connection) {
  const txn = connection.transaction
  const dir = path.join(process.env.HARAKA, 'queue')
  txn.message_stream.get_data({ line_endings: '\\n' }, (buf) => {
    const tmp = path.join(dir, `.${txn.uuid}.tmp`)
    fs.writeFile(tmp, buf, (err) => {
      if (err) return next(DENYSOFT, `cannot write the message: ${err.message}`)
      fs.rename(tmp, path.join(dir, `${txn.uuid}.eml`), (err2) => {
        if (err2) return next(DENYSOFT, `cannot write the message: ${err2.message}`)
        next(OK, `queued as ${txn.uuid}`)
      })
    })
  })
}
"""

# Haraka's log line of the plugin's result (log_results)
RESULT_LINE = re.compile(r"\[spamassassin\] (status=\w+, score=.*)$", re.M)
STATUS_SCORE = re.compile(r"\bscore=(-?\d+(?:\.\d+)?)")


def cache_dir(version: str = HARAKA_VERSION) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "spamnb-peers" / "haraka" / version


def haraka_bin(prefix: Path) -> Path:
    return prefix / "node_modules" / "Haraka" / "bin" / "haraka"


def cached(version: str = HARAKA_VERSION) -> Path | None:
    """The cached install's prefix, when it is complete."""
    d = cache_dir(version)
    return d if (d / ".complete").is_file() and haraka_bin(d).is_file() else None


def find_node() -> str:
    node = shutil.which("node")
    if not node:
        raise Unavailable("node is not installed (Haraka is a Node.js program: Node.js 20 or later)")
    try:
        v = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        raise Unavailable(f"node --version failed: {e}") from e
    m = re.match(r"v(\d+)", v)
    if not m or int(m.group(1)) < 18:
        raise Unavailable(f"node {v or '(unknown version)'} is too old for Haraka 3 (18 or later)")
    return node


def install(workdir: Path, version: str = HARAKA_VERSION, out=print, allow_download: bool = True) -> Path:
    """Haraka's prefix (its node_modules): the cache, or npm installs it into
    ``workdir/npm`` and it is moved to the cache."""
    if (prefix := cached(version)) is not None:
        out(f"Haraka {version}: cached in {prefix}")
        return prefix
    if not allow_download:
        raise Unavailable(f"Haraka {version} is not cached in {cache_dir(version)} "
                          f"(python tools/harnesses/haraka_spamd.py installs it there once, from npm)")
    npm = shutil.which("npm")
    if not npm:
        raise Unavailable("npm is not installed (it installs Haraka)")
    tmp = workdir / "npm"
    tmp.mkdir(parents=True, exist_ok=True)
    cmd = [npm, "install", "--prefix", str(tmp), "--no-audit", "--no-fund", "--no-save", f"Haraka@{version}"]
    out(f"installing: {' '.join(cmd[1:])}")
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as e:
        raise Unavailable(f"npm install failed: {e}") from e
    if r.returncode != 0 or not haraka_bin(tmp).is_file():
        raise Unavailable(f"npm install Haraka@{version} failed (network?): "
                          f"{(r.stderr or r.stdout).strip()[-400:]}")
    out(f"installed in {time.monotonic() - t0:.0f} s")
    dest = cache_dir(version)
    if dest.exists():  # an incomplete earlier attempt
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(tmp), str(dest))
    (dest / ".complete").write_text(f"Haraka@{version}\n")
    out(f"cached in {dest}")
    return dest


def haraka_config(d: Path, smtp_port: int, spamd_port: int, reject: float = REJECT) -> None:
    """The files of Haraka's configuration under ``d`` (``haraka -c d``) that
    :func:`make_haraka_dir` writes over the defaults of ``haraka -i d``."""
    conf = d / "config"
    (d / "plugins").mkdir(parents=True, exist_ok=True)
    conf.mkdir(exist_ok=True)
    (d / "queue").mkdir(exist_ok=True)
    files = {
        "smtp.ini": f"listen=127.0.0.1:{smtp_port}\n",
        "me": f"mx.{DOMAIN}\n",
        "host_list": f"{DOMAIN}\n",
        "relay.ini": "[relay]\nacl=true\n",
        "relay_acl_allow": f"{RELAY_FROM}/32\n",
        "log.ini": "[main]\nlevel=info\ntimestamps=true\n",
        "plugins": "relay\nrcpt_to.in_host_list\nspamassassin\nspamnb_queue_file\n",
        "spamassassin.ini": SPAMASSASSIN_INI.format(port=spamd_port, reject=reject),
    }
    for name, text in files.items():
        (conf / name).write_text(text)
    (d / "plugins" / "spamnb_queue_file.js").write_text(QUEUE_PLUGIN)


def make_haraka_dir(node: str, prefix: Path, d: Path, smtp_port: int, spamd_port: int,
                    reject: float = REJECT) -> None:
    """``haraka -i d`` (the default configuration: connection.ini and the rest
    Haraka needs), then :func:`haraka_config` over it."""
    r = subprocess.run([node, str(haraka_bin(prefix)), "-i", str(d)], capture_output=True, text=True, timeout=60)
    if r.returncode != 0 or not (d / "config" / "connection.ini").is_file():
        raise RuntimeError(f"haraka -i {d} failed ({r.returncode}): {(r.stderr or r.stdout).strip()[-300:]}")
    haraka_config(d, smtp_port, spamd_port, reject)


@dataclass
class Pick:
    role: str  # "ham", "rejected" (S >= reject), "flagged" (T < S < reject)
    path: Path
    raw: bytes  # as sent
    spam: bool  # spamnb's own CHECK
    s: float
    t: float


def choose(port: int, ham: Path | None, high: Path | None, flagged: Path | None,
           reject: float = REJECT) -> tuple[list[Pick], list[str]]:
    """The messages to send, by spamnb's own CHECK of each, and notes on the choice."""
    notes: list[str] = []
    scored = {}

    def check(p: Path):
        if p not in scored:
            raw = as_sent(p.read_bytes())
            scored[p] = (raw, *spamd_check(port, raw))
        return scored[p]

    samples = sorted(SAMPLE.iterdir())
    for p in samples:
        check(p)
    hams = [p for p in samples if not p.name.startswith("spam")]
    spams = [p for p in samples if p.name.startswith("spam")]
    if ham is None:
        ham = DEFAULT_HAM if not check(DEFAULT_HAM)[1] else min(hams, key=lambda p: check(p)[2])
    if high is None:
        high = max(spams, key=lambda p: check(p)[2])
        if check(high)[2] < reject:
            notes.append(f"no sample spam scores {reject:g} or more (the highest: {check(high)[2]});"
                         " it is expected to be accepted and flagged")
    if flagged is None:
        t = check(DEFAULT_FLAGGED)[3]
        band = [p for p in spams if check(p)[1] and check(p)[2] < reject and p != high]
        if DEFAULT_FLAGGED in band:
            flagged = DEFAULT_FLAGGED
        elif band:
            flagged = min(band, key=lambda p: abs(check(p)[2] - (t + reject) / 2))
        else:
            notes.append(f"no sample spam scores between T and {reject:g}: none sent for that case")
    picks = []
    for role, p in (("ham", ham), ("rejected", high), ("flagged", flagged)):
        if p is None:
            continue
        raw, is_spam, s, t = check(p)
        if role == "rejected" and s < reject:
            role = "flagged"
        picks.append(Pick(role, p, raw, is_spam, s, t))
    return picks, notes


def queued(qdir: Path) -> set[Path]:
    return {p for p in qdir.glob("*.eml")}


def wait_queued(qdir: Path, before: set, timeout: float = 10.0) -> list[Path]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if new := sorted(queued(qdir) - before):
            return new
        time.sleep(0.05)
    return []


def session(port: int, raw: bytes, out, source: str | None = None) -> tuple[int, str]:
    """One SMTP session (EHLO, MAIL, RCPT, DATA, QUIT); the DATA reply."""
    s = smtplib.SMTP("127.0.0.1", port, local_hostname="client.test", timeout=60,
                     source_address=(source, 0) if source else None)
    try:
        return exim_spamd.smtp_session(s, raw, out)
    finally:
        s.close()


def haraka_results(log: Path, since: int) -> list[str]:
    """The plugin's result lines (``status=..., score=..., reject=...``) logged after byte ``since``."""
    try:
        text = log.read_bytes()[since:].decode(errors="replace")
    except OSError:
        return []
    return [m.group(1) for m in RESULT_LINE.finditer(text)]


def run(model: Path, *, ham: Path | None = None, high: Path | None = None, flagged: Path | None = None,
        workdir: Path | None = None, keep: bool = False, out=print, spamnb: list[str] | None = None,
        allow_download: bool = True, reject: float = REJECT, prefix: Path | None = None) -> list[str]:
    """Do the whole exchange; return the differences from what is expected (none: all well).

    ``prefix``: a Haraka install (its node_modules) to use; by default the
    cached one, installed first when it is not there and ``allow_download``.

    Raises :class:`Unavailable` when Haraka cannot run here.
    """
    node = find_node()
    spamnb = spamnb or [sys.executable, "-m", "spamnb"]
    d = Path(workdir or tempfile.mkdtemp(prefix="spamnb-haraka-"))
    problems: list[str] = []
    serve = haraka = None
    try:
        if prefix is None:
            prefix = install(d, out=out, allow_download=allow_download)
        elif not haraka_bin(prefix).is_file():
            raise Unavailable(f"no Haraka in {prefix}")
        (d / "run").mkdir(mode=0o700, exist_ok=True)
        spamd_port, smtp_port = free_port(), free_port()
        hd = d / "haraka"
        make_haraka_dir(node, prefix, hd, smtp_port, spamd_port, reject)

        serve = start_serve(spamnb, model, d, spamd_port, out)

        haraka_log = d / "haraka.log"
        with open(haraka_log, "wb") as f:
            haraka = subprocess.Popen([node, str(haraka_bin(prefix)), "-c", str(hd)], stdout=f,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=d)

        wait_for("haraka", lambda: smtp_greets(smtp_port), haraka, haraka_log, timeout=30)
        out(f"haraka -c {hd}: SMTP on 127.0.0.1:{smtp_port}; config/spamassassin.ini:")
        for line in (hd / "config" / "spamassassin.ini").read_text().splitlines():
            out(f"  {line}")

        picks, notes = choose(spamd_port, ham, high, flagged, reject)
        for n in notes:
            out(f"note: {n}")
        qdir = hd / "queue"
        sends = [(p, None) for p in picks]
        sends += [(p, RELAY_FROM) for p in picks if p.role == "rejected"]
        for pick, source in sends:
            name = pick.path.relative_to(ROOT) if pick.path.is_relative_to(ROOT) else pick.path
            label = pick.role + (f", from {source} (relaying)" if source else "")
            out(f"\n{label}: {name}")
            out(f"  spamnb's own CHECK of the message as sent: Spam: {pick.spam} ; {pick.s} / {pick.t}")
            want_spam = pick.role != "ham"
            if pick.spam != want_spam:
                problems.append(f"{label}: the model itself judges it {'spam' if pick.spam else 'not spam'}"
                                f" ({pick.s} / {pick.t}): pick another message or model")
            before, log_at = queued(qdir), haraka_log.stat().st_size
            try:
                code, text = session(smtp_port, pick.raw, out, source)
            except (OSError, smtplib.SMTPException) as e:
                problems.append(f"{label}: the SMTP session failed: {e!r} (haraka: {tail(haraka_log)})")
                continue
            if pick.role == "rejected":
                why = "spam score exceeded relay threshold" if source else "spam score exceeded threshold"
                if not (500 <= code < 600 and why in text):
                    problems.append(f"{label}: DATA answered {code} {text}, expected 5xx {why!r}")
                new = wait_queued(qdir, before, timeout=1.0)
                if new:
                    problems.append(f"{label}: it was queued ({new[0].name})")
                out(f"  queued: {'nowhere' if not new else new[0].name}")
            else:
                if code != 250:
                    problems.append(f"{label}: DATA answered {code} {text}, expected 250")
                    continue
                new = wait_queued(qdir, before)
                if len(new) != 1:
                    problems.append(f"{label}: {len(new)} new files in {qdir}, expected 1")
                    continue
                got = new[0].read_bytes()
                out(f"  queued: {new[0].relative_to(d)}")
                hdrs = email.parser.BytesHeaderParser(policy=email.policy.compat32).parsebytes(got)
                for hname in ("X-Spam-Flag", "X-Spam-Status", "Precedence"):
                    if hdrs.get(hname) is not None:
                        out(f"  {hname}: {hdrs[hname]}")
                flag = (hdrs.get("X-Spam-Flag") or "").strip()
                status = hdrs.get("X-Spam-Status") or ""
                m = STATUS_SCORE.search(status)
                if not m or "model=" not in status:
                    problems.append(f"{label}: X-Spam-Status {status!r} is not spamnb's (no score=, model=)")
                else:
                    s_hdr = float(m.group(1))
                    if abs(s_hdr - pick.s) > 1.0:
                        problems.append(f"{label}: Haraka's X-Spam-Status score {s_hdr} is far from spamnb's"
                                        f" own {pick.s} for the message as sent")
                    if pick.role == "ham" and not s_hdr < pick.t:
                        problems.append(f"ham: score {s_hdr} in X-Spam-Status is not below T={pick.t}")
                    if pick.role == "flagged" and not pick.t < s_hdr < reject:
                        problems.append(f"flagged: score {s_hdr} in X-Spam-Status is not between"
                                        f" T={pick.t} and {reject:g}")
                if pick.role == "ham":
                    if flag == "YES":  # spamnb writes the flag on spam only (SpamAssassin's rule)
                        problems.append(f"ham: X-Spam-Flag {flag!r}, expected none (or NO)")
                    if (hdrs.get("Precedence") or "").strip() == "junk":
                        problems.append("ham: Haraka added Precedence: junk")
                else:
                    if flag != "YES":
                        problems.append(f"flagged: X-Spam-Flag {flag!r}, expected YES")
                    if (hdrs.get("Precedence") or "").strip() != "junk":
                        problems.append("flagged: no Precedence: junk (Haraka adds it when spamd says True)")
                body = pick.raw.partition(b"\r\n\r\n")[2].replace(b"\r\n", b"\n")
                if body not in got:
                    problems.append(f"{label}: the queued body differs from the one sent")
            time.sleep(0.1)  # the log line is written with the reply; let it reach the file
            results = haraka_results(haraka_log, log_at)
            for r in results:
                out(f"  haraka log: [spamassassin] {r}")
            if not results:
                problems.append(f"{label}: no [spamassassin] result in Haraka's log: {tail(haraka_log)}")
    except RuntimeError as e:
        problems.append(str(e))
    finally:
        leave(d, keep=keep, made=workdir is None, out=out, procs=(haraka, serve))
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="a spamnb model (default: train one on the shipped corpus)")
    ap.add_argument("--ham", type=Path, help=f"the ham to send (default: {DEFAULT_HAM.name})")
    ap.add_argument("--spam", type=Path, help="the spam expected to be rejected "
                                              "(default: the sample spam spamnb scores highest)")
    ap.add_argument("--flagged", type=Path, help="a spam scoring between T and 7, expected accepted and flagged"
                                                 f" (default: {DEFAULT_FLAGGED.name} if it does, else the"
                                                 " sample closest to the middle)")
    ap.add_argument("--no-install", action="store_true", help="use the cached Haraka only (no npm)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (config, logs, queue)")
    args = ap.parse_args(argv)

    def check():
        find_node()
        if args.no_install and cached() is None:
            raise Unavailable(f"Haraka {HARAKA_VERSION} is not cached in {cache_dir()}")

    def go(model, _):
        return run(model, ham=args.ham, high=args.spam, flagged=args.flagged, keep=args.keep,
                   allow_download=not args.no_install)

    return drive("haraka_spamd", "Haraka and spamnb", args.model, check, go)


if __name__ == "__main__":
    sys.exit(main())
