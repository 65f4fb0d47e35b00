"""What the filter did: every verdict in an SQLite database, ``MODEL.history.sqlite``
(which file: :func:`spamnb.storage.locate.history_path`).

``serve`` (both protocols), ``filter`` (when it does the work itself) and
``imap filter`` record each verdict here; ``spamnb web`` shows it and learns
from it. One row per verdict (time, verdict, score, P(spam), From, Subject,
Message-ID, user, size, which way answered, where the message went, who sent it
when the door knows (the client's address: spamd's, the milter's; the SMTP envelope: the
milter's), learned or not, the user's correction: made on the page, or learned by an IMAP move,
spamd TELL or ``spamnb learn``, its row found by Message-ID and the message's own
key: :func:`correct`),
and the whole message beside it for unsure ones (and the :data:`KEEP_RECENT`
most recent others) up to :data:`MAX_BODY` bytes, for :data:`BODY_DAYS` days:
enough to show them and learn them later.

Recording is a side effect of a delivery and never its master:

* bounded: SQLite waits at most :data:`BUSY_MS` for a lock; a locked, full,
  damaged or unwritable database skips the record and says so in the log,
  and the delivery goes on with its verdict;
* off the delivery's path in the server and ``imap filter``: :class:`Recorder`
  (handed each message by :class:`spamnb.delivery.events.Recorder`, where the
  line per message is written) passes the record to a writer thread through a
  bounded queue (a full queue drops it, logged); ``filter`` writes it itself
  (:func:`record_now`), after the verdict is decided;
* private (:func:`check_private`, :func:`check_folder`): the file is made mode 0600 (SQLite gives its
  ``-wal`` and ``-shm`` files the same mode); a file that is not ours, or that
  others may write or read (it holds mail), or a symlink, is not used, and
  neither is one whose ``-wal``, ``-shm`` or ``-journal`` file is such (SQLite
  reads them as part of the database: a WAL planted from another database
  forges rows, a world-writable one receives the mail), nor one in a folder
  that others may write to, a sticky one such as /tmp included (another user
  could create those files there before SQLite does: no check made before
  SQLite opens them could see one created a moment later);
* WAL mode, ``synchronous=NORMAL``: a commit is an append to the WAL with no
  fsync (a power cut may lose the last records, never the database), and the
  page reads while deliveries write.

Standard library only: the cold ``filter`` path imports this module.
"""

from __future__ import annotations

import math
import os
import stat
import time

from spamnb.storage import locate

MAX_BODY = 512 * 1024  # bytes: a bigger message is recorded without its body
KEEP_RECENT = 200  # bodies of the most recent messages that are not unsure
BODY_DAYS = 30  # days a kept body stays
ROW_DAYS = 400  # days a verdict's row stays
BUSY_MS = 50  # the longest a record waits for the database's lock
QUEUE = 1000  # records waiting for the server's writer; more are dropped
PRUNE_EVERY = 500  # records between two retention passes
LINGER = 0.05  # seconds the server's writer waits after a write, gathering the next records

# Histories made before corrections found their row by Message-ID lack it: the first
# correction makes it (a history is young: milliseconds), the schema makes it for new ones.
MID_INDEX = "CREATE INDEX IF NOT EXISTS verdicts_mid ON verdicts (message_id, id);"

