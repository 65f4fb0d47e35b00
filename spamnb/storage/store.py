"""Safe persistence of model files.

What is *in* a model is not this module's business: it stores any picklable
object with joblib.  Its business is that a model file is

* never half-written: :func:`save_atomic` writes a temporary file in the same
  folder, syncs it to disk and renames it over the old one, so a crash at any
  moment leaves either the old model or the new one, never a mixture;
* never loaded from a place someone else can write: loading runs pickle, and
  unpickling attacker-controlled bytes is arbitrary code execution, so
  :func:`load_checked` refuses files (and folders) that another user could
  have changed;
* never updated by two writers at once: :func:`model_lock` serialises
  read-modify-write cycles (incremental training) between processes.

Trust policy (:func:`load_checked`)
-----------------------------------
A model file is trusted when it is a regular file, owned by the current
effective user or by root, and not group- or world-writable; and its folder
is owned by the current user or root and not group- or world-writable unless
the sticky bit is set (as on ``/tmp``, where others cannot rename over our
files).  Root-owned files are accepted for every user because root can
already run code as anyone; root itself therefore loads only root-owned
files.  An administrator who knows better can pass ``allow_insecure=True``
(the CLI's ``--allow-insecure-model``), which skips the owner and permission
checks (a non-regular file is still refused).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["ModelError", "save_atomic", "load_checked", "model_lock"]

# New model files: read-write for the owner only.
_NEW_FILE_MODE = 0o600
# Folders created for a model (e.g. ~/.local/share/spamnb).
_NEW_DIR_MODE = 0o700
# Modes a trusted file may not have: writable by group or others.
_UNSAFE_WRITE = stat.S_IWGRP | stat.S_IWOTH


class ModelError(Exception):
    """A model file cannot be saved, trusted or read; the message says why and what to do."""


class LockTimeout(ModelError):
    """Another process held the model's lock longer than we may wait: try again later."""


# -- saving ------------------------------------------------------------------


def save_atomic(obj, path, *, compress=0) -> None:
    """Write `obj` to `path` with joblib, atomically.

    Parameters
    ----------
    obj : object
        Anything picklable.
    path : str or path-like
        Destination.  Missing parent folders are created (mode 0o700).
    compress : int, bool, str or tuple, default 0
        Passed to :func:`joblib.dump`.

    Notes
    -----
    The new file gets mode 0o600, or, when replacing a model, the old file's
    mode without group/world write bits.  Steps: ``mkstemp`` in the target
    folder, ``joblib.dump``, flush, ``fsync``, ``os.replace``, ``fsync`` of the
    folder.  If the process is killed part-way a stray ``.NAME.*.tmp`` file may
    remain beside the model; the model itself is the old one, intact.

    Raises
    ------
    ModelError
        On any failure (unpicklable object, full disk, no permission...); the
        temporary file is removed and the previous model is left untouched.
    """
    import joblib

    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    try:
        make_private_folder(folder)
        import tempfile  # here, not at import: the filter's fast path imports this module

        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    except OSError as exc:
        raise ModelError(f"cannot save model to {path}: {_describe(exc)}") from exc
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), _mode_for(path))
            joblib.dump(obj, f, compress=compress)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        _remove_quietly(tmp)
        if isinstance(exc, Exception):
            raise ModelError(f"cannot save model to {path}: {_describe(exc)}") from exc
        raise  # KeyboardInterrupt, SystemExit: cleaned up, now propagate
    fsync_folder(folder)


