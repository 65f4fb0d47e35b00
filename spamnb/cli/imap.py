"""``spamnb imap train`` and ``spamnb imap filter``: mail that lives on an IMAP server."""

from __future__ import annotations

import os
import sys

import click

from spamnb.cli.options import (decision_options, heartbeat, history_of, history_options, log_options,
                                metrics_from, metrics_options, notice, options, recorder, run_alone, store_option)
from spamnb.verdict import MODELS_OWN

_SETTING_KEYS = ("host", "port", "user", "password_file", "password_command", "security", "cafile",
                 "force_plaintext")


def account_options(f):
    """The connection: the same keys as the config file, which they override."""
    opts = [
        click.option("--config", "config_path", type=click.Path(dir_okay=False),
                     help="Config file (default $XDG_CONFIG_HOME/spamnb/imap.toml, ~/.config/... when unset; "
                          "mode 0600): the keys below, so that you type none of them twice."),
        options("host", "port", "user", "password_file", "password_command", "security", "cafile",
                "force_plaintext", ("model_path", "imap")),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return store_option(f)


def _settings(config_path, extra, kw):
    """The account's settings: the options and the configuration's ``[imap]`` keys (the
    older imap.toml's too), as the one resolver gave them to the command; below them the
    keys of the file of this command's own ``--config FILE``."""
    from spamnb.delivery import imap

    options = {k: kw.pop(k) for k in _SETTING_KEYS}
    options.update(extra)
    options["model"] = kw.pop("model_path")
    try:
        if config_path is not None:  # one run's file, named by an option: read here, below the rest
            return imap.settings_from(imap.read_config(config_path, explicit=True), options)
        _private_imap_file()
        return imap.settings_from({}, options)
    except imap.ImapError as exc:
        raise click.ClickException(str(exc)) from None


def _private_imap_file():
    """The older imap.toml may say how to get the password: its values come through the
    configuration's layers, and the imap commands refuse it unless it is private (mode 0600),
    as they refuse a password file."""
    from spamnb.delivery import imap
    from spamnb.storage.locate import imap_config_path

    path = imap_config_path()
    try:
        imap.open_private(path, path, "config file").close()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise imap.ImapError(f"cannot read config file {path}: {exc.strerror or exc}") from None


@click.group()
def imap():
    """Filter and learn where the mail lives: an IMAP account.

    \b
    Example (~/.config/spamnb/imap.toml, mode 0600, holds host, user, password_command):
      spamnb imap train --ham INBOX --ham Archive --spam Junk
      spamnb imap filter --dry-run
      spamnb imap filter --watch
    """


@imap.command("train")
@options("ham", "spam")
@account_options
def train(ham, spam, config_path, store, **kw):
    """Train a new model from IMAP folders (read-only: no flag changes).

    Replaces the model file, as `spamnb train` does.
    """
    from spamnb.delivery import imap as lib
    from spamnb.model import SpamModel
    from spamnb.scale import parallel
    from spamnb.storage.where import own_backend

    s = _settings(config_path, {"ham": ham, "spam": spam}, kw)
    if not (s.ham and s.spam):
        raise click.UsageError("name the folders: --ham FOLDER and --spam FOLDER (or ham and spam in the config)")
    backend = _user_store(own_backend(s.model, store), s.user)
    tty = sys.stderr.isatty()

    def progress(folder, n, total):
        if tty and (n % 50 == 0 or n == total):
            click.echo(f"\rreading {folder}: {n}/{total}", err=True, nl=n == total)

    client = _connect(s)
    try:
        folders = [(f, "ham") for f in s.ham] + [(f, "spam") for f in s.spam]
        model = SpamModel()
        try:
            done = parallel.train(model, lib.training_items(client, folders, progress))
        except lib.connection_errors() as exc:
            raise click.ClickException(f"the connection failed while reading: {exc}; nothing was saved") from None
        except lib.ImapError as exc:
            raise click.ClickException(f"{exc}; nothing was saved") from None
    finally:
        _logout(client)
    ham_n, spam_n = (int(n) for n in model.messages)
    if not (ham_n and spam_n):
        raise click.ClickException("a model needs both ham and spam: "
                                   f"read {ham_n} ham and {spam_n} spam; nothing was saved")
    backend.replace(model)
    click.echo(f"trained on {ham_n} ham and {spam_n} spam from {s.host} "
               f"({done['unchanged']} copies counted once); saved to {backend.name}", err=True)


@imap.command("filter")
@options("folder", "junk", "unsure_folder")
@click.option("--watch", is_flag=True, help="Keep going: IDLE on the folder, a pass whenever mail arrives "
                                            "and every --interval seconds; reconnect after a drop.")
@options("interval", "learn_verdicts")
@click.option("--dry-run", is_flag=True, help="Say what it would move and learn; change nothing.")
@history_options
@account_options
@decision_options
@log_options(True)
@metrics_options
def filter_(folder, junk, unsure_folder, watch, interval, learn_verdicts, dry_run, config_path, store, decision,
            log_messages, log_format, log_to, metrics_address, metrics_allow, history, **kw):
    """Classify new messages, move spam to Junk, learn from your moves.

    Each pass: a message you moved into Junk is learned as spam; one spamnb
    filed in Junk (or the unsure folder) that you moved back to the folder is
    learned as ham; deleting from Junk teaches nothing. Then every message of
    the folder not classified yet gets the keyword $Junk or $NotJunk and spam
    moves to Junk. State (what was seen and filed) lives beside the model.

    A line per message on stderr (--no-log-messages: none); with --watch,
    --metrics HOST:PORT serves Prometheus metrics (see docs/admin.md).
    """
    from spamnb.delivery import imap as lib
    from spamnb.storage.modelfile import own_model_path
    from spamnb.storage.where import store_url

    s = _settings(config_path, {"folder": folder, "junk": junk, "unsure_folder": unsure_folder}, kw)
    own = own_model_path(s.model)
    state_path = lib.state_path(own)
    say = (lambda text: click.echo(f"(dry run) {text}", err=True)) if dry_run else (lambda text: click.echo(text, err=True))
    lock = run_alone(state_path, "spamnb imap filter")
    if metrics_address and not watch:
        raise click.UsageError("--metrics is for --watch")
    meter = metrics_from(metrics_address, metrics_allow)
    url = store_url(store, os.environ, s.model)
    beside = None if url else own  # a store's model has no file to sit beside
    rec = recorder(log_messages, log_format, log_to, meter,
                   None if dry_run else history_of(history, url=url, model_path=beside))
    listener = beat = None
    try:
        folders = {"spam": s.junk or "Junk", "unsure": s.unsure_folder}
        judge, learn = _judge_and_learn(s.model, learn_verdicts, decision, rec, s.user, store,
                                        lambda label: folders.get(label) or s.folder)
        if meter is not None:
            import threading

            listener = meter.listener()
            threading.Thread(target=listener.serve_forever, daemon=True).start()
            say(f"serving Prometheus metrics on {listener.where()}")

        def one_pass(client):
            # the state as on disk: a pass that failed half-way is redone from its last save
            out = lib.Filter(client, s, lib.State.load(state_path), judge, learn, say, dry_run=dry_run,
                             unscanned=lambda size: rec.error("too_big", f"over {lib.MAX_MESSAGE} bytes: left "
                                                              "where it is", via="imap", unscanned=True, size=size,
                                                              user=s.user), recorder=rec).run()
            say(out.summary())
            return out

        if watch:
            if url and not dry_run:  # a store's heartbeat, for the Site view of `spamnb web --store`
                beat = heartbeat(url, rec, f"imap {s.user}")
            _watch(s, one_pass, say, interval)
        else:
            client = _connect(s)
            try:
                if one_pass(client).failed:  # said per message; a cron job's status says it too
                    raise click.ClickException("some messages could not be filtered (see above): they are where "
                                               "they were, and the next pass tries them again")
            except lib.connection_errors() as exc:
                raise click.ClickException(f"the connection failed during the pass: {exc} (what was done is "
                                           "recorded; the next pass goes on from there)") from None
            finally:
                _logout(client)
    except lib.ImapError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        if listener is not None:
            listener.shutdown()
            listener.close()
        if beat is not None:
            beat.close()
        rec.close()
        os.close(lock)


def _user_store(backend, user):
    """With a store holding per-user models, the IMAP user's own; else ``backend``."""
    return backend.for_user(user) if backend.per_user and user else backend


class _Account:
    """The IMAP door's model (a :class:`spamnb.delivery.pipeline.Source`): the user's
    own once there is one, else the shared one (:func:`_judge_and_learn`'s ``current``).
    A verdict ``filter -u``'s rule learns is learned with the pass's moves, in one batch
    (:class:`spamnb.delivery.imap.Filter`): :meth:`learn` remembers it for that."""

    name = ""
    learns = False

    def __init__(self, current, learn_verdicts, own):
        self.current, self.learn_verdicts, self.own = current, learn_verdicts, own

    def read(self, raw):
        from spamnb.delivery.hook import message_tokens

        backend = self.current()
        self.learns = self.learn_verdicts and not backend.is_default
        model = backend.view()
        return model, message_tokens(model, raw)

    def learn(self, raw, label, toks, model):
        import hashlib

        self.own.add(hashlib.sha256(raw).digest())  # learned with the pass's batch, not as the user's move


def _judge_and_learn(model_path, learn_verdicts=True, decision=MODELS_OWN, rec=None, user=None, store=None,
                     folder=None):
    """``judge(raw) -> (label, p, learn)`` with the user's model as it is now (their
    own once they have one, else the default, or a store's shared model) under
    ``decision`` (a :class:`spamnb.verdict.Decision`), through the one pipeline
    (:func:`spamnb.delivery.pipeline.filter_one`), ``learn`` saying whether the verdict
    is learned as ``filter -u`` would learn it (never with the default model), and
    ``learn(items)`` into their own model (made from the default or shared one at the
    first correction, as `spamnb learn` does). ``rec``: the Recorder of each message and
    of each correction learned; ``folder(label)``: where a verdict files the message."""
    import hashlib

    from spamnb.delivery import pipeline
    from spamnb.delivery.events import NOTHING
    from spamnb.storage.modelfile import default_seed
    from spamnb.storage.where import open_backend, own_backend

    rec = rec or NOTHING
    mine = _user_store(own_backend(model_path, store), user).resident()
    shared = []  # the model judging until the user has one: opened once a run, not per message
    own = set()  # digests of the verdicts judge() said to learn: the others learn() gets are the user's moves

    def current():
        """The user's model once there is one, else the shared one. Both are resident
        backends that follow their model: a file's is reloaded when it changes, a
        store answers with the model pushed last. Only the default model is opened
        again, when its cache went (built again); another shared model that is
        missing says so when it is read."""
        if mine.exists():
            return mine
        if not shared or (shared[0].is_default and not shared[0].exists()):
            backend = open_backend(model_path, store, build_default=False)
            if not backend.exists():
                backend = open_backend(model_path, store, notice=notice)  # builds the default model once
            shared[:] = [backend.resident()]
        return shared[0]

    account = _Account(current, learn_verdicts, own)

    def judge(raw):
        out = pipeline.filter_one(raw, account, via="imap", decision=decision, learn=True, recorder=rec, user=user,
                                  folder=folder, headers=False)
        return out.label, out.decided.p, out.learned is not None

    def seed():
        shared = current()
        return default_seed() if shared.is_default else shared.model()

    def learn(items):
        """The pass's batch: its own verdicts (learned, not corrections) and the user's moves;
        what learning did to each item, in order (:func:`spamnb.mail.identity.tally`'s outcomes)."""
        moved = []  # per item: a move of the user's (a correction), else one of its verdicts
        for raw, _ in items:
            digest = hashlib.sha256(raw).digest()
            moved.append(digest not in own)
            own.discard(digest)
        outcomes = [None] * len(items)
        for is_move, records in ((False, None), (True, rec)):
            which = [i for i, m in enumerate(moved) if m == is_move]
            if which:
                done = pipeline.learn(mine, [items[i] for i in which], via="imap", recorder=records, user=user,
                                      create=seed, warn=notice)
                for i, outcome in zip(which, done["outcomes"]):
                    outcomes[i] = outcome
        return outcomes

    return judge, learn


def _watch(s, one_pass, say, interval):
    import signal

    from spamnb.delivery import imap as lib
    from spamnb.storage.store import ModelError

    def tolerant_pass(client):
        try:
            one_pass(client)
        except (ModelError, lib.StateError, lib.BadReply) as exc:  # a busy lock, a full disk: the next pass redoes this one
            say(f"pass not finished: {exc}; trying again at the next one")

    stopping = []
    previous = signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    try:
        lib.watch(lambda: lib.connect(s), tolerant_pass, say, interval=interval, stop=lambda: bool(stopping))
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    say("stopped")


def _connect(s):
    from spamnb.delivery import imap as lib

    try:
        return lib.connect(s)
    except lib.ImapError as exc:
        raise click.ClickException(str(exc)) from None


def _logout(client):
    try:
        client.logout()
    except Exception:  # noqa: BLE001 - a dropped connection cannot log out; nothing is lost
        pass
