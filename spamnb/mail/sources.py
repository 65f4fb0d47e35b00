"""Where messages come from: one iterator over every kind of mail store.

:func:`iter_messages` takes a *spec* (a path or ``-``), decides what it is
(:func:`detect_kind`) and yields :class:`Message` objects holding the raw bytes
of each message, untouched.  Supported kinds:

``stdin``    ``-``: one message read from standard input.
``maildir``  a directory with ``cur/`` and ``new/`` (``tmp/`` is never read:
             messages there are still being delivered).  Maildir++ sub-folders
             (``.Folder`` directories) only with ``recursive=True``.
``mh``       an MH folder (``.mh_sequences``, or only numeric file names),
             read with :class:`mailbox.MH`; sub-folders with ``recursive=True``.
``tree``     any other directory: every regular file below it, recursively.
``mbox``     a file whose first line starts with ``From `` (read with
             :class:`mailbox.mbox`; the ``From_`` line is not part of the message).
``archive``  ``.tar``, ``.tar.gz``/``.tgz``, ``.tar.bz2``/``.tbz2``,
             ``.tar.xz``/``.txz`` or ``.zip``: each regular member is a message.
``index``    a TREC index file: lines ``spam PATH`` / ``ham PATH``, paths
             relative to the index's folder.  Labels come from the index.
``file``     any other file: one message.

In directories and archives, hidden names (starting with ``.``) and files named
``index`` are not messages.  Order is deterministic: sorted names for
directories, file order for mboxes, member order for archives, line order for
indexes.

Errors: a problem with the spec itself (missing, unknown format, unreadable
archive or index, bad index line) raises :class:`SourceError`.  A problem with
one entry (permission denied, file vanished, corrupt member, index target
missing) is passed to ``on_error(source, exc)`` and the entry is skipped, so a
long run survives a bad message; with ``strict=True`` it raises
:class:`SourceError` instead.  Without an ``on_error`` callback skipped entries
are reported as :class:`SourceWarning` warnings, never silently.

This module uses the standard library only, so the delivery hook stays light.
"""

from __future__ import annotations

import mailbox
import os
import posixpath
import re
import stat
import sys
import tarfile
import tempfile
import warnings
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from spamnb.mail.mime import MAX_PARSE_BYTES, NotMailError, looks_like_mail
from spamnb.verdict import LABELS

__all__ = [
    "Message",
    "SourceError",
    "SourceWarning",
    "detect_kind",
    "mail_only",
    "iter_messages",
    "iter_index",
    "index_entries",
    "index_paths",
    "is_archive",
    "maildir_paths",
    "mh_paths",
    "tree_paths",
    "message_file",
    "sorted_listing",
    "reporter",
]


# The most of an archive member that is read (see _read_capped).
MAX_MEMBER_BYTES = MAX_PARSE_BYTES + 1

# Suffixes recognised as archives, longest first so ".tar.gz" wins over ".gz".
_TAR_SUFFIXES = (".tar.gz", ".tar.bz2", ".tar.xz", ".tgz", ".tbz2", ".txz", ".tar")
_ZIP_SUFFIXES = (".zip",)

# A TREC index line: a label, white space, a path (which may contain spaces).
_INDEX_LINE = re.compile(r"(ham|spam)\s+(\S.*)")

ErrorHandler = Callable[[str, Exception], None]


@dataclass(frozen=True)
class Message:
    """One message and where it came from.

    Attributes
    ----------
    source : str
        A path, ``ARCHIVE:MEMBER``, ``MBOX:#N`` (1-based), or ``-``.
    raw : bytes
        The message, bytes exactly as stored.
    label : {"ham", "spam", None}
    """

    source: str
    raw: bytes = field(repr=False)
    label: str | None = None


class SourceError(Exception):
    """A mail source cannot be read; the message names the path and the problem."""


class SourceWarning(UserWarning):
    """An entry of a mail source was skipped (no ``on_error`` callback given)."""


# -- detection ---------------------------------------------------------------


def is_archive(path) -> bool:
    """True if `path` has a tar or zip archive suffix."""
    name = os.fspath(path).lower()
    return name.endswith(_TAR_SUFFIXES + _ZIP_SUFFIXES)


