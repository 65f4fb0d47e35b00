#!/usr/bin/env python3
"""spamnb's own milter against spamass-milter + ``spamnb serve --spamd``, through a real Postfix.

One private Postfix instance (:mod:`tools.harnesses.postfix_spamc`'s) with two smtpd
services: one whose ``smtpd_milters`` is ``spamnb serve --milter``, one whose is
spamass-milter (``-m``: it changes no body) running ``spamc`` against the same
``spamnb serve --spamd`` (one process serves both doors, one model). Each pass sends
``--n`` messages (ham and spam of the shipped corpus, alternately) through each way,
the order alternating from pass to pass, one SMTP session per message, and measures:

* **DATA to 250**: the SMTP client's time from sending DATA to Postfix's 250 (what
  the milter adds to each message's delivery), median per way; the ratio milter /
  spamass-milter is the median of the passes' ratios (target: at most 0.7);
* **server CPU per message**: ``spamnb serve``'s CPU (user + system of all its
  threads, the ended ones too) over the pass / messages: the milter's own answer
  against spamd's answer to spamass-milter's spamc (target: the milter's at most
  spamd's). Read in nanoseconds from a cgroup of its own (cpuacct, or cgroup v2's
  cpu.stat) where the machine lets root make one, else in clock ticks from
  /proc/PID/stat (10 ms: a pass of 60 messages then moves in steps of 0.17 ms a
  message, so use more messages).

Needs root, Postfix and spamass-milter (``python tools/harnesses/postfix_milter.py
--unpack-only``), spamc.

    python3 tools/benchmarks/bench_milter.py --n 50 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import smtplib
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the project: spamnb, tools
from tools.harnesses.exim_spamd import (RECIPIENT, SENDER, Unavailable, as_sent, free_port,  # noqa: E402
                                        model_or_trained, stop)
from tools.harnesses.postfix_milter import find_milter, start_milter  # noqa: E402
from tools.harnesses.postfix_own_milter import milter_options  # noqa: E402
from tools.harnesses.postfix_spamc import find_postfix, instance  # noqa: E402

CLK = os.sysconf("SC_CLK_TCK")
CGROUPS = (("/sys/fs/cgroup/cpuacct", "cpuacct.usage", 1e-9),  # cgroup v1: nanoseconds
           ("/sys/fs/cgroup/unified", "cpu.stat", 1e-6),  # cgroup v2 beside v1: usage_usec
           ("/sys/fs/cgroup", "cpu.stat", 1e-6))  # cgroup v2 alone


class CPU:
    """CPU seconds of process ``pid`` so far, all its threads: from a cgroup made for it
    (ns; threads that ended are counted) when root can make one, else /proc/PID/stat's
    utime + stime (clock ticks). ``how`` says which."""

    def __init__(self, pid: int):
        self.pid, self.group, self.how = pid, None, "/proc/PID/stat (clock ticks)"
        for root, name, unit in CGROUPS:
            group = Path(root) / f"spamnb-bench-{os.getpid()}"
            try:
                group.mkdir()
            except OSError:
                continue
            try:
                (group / "cgroup.procs").write_text(str(pid))
                self.group, self.file, self.unit = group, group / name, unit
                self.how = f"cgroup {group / name} (ns)" if unit == 1e-9 else f"cgroup {group / name} (us)"
                break
            except OSError:
                group.rmdir()

    def seconds(self) -> float:
        if self.group is None:
            with open(f"/proc/{self.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / CLK
        text = self.file.read_text()
        value = text.split()[1] if text.startswith("usage_usec") else text.split()[0]
        return int(value) * self.unit

    def close(self):
        if self.group is not None:  # the process is gone by now: the group is empty
            try:
                self.group.rmdir()
            except OSError:
                pass


def serve_pid(inst) -> int:
    """The pid of the instance's ``spamnb serve`` (the one whose socket is DIR/run/sock)."""
    want = str(inst.d / "run" / "sock").encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if want in f.read():
                        return int(entry)
            except OSError:
                continue
    raise RuntimeError("spamnb serve's process not found")


