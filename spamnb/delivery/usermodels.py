"""The models the doors that serve other programs (spamd, the milter) score with: the
served model, and each user's own.

The user a message is for (a spamd request's ``User:`` header, the one recipient of a
milter's message) picks ``USER_MODELS/<user>/model.joblib`` when ``--user-models`` is
given and that file exists, or the user's model in the store of ``--store`` when there
is one (:meth:`spamnb.storage.backend.Backend.for_user`); otherwise the served model
scores. A user name must be a plain name (:data:`_PLAIN_NAME`,
:func:`plain_user`). ``USER_MODELS/<user>/config.toml``, when there, may hold a
``[decision]`` table of the user's own: it replaces the site's decision for that user
(:meth:`Models.decision_for`; a broken or untrusted one is logged and the site's applies).

:class:`Models` keeps the users' backends loaded, at most :attr:`Models.CACHE` of them;
names without a model are remembered apart (:attr:`Models.NO_MODEL_CACHE`), so that
names a client makes up never push a real user's model out.
"""

from __future__ import annotations

import os
import re
import threading
import time

from spamnb import verdict
from spamnb.delivery import events, pipeline
from spamnb.delivery.spamd_protocol import SpamdError
from spamnb.storage.backend import Backend
from spamnb.storage.store import ModelError

#: A user name that picks a per-user model: a login or mailbox name, never a path.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@+=-]{0,127}\Z")


