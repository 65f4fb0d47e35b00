#!/usr/bin/env python3
"""The milter's protocol work a message: its CPU beside the scoring.

The shipped sample maildir's messages, each as a Postfix-like session (option
negotiation, the envelope with its macros, an empty macro list before each header
field, the body, the end of the body with the queue id, QUIT), cut into packets
(:class:`spamnb.delivery.milter_protocol.Packets`) and fed to a
:class:`spamnb.delivery.milter.Session` from memory, its scoring replaced by a fixed
verdict: the microseconds of CPU a session costs the milter beside the scoring.

    python3 tools/benchmarks/milter_session_cpu.py
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from spamnb.delivery import milter  # noqa: E402
from spamnb.delivery import milter_protocol as mp  # noqa: E402

SAMPLE = ROOT / "corpora" / "sample-maildir" / "cur"
QUIT = mp.packet(mp.QUIT)


def messages() -> list[bytes]:
    out = []
    for path in sorted(SAMPLE.iterdir()):
        raw = path.read_bytes()
        out.append(raw.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n"))
    return out


def session(raw: bytes) -> bytes:
    """A Postfix-like session of ``raw`` up to the end of its body."""
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
    return b"".join(chunks)


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
    streams = [session(raw) + QUIT for raw in msgs]
    start = time.thread_time()
    for _ in range(rounds):
        for data in streams:
            s = milter.Session(srv, None, "127.0.0.1")
            packets = mp.Packets()
            packets.add(data)
            while not s.done and (got := packets.take()) is not None:
                s.step(*got)
    return (time.thread_time() - start) / (rounds * len(streams)) * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20, help="rounds of the sample maildir (default: %(default)s)")
    args = ap.parse_args(argv)
    msgs = messages()
    print(f"protocol work: {protocol_us(msgs, args.rounds):.1f} us a session ({len(msgs)} messages)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
