"""``spamnb config``: the configuration file's keys, from the table of settings.

:data:`KEYS` is :data:`spamnb.options.TABLE`'s keys: ``(table, key)`` -> the click
parameter it sets and the commands that have it. A file's value has its row's kind,
choices and bounds and passes the key's check in :data:`spamnb.checks.CHECKS`
(:func:`spamnb.options.check`), and the rules of :data:`~spamnb.checks.TOGETHER`: what
the commands that take the key apply at start (:func:`applies`). A command's values come
from :func:`spamnb.storage.settings.resolve`, once per run
(:func:`spamnb.cli.options.take_settings`): the layers, their order and the units.

To add a key: one row in :mod:`spamnb.options`.
"""

from __future__ import annotations

import os
import sys

import click

from spamnb import checks
from spamnb import options as table_
from spamnb.cli.options import LAYERS, pass_through
from spamnb.options import DECIDING, EVERY, IMAP, LOGGING, METRICS  # noqa: F401 - the commands' groups
from spamnb.storage import settings
from spamnb.verdict import DECISION_OPTIONS

#: (table, key) -> (parameter name, commands): the keys of :data:`spamnb.options.TABLE`.
KEYS = {(r.table, r.key): (r.name, r.commands) for r in table_.TABLE if r.table}


def commands(group):
    """``{"serve": cmd, "imap filter": cmd, ...}``: every command under ``group``."""
    out = {}
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            out.update({f"{name} {k}": v for k, v in commands(cmd).items()})
        else:
            out[name] = cmd
    return out


def targets(group, table, key):
    """``[(command path, click.Parameter)]`` that a key sets."""
    name, where = KEYS[(table, key)]
    out = []
    for path, cmd in commands(group).items():
        if where != EVERY and path not in where:
            continue
        out += [(path, p) for p in cmd.params if p.name == name]
    return out


def check_value(table, key, value):
    """A file's ``value`` for a key as the command takes it; ValueError saying what is
    wrong: :func:`spamnb.options.check`, what the command checks at start."""
    return table_.check(table_.BY_KEY[(table, key)], value)


#: Keys whose check at start (:data:`spamnb.checks.CHECKS`) is made by fewer of the commands
#: that take them: ``filter`` asks a server only on a socket in a private folder, and
#: filters the message itself otherwise.
CHECKED_BY = {("serve", "socket"): ("serve",)}


def _under(path, command):
    return path == command or path.startswith(command + " ")


def applies(group, table, key, command):
    """Whether the key's value is checked when ``command`` runs (a command's first word:
    ``"imap"`` for ``imap train`` and ``imap filter``): only a command that takes the key
    refuses its bad value, so a bad ``[imap]`` key never stops ``filter`` from filtering.
    Every key when ``command`` is None (``config --check``)."""
    if command is None:
        return True
    only = CHECKED_BY.get((table, key))
    return any(_under(path, command) and (only is None or path in only) for path, _ in targets(group, table, key))


def problems(group, layers, command=None):
    """``[(path, line, text)]`` of every key of ``layers`` that is unknown, of a wrong type or out of range,
    and of a ``[decision]`` table that makes no decision; with ``command``, of the keys that
    command takes only (:func:`applies`), unknown keys and tables always."""
    from spamnb import verdict

    out = []
    tables = {t for t, _ in KEYS}
    for path, table, key, value, line, table_line in layers.items():
        if table not in tables:
            problem = (path, table_line, f"unknown table [{table}] (known: {', '.join(sorted(tables))})")
            if problem not in out:
                out.append(problem)
        elif key is None:
            out.append((path, line, f"{table} must be a table ([{table}])"))
        elif (table, key) not in KEYS:
            known = ", ".join(k for t, k in KEYS if t == table)
            out.append((path, line, f"unknown key {key!r} in [{table}] (known: {known})"))
        elif applies(group, table, key, command):
            try:
                check_value(table, key, value)
            except ValueError as exc:
                out.append((path, line, f"[{table}] {key}: {exc}"))
    if not out and (command is None or applies(group, "model", "path", command)):
        out += layers.conflicts()  # two places for the model in one layer
    if not out:
        for keys, check in checks.TOGETHER:
            first = layers.where(*keys[0])
            if first is not None and applies(group, *keys[0], command):
                try:
                    check(first[0], *(layers.get(*k) for k in keys[1:]))
                except ValueError as exc:
                    out.append((first[2], first[3], f"[{keys[0][0]}] {keys[0][1]}: {exc}"))
    if not out and applies(group, "decision", DECISION_OPTIONS[0], command):
        try:
            settings.decision(layers).check()
        except settings.ConfigError:  # a value of a wrong type, a conflict: reported above
            pass
        except (verdict.DecisionError, TypeError) as exc:
            found = [w for k in DECISION_OPTIONS if (w := layers.where("decision", k))]
            path, line = max(((w[2], w[3] or 0) for w in found), key=lambda w: w[1], default=("?", None))
            out.append((path, line, f"[decision] {exc}"))
    return out