def detect_kind(spec) -> str:
    """Classify a source spec.

    Returns
    -------
    {"stdin", "maildir", "mh", "tree", "mbox", "archive", "index", "file"}

    Raises
    ------
    SourceError
        If the path does not exist, cannot be inspected, or is neither a
        directory nor a regular file.
    """
    spec = os.fspath(spec)
    if spec == "-":
        return "stdin"
    try:
        st = os.stat(spec)
    except FileNotFoundError:
        raise SourceError(f"no such file or directory: {spec}") from None
    except OSError as exc:
        raise SourceError(f"cannot read {spec}: {exc.strerror or exc}") from exc
    if stat.S_ISDIR(st.st_mode):
        return _detect_dir_kind(spec)
    if not stat.S_ISREG(st.st_mode):
        raise SourceError(f"{spec} is neither a regular file nor a directory")
    if is_archive(spec):
        return "archive"
    head = _read_head(spec)
    if head.startswith(b"From "):
        return "mbox"
    if _looks_like_index(head):
        return "index"
    return "file"


def _detect_dir_kind(path: str) -> str:
    if os.path.isdir(os.path.join(path, "cur")) and os.path.isdir(os.path.join(path, "new")):
        return "maildir"
    if os.path.isfile(os.path.join(path, ".mh_sequences")):
        return "mh"
    try:
        names = [n for n in os.listdir(path) if not n.startswith(".")]
    except OSError as exc:
        raise SourceError(f"cannot list directory {path}: {exc.strerror or exc}") from exc
    files = [n for n in names if os.path.isfile(os.path.join(path, n))]
    # MH messages are files named 1, 2, 3...; any other file makes it a plain tree.
    if files and all(n.isdigit() for n in files):
        return "mh"
    return "tree"


def _read_head(path: str, size: int = 4096) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(size)
    except OSError as exc:
        raise SourceError(f"cannot read {path}: {exc.strerror or exc}") from exc


def _looks_like_index(head: bytes) -> bool:
    """The first meaningful line is ``ham PATH`` or ``spam PATH``.

    A mail message starts with a header (``Name: value``) or a ``From_`` line,
    neither of which matches, so this does not misclassify messages.
    """
    for line in head.split(b"\n"):
        line = line.strip()
        if not line or line.startswith(b"#"):
            continue
        return _INDEX_LINE.fullmatch(line.decode("utf-8", "surrogateescape")) is not None
    return False


# -- entry point -------------------------------------------------------------


def iter_messages(
    spec,
    *,
    label: str | None = None,
    recursive: bool = False,
    strict: bool = False,
    on_error: ErrorHandler | None = None,
    stdin=None,
) -> Iterator[Message]:
    """Yield the messages of `spec`, each tagged with `label`.

    Parameters
    ----------
    spec : str or path-like
        A path of any supported kind, or ``-`` for standard input.
    label : {"ham", "spam", None}
        Label given to every message.  An index file carries its own labels;
        passing a label for one is an error.
    recursive : bool
        Also read Maildir++ / MH sub-folders.  Plain trees are always recursive.
    strict : bool
        Raise :class:`SourceError` on the first unreadable entry instead of
        skipping it.
    on_error : callable(source, exc), optional
        Called for each skipped entry.  Default: a :class:`SourceWarning`.
    stdin : file object, optional
        Stand-in for ``sys.stdin`` (its ``.buffer`` is read if it has one).

    Raises
    ------
    SourceError
        Missing path, unknown format, unreadable container, bad index.
    """
    if label not in (None,) + LABELS:
        raise ValueError(f"label must be 'ham', 'spam' or None, not {label!r}")
    spec = os.fspath(spec)
    report = reporter(strict, on_error)
    kind = detect_kind(spec)
    if kind == "index":
        if label is not None:
            raise SourceError(f"{spec} is a labelled index file; do not give it a label too")
        return iter_index(spec, strict=strict, on_error=on_error)
    readers = {
        "stdin": lambda: _iter_stdin(stdin, label, report),
        "maildir": lambda: _iter_maildir(spec, label, recursive, report),
        "mh": lambda: _iter_mh(spec, label, recursive, report),
        "tree": lambda: _iter_tree(spec, label, report),
        "mbox": lambda: _iter_mbox(spec, label, report),
        "archive": lambda: _iter_archive(spec, label, report),
        "file": lambda: _iter_file(spec, label, report),
    }
    return readers[kind]()


