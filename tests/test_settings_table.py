"""The table of settings (spamnb/options.py) against everything built from it or beside
it: the click options, the configuration's keys, the fast path's parser, the wire
fields and the man pages. A row changed in one place and not the other fails here."""

from __future__ import annotations

import click
import pytest

from spamnb import checks, options
from spamnb.cli import main
from spamnb.cli.config import KEYS, commands
from spamnb.delivery import fastfilter, wire

COMMANDS = commands(main)
KIND = {"int": click.types.IntParamType, "float": click.types.FloatParamType, "choice": click.Choice,
        "bool": click.types.BoolParamType}


def params(command):
    return {p.name: p for p in COMMANDS[command].params if isinstance(p, click.Option)}


@pytest.mark.parametrize("row", options.TABLE, ids=repr)
def test_each_row_is_its_commands_option(row):
    taking = [c for c in COMMANDS if row.takes(c) and row.name in params(c)]
    assert taking, f"no command takes {row}"
    if row.commands != options.EVERY:
        assert set(taking) == set(row.commands), row
    for command in taking:
        p = params(command)[row.name]
        assert tuple(p.opts) == row.flags, (command, row)
        assert tuple(p.secondary_opts) == ((row.off,) if row.off else ()), (command, row)
        assert p.multiple == (row.kind == "list"), (command, row)
        if row.kind in KIND:
            assert isinstance(p.type, KIND[row.kind]), (command, row, p.type)
        if row.kind == "choice":
            assert tuple(p.type.choices) == row.choices
        if row.default is not None and row.kind != "bool":
            assert p.default == row.default, (command, row)


def test_the_keys_are_the_tables_and_each_check_is_there():
    assert KEYS == {(r.table, r.key): (r.name, r.commands) for r in options.TABLE if r.table}
    for r in options.TABLE:
        assert (r.check is not None) == ((r.table, r.key) in checks.CHECKS), r
    assert set(checks.CHECKS) <= set(options.BY_KEY)


@pytest.mark.parametrize("command", sorted(options.PER_INVOCATION))
def test_every_option_of_a_site_command_has_a_key_or_a_reason(command):
    """Every option a site would set has a key; the others are per invocation, with why."""
    keyed = {f for r in options.TABLE if r.table and r.takes(command) for f in r.flags}
    for name, p in params(command).items():
        if name == "help":
            continue
        assert p.opts[0] in keyed or p.opts[0] in options.PER_INVOCATION[command], (command, p.opts)
    for flag, why in options.PER_INVOCATION[command].items():
        assert why and flag not in keyed


def test_the_fast_path_parses_every_filter_option_of_the_table():
    for r in options.TABLE:
        if not r.takes("filter"):
            continue
        if r.kind == "bool":
            args = [r.flags[0]]
        else:
            args = [r.flags[0], {"int": "3", "float": "0.5", "choice": (r.choices or ("x",))[0]}.get(r.kind, "/x")]
        assert r.name in options.parse(args, "filter"), r
        assert (fastfilter.parse_args(args) is None) == (r.name not in fastfilter.FAST), r
    with pytest.raises(ValueError, match="--spam-cutoff x: not a number"):
        options.parse(["--spam-cutoff", "x"], "filter")
    with pytest.raises(ValueError, match="--model or --store"):
        options.parse(["--model", "m", "--store", "redis://h/0"], "filter")


def test_the_wire_carries_the_rows_that_travel():
    """Every setting that travels goes through the wire's own encoder and decoder: a
    request with each of them set (to a value of its own) decodes to the same values,
    and one with none of them to none."""
    import socket

    assert set(wire.FIELDS) == set(options.TRAVELS)
    given = {name: (True if options.rows_of("filter")[name].kind == "bool" else 0.125 * (i + 1))
             for i, name in enumerate(options.TRAVELS)}
    for values in (given, {}):
        a, b = socket.socketpair()
        with a, b:
            wire.send_all(a, wire.encode_settings("/m/model.joblib", "model", b"Subject: x\n\nbody", values))
            header, n = wire.read_request_head(b, 1 << 20)
            assert wire.recv_exact(b, n) == b"Subject: x\n\nbody"
        decoded = wire.settings_of(header)
        assert set(decoded) == set(options.TRAVELS)
        for name in options.TRAVELS:
            assert decoded[name] == values.get(name, False if isinstance(given[name], bool) else None), name
    with pytest.raises(ValueError, match="evidence"):
        wire.encode_settings("/m", "m", b"", {"evidence": 3})


def test_the_man_pages_show_every_option_of_the_table():
    from pathlib import Path

    man = Path(__file__).parent.parent / "man"
    if not man.is_dir():
        pytest.skip("no man pages in this tree")
    for r in options.TABLE:
        for command in COMMANDS:
            if r.takes(command) and r.name in params(command):
                page = man / f"spamnb-{command.replace(' ', '-')}.1"
                if page.exists():
                    assert r.flags[0].replace("-", "\\-") in page.read_text() or r.flags[0] in page.read_text(), \
                        (page, r)


@pytest.mark.parametrize("row", [r for r in options.TABLE if r.low is not None or r.high is not None], ids=repr)
def test_a_rows_bounds_are_the_files_the_fast_paths_and_clicks(row):
    """A number's bounds are its row's: a file's value (the check at start, ``config
    --check``), the fast paths' parser and the click option all refuse just outside them,
    with the same sentence."""
    command = next(c for c in COMMANDS if row.takes(c) and row.name in params(c))
    option = params(command)[row.name]
    step = 1 if row.kind == "int" else 0.01
    for bound, outside in ((row.low, -step), (row.high, step)):
        if bound is None:
            continue
        assert options.check(row, bound) == bound
        assert option.type.convert(str(bound), option, None) == bound
        with pytest.raises(ValueError) as file_error:
            options.check(row, bound + outside)
        with pytest.raises(click.BadParameter) as click_error:
            option.type.convert(str(bound + outside), option, None)
        assert str(file_error.value) in str(click_error.value)
        with pytest.raises(ValueError, match=f"{row.flags[0]} {bound + outside}: {file_error.value}"):
            options.parse([row.flags[0], str(bound + outside)], command)


