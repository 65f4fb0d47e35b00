"""``spamnb filter`` (the delivery hook, the full way) and ``spamnb serve``."""

from __future__ import annotations

import os
import sys

import click

from spamnb import verdict
from spamnb.cli.options import (cutoffs, decision_options, history_of, history_options, log_options, metrics_from,
                                metrics_options, model_options, notice, open_backend, options, pass_through, recorder)
from spamnb.verdict import EXIT_CODES, EXIT_ERROR, Boundary, deliver_unchanged, model_name


class _FilterCommand(click.Command):
    """``filter`` never loses mail: a bad command line passes the message through too.

    Click rejects bad options (``--evidence abc``, a stray argument) while
    parsing, before the command body runs; it would then print usage, write
    nothing and exit 2, the *unsure* status. Here the message goes to stdout
    unchanged and the exit status is 3, as for any other error.
    """

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.ClickException as exc:
            pass_through(exc.format_message().rstrip("."))


@click.command("filter", cls=_FilterCommand)
@model_options
@options("exit_zero", "learn_", "evidence", "socket_path", command="filter")
@decision_options
@log_options(False)
@history_options
def filter_(model_path, store, allow_insecure_model, exit_zero, learn_, evidence, socket_path,
            cost_fp, cost_fn, cost_unsure, spam_cutoff, ham_cutoff, log_messages, log_format, log_to, history):
    """Filter one message from standard input to standard output.

    Adds X-Spam-Flag: YES (spam only) and X-Spam-Status: Yes|No, score=S
    required=T tests=SPAMNB_SPAM|SPAMNB_UNSURE|SPAMNB_HAM probability=... model=...
    version=... to the header, in SpamAssassin's form (S and T log-odds; unsure
    is No), after removing the verdict fields the message came with. Exit status as bogofilter's:
    0 spam, 1 ham, 2 unsure, 3 error (0 for all with --exit-zero). On any error
    (options, configuration, model, store) the message is written out unchanged,
    with one line on stderr: mail is never lost, nor held.

    Started as the `spamnb` program, it answers through a running `spamnb serve`
    when it can, else from the model's compiled scorer, else the full way:
    the output is the same whichever way answers. Each verdict is recorded in
    the history (see `spamnb web`): by the server when it answers, else here.

    Delivery agents run it with their own PATH, not yours (procmail:
    $HOME/bin:/usr/local/bin:/usr/bin:/bin; maildrop: /bin:/usr/bin:/usr/local/bin),
    so write spamnb's full path: replace /usr/local/bin/spamnb below with what
    `command -v spamnb` prints. No lock (:0, not :0:): a maildir needs none.

    \b
    Example, procmail (~/.procmailrc; `spamnb setup` writes it):
      MAILDIR=$HOME/Maildir/
      DEFAULT=$MAILDIR
      :0fw
      | /usr/local/bin/spamnb filter --exit-zero -u
      :0
      * ^X-Spam-Flag: YES
      .Junk/
      :0
      * ^X-Spam-Status: No, .*tests=SPAMNB_UNSURE
      .Unsure/

    \b
    maildrop (~/.mailfilter, mode 0600):
      xfilter "/usr/local/bin/spamnb filter --exit-zero -u"
      if (/^X-Spam-Flag: YES/)
      {
          to "$HOME/Maildir/.Junk/"
      }
      if (/^X-Spam-Status: No, .*tests=SPAMNB_UNSURE/)
      {
          to "$HOME/Maildir/.Unsure/"
      }
      to "$HOME/Maildir/"
    """
    got = {"raw": b""}

    def fail(reason, exc):
        if log_messages:  # the message goes on unscanned: its line says so
            try:
                recorder(True, log_format, log_to).error("failed", reason, via="filter", unscanned=True,
                                                         raw=got["raw"], user=_login())
            except Exception as exc2:  # noqa: BLE001 - a log line never costs a delivery
                click.echo(f"spamnb: warning: no log line: {exc2}", err=True)
        return deliver_unchanged(got["raw"], reason, exit_zero)

    with Boundary(fail, interrupts=True) as boundary:
        raw = got["raw"] = sys.stdin.buffer.read()
        out, label = _filter_message(raw, model_path, store, allow_insecure_model, learn_, evidence,
                                     (cost_fp, cost_fn, cost_unsure, spam_cutoff, ham_cutoff),
                                     recorder(log_messages, log_format, log_to), history)
    if boundary.result is not None:
        sys.exit(boundary.result)
    code = 0 if exit_zero else EXIT_CODES[label]
    try:
        sys.stdout.buffer.write(out)
        sys.stdout.buffer.flush()
    except (OSError, ValueError):
        code = EXIT_ERROR
    sys.exit(code)


