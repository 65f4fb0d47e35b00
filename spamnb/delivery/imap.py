"""``spamnb imap``: train from, filter and learn in the folders of an IMAP account.

Many people's mail lives on an IMAP server they do not run: no procmail, no
spamd. This filters it where it is and learns from what the user does there.

* **Train** (:func:`training_items`): every message of the ``--ham`` and
  ``--spam`` folders, read once with ``BODY.PEEK[]`` from a folder opened
  read-only (``EXAMINE``): no ``\\Seen`` flag changes.
* **Filter** (:class:`Filter`): the messages of the folder (INBOX) not
  classified yet get a keyword -- ``$Junk`` or ``$NotJunk``, as Thunderbird
  and Apple Mail use (IMAP cannot change a stored message, so no header is
  added) -- and spam moves to the Junk folder (the folder with the ``\\Junk``
  special use, else ``Junk``), unsure mail to ``--unsure-folder`` when given.
  A move is ``MOVE`` when the server has it, else ``COPY`` + ``\\Deleted`` +
  ``UID EXPUNGE`` of just that message (UIDPLUS); never a plain ``EXPUNGE``,
  and without UIDPLUS the original stays, marked ``\\Deleted``, for the
  user's client to expunge.
* **Learning from corrections**, on every pass: a message that arrives in Junk
  and that spamnb did not file there was put there by the user: it is learned
  as spam. spamnb filed it when this filter moved it, or when it arrives carrying
  spamnb's spam verdict header (:func:`spamnb.verdict.filed_as`: a procmail,
  maildrop or Sieve rule filed it on ``X-Spam-Flag: YES`` at delivery); either
  way it is remembered, not learned, so running both on one mailbox learns what
  one would. A message spamnb filed in Junk (or in the unsure folder) that shows
  up in the filtered folder again was moved back by the user: it is learned
  as ham (which forgets it as spam when it had been learned so). Deleting a
  message from Junk is no correction: it never shows up anywhere. Messages are
  recognised by :func:`spamnb.mail.identity.message_key`, as ``spamnb learn``
  recognises them, never by UID (a move gives a message a new UID).
* **State** (:class:`State`, ``MODEL.imap.json`` beside the user's model,
  written atomically): per folder the ``UIDVALIDITY`` and the last UID seen
  (UIDs only grow within one ``UIDVALIDITY``, so new mail and new arrivals in
  Junk are the UIDs above it), and per message key where spamnb last knew the
  message to be and what it learned. A changed ``UIDVALIDITY`` re-scans the
  folder; a message already known by its key is not classified or learned twice.
* **Crash safety**: the messages of a batch about to move are written to the
  state as *pending* (with their source UID) before the move; a pass that
  finds one pending finishes or confirms its move, so a dropped connection or
  a kill at any moment neither loses nor duplicates a message, nor mistakes
  spamnb's own move for a user's correction.

The first pass over a Junk folder takes what is already there as the user's
earlier judgement (remembered as in Junk, not learned): only what arrives
afterwards is a correction.

Round trips: a pass costs a ``SELECT`` and a ``UID SEARCH`` per folder, then
per batch of :data:`BATCH` new messages two ``UID FETCH`` (sizes and flags,
then bodies), one ``STORE`` per verdict's keyword (and one more only where a
message carries the other verdict's keyword already: a correction, or a mail
client's own marking) and one ``MOVE`` (or three commands without MOVE): a
handful of round trips per hundred messages.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field, fields

from spamnb import checks, verdict
from spamnb import options as table
from spamnb.mail.identity import LEARNED, MovesLearned, message_key

KEYWORDS = {"spam": b"$Junk", "ham": b"$NotJunk"}
#: Messages fetched per round trip, and the bytes of their bodies at most.
BATCH = 100
FETCH_BYTES = 32 * 1024 * 1024
#: A message larger than this is left where it is, unclassified and unlearned
#: (as ``spamnb serve`` answers larger ones unscanned).
MAX_MESSAGE = 64 * 1024 * 1024
#: Where spamnb last knew a message to be (the folders' roles, not their names).
INBOX, JUNK, UNSURE = "folder", "junk", "unsure"
STATE_VERSION = 1


class ImapError(Exception):
    """What the user is told, in one line (no traceback)."""


class StateError(ImapError):
    """The state file cannot be saved: the pass stops there (never a dropped connection)."""


class BadReply(ImapError):
    """The server answered what it must not (a SELECT without UIDVALIDITY): the pass
    stops there; ``--watch`` tries again at the next one."""


# -- settings: options and the config file ----------------------------------------------


@dataclass
class Settings:
    host: str | None = None
    port: int | None = None
    user: str | None = None
    password_file: str | None = None
    password_command: str | None = None
    security: str = "tls"
    cafile: str | None = None
    force_plaintext: bool = False
    folder: str = "INBOX"
    junk: str | None = None
    unsure_folder: str | None = None
    ham: tuple = ()
    spam: tuple = ()
    model: str | None = None

    def account(self) -> str:
        return f"{self.user}@{self.host}:{self.port or ''}"


CONFIG_KEYS = {f.name for f in fields(Settings)}


def read_config(path, *, explicit=False) -> dict:
    """The keys of the TOML config file at ``path`` ({} when it is not there and
    was not named). Refused unless it is a regular file of ours that no one
    else can read (it may hold how to get the password): mode 0600 or stricter."""
    import tomllib

    try:
        f = open_private(path, path, "config file")
    except FileNotFoundError:
        if explicit:
            raise ImapError(f"config file {path} does not exist") from None
        return {}
    except OSError as exc:
        raise ImapError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    try:
        with f:
            data = tomllib.load(f)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ImapError(f"config file {path}: {exc}") from None
    unknown = sorted(set(data) - CONFIG_KEYS - {k.replace("_", "-") for k in CONFIG_KEYS})
    if unknown:
        raise ImapError(f"config file {path}: unknown key(s) {', '.join(unknown)} "
                        f"(known: {', '.join(sorted(CONFIG_KEYS))})")
    return {k.replace("-", "_"): v for k, v in data.items()}


def settings_from(config: dict, options: dict) -> Settings:
    """Options given on the command line over the config file's keys over the defaults."""
    merged = {**config, **{k: v for k, v in options.items() if v not in (None, (), False)}}
    for key, value in merged.items():  # every [imap] key's kind and bounds, from its row of the table
        row = table.BY_KEY.get(("imap", key))
        if row is not None and value is not None:
            try:
                merged[key] = table.within(row, table.convert(row, value))
            except ValueError as exc:
                raise ImapError(f"{key}: {exc}") from None
    for key in ("ham", "spam"):
        value = merged.get(key, ())
        merged[key] = tuple([value] if isinstance(value, str) else value)
    try:
        s = Settings(**{k: merged[k] for k in CONFIG_KEYS if k in merged})
    except TypeError as exc:
        raise ImapError(str(exc)) from None
    if not s.host or not s.user:
        raise ImapError("say which account: --host and --user (or host and user in the config file)")
    if s.password_file and s.password_command:
        raise ImapError("give either a password file or a password command, not both")
    if not (s.password_file or s.password_command):
        raise ImapError("say how to get the password: --password-file FILE or --password-command CMD "
                        "(never the password itself on the command line)")
    # the checks `config --check` applies to the [imap] keys, the same functions
    try:
        checks.plaintext(s.security, s.host, s.force_plaintext)  # before the password file is opened
    except ValueError as exc:
        raise ImapError(str(exc)) from None
    for key in merged:  # then the rows' own checks (a file of ours, a host name), as `config --check` does
        row = table.BY_KEY.get(("imap", key))
        if row is not None and row.check and merged[key] is not None:
            try:
                table.check(row, merged[key])
            except ValueError as exc:
                raise ImapError(str(exc)) from None
    return s