def write_bytes_atomic(path, parts, *, mode=_NEW_FILE_MODE) -> None:
    """Write the byte strings ``parts`` to ``path`` atomically: a temporary file in
    the same folder (``mode``, 0600 unless told), synced, renamed into place, the
    folder synced. OSError passes through, the temporary file removed (the compiled
    scorer, the journal's new copy: :func:`companion_mode`)."""
    import tempfile

    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            for part in parts:
                f.write(part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _remove_quietly(tmp)
        raise
    fsync_folder(folder)


def read_state(path, what: str, well_formed) -> object:
    """The JSON a state file beside a model holds (``imap filter``'s, ``learn-moves``'),
    None when there is none. Read through :func:`open_trusted` (a state another user
    planted decides what is moved or learned); ModelError in one line when it is not to
    be trusted, cannot be read, or is damaged or another version's (``well_formed(data)``
    is false): nothing is then to be done with it."""
    import json

    try:
        fd, _ = open_trusted(path, what=what)
        with os.fdopen(fd, "rb") as f:
            data = json.loads(f.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read the {what} {path}: {exc} (move it away to start afresh)") from None
    if not well_formed(data):
        raise ModelError(f"the {what} {path} is damaged or not one this version reads (move it away to "
                         "start afresh)")
    return data


def write_state(path, data) -> None:
    """Replace the state file at ``path`` with ``data`` as JSON, atomically (mode 0600)."""
    import json

    write_bytes_atomic(path, [json.dumps(data, sort_keys=True).encode()])


def make_private_folder(folder) -> None:
    """Create ``folder`` and any missing parent, each mode 0o700 whatever the umask
    (``os.makedirs`` gives the parents 0o777 minus the umask: 0o775 under umask
    002, a folder every later load then refuses)."""
    folder = os.path.abspath(os.fspath(folder))
    missing = []
    while not os.path.isdir(folder):
        missing.append(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    for name in reversed(missing):
        try:
            os.mkdir(name, _NEW_DIR_MODE)
        except FileExistsError:
            continue  # made meanwhile by a racing process, or a file: the next step says
        os.chmod(name, _NEW_DIR_MODE)  # the umask may have taken bits the mode asked for


def companion_mode(model_path) -> int:
    """The mode of a file every reader of the model reads too (its scorer, its journal):
    the model's, without group/world write bits, read-write for the owner; 0600 when
    there is no model. A site model root made 0644 is read by every user: a journal
    made 0600 beside it sent every one of their deliveries through unfiltered."""
    try:
        return stat.S_IMODE(os.stat(model_path).st_mode) & 0o644 | 0o600
    except OSError:
        return _NEW_FILE_MODE


def _mode_for(path: str) -> int:
    """Keep an existing model's permissions (minus go-w), else 0o600."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode) & ~_UNSAFE_WRITE
    except OSError:
        return _NEW_FILE_MODE


def fsync_folder(folder: str) -> None:
    # Makes the rename itself durable; some file systems cannot sync folders.
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# -- loading -----------------------------------------------------------------


def load_checked(path, *, allow_insecure: bool = False) -> object:
    """Load a model written by :func:`save_atomic`, after checking it can be trusted.

    Parameters
    ----------
    path : str or path-like
    allow_insecure : bool, default False
        Skip the owner and permission checks (see the module docstring).

    Raises
    ------
    ModelError
        Missing or unreadable file, not a regular file, untrusted owner or
        permissions, or contents that do not unpickle (corrupt, truncated,
        written by an incompatible version).
    """
    import joblib

    path = os.fspath(path)
    try:
        fd, _ = open_trusted(path, allow_insecure=allow_insecure)
    except FileNotFoundError:
        raise ModelError(f"no model at {path}") from None
    except OSError as exc:
        raise ModelError(f"cannot read model {path}: {_describe(exc)}") from exc
    with os.fdopen(fd, "rb") as f:
        try:
            return joblib.load(f)
        except (ImportError, AttributeError) as exc:  # ModuleNotFoundError is an ImportError
            raise ModelError(
                f"model file {path} was written by an incompatible version of spamnb or its "
                f"libraries ({_describe(exc)}); train a new model") from exc
        except Exception as exc:  # EOFError, UnpicklingError, ValueError, KeyError, zlib.error...
            # What the unpickler tripped over (IndexError, KeyError: 24...) means nothing to a user.
            raise ModelError(f"{path} is not a spamnb model file, or it is corrupt or truncated "
                             f"(it cannot be read as one); train a model with `spamnb train`") from exc


def open_trusted(path, *, allow_insecure: bool = False, what: str = "model",
                 flags: int = os.O_RDONLY) -> tuple[int, os.stat_result]:
    """Open a file spamnb will load (a model, its scorer, its journal): ``(fd, fstat)``;
    ``flags``: how (read-only unless told).

    Refuses (ModelError) a file another user could have planted or changed:

    * every symbolic link on the way (in the name given, and in what each link
      points to) must be owned by us or root and sit in a folder nobody else
      can change (a sticky one such as ``/tmp`` is fine): a link another user
      planted in ``/tmp`` could point us at a pickle of our own, a saved
      attachment, and we would run it;
    * the file is then opened at the path the links resolve to, without
      following a link (``O_NOFOLLOW``), and checked on the open descriptor:
      the file checked is the file read, whatever is swapped meanwhile;
    * it must be a regular file (``O_NONBLOCK``: a FIFO planted there cannot
      hang us), and pass :func:`trust_problem`, which looks at the folder it
      really sits in, not the folder of a link to it.

    ``allow_insecure`` skips the owner and permission checks (not the last
    two points). OSError (FileNotFoundError for a missing file) passes through.
    """
    path = os.fspath(path)
    real = resolve_links(path, None if allow_insecure else what)
    fd = os.open(real, flags | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ModelError(f"{what} {path} is not a regular file")
        if not allow_insecure:
            problem = trust_problem(real, st, what)
            if problem is not None:
                raise ModelError(problem)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def resolve_links(path: str, what: str | None, *, seen: list | None = None, verb: str = "load", enter=None,
                  strict: bool = False) -> str:
    """``path`` with every symbolic link resolved, each checked when ``what`` names
    the file (see :func:`open_trusted`; ``verb``: what the refusal says we were to do
    with it); OSError ELOOP past 40 links. ``seen`` gets ``(path, lstat)`` of every
    folder and link looked at on the way, in order; ``enter(folder)`` is called before
    each name is looked up in a folder (it may raise). A name missing on the way ends
    the walk with the path as it would be (the open then says it is missing), or with
    ``strict`` is FileNotFoundError naming the first one missing."""
    # Not os.path.abspath: it folds "link/.." before the link is read.
    pending = [p for p in os.path.join(os.getcwd(), path).split("/") if p]
    current, hops = "/", 0
    while pending:
        name = pending.pop(0)
        if name == ".":
            continue
        if enter is not None:
            enter(current)
        if name == "..":
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, name)
        try:
            st = os.lstat(candidate)
        except FileNotFoundError:
            if strict:
                raise
            return os.path.join(candidate, *pending)  # the open says it is missing
        if seen is not None:
            seen.append((candidate, st))
        if not stat.S_ISLNK(st.st_mode):
            current = candidate
            continue
        hops += 1
        if hops > 40:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
        if what is not None:
            problem = _link_problem(path, candidate, st, what, verb)
            if problem is not None:
                raise ModelError(problem)
        target = os.readlink(candidate)
        if target.startswith("/"):
            current = "/"
        pending = [p for p in target.split("/") if p] + pending
    return current


def _link_problem(path: str, link: str, st: os.stat_result, what: str, verb: str = "load") -> str | None:
    owners = _trusted_owners()
    if st.st_uid not in owners:
        return (f"refusing to {verb} {what} {path}: it is reached through the symbolic link {link}, "
                f"owned by uid {st.st_uid}, not by you or root, who could point it at any file; "
                f"remove the link and give the real path")
    folder = os.path.dirname(link)
    dst = os.stat(folder)
    if dst.st_uid not in owners or dst.st_mode & _UNSAFE_WRITE and not dst.st_mode & stat.S_ISVTX:
        return (f"refusing to {verb} {what} {path}: it is reached through the symbolic link {link}, "
                f"in a folder others can change ({folder}), who could point it at any file; "
                f"give the real path")
    return None


def _trusted_owners() -> set[int]:
    return {os.geteuid(), 0}


def owner_problem(name: str, st: os.stat_result, *, above: bool = False) -> str | None:
    """Why someone other than us or root could change ``name`` (its ``lstat``), or None:
    it must be ours or root's and writable by nobody else. ``above``: a folder above
    what is used, which others may write to when it is sticky (as ``/tmp``: they can
    add names there, never replace ours)."""
    if st.st_uid not in _trusted_owners():
        return f"{name} is owned by uid {st.st_uid}, not by you (uid {os.geteuid()}) or root, who could replace it"
    if stat.S_ISLNK(st.st_mode) or not st.st_mode & _UNSAFE_WRITE:
        return None
    if above and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX:
        return None
    return (f"{name} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}), who could "
            f"replace what is there: chmod go-w {name}")


def trusted_path(path, what: str, why: str) -> str:
    """The real path of ``path`` (which must exist) once nobody but us and root can change
    what it names: it, every folder above it (:func:`owner_problem`) and every symbolic
    link on the way (:func:`open_trusted`'s rule). ValueError otherwise, one line that
    names the path, ``what`` it is, what is wrong and ``why`` it matters."""
    path = os.fspath(path)
    seen = [("/", os.lstat("/"))]
    try:
        real = resolve_links(path, what, seen=seen, verb="use")
        os.lstat(real)
    except ModelError as exc:
        raise ValueError(f"{exc}: {why}") from None
    except OSError as exc:
        raise ValueError(f"cannot use {what} {path}: {_describe(exc)}") from None
    for name, st in seen:
        problem = owner_problem(name, st, above=name != real)
        if problem:
            raise ValueError(f"refusing to use {what} {path}: {problem}; {why}")
    return real


def open_trusted_folder(path, what: str, why: str, mode: int = 0o755) -> tuple[int, str]:
    """``(fd, real path)`` of the folder ``path``, made (``mode``, whatever the umask) where
    it is missing, once it and every folder above it are ours or root's and writable by
    nobody else (:func:`trusted_path`'s rule). Each folder is opened from the one above
    without following a link and checked on its descriptor, a folder made here too: what
    is checked is what the descriptor names, whatever is swapped meanwhile. ValueError,
    one line, otherwise."""
    path = os.fspath(path)
    try:
        real = resolve_links(path, what, verb="use")
    except ModelError as exc:
        raise ValueError(f"{exc}: {why}") from None
    except OSError as exc:
        raise ValueError(f"cannot use {what} {path}: {_describe(exc)}") from None
    names = [n for n in real.split("/") if n]
    if any(n in (".", "..") for n in names):
        raise ValueError(f"cannot use {what} {path}: give a path without . or .. in its missing part")
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    fd, here = os.open("/", flags), "/"
    try:
        for i, name in enumerate(names + [None]):
            problem = owner_problem(here, os.fstat(fd), above=name is not None)
            if problem:
                raise ValueError(f"refusing to use {what} {path}: {problem}; {why}")
            if name is None:
                return fd, here
            try:
                child = os.open(name, flags, dir_fd=fd)
            except FileNotFoundError:
                try:
                    os.mkdir(name, mode, dir_fd=fd)
                except FileExistsError:
                    pass  # made meanwhile: opened and checked as any other
                child = os.open(name, flags, dir_fd=fd)
                made = os.fstat(child)
                if made.st_uid == os.geteuid() and stat.S_IMODE(made.st_mode) != mode:
                    os.fchmod(child, mode)  # the umask may have taken bits
            os.close(fd)
            fd, here = child, os.path.join(here, name)
    except OSError as exc:
        os.close(fd)
        raise ValueError(f"cannot use {what} {path}: {here}/{name}: {_describe(exc)}") from None
    except BaseException:
        os.close(fd)
        raise


def planted_by(path, *, lock: bool = False) -> int | None:
    """The uid of another user who owns the file at ``path`` (not us, nor root unless
    ``lock``: a lock must be ours), or None (ours, root's, or nothing there). Such a
    file beside a model was made by someone who can write to the model's folder (a
    sticky one such as /tmp lets everyone create files there)."""
    try:
        uid = os.lstat(path).st_uid
    except OSError:
        return None
    if not hasattr(os, "geteuid"):
        return None
    return None if uid in ({os.geteuid()} if lock else _trusted_owners()) else uid


def planted_message(path, uid: int, what: str, consequence: str) -> str:
    """What to tell about a companion file another user made (:func:`planted_by`)."""
    folder = os.path.dirname(os.path.abspath(path))
    return (f"{what} {path} belongs to uid {uid}, not to you: another user made it in {folder}, "
            f"which others can write to; {consequence}; remove it, or keep the model in a folder "
            f"only you can write to")


#: What a planted file of each kind could do: why another user's is refused.
_RISK = {
    "journal": "its records change the model's counts",
    "IMAP state": "it decides which messages are moved or deleted",
    "moves state": "it decides which messages are learned as spam or ham",
}


def trust_problem(path: str, st: os.stat_result, what: str = "model") -> str | None:
    """Why a model file must not be loaded (someone other than us or root can change it), or None.

    ``path`` is the file's real path (no link in it): the folder checked is the one
    the file sits in. The one definition of the rule: :func:`open_trusted` applies it
    to every model and scorer that is loaded.
    """
    if not hasattr(os, "geteuid"):  # no POSIX owners to check
        return None
    override = "or pass --allow-insecure-model (allow_insecure=True) if you trust it"
    risk = _RISK.get(what, "loading a model runs code from it")
    owners = _trusted_owners()
    if st.st_uid not in owners:
        return (f"refusing to load {what} {path}: it is owned by uid {st.st_uid}, not by you "
                f"(uid {os.geteuid()}) or root, and {risk}; "
                f"copy it to a file you own, {override}")
    if st.st_mode & _UNSAFE_WRITE:
        return (f"refusing to load {what} {path}: it is writable by group or others "
                f"(mode {stat.S_IMODE(st.st_mode):04o}), and {risk}; "
                f"fix with `chmod go-w {path}`, {override}")
    folder = os.path.dirname(os.path.abspath(path))
    try:
        dst = os.stat(folder)
    except OSError as exc:
        return f"cannot check the folder of {what} {path}: {_describe(exc)}"
    if dst.st_uid not in owners:
        return (f"refusing to load {what} {path}: its folder {folder} is owned by uid {dst.st_uid}, "
                f"who could replace it; move it, {override}")
    if dst.st_mode & _UNSAFE_WRITE and not dst.st_mode & stat.S_ISVTX:
        return (f"refusing to load {what} {path}: its folder {folder} is writable by group or others "
                f"(mode {stat.S_IMODE(dst.st_mode):04o}), who could replace it; "
                f"fix with `chmod go-w {folder}`, {override}")
    return None


# -- locking -----------------------------------------------------------------

# How long a writer waits for the lock before it gives up with a clear error: far
# longer than any save takes, so only a stuck or hostile holder reaches it.
# $SPAMNB_LOCK_TIMEOUT (seconds) overrides it.
LOCK_TIMEOUT = 120.0


def lock_timeout(default: float = LOCK_TIMEOUT) -> float:
    """Seconds a writer waits for a model's lock: ``$SPAMNB_LOCK_TIMEOUT``, else ``default``."""
    try:
        value = float(os.environ.get("SPAMNB_LOCK_TIMEOUT") or default)
    except ValueError:
        return default
    return value if value >= 0 else default



def try_lock(lock_path):
    """An exclusive ``flock`` on ``lock_path`` (made 0600) if free now: its open fd,
    held until closed; None when another process holds it. For a process that
    must run alone (``spamnb imap filter`` for one model's state). ModelError for
    another user's lock file (:func:`check_lock_owner`)."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        check_lock_owner(fd, lock_path)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_lock_owner(fd: int, lock_path: str) -> None:
    """ModelError when the open lock file ``fd`` is another user's: made in a shared
    folder before ours, it would let that user hold the lock, and so block every
    update, for ever."""
    owner = os.fstat(fd).st_uid
    if hasattr(os, "geteuid") and owner != os.geteuid():
        raise ModelError(f"lock file {lock_path} belongs to uid {owner}, not to you: "
                         f"another user can block every update; remove it")


@contextmanager
def model_lock(path, *, shared: bool = False, timeout: float | None = None) -> Iterator[str]:
    """Hold an advisory lock for the model at `path`.

    ``flock`` on a sibling file ``PATH.lock`` (created 0o600, never deleted:
    deleting a lock file races with processes waiting on it).  Writers take it
    exclusive and do their whole read-modify-write inside; readers need no
    lock for consistency (saves are atomic renames) but may take it shared to
    wait for a writer to finish.

    Parameters
    ----------
    path : str or path-like
        The model path (not the lock file's).
    shared : bool, default False
    timeout : float or None
        Seconds to wait (0 tries once); None: :func:`lock_timeout`.

    Yields
    ------
    str
        The lock file's path.

    Raises
    ------
    ModelError
        The lock file cannot be opened, belongs to another user, or the timeout expired.
    """
    path = os.fspath(path)
    lock_path = path + ".lock"
    folder = os.path.dirname(os.path.abspath(path))
    try:
        make_private_folder(folder)
        # O_NOFOLLOW: never create or lock through a symlink someone planted.
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0),
                     _NEW_FILE_MODE)
    except OSError as exc:
        raise ModelError(f"cannot open lock file {lock_path}: {_describe(exc)}") from exc
    try:
        check_lock_owner(fd, lock_path)
        _flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX,
               lock_timeout() if timeout is None else timeout, path)
        try:
            yield lock_path
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _flock(fd: int, operation: int, timeout: float, path: str) -> None:
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
            return
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ModelError(f"cannot lock model {path}: {_describe(exc)}") from exc
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise LockTimeout(
                f"timed out after {timeout:g}s waiting for the lock on model {path} "
                f"(another spamnb process is using it)")
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, 0.1)


# -- default location --------------------------------------------------------