def describe(problem):
    path, line, text = problem
    return f"{path}:{line}: {text}" if line else f"{path}: {text}"


def load(ctx, named):
    """Read the files and check the keys the command takes (a broken file is an error;
    for ``filter``: the message passes through, as for any other error), for the one
    resolver to give the command its values (:func:`spamnb.cli.options.take_settings`)."""
    try:
        stamped = settings.stamps(named=named)
        layers = settings.Layers.load(named=named)
        found = problems(ctx.command, layers, ctx.invoked_subcommand)
        if found:
            raise settings.ConfigError(describe(found[0]))
        ctx.meta[LAYERS] = layers  # the one resolver's layers for the command (options.resolved)
        if named is None and layers.layers and settings.read_cache() is None and not problems(ctx.command, layers):
            settings.write_cache(layers, stamped)  # every key checked: the fast paths may use any of them
    except settings.ConfigError as exc:
        if ctx.invoked_subcommand == "filter":
            pass_through(str(exc))
        raise ConfigProblem(str(exc)) from None
    imap_file = next((path for source, path, *_ in layers.layers if source == settings.IMAP_FILE), None)
    if imap_file and ctx.invoked_subcommand == "imap":
        click.echo(f"spamnb: note: {imap_file} is read as the [imap] table of "
                   f"{os.path.join(os.path.dirname(imap_file), 'config.toml')}; move its keys there", err=True)


class ConfigProblem(click.ClickException):
    exit_code = 2


def _toml(value):
    import json

    if isinstance(value, str) and checks.is_store_url(value):  # its password is never shown
        value = checks.redact(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))


ALL_FILES = "\0all"  # --check without FILE


@click.group("config", invoke_without_command=True)
@click.option("--check", "check_", is_flag=False, flag_value=ALL_FILES, default=None, metavar="[FILE]",
              help="Check the files read (or FILE only) and exit: 0 when good, 2 naming FILE:LINE for each "
                   "unknown key, wrong type, value out of range or value a command would refuse at start "
                   "(docs/admin.md).")
@click.option("--command", "command_line", metavar="'COMMAND [OPTIONS]'",
              help="Show the settings of this command line instead, its options too "
                   "(e.g. --command 'serve --spamd 783').")
@click.pass_context
def config(ctx, check_, command_line):
    """Show every setting and where it comes from; check configuration files.

    \b
    Files, later ones winning key by key:
      /etc/spamnb/spamnb.toml                      (the system file)
      $XDG_CONFIG_HOME/spamnb/config.toml          (yours; ~/.config/spamnb/...)
      the file of `spamnb --config FILE` or $SPAMNB_CONFIG
    then the environment's variables that set a setting (spamnb(1),
    ENVIRONMENT), then each command's options.
    See docs/admin.md.

    \b
    Examples:
      spamnb config
      spamnb config --check /etc/spamnb/spamnb.toml
      spamnb config --command 'serve --max-bytes 1000000'
      spamnb config reload            # a running `spamnb serve` rereads them
    """
    if ctx.invoked_subcommand is not None:
        return
    group = ctx.find_root().command
    named = ctx.find_root().params.get("config_file")
    file = None if check_ in (None, ALL_FILES) else check_
    stamped = settings.stamps(named=named)
    try:
        if file:
            tables, lines = settings.read(file, must_exist=True)
            layers = settings.Layers([(settings.NAMED, file, tables, lines)], env={})
        else:
            layers = settings.Layers.load(named=named)
    except settings.ConfigError as exc:
        click.echo(f"spamnb: error: {exc}", err=True)
        sys.exit(2)
    found = problems(group, layers)
    for p in found:
        click.echo(f"spamnb: error: {describe(p)}", err=True)
    if found:
        sys.exit(2)
    if not file and named is None and layers.layers:
        settings.write_cache(layers, stamped)  # checked: the fast filter path may use them
    if check_:
        names = [p for _, p, *_ in layers.layers] or ["no configuration file"]
        click.echo(f"{', '.join(names)}: ok")
        return
    click.echo("# read: " + (", ".join(f"{s} {p}" for s, p, *_ in layers.layers) or "no configuration file"))
    if command_line:
        _show_command(group, layers, command_line)
        return
    table = None
    for (t, key) in KEYS:
        if t != table:
            click.echo(f"\n[{t}]")
            table = t
        where = layers.where(t, key)
        if where is None:
            defaults = {}
            for path, param in targets(group, t, key):
                default = param.get_default(click.Context(commands(group)[path]))
                shown = _toml(default) if isinstance(default, (str, int, float, list, tuple)) and default not in \
                    ((), []) else None
                defaults.setdefault(shown, []).append(path)
            if len(defaults) > 1:
                click.echo(f"# {key}: default " + "; ".join(f"{v or 'unset'} for {', '.join(p)}"
                                                           for v, p in defaults.items()))
            elif next(iter(defaults)) is None:
                click.echo(f"# {key}: unset (default)")
            else:
                click.echo(f"{key} = {next(iter(defaults))}  # default")
        else:
            value, source, path, line = where
            at = f"{path}:{line}" if line else path
            click.echo(f"{key} = {_toml(value)}  # {source} {at}")
    _notes(layers)