def reporter(strict: bool = False, on_error: ErrorHandler | None = None) -> ErrorHandler:
    """The per-entry error policy as a ``report(source, exc)`` callable.

    With `strict` it raises :class:`SourceError`; else it calls `on_error`,
    or warns with a :class:`SourceWarning` when there is none.  Readers that
    take a ``report`` argument (:func:`message_file`, the listers) use it for
    every entry they skip.
    """

    def report(source: str, exc: Exception) -> None:
        if strict:
            raise SourceError(f"cannot read {source}: {_describe(exc)}") from exc
        if on_error is not None:
            on_error(source, exc)
        else:
            warnings.warn(f"skipped {source}: {_describe(exc)}", SourceWarning, stacklevel=3)

    return report


def mail_only(messages: Iterable[Message], report: ErrorHandler) -> Iterator[Message]:
    """The messages that are mail; each other one goes to ``report(source, NotMailError())``.

    For training and learning: an empty file, a program or random bytes read
    as a message would only teach the model noise (and grow its vocabulary).
    """
    for m in messages:
        if looks_like_mail(m.raw):
            yield m
        else:
            report(m.source, NotMailError())


def _describe(exc: Exception) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def message_file(path: str, label=None, report: ErrorHandler | None = None) -> Iterator[Message]:
    """Yield the message in file `path`, or nothing.

    A file that cannot be read is passed to ``report(path, exc)`` (default:
    :func:`reporter`'s warning) and skipped; anything but a regular file is
    skipped silently.
    """
    if report is None:
        report = reporter()
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return  # FIFOs, sockets, devices: not messages (and reading could block)
        raw = _read_file(path)
    except OSError as exc:
        report(path, exc)
        return
    yield Message(path, raw, label)


# -- kinds -------------------------------------------------------------------


def _iter_stdin(stdin, label, report) -> Iterator[Message]:
    """Standard input, read as the same bytes in a file would be: an mbox (it starts
    with a ``From`` line) is its messages, anything else one message."""
    stream = sys.stdin if stdin is None else stdin
    stream = getattr(stream, "buffer", stream)
    raw = stream.read()
    if isinstance(raw, str):
        raise SourceError("standard input must be read as bytes")
    if not raw.startswith(b"From "):
        yield Message("-", raw, label)
        return
    # The mbox reader needs a file: a private temporary one, gone when we are.
    fd, tmp = tempfile.mkstemp(prefix="spamnb-stdin-", suffix=".mbox")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        del raw
        for m in _iter_mbox(tmp, label, report):
            yield Message("-" + m.source[len(tmp):], m.raw, label)
    finally:
        os.unlink(tmp)


def _iter_file(path, label, report) -> Iterator[Message]:
    yield from message_file(path, label, report)


def _iter_maildir(path, label, recursive, report) -> Iterator[Message]:
    for file in maildir_paths(path, recursive, report):
        yield from message_file(file, label, report)


def maildir_paths(path, recursive: bool = False, report: ErrorHandler | None = None,
                  skip: Iterable[str] = ()) -> Iterator[str]:
    """The message file paths of a maildir, in reading order, lazily.

    ``cur/`` then ``new/``, each in sorted name order, without dot files;
    ``tmp/`` holds partial deliveries and is never listed.  With `recursive`,
    then each Maildir++ sub-folder the same way, except those in `skip`
    (paths of sub-folders read on their own, compared by real path).  A folder
    that cannot be listed goes to ``report`` (default: :func:`reporter`'s
    warning).  The paths are not checked: :func:`message_file` skips what is
    not a message.
    """
    path = os.fspath(path)
    if report is None:
        report = reporter()
    for sub in ("cur", "new"):
        folder = os.path.join(path, sub)
        for name in sorted_listing(folder, report):
            if not name.startswith("."):
                yield os.path.join(folder, name)
    if recursive:
        # Maildir++: sub-folders are ".Name" directories (".A.B" for nesting),
        # all directly in the top maildir.
        skip = {os.path.realpath(p) for p in skip}
        for name in sorted_listing(path, report):
            sub = os.path.join(path, name)
            if name.startswith(".") and os.path.isdir(os.path.join(sub, "cur")) \
                    and os.path.realpath(sub) not in skip:
                yield from maildir_paths(sub, False, report)


