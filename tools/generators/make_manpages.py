#!/usr/bin/env python3
"""Write the man pages in man/ from the click definitions of the spamnb command.

    python tools/generators/make_manpages.py            # rewrite man/*.1
    python tools/generators/make_manpages.py --check    # exit 1 if man/ differs

One page per command, as git and borg have them: spamnb(1) for the program,
spamnb-COMMAND(1) for each command and spamnb-GROUP-COMMAND(1) for each command
of a group (spamnb-imap-train(1)). Each page is the command's --help in roff:
its help text (click's ``\\b`` paragraphs, the examples, kept as they are
written), its options with their defaults, its subcommands, and SEE ALSO. A page
for a command that no longer exists is removed. The pages hold no date, so
regenerating unchanged definitions changes nothing (tests/test_manpages.py
checks that, and that ``man -l`` renders each page without a warning).

Our own, not click-man: click-man copies help text into roff unescaped (a help
line starting with a dot or a quote is a roff request; a backslash an escape),
refills the ``\\b`` examples into one paragraph, and needs Python 3.11.
"""

from __future__ import annotations

import argparse
import sys
from inspect import cleandoc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import click  # noqa: E402

from spamnb import options as table  # noqa: E402
from spamnb._version import __version__  # noqa: E402
from spamnb.cli import main as spamnb_main  # noqa: E402

MAN = ROOT / "man"

# What spamnb(1) says beyond the group's help: true of every command.
EXIT_STATUS = [
    ("filter", "0 spam, 1 ham, 2 unsure, 3 error (the message passed through unchanged); "
               "with --exit-zero 0 for any classification, still 3 on error."),
    ("every other command", "0 success; 1 error (a missing file, an unreadable source, a corpus "
                            "without a class, a file that is not a spamnb model, an untrusted model); "
                            "2 bad command line."),
]
FILES = [
    ("~/.local/share/spamnb/model.joblib", "Your model ($XDG_DATA_HOME/spamnb), with its journal "
                                           "(model.joblib.journal) and compiled scorer (model.joblib.scorer)."),
    ("~/.cache/spamnb/default-model-N.joblib", "The default model ($XDG_CACHE_HOME/spamnb), "
                                             "built the first time a command needs it; N is its recipe, "
                                             "so a release with another corpus or defaults builds it anew."),
    ("~/.config/spamnb/imap.toml", "The settings of spamnb imap (mode 0600)."),
    ("~/.local/state/spamnb/learn-queue/", "The learns Dovecot's IMAPSieve pipe program could not do, kept "
                                           "for a retry (spamnb learn-queue)."),
    ("~/.local/state/spamnb/learn.log", "A line per learn, queued learn, failed retry and dropped learn "
                                        "of the IMAPSieve pipe program (rotated to learn.log.1 at 1 MiB)."),
]
SEE_ALSO_PEERS = ["bogofilter(1)", "spamc(1)", "procmail(1)", "maildrop(1)"]


