"""Options and helpers the commands share: one definition of each option and rule.

Decision options become cut-offs through :func:`spamnb.verdict.cutoffs_from`
(:func:`cutoffs`), whose errors are usage errors here.
"""

from __future__ import annotations

import functools
import os
import sys

import click

from spamnb import options as table_
from spamnb import verdict
from spamnb.verdict import deliver_unchanged


class _TableType:
    """A click type whose conversion is the table's: the row's kind and choices
    (:func:`spamnb.options.convert`) and bounds (:func:`spamnb.options.within`), as the
    fast paths' parser and a file's check apply them. Mixed into click's own type of the
    kind, which gives its name, metavar and the range ``--help`` shows."""

    def __init__(self, row, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.row = row

    def convert(self, value, param, ctx):
        try:
            return table_.within(self.row, table_.convert(self.row, value, text=True))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def _click_type(row):
    """The click type of a row: its kind's, converting with the table's rule
    (:class:`_TableType`); a path's existence is click's."""
    if row.kind in ("path", "folder"):
        folder = row.kind == "folder"
        return click.Path(dir_okay=folder, file_okay=not folder, exists=row.exists)
    if row.kind == "choice":
        base, args = click.Choice, (row.choices,)
    elif row.kind in ("int", "float"):
        bounded = row.low is not None or row.high is not None
        base = {"int": (click.types.IntParamType, click.IntRange),
                "float": (click.types.FloatParamType, click.FloatRange)}[row.kind][bounded]
        args = (row.low, row.high) if bounded else ()
    else:
        return None
    return _table_type(base)(row, *args)


@functools.cache
def _table_type(base):
    return type(base.__name__, (_TableType, base), {})


def option(name, table="", command=None, **changes):
    """The click option of the setting ``name`` (its row of :data:`spamnb.options.TABLE`;
    ``table`` picks one of a name's rows by its configuration table): its spellings,
    kind, bounds, default and help (``command``'s, when the row has one per command).
    ``changes``: click arguments a command sets otherwise (a default of its own). The
    value a command uses is the one resolver's (:func:`take_settings`)."""
    row = next(r for r in table_.TABLE if r.name == name and (not table or r.table == table))
    kw = {"help": row.help_for(command) or None, "metavar": row.metavar}
    if row.kind == "bool":
        flags = [f"{row.flags[0]}/{row.off}"] if row.off else list(row.flags)
        if row.off:
            kw.update(default=row.default, show_default=True)
        else:
            kw["is_flag"] = True
    else:
        flags = list(row.flags)
        kw["type"] = _click_type(row)
        kw["multiple"] = row.kind == "list"
        if row.default is not None:
            kw.update(default=row.default, show_default=True)
    kw.update(changes)
    kw = {k: v for k, v in kw.items() if v is not None or k == "default"}
    if row.kind == "bool" and not row.off:
        kw.pop("default", None)
    return click.option(*flags, name, **kw)


def options(*names, command=None):
    """A decorator adding the options of ``names`` (rows of the table), in that order in
    ``--help``; ``(name, table)`` picks a row by its configuration table."""
    def add(f):
        for name in reversed(names):
            name, table = (name, "") if isinstance(name, str) else name
            f = option(name, table, command=command)(f)
        return f
    return add


#: ``ctx.meta`` keys: the configuration's layers the group read and checked
#: (:func:`spamnb.cli.config.load`), and the running command's resolved settings.
LAYERS, RESOLVED = "spamnb.layers", "spamnb.resolved"


def resolved(ctx, names=None):
    """``{name: Setting}`` of the running command's settings from the one resolver
    (:func:`spamnb.storage.settings.resolve`), called once per command: its
    command-line options (``ctx.get_parameter_source`` tells them from defaults), then
    the environment, the files (the global ``--config`` too), the defaults; ``names``:
    only these. A configuration the resolver refuses is a one-line error; options that
    exclude each other (``--model`` and ``--store``) a usage error."""
    from click.core import ParameterSource

    from spamnb.storage import settings

    if RESOLVED not in ctx.meta or ctx.meta[RESOLVED][0] is not ctx:
        root = ctx.find_root()
        command = " ".join(ctx.command_path.split()[1:])
        given = {n: v for n, v in ctx.params.items()
                 if ctx.get_parameter_source(n) == ParameterSource.COMMANDLINE}
        try:
            found = settings.resolve(command, given, named=root.params.get("config_file"),
                                     layers=root.meta.get(LAYERS))
        except settings.ConfigError as exc:
            raise click.ClickException(str(exc)) from None
        except ValueError as exc:  # options that exclude each other
            raise click.UsageError(str(exc), ctx=ctx) from None
        ctx.meta[RESOLVED] = (ctx, found)
    found = ctx.meta[RESOLVED][1]
    return found if names is None else {n: found[n] for n in names if n in found}


def settled(ctx):
    """The running command's parameters as it uses them: what the one resolver
    (:func:`resolved`) took from the configuration files in place of click's defaults.
    Options on the command line are the resolver's first layer, and the defaults are
    the commands' own (``serve`` logs by default, ``filter`` does not); the
    environment's variables are read where they are used (the model's, the store's,
    the socket's: :mod:`spamnb.storage.locate`), after the resolver has let them set
    aside a file's unit (``$SPAMNB_STORE`` over a file's ``[model] path``)."""
    from spamnb.storage import settings

    out = dict(ctx.params)
    for name, setting in resolved(ctx).items():
        if name in out and setting.source not in (settings.OPTION, settings.ENVIRONMENT, settings.DEFAULT):
            out[name] = tuple(setting.value) if isinstance(setting.value, list) else setting.value
    return out


def take_settings(command):
    """Make ``command`` (a click command) run with :func:`settled` parameters: the one
    place a command's options meet the environment and the configuration files."""
    callback = command.callback

    @functools.wraps(callback)
    def run(*args, **kwargs):
        ctx = click.get_current_context()
        ctx.params = settled(ctx)
        return callback(*args, **{k: ctx.params[k] if k in ctx.params else v for k, v in kwargs.items()})

    command.callback = run
    return command


def model_options(f):
    return options("store", ("model_path", "model"), "allow_insecure_model")(f)


def store_option(f):
    return option("store")(f)


class _InStore:
    """The ``history`` of :func:`history_options` when it lives in the model's store."""

    def __repr__(self):
        return "IN_STORE"


IN_STORE = _InStore()


def history_options(f):
    """``--history FILE`` / ``--history-store`` / ``--no-history`` (``[history] path`` /
    ``store`` / ``off``), passed on as ``history``: a path, :data:`IN_STORE`, False for
    none, None for the default beside the model (:func:`history_of`). The three are one
    unit of the resolver: the most specific layer naming any of them chooses."""

    @functools.wraps(f)
    def command(history, no_history, history_store, **kwargs):
        if no_history:
            history = False
        elif history_store:
            history = IN_STORE
        return f(history=history, **kwargs)

    return options("history", "history_store", "no_history")(command)


def history_of(history, backend=None, *, url=None, model_path=None):
    """Where a command records its verdicts: a file's path
    (:func:`spamnb.storage.locate.history_path`), the store's history
    (:class:`spamnb.storage.redishistory.RedisHistory`, for :data:`IN_STORE`: the store of
    ``backend``, else of ``url``), or None."""
    from spamnb.storage.locate import history_path

    if history is not IN_STORE:
        return history_path(history, backend.path if backend is not None else model_path)
    from spamnb.storage.redisstore import RedisBackend
    from spamnb.storage.store import ModelError

    if backend is None and url:
        try:
            backend = RedisBackend.from_url(url)
        except ModelError as exc:
            raise click.ClickException(str(exc)) from None
    if not isinstance(backend, RedisBackend):
        raise click.UsageError("--history-store ([history] store) keeps the history in the model's store: "
                               "give --store URL ([store] url)")
    from spamnb.storage.redishistory import RedisHistory

    return RedisHistory(backend)


def open_site(model_path, store, history, *, page=False, allow_insecure_model=False):
    """The site a history is read from, found alike by ``spamnb history`` and, with
    ``page``, ``spamnb web``: for ``store`` the store's (:class:`spamnb.web.storesite.StoreSite`,
    its history checked, and for the page its model too), else the model file's
    (:class:`spamnb.web.data.Site`) with the history beside it as filter records it
    (``history``: the resolver's setting of ``--history``, which is for a model file only).
    The page needs the model and makes a history that is not there yet (0600: it works
    before the first message); reading needs the history and never makes one. Whatever
    is wrong is a one-line error, before any output."""
    from spamnb.storage import settings
    from spamnb.storage.history import HistoryError, open_db
    from spamnb.storage.locate import history_path
    from spamnb.storage.store import ModelError

    log = notice if page else None
    if store:
        from spamnb.storage.redishistory import RedisHistory
        from spamnb.storage.redisstore import RedisBackend
        from spamnb.web.storesite import StoreSite

        if history.value and history.source == settings.OPTION:
            said = "the page shows the store's history" if page else "the history is the store's"
            raise click.UsageError(f"with --store {said}: --history FILE is for a model file")
        try:
            backend = RedisBackend.from_url(store)
            if page:
                backend.settings()  # a store that is empty, unreachable or malformed: said now, not on the page
            hist = RedisHistory(backend)
            hist.check()
        except (ModelError, HistoryError) as exc:
            raise click.ClickException(str(exc)) from None
        return StoreSite(backend, log=log, hist=hist)
    from spamnb.storage.modelfile import resolve
    from spamnb.web.data import Site

    path, is_default = resolve(model_path)
    if page and not path.exists():
        raise click.ClickException(f"no model at {path}; train one with `spamnb train`")
    where = os.path.abspath(history_path(history.value, path))  # beside the model as named, as filter records
    if not page and not os.path.exists(where):
        raise click.ClickException(f"no history at {where}: serve, filter and imap filter record one as they "
                                   f"filter (docs/web.md)")
    try:
        open_db(where, create=page).close()  # not ours, unsafe, not a history: one line
    except HistoryError as exc:
        raise click.ClickException(str(exc)) from None
    return Site(path.resolve(), is_default, where, allow_insecure=allow_insecure_model, log=log)


def decision_options(f):
    """The decision options (rows of the table), handed to the command as one value,
    ``decision`` (:class:`spamnb.verdict.Decision`), as the one resolver settled them."""

    @functools.wraps(f)
    def command(**kwargs):
        decision = verdict.Decision.of(kwargs)
        for name in verdict.DECISION_OPTIONS:
            kwargs.pop(name, None)
        return f(decision=decision, **kwargs)

    for name in reversed(verdict.DECISION_OPTIONS):
        command = option(name)(command)
    return command


def trust_index_option(f):
    return click.option("--trust-index", is_flag=True,
                        help="Read index paths that leave the index's folder (absolute, ../, links "
                             "out of it), as TREC's full/index -> ../data does: only for an index you trust.")(f)


def source_options(f):
    f = click.option("--strict", is_flag=True, help="Stop at the first unreadable message.")(f)
    f = click.option("--recursive", "-r", is_flag=True, help="Also read maildir/MH sub-folders.")(f)
    return f




def cutoffs(model_cutoffs, decision):
    """The :class:`~spamnb.nb.decision.Cutoffs` that ``decision`` applies over
    ``model_cutoffs`` (:meth:`spamnb.verdict.Decision.cutoffs`); bad values are usage errors."""
    from spamnb.nb.decision import Cutoffs

    try:
        return Cutoffs(*decision.cutoffs(model_cutoffs))
    except verdict.DecisionError as exc:
        raise click.UsageError(str(exc)) from None


def checked(decision):
    """``decision`` when it makes a decision, a usage error otherwise: before any model is loaded."""
    try:
        return decision.check()
    except verdict.DecisionError as exc:
        raise click.UsageError(str(exc)) from None


def decision_note():
    """Say on stderr when a configured ``[decision]`` overrides the model's stored cut-offs
    (for ``cutoffs`` and ``info``, which show the stored ones)."""
    from spamnb.storage import settings

    ctx = click.get_current_context(silent=True)
    named = ctx.find_root().params.get("config_file") if ctx is not None else None
    try:
        note = settings.decision_note(settings.Layers.load(named=named))
    except settings.ConfigError:
        return
    if note:
        notice(f"note: {note}, for classify, sort, evaluate, filter, serve and imap filter")


def skipper(counter):
    """An on_error callback that reports a skipped message and counts it in ``counter[0]``."""
    def on_error(source, exc):
        counter[0] += 1
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        click.echo(f"spamnb: skipped {source}: {reason}", err=True)
    return on_error


def labelled(ham, spam, index, *, recursive=False, strict=False, on_error=None, trust_index=False):
    """All mail of the --ham/--spam/--index sources, as sources.Message (what is not
    mail is reported and skipped: :func:`spamnb.mail.sources.mail_only`)."""
    from spamnb.mail.sources import iter_index, iter_messages, mail_only, reporter

    def read():
        for label, specs in (("ham", ham), ("spam", spam)):
            for spec in specs:
                yield from iter_messages(spec, label=label, recursive=recursive, strict=strict,
                                         on_error=on_error)
        for spec in index:
            yield from iter_index(spec, strict=strict, on_error=on_error, trusted=trust_index)

    return mail_only(read(), reporter(strict, on_error))


def shard_progress():
    """A progress callback for sharded work: messages merged so far, in place on stderr."""
    def show(n):
        click.echo(f"\r  {n} messages...", err=True, nl=False)
    return show


def notice(text):
    """Tell the user something on stderr, as ``spamnb: text``."""
    click.echo(f"spamnb: {text}", err=True)




def open_backend(model_path, store, allow_insecure_model, **kwargs):
    """The :class:`spamnb.storage.backend.Backend` of the model a command uses (the
    default model built if needed)."""
    from spamnb.storage import where

    return where.open_backend(model_path, store, allow_insecure=allow_insecure_model, notice=notice, **kwargs)



def model_settings_options(f):
    """Options that define a model: event model, λ, prior, features, tokenizer, decision."""
    opts = [
        click.option("--model-type", type=click.Choice(["multinomial", "bernoulli", "complement"]),
                     default="multinomial", show_default=True, help="Naive Bayes event model."),
        click.option("--alpha", type=click.FloatRange(min=0.0), default=None,
                     help="Smoothing λ > 0 (1 = Laplace; default 0.01). λ = 0, maximum likelihood, "
                          "is for experiments: train refuses it, evaluate warns."),
        click.option("--refine-rounds", type=click.IntRange(min=0), default=None,
                     help="Rounds of training on errors after counting: the training messages not "
                          "classified right by --refine-margin are added again (default 10; 0 = off)."),
        click.option("--refine-margin", type=click.FloatRange(min=0.0), default=None,
                     help="The margin, in log-odds, for --refine-rounds (default 10)."),
        click.option("--prior", type=click.Choice(["laplace", "learned", "smoothed", "uniform"]), default="laplace",
                     show_default=True, help="Class prior: (N_k+1)/(N+2), N_k/N, (N_k+λ)/(N+2λ), or 1/2."),
        click.option("--features", type=click.Choice(["counts", "presence", "presence-l2", "logtf-l2"]),
                     default=None, help="What a message's row holds (default presence-l2: each token "
                                        "once, the message scaled to unit length)."),
        click.option("--only-headers", metavar="LIST", help="Comma-separated header names: tokenize only these."),
        click.option("--skip-headers", metavar="LIST",
                     help="Comma-separated header names never tokenized (default: mailing-list and "
                          "mailbox-store fields, see docs/accuracy.md; '' for none)."),
        click.option("--bigrams/--no-bigrams", default=None, help="Also use word pairs as tokens."),
        click.option("--max-part-bytes", type=click.IntRange(min=1),
                     help="Tokenize at most this many bytes of each part."),
        click.option("--hash-features", type=click.IntRange(min=1, max=2**31 - 1), metavar="N",
                     help="Hash tokens into N columns (e.g. 1048576) instead of keeping a vocabulary: "
                          "memory bounded by N, at a small cost in accuracy."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return decision_options(f)


def scale_options(f):
    """Where tokenizing and counting run: --jobs local processes, or a Dask cluster."""
    opts = [
        click.option("--jobs", "-j", type=click.IntRange(min=1), default=1, show_default=True,
                     help="Worker processes tokenizing and counting (the model is the same for any N)."),
        click.option("--backend", type=click.Choice(["multiprocessing", "loky", "dask"]), default="multiprocessing",
                     show_default=True,
                     help="multiprocessing: local worker processes forked from this one (fast to start); "
                          "loky: fresh local interpreters; dask: the workers of a Dask cluster (--scheduler)."),
        click.option("--scheduler", metavar="ADDRESS",
                     help="Dask scheduler address, e.g. tcp://10.0.0.1:8786 (with --backend dask)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def runner_from(jobs, backend, scheduler):
    """The :class:`spamnb.scale.parallel.Runner` of the --jobs/--backend/--scheduler options."""
    from spamnb.scale.parallel import Runner

    if backend == "dask" and not scheduler:
        raise click.UsageError("--backend dask needs --scheduler ADDRESS")
    if scheduler and backend != "dask":
        raise click.UsageError("--scheduler is for --backend dask")
    return Runner(jobs=jobs, backend=backend, scheduler=scheduler)


ALPHA_ZERO = ("--alpha 0 is maximum likelihood: a token seen in one class only gets an infinite "
              "weight, so a single word decides a message (P = 0 or 1, whatever else it says)")


def check_alpha(alpha, *, refuse):
    """λ = 0 on the command line: a usage error for a model that will filter mail
    (``refuse``), a warning for an experiment. The library keeps λ = 0
    (:class:`spamnb.nb.naive_bayes.MultinomialNB` and the others)."""
    if alpha != 0:
        return
    if refuse:
        raise click.UsageError(f"{ALPHA_ZERO}; use a small λ such as 0.001, or the library "
                               "(spamnb.nb.naive_bayes) to study λ = 0")
    notice(f"warning: {ALPHA_ZERO}")


def model_factory(model_type, alpha, prior, features, only_headers, skip_headers, bigrams,
                  max_part_bytes, decision, hash_features=None, refine_rounds=None, refine_margin=None):
    """A function making fresh, untrained models with the settings of the options.

    Settings are checked here, once, so a bad value fails before any mail is read.
    """
    from spamnb import model as model_mod
    from spamnb.mail.tokenizer import TokenizerConfig

    changes = {}
    if only_headers is not None:
        changes["only_headers"] = header_list(only_headers)
    if skip_headers is not None:
        changes["skip_headers"] = header_list(skip_headers)
    if bigrams is not None:
        changes["bigrams"] = bigrams
    if max_part_bytes is not None:
        changes["max_part_bytes"] = max_part_bytes
    tok = TokenizerConfig.from_dict({**TokenizerConfig().to_dict(), **changes})
    default_cut = verdict.cutoffs_from_costs(*verdict.DEFAULT_COSTS)
    cut = cutoffs(default_cut, decision)
    kwargs = {"alpha": alpha, "features": features, "hash_features": hash_features,
              "refine_rounds": refine_rounds, "refine_margin": refine_margin}
    kwargs = {k: v for k, v in kwargs.items() if v is not None}

    def make():
        return model_mod.SpamModel(model_type=model_type, prior=prior, tokenizer=tok, cutoffs=cut, **kwargs)

    make()
    return make




def header_list(text):
    """``--only-headers``/``--skip-headers``: comma-separated names, lower-cased."""
    return tuple(h.strip().lower() for h in text.split(",") if h.strip())


def log_options(default_on):
    """``--log-messages``, ``--log-format``, ``--log-to``: a line per message
    (:mod:`spamnb.delivery.events`); on by default for servers, asked for by ``filter``."""
    def add(f):
        for name in ("log_to", "log_format"):
            f = option(name)(f)
        return option("log_messages", default=default_on)(f)
    return add


def metrics_options(f):
    """``--metrics HOST:PORT`` and who may scrape it (:mod:`spamnb.delivery.metrics`)."""
    f = option("metrics_allow")(f)
    return option("metrics_address")(f)


def recorder(log_messages, log_format, log_to, metrics=None, history=None, log=notice):
    """The :class:`spamnb.delivery.events.Recorder` of the log options; ``history``:
    the history file it also records each message in
    (:func:`spamnb.storage.locate.history_path`; None: none), or the store's
    (:func:`history_of`). A history that cannot be used is said to ``log``, and the
    command goes on without it: deliveries matter more than their record. Close it at the end."""
    from spamnb.delivery.events import Recorder

    kept = None
    if history and not isinstance(history, (str, os.PathLike)):  # the store's: its writer says what fails
        from spamnb.storage import redishistory

        kept = redishistory.Recorder(history, log)
    elif history:
        import sqlite3

        from spamnb.storage import history as hist

        try:
            kept = hist.Recorder(history, log)
        except (hist.HistoryError, sqlite3.Error, OSError) as exc:
            log(f"not recording the history: {exc}")
    return Recorder(lines=log_messages, fmt=log_format, to=log_to, metrics=metrics, history=kept)


def heartbeat(backend, rec, role, log=notice):
    """A running :class:`spamnb.storage.redissite.Heartbeat` of ``rec``'s counts (a
    :class:`spamnb.delivery.events.Recorder`) into the store of ``backend`` (a
    :class:`~spamnb.storage.backend.Backend`, or a store's URL), as ``role``; None for a
    model file. Close it at the end."""
    from spamnb.storage.redisstore import RedisBackend
    from spamnb.storage.store import ModelError

    if isinstance(backend, str):
        try:
            backend = RedisBackend.from_url(backend)
        except ModelError as exc:  # said again where the model is read; the command goes on
            log(f"no heartbeat: {exc}")
            return None
    if not isinstance(backend, RedisBackend):
        return None
    from spamnb.storage.redissite import Heartbeat

    return Heartbeat(backend, rec.counts, role, log=log).start()


def metrics_from(address, allow):
    """The :class:`spamnb.delivery.metrics.Metrics` of --metrics, or None."""
    if not address:
        if allow:
            raise click.UsageError("--metrics-allow is for --metrics")
        return None
    from spamnb.delivery import metrics

    try:
        return metrics.Metrics(address, allow)
    except metrics.MetricsError as exc:
        raise click.ClickException(str(exc)) from None
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


#: ``ctx.meta`` key: whether ``--exit-zero`` is on the command line (set by the group before
#: any option is parsed, for :func:`pass_through`).
EXIT_ZERO_GIVEN = "spamnb.exit_zero_given"


def pass_through(reason):
    """What ``filter`` does when it cannot even start (bad options, a configuration file
    it cannot read): standard input delivered unchanged, as the delivery paths' failure
    boundary delivers it (:func:`spamnb.verdict.deliver_unchanged`), then the exit: 3, or
    0 with ``--exit-zero`` on the command line or in the configuration that was read."""
    ctx = click.get_current_context(silent=True)
    root = ctx.find_root() if ctx is not None else None
    layers = root.meta.get(LAYERS) if root is not None else None
    exit_zero = root is not None and bool(
        root.meta.get(EXIT_ZERO_GIVEN) or (layers is not None and layers.get("filter", "exit_zero")))
    try:
        raw = sys.stdin.buffer.read()
    except (OSError, ValueError):
        raw = b""
    raise click.exceptions.Exit(deliver_unchanged(raw, reason, exit_zero))


def run_alone(state_path, command) -> int:
    """The lock beside ``state_path`` (``STATE.lock``, made with its private folder), held
    until the returned fd is closed: one ``command`` per model at a time. A click error
    when another holds it, or it cannot be taken."""
    from spamnb.storage import store as files

    try:
        files.make_private_folder(os.path.dirname(os.path.abspath(state_path)))
        lock = files.try_lock(state_path + ".lock")
    except OSError as exc:
        raise click.ClickException(f"cannot lock {state_path}.lock: {exc.strerror or exc}") from None
    except files.ModelError as exc:
        raise click.ClickException(str(exc)) from None
    if lock is None:
        raise click.ClickException(f"another {command} is running for this model ({state_path}.lock)")
    return lock