def _notes(layers, given=()):
    """Which model location wins and why; whether ``[decision]`` overrides stored cut-offs."""
    click.echo("\n# " + settings.location(layers, [f for f in given if f in ("--model", "--store")]))
    note = settings.decision_note(layers, [f for f in given if f.lstrip("-").replace("-", "_") in DECISION_OPTIONS])
    if note:
        click.echo(f"# {note}")


def _show_command(group, layers, command_line):
    """Each key of one command line: its value, and whether an option, a file,
    the environment or the default set it."""
    import shlex

    from click.core import ParameterSource

    words = shlex.split(command_line)
    ctx = click.Context(group, info_name="spamnb")
    cmd, path = group, []
    while isinstance(cmd, click.Group) and words and words[0] in cmd.commands:
        path.append(words.pop(0))
        cmd = cmd.commands[path[-1]]
        if isinstance(cmd, click.Group):
            ctx = click.Context(cmd, info_name=path[-1], parent=ctx)
    if isinstance(cmd, click.Group) or not path:
        raise click.UsageError(f"--command {command_line!r}: name a command, e.g. 'serve'")
    # click.Command's own parsing: filter's would deliver standard input on a bad option
    sub = click.Command.make_context(cmd, path[-1], words, parent=ctx)
    here = " ".join(path)
    options = {n: v for n, v in sub.params.items() if sub.get_parameter_source(n) == ParameterSource.COMMANDLINE}
    try:  # the values the command will use: the one resolver's
        found = settings.resolve(here, options, env=layers.env, layers=layers)
    except settings.ConfigError as exc:
        raise ConfigProblem(str(exc)) from None
    except ValueError as exc:  # options that exclude each other
        raise click.UsageError(f"--command {command_line!r}: {exc}") from None
    table = None
    for (t, key) in KEYS:
        params = [p for p_path, p in targets(group, t, key) if p_path == here]
        if not params:
            continue
        if t != table:
            click.echo(f"\n[{t}]")
            table = t
        name = params[0].name
        value, setting, where = sub.params.get(name), found.get(name), layers.where(t, key)
        if name in options:
            said = "option"
        elif setting is not None and setting.source == settings.OPTION:  # another option of its unit
            value, said = None, f"{setting.where} (option) replaces it"
        elif where is not None:
            value, said = where[0], f"{where[1]} {where[2]}" + (f":{where[3]}" if where[3] else "")
        else:
            said = "default"
        if value is None or value == () or value == []:
            click.echo(f"# {key}: unset ({said})")
        else:
            click.echo(f"{key} = {_toml(list(value) if isinstance(value, tuple) else value)}  # {said}")
    given = [p.opts[0] for p in cmd.params if isinstance(p, click.Option)
             and sub.get_parameter_source(p.name) == ParameterSource.COMMANDLINE]
    _notes(layers, given)


@config.command("reload")
@click.option("--socket", "socket_path", metavar="PATH",
              help="The server's private socket (default as `spamnb serve`'s).")
@click.option("--pidfile", metavar="PATH", help="Or the server's --pidfile.")
def reload(socket_path, pidfile):
    """Make a running `spamnb serve` reread its configuration (as SIGHUP does).

    Finds the server by its pid file, else by its socket (the server's
    process, checked to be yours), and sends it SIGHUP. Without systemd.
    """
    import signal

    from spamnb.delivery.server import server_pid

    try:
        pid = server_pid(socket_path=socket_path, pidfile=pidfile)
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"no server to reload: {exc}") from None
    os.kill(pid, signal.SIGHUP)
    click.echo(f"asked spamnb serve (pid {pid}) to reread its configuration", err=True)