def esc(text):
    """Text as roff reads it literally: backslashes, dashes, and non-ASCII as named glyphs."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "".join(c if ord(c) < 128 else f"\\[u{ord(c):04X}]" for c in text)


def line(text):
    """One source line of text: a leading dot or quote would be a request."""
    text = esc(text)
    return "\\&" + text if text[:1] in (".", "'") else text


def paragraphs(help_text):
    """Roff for a click help text: paragraphs filled, ``\\b`` ones kept line for line."""
    help_text = cleandoc(help_text.split("\f")[0])
    out = []
    for para in help_text.split("\n\n"):
        lines = para.split("\n")
        if lines[0].strip() == "\b":
            # click prints these lines as written: a heading line, then indented examples
            out += [".PP", ".nf"] + [line(x) if x.strip() else "" for x in lines[1:]] + [".fi"]
        elif para.strip():
            out += [".PP"] + [line(x.strip()) for x in lines if x.strip()]
    return out


def short_help(command, name=""):
    text = command.get_short_help_str(limit=80).rstrip(".")
    return text[len(name) + 2:] if name and text.startswith(name + ": ") else text


def page_name(ctx):
    return ctx.command_path.replace(" ", "-")


def options(ctx):
    out = []
    for param in ctx.command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None or getattr(param, "hidden", False):
            continue
        names, help_text = record
        # option names bold, metavars roman: "\fB-c,\fR \fB--count\fR N"
        out += [".TP", " ".join(f"\\fB{esc(w)}\\fR" if w.startswith("-") else esc(w) for w in names.split(" "))]
        out += [line(x.strip()) for x in help_text.split("\n") if x.strip()] or [""]
    return out


def contexts(command, name, parent=None):
    """Every (context, command) of the tree, the program first, groups before their commands."""
    ctx = click.Context(command, info_name=name, parent=parent, **command.context_settings)
    yield ctx
    if isinstance(command, click.Group):
        for sub_name in command.list_commands(ctx):
            sub = command.get_command(ctx, sub_name)
            if sub is not None and not sub.hidden:
                yield from contexts(sub, sub_name, ctx)


def definitions(items):
    out = []
    for term, text in items:
        out += [".TP", "\\fB" + esc(term) + "\\fR", line(text)]
    return out


def render(ctx):
    command, name = ctx.command, page_name(ctx)
    title = name.upper()
    out = [f'.TH "{esc(title)}" "1" "" "spamnb {__version__}" "spamnb manual"',
           ".\\\" Generated by tools/generators/make_manpages.py from the click definitions: do not edit.",
           ".ad l", ".nh",  # ragged right, no hyphens: paths and options stay whole
           ".SH NAME", f"{esc(name)} \\- {esc(short_help(command, name))}",
           ".SH SYNOPSIS", ".nf",
           f"\\fB{esc(ctx.command_path)}\\fR {esc(' '.join(command.collect_usage_pieces(ctx)))}", ".fi",
           ".SH DESCRIPTION"]
    out += paragraphs(command.help or "")
    out += [".SH OPTIONS"] + options(ctx)
    see_also = []
    if isinstance(command, click.Group):
        out.append(".SH COMMANDS")
        for sub_name in command.list_commands(ctx):
            sub = command.get_command(ctx, sub_name)
            if sub is None or sub.hidden:
                continue
            sub_page = f"{name}-{sub_name}"
            out += [".TP", f"\\fB{esc(sub_name)}\\fR", line(f"{short_help(sub)}: see {sub_page}(1).")]
            see_also.append(f"{sub_page}(1)")
    if ctx.parent is None:
        out += [".SH EXIT STATUS"] + definitions(EXIT_STATUS)
        out += [".PP", line("Every error is one line on standard error, spamnb: error: ..., "
                            "saying what is wrong and, where there is one, what to do.")]
        out += [".SH ENVIRONMENT"] + definitions(table.environment())  # the table's, and the others
        out += [".SH FILES"] + definitions(FILES)
        see_also += SEE_ALSO_PEERS
    else:
        see_also.insert(0, f"{page_name(ctx.parent)}(1)")
    out += [".SH SEE ALSO", ", ".join(f"\\fB{esc(p[:-3])}\\fR(1)" for p in see_also)]
    out += [".PP", line("The documentation by topic (delivery, the spamd protocol, IMAP, accuracy, speed) "
                        "is in README.md and docs/ of spamnb's source.")]
    return "\n".join(out) + "\n"


def pages():
    """{file name: text} for every command of spamnb."""
    return {page_name(ctx) + ".1": render(ctx) for ctx in contexts(spamnb_main, "spamnb")}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if man/ is not up to date")
    parser.add_argument("--dir", type=Path, default=MAN, help="where the pages go (default: man/)")
    args = parser.parse_args(argv)
    want = pages()
    have = {p.name: p.read_text(encoding="utf-8") for p in sorted(args.dir.glob("*.1"))}
    stale = sorted(n for n in set(want) | set(have) if want.get(n) != have.get(n))
    if args.check:
        for name in stale:
            print(f"make_manpages.py: {args.dir / name} is not what the click definitions give", file=sys.stderr)
        return 1 if stale else 0
    args.dir.mkdir(parents=True, exist_ok=True)
    for name in stale:
        if name in want:
            (args.dir / name).write_text(want[name], encoding="utf-8")
        else:
            (args.dir / name).unlink()
    print(f"{len(want)} man pages in {args.dir}: {len(stale)} written or removed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
