"""``spamnb filter`` (the delivery hook, the full way) and ``spamnb serve``."""

from __future__ import annotations

import sys

import click

from spamnb.cli.options import (checked, decision_options, heartbeat, history_of, history_options, log_options,
                                metrics_from, metrics_options, model_options, notice, open_backend, options,
                                pass_through, recorder)
from spamnb.verdict import filtered_status, write_out


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
            decision, log_messages, log_format, log_to, history):
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
    from spamnb.delivery import fastfilter, pipeline

    opts = {"learn_": learn_, "evidence": evidence, "log_messages": log_messages, "log_format": log_format,
            "log_to": log_to, **decision.given()}
    got = {"raw": None, "exit_zero": exit_zero, "opts": opts}
    with fastfilter.filter_boundary(got, note=notice) as boundary:  # the same boundary as the fast path's
        raw = got["raw"] = sys.stdin.buffer.read()
        backend = open_backend(model_path, store, allow_insecure_model)
        out, label = fastfilter.filter_here(raw, pipeline.BackendSource(backend, warn=notice), opts,
                                            fastfilter.recorder_for(opts, _history(history, backend)))
    if boundary.result is not None:
        sys.exit(boundary.result)
    sys.exit(write_out(out, filtered_status(label, exit_zero)))


def _history(history, backend):
    """Where ``filter`` records its verdict now (the history unit, :func:`history_of`):
    a writer of the file or of the store's history, None for none. A history that
    cannot be used is a note: the verdict stands, delivered unrecorded."""
    try:
        where = history_of(history, backend)
    except click.ClickException as exc:
        notice(f"history not recorded: {exc.format_message()}")
        return None
    if where and not isinstance(where, str):  # the store's history: one round trip
        from spamnb.storage import redishistory

        return redishistory.Now(where, notice)
    if where:  # now, not through a writer thread: this process ends with the message
        from spamnb.storage.history import Now

        return Now(where, notice)
    return None


# -- serve -----------------------------------------------------------------------


@click.command()
@options("socket_path", command="serve")
@model_options
@options("max_bytes", "timeout", "max_connections", "pidfile", "spamd_addresses", ("allow", "spamd"), "user_models",
         "store_users", "allow_tell", "allow_tell_served", "spamd_max_bytes", "spamd_socket_mode",
         "spamd_trusted_users", "milter_addresses", "milter_reject", "milter_on_error")
@decision_options
@log_options(True)
@metrics_options
@history_options
@click.pass_context
def serve(ctx, socket_path, model_path, store, allow_insecure_model, max_bytes, timeout, max_connections, pidfile,
          spamd_addresses, allow, user_models, store_users, allow_tell, allow_tell_served, spamd_max_bytes,
          spamd_socket_mode, spamd_trusted_users, milter_addresses, milter_reject, milter_on_error, decision, log_messages, log_format, log_to, metrics_address, metrics_allow, history):
    """Keep the model loaded and filter messages for `spamnb filter`.

    `spamnb filter` uses the server when its socket is there and it serves the
    same model, and does the work itself otherwise, with the same result. The
    model is reloaded when its file changes (after learn, forget or train).
    Only your own processes may connect. Stops on SIGTERM or Ctrl-C.
    A socket folder that does not exist yet is made, mode 0700.

    With --milter it speaks the milter protocol for Postfix (smtpd_milters)
    and Sendmail (INPUT_MAIL_FILTER): each message gets X-Spam-Status (and
    X-Spam-Flag: YES when spam), or with --milter-reject a spam is refused
    with 550 5.7.1; see docs/admin.md. With --spamd it also answers
    SpamAssassin's protocol (CHECK, SYMBOLS, REPORT, REPORT_IFSPAM, PROCESS,
    HEADERS, PING, SKIP, TELL) for spamc, Exim and Haraka; see docs/spamd.md.
    The decision options (and the [decision] table of the configuration
    files) override every model's cut-offs for spamd and milter clients;
    `spamnb filter` sends its own.

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
      spamnb serve --milter 127.0.0.1:11332 --user-models /var/lib/spamnb/users
    """
    from spamnb.delivery.server import ServerError, open_listeners, serve as run_server
    from spamnb.storage.locate import default_socket_path

    mode = _checked_serve_options(
        socket_path=socket_path, pidfile=pidfile, spamd_socket_mode=spamd_socket_mode,
        spamd_trusted_users=spamd_trusted_users, spamd_addresses=spamd_addresses, milter_addresses=milter_addresses,
        allow=allow, user_models=user_models, store_users=store_users, allow_tell=allow_tell,
        allow_tell_served=allow_tell_served, milter_reject=milter_reject, milter_on_error=milter_on_error)
    checked(decision)  # a bad decision: a usage error now
    meter = metrics_from(metrics_address, metrics_allow)
    backend = open_backend(model_path, store, allow_insecure_model)  # builds the default model if needed
    rec = recorder(log_messages, log_format, log_to, meter, history_of(history, backend))
    if rec.history is not None:
        notice(f"recording verdicts in {rec.history.path}")
    spamd_models = []
    others = None
    if spamd_addresses or milter_addresses:
        from spamnb.delivery import milter, spamd
        from spamnb.delivery.usermodels import Models

        def others(backend, compactor, log):
            # one set of models for both doors: one cache of users' models, one decision to reload
            models = Models(backend, user_models, log, store_users=store_users, decision=decision,
                                  recorder=rec)
            spamd_models.append(models)
            return open_listeners(
                allow,
                spamd.listening(spamd_addresses or (), models, max_bytes=max_bytes, timeout=timeout,
                                allow_tell=allow_tell or allow_tell_served, tell_served=allow_tell_served,
                                unix_mode=mode, max_connections=max_connections, compactor=compactor, log=log,
                                spamd_max_bytes=spamd_max_bytes, trusted_users=spamd_trusted_users or ()),
                milter.listening(milter_addresses or (), models, limit=min(max_bytes, spamd_max_bytes),
                                 timeout=timeout, reject=milter_reject, on_error=milter_on_error, unix_mode=mode,
                                 max_connections=max_connections, log=log, trusted_users=spamd_trusted_users or ()))

    def reload():
        new = reread_decision(ctx)
        for models in spamd_models:
            models.decision = new  # one assignment: a request in flight keeps the decision it read
        return f"configuration reread; decision {new.shown()}"

    beats = []  # a store's heartbeat (the Site view of `spamnb web --store`), once every listener listens
    try:
        run_server(socket_path or default_socket_path(), backend, max_bytes=max_bytes, timeout=timeout,
                   pidfile=pidfile, max_connections=max_connections, others=others, recorder=rec, reload=reload,
                   metrics=meter and meter.listener, ready=lambda: beats.append(heartbeat(backend, rec, "serve")))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    except ServerError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"cannot listen: {exc.strerror or exc}") from None
    finally:
        for beat in filter(None, beats):
            beat.close()
        rec.close()