def password(s: Settings) -> str:
    """The first line of the password file, or of what the password command prints."""
    if s.password_file:
        try:
            with open_private(os.path.expanduser(s.password_file), s.password_file, "password file") as f:
                text = f.readline().decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            why = getattr(exc, "strerror", None) or "it is not UTF-8 text"  # never the bytes themselves
            raise ImapError(f"cannot read the password file {s.password_file}: {why}") from None
    else:
        try:
            done = subprocess.run(s.password_command, shell=True, capture_output=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ImapError(f"the password command failed: {exc}") from None
        if done.returncode != 0:
            raise ImapError(f"the password command exited with status {done.returncode}")
        text = done.stdout.decode("utf-8", "replace").split("\n", 1)[0]
    text = text.rstrip("\r\n")
    if not text:
        raise ImapError("the password is empty")
    return text


def open_private(path, shown, what):
    """``path`` opened for reading (binary), once it is known to be a regular file of
    ours that no one else can read or write (mode 0600 or stricter): the config
    file's rule, and the password file's. ImapError otherwise; OSError passes through."""
    try:
        return checks.open_private(path, what, shown)
    except ValueError as exc:
        raise ImapError(str(exc)) from None


def connect(s: Settings, *, timeout=60.0):
    """A logged-in :class:`imapclient.IMAPClient` for ``s``; ImapError otherwise."""
    import ssl

    imapclient = require_imapclient()
    try:
        checks.plaintext(s.security, s.host, s.force_plaintext)
    except ValueError as exc:
        raise ImapError(str(exc)) from None
    ctx = ssl.create_default_context(cafile=s.cafile) if s.security != "none" else None
    port = s.port or (993 if s.security == "tls" else 143)
    where = f"{s.host}:{port}"
    try:
        client = imapclient.IMAPClient(s.host, port, ssl=s.security == "tls", ssl_context=ctx, timeout=timeout)
        cap_literals(client)
        if s.security == "starttls":
            client.starttls(ctx)
        _login(client, s)
    except ssl.SSLCertVerificationError as exc:
        raise ImapError(f"the certificate of {where} is not trusted ({exc.verify_message}); "
                        "give its CA with --cafile FILE") from None
    except imapclient.exceptions.LoginError:
        raise ImapError(f"login to {where} as {s.user} failed: wrong user or password") from None
    except (OSError, imapclient.exceptions.IMAPClientError) as exc:
        raise ImapError(f"cannot connect to {where}: {exc}") from None
    return client


def _login(client, s: Settings):
    """LOGIN, or AUTHENTICATE PLAIN for a non-ASCII password (LOGIN's strings are ASCII,
    PLAIN's UTF-8). An encoding error names neither a character nor its position."""
    secret = password(s)
    try:
        if secret.isascii() and s.user.isascii():
            client.login(s.user, secret)
        else:
            client.plain_login(s.user, secret)
    except UnicodeError:
        raise ImapError(f"the server at {s.host} cannot take the user name or password: they have "
                        "characters it does not accept") from None


def cap_literals(client, limit=MAX_MESSAGE):
    """Refuse a literal (``{N}`` then N bytes) over ``limit`` bytes, and more than
    ``limit`` bytes of literals in the answer to one command, before reading them:
    imaplib allocates a literal whole, so ``{100000000000}`` ended the run with a
    MemoryError, and a 2 GB body under a small RFC822.SIZE took 2 GB. The refusal is
    a dropped connection (``IMAP4.abort``): a one-line error, and ``--watch`` reconnects."""
    import imaplib

    imap = client._imap  # imapclient's imaplib connection: the one place literals are read
    read, send = imap.read, imap.send
    left = [limit]

    def bounded_read(size):
        if size > left[0]:
            raise imaplib.IMAP4.abort(f"the server sent a literal of {size} bytes, over the {limit}-byte limit")
        left[0] -= size
        return read(size)

    def send_command(data):
        left[0] = limit  # a new command: a new allowance for its answer
        return send(data)

    imap.read, imap.send = bounded_read, send_command


def require_imapclient():
    try:
        import imapclient
    except ImportError:
        raise ImapError("spamnb imap needs the imapclient package: pip install 'spamnb[imap]'") from None
    return imapclient


def connection_errors():
    """The exceptions a dropped or failing IMAP connection raises."""
    import imaplib

    imapclient = require_imapclient()
    return (OSError, imaplib.IMAP4.abort, imaplib.IMAP4.error, imapclient.exceptions.IMAPClientError)


# -- reading ------------------------------------------------------------------------------


def uids_after(client, last: int) -> list[int]:
    """The UIDs above ``last`` in the selected folder (``N:*`` always names the
    highest UID, even one below N: those are dropped)."""
    return sorted(u for u in client.search(["UID", f"{last + 1}:*"]) if u > last)


def fetch_raw(client, uids, *, budget=FETCH_BYTES, too_large=None, flags=None):
    """``(uid, raw bytes)`` of ``uids`` in the selected folder, without setting
    ``\\Seen`` (``BODY.PEEK[]``): sizes first (``RFC822.SIZE``, :data:`BATCH` per
    round trip), then bodies in round trips of at most :data:`BATCH` messages and
    ``budget`` bytes, so a folder of large attachments never holds more than that
    in memory. A message over :data:`MAX_MESSAGE` is not fetched: ``too_large(uid,
    size)`` is told and it stays where it is. Messages expunged meanwhile are skipped.
    ``flags``, a dict: filled with each message's flags (lower-cased), fetched with
    the sizes, in the same round trip."""
    items = [b"RFC822.SIZE", b"FLAGS"] if flags is not None else [b"RFC822.SIZE"]
    for i in range(0, len(uids), BATCH):
        sizes = client.fetch(uids[i:i + BATCH], items)
        group, group_bytes = [], 0
        for uid in uids[i:i + BATCH]:
            size = sizes.get(uid, {}).get(b"RFC822.SIZE")
            if size is None:
                continue  # expunged meanwhile
            if flags is not None:
                flags[uid] = {bytes(f).lower() for f in sizes[uid].get(b"FLAGS", ())}
            if size > MAX_MESSAGE:
                if too_large:
                    too_large(uid, size)
                continue
            if group and group_bytes + size > budget:
                yield from _bodies(client, group)
                group, group_bytes = [], 0
            group.append(uid)
            group_bytes += size
        if group:
            yield from _bodies(client, group)


def _bodies(client, uids):
    got = client.fetch(uids, [b"BODY.PEEK[]"])
    for uid in uids:
        if uid in got and b"BODY[]" in got[uid]:
            yield uid, got[uid][b"BODY[]"]


def training_items(client, folders, progress=None):
    """``(source, raw, label)`` of every message of ``folders`` (``(name, label)``
    pairs), each folder opened read-only; ``progress(folder, done, total)``."""
    for name, label in folders:
        try:
            client.select_folder(name, readonly=True)
        except connection_errors() as exc:
            raise ImapError(f"cannot open folder {name!r}: {exc}") from None
        uids = sorted(client.search("ALL"))
        for n, (uid, raw) in enumerate(fetch_raw(client, uids), 1):
            if progress:
                progress(name, n, len(uids))
            yield f"imap:{name}/{uid}", raw, label


# -- state --------------------------------------------------------------------------------


class State:
    """What spamnb knows of an account between passes (see the module doc)."""

    def __init__(self, path, data=None):
        self.path = os.fspath(path)
        self.data = data or {"version": STATE_VERSION, "accounts": {}}

    @classmethod
    def load(cls, path) -> "State":
        """The state at ``path``, trusted as a model is (:func:`spamnb.storage.store.read_state`):
        a state another user planted could say a message was half-moved to Junk, and the
        next pass would delete the folder's copy."""
        from spamnb.storage.store import ModelError, read_state

        try:
            data = read_state(path, "IMAP state", lambda d: isinstance(d, dict) and d.get("version") == STATE_VERSION)
        except ModelError as exc:
            raise ImapError(str(exc)) from None
        return cls(path, data)

    def save(self) -> None:
        from spamnb.storage.store import write_state

        try:
            write_state(self.path, self.data)
        except OSError as exc:
            raise StateError(f"cannot save the IMAP state {self.path}: {exc.strerror or exc} (the pass "
                             "stopped there; the next one redoes what was not recorded)") from None

    def account(self, name) -> dict:
        return self.data["accounts"].setdefault(name, {"folders": {}, "messages": {}})


def state_path(model_path) -> str:
    return os.fspath(model_path) + ".imap.json"


# -- one pass -------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What a pass did (or, with dry_run, would do)."""

    classified: dict = field(default_factory=lambda: {"spam": 0, "ham": 0, "unsure": 0})
    learned: MovesLearned = field(default_factory=MovesLearned)
    own: int = 0  # verdicts learned (filter -u's rule)
    moved: int = 0
    failed: int = 0  # messages the model could not judge: left where they were

    def summary(self) -> str:
        c, l_ = self.classified, self.learned
        left = (f", left {self.failed} unfiltered where they are (tried again at the next pass)"
                if self.failed else "")
        return (f"classified {sum(c.values())} ({c['spam']} spam, {c['ham']} ham, {c['unsure']} unsure), "
                f"moved {self.moved}, learned {self.own} of its verdicts, {l_.said()}{left}")


class Filter:
    """One account's filtering and learning (a pass: :meth:`run`).

    ``judge(raw) -> (label, p, learn)`` classifies, and says whether the verdict
    is to be learned (``filter -u``'s rule); ``learn([(raw, label)])`` learns
    (moving a message learned as the other class, as ``spamnb learn``);
    ``say(line)`` reports each action.
    """

    def __init__(self, client, settings: Settings, state: State, judge, learn, say, *, dry_run=False,
                 unscanned=None, recorder=None):
        self.client = client
        self.s = settings
        self.state = state
        self.acct = state.account(settings.account())
        self.msgs = self.acct["messages"]
        self.judge = judge
        self.learn = learn
        self.say = say
        #: ``unscanned(size)``: a message left where it is unjudged, too large to fetch (its log line)
        self.unscanned = unscanned
        #: where a message that could not be judged gets its error line
        self.recorder = recorder
        self.dry_run = dry_run
        self.out = Outcome()
        caps = {c.upper() for c in client.capabilities()}
        self.can_move = b"MOVE" in caps
        self.can_uid_expunge = b"UIDPLUS" in caps

    # -- folders ---------------------------------------------------------

    def junk_folder(self) -> str:
        if self.s.junk:
            name = self.s.junk
        else:
            name = self.client.find_special_folder(b"\\Junk") or "Junk"  # RFC 6154 special use
        self._ensure(name)
        return name

    def _ensure(self, name):
        if not self.client.folder_exists(name):
            self.say(f"creating folder {name}")
            if not self.dry_run:
                self.client.create_folder(name)

    def _select(self, name, role):
        """Select ``name``; ``(folder state, first)``: first is True the first time
        this folder is seen, and after its UIDVALIDITY changed (a re-scan)."""
        info = self.client.select_folder(name, readonly=self.dry_run)
        try:
            uv = int(info[b"UIDVALIDITY"])
        except (KeyError, TypeError, ValueError):
            uv = 0
        if uv <= 0:
            raise BadReply(f"the server opened folder {name!r} without a valid UIDVALIDITY, which spamnb "
                           "needs to know a message again: nothing done in it")
        f = self.acct["folders"].setdefault(role, {})
        first = f.get("uidvalidity") != uv
        if first:
            if f.get("uidvalidity") is not None:
                self.say(f"{name}: UIDVALIDITY changed ({f['uidvalidity']} -> {uv}): reading it again")
            f.update(uidvalidity=uv, last_uid=0, name=name)
        return f, first

    # -- the pass -----------------------------------------------------------

    def run(self) -> Outcome:
        junk = self.junk_folder()
        if self.s.unsure_folder:
            self._ensure(self.s.unsure_folder)
        if not (self.dry_run and not self.client.folder_exists(junk)):
            self.scan_junk(junk)
        self.scan_folder(junk)
        if not self.dry_run:
            self.state.save()
        return self.out

    def scan_junk(self, junk):
        """Arrivals in Junk: spamnb's own moves (confirmed), else the user's (learned as spam)."""
        f, _ = self._select(junk, JUNK)
        baseline = f.get("scanned") is None  # Junk's content before spamnb's first pass: the user's past
        uids = uids_after(self.client, f["last_uid"])
        for start in range(0, len(uids), BATCH):
            batch = uids[start:start + BATCH]
            learn, flag, flags = [], [], {}
            for uid, raw in fetch_raw(self.client, batch, too_large=self._too_large(junk), flags=flags):
                key = message_key(raw).hex()
                rec = self.msgs.get(key)
                if rec is not None and rec.get("where") == JUNK:
                    if rec.get("pending"):
                        rec["copied"] = True  # spamnb's move, maybe half done: see _finish_pending
                    rec["uid"] = uid
                elif baseline or (rec is not None and rec.get("learned") == "spam"):
                    self.msgs[key] = {**(rec or {}), "where": JUNK, "uid": uid}  # the user's past, or learned
                elif rec is None and verdict.filed_as(raw) == "spam":
                    # filed by spamnb at delivery (procmail, maildrop, Sieve on its X-Spam-Flag): its
                    # own verdict, which `filter -u` learned there if at all; the user's move back is
                    # the correction (scan_folder), as for a message this filter filed itself
                    self.say(f"{junk} {uid}: filed there by spamnb at delivery: not a correction: "
                             f"{subject_line(raw)}")
                    flag.append(uid)
                    self.msgs[key] = {"where": JUNK, "verdict": "spam", "uid": uid}
                else:  # the user put it there
                    self.say(f"{junk} {uid}: you moved it to {junk}: learning it as spam: {subject_line(raw)}")
                    learn.append((raw, "spam"))
                    flag.append(uid)
                    self.msgs[key] = {"where": JUNK, "learned": "spam", "uid": uid}
            self._learn(learn)
            self._keyword(flag, "spam", flags)
            f["last_uid"] = max(batch)
            self._save()
        f["scanned"] = True

    def scan_folder(self, junk):
        """The filtered folder: finish pending moves, take back the user's
        corrections, classify what is new."""
        name = self.s.folder
        f, first = self._select(name, INBOX)
        if not first:  # pending UIDs are this UIDVALIDITY's; after a change the re-scan finds the messages
            self._finish_pending(name, junk)
        uids = uids_after(self.client, f["last_uid"])
        unjudged = []  # UIDs the model could not judge: the next pass starts again at the first
        for start in range(0, len(uids), BATCH):
            batch = uids[start:start + BATCH]
            new, back, flags = [], [], {}
            for uid, raw in fetch_raw(self.client, batch, too_large=self._too_large(name, judged=True), flags=flags):
                key = message_key(raw).hex()
                rec = self.msgs.get(key)
                if rec is None:
                    self._judged(new, unjudged, name, uid, key, raw)
                elif rec.get("pending"):  # a move begun before the UIDVALIDITY changed
                    self._finish(uid, rec, junk, name)
                elif rec.get("where") in (JUNK, UNSURE):
                    back.append((uid, key, raw))  # spamnb filed it away; the user moved it back
            back, copies = self._moved_back(back, name, junk)
            for uid, key, raw in copies:  # a second copy of a message still in Junk: new mail, not a correction
                self._judged(new, unjudged, name, uid, key, raw)
            for uid, key, raw in back:
                self.say(f"{name} {uid}: you moved it back from "
                         f"{junk if self.msgs[key]['where'] == JUNK else self.s.unsure_folder}: "
                         f"learning it as ham: {subject_line(raw)}")
                self.msgs[key] = {"where": INBOX, "learned": "ham"}
            self._learn([(raw, "ham") for _, _, raw in back])
            self._keyword([uid for uid, _, _ in back], "ham", flags)
            self._file(name, junk, new, flags)
            f["last_uid"] = max(batch) if not unjudged else max(f["last_uid"], min(unjudged) - 1)
            self._save()
        if first:  # after a re-scan, no pending UID of the old UIDVALIDITY may name a message of the new
            for rec in self.msgs.values():
                rec.pop("pending", None)
                rec.pop("copied", None)

    def _judged(self, new, unjudged, name, uid, key, raw):
        """Judge ``raw`` into ``new``, behind the one failure boundary
        (:func:`spamnb.delivery.pipeline.boundary`): when anything fails (the model, its
        store, a bug), the message stays where it is, unflagged and unrecorded, its error
        line and one line here say why, and its UID goes to ``unjudged`` (the next pass
        judges it again)."""
        from spamnb.delivery import pipeline

        def left(reason, exc):
            self.say(f"{name} {uid}: not filtered, left where it is: {reason}: {subject_line(raw)}")
            self.out.failed += 1
            unjudged.append(uid)

        with pipeline.boundary("imap", left, recorder=self.recorder, facts={"raw": raw, "user": self.s.user}):
            new.append((uid, key, *self.judge(raw), raw))

    def _moved_back(self, found, name, junk):
        """``(back, copies)`` of messages found in the folder that spamnb had filed
        in Junk: moved back by the user, or another copy of one that is still
        there (the same message delivered twice), which Junk is asked about."""
        there = {uid for _, key, _ in found if (uid := self.msgs[key].get("uid")) is not None}
        if not there:
            return found, []
        self.client.select_folder(junk, readonly=True)
        still = set(self.client.search(["UID", ",".join(map(str, sorted(there))), "NOT", "DELETED"]))
        self.client.select_folder(name, readonly=self.dry_run)
        back = [item for item in found if self.msgs[item[1]].get("uid") not in still]
        return back, [item for item in found if item not in back]

    def _file(self, name, junk, new, flags):
        """Keyword every new message with its verdict, learn the verdicts ``judge``
        says to learn, move spam (and unsure) away (``flags``: each one's, as fetched)."""
        dest = {"spam": (JUNK, junk), "unsure": (UNSURE, self.s.unsure_folder)}
        moving, own = {}, []
        for uid, key, label, p, learns, raw in new:
            self.out.classified[label] += 1
            role, folder = dest.get(label, (None, None))
            where = f" -> {folder}" if folder else ""
            self.say(f"{name} {uid}: {label} (P(spam)={p:.4f}){where}{', learned' if learns else ''}: "
                     f"{subject_line(raw)}")
            rec = {"where": role if folder else INBOX, "verdict": label}
            if learns:
                own.append((raw, label))
                rec["learned"] = label
            if folder:
                rec["pending"] = uid
                moving.setdefault(folder, []).append(uid)
            self.msgs[key] = rec
        if own:
            self.out.own += len(own)
            if not self.dry_run:
                self.learn(own)
        for label in ("spam", "ham"):
            self._keyword([item[0] for item in new if item[2] == label], label, flags)
        self._save()  # the pending moves are on disk before any move starts
        for folder, uids in moving.items():
            self._move(uids, folder)
        for item in new:
            self.msgs[item[1]].pop("pending", None)

    def _finish_pending(self, name, junk):
        """Moves a pass began and did not confirm: done (the message left the
        folder, or is marked deleted there), half done (copied, not yet
        removed), or not done."""
        pending = {rec["pending"]: rec for rec in self.msgs.values() if rec.get("pending")}
        if not pending:
            return
        here = set(self.client.search(["UID", ",".join(map(str, pending)), "NOT", "DELETED"]))
        for uid, rec in pending.items():
            if uid in here:
                self._finish(uid, rec, junk, name)
            rec.pop("pending", None)
            rec.pop("copied", None)
        self._save()

    def _finish(self, uid, rec, junk, name):
        folder = junk if rec["where"] == JUNK else self.s.unsure_folder
        self.say(f"{name} {uid}: finishing its move to {folder}")
        if rec.get("copied"):
            self._remove([uid])
        else:
            self._move([uid], folder)
        rec.pop("pending", None)
        rec.pop("copied", None)

    def _too_large(self, folder, judged=False):
        def said(uid, size):
            self.say(f"{folder} {uid}: {size} bytes, over {MAX_MESSAGE}: left as it is")
            if judged and self.unscanned is not None:
                self.unscanned(size)
        return said

    # -- actions (nothing with dry_run) -------------------------------------------

    def _learn(self, items):
        """Learn the user's moves, counting by class those that changed the model (a dry run:
        all it would learn), and apart those learned so already."""
        if not items:
            return
        outcomes = None if self.dry_run else self.learn(items)
        self.out.learned.count([label for _, label in items], outcomes or [LEARNED] * len(items))

    def _keyword(self, uids, label, flags):
        """Set the label's keyword on ``uids``; take the other label's off the ones
        that carry it (``flags``, as fetched: one STORE, not two, for new mail)."""
        if not uids or self.dry_run:
            return
        other = KEYWORDS["ham" if label == "spam" else "spam"]
        stale = [uid for uid in uids if other.lower() in flags.get(uid, ())]
        if stale:
            self.client.remove_flags(stale, [other], silent=True)
        self.client.add_flags(uids, [KEYWORDS[label]], silent=True)

    def _move(self, uids, folder):
        self.out.moved += len(uids)
        if self.dry_run:
            return
        if self.can_move:
            self.client.move(uids, folder)
            return
        self.client.copy(uids, folder)
        self._remove(uids)

    def _remove(self, uids):
        """Remove ``uids`` (copied elsewhere already) from the selected folder: only
        them (UID EXPUNGE); without UIDPLUS they stay marked \\Deleted."""
        self.client.add_flags(uids, [b"\\Deleted"], silent=True)
        if self.can_uid_expunge:
            self.client.uid_expunge(uids)

    def _save(self):
        if not self.dry_run:
            self.state.save()


def subject_line(raw: bytes) -> str:
    """The message's Subject for a report line (``imap filter``'s, ``learn-moves``'): as the
    history and the page show it (:func:`spamnb.storage.history.fields`), shortened."""
    from spamnb.mail.mime import clipped
    from spamnb.storage import history

    return clipped(history.fields(raw, want=("subject",))["subject"], 70) or "(no subject)"


# -- watching ----------------------------------------------------------------------------------


def watch(open_client, one_pass, say, *, interval=300.0, stop=None, sleep=time.sleep, max_backoff=300.0):
    """Passes until ``stop()``: after each, ``IDLE`` on the selected folder until
    something happens or ``interval`` seconds pass (polling instead when the
    server has no IDLE); a dropped connection is reopened after 1, 2, 4 ... up
    to ``max_backoff`` seconds."""
    stop = stop or (lambda: False)
    errors = connection_errors() + (ImapError,)
    backoff = 1.0
    while not stop():
        client = None
        try:
            client = open_client()
            backoff = 1.0
            while not stop():
                one_pass(client)
                _wait(client, interval, stop, sleep)
        except errors as exc:
            if stop():
                break
            say(f"connection lost ({exc}); trying again in {backoff:.0f} s")
            sleep(backoff)
            backoff = min(backoff * 2, max_backoff)
        finally:
            if client is not None:
                try:
                    client.logout()
                except Exception:  # noqa: BLE001 - a dead connection cannot log out
                    pass


def _wait(client, interval, stop, sleep):
    """Until the selected folder changes or ``interval`` passes (checking ``stop`` each second)."""
    deadline = time.monotonic() + interval
    if not client.has_capability("IDLE"):
        while not stop() and time.monotonic() < deadline:
            sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        return
    client.idle()
    try:
        while not stop() and time.monotonic() < deadline:
            if client.idle_check(timeout=min(1.0, max(0.01, deadline - time.monotonic()))):
                break
    finally:
        client.idle_done()