class Models:
    """The served model, and per-user models (cached backends): ``USER_MODELS/<user>/model.joblib``
    with ``--user-models``, the user's model in the store of ``--store`` with ``store_users``
    (``--store-users``)."""

    CACHE = 256
    #: Names known to have no model of their own, kept apart from the cache of backends:
    #: ``User:`` is the client's to choose, so new names (a hostile client's, one per request)
    #: only ever evict each other, never a real user's loaded model; and at most this many.
    NO_MODEL_CACHE = 4096
    #: How long the store's "no model of that user" is believed (a model file is looked for
    #: at every request: a stat). A user's model pushed to the store is served within this.
    NO_MODEL_SECONDS = 10.0

    def __init__(self, served: Backend, user_models=None, log=None, *, store_users=False,
                 decision=verdict.MODELS_OWN, recorder=None):
        self.served = served
        self.store_users = store_users and served.per_user
        #: The decision options over every model's cut-offs (the [decision] table: swapped whole on reload).
        self.decision = decision
        self.recorder = recorder or events.NOTHING
        self.user_models = os.path.abspath(user_models) if user_models else None
        self.log = log or (lambda text: None)
        self._backends: dict[str, list] = {}  # user name -> [backend, when its model was last seen there]
        self._decisions: dict[str, tuple] = {}  # conf path -> (stamp, Decision or None)
        self._lock = threading.Lock()
        self._failed: dict[str, str] = {}  # user model -> why it was last unreadable (said once)
        #: user name -> when (time.monotonic()) they were found to have no model (:data:`NO_MODEL_CACHE`)
        self.no_model: dict[str, float] = {}

    def fell_back(self, backend: Backend, exc) -> None:
        """Log that the user model of ``backend`` could not be read and the served model
        answered instead: once per model and reason, not once per message."""
        why = str(exc)
        with self._lock:
            if self._failed.get(backend.name) == why:
                return
            self._failed[backend.name] = why
        self.log(f"cannot read user model {backend.name}: {why}; scanning with {self.served.name} instead")

    @property
    def per_user(self) -> bool:
        return bool(self.user_models) or self.store_users

    def user_path(self, user):
        """``USER_MODELS/<user>/model.joblib``, or None (no --user-models, no user)."""
        return None if user is None else self._model_file(plain_user(user))

    def _model_file(self, name):
        """:meth:`user_path` of a name :func:`plain_user` has checked."""
        return os.path.join(self.user_models, name, "model.joblib") if self.user_models else None

    def decision_for(self, user, *, via) -> verdict.Decision:
        """The decision for ``user``: the ``[decision]`` table of their
        ``USER_MODELS/<user>/config.toml`` when it has one, else the site's
        (:attr:`decision`). Reread when the file changes; a broken one is a line of
        door ``via``'s (``spamd``, ``milter``)."""
        path = self.user_path(user)
        if path is None:
            return self.decision
        conf = os.path.join(os.path.dirname(path), "config.toml")
        try:
            st = os.stat(conf)
        except OSError:
            return self.decision
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        cached = self._decisions.get(conf)
        if cached is None or cached[0] != stamp:
            cached = (stamp, self._user_decision(conf, via))
            with self._lock:
                _put_bounded(self._decisions, conf, cached, self.CACHE)
        return cached[1] or self.decision

    def _user_decision(self, conf, via):
        from spamnb.storage import settings

        try:
            # the one resolver over the user's own file alone: the decision as a unit, its values numbers
            layers = settings.Layers([(settings.USER, conf, *settings.read(conf))], env={})
            decision = settings.decision(layers, "serve").check()
        except (ValueError, TypeError) as exc:  # settings.ConfigError and verdict.DecisionError are ValueErrors
            self.log(f"{via}: {conf}: {exc}; the site's decision applies")
            return None
        return decision or None

    def where(self, user) -> str:
        """Where the model of ``user`` would be (for a message saying there is none)."""
        path = self.user_path(user)
        return f"spamnb train --model {path}" if path else f"spamnb store push MODEL {self.served.for_user(user).name}"

    def for_user(self, user) -> tuple[Backend, bool]:
        """``(backend, own)``: the user's model when there is one, else the served one.

        One backend a user, kept (the :data:`CACHE` most recent) and shared by the
        messages scanned at once, so that it is loaded once; whether their model is
        there is asked again only after :data:`NO_MODEL_SECONDS` (for a store, a round
        trip). A store that cannot say (a failover) leaves the served model to answer."""
        if user is None or not self.per_user:
            return self.served, False
        name = plain_user(user)
        path = self._model_file(name)
        if self._has_none(name, path):
            return self.served, False
        with self._lock:
            entry = self._backends.get(name)
            if entry is not None:  # the most recent now
                _put_bounded(self._backends, name, entry, self.CACHE)
        new = entry is None
        if new:  # kept only once their model is found: unknown names evict no one
            entry = [self._backend(name, path), None]  # the backend, when its model was last seen there
        backend, seen = entry
        now = time.monotonic()
        if seen is not None and now - seen < self.NO_MODEL_SECONDS:
            return backend, True
        def served():
            if new:
                backend.close()  # never read, never kept
            return self.served, False

        try:
            there = backend.exists()
        except ModelError as exc:  # a store that cannot say now: the served model answers
            self.fell_back(backend, exc)
            return served()
        if not there:
            with self._lock:
                _put_bounded(self.no_model, name, now, self.NO_MODEL_CACHE)
            return served()
        with self._lock:
            self.no_model.pop(name, None)
            entry[1] = now
            kept = self._backends.setdefault(name, entry)  # another message may have found it first: one backend
            if kept is entry:
                _put_bounded(self._backends, name, entry, self.CACHE, dropped=lambda e: e[0].close())
        if kept is not entry:
            backend.close()  # never read
        return kept[0], True

    def _backend(self, name, path) -> Backend:
        """A resident backend of user ``name``'s model (nothing is read yet): the file
        ``path``, else the store's key of that user."""
        if path is not None:
            from spamnb.storage.filestore import FileBackend

            return FileBackend(path, allow_insecure=self.served.allow_insecure, log=self.log).resident()
        return self.served.for_user(name).resident()

    def filter(self, user, raw, *, via, may_name=None, **kw):
        """One message for ``user`` (None: the served model's) through the one pipeline
        (:func:`spamnb.delivery.pipeline.filter_one`, with ``kw``): their own model when
        they have one and ``may_name(user)`` (the door's access rule, asked only then: over
        TCP a socket-table scan) does not say no, else the served model. A user's model the
        server cannot read (copied by root at 0600, damaged, a store that cannot answer)
        scans with the served one, whose name the verdict header carries; the log says why
        (:meth:`fell_back`). ModelError/OSError when the served model cannot be read."""
        backend, own = self.pick(user, may_name)

        def scan(backend):  # view(): refused unless trusted
            return pipeline.filter_one(raw, pipeline.BackendSource(backend), via=via,
                                       decision=self.decision_for(user, via=via), recorder=self.recorder, user=user,
                                       **kw)

        return self.with_fallback(backend, own, scan)

    def pick(self, user, may_name=None):
        """``(backend, own)``: the model that answers for ``user``: their own when they
        have one and ``may_name(user)`` does not say no (asked only then), else the
        served model."""
        backend, own = self.for_user(user)
        if own and may_name is not None and not may_name(user):
            backend, own = self.served, False
        return backend, own

    def with_fallback(self, backend, own, use):
        """``use(backend)``, or when a user's own model cannot be read, ``use`` of the
        served model, the log saying why (:meth:`fell_back`)."""
        try:
            return use(backend)
        except (ModelError, OSError) as exc:
            if not own:
                raise
            self.fell_back(backend, exc)
        return use(self.served)

    def _has_none(self, name, path) -> bool:
        """Whether user ``name`` is known to have no model: ``path``, their model file, is
        still not there, or the store said so less than :data:`NO_MODEL_SECONDS` ago."""
        found = self.no_model.get(name)
        if found is None:
            return False
        return not os.path.isfile(path) if path is not None else time.monotonic() - found < self.NO_MODEL_SECONDS


def _put_bounded(cache: dict, key, value, cap, dropped=None):
    """``cache[key] = value`` as its most recent entry; the oldest entries over ``cap``
    go (``dropped(value)`` for each). The caller holds the lock."""
    cache.pop(key, None)
    cache[key] = value
    while len(cache) > cap:
        old = cache.pop(next(iter(cache)))
        if dropped is not None:
            dropped(old)


def plain_user(user) -> str:
    """``user`` when it is a plain name (a login or mailbox name, never a path); EX_PROTOCOL otherwise."""
    if not _PLAIN_NAME.match(user) or ".." in user:
        raise SpamdError("EX_PROTOCOL", "(User header is not a plain user name)")
    return user