SCHEMA = """
CREATE TABLE IF NOT EXISTS verdicts (
    id INTEGER PRIMARY KEY,
    t REAL NOT NULL,            -- seconds since the epoch
    verdict TEXT NOT NULL,      -- spam, ham, unsure: as delivered
    score REAL,                 -- log-odds
    p REAL,                     -- P(spam|message)
    sender TEXT, subject TEXT, message_id TEXT,
    user TEXT,                  -- the spamd User, the IMAP account, the local user
    size INTEGER,
    via TEXT,                   -- serve, spamd, filter, imap
    dest TEXT,                  -- where it went, when spamnb knows (an IMAP folder)
    learned TEXT,               -- the label filter -u's rule learned it as, at delivery
    corrected TEXT,             -- the label the user taught: the page, an IMAP move, TELL, spamnb learn
    corrected_t REAL,
    now_verdict TEXT,           -- after the last re-scoring on the page
    now_score REAL,
    ham_cut REAL, spam_cut REAL, -- the cut-offs the verdict was decided with (re-scoring uses them)
    message_key BLOB,           -- the message's identity (spamnb.mail.identity.message_key): its corrections
    -- who sent it, when the door knows (ENVELOPE_COLUMNS; NULL when not, and in rows recorded before version 3):
    client TEXT,                -- the connecting client's IP address: the SMTP client's (milter), spamc's (spamd)
    helo TEXT,                  -- the SMTP client's HELO/EHLO name (milter)
    env_sender TEXT,            -- the envelope sender, MAIL FROM (milter); not the From header (sender)
    rcpt TEXT,                  -- the envelope recipients, RCPT TO, comma-separated (milter)
    qid TEXT                    -- the MTA's queue id (milter: Postfix's and Sendmail's {i})
);
CREATE INDEX IF NOT EXISTS verdicts_t ON verdicts (t);
CREATE INDEX IF NOT EXISTS verdicts_verdict ON verdicts (verdict, id);
CREATE TABLE IF NOT EXISTS bodies (id INTEGER PRIMARY KEY, raw BLOB NOT NULL);
""" + MID_INDEX

#: The history's version (``PRAGMA user_version``): 2 since rows hold their message's key, 3
#: since they hold the SMTP envelope (:data:`ENVELOPE_COLUMNS`). A history of an older version
#: gets the columns it lacks when first opened for writing (:func:`upgrade`); its old rows keep
#: none (NULL): a row of version 1 is found by a correction by its Message-ID alone, as it was.
VERSION = 3
#: The versions a history may have when read: every one this code can upgrade.
VERSIONS = (1, 2, 3)
#: The columns of the envelope (version 3): who connected, and what the SMTP session said.
ENVELOPE_COLUMNS = ("client", "helo", "env_sender", "rcpt", "qid")
#: The most characters an envelope column holds (as :func:`fields` cuts From and Subject).
ENVELOPE_WIDTH = 300


class HistoryError(Exception):
    """The history database cannot be used (not ours, unsafe, damaged)."""


# -- the numbers a row holds, checked when read ---------------------------------------------

#: the earliest time a row (or its correction) may hold: 2000-01-01 00:00 UTC
EARLIEST = 946684800.0
#: how far into the future of the reader's clock a time may be (hosts' clocks differ a little)
AHEAD = 86400.0
#: the largest size a row may hold (2**53: an exact float, far beyond any message)
LARGEST = 2 ** 53


def _real(v):
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


def check_time(t, what, now=None):
    """ValueError naming ``what`` unless ``t`` is a time a verdict or a correction can have: a
    finite number of seconds since the epoch from :data:`EARLIEST` to :data:`AHEAD` past ``now``
    (a page shows it as a date: ``1e300`` or ``1e12`` is no date Python can make)."""
    now = time.time() if now is None else now
    if not _real(t) or not EARLIEST <= t <= now + AHEAD:
        raise ValueError(f"its {what} is {t!r}, not a time from 2000-01-01 to a day from now")


def check_numbers(r, now=None):
    """ValueError naming the first number of row ``r`` (a dict of the :data:`SCHEMA` columns
    present) that no verdict can hold: its time and its correction's time (:func:`check_time`),
    a score that is not finite, a P(spam) or cut-off outside 0..1, or cut-offs the other way
    round, a size that is not a whole number from 0 to :data:`LARGEST`."""
    check_time(r.get("t"), "time", now)
    if r.get("corrected_t") is not None:
        check_time(r["corrected_t"], "correction's time", now)
    for k in ("score", "now_score"):
        v = r.get(k)
        if v is not None and not _real(v):
            raise ValueError(f"its {k} is {v!r}")
    for k in ("p", "ham_cut", "spam_cut"):
        v = r.get(k)
        if v is not None and not (_real(v) and 0 <= v <= 1):
            raise ValueError(f"its {k} is {v!r}, not a number from 0 to 1")
    if r.get("ham_cut") is not None and r.get("spam_cut") is not None and r["ham_cut"] > r["spam_cut"]:
        raise ValueError(f"its cut-offs are {r['ham_cut']!r} > {r['spam_cut']!r}")
    size = r.get("size")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= LARGEST):
        raise ValueError(f"its size is {size!r}")


