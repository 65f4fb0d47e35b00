"""The learns Dovecot's IMAPSieve pipe program could not do, kept for a retry, and its log.

The pipe program (``spamnb-learn``, :mod:`spamnb.delivery.imapsieve`) runs as the mail
user after a move is done: when spamnb cannot learn then (the model's lock busy, its
folder unwritable, spamnb itself not runnable), the person's correction would be lost.
So the pipe program keeps the message in a queue, and the next move, or ``spamnb
learn-queue`` (a timer's), learns it. Everything lives in the mail user's
``~/.local/state/spamnb/`` (from HOME alone: Dovecot sets no XDG variable, and the pipe
program and a ``spamnb learn-queue`` run from a login must find the same folder):

* ``learn-queue/`` (0700): one file (0600) per learn waiting, the message as Dovecot
  piped it, named ``STAMP.PID.LABEL`` (STAMP: the time in nanoseconds, 19 digits), so
  that the names sort in the order the moves were made: a message moved into Junk and
  back out is learned spam, then ham, as the person meant. The pipe program writes each
  under a dot name and renames it, so a retry never reads half a message; it bounds the
  queue (:data:`MAX_MESSAGES`, :data:`MAX_BYTES`), the oldest dropped first, even when
  spamnb cannot run at all.
* ``learn.log``: a line per learn, queued learn, failed retry and dropped learn (the
  time, what happened, the label, the Message-ID, why), rotated to ``learn.log.1`` at
  :data:`LOG_MAX_BYTES`; the same line goes to syslog (``spamnb-learn``) when one listens
  (on ``/dev/log``). No syslog is needed for the record.

A message learned twice (a retry of a learn that was done before its process was
stopped) changes nothing: spamnb learns a message once by its identity. What is not a
mail message cannot be learned by any retry: it is dropped, with a line, at once.

Standard library only at import, as the fast paths.
"""

from __future__ import annotations

import os
import re
import stat
import time

#: At most this many learns wait in a user's queue ...
MAX_MESSAGES = 200
#: ... holding at most this many bytes; past either, the oldest are dropped (a line each).
MAX_BYTES = 20 * 1024 * 1024
#: The log is moved to ``learn.log.1`` (the one old log kept) once it is this large.
LOG_MAX_BYTES = 1024 * 1024
#: How long the pipe program lets ``learn-queue`` go on (Dovecot stops the pipe program
#: after ``sieve_pipe_exec_timeout``, 10 s by default; what is left waits for the next).
PIPE_SECONDS = 5
#: How long ``learn-queue`` waits for another one to finish (the pipe program's, a timer's).
LOCK_WAIT = 30.0
QUEUE, LOG = "learn-queue", "learn.log"
NAME = re.compile(r"^[0-9]+\.[0-9]+\.(spam|ham)$")


class Failed(Exception):
    """A learn that failed (the message stays queued); its text is one line."""


def state_dir(env=os.environ) -> str:
    """The mail user's ``~/.local/state/spamnb`` (``~``: ``$HOME``, as the pipe program has it)."""
    return os.path.join(env.get("HOME") or os.path.expanduser("~"), ".local", "state", "spamnb")


def queue_dir(env=os.environ) -> str:
    return os.path.join(state_dir(env), QUEUE)


def log_path(env=os.environ) -> str:
    return os.path.join(state_dir(env), LOG)


def waiting(queue) -> list:
    """``[(name, label)]`` of the learns waiting in ``queue``, oldest first; [] when there is
    no queue. ValueError when someone else could have put messages there."""
    try:
        st = os.lstat(queue)
    except FileNotFoundError:
        return []
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        # a message planted there would be learned as the person's own correction
        raise ValueError(f"{queue} is not a private folder of yours (mode {stat.S_IMODE(st.st_mode):04o}, "
                         f"uid {st.st_uid}): refusing its messages; chmod 700 {queue} if it is yours")
    names = sorted(n for n in os.listdir(queue) if NAME.match(n))
    return [(n, n.rsplit(".", 1)[1]) for n in names]


def message_id(raw) -> str:
    """The Message-ID as a log line gives it: printable ASCII without spaces, at most 200
    characters, ``-`` without one (the pipe program's ``awk`` gives the same)."""
    head = raw.split(b"\n\n", 1)[0].split(b"\r\n\r\n", 1)[0]
    value, found = b"", False
    for line in head.split(b"\n"):
        if found:
            if line[:1] not in (b" ", b"\t"):
                break
            value += line
        elif line[:11].lower() == b"message-id:":
            value, found = line[11:], True
    text = "".join(chr(c) for c in value if 33 <= c <= 126)[:200]
    return text or "-"


