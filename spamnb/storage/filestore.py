"""The model file as a backend: a snapshot plus its journal, with the compiled scorer.

:class:`FileBackend` is the :class:`spamnb.storage.backend.Backend` of one model
file: scoring views come from a :class:`ModelHolder` (the compiled scorer with
the journal's changes, reloaded when the files change), learning appends to the
journal (:mod:`spamnb.storage.journal`) and folds it in when it has grown,
``replace`` saves a new snapshot atomically (:mod:`spamnb.storage.modelfile`),
``edit`` loads the whole model and saves it again under the model's lock. What a
model file has beyond the contract (the journal's compaction, the compiled
scorer, the trust checks) :mod:`spamnb.storage.upkeep` reaches through ``path``.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from spamnb.storage import journal
from spamnb.storage.backend import Backend, Edit, Status
from spamnb.storage.modelfile import (learn_messages, load_and_compile, load_model, remove_journal, save_model,
                                      updating)
from spamnb.storage.scorer import REBUILDABLE, Scorer, ScorerError, fresh_scorer, open_checked
from spamnb.storage.store import ModelError, model_lock


@dataclass(frozen=True)
class Loaded:
    model: object  # a Scorer (with its journal's changes as overlay) or a SpamModel
    identity: tuple  # the model file's
    journal: tuple = None  # the journal file's (inode, size) when read
    read_to: tuple = None  # (journal id, offset) of the records in the overlay


def file_state(st):
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class ModelHolder:
    """The served model, reloaded when its file changes."""

    def __init__(self, path, *, allow_insecure=False, log=None):
        self.path = os.path.abspath(path)
        self.allow_insecure = allow_insecure
        self.log = log or (lambda text: None)
        self.current: Loaded | None = None
        self.loads = 0
        self._lock = threading.Lock()

    def real_now(self) -> str:
        """The model's real path now (a symlink may have been repointed)."""
        return os.path.realpath(self.path)

    def get(self) -> Loaded:
        """The model as the files are now (loading what changed); ModelError/OSError otherwise."""
        ident = file_state(os.stat(self.path))
        cur = self.current
        if cur is not None and cur.identity == ident and cur.journal == _journal_state(self.path):
            return cur
        with self._lock:  # one reload at a time; the others wait for it and share it
            cur = self.current
            if cur is not None and cur.identity == file_state(os.stat(self.path)):
                if cur.journal == _journal_state(self.path):
                    return cur
                if isinstance(cur.model, Scorer) and cur.read_to is not None:
                    self.current = self._catch_up(cur)
                    return self.current
            self.current = self._load()
            self.loads += 1
            self.log(f"loaded model {self.path}")
            return self.current

    def _catch_up(self, cur: Loaded) -> Loaded:
        """``cur`` with the journal's records appended since it was read."""
        state = _journal_state(self.path)
        sc = cur.model
        j = journal.read(self.path, sc.save_id, sc.folded, allow_insecure=self.allow_insecure, since=cur.read_to)
        if j is None or j.id != cur.read_to[0] or j.start != cur.read_to[1]:
            return self._load()  # not the journal read before: read it whole
        overlay = sc.overlay.copy()
        for rec in j.records():
            overlay.add(rec)
        return Loaded(sc.with_overlay(overlay), cur.identity, state, (j.id, j.end))

    def _scorer(self):
        """The fresh compiled scorer with its journal's changes, and where its journal was
        read to; :class:`ScorerError` when the scorer is not fresh."""
        model = fresh_scorer(self.path, allow_insecure=self.allow_insecure).resident()
        j = journal.read(self.path, model.save_id, model.folded, allow_insecure=self.allow_insecure)
        model.overlay = journal.Overlay.of(j)
        return model, ((j.id, j.end) if j is not None else None)

    def _load(self) -> Loaded:
        """The compiled scorer when it is fresh (a few ms: mmap) with its journal's
        changes, else the full model (which adds them itself)."""
        for _ in range(5):  # a save between the stats: load again
            before = file_state(os.stat(self.path))
            state = _journal_state(self.path)
            read_to = None
            try:
                model, read_to = self._scorer()
            except ScorerError as exc:
                if exc.kind in REBUILDABLE:  # a copied model: its scorer is rebuilt when that is safe
                    model, note = load_and_compile(self.path, exc.kind, allow_insecure=self.allow_insecure)
                    if note:
                        self.log(note)
                    try:  # rebuilt: serve it now, or a resident server keeps the slow model until a save
                        model, read_to = self._scorer()
                    except ScorerError:
                        pass
                else:
                    model = load_model(self.path, allow_insecure=self.allow_insecure)
            if file_state(os.stat(self.path)) == before:
                if read_to is None:  # no journal yet: the next one is read whole when it comes
                    state = None if isinstance(model, Scorer) else _journal_state(self.path)
                return Loaded(model, before, state, read_to)
        raise OSError(f"model {self.path} keeps changing while it is loaded")