# -- the message's fields ---------------------------------------------------------------


#: The header fields a row shows, by the names :func:`fields` gives them.
ROW_FIELDS = {b"from": "sender", b"subject": "subject", b"message-id": "message_id"}


def fields(raw: bytes, want=("sender", "subject", "message_id")) -> dict:
    """From, Subject and Message-ID of ``raw`` (``want``: those of them to read, by
    :data:`ROW_FIELDS`' names) as a person reads them (:func:`spamnb.mail.mime.header_text`:
    RFC 2047 and raw 8-bit bytes decoded, in the message's charset when they are not
    UTF-8), unfolded, each cut to 300 characters: what a row shows. Never raises."""
    from spamnb.mail.mime import header_block_end, header_text, split_params

    want = {**{name: key for name, key in ROW_FIELDS.items() if key in want}, b"content-type": "type"}
    found = {}
    out = dict.fromkeys((key for key in want.values() if key != "type"), "")
    try:
        head = raw[:header_block_end(raw[:256 * 1024])]
        current = None
        for line in head.splitlines():
            if line[:1] in (b" ", b"\t"):
                if current:
                    found[current] += b" " + line.strip()
                continue
            name, colon, value = line.partition(b":")
            current = want.get(name.strip().lower()) if colon else None
            if current and current in found:
                current = None  # the first of a repeated field counts
            elif current:
                found[current] = value.strip()
        declared = split_params(found.pop("type", b"").decode("latin-1"))[1].get("charset")
        for k, v in found.items():
            out[k] = header_text(v, declared)[:300]
    except Exception:  # noqa: BLE001 - hostile headers give empty fields, never a failed record
        pass
    return out


# -- the database ----------------------------------------------------------------------


def open_db(path, *, create=True, readonly=False, busy_ms=BUSY_MS):
    """A connection to the history at ``path`` (made 0600 when missing and ``create``).

    HistoryError when the file is a symlink or not a regular file, is another
    user's, or others may write it (a record there could be forged) or read it,
    when its -wal, -shm or -journal is any of these, when its folder is not ours
    or others may write to it (:func:`check_folder`), or when it is not a
    history database; sqlite3.Error for the rest.
    """
    import sqlite3

    path = os.path.abspath(os.fspath(path))
    check_folder(path)
    if create and not readonly:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        except OSError as exc:
            raise HistoryError(f"cannot open history {path}: {exc.strerror or exc}") from None
        try:
            check_private(os.fstat(fd), path)
        finally:
            os.close(fd)
    else:
        try:
            st = os.lstat(path)
        except OSError as exc:
            raise HistoryError(f"no history at {path}: {exc.strerror or exc}") from None
        check_private(st, path)
    check_companions(path)
    uri = "file:" + path.replace("%", "%25").replace("?", "%3f").replace("#", "%23") + ("?mode=ro" if readonly else "")
    try:
        db = sqlite3.connect(uri, uri=True, timeout=busy_ms / 1000, check_same_thread=False, isolation_level=None)
    except sqlite3.Error as exc:
        raise HistoryError(f"cannot open history {path}: {exc}") from None
    try:
        db.execute(f"PRAGMA busy_timeout = {int(busy_ms)}")
        if not readonly:
            if db.execute("PRAGMA journal_mode = WAL").fetchone()[0].lower() != "wal":
                raise HistoryError(f"history {path}: cannot switch to WAL mode")
            db.execute("PRAGMA synchronous = NORMAL")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version == 0:
                db.executescript(SCHEMA + f"PRAGMA user_version = {VERSION};")
            elif version < VERSION:
                upgrade(db)
        elif db.execute("PRAGMA user_version").fetchone()[0] not in VERSIONS:
            raise HistoryError(f"{path} is not a spamnb history")
    except sqlite3.DatabaseError as exc:
        db.close()
        if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
            raise
        raise HistoryError(f"history {path}: {exc}") from None
    except BaseException:
        db.close()
        raise
    return db