def data_time(port: int, raw: bytes) -> float:
    """One SMTP session; the seconds from DATA to Postfix's 250."""
    with smtplib.SMTP("127.0.0.1", port, local_hostname="client.test", timeout=60) as s:
        s.ehlo()
        s.mail(SENDER)
        s.rcpt(RECIPIENT)
        t0 = time.perf_counter()
        code, text = s.data(raw)
        took = time.perf_counter() - t0
    if code != 250:
        raise RuntimeError(f"DATA answered {code} {text!r}")
    return took


def messages(n: int) -> list[bytes]:
    """``n`` messages of the shipped sample maildir, ham and spam alternately, as sent."""
    files = sorted((Path(__file__).resolve().parents[2] / "corpora" / "sample-maildir" / "cur").iterdir())
    spam = [p for p in files if p.name.startswith("spam")]
    ham = [p for p in files if not p.name.startswith("spam")]
    out = []
    for i in range(n):
        pool = spam if i % 2 and spam else ham
        out.append(as_sent(pool[i // 2 % len(pool)].read_bytes()))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, help="a spamnb model (default: train one on the shipped corpus)")
    ap.add_argument("--n", type=int, default=40, help="messages a pass and way (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=5, help="passes (default: %(default)s)")
    args = ap.parse_args(argv)
    try:
        pf, milter = find_postfix(), find_milter()
    except Unavailable as e:
        print(f"bench_milter.py: {e}", file=sys.stderr)
        return 77
    msgs = messages(args.n)
    with tempfile.TemporaryDirectory(prefix="spamnb-bench-milter-") as tmp:
        model = model_or_trained(args.model, tmp)
        own, theirs, second_smtp = free_port(), free_port(), free_port()

        def services(ports):
            # the first smtpd (the instance's port) asks spamnb's milter; a second service
            # line, on its own port, asks spamass-milter
            return (f"{milter_options(own)}\n127.0.0.1:{second_smtp} inet n - n - - smtpd "
                    f"{milter_options(theirs)}")

        with instance(model, pf, out=lambda _: None, smtpd_options=services,
                      serve_options=["--milter", f"127.0.0.1:{own}"]) as inst:
            proc = start_milter(milter, theirs, inst.spamd_port, ["-m"], inst.d / "milter.log")
            cpu_of = CPU(serve_pid(inst))
            try:
                ways = {"spamnb --milter": inst.smtp_port, "spamass-milter + --spamd": second_smtp}
                for port in ways.values():  # warm both: the model loaded, the processes started
                    for raw in msgs[:4]:
                        data_time(port, raw)
                times = {w: [] for w in ways}
                cpu = {w: [] for w in ways}
                for rep in range(args.repeats):
                    order = list(ways) if rep % 2 == 0 else list(ways)[::-1]
                    for way in order:
                        c0 = cpu_of.seconds()
                        times[way].append(statistics.median(data_time(ways[way], raw) for raw in msgs))
                        cpu[way].append((cpu_of.seconds() - c0) / len(msgs))
            finally:
                stop(proc)
        cpu_of.close()
    mine, ref = "spamnb --milter", "spamass-milter + --spamd"
    print(f"{args.repeats} passes of {args.n} messages each way, through Postfix ({pf}); CPU from {cpu_of.how}\n")
    print("| measure | spamass-milter + spamd | spamnb --milter | ratio |")
    print("|---|---|---|---|")
    ratio = statistics.median(m / r for m, r in zip(times[mine], times[ref]) if r)
    print(f"| DATA to 250 (median) | {1000 * statistics.median(times[ref]):.1f} ms | "
          f"{1000 * statistics.median(times[mine]):.1f} ms | {ratio:.3f} |")
    cratio = statistics.median(m / r for m, r in zip(cpu[mine], cpu[ref]) if r)
    print(f"| spamnb serve CPU per message | {1000 * statistics.median(cpu[ref]):.2f} ms | "
          f"{1000 * statistics.median(cpu[mine]):.2f} ms | {cratio:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