def _checked_serve_options(*, socket_path, pidfile, spamd_socket_mode, spamd_trusted_users, spamd_addresses,
                           milter_addresses, allow, user_models, store_users, allow_tell, allow_tell_served,
                           milter_reject, milter_on_error):
    """``serve``'s options checked before any model is loaded: each value by the check
    `config --check` applies to the files' (refused there with FILE:LINE), the options that
    need a door given with it, the listen addresses and networks. The Unix sockets' mode."""
    from spamnb import checks
    from spamnb.delivery.server import check_listening

    for option, check, value in (("--socket", checks.socket_path, socket_path), ("--pidfile", checks.pidfile, pidfile),
                                 ("--spamd-socket-mode", checks.socket_mode, spamd_socket_mode),
                                 ("--spamd-trusted-user", checks.each(checks.local_user), spamd_trusted_users)):
        try:
            value and check(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint=option) from None
    if (allow or user_models or store_users) and not (spamd_addresses or milter_addresses):
        raise click.UsageError("--allow, --user-models and --store-users are for --spamd ([spamd] listen) "
                               "and --milter ([milter] listen)")
    if (allow_tell or allow_tell_served) and not spamd_addresses:
        raise click.UsageError("--allow-tell is for --spamd ([spamd] listen)")
    if (milter_reject or milter_on_error != "accept") and not milter_addresses:
        raise click.UsageError("--milter-reject and --milter-on-error are for --milter ([milter] listen)")
    for addresses, option in ((spamd_addresses, "--spamd"), (milter_addresses, "--milter")):
        if addresses:
            try:
                check_listening(addresses, allow, option)
            except ValueError as exc:
                raise click.UsageError(str(exc)) from None
    return checks.socket_mode(spamd_socket_mode)


def reread_decision(ctx):
    """The decision of a running command after its configuration files changed, from
    the one resolver (:func:`spamnb.storage.settings.resolve`): the options given on
    its command line, else the environment and the files now. The files' keys this
    command takes are checked first (a bad ``[imap]`` key is not serve's): an error
    keeps the decision in force."""
    from click.core import ParameterSource

    from spamnb.cli.config import describe, problems
    from spamnb.storage import settings
    from spamnb.verdict import DECISION_OPTIONS

    root = ctx.find_root()
    layers = settings.Layers.load(named=root.params.get("config_file"))
    command = " ".join(ctx.command_path.split()[1:])
    found = problems(root.command, layers, command.split()[0])
    if found:
        raise settings.ConfigError(describe(found[0]))
    given = {n: ctx.params[n] for n in DECISION_OPTIONS if ctx.get_parameter_source(n) == ParameterSource.COMMANDLINE}
    return checked(settings.decision(layers, command, given))