def line(what, label, mid, text, when=None) -> str:
    """One line of the log: ``TIME WHAT LABEL MESSAGE-ID: TEXT`` (UTC)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))
    return f"{stamp} {what} {label} {mid}: {' '.join(str(text).split())}"


def note(log, what, label, mid, text) -> str:
    """Append a :func:`line` to ``log`` (rotated first when full) and to syslog when there
    is one; returns it. A log that cannot be written costs nothing but the line."""
    text = line(what, label, mid, text)
    try:
        _rotate(log)
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, (text + "\n").encode("utf-8", "replace"))
        finally:
            os.close(fd)
    except OSError:
        pass
    _syslog(what, text)
    return text


def _rotate(log):
    try:
        if os.stat(log).st_size >= LOG_MAX_BYTES:
            os.replace(log, log + ".1")
    except FileNotFoundError:
        pass


_syslog_there = None  # whether a syslog listens, asked (and syslog opened) at the first line of the process


def _syslog(what, text):
    global _syslog_there
    if _syslog_there is None:
        from spamnb.delivery.events import syslog_there

        _syslog_there = syslog_there()
        if _syslog_there:
            import syslog

            syslog.openlog("spamnb-learn", 0, syslog.LOG_MAIL)
    if not _syslog_there:
        return  # no syslog here: the log file is the record
    import syslog

    from spamnb.storage.locate import local_user

    syslog.syslog(syslog.LOG_INFO if what == "learned" else syslog.LOG_WARNING, f"{local_user()}: {text}")


def lock(queue, seconds=LOCK_WAIT):
    """The queue's lock (``QUEUE/.lock``): its fd once held, None when another retry held it
    for ``seconds``; one retry at a time keeps the learns in their order."""
    from spamnb.storage.store import try_lock

    deadline = time.monotonic() + seconds
    while True:
        fd = try_lock(os.path.join(queue, ".lock"))
        if fd is not None or time.monotonic() >= deadline:
            return fd
        time.sleep(0.05)


def read(path) -> bytes:
    """The message of a queued learn: a regular file of ours, not followed if a link."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise ValueError("not a regular file of yours")
        return f.read(MAX_BYTES + 1)


class Retry:
    """What one :func:`retry` did: the counts, and why it stopped early (``failed``)."""

    def __init__(self):
        self.learned = self.dropped = self.left = 0
        self.failed = None


def retry(queue, log, learn, *, seconds=None, say=lambda text: None) -> Retry:
    """Learn the queued learns, oldest first, each removed once learned: ``learn(raw,
    label)`` returns the learn's summary, or raises :class:`Failed`, which stops the retry
    there (the later ones wait behind it, so that they keep their order). What is not a
    mail message is dropped. A learn queued meanwhile is learned too; after ``seconds``
    no new learn is started. Each outcome is a :func:`note`, also given to ``say``."""
    from spamnb.mail.mime import looks_like_mail

    started, done = time.monotonic(), Retry()
    while True:
        entries = waiting(queue)
        if not entries:
            return done
        if seconds is not None and time.monotonic() - started >= seconds:
            done.left = len(entries)
            return done
        name, label = entries[0]
        path = os.path.join(queue, name)
        try:
            raw = read(path)
        except FileNotFoundError:
            continue  # dropped by the pipe program's bound meanwhile
        except (OSError, ValueError) as exc:
            _drop(log, path, label, "-", f"cannot be read ({getattr(exc, 'strerror', None) or exc})", done, say)
            continue
        mid = message_id(raw)
        if len(raw) > MAX_BYTES or not looks_like_mail(raw):
            _drop(log, path, label, mid, "not a mail message (or over the queue's size): never retried", done,
                  say)
            continue
        try:
            summary = learn(raw, label)
        except Failed as exc:
            done.failed, done.left = str(exc), len(entries)
            say(note(log, "failed", label, mid, f"{exc}; kept in {queue} for a retry"))
            return done
        _remove(path)
        done.learned += 1
        say(note(log, "learned", label, mid, f"{summary} (queued {_queued_at(name)})"))


def _drop(log, path, label, mid, why, done, say):
    _remove(path)
    done.dropped += 1
    say(note(log, "dropped", label, mid, why))


def _remove(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _queued_at(name) -> str:
    when = queued_when(name)
    return "at an unknown time" if when is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))


def queued_when(name) -> float | None:
    """When the learn named ``name`` was queued (seconds since 1970), None if its stamp is no time."""
    try:
        when = int(name.split(".")[0]) / 1e9
        time.gmtime(when)
    except (ValueError, OverflowError, OSError):
        return None
    return when