def upgrade(db):
    """Give a history of an older version the columns it lacks (its rows keep none): version 1
    the ``message_key``, versions 1 and 2 the envelope's (:data:`ENVELOPE_COLUMNS`); once: the
    version read again inside a write lock, so that two processes opening it together add them
    once."""
    db.execute("BEGIN IMMEDIATE")
    try:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version == 1:
            db.execute("ALTER TABLE verdicts ADD COLUMN message_key BLOB")
        if version in (1, 2):
            for column in ENVELOPE_COLUMNS:
                db.execute(f"ALTER TABLE verdicts ADD COLUMN {column} TEXT")
            db.execute(f"PRAGMA user_version = {VERSION}")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


#: Mode bits a history file (or its -wal, -shm, -journal) may not have: written by
#: group or others (a record there could be forged) ...
OTHERS_WRITE = 0o022
#: ... or read by them: it holds whole messages.
OTHERS_READ = 0o044
#: SQLite's files beside a database, read as part of it.
COMPANIONS = ("-wal", "-shm", "-journal")


def check_private(st, path, what="history"):
    """HistoryError unless ``st`` (an lstat) is a regular file of ours that only we may read and write."""
    mode = stat.S_IMODE(st.st_mode)
    if not stat.S_ISREG(st.st_mode):
        raise HistoryError(f"{what} {path} is not a regular file")
    if st.st_uid != os.geteuid():
        raise HistoryError(f"{what} {path} belongs to uid {st.st_uid}, not to you")
    if st.st_mode & OTHERS_WRITE:
        raise HistoryError(f"{what} {path} may be written by others (mode {mode:04o}): chmod 600 it")
    if st.st_mode & OTHERS_READ:
        raise HistoryError(f"{what} {path} may be read by others (mode {mode:04o}) and it holds your mail: "
                           f"chmod 600 it")


def check_companions(path):
    """SQLite's ``-wal``, ``-shm`` and ``-journal`` of the history at ``path``, where
    there, checked as the history itself (:func:`check_private`)."""
    for suffix in COMPANIONS:
        try:
            st = os.lstat(path + suffix)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise HistoryError(f"cannot check history file {path + suffix}: {exc.strerror or exc}") from None
        check_private(st, path + suffix, what="history file")


def check_folder(path):
    """HistoryError unless only we (or root) may create files in the history's folder.

    SQLite creates the ``-wal`` and ``-shm`` files when it needs them, following
    no rule of ours: in a folder another user may write to (a sticky one such as
    /tmp too) that user can make them first, world-writable (they then receive
    every record) or from another database (whose rows then read as ours)."""
    folder = os.path.dirname(path)
    try:
        st = os.stat(folder)
    except OSError as exc:
        raise HistoryError(f"cannot use history {path}: its folder: {exc.strerror or exc}") from None
    where = "keep the history in a folder only you can write to (--history FILE, [history] path)"
    if st.st_uid not in (os.geteuid(), 0):
        raise HistoryError(f"history {path}: its folder {folder} belongs to uid {st.st_uid}, who could plant "
                           f"the database's -wal or -shm file there; {where}")
    if st.st_mode & OTHERS_WRITE:
        raise HistoryError(f"history {path}: its folder {folder} may be written by others "
                           f"(mode {stat.S_IMODE(st.st_mode):04o}), who could plant the database's -wal or -shm "
                           f"file there; {where}")


