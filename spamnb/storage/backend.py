"""One storage contract: what a place that holds a model's counts does.

bogofilter's ``datastore.h`` is the model: its programs never know which
database holds the counts, and the store does little more than read and write
them. spamnb's commands, the filter, the servers and the decision
(:func:`spamnb.delivery.pipeline.filter_one`) talk to a :class:`Backend`, whose whole
surface is this table (the attributes, then the methods):

=========================  ===========================================================
``name``, ``short_name``   what messages call the model (a path; a URL without its
                           password), and what the verdict header calls it (``model=``)
``is_default``             the cached default model (it never learns)
``allow_insecure``         load a model file that others can write
``path``                   the model's file, None for a store: the file capability
                           (a journal, a compiled scorer, an owner and a mode beside
                           it: what :mod:`spamnb.storage.upkeep` works on)
``per_user``               whether :meth:`~Backend.for_user` holds users' own models
``log(text)``              where notes go (a server sets its log)
``exists()``               whether there is a model
``view()``                 a scorer of the model as it is now: the tokenizer settings,
                           the decision's cut-offs, and the counts of a message's tokens
                           with the class totals (what the decision reads)
``model()``                the whole model (batch commands, ``explain``, ``store pull``)
``tokenizer()``            the model's tokenizer settings
``learn(items)``           apply a learn, forget or move of messages, each once by its
                           identity (:func:`spamnb.mail.identity.message_key`)
``learned_as(raws)``       the class each message was learned as, by its identity,
                           learning nothing (``spamnb learned``)
``replace(model)``         the store now holds this model (``train``, ``store push``)
``edit(change)``           ``change(e)`` on the stored model in place, under the store's
                           write guard, ``e`` an :class:`Edit` (cut-offs, ageing)
``describe(model)``        rows saying where and how the model is kept (``info``)
``status()``               what a gauge reads without loading: a :class:`Status`
``writes``                 whether its last learn went through, and when (:class:`Writes`)
``probe_write()``          whether the model could be written now, learning nothing
``learning()``             whether learning works: the last learn's outcome, else a probe
``resident()``             serve a long-running process (keep what makes requests cheap)
``for_user(name)``         optional: the model of one user in the same store
``close()``                let go of what it holds
=========================  ===========================================================

The operations written once above these (ageing, cut-offs, trust, compaction,
the compiled scorer, health) are :mod:`spamnb.storage.upkeep`'s.

Two implementations: :class:`spamnb.storage.filestore.FileBackend`, the model
file (a snapshot plus its journal, with the compiled scorer), and
:class:`spamnb.storage.redisstore.RedisBackend`, counts in Redis shared by
several mail hosts (docs/many-hosts.md). :func:`spamnb.storage.where.open_backend`
picks one from the options.
"""

from __future__ import annotations

import abc
import time
from dataclasses import dataclass

from spamnb.storage.store import LockTimeout, ModelError

#: Seconds a learn's outcome says whether learning works (:meth:`Backend.learning`);
#: older, a probe asks again (a server asks it at each scrape of its metrics).
PROBE_SECONDS = 30.0


class StoreUnavailable(ModelError):
    """The store cannot be reached or cannot answer now (down, timed out, a
    read-only replica, restarted empty): the filter passes the message through
    (exit 3), spamd answers that it cannot scan, learning changes nothing."""


@dataclass(frozen=True)
class Status:
    """What a backend can say of itself without loading anything (``--metrics``)."""

    #: ``(tokens, (ham messages, spam messages))`` of the model held or stored now;
    #: None when it holds none (a model file not loaded yet, a store that cannot answer)
    size: tuple | None = None
    #: whether the store answered its last request (None: no store, or no request yet)
    answered: bool | None = None
    #: when (``time.time()``) the store last answered; None: never, or no store
    answered_at: float | None = None


class Writes:
    """Whether the model's last write (a learn, or a probe) went through, and when
    (``time.monotonic()``): what :meth:`Backend.learning` reads."""

    def __init__(self):
        self.ok: bool | None = None
        self.at: float | None = None

    def note(self, ok: bool) -> None:
        self.ok, self.at = ok, time.monotonic()

    def learning(self, learn):
        """``learn()``, its outcome noted: what it returns went through; a ModelError (the
        store down, a read-only replica, a model file that cannot be written) did not,
        but a lock busy for a while (LockTimeout) says nothing of whether learning works,
        nor does a message refused (ValueError: nothing to forget)."""
        try:
            out = learn()
        except LockTimeout:
            raise
        except (ModelError, OSError):
            self.note(False)
            raise
        self.note(True)
        return out


