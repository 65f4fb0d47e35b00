"""``spamnb learn`` / ``forget`` of single message files without click or numpy.

A mail client's "this is spam" button, a Junk folder's hook or a script runs
``spamnb learn --spam FILE`` once per message, so, as for ``filter``, the
process start is most of the cost: click, numpy and the full model would
take longer than the update itself (:mod:`spamnb.storage.journal`: the
message's tokens, a lock, one append). :mod:`spamnb._entry` sends
``learn``/``forget`` command lines here; this module handles the common case
and hands anything else to the click command, which then does all the work
and says what is wrong:

* options ``--spam``/``--ham`` (one of them), ``--model PATH``, and message
  files: regular files holding one message each (or an mbox of one message,
  as a saved message with its ``From_`` line is; not a folder, not ``-``);
* a model of the user's own with a fresh scorer (else the click command loads
  the model, learns, and saves a scorer for next time);
* configuration files as the click command last read and checked them: their
  ``[model] path`` and ``[history] path`` apply here as there (a ``[store] url``,
  or files not checked since they changed: the click command).

The summary line is the click command's (:func:`summary`), the rows in the
history of the messages the model learned (not of those learned already) are
marked as corrected (:func:`spamnb.storage.history.correct_now`), and
the journal is folded in the background when it has grown past its bound.
"""

import os
import sys

from spamnb.storage import locate

#: The settings this path implements; a command line or configuration that sets any other
#: (a store, the history in a store, a lock timeout...) goes to the click command.
FAST = frozenset(("label", "model_path", "history", "no_history"))


def parse_args(args, command="learn", env=os.environ, layers=None):
    """``(settings, files)`` of a learn/forget command line: the options (``--model``, the
    label: ``--spam``/``--ham`` of :data:`spamnb.options.SWITCHES`), the environment and
    the configuration, read and ordered as every fast path reads them
    (:func:`spamnb.storage.settings.command_line`); None when this module does not handle
    it: another option, a setting this path does not implement (a store, the history in
    the store) set, no label or no files."""
    from spamnb.storage import settings

    files = []
    given = settings.command_line(command, args, env, layers, only=FAST, arguments=files)
    if given is None or given.get("label") is None or not files:
        return None
    return given, files


def forgot(done, label) -> str:
    """The line ``spamnb forget`` ends with (``done``: the learn's counts)."""
    return f"forgot {done['forgotten']} {label} message(s)" + given_twice(done)


def summary(done, label, skipped=0) -> str:
    """The line ``spamnb learn`` ends with: what changed the model, then what did not."""
    return (f"learned {done['learned']} as {label}, moved {done['moved']}; already learned: {done['unchanged']}"
            + given_twice(done) + (f"; skipped {skipped}" if skipped else ""))


def given_twice(done) -> str:
    """What a learn's summary says of the copies given twice in one call (learned once)."""
    n = done["duplicates"]
    return f"; {n} duplicate{'s' * (n != 1)} dropped (given twice)" if n else ""


def _read_single(path):
    """The bytes of a file holding one message, or None (an mbox, a folder, not mail...)."""
    from spamnb.mail.mime import MAX_PARSE_BYTES, looks_like_mail

    raw = read_regular(path, MAX_PARSE_BYTES)
    if raw is not None and raw.startswith(b"From "):  # an mbox: one message (a saved message's envelope line)
        raw = _only_message(path)
    if raw is None or not looks_like_mail(raw):  # many messages, or not mail: the click command
        return None
    return raw


def read_regular(path, limit):
    """The bytes of the regular file at ``path``, or None when it is something else (a
    FIFO does not block the open), holds more than ``limit`` bytes, or cannot be read."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(limit + 1)  # a file that grew since fstat (or says size 0, as /proc's) is still bounded
        return raw if len(raw) <= limit else None
    except OSError:
        return None
    finally:
        os.close(fd)


def _only_message(path):
    """The message of an mbox file holding exactly one, as ``spamnb.mail.sources``
    reads it (:class:`spamnb.mail.sources.ReadOnlyMbox`, without the ``From_`` line), else None."""
    import mailbox

    from spamnb.mail.sources import ReadOnlyMbox  # only for an mbox file: the fast path's imports stay few

    try:
        box = ReadOnlyMbox(path)
        try:
            keys = list(box.iterkeys())
            return box.get_bytes(keys[0]) if len(keys) == 1 else None
        finally:
            box.close()
    except (OSError, mailbox.Error):
        return None


def main(command, args, load_cli, env=os.environ):
    """``spamnb learn|forget ARGS``: through the journal when it can, else the click command."""
    parsed = parse_args(args, command, env)
    if parsed is not None:
        given, files = parsed
        path, is_default = locate.resolve_model(given["model_path"], env)
        raws = None if is_default or not os.path.isfile(path) else [_read_single(f) for f in files]
        if raws is not None and all(r is not None for r in raws):
            code = _update(command, path, given["label"], raws, locate.history_setting(given))
            if code is not None:
                sys.stderr.flush()
                sys.exit(code)
    load_cli()(args=[command, *args])


def _update(command, path, label, raws, history=None):
    """Exit status, or None to let the click command do it (and report any error);
    ``history``: ``[history] path``, for :func:`spamnb.storage.locate.history_path`."""
    from spamnb.delivery import pipeline
    from spamnb.delivery.fastfilter import JournalStore, warn
    from spamnb.storage import journal
    from spamnb.storage.history import Now
    from spamnb.storage.store import ModelError

    forget = command == "forget"
    where = locate.history_path(history, path)
    marks = pipeline.HistoryOnly(Now(where, warn) if where else None)
    try:
        done = pipeline.learn(JournalStore(path), [(raw, label) for raw in raws], via=command, forget=forget,
                              recorder=marks, warn=warn)
    except (journal.NeedsModel, ModelError, ValueError, OSError):
        return None  # nothing was written: the click command does it, or says what is wrong
    marks.close()
    if forget:
        sys.stderr.write(forgot(done, label) + "\n")
    else:
        sys.stderr.write(summary(done, label) + "\n")
    return 0