def row(raw, label, score, p, *, via, user=None, dest=None, learned=None, cutoffs=(None, None), t=None,
        raddr=None, envelope=None):
    """The record of one verdict: ``(columns, body or None)``; ``cutoffs``: the
    ``(ham, spam)`` cut-offs it was decided with; ``message_key``: the message's identity
    (:func:`spamnb.mail.identity.message_key`), by which its corrections find it; ``raddr``:
    the client's IP address, and ``envelope``: the SMTP envelope's ``helo``, ``sender``,
    ``rcpt`` and ``qid`` (a dict, :data:`spamnb.delivery.events.ENVELOPE`'s), where the door
    knows them (:func:`envelope_columns`)."""
    from spamnb.mail.identity import message_key

    f = fields(raw)
    cols = {"t": time.time() if t is None else t, "verdict": label, "score": float(score), "p": float(p),
            **f, "user": user or locate.local_user(), "size": len(raw), "via": via, "dest": dest, "learned": learned,
            "ham_cut": cutoffs[0], "spam_cut": cutoffs[1], "message_key": message_key(raw),
            **envelope_columns(raddr, envelope)}
    return cols, raw if len(raw) <= MAX_BODY else None


def envelope_columns(raddr=None, envelope=None) -> dict:
    """The :data:`ENVELOPE_COLUMNS` of a row: the client's address ``raddr`` and the SMTP
    ``envelope`` (``helo``, ``sender``: the envelope sender, ``rcpt``, ``qid``), each as a
    person reads it (:func:`spamnb.mail.mime.one_line`: no line break, control or
    bidirectional character survives) and cut to :data:`ENVELOPE_WIDTH` characters, as the
    header fields are; None for what is not known, or empty. Never raises: a hostile value
    is recorded bounded, never fails the record."""
    from spamnb.mail.mime import one_line

    envelope = envelope if isinstance(envelope, dict) else {}
    given = {"client": raddr, "helo": envelope.get("helo"), "env_sender": envelope.get("sender"),
             "rcpt": envelope.get("rcpt"), "qid": envelope.get("qid")}
    return {column: None if value is None else one_line(str(value))[:ENVELOPE_WIDTH] or None
            for column, value in given.items()}