class Edit(abc.ABC):
    """The stored model as :meth:`Backend.edit` hands it to a change: what may be
    changed in place, every learned count kept."""

    @property
    @abc.abstractmethod
    def cutoffs(self):
        """The stored decision's :class:`spamnb.nb.decision.Cutoffs` (settable)."""

    @cutoffs.setter
    @abc.abstractmethod
    def cutoffs(self, new): ...

    @abc.abstractmethod
    def limit_tokens(self, limit) -> None:
        """Keep at most ``limit`` tokens at every compaction from now on (None: no
        limit); ModelError where the store has no such limit."""

    @abc.abstractmethod
    def age_out(self, *, older_than_days=None, max_messages=1, max_tokens=None) -> tuple[int, int]:
        """Drop the old, rare tokens by prune's rule (:meth:`spamnb.model.SpamModel.age_out`):
        ``(dropped, tokens before)``."""


class Backend(abc.ABC):
    """What a model's storage does (the module docstring's table); the file and
    Redis backends implement it, and nothing above this layer asks which one it has."""

    name: str = ""
    short_name: str = ""
    is_default: bool = False
    allow_insecure: bool = False
    path: str | None = None
    per_user: bool = False

    @staticmethod
    def log(text) -> None:
        """Where notes go (a server sets its log)."""

    @abc.abstractmethod
    def exists(self) -> bool:
        """Whether there is a model here."""

    @abc.abstractmethod
    def view(self):
        """A scorer of the model now: a :class:`spamnb.storage.scorer.Scorer` or a
        :class:`spamnb.model.SpamModel` (both what :func:`spamnb.delivery.pipeline.filter_one`
        takes). ModelError when there is no usable model, StoreUnavailable when the
        store cannot answer."""

    @abc.abstractmethod
    def model(self):
        """The whole :class:`spamnb.model.SpamModel`."""

    def tokenizer(self):
        """The model's :class:`spamnb.mail.tokenizer.TokenizerConfig`."""
        return self.model().tokenizer

    @abc.abstractmethod
    def learn(self, items, *, forget=False, create=None, timeout=None, warn=None, later=None) -> dict:
        """Learn (or forget) ``(raw, label, tokens or None)`` items: the counts
        (``learned``, ``moved``, ``unchanged``, ``duplicates``, ``forgotten``) and, under
        ``outcomes``, what it did to each item in the order given
        (:func:`spamnb.mail.identity.tally`): only an item whose outcome is in
        :data:`spamnb.mail.identity.CHANGED` changed the model. A message not learned
        under that label refuses a forget with ValueError before anything changes.
        ``create()``: the model to start from when there is none yet; ``later(fn)``:
        run upkeep (a compaction) in the background instead of now."""

    def learned_as(self, raws):
        """The class (``"spam"``, ``"ham"``, None: not learned) each message of ``raws`` was
        learned as, found by its identity in the model's registry of learned messages, in
        order, as they are read (a generator: a folder is never held whole). Nothing is
        learned, and the stored model is not written."""
        from spamnb.mail.identity import message_key
        from spamnb.verdict import LABELS

        model = self.model()  # with its journal: what learn, forget and TELL did since
        for raw in raws:
            c = model.known(message_key(raw), raw)
            yield None if c is None else LABELS[c]

    @abc.abstractmethod
    def replace(self, model) -> None:
        """Make ``model`` the stored model, whatever was there."""

    @abc.abstractmethod
    def edit(self, change, *, dry_run=False):
        """``change(e)`` (``e`` an :class:`Edit` of the stored model) under the store's
        write guard, then what it changed is stored, unless ``dry_run``: what
        ``change`` returns."""

    @abc.abstractmethod
    def describe(self, model) -> tuple[list, list]:
        """``(name, value)`` rows saying where and how ``model`` is stored, for
        ``spamnb info``: those shown before the model's settings, and after."""

    def status(self) -> Status:
        """What this backend can say without loading (:class:`Status`)."""
        return Status()

    @property
    def writes(self) -> Writes:
        """The record of this backend's learns (:class:`Writes`)."""
        rec = self.__dict__.get("_writes")
        if rec is None:
            rec = self.__dict__["_writes"] = Writes()
        return rec

    def probe_write(self) -> bool | None:
        """Whether the model could be written now, found without learning anything
        (None: this backend cannot say)."""
        return None

    def learning(self, within=PROBE_SECONDS) -> bool | None:
        """Whether learning works: the outcome of the last learn when it is less than
        ``within`` seconds old, else of a probe now (:meth:`probe_write`), which then
        stands for ``within`` seconds; None: nothing to say."""
        rec = self.writes
        if rec.at is None or time.monotonic() - rec.at > within:
            ok = self.probe_write()
            if ok is not None:
                rec.note(ok)
        return rec.ok

    def resident(self) -> "Backend":
        """This backend serves a long-running process (a server, ``imap filter --watch``):
        keep what makes many requests cheap. Returns self."""
        return self

    def for_user(self, user) -> "Backend":
        """The backend of ``user``'s own model (which may not exist yet), where
        :attr:`per_user`; ModelError elsewhere."""
        raise ModelError(f"{self.name} holds no per-user models")

    def close(self) -> None:
        """Let go of what it holds."""
