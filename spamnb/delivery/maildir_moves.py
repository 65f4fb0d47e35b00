"""``spamnb learn-moves``: learn from the moves a person makes in a local Maildir++.

Someone who reads mail with mutt (or any client on the Maildir itself) corrects
the filter by moving a message into or out of the Junk folder. Run from cron or
a systemd timer, this compares the Maildir with what the last run saw
(:class:`State`) and learns:

* a message that arrived in Junk from another folder as **spam** (``spamnb
  learn --spam``, which forgets it as ham if it was learned so);
* a message that left Junk (or the folder unsure mail is filed in) for a folder
  of kept mail as **ham** (which forgets it as spam). Out of Junk into a trash
  folder, another junk folder or the unsure folder (whatever its name) teaches
  nothing: deleting spam is no verdict on it, and filing it as unsure no decision
  (the folders' roles are setup's, :func:`spamnb.delivery.setup.role_of`);
* a move between two other folders, and a copy (the original is still where it
  was), teach nothing.

Messages are recognised across moves by their Maildir unique name (the part of
the file name before ``:2,``: a rename, as ``mv`` or a rename-based client
moves, keeps it) and, when a client writes a new file and removes the old one
(mutt's save), by their identity (:func:`spamnb.mail.identity.message_key`,
what ``spamnb learn`` recognises): the state keeps each message's key.

A message in Junk that no run has seen anywhere before (delivered and moved
between two runs) was put there by the user when it carries no spam verdict of
spamnb's (:func:`spamnb.verdict.filed_as`): the recipes file only spam there, so
mail delivered into Junk by them is spamnb's own verdict, not a correction.
A message seen in no folder before that turns up outside Junk teaches nothing:
mail that arrives there is new mail, whatever its header says.

The first run over a Maildir records it and learns nothing: what is in Junk
then is the person's past sorting, which ``spamnb setup`` (or ``train``) learns,
as ``spamnb imap filter`` takes a Junk folder's old content. Learning from
verdict headers that contradict their folder would learn young mail nobody has
looked at yet.

Memory is bounded whatever arrives: a message is read when it is needed and
dropped after it (never all of a run's at once), a message over
:data:`MAX_MESSAGE` (what the tokenizer reads, ``MAX_PARSE_BYTES``) is never
read at all (tracked by name only; a move of it is skipped with one line), and
the moves are learned in batches (:func:`batches`) of at most
:data:`BATCH_MESSAGES` messages and :data:`BATCH_BYTES` bytes.

The state (``MODEL.moves.json``, beside the user's model) is read as a model
is (:func:`spamnb.storage.store.open_trusted`: ours or root's, not writable by
others, in a folder only we can change) and written atomically after each batch
is learned, with what that batch settled (:func:`settle`): a run that dies
leaves what it learned recorded, and a failing learn is retried by the next run
(learning is idempotent by identity). A damaged or planted state is refused:
nothing learned, nothing written. This never moves, changes or deletes a message.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

from spamnb import verdict
from spamnb.delivery.fastlearn import read_regular
from spamnb.mail.identity import message_key
from spamnb.mail.mime import MAX_PARSE_BYTES

STATE_VERSION = 1
INBOX = "INBOX"  # the Maildir's own cur/ and new/
#: Messages larger than this (what the tokenizer reads of one) are never read: tracked by
#: name only, and a move of one is skipped with one line.
MAX_MESSAGE = MAX_PARSE_BYTES
#: A batch learned at once, the state saved after it: at most this many messages ...
BATCH_MESSAGES = 64
#: ... and this many bytes of mail (a message alone is a batch whatever its size).
BATCH_BYTES = 4 * MAX_MESSAGE


class MovesError(Exception):
    """What the user is told, in one line (no traceback)."""


def state_path(model_path) -> str:
    return os.fspath(model_path) + ".moves.json"


def unique_name(file_name: str) -> str:
    """The Maildir unique name: the file name without its info (``:2,FLAGS``), which a
    client changes when it sets a flag or moves the message from new/ to cur/."""
    return file_name.split(":", 1)[0]


def scan(maildir: str) -> tuple:
    """``({unique name: [(folder, path), ...]}, folders)``: every message in the Maildir++
    at ``maildir`` (its own ``cur/`` and ``new/``, folder ``INBOX``, and every ``.Folder``),
    and how many folders it has."""
    root = os.path.abspath(maildir)
    if not (os.path.isdir(os.path.join(root, "cur")) or os.path.isdir(os.path.join(root, "new"))):
        raise MovesError(f"{maildir} is not a Maildir: it has no cur/ or new/ folder")
    folders = [(INBOX, root)]
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if name.startswith(".") and name not in (".", "..") and os.path.isdir(path) and not os.path.islink(path):
            folders.append((name, path))
    found = {}
    for folder, path in folders:
        for sub in ("new", "cur"):
            try:
                names = os.listdir(os.path.join(path, sub))
            except FileNotFoundError:
                continue
            for name in names:
                file = os.path.join(path, sub, name)
                if name.startswith("."):
                    continue
                try:
                    if not stat.S_ISREG(os.lstat(file).st_mode):
                        continue
                except FileNotFoundError:  # moved or deleted while we list: the next run sees where
                    continue
                found.setdefault(unique_name(name), []).append((folder, file))
    return found, len(folders)


def _read(path):
    """The bytes of the message file at ``path``, or None (gone meanwhile, unreadable, too
    large): never more than :data:`MAX_MESSAGE` bytes are read."""
    return read_regular(path, MAX_MESSAGE)


def _why_not(path) -> str:
    """Why the message file at ``path`` cannot be read (:func:`_read` gave None)."""
    try:
        size = os.stat(path).st_size
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror or exc}"
    if size > MAX_MESSAGE:
        return f"{path} holds {size} bytes, over the {MAX_MESSAGE} spamnb reads of a message"
    return f"cannot read {path}"


# -- state ----------------------------------------------------------------------------------


class State:
    """What the last run saw, per Maildir: ``{unique name: [folders, key hex or None]}``."""

    def __init__(self, path, data=None):
        self.path = os.fspath(path)
        self.data = data or {"version": STATE_VERSION, "maildirs": {}}

    @classmethod
    def load(cls, path) -> "State":
        """The state at ``path`` (a fresh one when there is none), trusted as a model is
        (:func:`spamnb.storage.store.read_state`): one another user planted could make
        spamnb learn what they choose."""
        from spamnb.storage.store import ModelError, read_state

        try:
            return cls(path, read_state(path, "moves state", _well_formed))
        except ModelError as exc:
            raise MovesError(str(exc)) from None

    def save(self) -> None:
        from spamnb.storage.store import write_state

        try:
            write_state(self.path, self.data)
        except OSError as exc:
            raise MovesError(f"cannot save the moves state {self.path}: {exc.strerror or exc} (what was learned "
                             "stays learned; the next run finds the same moves and knows them)") from None

    def seen(self, maildir):
        return self.data["maildirs"].get(maildir)

    def record(self, maildir, messages):
        self.data["maildirs"][maildir] = messages


def _well_formed(data) -> bool:
    if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
        return False
    maildirs = data.get("maildirs")
    if not isinstance(maildirs, dict):
        return False
    for messages in maildirs.values():
        if not isinstance(messages, dict):
            return False
        for entry in messages.values():
            if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], list)
                    and all(isinstance(f, str) for f in entry[0])
                    and (entry[1] is None or isinstance(entry[1], str))):
                return False
    return True


# -- one run ----------------------------------------------------------------------------------


@dataclass
class Move:
    """A message to learn: its file, the label, why (for the run's line), its key (hex),
    and the state's entries learning it settles (``(name, name it replaces or None)``:
    every file of it that moved, and for a new file whose old one is gone, that old one)."""

    path: str
    label: str
    what: str
    key: str | None
    names: list = field(default_factory=list)


@dataclass
class Outcome:
    """What a run found: the moves to learn (:class:`Move`), those skipped (``(move, why)``:
    too large or unreadable, never read whole), and what it recorded."""

    learn: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    first: bool = False
    messages: int = 0
    folders: int = 0

    def count(self, label) -> int:
        return sum(1 for move in self.learn if move.label == label)


def compare(maildir: str, seen: dict | None, junk: str, role_of, unsure: str | None = None) -> tuple:
    """``(outcome, now)``: what moved since ``seen`` (the state's entry for this
    Maildir, None on a first run), and the entry to record; ``role_of(folder)``:
    ``spam``, ``ham`` or ``skip`` (setup's roles); ``unsure``: the folder unsure mail
    is filed in, out of which a move into kept mail is ham too. Each message is read
    at most once here, one at a time, and none is kept: the outcome names files."""
    found, n_folders = scan(maildir)
    out = Outcome(first=seen is None, messages=sum(len(v) for v in found.values()), folders=n_folders)
    seen = seen or {}
    now = {}
    for name, places in found.items():
        if name in seen and seen[name][1] is not None:
            key = seen[name][1]  # a Maildir file's content never changes: its key neither
        else:
            raw = _read(places[0][1])
            key = message_key(raw).hex() if raw is not None else None
            del raw
        now[name] = [sorted({f for f, _ in places}), key]
    if out.first:
        return out, now

    wanted = []  # (name, label, what, name it replaces)

    def moved(name, src, dst, gone=None):
        """Message ``name`` went from folder ``src`` to ``dst``: learned, or not."""
        if dst == junk and src != junk:
            wanted.append((name, "spam", f"moved from {src} to {dst}", gone))
        elif src in (junk, unsure) and dst not in (junk, unsure) and role_of(dst) == "ham":
            wanted.append((name, "ham", f"moved from {src} to {dst}", gone))

    gone_by_key = {}  # key -> (name, folders) of each message no longer there
    for name, (where, key) in seen.items():
        if name not in now and key is not None:
            gone_by_key.setdefault(key, []).append((name, where))
    present = {key for name, (_, key) in now.items() if name in seen and key is not None}
    for name, (where, key) in now.items():
        if name in seen:  # known by its unique name: renamed from one folder to another?
            before = set(seen[name][0])
            for dst in sorted(set(where) - before):  # none left (only added): a copy, linked
                for src in sorted(before - set(where)):
                    moved(name, src, dst)
        elif key is not None and gone_by_key.get(key):  # a new file, its old one gone: a move
            old, src = gone_by_key[key].pop(0)
            for dst in where:
                if dst not in src:
                    moved(name, src[0], dst, gone=old)
        elif key is not None and key in present:
            pass  # a copy of a message still where it was: no move
        elif junk in where:  # never seen before: delivered into Junk by a recipe, or moved there by the user
            raw = _read(found[name][0][1])
            if raw is None or verdict.filed_as(raw) != "spam":
                wanted.append((name, "spam", f"new in {junk} without spamnb's spam verdict: put there by you", None))
            del raw
    # one verdict per message: the same message reached twice (copies moved) is learned once,
    # and one moved both ways (a copy into Junk, another out of it) not at all
    labels = {}
    for name, label, _, _ in wanted:
        if now[name][1] is not None:
            labels.setdefault(now[name][1], set()).add(label)
    by_key = {}
    for name, label, what, gone in wanted:
        key = now[name][1]
        if key is None:  # too large (or unreadable) to know: never read whole, never learned
            move = Move(found[name][0][1], label, what, None, [(name, gone)])
            out.skipped.append((move, _why_not(move.path)))
        elif len(labels[key]) == 1:
            if key in by_key:
                by_key[key].names.append((name, gone))
            else:
                by_key[key] = Move(found[name][0][1], label, what, key, [(name, gone)])
                out.learn.append(by_key[key])
    return out, now


def batches(moves, *, messages=None, size=None):
    """The ``moves`` with their bytes, ``[(move, raw), ...]`` per batch: at most
    ``messages`` moves (:data:`BATCH_MESSAGES`) and ``size`` bytes (:data:`BATCH_BYTES`;
    a message alone is a batch whatever its size), each message read when its batch is.
    ``raw`` is None for one gone (or unreadable) since the comparison."""
    messages = messages or BATCH_MESSAGES
    size = size or BATCH_BYTES
    batch, held = [], 0
    for move in moves:
        raw = _read(move.path)
        n = len(raw) if raw is not None else 0
        if batch and (len(batch) >= messages or held + n > size):
            yield batch
            batch, held = [], 0
        batch.append((move, raw))
        held += n
    if batch:
        yield batch


def settle(entry: dict, now: dict, move: Move) -> None:
    """Record in ``entry`` (the state's entry of a Maildir, as the last save left it)
    that ``move`` is done: its files where they are ``now``, the files they replace gone."""
    for name, gone in move.names:
        entry[name] = now[name]
        if gone is not None:
            entry.pop(gone, None)


def unsettle(entry: dict, seen: dict, move: Move) -> None:
    """Leave ``move`` in ``entry`` (the entry a run records at its end) as the last run
    saw it, so that the next run finds it again: it was not learned."""
    for name, gone in move.names:
        if name in seen:
            entry[name] = seen[name]
        else:
            entry.pop(name, None)
        if gone is not None and gone in seen:
            entry[gone] = seen[gone]


# -- running it from a systemd timer -------------------------------------------------------------

SERVICE, TIMER = "spamnb-learn-moves.service", "spamnb-learn-moves.timer"


def units(spamnb: str, junk: str = ".Junk") -> dict:
    """``{file name: text}`` of the systemd user service and timer that run learn-moves over
    ~/Maildir every 10 minutes (contrib/systemd/user/ has them, with comments)."""
    option = "" if junk == ".Junk" else f" --junk {junk}"
    service = ("[Unit]\nDescription=spamnb: learn from your moves into and out of Junk (local Maildir)\n\n"
               f"[Service]\nType=oneshot\nExecStart={spamnb} learn-moves{option} %h/Maildir\nUMask=0077\n"
               "Nice=10\nIOSchedulingClass=idle\nNoNewPrivileges=yes\nRestrictAddressFamilies=AF_UNIX AF_INET AF_INET6\n"
               "RestrictNamespaces=yes\nRestrictRealtime=yes\nRestrictSUIDSGID=yes\nLockPersonality=yes\n"
               "SystemCallArchitectures=native\nSystemCallFilter=@system-service\n"
               "SystemCallFilter=~@privileged @resources\nSystemCallErrorNumber=EPERM\nMemoryMax=1G\n")
    timer = ("[Unit]\nDescription=spamnb: learn from your moves into and out of Junk every 10 minutes\n\n"
             "[Timer]\nOnCalendar=*:0/10\nPersistent=true\n\n[Install]\nWantedBy=timers.target\n")
    return {SERVICE: service, TIMER: timer}
