"""The operations on a model written once over the storage contract
(:class:`spamnb.storage.backend.Backend`), whichever store holds it:

=================================  ======================================================
``set_cutoffs(backend, change)``   store ``change(old)`` as the decision's cut-offs
``age_out(backend, ...)``          prune's rule: drop old, rare tokens; set the size limit
``compact(backend, ...)``          fold a model file's journal into it (a store: nothing)
``rebuild_scorer(backend)``        compile a model file's scorer again
``trusted(backend)``               whether the model passes the trust checks now
``serves(backend, path)``          whether the model file ``path`` is the backend's
``journal_bytes(backend)``         a model file's updates not yet folded in (a store: None)
``health(backend)``                what ``--metrics`` reports: a :class:`Health`
=================================  ======================================================

What a model file has and a store has not (a journal, a compiled scorer, an owner
and a mode) is reached through the backend's ``path``: None for a store.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from spamnb.storage.store import ModelError


def set_cutoffs(backend, change) -> tuple:
    """Store the cut-offs ``change(old)`` returns in place of the model's ``old``
    :class:`spamnb.nb.decision.Cutoffs` (every count kept): ``(old, new)``."""

    def edit(e):
        old = e.cutoffs
        e.cutoffs = new = change(old)
        return old, new

    return backend.edit(edit)


def age_out(backend, *, older_than_days=None, max_messages=1, max_tokens=None, limit=None,
            dry_run=False) -> tuple[int, int]:
    """``(dropped, before)``: prune's rule (:meth:`spamnb.model.SpamModel.age_out`),
    then at most ``max_tokens`` tokens; ``limit``: the automatic size limit to keep
    from now on, which also bounds this run (0: off, None: unchanged)."""

    def edit(e):
        cap = max_tokens
        if limit is not None:
            e.limit_tokens(limit or None)
            cap = limit or max_tokens
        return e.age_out(older_than_days=older_than_days, max_messages=max_messages, max_tokens=cap)

    return backend.edit(edit, dry_run=dry_run)


def compact(backend, *, force=True, warn=None) -> int:
    """Fold the updates pending in a model file's journal into a new snapshot: the
    updates folded (0 for a store, whose learns change the counts themselves)."""
    if backend.path is None:
        return 0
    from spamnb.storage import modelfile

    return modelfile.compact(backend.path, allow_insecure=backend.allow_insecure, force=force, warn=warn)


def rebuild_scorer(backend) -> str:
    """Compile a model file's scorer again; the outcome in words."""
    if backend.path is None:
        raise ModelError(f"{backend.name} has no compiled scorer to rebuild")
    from spamnb.storage.modelfile import compile_scorer

    _, outcome = compile_scorer(backend.path)
    return {"written": "rebuilt", "changed": "not rebuilt: the model changed while it was read; "
                                             "run again"}.get(outcome, "none")


def trusted(backend) -> bool:
    """Whether the model passes the trust checks now: a model file's owner and mode
    (:func:`spamnb.storage.filestore.trusted_now`); a store's model has no file."""
    if backend.path is None:
        return True
    from spamnb.storage.filestore import trusted_now

    return trusted_now(backend.path)


def serves(backend, path) -> bool:
    """Whether the model file ``path`` is the backend's (the private socket's check)."""
    return backend.path is not None and os.path.realpath(path) == os.path.realpath(backend.path)


def journal_bytes(backend) -> int | None:
    """Bytes of updates not yet folded into a model file (its journal's size); None: a store."""
    if backend.path is None:
        return None
    from spamnb.storage.journal import journal_path

    try:
        return os.stat(journal_path(backend.path)).st_size
    except OSError:
        return 0


@dataclass(frozen=True)
class Health:
    """What ``--metrics`` reports of the served model; None: nothing to say."""

    #: ``(tokens, (ham messages, spam messages))``
    size: tuple | None
    #: a model file's journal, not yet compacted
    journal_bytes: int | None
    #: a store: whether it answered its last request, and when it last answered (None: never)
    up: bool | None
    last_success: float | None
    #: whether the model is a store's (the two above are said of it)
    store: bool = False
    #: whether learning works (:meth:`spamnb.storage.backend.Backend.learning`); None: cannot say
    learning: bool | None = None


def health(backend) -> Health:
    """The served model's :class:`Health`, without loading anything. Whether learning
    works is asked first (a store's probe writes to its primary), then the size (read
    where classification reads): ``up`` is then said of what classification uses."""
    learning = backend.learning()
    status = backend.status()
    pending = journal_bytes(backend)
    if pending is not None:  # a model file is always there: no store to answer
        return Health(status.size, pending, None, None, learning=learning)
    return Health(status.size, None, status.answered, status.answered_at, store=True, learning=learning)