def sorted_listing(folder, report: ErrorHandler | None = None) -> list[str]:
    """The names in `folder`, sorted; ``[]`` (reported) if it cannot be listed."""
    try:
        return sorted(os.listdir(folder))
    except OSError as exc:
        (report or reporter())(os.fspath(folder), exc)
        return []


def _mh_folder(path):
    """The MH folder at ``path`` and its message numbers, ascending (nothing read)."""
    try:
        mh = mailbox.MH(path, create=False)
        return mh, sorted(mh.keys())
    except (OSError, mailbox.Error) as exc:
        raise SourceError(f"cannot read MH folder {path}: {_describe(exc)}") from exc


def mh_paths(path) -> list[str]:
    """The message file paths of the MH folder ``path`` (not its sub-folders), in the
    order :func:`iter_messages` reads them, without reading them."""
    path = os.fspath(path)
    return [os.path.join(path, str(key)) for key in _mh_folder(path)[1]]


def _iter_mh(path, label, recursive, report) -> Iterator[Message]:
    mh, keys = _mh_folder(path)
    for key in keys:
        source = os.path.join(path, str(key))
        try:
            raw = mh.get_bytes(key)
        except KeyError:
            report(source, FileNotFoundError(2, "message vanished", source))
            continue
        except OSError as exc:
            report(source, exc)
            continue
        yield Message(source, raw, label)
    if recursive:
        try:
            folders = sorted(mh.list_folders())
        except OSError as exc:
            report(path, exc)
            folders = []
        for name in folders:
            yield from _iter_mh(os.path.join(path, name), label, True, report)


def _iter_tree(path, label, report) -> Iterator[Message]:
    for file in tree_paths(path, report):
        yield from message_file(file, label, report)


def tree_paths(path, report: ErrorHandler | None = None) -> Iterator[str]:
    """The file paths below folder `path`, recursively, in sorted order.

    Hidden names (files and folders starting with ``.``) and files named
    ``index`` are left out.  The whole tree is listed (and its names held)
    before the first path is yielded, since sorting needs them all; a folder
    that cannot be listed goes to ``report`` (default: :func:`reporter`'s
    warning).  The paths are not checked: :func:`message_file` skips what is
    not a message.
    """
    path = os.fspath(path)
    if report is None:
        report = reporter()
    files = []
    for top, dirs, names in os.walk(path, onerror=lambda exc: report(exc.filename or path, exc)):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        files.extend(os.path.join(top, n) for n in names
                     if not n.startswith(".") and n != "index")
    yield from sorted(files)


class ReadOnlyMbox(mailbox.mbox):
    """:class:`mailbox.mbox` with its file opened read-only. The standard class opens
    it read-write (``rb+``) whenever the user may write it, for the methods that change
    a mailbox; reading mail never needs that, and promises not to touch it (``setup``,
    ``train``): a read-write open is itself seen as a change by whatever watches the
    file (inotify's close-after-write, a mail client's reload)."""

    def __init__(self, path):
        super().__init__(os.devnull, create=False)  # the standard set-up, on a file of no account
        self._file.close()
        self._path = os.path.abspath(os.path.expanduser(path))
        self._file = open(self._path, "rb")


def _iter_mbox(path, label, report) -> Iterator[Message]:
    try:
        box = ReadOnlyMbox(path)
        keys = list(box.iterkeys())  # file order (the table of contents is built here)
    except (OSError, mailbox.Error) as exc:
        raise SourceError(f"cannot read mbox {path}: {_describe(exc)}") from exc
    try:
        for n, key in enumerate(keys, start=1):
            # get_bytes drops the From_ line and leaves ">From " quoting as stored:
            # mboxo and mboxrd differ on un-quoting, so we do not guess.
            try:
                raw = box.get_bytes(key)
            except (OSError, KeyError) as exc:
                report(f"{path}:#{n}", exc)
                continue
            yield Message(f"{path}:#{n}", raw, label)
    finally:
        box.close()


# -- archives ----------------------------------------------------------------


def _is_message_member(name: str) -> bool:
    base = posixpath.basename(name)
    return bool(base) and base != "index" and not base.startswith(".")


def _member_name(name: str) -> str:
    """Normalise an archive member name ("./a//b" -> "a/b")."""
    name = posixpath.normpath(name)
    return "" if name == "." else name.lstrip("/")


