#!/usr/bin/env python3
"""Where the milter's CPU a message goes: its protocol work, and how the MTA's pace changes it.

Two measures, on the shipped sample maildir's messages, each sent as a Postfix-like
session (option negotiation, the envelope with its macros, an empty macro list before
each header field, the body, the end of the body with the queue id, QUIT):

* **protocol work**: the sessions fed to a :class:`spamnb.delivery.milter.Session`
  from memory, its scoring replaced by a fixed verdict: the microseconds of CPU a
  session costs the milter beside the scoring;
* **one write or four**: a ``spamnb serve --milter`` in this process (the model given),
  a client in another process sending each session in one write, then in four (after
  the negotiation, after the envelope, before the end of the body), the order
  alternating; the handler thread's CPU a session and the scoring's inside it. With
  ``--pin`` the server runs on CPU 0 and the client on CPU 1.

    python3 tools/benchmarks/milter_session_cpu.py --model MODEL [--pin]
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import types
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from spamnb.delivery import access, events, milter, usermodels  # noqa: E402
from spamnb.delivery import milter_protocol as mp  # noqa: E402
from spamnb.storage.filestore import FileBackend  # noqa: E402

SAMPLE = ROOT / "corpora" / "sample-maildir" / "cur"
QUIT = mp.packet(mp.QUIT)


def messages() -> list[bytes]:
    out = []
    for path in sorted(SAMPLE.iterdir()):
        raw = path.read_bytes()
        out.append(raw.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n"))
    return out


def session(raw: bytes) -> tuple[bytes, list[int]]:
    """A Postfix-like session of ``raw`` up to the end of its body, and where its four writes start."""
    head, _, body = raw.partition(b"\r\n\r\n")
    fields = []
    for line in head.split(b"\r\n"):
        if line[:1] in (b" ", b"\t") and fields:
            fields[-1] += b"\n" + line  # folded, as Postfix sends it
        else:
            fields.append(line)
    parts = [[mp.packet(mp.OPTNEG, struct.pack("!LLL", 6, 0x1FF, 0x1FFFFF))],
             [mp.packet(mp.MACRO, b"Cj\0mx.example.com\0{daemon_name}\0smtpd\0"),
              mp.packet(mp.CONNECT, b"client.example.net\x004" + struct.pack("!H", 40000) + b"192.0.2.9\0"),
              mp.packet(mp.HELO, b"client.example.net\0"),
              mp.packet(mp.MACRO, b"M{mail_mailer}\0esmtp\0{mail_addr}\0a@example.org\0"),
              mp.packet(mp.MAIL, b"<a@example.org>\0"),
              mp.packet(mp.MACRO, b"R{rcpt_mailer}\0local\0{rcpt_addr}\0bob\0"),
              mp.packet(mp.RCPT, b"<bob@example.com>\0")],
             [], [mp.packet(mp.MACRO, b"E{i}\0ABC123\0"), mp.packet(mp.EOB)]]
    for f in fields:
        name, _, value = f.partition(b":")
        parts[2] += [mp.packet(mp.MACRO, b"L"), mp.packet(mp.HEADER, name + b"\0" + value[1:] + b"\0")]
    parts[2] += [mp.packet(mp.BODY, body[i:i + 65535]) for i in range(0, len(body), 65535)]
    chunks = [b"".join(p) for p in parts]
    starts = [sum(len(c) for c in chunks[:i]) for i in range(4)]
    return b"".join(chunks), starts


class _Memory:
    """A socket that hands out ``data``."""

    def __init__(self, data):
        self.data, self.at = data, 0

    def setsockopt(self, *option):
        pass

    def recv(self, n):
        out = self.data[self.at:self.at + n]
        self.at += len(out)
        return out


def protocol_us(msgs, rounds=20) -> float:
    """Microseconds of CPU a session's protocol work costs (scoring replaced)."""
    verdict = types.SimpleNamespace(label="ham", decided=types.SimpleNamespace(
        lines=[b"X-Spam-Status: No, score=-5.00 required=2.94 tests=SPAMNB_HAM"]))
    srv = types.SimpleNamespace(limit=1 << 20, timeout_s=30, reject=False, on_error="accept")
    srv.models = types.SimpleNamespace(recorder=types.SimpleNamespace(lines=True),
                                       filter=lambda *a, **k: verdict)
    srv.answer = lambda s, msg: milter._MilterServer._verdict(srv, s, msg, msg.raw(), {"raddr": None,
                                                                                      "envelope": None})
    srv.rules = milter._MilterServer.rules
    streams = [session(raw)[0] + QUIT for raw in msgs]
    start = time.thread_time()
    for _ in range(rounds):
        for data in streams:
            s = milter.Session(srv, None, "127.0.0.1")
            for cmd, body in mp.PacketReader(_Memory(data)).packets(s.deadline):
                s.step(cmd, body)
                if s.done:
                    break
    return (time.thread_time() - start) / (rounds * len(streams)) * 1e6