def _filter_message(raw, model_path, store, allow_insecure_model, learn_, n_evidence, decision, rec, history=None):
    import time

    from spamnb.delivery.hook import LEARN_TIMEOUT, filter_verdict, not_learned

    start = time.perf_counter()
    backend = open_backend(model_path, store, allow_insecure_model)
    kept, pos, block, d = filter_verdict(backend.view(), raw, model_name(backend.short_name, backend.is_default),
                                         decision, n_evidence)
    out, label, learns = kept[:pos] + block + kept[pos:], d.label, d.learns
    learned = learn_ and learns and not backend.is_default
    if learned:
        from spamnb.storage.store import ModelError, lock_timeout

        try:
            backend.learn([(raw, label, None)], timeout=lock_timeout(LEARN_TIMEOUT), warn=notice)
        except ModelError as exc:  # the verdict stands: deliver it, unlearned
            click.echo(not_learned(exc), err=True)
            learned = False
    rec.message("filter", label, d.score, d.p, d.cutoffs, len(raw), time.perf_counter() - start, raw=raw,
                user=_login(), learned=label if learned else None, why="filter-u")
    try:
        where = history_of(history, backend)
    except click.ClickException as exc:  # the verdict stands: deliver it, unrecorded
        notice(f"history not recorded: {exc.format_message()}")
        where = None
    if where and not isinstance(where, str):  # the store's history: one round trip
        from spamnb.storage.store import ModelError

        try:
            where.record(raw, label, d.score, d.p, via="filter", learned=label if learned else None,
                         cutoffs=d.cutoffs)
        except ModelError as exc:
            notice(f"history not recorded: {exc}")
    elif where:  # now, not through rec's writer thread: this process ends with the message
        from spamnb.storage.history import record_now

        record_now(where, raw, label, d.score, d.p, via="filter", learned=label if learned else None,
                   cutoffs=d.cutoffs, log=notice)
    return out, label


def _login():
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


# -- serve -----------------------------------------------------------------------


@click.command()
@options("socket_path", command="serve")
@model_options
@options("max_bytes", "timeout", "max_connections", "pidfile", "spamd_addresses", ("allow", "spamd"), "user_models",
         "store_users", "allow_tell", "allow_tell_served", "spamd_max_bytes", "spamd_socket_mode")