def _iter_archive_members(path: str, report) -> Iterator[tuple[str, bytes | None, Exception | None]]:
    """Yield ``(normalised name, bytes, None)`` for each regular member, in
    archive order; ``(name, None, exc)`` for a member that cannot be read.

    Raises SourceError if the archive cannot be opened at all.  A corrupt
    stream part-way through is reported once and ends the iteration.
    """
    if path.lower().endswith(_ZIP_SUFFIXES):
        yield from _iter_zip_members(path, report)
    else:
        yield from _iter_tar_members(path, report)


def _read_capped(f) -> bytes:
    """A member's bytes, at most :data:`MAX_MEMBER_BYTES`: a small archive can hold a
    huge member (a compressed run of zeros), and no more of a message than that is
    ever tokenized (the parser's own cap, plus the byte that tells it more was cut),
    so the tokens are those of the whole member."""
    return f.read(MAX_MEMBER_BYTES)


def _iter_tar_members(path, report):
    try:
        # Stream mode ("r|*"): one sequential pass, no seeking back in xz/bz2.
        tar = tarfile.open(path, mode="r|*")
    except (OSError, tarfile.TarError, EOFError) as exc:
        raise SourceError(f"cannot read archive {path}: {_describe(exc)}") from exc
    with tar:
        members = iter(tar)
        while True:
            try:
                member = next(members)
            except StopIteration:
                return
            except Exception as exc:  # corrupt or truncated compressed stream
                report(path, exc)
                return
            if not member.isfile():
                continue
            name = _member_name(member.name)
            try:
                data = _read_capped(tar.extractfile(member))
            except Exception as exc:
                # A failed read leaves the stream at an unknown offset: report
                # this member and stop, since nothing after it can be trusted.
                yield name, None, exc
                return
            yield name, data, None


def _iter_zip_members(path, report):
    try:
        zf = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise SourceError(f"cannot read archive {path}: {_describe(exc)}") from exc
    with zf:
        for info in zf.infolist():
            if info.is_dir():
                continue
            name = _member_name(info.filename)
            try:
                with zf.open(info) as f:
                    data = _read_capped(f)
            except Exception as exc:  # bad CRC, bad compression data, ...
                yield name, None, exc
                continue
            yield name, data, None


def _iter_archive(path, label, report) -> Iterator[Message]:
    for name, data, exc in _iter_archive_members(path, report):
        if not _is_message_member(name):
            continue
        if exc is not None:
            report(f"{path}:{name}", exc)
        else:
            yield Message(f"{path}:{name}", data, label)


# -- indexes -----------------------------------------------------------------


def iter_index(path, *, strict: bool = False, on_error: ErrorHandler | None = None,
               trusted: bool = False) -> Iterator[Message]:
    """Yield the labelled messages a TREC index names, in index order.

    `path` is either an index file (paths relative to its folder) or an
    archive (by suffix) holding a member ``index`` at its root or one folder
    deep; the paths are then relative to that member's folder inside the
    archive, and the archive is read in one sequential pass.

    The whole index is parsed before the first message is yielded, so a bad
    line raises :class:`SourceError` (naming the line number) up front, and so
    does a path outside the index's folder unless the index is ``trusted``
    (:func:`index_paths`). Missing or unreadable targets are skipped and
    reported like any unreadable entry (see :func:`iter_messages`).
    """
    path = os.fspath(path)
    report = reporter(strict, on_error)
    if not os.path.exists(path):
        raise SourceError(f"no such index file or archive: {path}")
    if is_archive(path):
        return _iter_archive_index(path, report)
    if os.path.isdir(path):
        raise SourceError(f"{path} is a directory, not an index file")
    entries = list(index_paths(path, trusted=trusted))
    return _iter_file_index(entries, report)


