"""Filing messages out of a maildir by their classification (``spamnb sort``).

A move stays inside one maildir tree and is a hard link followed by an
unlink: the message is linked into the target folder and then unlinked from
the source (a link never overwrites an existing file, unlike rename), with the
same file name and the same ``cur/`` or ``new/`` sub-folder, as the maildir
specification requires for moves between folders. A crash between the two
steps leaves the message in both folders, never in neither.

Target folders are Maildir++ sub-folders: ``cur/``, ``new/``, ``tmp/`` and the
empty marker file ``maildirfolder`` that the Maildir++ specification puts in
every sub-folder (and that Courier's ``maildirmake -f`` writes).
"""

from __future__ import annotations

import errno
import os

from spamnb.model import BATCH, batches


# The Maildir++ marker of a sub-folder (an empty file; the inbox has none).
FOLDER_MARKER = "maildirfolder"


def ensure_maildir(path: str) -> None:
    """Create ``path`` with ``cur/``, ``new/`` and ``tmp/`` when missing (mode 0700)."""
    for sub in ("cur", "new", "tmp"):
        os.makedirs(os.path.join(path, sub), mode=0o700, exist_ok=True)


def ensure_folder(path: str) -> None:
    """Make ``path`` a Maildir++ sub-folder: a maildir with the empty
    ``maildirfolder`` marker (mode 0600, as ``maildirmake -f`` makes it).

    The marker is added to a folder that lacks it (one made by hand or by
    procmail) and an existing one is left alone. It is written after the
    three sub-folders, as ``maildirmake`` does.
    """
    ensure_maildir(path)
    try:
        os.close(os.open(os.path.join(path, FOLDER_MARKER), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass


def messages_of(maildir: str):
    """Paths of the messages in ``maildir``'s ``cur/`` and ``new/`` (not sub-folders)."""
    for sub in ("new", "cur"):
        folder = os.path.join(maildir, sub)
        if not os.path.isdir(folder):
            raise ValueError(f"{maildir} is not a maildir: it has no {sub}/ folder")
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            if not name.startswith(".") and os.path.isfile(path):
                yield sub, name, path


def plan_moves(model, maildir: str, folders: dict, cutoffs):
    """Yield ``(source, target, label)`` for each message whose label has a folder.

    ``folders`` maps a label ('spam', 'unsure', 'ham') to a Maildir++ folder name
    (``.Junk``) or None. Planning changes nothing on disk (``sort --dry-run``
    relies on that); :func:`move` creates the target folder.
    """
    for batch in batches(messages_of(maildir), BATCH):
        raws, kept = [], []
        for sub, name, path in batch:
            try:
                with open(path, "rb") as f:
                    raws.append(f.read())
                kept.append((sub, name, path))
            except OSError:
                continue  # vanished or unreadable: the mail client has it; leave it be
        for (sub, name, path), result in zip(kept, model.classify_many(raws, cutoffs=cutoffs)):
            folder = folders.get(result.label)
            if folder:
                yield path, os.path.join(maildir, folder, sub, name), result.label


class MoveSkipped(Exception):
    """One message was left where it was; the message says why (the run goes on)."""


def check_folder_name(name: str) -> str:
    """``name`` if it is a Maildir++ folder name (``.Junk``, ``.Lists.spam``): a dot,
    then a name with no ``/``; ValueError otherwise. Anything else could move mail
    out of the maildir (``../x``, an absolute path) or into its own cur/ or new/."""
    if not (name.startswith(".") and len(name) > 1 and "/" not in name and name not in (".", "..")
            and "\0" not in name):
        raise ValueError(f"{name!r} is not a Maildir++ folder name: give a dot and a name, "
                         f"like .Junk (no '/', and not '..')")
    return name


def move(source: str, target: str) -> bool:
    """Move one message file without ever overwriting, duplicating or losing it.

    ``target`` is ``FOLDER/cur/NAME`` or ``FOLDER/new/NAME``; FOLDER is made a
    Maildir++ sub-folder first (:func:`ensure_folder`) when it is not one yet.
    True if moved; False when the message went away meanwhile or the target
    exists (nothing changed). MoveSkipped when the move cannot be done here and
    the message stays where it is: a folder on another file system (no hard
    link across them), or the original renamed by a mail client between the
    link and the unlink (the link is undone, so the message is in one place).
    """
    ensure_folder(os.path.dirname(os.path.dirname(target)))
    try:
        os.link(source, target)  # fails if target exists: never overwrites
    except FileExistsError:
        return False
    except FileNotFoundError:
        return False  # the message went away meanwhile
    except OSError as exc:
        if exc.errno == errno.EXDEV:
            raise MoveSkipped(f"{target} is on another file system than {source}: not moved") from None
        raise MoveSkipped(f"cannot link {source} to {target}: {exc.strerror or exc}") from None
    try:
        os.unlink(source)
    except OSError as exc:
        # A mail client renamed it (new/X -> cur/X:2,S) or took it: the copy we
        # linked would duplicate it. Undo the link; the client's message stays.
        try:
            os.unlink(target)
        except OSError:
            pass
        raise MoveSkipped(f"{source} changed while it was moved ({exc.strerror or exc}): left where it is") from None
    return True