@decision_options
@log_options(True)
@metrics_options
@history_options
@click.pass_context
def serve(ctx, socket_path, model_path, store, allow_insecure_model, max_bytes, timeout, max_connections, pidfile,
          spamd_addresses, allow, user_models, store_users, allow_tell, allow_tell_served, spamd_max_bytes,
          spamd_socket_mode, cost_fp, cost_fn, cost_unsure,
          spam_cutoff, ham_cutoff, log_messages, log_format, log_to, metrics_address, metrics_allow, history):
    """Keep the model loaded and filter messages for `spamnb filter`.

    `spamnb filter` uses the server when its socket is there and it serves the
    same model, and does the work itself otherwise, with the same result. The
    model is reloaded when its file changes (after learn, forget or train).
    Only your own processes may connect. Stops on SIGTERM or Ctrl-C.
    A socket folder that does not exist yet is made, mode 0700.

    With --spamd it also answers SpamAssassin's protocol (CHECK, SYMBOLS,
    REPORT, REPORT_IFSPAM, PROCESS, HEADERS, PING, SKIP, TELL) for spamc,
    Exim and Haraka; see docs/spamd.md. The decision options
    (and the [decision] table of the configuration files) override every
    model's cut-offs for spamd clients; `spamnb filter` sends its own.

    One line per message on stderr (--log-to syslog, --log-format json);
    Prometheus metrics with --metrics HOST:PORT. On SIGHUP (or `spamnb config
    reload`) it rereads the configuration files' [decision] table without
    dropping a connection; see docs/admin.md.

    To run it as a service: the systemd units in contrib/systemd/ (a user
    unit, and spamnb@USER.service for a mail host); see docs/delivery.md.

    \b
    Example:
      spamnb serve &
      spamnb filter --exit-zero < message.eml
      spamnb serve --spamd 127.0.0.1:783 --user-models /var/lib/spamnb/users --allow-tell
    """
    from spamnb import checks
    from spamnb.delivery.server import ServerError, serve as run_server
    from spamnb.storage.locate import default_socket_path

    # the checks `config --check` applies to the files' values (refused there with FILE:LINE)
    for option, check, value in (("--socket", checks.socket_path, socket_path), ("--pidfile", checks.pidfile, pidfile),
                                 ("--spamd-socket-mode", checks.socket_mode, spamd_socket_mode)):
        try:
            value and check(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint=option) from None
    mode = checks.socket_mode(spamd_socket_mode)
    if (allow or user_models or store_users or allow_tell or allow_tell_served) and not spamd_addresses:
        raise click.UsageError("--allow, --user-models, --store-users and --allow-tell are for --spamd "
                               "([spamd] listen)")
    if spamd_addresses:  # bad addresses and networks are refused before any model is loaded
        from spamnb.delivery.spamd import check_listening

        try:
            check_listening(spamd_addresses, allow)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
    decision = (cost_fp, cost_fn, cost_unsure, spam_cutoff, ham_cutoff)
    cutoffs(verdict.cutoffs_from_costs(*verdict.DEFAULT_COSTS), *decision)  # a bad decision: a usage error now
    meter = metrics_from(metrics_address, metrics_allow)
    backend = open_backend(model_path, store, allow_insecure_model)  # builds the default model if needed
    rec = recorder(log_messages, log_format, log_to, meter, history_of(history, backend))
    if rec.history is not None:
        notice(f"recording verdicts in {rec.history.path}")
    spamd_models = []
    others = None
    if spamd_addresses:
        from spamnb.delivery import spamd

        def others(backend, compactor, log):
            models = spamd.Models(backend, user_models, log, store_users=store_users, decision=decision,
                                  recorder=rec)
            spamd_models.append(models)
            return spamd.open_servers(spamd_addresses, models, allow=allow, max_bytes=max_bytes, timeout=timeout,
                                      allow_tell=allow_tell or allow_tell_served,
                                      tell_served=allow_tell_served, unix_mode=mode, max_connections=max_connections,
                                      compactor=compactor, log=log,
                                      max_length=spamd_max_bytes or spamd.MAX_LENGTH)

    def reload():
        new = reread_decision(ctx)
        for models in spamd_models:
            models.decision = new  # one assignment: a request in flight keeps the tuple it read
        return f"configuration reread; decision {_shown(new)}"

    try:
        run_server(socket_path or default_socket_path(), backend, max_bytes=max_bytes, timeout=timeout,
                   pidfile=pidfile, max_connections=max_connections, others=others, recorder=rec, reload=reload,
                   metrics=meter and meter.listener)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    except ServerError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"cannot listen: {exc.strerror or exc}") from None
    finally:
        rec.close()


def reread_decision(ctx):
    """The decision of a running command after its configuration files changed, from
    the one resolver (:func:`spamnb.storage.settings.resolve`): the options given on
    its command line, else the environment and the files now. The files' keys this
    command takes are checked first (a bad ``[imap]`` key is not serve's): an error
    keeps the decision in force."""
    from click.core import ParameterSource

    from spamnb.cli.config import describe, problems
    from spamnb.storage import settings

    root = ctx.find_root()
    layers = settings.Layers.load(named=root.params.get("config_file"))
    command = " ".join(ctx.command_path.split()[1:])
    found = problems(root.command, layers, command.split()[0])
    if found:
        raise settings.ConfigError(describe(found[0]))
    given = {n: ctx.params[n] for n in verdict.DECISION_OPTIONS
             if ctx.get_parameter_source(n) == ParameterSource.COMMANDLINE}
    fresh = settings.resolve(command, given, layers=layers, names=verdict.DECISION_OPTIONS)
    out = tuple(fresh[n].value for n in verdict.DECISION_OPTIONS)
    cutoffs(verdict.cutoffs_from_costs(*verdict.DEFAULT_COSTS), *out)
    return out


def _shown(decision):
    given = [f"{k}={v:g}" for k, v in zip(verdict.DECISION_OPTIONS, decision) if v is not None]
    return ", ".join(given) or "the model's cut-offs"