def write(db, records, *, keep_recent=KEEP_RECENT, corrections=()):
    """Insert ``records`` (:func:`row`'s), then mark ``corrections`` (:func:`correct`'s),
    in one transaction."""
    if corrections:
        db.execute(MID_INDEX)
    db.execute("BEGIN IMMEDIATE")
    try:
        for cols, body in records:
            cur = db.execute(f"INSERT INTO verdicts ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                             list(cols.values()))
            if body is not None:
                db.execute("INSERT INTO bodies (id, raw) VALUES (?, ?)", (cur.lastrowid, body))
        last = cur.lastrowid if records else 0
        if last and last % PRUNE_EVERY < len(records):
            prune(db, keep_recent=keep_recent)
        correct(db, corrections)
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def prune(db, *, now=None, keep_recent=KEEP_RECENT, body_days=BODY_DAYS, row_days=ROW_DAYS):
    """Retention: bodies older than ``body_days``, bodies beyond the ``keep_recent``
    most recent of messages that were not unsure, rows older than ``row_days``.
    Inside the caller's transaction."""
    now = time.time() if now is None else now
    db.execute("DELETE FROM bodies WHERE id IN (SELECT id FROM verdicts WHERE t < ?)", (now - body_days * 86400,))
    db.execute("DELETE FROM bodies WHERE id IN (SELECT b.id FROM bodies b JOIN verdicts v ON v.id = b.id "
               "WHERE v.verdict != 'unsure' ORDER BY b.id DESC LIMIT -1 OFFSET ?)", (keep_recent,))
    db.execute("DELETE FROM verdicts WHERE t < ?", (now - row_days * 86400,))


def mark(db, row_id, label):
    """Mark verdict ``row_id`` corrected to ``label`` (spam or ham), now: what the page's
    choice and each correction learned elsewhere write, and the Overview counts."""
    db.execute("UPDATE verdicts SET corrected = ?, corrected_t = ? WHERE id = ?", (label, time.time(), row_id))


def unmark(db, row_id):
    """Take :func:`mark` back: verdict ``row_id`` is corrected no more."""
    db.execute("UPDATE verdicts SET corrected = NULL, corrected_t = NULL WHERE id = ?", (row_id,))


def correct(db, corrections):
    """Mark the row of each ``(raw, label, user, undo)`` the user corrected (an IMAP move,
    TELL, ``spamnb learn``): the newest verdict of the message's Message-ID (as
    :func:`fields` recorded it) and of the message itself (its key: two messages that share
    a Message-ID, as spammers' and some mailing lists' do, are told apart), of ``user`` when
    given (a server's history holds everyone's). A row recorded before rows held their
    message's key (a history of version 1) is found by its Message-ID alone, as it was. A
    message without a Message-ID, or never recorded, has no row: nothing is marked. A row
    already corrected to that label is left (the first time counts).
    ``undo`` (``spamnb forget``, TELL ``Remove:``): the learning is taken back, so a
    row corrected to ``label`` is corrected no more. Inside the caller's transaction;
    the number of rows changed."""
    from spamnb.mail.identity import message_key

    n = 0
    for raw, label, user, undo in corrections:
        mid = fields(raw)["message_id"]
        if not mid:
            continue
        found = db.execute("SELECT id, corrected FROM verdicts WHERE message_id = ?"
                           + (" AND user = ?" if user else "")
                           + " AND (message_key = ? OR message_key IS NULL) ORDER BY id DESC LIMIT 1",
                           (mid, *([user] if user else []), message_key(raw))).fetchone()
        if not found:
            continue
        if undo and found[1] == label:
            unmark(db, found[0])
            n += 1
        elif not undo and found[1] != label:
            mark(db, found[0], label)
            n += 1
    return n


def correct_now(path, raws, label, *, log, user=None, undo=False):
    """Mark the rows of ``raws``, just learned as ``label`` (``spamnb learn``; with
    ``undo``, forgotten: ``spamnb forget``), in the history at ``path``, now: at most
    :data:`BUSY_MS` of waiting; no history there, nothing to do; any failure is one
    line to ``log``, and the learning stands."""
    if not os.path.exists(path):  # before importing sqlite3: most learns have no history
        return
    import sqlite3

    try:
        db = open_db(path, create=False)
        try:
            db.execute(MID_INDEX)
            db.execute("BEGIN IMMEDIATE")
            try:
                correct(db, [(raw, label, user, undo) for raw in raws])
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        finally:
            db.close()
    except (sqlite3.Error, HistoryError, OSError) as exc:
        log(f"history: correction not recorded: {exc}")


# Connections ``record_now(..., leave_open=True)`` keeps to the process's end (see there).
LEFT_OPEN = []


def record_now(path, raw, label, score, p, *, log, leave_open=False, **kw):
    """Record one verdict now (``filter``): at most :data:`BUSY_MS`
    of waiting; any failure is one line to ``log`` and no record.

    ``leave_open``: for a process that ends at once without closing anything
    (the cold ``filter``, with ``os._exit``). Closing the last connection to a
    WAL database checkpoints it, an fsync (30 ms on a busy disk, where the
    commit itself takes 0.1 ms); left open, the WAL stays for the next
    connection (SQLite's case of a process that ended), and the checkpoint
    comes when the WAL has grown, paid once for many records."""
    import sqlite3

    try:
        db = open_db(path)
        try:
            write(db, [row(raw, label, score, p, **kw)])
        finally:
            if leave_open:
                LEFT_OPEN.append(db)
            else:
                db.close()
    except (sqlite3.Error, HistoryError, OSError) as exc:
        log(f"history not recorded: {exc}")


class Now:
    """The history of a process that handles one message or one batch (``filter``,
    ``learn``, ``forget``): :meth:`add` records a verdict at once (:func:`record_now`);
    :meth:`correct` keeps a correction, and :meth:`close` writes them all in one
    transaction (:func:`correct_now`). The server's :class:`Recorder` does the same
    through its writer thread."""

    def __init__(self, path, log, leave_open=False):
        self.path, self.log, self.leave_open = path, log, leave_open
        self.corrections = {}  # (label, user, undo) -> [raw, ...]

    def add(self, raw, label, score, p, **kw):
        record_now(self.path, raw, label, score, p, log=self.log, leave_open=self.leave_open, **kw)

    def correct(self, raw, label, user=None, undo=False):
        self.corrections.setdefault((label, user, undo), []).append(raw)

    def close(self):
        done, self.corrections = self.corrections, {}
        for (label, user, undo), raws in done.items():
            correct_now(self.path, raws, label, log=self.log, user=user, undo=undo)


class Recorder:
    """The server's recorder: :meth:`add` queues a record and returns at once; a
    writer thread writes what is queued in one transaction at a time."""

    def __init__(self, path, log):
        import queue
        import threading

        self.path = os.path.abspath(os.fspath(path))
        self.log = log
        self.db = open_db(self.path)  # a history that cannot open is an error at start, not per message
        self.queue = queue.Queue(QUEUE)
        self.dropped = 0  # the queue was full
        self.unwritten = 0  # their write failed
        self.thread = threading.Thread(target=self._run, name="spamnb-history", daemon=True)
        self.thread.start()

    @property
    def lost(self) -> int:
        """Records that never reached the history: dropped with the queue full, or whose
        write failed (``spamnb_history_lost_total``)."""
        return self.dropped + self.unwritten

    def add(self, raw, label, score, p, **kw):
        """Queue one verdict (never blocks; a full queue drops it, logged once per 100)."""
        self._put(("verdict", (raw, label, score, p, kw)))

    def correct(self, raw, label, user=None, undo=False):
        """Queue the user's correction of ``raw`` to ``label`` (its undoing, with
        ``undo``: :func:`correct`), written after the verdicts queued before it; never
        blocks, as :meth:`add`."""
        self._put(("correction", (raw, label, user, undo)))

    def _put(self, item):
        import queue

        try:
            self.queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1
            if self.dropped % 100 == 1:
                self.log(f"history: the writer is behind, {self.dropped} record(s) dropped")

    def _batch(self):
        """What is queued, up to 100 items (waiting for the first): ``(rows, corrections,
        stop)``; ``stop`` when :meth:`close` asked to end after them."""
        item = self.queue.get()
        batch = [item]
        while item is not None and len(batch) < 100:
            try:
                item = self.queue.get_nowait()
            except Exception:  # noqa: BLE001 - queue.Empty: write what we have
                break
            batch.append(item)
        items = [i for i in batch if i is not None]
        records = [row(raw, label, score, p, **kw) for kind, (raw, label, score, p, kw) in
                   ((k, v) for k, v in items if k == "verdict")]  # add()'s
        corrections = [v for k, v in items if k == "correction"]  # correct()'s
        return records, corrections, batch[-1] is None

    def _run(self):
        import sqlite3

        while True:
            records, corrections, stop = self._batch()
            try:
                write(self.db, records, corrections=corrections)
            except (sqlite3.Error, OSError) as exc:
                self.unwritten += len(records) + len(corrections)
                self.log(f"history: {len(records) + len(corrections)} record(s) not written: {exc}")
            if stop:
                return
            time.sleep(LINGER)  # let a burst gather: one transaction for many records

    def close(self, wait=5.0):
        """Write what is queued (at most ``wait`` seconds), then close."""
        try:
            self.queue.put(None, timeout=wait)
        except Exception:  # noqa: BLE001 - queue.Full: what is left is lost, the server stops anyway
            pass
        self.thread.join(wait)
        if not self.thread.is_alive():
            self.db.close()