def client(port: int, writes: int, pause: float) -> None:
    """The sessions to ``port``, each in ``writes`` writes (1 or 4), reading the answer."""
    for raw in messages():
        data, starts = session(raw)
        with socket.create_connection(("127.0.0.1", port)) as s:
            bounds = [0, len(data)] if writes == 1 else [*starts, len(data)]
            for a, b in zip(bounds, bounds[1:]):
                s.sendall(data[a:b])
                time.sleep(pause)
            got = b""
            while mp.packet(mp.ACCEPT) not in got:
                more = s.recv(65536)
                if not more:
                    break
                got += more
            s.sendall(QUIT)


def writes_ms(model: Path, rounds: int, pin: bool, pause: float) -> dict:
    """Handler and scoring CPU (ms) a session, by writes: {1: (handler, scoring), 4: ...}."""
    cpu, n, now = Counter(), Counter(), {"writes": 0}
    handle, scan = milter._Handler.handle, usermodels.Models.filter

    def timed_handle(self):
        start = time.thread_time()
        try:
            return handle(self)
        finally:
            cpu[now["writes"]] += time.thread_time() - start
            n[now["writes"]] += 1

    def timed_filter(self, *a, **k):
        start = time.thread_time()
        try:
            return scan(self, *a, **k)
        finally:
            cpu[-now["writes"]] += time.thread_time() - start

    milter._Handler.handle, usermodels.Models.filter = timed_handle, timed_filter
    if pin:
        os.sched_setaffinity(0, {0})
    backend = FileBackend(str(model)).resident()
    backend.view()
    models = usermodels.Models(backend, None, lambda line: None, recorder=events.Recorder(write=lambda line: None))
    srv = milter.TCPServer("127.0.0.1", 0, access.LOOPBACK)
    srv.configure(models, limit=1 << 20, timeout=30, reject=False, on_error="accept", log=lambda line: None,
                  max_connections=8)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.5}, daemon=True).start()
    port = srv.server_address[1]
    prefix = ["taskset", "-c", "1"] if pin else []
    try:
        for rnd in range(rounds):
            for writes in ((1, 4) if rnd % 2 == 0 else (4, 1)):
                now["writes"] = writes
                subprocess.run([*prefix, sys.executable, __file__, "--client", str(port), str(writes), str(pause)],
                               check=True)
        time.sleep(0.3)
    finally:
        srv.shutdown()
        srv.server_close()
    return {w: (cpu[w] / n[w] * 1e3, cpu[-w] / n[w] * 1e3) for w in (1, 4)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, help="a spamnb model (spamnb train ...)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the sample maildir a way (default: %(default)s)")
    ap.add_argument("--pause", type=float, default=0.0, help="seconds between a session's writes (default: 0)")
    ap.add_argument("--pin", action="store_true", help="the server on CPU 0, the client on CPU 1")
    ap.add_argument("--client", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.client:
        client(int(args.client[0]), int(args.client[1]), float(args.client[2]))
        return 0
    msgs = messages()
    print(f"protocol work: {protocol_us(msgs):.1f} us a session ({len(msgs)} messages)")
    if args.model is None:
        return 0
    got = writes_ms(args.model, args.rounds, args.pin, args.pause)
    for w, (handler, scoring) in got.items():
        print(f"{w} write{'s' if w > 1 else ''}: handler {handler:.3f} ms a session, scoring inside it {scoring:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
