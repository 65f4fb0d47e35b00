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
  message, so use more messages). What the server spends while no message comes
  (measured for 5 s before the passes) is taken out of each pass by its length.
* **host CPU per message** (with a cgroup only): the same, of every process either way
  runs on: ``spamnb serve``, the private Postfix (its master and every process it
  starts: smtpd, cleanup, the delivery) and spamass-milter with the ``spamc`` it runs
  for each message. What a site's machine spends on a message, either way.

Each ratio is the median of the passes' paired ratios, with a 95% bootstrap interval
over the passes (a shared machine drifts from run to run: the interval says how far
one run's figure can be trusted). The model given is copied, so that each run's
history starts empty.

Needs root, Postfix and spamass-milter (``python tools/harnesses/postfix_milter.py
--unpack-only``), spamc.

    .venv/bin/python tools/benchmarks/bench_milter.py --n 50 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import shutil
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
    utime + stime (clock ticks). ``how`` says which. ``more``: other processes put in the
    same cgroup (their children started later join it); only counted with a cgroup."""

    def __init__(self, pid: int, more=(), tag="serve"):
        self.pid, self.group, self.how = pid, None, "/proc/PID/stat (clock ticks)"
        for root, name, unit in CGROUPS:
            group = Path(root) / f"spamnb-bench-{os.getpid()}-{tag}"
            try:
                group.mkdir()
            except OSError:
                continue
            try:
                for each in (pid, *more):
                    (group / "cgroup.procs").write_text(str(each))
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


def idle_cpu(cpu_of, seconds=5.0) -> float:
    """The server's CPU a second while no message comes (its threads' periodic wake-ups),
    taken out of each pass by its length: a way whose passes take longer would be
    charged more of it a message."""
    c0, t0 = cpu_of.seconds(), time.monotonic()
    time.sleep(seconds)
    return (cpu_of.seconds() - c0) / (time.monotonic() - t0)


def median_ratio(mine, ref) -> str:
    """The median of the passes' paired ratios, with a 95% bootstrap interval over the passes."""
    import random

    ratios = [m / r for m, r in zip(mine, ref) if r]
    rng = random.Random(1)
    boots = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
    return f"{statistics.median(ratios):.3f} [{boots[49]:.3f}, {boots[1949]:.3f}]"


def family(roots) -> list[int]:
    """The processes ``roots`` and every process started under them, running now."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, todo = set(), [r for r in roots if r in parent]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(child for child, ppid in parent.items() if ppid == pid)
    return sorted(found)


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
        if args.model is not None:  # a copy: the history starts empty each run (a grown one costs more a write)
            for src in (model, Path(f"{model}.scorer")):
                if src.exists():
                    shutil.copy2(src, Path(tmp) / src.name)
            model = Path(tmp) / model.name
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
            master = int((inst.d / "spool" / "pid" / "master.pid").read_text().split()[0])
            host_of = CPU(proc.pid, family([master, proc.pid]), tag="host") if cpu_of.group else None
            try:
                ways = {"spamnb --milter": inst.smtp_port, "spamass-milter + --spamd": second_smtp}
                for port in ways.values():  # warm both: the model loaded, the processes started
                    for raw in msgs[:4]:
                        data_time(port, raw)
                idle = idle_cpu(cpu_of)
                times = {w: [] for w in ways}
                cpu = {w: [] for w in ways}
                host = {w: [] for w in ways}
                for rep in range(args.repeats):
                    order = list(ways) if rep % 2 == 0 else list(ways)[::-1]
                    for way in order:
                        c0, h0, t0 = cpu_of.seconds(), host_of.seconds() if host_of else 0.0, time.monotonic()
                        times[way].append(statistics.median(data_time(ways[way], raw) for raw in msgs))
                        time.sleep(0.5)  # the last message's delivery (Postfix's, after the 250) counted too
                        waited = idle * (time.monotonic() - t0)  # what the server spends anyway, however long
                        cpu[way].append((cpu_of.seconds() - c0 - waited) / len(msgs))
                        if host_of:
                            host[way].append((cpu_of.seconds() + host_of.seconds() - c0 - h0 - waited) / len(msgs))
            finally:
                stop(proc)
        cpu_of.close()
        if host_of:
            host_of.close()
    mine, ref = "spamnb --milter", "spamass-milter + --spamd"
    print(f"{args.repeats} passes of {args.n} messages each way, through Postfix ({pf}); CPU from {cpu_of.how}; "
          f"the server's idle CPU, {1000 * idle:.2f} ms a second, taken out\n")
    print("| measure | spamass-milter + spamd | spamnb --milter | ratio (95% interval) |")
    print("|---|---|---|---|")
    rows = [("DATA to 250 (median)", times, 1), ("spamnb serve CPU per message", cpu, 2)]
    if host_of:
        rows.append(("host CPU per message (serve, Postfix, spamass-milter, spamc)", host, 2))
    for what, got, digits in rows:
        print(f"| {what} | {1000 * statistics.median(got[ref]):.{digits}f} ms | "
              f"{1000 * statistics.median(got[mine]):.{digits}f} ms | {median_ratio(got[mine], got[ref])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