def test_the_code_takes_its_defaults_from_the_rows():
    """A default is its row's: the server's limits, and spamd's largest message."""
    from spamnb.delivery import server, spamd

    assert server.MAX_BYTES == options.BY_KEY[("serve", "max_bytes")].default
    assert server.TIMEOUT == options.BY_KEY[("serve", "timeout")].default
    assert server.MAX_CONNECTIONS == options.BY_KEY[("serve", "max_connections")].default
    assert spamd.SPAMD_MAX_BYTES == options.BY_KEY[("spamd", "max_bytes")].default


def test_no_check_restates_a_rows_kind_choices_or_bounds():
    """A key's entry in checks.CHECKS is for what its row cannot say: a row with bounds or
    choices and nothing more has none, and a wrong type is the row's to refuse."""
    for row in options.TABLE:
        if row.check is None:
            continue
        assert row.kind not in ("int", "float", "choice", "bool"), row
    assert not hasattr(checks, "integer") and not hasattr(checks, "one_of")


def test_the_command_line_converts_as_the_table_does():
    """One conversion per kind: click's option, the fast paths' parser and a file's value."""
    for row in [r for r in options.TABLE if r.kind in ("int", "float", "choice")]:
        command = next(c for c in COMMANDS if row.takes(c) and row.name in params(c))
        option = params(command)[row.name]
        for text in ("x", "1_0", " 7 ", "-3", "nan", *row.choices, "XML"):
            try:
                want = options.within(row, options.convert(row, text, text=True))
            except ValueError:
                want = None
            try:
                got = option.type.convert(text, option, None)
            except click.BadParameter:
                got = None
            try:
                parsed = options.parse([row.flags[0], text], command)[row.name]
            except ValueError:
                parsed = None
            assert str(got) == str(want) == str(parsed), (row, text, got, want, parsed)


@pytest.mark.parametrize("command", sorted(options.SWITCHES))
def test_the_parsers_switches_are_options_without_a_key(command):
    """The per-invocation options the table's parser reads (learn's --spam/--ham) are the
    command's, listed in PER_INVOCATION with why they have no key."""
    for flag in options.SWITCHES[command]:
        assert flag in options.PER_INVOCATION[command]
        assert any(flag in p.opts for p in params(command).values()), (command, flag)


def test_fast_learn_reads_its_command_line_with_the_tables_parser():
    from spamnb.delivery import fastlearn
    from spamnb.storage import settings

    def parsed(args, command="learn", layers=None):
        out = fastlearn.parse_args(args, command, {}, layers or settings.Layers([], {}))
        return out and ((out[0]["label"], out[0]["model_path"], bool(out[0]["no_history"])), out[1])

    assert parsed(["--spam", "a", "--model", "m", "b"]) == (("spam", "m", False), ["a", "b"])
    assert parsed(["--model=m", "--ham", "a"], "forget") == (("ham", "m", False), ["a"])
    assert parsed(["--ham", "a"]) == (("ham", None, False), ["a"])
    assert parsed(["--spam", "--no-history", "a"]) == (("spam", None, True), ["a"])
    for declined in (["--spam"], ["a"], ["--spam", "--ham", "a"], ["--spam", "--spam", "a"], ["--spam=x", "a"],
                     ["--spam", "a", "--model"], ["--spam", "--model", "m", "--model", "n", "a"],
                     ["--spam", "-r", "a"], ["--spam", "--store", "redis://h/0", "a"], ["--spam", "-", "a"],
                     ["--spam", "--", "a"], ["--spam", "--history-store", "a"],
                     ["--spam", "--model", "m", "--store", "redis://h/0", "a"]):
        assert parsed(declined) is None, declined
    # a configuration that keeps the history in the store: the click command, which records there
    in_store = settings.Layers([("config file", {"history": {"store": True}}, "f.toml")], {})
    assert parsed(["--spam", "a"], layers=in_store) is None


def test_exit_zero_is_read_by_one_rule():
    assert options.exit_zero_given(["--model", "m", "--exit-zero"])
    assert options.exit_zero_given(["filter", "--exit-zero"])
    assert not options.exit_zero_given(["--exit-zero=1", "-u"])


def test_the_environment_is_one_list():
    """Every variable the package reads is in the one list spamnb(1) shows, a setting's
    in its row (and nowhere else), the others in VARIABLES; and spamnb(1) lists them all."""
    import re
    from pathlib import Path

    listed = dict(options.environment())
    settings_ = [r.env for r in options.TABLE if r.env]
    assert set(settings_) | set(options.VARIABLES) == set(listed)
    assert not set(settings_) & set(options.VARIABLES)
    assert all(text for text in listed.values())
    package = Path(options.__file__).parent
    read = set()
    for path in package.rglob("*.py"):
        read |= set(re.findall(r"""(?:environ|env)(?:\.get\(|\[)\s*["'](SPAMNB_\w+)""", path.read_text()))
    assert read and read <= set(listed), read - set(listed)
    page = Path(__file__).parent.parent / "man" / "spamnb.1"
    if page.exists():
        text = page.read_text()
        environment = text[text.index(".SH ENVIRONMENT"):text.index(".SH FILES")]
        for variable in listed:
            assert f"\\fB{variable}\\fR" in environment, variable
