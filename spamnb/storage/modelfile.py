"""Model files: where they live, loading them safely, updating them under a lock.

A model file is one joblib file holding :meth:`SpamModel.to_state`'s dict.
Saving is atomic and writers are serialised (:mod:`spamnb.storage.store`); loading
refuses foreign-writable files, because loading joblib runs pickle.

The default model
-----------------
A new user with no model still gets a working filter: when no ``--model`` is
given and ``$SPAMNB_MODEL`` / the XDG path holds no model, spamnb trains one on
the shipped SpamAssassin corpus (``spamnb/data/spamassassin.tar.xz``, in the
package, so every install has it: ``corpora/`` links to it; or ``$SPAMNB_CORPUS``) on first use and caches it in
``$XDG_CACHE_HOME/spamnb/default-model-N.joblib`` (N: the recipe,
:data:`spamnb.storage.locate.DEFAULT_RECIPE`: an upgrade that changes the corpus or
a default builds it anew, and the older ones are removed). Output then says that the
default model is in use.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

from spamnb.storage import locate, store
from spamnb.storage.store import ModelError
from spamnb.verdict import default_model_notice


NO_MODEL = ("no model of yours, and no shipped corpus to build the default model from "
            "(an install without spamnb/data/spamassassin.tar.xz): train your own with "
            "`spamnb train --ham DIR --spam DIR`, or set SPAMNB_CORPUS to a labelled corpus")


def shipped_corpus() -> Path | None:
    """The shipped training corpus (``$SPAMNB_CORPUS``, else the package's own), or None
    when there is none."""
    env = os.environ.get("SPAMNB_CORPUS")
    path = Path(env) if env else Path(__file__).resolve().parents[1] / "data" / "spamassassin.tar.xz"
    return path if path.exists() else None


def default_cache_path(env=os.environ) -> Path:
    return Path(locate.default_cache_path(env))


def load_model(path, *, allow_insecure=False):
    """Load the :class:`SpamModel` at ``path``, its journal's updates added
    (:mod:`spamnb.storage.journal`); ModelError with a clear message otherwise."""
    return load_with_journal(path, allow_insecure=allow_insecure)[0]


def load_snapshot(path, *, allow_insecure=False):
    """The model file at ``path`` alone, without its journal (what a scorer is compiled from)."""
    from spamnb.model import ModelFormatError, SpamModel

    state = store.load_checked(path, allow_insecure=allow_insecure)
    try:
        return SpamModel.from_state(state)
    except ModelFormatError as exc:
        raise ModelError(f"cannot use model {path}: {exc}") from None


def add_journal(model, path, *, allow_insecure=False, opened=None):
    """Add to ``model`` (the snapshot at ``path``) its journal's updates; returns the
    :class:`spamnb.storage.journal.Journal` (None without one). ``opened``: the
    journal as :func:`spamnb.storage.journal.open_journal` opened it before the
    snapshot was loaded."""
    from spamnb.storage import journal

    j = journal.read(path, model.stats.get("save_id"), model.stats.get("journal"),
                     allow_insecure=allow_insecure, opened=opened)
    model.apply_journal(journal.Overlay.of(j, texts=True))
    return j


def load_with_journal(path, *, allow_insecure=False):
    """``(model, journal)``: the snapshot at ``path`` with its journal's updates
    added, and that :class:`spamnb.storage.journal.Journal` (None without one).
    The journal is opened first, so that a compaction meanwhile cannot pair an
    older snapshot with a newer journal (:func:`spamnb.storage.journal.open_journal`):
    a reader never sees fewer updates than a read before it."""
    from spamnb.storage import journal

    opened = journal.open_journal(path, allow_insecure=allow_insecure)
    try:
        model = load_snapshot(path, allow_insecure=allow_insecure)
    except BaseException:
        if opened:
            os.close(opened[0])
        raise
    return model, add_journal(model, path, allow_insecure=allow_insecure, opened=opened)


def folded_marker(j):
    """What a snapshot that folds the journal ``j`` records (see :mod:`spamnb.storage.journal`)."""
    return None if j is None else {"id": j.id, "through": j.end}


def save_model(model, path, *, folded=None) -> None:
    """Write ``model`` to ``path`` atomically, with its compiled scorer beside it.

    ``folded``: the journal whose updates ``model`` holds (:func:`folded_marker`),
    so that no reader adds them twice; the caller removes that journal after.
    A snapshot saved without it makes any journal beside it stale (``train``).

    The folder is created if needed. Steps: the model goes to a temporary name
    in the target folder (itself written atomically by :func:`store.save_atomic`),
    the scorer (:mod:`spamnb.storage.scorer`, ``PATH.scorer``) is compiled from that
    file's identity, and only then is the model renamed into place. Racing
    saves can therefore leave a scorer that does not match the model beside it
    (the filter then takes the full path), never one that matches the wrong weights.
    """
    path = os.fspath(path)
    store.make_private_folder(Path(path).parent)
    staged = _stage(model, path, folded)
    try:
        staged.install(path)
    finally:
        staged.discard()


class _Staged:
    """A snapshot written beside the model under temporary names, with its scorer:
    :meth:`install` renames both into place (scorer first), :meth:`discard` removes
    what was not installed."""

    def __init__(self, tmp, scorer_tmp, compiled):
        self.tmp, self.scorer_tmp, self.compiled = tmp, scorer_tmp, compiled

    def install(self, path):
        from spamnb.storage import scorer

        try:
            if self.compiled:
                os.replace(self.scorer_tmp, scorer.scorer_path(path))
            else:
                scorer.remove_scorer(scorer.scorer_path(path))
            os.replace(self.tmp, path)
        except OSError as exc:
            raise ModelError(f"cannot save model to {path}: {exc.strerror or exc}") from exc
        store.fsync_folder(os.path.dirname(os.path.abspath(path)))

    def discard(self):
        for leftover in (self.tmp, self.scorer_tmp):
            try:
                os.unlink(leftover)
            except OSError:
                pass


def _stage(model, path, folded) -> _Staged:
    """Write ``model`` (with a new save id and the journal marker ``folded``) and its
    scorer to temporary names beside ``path``; the scorer is keyed to the identity of
    the temporary model file, which the rename keeps."""
    import secrets

    from spamnb.storage import scorer

    # A fresh random id in the file's tail: two saves never look alike to the scorer check;
    # it also names the snapshot a journal extends.
    model.stats["save_id"] = secrets.token_hex(8)
    model.stats["journal"] = folded
    tmp = os.path.join(os.path.dirname(os.path.abspath(path)),
                       f".{os.path.basename(path)}.{secrets.token_hex(6)}.new")
    staged = _Staged(tmp, tmp + scorer.SUFFIX, False)
    try:
        store.save_atomic(model.to_state(), tmp)
        os.chmod(tmp, _keep_mode(path))
        fd = os.open(tmp, os.O_RDONLY)
        try:
            identity = scorer.file_identity(fd)
        finally:
            os.close(fd)
        staged.compiled = scorer.write_scorer(model, staged.scorer_tmp, identity)
    except BaseException as exc:
        staged.discard()
        if isinstance(exc, OSError):
            raise ModelError(f"cannot save model to {path}: {exc.strerror or exc}") from exc
        raise
    return staged


# -- the compiled scorer of a model that has none (a copied model) -----------------


def _trusted_identity(path):
    """The scorer identity (:func:`scorer.file_identity`) of the model file at ``path``;
    ModelError when it is not a regular file or fails the trust checks."""
    import stat

    from spamnb.storage import scorer

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise ModelError(f"cannot read model {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ModelError(f"model {path} is not a regular file")
        problem = store.trust_problem(os.fspath(path), st)
        if problem is not None:
            raise ModelError(problem)
        return scorer.file_identity(fd, st)
    finally:
        os.close(fd)


def compile_scorer(path, *, wait=True):
    """Compile the scorer of the model at ``path`` from the model itself: ``(model, outcome)``,
    ``model`` being the snapshot (without its journal's updates).

    For a model that has no usable scorer beside it (copied with ``cp``, or
    written by something other than :func:`save_model`). Safe to run at any
    moment, also from a delivery:

    * only for a *trusted* model (:func:`store.trust_problem`: the owner and
      permission checks, never skipped here) in a folder this user can write,
      else ModelError saying which;
    * under the model's exclusive lock, so no learn, forget or train saves the
      model meanwhile (they write their own fresh scorer); with ``wait=False``
      a lock held by someone else gives ``(None, "busy")`` at once;
    * the scorer is keyed to the identity of the file its weights were read
      from: taken before loading and checked again after, and when the file
      changed in between (a writer that ignores the lock) nothing is written:
      ``(model, "changed")``;
    * written atomically, mode 0600 (:func:`scorer.write_scorer`).

    ``outcome``: ``"written"``; ``"uncompilable"`` when the model can have no
    scorer (:func:`scorer.cannot_compile`); ``"busy"``; ``"changed"``.
    """
    from contextlib import ExitStack

    from spamnb.storage import scorer

    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    _trusted_identity(path)  # refuse an untrusted model before touching its folder
    if not os.access(folder, os.W_OK):
        raise ModelError(f"cannot write the scorer of {path}: its folder {folder} is not writable by you")
    with ExitStack() as stack:
        try:
            stack.enter_context(store.model_lock(path, timeout=None if wait else 0))
        except ModelError:
            if wait:
                raise
            return None, "busy"
        before = _trusted_identity(path)
        model = load_snapshot(path)  # the scorer is the snapshot's; readers add the journal to it
        if _trusted_identity(path) != before:
            return model, "changed"
        try:
            written = scorer.write_scorer(model, scorer.scorer_path(path), before)
        except OSError as exc:
            raise ModelError(f"cannot write the scorer {scorer.scorer_path(path)}: "
                             f"{exc.strerror or exc}") from None
        return model, "written" if written else "uncompilable"


def load_and_compile(path, kind, *, allow_insecure=False):
    """Load the model at ``path`` for a filter that found its scorer unusable
    (``kind``: a :data:`scorer.REBUILDABLE` kind of :class:`scorer.ScorerError`),
    and rebuild the scorer on the way when it can: ``(model, note)``.

    The rebuild is :func:`compile_scorer` without waiting for the lock; when it
    cannot be done (an untrusted model, a folder this user cannot write) the
    model is loaded as the caller asked and the note says why deliveries stay
    slow and what to do. ``note`` is one line for the user, or None when there
    is nothing to say (rebuilt by a concurrent save, or a model that can have
    no scorer). Raises only what :func:`load_model` raises: a failed rebuild,
    whatever the reason, leaves the caller where it would be without one.
    """
    from spamnb.storage.scorer import REBUILDABLE

    path = os.fspath(path)
    what = f"the compiled scorer of {path} was {REBUILDABLE.get(kind, kind)}"
    try:
        model, outcome = compile_scorer(path, wait=False)
    except Exception as exc:  # noqa: BLE001 - the rebuild is a shortcut: never worse than without it
        why = str(exc) if isinstance(exc, ModelError) else f"{type(exc).__name__}: {exc}"
        model = load_model(path, allow_insecure=allow_insecure)
        fix = f"`spamnb info --rebuild-scorer --model {path}`"
        return model, (f"{what}; not rebuilt ({why}), so every delivery loads the whole model (slow); "
                       f"rebuild it with {fix} as a user who can write its folder")
    if model is None:  # busy: a learner is saving, with a scorer of its own
        model = load_model(path, allow_insecure=allow_insecure)
    else:
        add_journal(model, path, allow_insecure=allow_insecure)
    if outcome == "written":
        return model, f"{what}: rebuilt it (this delivery loaded the whole model; the next ones use the scorer)"
    return model, None


def _keep_mode(path) -> int:
    """A replaced model keeps its permissions (minus group/world write); new ones get 0600."""
    try:
        return os.stat(path).st_mode & 0o755
    except OSError:
        return 0o600


def build_default_model():
    """Train the default model on the shipped corpus, as ``spamnb train`` would."""
    from spamnb.scale import parallel
    from spamnb.model import SpamModel

    corpus = shipped_corpus()
    if corpus is None:
        raise ModelError(NO_MODEL)
    model = SpamModel()
    parallel.train(model, parallel.plan(index=[str(corpus)], on_error=lambda *_: None))
    return model


def resolve(path, env=os.environ):
    """Which model a command uses: ``(path, is_default)``.

    An explicit ``--model`` path is used as it is. Otherwise ``$SPAMNB_MODEL`` or
    the XDG data path when a model is there, else the cached default model.
    """
    found, is_default = locate.resolve_model(path, env)  # shared with the fast filter path
    return Path(found), is_default


def own_model_path(path=None, env=os.environ) -> Path:
    """Where a command that writes the user's model writes it: ``--model``, else
    ``$SPAMNB_MODEL``, else the XDG data path -- never the default model's cache,
    which belongs to the shipped corpus (a model trained there would pass for
    the default model, and learning would refuse it)."""
    return Path(path) if path is not None else Path(locate.default_model_path(env))


def default_seed():
    """A user's first model of their own starts as this: the cached default model,
    else a fresh build of it (``learn`` and IMAP corrections without a model)."""
    cached = default_cache_path()
    return load_model(cached) if cached.exists() else build_default_model()


def open_model(path, *, allow_insecure=False, env=os.environ, notice=None):
    """Resolve and load the model a command should use: ``(model, path, is_default)``
    (:func:`prepare_model`, then :func:`load_model`)."""
    path, is_default = prepare_model(path, env=env, notice=notice)
    return load_model(path, allow_insecure=allow_insecure), path, is_default


def prepare_model(path, *, env=os.environ, notice=None):
    """Resolve the model a command should use: ``(path, is_default)``.

    The default model is built and cached when it does not exist yet;
    ``notice(text)`` is told so. Without a model of the user's, a cached default
    model or a shipped corpus to build one, ModelError says once what to do.
    """
    path, is_default = resolve(path, env)
    if is_default:
        if not path.exists() and shipped_corpus() is None:
            raise ModelError(NO_MODEL)
        if notice:
            notice(default_model_notice(path))
        cache_default(path, notice=notice)
    return path, is_default


def cache_default(path=None, *, notice=None) -> Path:
    """The default model's file (``path``, else :func:`default_cache_path`), built from
    the shipped corpus and saved there first when it is not there yet: once, under
    its lock, whoever needs it first. ModelError when there is no corpus to build from."""
    path = Path(path) if path is not None else default_cache_path()
    if not path.exists():
        if shipped_corpus() is None:
            raise ModelError(NO_MODEL)
        if notice:
            notice("building the default model (once)...")
        with store.model_lock(path):
            if not path.exists():
                save_model(build_default_model(), path)
                _remove_older_defaults(path)
    return path


def _remove_older_defaults(path):
    """Remove the default models that older recipes cached beside ``path`` (their
    exact names: the model and its scorer), and give the new one the history the
    older one kept, so a first-day user's verdicts stay on their page. A newer
    recipe's model (another release sharing the cache) is left alone, and so are
    lock files (:func:`spamnb.storage.store.model_lock`)."""
    older = ["default-model.joblib"] + [f"default-model-{n}.joblib" for n in range(2, locate.DEFAULT_RECIPE)]
    for name in older:
        old = path.parent / name
        for gone in (old, old.with_name(name + ".scorer")):
            try:
                gone.unlink()
            except OSError:
                pass
        kept, new = Path(locate.history_path(None, old)), Path(locate.history_path(None, path))
        # a -wal file means a process may still be writing it: left where it is
        if kept.exists() and not new.exists() and not Path(f"{kept}-wal").exists():
            try:
                kept.rename(new)
            except OSError:
                pass


@contextmanager
def updating(path, *, allow_insecure=False, create=None, timeout=None):
    """Read-modify-write a model file under its exclusive lock.

    Yields the loaded model (or ``create()``'s when the file does not exist);
    the model is saved atomically when the block ends without an exception, so
    an error inside the block leaves the file as it was. ``timeout``: seconds
    to wait for the lock (ModelError after them; None: :func:`spamnb.storage.store.lock_timeout`).
    """
    path = Path(path)
    store.make_private_folder(path.parent)
    with store.model_lock(path, timeout=timeout):
        if path.exists():
            model, j = load_with_journal(path, allow_insecure=allow_insecure)
        elif create is not None:
            model, j = create(), None
        else:
            raise ModelError(f"no model at {path}; train one with `spamnb train`")
        yield model
        save_model(model, path, folded=folded_marker(j))
        remove_journal(path)


def learn_messages(path, messages, *, forget=False, create=None, allow_insecure=False, timeout=None,
                   warn=None, later=None, journal_only=False) -> dict:
    """Learn (or forget) ``(raw, label)`` messages (or ``(raw, label, tokens)``) into
    the model at ``path``: what ``learn``, ``forget`` and ``filter -u`` do. Returns
    the counts and each message's outcome (:func:`spamnb.mail.identity.tally`).

    Through the journal when the model has a fresh scorer (the cost of the
    messages), folding it in when it has grown past its bound (now, or through
    ``later(fold)``); else the full model is loaded, updated and saved under the
    lock (``create()`` makes the model when there is none yet), unless
    ``journal_only``: :class:`spamnb.storage.journal.NeedsModel` then.
    """
    from spamnb.mail.identity import tally
    from spamnb.storage import journal

    path = Path(path)
    items = [(m[0], m[1], m[2] if len(m) > 2 else None) for m in messages]
    messages = [(raw, label) for raw, label, _ in items]
    if path.exists():
        try:
            done = journal.update(path, items, forget=forget, allow_insecure=allow_insecure, timeout=timeout,
                                  warn=warn)
        except journal.NeedsModel:
            if journal_only:
                raise
        else:
            if done["needs_compaction"]:
                def fold():
                    return compact(path, allow_insecure=allow_insecure, warn=warn)

                fold() if later is None else later(fold)
            return done
    with updating(path, allow_insecure=allow_insecure, create=create, timeout=timeout) as model:
        return tally(model.forget_each(messages) if forget else model.learn_each(messages))


def remove_journal(path) -> None:
    """Remove the journal of the model at ``path`` (its updates are in the snapshot)."""
    from spamnb.storage import journal

    try:
        os.unlink(journal.journal_path(path))
    except FileNotFoundError:
        pass


# -- compaction ----------------------------------------------------------------------


def compact(path, *, allow_insecure=False, force=False, warn=None):
    """Fold the journal of the model at ``path`` into a new snapshot; returns the
    records folded (0: nothing to do, or another compaction is running).

    Without ``force`` only a journal past :data:`spamnb.storage.journal.MAX_BYTES`
    (or any journal of a model whose scorer cannot add its changes) is folded.
    The new snapshot is built without the model's lock, so deliveries and
    learners go on meanwhile; the lock is held only to install it:

    1. load the snapshot S1 and its journal up to its end X (no lock);
    2. add the journal, apply the model's automatic size limit (``max_tokens``
       in its settings: :meth:`SpamModel.age_out`), write S2 (marked as
       folding the journal up to X) to a temporary file and its scorer;
    3. take the lock; if S1 is no longer the model file, give up (someone
       saved meanwhile); rename the scorer and S2 into place, then replace the
       journal by its records after X (appended meanwhile) for S2.

    A crash after the rename of S2 and before the journal's leaves S2 with the
    old journal, whose records after X S2's marker says to add: every update
    counts exactly once, whenever the process dies.
    """
    from contextlib import ExitStack

    path = os.fspath(path)
    with ExitStack() as stack:
        try:
            stack.enter_context(store.model_lock(path + ".compact", timeout=0))
        except store.LockTimeout:
            return 0  # another compaction is at work (another user's lock file: ModelError says so)
        discard_stale_stages(path)
        return _compact(path, allow_insecure, force, warn)


#: Seconds after which a staged snapshot nobody installed is a leftover (see discard_stale_stages).
STALE_STAGE = 600


def discard_stale_stages(path) -> int:
    """Remove what a compaction killed part-way left beside the model at ``path`` (its
    staged snapshot and scorer, a few MB each time, and their temporary files); the
    number removed. Called under the compaction's lock, so no compaction is staging
    now; a save (``learn``, ``train``) stages under the same names without that lock,
    so only files untouched for :data:`STALE_STAGE` seconds go (no save takes that long)."""
    import re
    import time

    folder, base = os.path.split(os.path.abspath(path))
    staged = re.compile(r"\.?\.%s\.[0-9a-f]{12}\.new(\.scorer)?(\.[^/]*\.tmp)?\Z" % re.escape(base))
    removed = 0
    try:
        names = os.listdir(folder)
    except OSError:
        return 0
    for name in names:
        full = os.path.join(folder, name)
        try:
            st = os.lstat(full) if staged.match(name) else None
            if st and st.st_uid == os.geteuid() and time.time() - st.st_mtime > STALE_STAGE:
                os.unlink(full)
                removed += 1
        except OSError:
            continue
    return removed


def _compact(path, allow_insecure, force, warn):
    import time

    from spamnb.storage import journal, scorer

    before = _trusted_identity(path)
    model, j = load_with_journal(path, allow_insecure=allow_insecure)
    base = (model.stats.get("save_id"), model.stats.get("journal"))
    if j is None or not len(j) or _trusted_identity(path) != before:
        return 0
    if not force and j.end <= journal.MAX_BYTES and scorer.cannot_compile(model) is None \
            and model.model_type == "multinomial":
        return 0
    records = len(j)
    limit = model.stats.get("max_tokens")
    if limit:
        model.age_out(max_tokens=int(limit))
    model.stats["compacted"] = time.time()
    staged = _stage(model, path, folded_marker(j))
    try:
        with store.model_lock(path):
            if _trusted_identity(path) != before:
                return 0  # saved by someone else meanwhile: their snapshot stands
            now = journal.read(path, *base, allow_insecure=allow_insecure)
            if now is None or now.id != j.id:
                return 0
            if now.damaged and warn:
                warn(f"the journal {j.path} had a damaged tail ({now.damaged} bytes); ignored")
            staged.install(path)
            journal.write_fresh(path, model.stats["save_id"], now.between(j.end, now.end))
    finally:
        staged.discard()
    return records