def index_paths(path, *, trusted: bool = False) -> Iterator[tuple[str, str]]:
    """``(message path, label)`` for each line of index file `path`, lazily.

    Paths are relative to the index's folder, as :func:`iter_index` reads
    them; the file is read a line at a time, so a very large index is never
    held in memory, and a bad line raises :class:`SourceError` (naming the
    line number) only when it is reached.  An unreadable index raises
    :class:`SourceError`.  Missing targets are not checked here:
    :func:`message_file` reports them.

    An index is someone's file: unless it is ``trusted``, a path that is
    absolute, or leaves the index's folder (``..``, or a symbolic link that
    points out of it), raises :class:`SourceError` -- a third-party index must
    not put ``/etc/passwd`` or another user's files into a model. TREC's own
    layout (``full/index`` naming ``../data/inmail.1``) needs ``trusted``.
    """
    path = os.fspath(path)
    base = os.path.dirname(path)
    root = None if trusted else os.path.realpath(base or ".")
    for label, rel in index_entries(_index_lines(path), path):
        target = os.path.join(base, rel)
        if root is not None and (os.path.isabs(rel) or not _inside(os.path.realpath(target), root)):
            raise SourceError(f"{path}: {rel!r} is outside the index's folder; read such an index "
                              f"only if you trust it (--trust-index)")
        yield target, label


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _index_lines(path: str) -> Iterator[str]:
    """The text lines of an index file: ``splitlines()`` of each physical line,
    the lines of ``splitlines()`` over the whole decoded file."""
    try:
        with open(path, "rb") as f:
            for physical in f:
                yield from physical.decode("utf-8", "surrogateescape").splitlines() or [""]
    except OSError as exc:
        raise SourceError(f"cannot read index {path}: {_describe(exc)}") from exc


def index_entries(lines: Iterable[str], where: str) -> Iterator[tuple[str, str]]:
    """``(label, relative path)`` of TREC index lines, lazily; blank lines and
    ``#`` comments are skipped, a bad line raises SourceError naming ``where`` and
    its line number."""
    for lineno, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _INDEX_LINE.fullmatch(line)
        if m is None:
            raise SourceError(
                f"{where}, line {lineno}: expected 'spam PATH' or 'ham PATH', got {line[:80]!r}")
        yield m.group(1), m.group(2)


def _parse_index(text: bytes, where: str) -> list[tuple[str, str]]:
    """``[(label, relative path)]`` from index bytes; SourceError on a bad line."""
    return list(index_entries(text.decode("utf-8", "surrogateescape").splitlines(), where))


def _iter_file_index(entries, report) -> Iterator[Message]:
    for path, label in entries:
        yield from message_file(path, label, report)


def _index_member_folder(name: str) -> str | None:
    """The folder ("" for the root) if `name` is an index member, else None."""
    parts = name.split("/")
    if parts[-1] == "index" and len(parts) <= 2:
        return "/".join(parts[:-1])
    return None


def _iter_archive_index(path, report) -> Iterator[Message]:
    members = _iter_archive_members(path, report)
    # Members seen before the index must all be kept (we cannot know yet which
    # it names); after it, only the named ones.  Entries are yielded as soon as
    # every earlier entry has been yielded, so an archive stored in index order
    # streams with almost nothing held in memory.
    held: dict[str, bytes | Exception] = {}
    entries = None
    for name, data, exc in members:
        folder = _index_member_folder(name) if entries is None else None
        if folder is not None:
            if exc is not None:
                raise SourceError(f"cannot read index in {path}: {_describe(exc)}") from exc
            entries = [(label, _member_name(posixpath.join(folder, rel)))
                       for label, rel in _parse_index(data, f"{path}:{name}")]
            wanted: dict[str, int] = {}
            for _, member in entries:
                wanted[member] = wanted.get(member, 0) + 1
            held = {k: v for k, v in held.items() if k in wanted}
            pos = 0
        elif entries is None:
            held[name] = exc if exc is not None else data
        elif name in wanted and name not in held:
            held[name] = exc if exc is not None else data
        if entries is not None:
            while pos < len(entries) and entries[pos][1] in held:
                yield from _yield_held(path, entries[pos], held, wanted, report)
                pos += 1
    if entries is None:
        raise SourceError(f"{path} has no index member ('index' or 'FOLDER/index')")
    for entry in entries[pos:]:
        if entry[1] in held:
            yield from _yield_held(path, entry, held, wanted, report)
        else:
            report(f"{path}:{entry[1]}", FileNotFoundError(2, "not in archive", entry[1]))


def _yield_held(path, entry, held, wanted, report) -> Iterator[Message]:
    label, name = entry
    value = held[name]
    wanted[name] -= 1
    if wanted[name] == 0:
        del held[name]  # last reference: free the bytes
    source = f"{path}:{name}"
    if isinstance(value, Exception):
        report(source, value)
    else:
        yield Message(source, value, label)