def _journal_state(path):
    """(inode, size) of the model's journal, None without one."""
    try:
        st = os.stat(journal.journal_path(path))
    except OSError:
        return None
    return st.st_ino, st.st_size


def trusted_now(path):
    """Whether the model file at ``path`` passes the trust checks now (owner, mode)."""
    try:
        fd, _ = open_checked(path, what="model")
    except ScorerError:
        return False
    os.close(fd)
    return True


class FileBackend(Backend):
    """The model file at ``path`` (see the module docstring)."""

    def __init__(self, path, *, allow_insecure=False, is_default=False, log=None):
        self.path = os.path.abspath(os.fspath(path))
        self.name = os.fspath(path)
        self.short_name = os.path.basename(self.path)
        self.allow_insecure = allow_insecure
        self.is_default = is_default
        self.log = log or (lambda text: None)
        self._holder = None
        self._resident = False
        self._lock = threading.Lock()

    def __repr__(self):
        return f"FileBackend({self.name!r})"

    def exists(self) -> bool:
        return os.path.isfile(self.path)

    def status(self) -> Status:
        """The size of the model a resident backend holds now (nothing is loaded for it)."""
        holder = self._holder
        current = holder.current if holder is not None else None
        return Status(size=_model_size(current.model) if current is not None else None)

    @property
    def holder(self) -> ModelHolder:
        with self._lock:
            if self._holder is None:
                self._holder = ModelHolder(self.path, allow_insecure=self.allow_insecure, log=self.log)
            return self._holder

    def resident(self) -> "FileBackend":
        """Views from a :class:`ModelHolder`: the compiled scorer (rebuilt when it
        is missing and that is safe) plus the journal, reloaded when the files
        change. A one-shot command's view is the whole model, loaded once."""
        self._resident = True
        return self

    def view(self):
        if not self._resident:
            return self.model()
        loaded = self.holder.get()
        if not self.allow_insecure and not trusted_now(self.path):
            raise ModelError(f"model {self.path} is not trusted (see spamnb info)")
        return loaded.model

    def model(self):
        return load_model(self.path, allow_insecure=self.allow_insecure)

    def learn(self, items, *, forget=False, create=None, timeout=None, warn=None, later=None, journal_only=False):
        """:meth:`Backend.learn` through the journal when the model has a fresh scorer,
        else the whole model (:func:`spamnb.storage.modelfile.learn_messages`);
        ``journal_only``: raise :class:`spamnb.storage.journal.NeedsModel` instead."""
        return self.writes.learning(lambda: learn_messages(
            self.path, items, forget=forget, create=create, allow_insecure=self.allow_insecure, timeout=timeout,
            warn=warn, later=later, journal_only=journal_only))

    def probe_write(self) -> bool:
        """Whether a learn could write here now, by the file modes alone (``os.access``):
        the model's folder (its journal, lock and a compaction's new snapshot go there)
        and the journal when there is one."""
        folder = os.path.dirname(self.path)
        if not os.access(folder, os.W_OK | os.X_OK):
            return False
        pending = journal.journal_path(self.path)
        return not os.path.exists(pending) or os.access(pending, os.W_OK)

    def replace(self, model) -> None:
        with model_lock(self.path):  # a concurrent learn/forget finishes first, then sees the new model
            save_model(model, self.path)
            remove_journal(self.path)  # learned into the model it replaces: stale (ignored) from the rename on

    def edit(self, change, *, dry_run=False):
        """``change`` on the whole model, loaded and saved again under the model's lock
        (:func:`spamnb.storage.modelfile.updating`); a dry run leaves without saving."""
        try:
            with updating(self.path, allow_insecure=self.allow_insecure) as model:
                out = change(FileEdit(model))
                if dry_run:
                    raise _DryRun(out)
        except _DryRun as run:
            return run.out
        return out

    def describe(self, model):
        """``(rows before the model's, rows after)`` for ``spamnb info``."""
        import datetime

        from spamnb.storage import scorer

        path, stats = self.path, model.stats
        why_none = scorer.cannot_compile(model)
        state = scorer.state(path, allow_insecure=self.allow_insecure)
        if why_none is not None:
            scorer_row = f"none: {why_none}, so the filter loads the whole model"
        elif state == "fresh":
            scorer_row = f"fresh ({scorer.scorer_path(path)})"
        else:
            scorer_row = (f"{scorer.REBUILDABLE.get(state, state)}: each delivery loads the whole model until "
                          f"it is rebuilt (by the next `spamnb filter`, or `spamnb info --rebuild-scorer`)")
        j = journal.read(path, stats.get("save_id"), stats.get("journal"), allow_insecure=self.allow_insecure)
        journal_row = "empty"
        if j is not None and (len(j) or j.damaged):
            journal_row = (f"{len(j)} update(s), {(j.end - j.start) / 1e3:.0f} kB (folded in past "
                           f"{journal.MAX_BYTES / 1e6:.0f} MB, or by `spamnb compact`)")
            if j.damaged:
                journal_row += f"; a damaged tail of {j.damaged} bytes, ignored"
        compacted = stats.get("compacted")
        return [
            ("model file", f"{self.name}" + (" (default model)" if self.is_default else "")),
            ("size", f"{os.path.getsize(path) / 1e6:.1f} MB"),
            ("journal", journal_row),
            ("compacted", datetime.datetime.fromtimestamp(compacted).isoformat(timespec="seconds")
             if compacted else "never"),
        ], [("scorer", scorer_row)]


class FileEdit(Edit):
    """:class:`spamnb.storage.backend.Edit` of a model file: the loaded model itself."""

    def __init__(self, model):
        self.model = model

    @property
    def cutoffs(self):
        return self.model.cutoffs

    @cutoffs.setter
    def cutoffs(self, new):
        self.model.cutoffs = new

    def limit_tokens(self, limit) -> None:
        self.model.stats["max_tokens"] = limit  # every compaction keeps at most this many

    def age_out(self, *, older_than_days=None, max_messages=1, max_tokens=None):
        before = len(self.model.vocabulary)
        dropped = self.model.age_out(older_than_days=older_than_days, max_messages=max_messages,
                                     max_tokens=max_tokens)
        return dropped, before


def _model_size(model):
    """``(tokens, (ham messages, spam messages))`` of a held model (a compiled
    scorer's snapshot, or a full model)."""
    header = getattr(model, "header", None)
    if header is not None:
        return len(model), tuple(int(x) for x in header["class_count"])
    return len(model.vocabulary), tuple(int(x) for x in model.messages)


class _DryRun(Exception):
    """Leaves :func:`spamnb.storage.modelfile.updating` without saving."""

    def __init__(self, out):
        super().__init__(out)
        self.out = out
