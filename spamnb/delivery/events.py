"""A line per message, and the counts behind the metrics: what the filter did, as it did it.

Every way of answering that runs for an admin (``serve``'s private socket and
its spamd protocol, ``imap filter``, and ``filter --log-messages``) reports
each message here (:meth:`Recorder.message`), each message learned
(:meth:`Recorder.learned`) and each error (:meth:`Recorder.error`). A
:class:`Recorder` writes the line and, when the server exports metrics
(:mod:`spamnb.delivery.metrics`), counts it, so the log and the metrics
can never tell two stories.

The line, ``text`` form (spamd's ``key=value`` style, for grep and awk)::

    ts=2026-12-02T02:34:48.123Z event=message via=spamd verdict=spam score=9.00 p=0.999877
      cutoff=0.5/0.95 size=1098 ms=3.1 user=alice mid=<x@example.org> learned=no

(one line), or one JSON object a line with ``json``. Every message has one
line, the ones that were not scanned too: an ``event=error`` line with the
reason (``kind=``), and ``mail=unscanned`` when the mail went on unscanned
(spamc passes it through, the filter delivers it unchanged, IMAP leaves it
where it is)::

    ts=... event=error via=spamd kind=ex_ioerr mail=unscanned size=1098 user=alice
      raddr=192.0.2.7 mid=<x@example.org> text="cannot read the model: ..."

``raddr`` is the client's IP address (spamd over TCP); spamd's ``rhost``, the
name of that address, is not written: it would cost a DNS lookup per message.
``learn`` and ``forget`` lines say who taught (``source=``) what (``class=``). Values that come from the
message or the client (Message-ID, user, folder) are escaped (:func:`quote`), once 8-bit
bytes were read as a person reads them (UTF-8 when they are: "für" is written
``f\\u00fcr``, not its two bytes' ``f\\u00c3\\u00bcr``): no line break, no control or
non-ASCII character and no ``=`` survive, so a message cannot end its line or write a
``verdict=`` of its own.
:func:`parse` reads both forms back (``spamnb stats``).

A :class:`Recorder` given a ``history`` (a :class:`spamnb.storage.history.Recorder`)
also records each message there, with its ``raddr`` and envelope when the door knows
them, and marks the row of each message learned as the user's correction, lines or
not, for ``spamnb web``.

Every event is counted once, in the recorder's :class:`Counts`, lines or not: the
metrics read those counts at each scrape, and a server's heartbeat in a store
(:mod:`spamnb.storage.redissite`) reads them every few seconds.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time

FORMATS = ("text", "json")
DESTINATIONS = ("stderr", "syslog")
#: Where a message came in (``via=``) and who taught a learned one (``source=``).
VIA = ("socket", "spamd", "milter", "imap", "filter")
SOURCES = ("filter-u", "tell", "imap", "cli")
#: Every ``kind`` of an error line (:meth:`Recorder.error`), each a ``spamnb_errors_total``
#: and a ``spamnb_unscanned_total`` series from the start: spamd's error replies (their
#: sysexits name in lower case) and its refusals, the private socket's, and the failure
#: boundary of ``filter`` and ``imap filter`` (``tests/test_prometheus.py`` checks the list
#: against the code and docs/admin.md's table).
ERROR_KINDS = ("ex_dataerr", "ex_ioerr", "ex_noperm", "ex_nouser", "ex_protocol", "ex_software", "ex_tempfail",
               "ex_timeout", "ex_unavailable", "too_big", "not_allowed",  # spamd (too_big: imap filter too)
               "declined", "busy", "refused", "dropped",  # the private socket
               "failed")  # filter, imap filter
#: ``mail=`` of an error line after which the mail went on without a verdict.
UNSCANNED = "unscanned"
#: Characters a value may have and stay bare: printable ASCII but space, quote, backslash and ``=``.
_PLAIN = re.compile(r'[!#-<>-\[\]-~]+')  # one scan, not a step a character
#: A Message-ID longer than this is cut (a header can be any length; a log line should not).
MAX_VALUE = 200
#: The history's name of a ``via`` (:mod:`spamnb.storage.history`: ``serve`` for its private socket).
HISTORY_VIA = {"socket": "serve"}


def quote(value) -> str:
    """A value as it appears after ``key=``: bare when plain, else in double
    quotes with JSON's escapes plus ``=`` and space as ``\\u003d`` / ``\\u0020``,
    so it holds no line break and no ``key=`` a grep could take for a field."""
    text = str(value)
    if _PLAIN.fullmatch(text):
        return text
    return json.dumps(text, ensure_ascii=True).replace("=", "\\u003d").replace(" ", "\\u0020")


def message_id(raw: bytes) -> str | None:
    """The Message-ID header of ``raw`` (unfolded, at most :data:`MAX_VALUE`
    characters), looked for in its header block only; None without one."""
    head = raw[:65536]
    end = min((i for i in (head.find(b"\n\n"), head.find(b"\r\n\r\n")) if i >= 0), default=len(head))
    head = head[:end]
    low = head.lower()
    at = 0 if low.startswith(b"message-id:") else low.find(b"\nmessage-id:") + 1
    if at <= 0 and not low.startswith(b"message-id:"):
        return None
    value = head[at + len(b"message-id:"):]
    lines = value.split(b"\n")
    parts = [lines[0]] + [x for x in _continuation(lines[1:])]
    data = b" ".join(p.strip() for p in parts).strip()
    if data.isascii():
        return data.decode("ascii")[:MAX_VALUE] or None
    # 8-bit bytes read as a person reads them (UTF-8 when they are: "für", not "fÃ¼r"), then
    # escaped by the line (quote): no encoded words, which a Message-ID never holds (RFC 2047)
    from spamnb.mail.mime import readable

    return readable(data, "utf-8")[:MAX_VALUE] or None


def _continuation(lines):
    for line in lines:
        if not line[:1] in (b" ", b"\t"):
            return
        yield line


#: The SMTP envelope's fields a line may carry, in their order: the client's HELO name, the
#: sender, the recipients (comma-separated) and the MTA's queue id (a milter's ``{i}``).
ENVELOPE = ("helo", "sender", "rcpt", "qid")


def envelope_fields(envelope) -> dict:
    """The line's fields of ``envelope`` (a dict of :data:`ENVELOPE`'s keys, or None)."""
    if not envelope:
        return {}
    return {key: envelope.get(key) or None for key in ENVELOPE}


def format_line(fields: dict, fmt: str = "text") -> str:
    """One event as a line (without its newline); ``fields`` in order, None values left out."""
    fields = {k: v for k, v in fields.items() if v is not None}
    if fmt == "json":
        return json.dumps(fields, ensure_ascii=True, separators=(",", ":"))
    return " ".join(f"{k}={quote(v)}" for k, v in fields.items())


def parse(line: str) -> dict | None:
    """The fields of a line written by :func:`format_line` in either form (values
    as strings in the text form), or None for a line that is not one (other log lines)."""
    line = line.strip()
    # a line from journald or syslog has a prefix: the fields start at ts=
    if line.startswith("{"):
        try:
            data = json.loads(line)
        except ValueError:
            return None
        return data if isinstance(data, dict) and "event" in data else None
    at = line.find("ts=")
    if at < 0:
        return None
    out = {}
    for item in line[at:].split(" "):
        key, eq, value = item.partition("=")
        if not eq:
            return None
        if value.startswith('"'):
            try:
                value = json.loads(value)
            except ValueError:
                return None
        out[key] = value
    return out if "event" in out else None


#: Where syslog(3) sends its lines (glibc's _PATH_LOG).
SYSLOG_SOCKET = "/dev/log"


def syslog_there(path=None) -> bool:
    """Whether a syslog daemon (or journald) listens on :data:`SYSLOG_SOCKET`."""
    import socket

    for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):  # syslog(3) tries both
        try:
            with socket.socket(socket.AF_UNIX, kind) as s:
                s.connect(path or SYSLOG_SOCKET)
            return True
        except OSError:
            continue
    return False


def now_iso(t=None) -> str:
    t = time.time() if t is None else t
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


class Counts:
    """What the doors of one process did since it started, counted once: messages by verdict
    and way in, learns and forgets by class and source, errors by kind, and the messages that
    went on unscanned. A few dict increments under a lock per event, whoever reads them: the
    metrics at a scrape, the heartbeat at a beat (:meth:`snapshot`), never the delivery."""

    def __init__(self):
        self.started = time.time()
        self._lock = threading.Lock()
        self.messages = {}  # (verdict, via) -> n
        self.learned = {}  # (class, source) -> n
        self.forgotten = {}  # (class, source) -> n
        self.errors = {}  # kind -> n
        self.unscanned = {}  # kind -> n: of the errors, the messages that went on without a verdict

    def _add(self, table, key, n=1):
        with self._lock:
            table[key] = table.get(key, 0) + n

    def message(self, via, label):
        self._add(self.messages, (label, via))

    def learn(self, label, source):
        self._add(self.learned, (label, source))

    def forget(self, label, source):
        self._add(self.forgotten, (label, source))

    def error(self, kind, count=1, unscanned=False):
        with self._lock:
            self.errors[kind] = self.errors.get(kind, 0) + count
            if unscanned:
                self.unscanned[kind] = self.unscanned.get(kind, 0) + count

    def snapshot(self) -> dict:
        """A copy of every count, taken at once."""
        with self._lock:
            return {"messages": dict(self.messages), "learned": dict(self.learned),
                    "forgotten": dict(self.forgotten), "errors": dict(self.errors),
                    "unscanned": dict(self.unscanned)}


class Recorder:
    """Writes the event lines (when ``lines``), counts them (:attr:`counts`: the metrics'
    own when given ``metrics``, which also times them) and records each message in
    ``history`` (each when given)."""

    def __init__(self, *, lines=True, fmt="text", to="stderr", metrics=None, write=None, history=None):
        if fmt not in FORMATS or to not in DESTINATIONS:
            raise ValueError(f"log format {fmt!r}, destination {to!r}: not one of {FORMATS}, {DESTINATIONS}")
        self.lines = lines
        self.fmt = fmt
        self.metrics = metrics
        self.counts = metrics.counts if metrics is not None else Counts()
        self.history = history
        if metrics is not None:
            metrics.history = history  # its records lost, counted at each scrape
        self._lock = threading.Lock()
        if write is not None:
            self._write = write
        elif to == "syslog" and syslog_there():
            import syslog

            syslog.openlog("spamnb", syslog.LOG_PID, syslog.LOG_MAIL)
            self._write = lambda line: syslog.syslog(syslog.LOG_INFO, line)
        elif to == "syslog":  # syslog(3) would drop every line without a word
            if lines:
                sys.stderr.write(f"spamnb: warning: --log-to syslog: nothing listens on {SYSLOG_SOCKET}; "
                                 f"the lines go to stderr\n")
            self._write = self._stderr
        else:
            self._write = self._stderr

    @staticmethod
    def _stderr(line):
        sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def emit(self, fields):
        line = format_line({"ts": now_iso(), **fields}, self.fmt)
        with self._lock:  # one whole line at a time, whichever thread writes
            self._write(line)

    def message(self, via, label, score, p, cutoffs, size, seconds, *, raw=None, mid=None, user=None,
                learned=None, why=None, folder=None, raddr=None, envelope=None):
        """One message's verdict; ``learned`` the class it was learned as (None: not learned);
        ``folder``: where it was filed; ``envelope``: the SMTP envelope's fields the door
        knows (the milter's: :func:`envelope_fields`). Only the fast filter's line for a message the
        server answered has ``learned`` "?" (by the server's rule) and no ``cutoffs``,
        and that recorder has no history (the server records the verdict): a history
        is always handed a class or None, and the cut-offs."""
        self.counts.message(via, label)
        if learned:
            self.counts.learn(learned, why or "filter-u")
        if self.metrics is not None:
            self.metrics.scanned(seconds)
        if self.history is not None and raw is not None:
            self.history.add(raw, label, score, p, via=HISTORY_VIA.get(via, via), user=user, dest=folder,
                             learned=learned, cutoffs=cutoffs, raddr=raddr, envelope=envelope)
        if not self.lines:
            return
        if mid is None and raw is not None:
            mid = message_id(raw)
        self.emit({"event": "message", "via": via, "verdict": label, "score": f"{score:.2f}",
                   "p": f"{p:.6f}", "cutoff": f"{cutoffs[0]:g}/{cutoffs[1]:g}" if cutoffs else None,
                   "size": size, "ms": f"{seconds * 1000:.1f}", "user": user, "raddr": raddr,
                   **envelope_fields(envelope), "folder": folder, "mid": mid or "-", "learned": learned or "no", "why": why if learned and learned != "?" else None})

    def learned(self, label, source, *, raw=None, mid=None, user=None, was=None, raddr=None):
        """A message learned by the user's hand (``source``: TELL, an IMAP move, the
        command line); ``was``: the class it was filed as before, for a correction."""
        self.counts.learn(label, source)
        if self.history is not None and raw is not None:
            self.history.correct(raw, label, user=user)
        if not self.lines:
            return
        if mid is None and raw is not None:
            mid = message_id(raw)
        self.emit({"event": "learn", "class": label, "source": source, "was": was, "user": user,
                   "raddr": raddr, "mid": mid or "-"})

    def forgotten(self, label, source, *, raw=None, mid=None, user=None, raddr=None):
        """A message the user took back (``source``: TELL ``Remove:``): learned as
        ``label`` no more, so a correction to ``label`` in the history stands no more."""
        self.counts.forget(label, source)
        if self.history is not None and raw is not None:
            self.history.correct(raw, label, user=user, undo=True)
        if self.lines:
            if mid is None and raw is not None:
                mid = message_id(raw)
            self.emit({"event": "forget", "class": label, "source": source, "user": user, "raddr": raddr,
                       "mid": mid or "-"})

    def error(self, kind, text=None, *, via=None, unscanned=False, raw=None, mid=None, size=None, user=None,
              raddr=None, count=1, envelope=None):
        """An error a client or the model caused (``kind``: a short word), for the
        message ``raw`` (or of ``size`` bytes and Message-ID ``mid``) where there is
        one; ``unscanned``: the mail went on without a verdict. ``count``: the line
        stands for that many (connections refused in a flood, one line a second)."""
        self.counts.error(kind, count, unscanned)
        if self.lines:
            if mid is None and raw is not None:
                mid = message_id(raw)
            if size is None and raw is not None:
                size = len(raw)
            self.emit({"event": "error", "via": via, "kind": kind, "mail": UNSCANNED if unscanned else None,
                       "count": count if count != 1 else None, "size": size, "user": user, "raddr": raddr,
                       **envelope_fields(envelope), "mid": mid, "text": text})

    def answered(self, seconds):
        """A spamd request answered (or refused) ``seconds`` after it was accepted."""
        if self.metrics is not None:
            self.metrics.answered(seconds)

    def close(self):
        """Write what the history has queued, and close it."""
        if self.history is not None:
            self.history.close()


#: A recorder that writes and counts nothing (the library's default).
NOTHING = Recorder(lines=False)
