"""The ``spamnb`` command line: a thin click layer over the library.

One module per command group (``train``, ``evaluate``, ``mailbox``: classify
and sort, ``learning``: learn, forget, compact, prune and cutoffs, ``delivery``: filter and serve,
``explain``: explain, info, tokens and learned, ``imap``: imap train and filter, ``web``: the page,
``history``: the history listed), the
options they share in ``options``; this module is the group. Commands import the library inside
their own bodies, so that the click path of the per-message ``filter`` hook
does not pay for modules it never uses. Errors the
user can fix (missing files, bad models, bad options) end in one line on stderr
and a non-zero exit, never a traceback (``SPAMNB_DEBUG=1`` shows it).
"""

from __future__ import annotations

import os
import sys

import click

from spamnb._version import __version__
from spamnb.cli.options import EXIT_ZERO_GIVEN, pass_through, take_settings
from spamnb.options import TABLE, exit_zero_given
from spamnb.verdict import failure_reason
from spamnb.cli import (config, delivery, evaluate, explain, history, imap, learning, mailbox, queue, remote, setup,
                        stats, train, web)


class _Group(click.Group):
    """One error style for every command: ``spamnb: error: …`` on one line, no traceback.

    Library errors (bad mail sources, models, values, files) exit 1; usage
    errors (bad options) exit 2, with a pointer to the command's help; click's
    own ``Error: …`` and usage blocks are never printed. ``SPAMNB_DEBUG=1``
    shows the traceback of a library error.
    """

    def main(self, args=None, prog_name=None, **extra):
        extra.pop("standalone_mode", None)
        try:
            code = super().main(args, prog_name or "spamnb", standalone_mode=False, **extra)
        except click.UsageError as exc:
            hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
            _error(exc.format_message() + hint)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            _error(exc.format_message())
            sys.exit(exc.exit_code)
        except click.Abort:
            _error("aborted")
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)

    def parse_args(self, ctx, args):
        # before any option is parsed: `filter` passes its message through with --exit-zero's
        # status even when its options or the configuration cannot be read (options.pass_through)
        ctx.meta[EXIT_ZERO_GIVEN] = exit_zero_given(args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx):
        from spamnb.mail.sources import SourceError
        from spamnb.storage.store import ModelError

        try:
            try:
                return super().invoke(ctx)
            except Exception as exc:
                if ctx.invoked_subcommand == "filter" and not isinstance(exc, click.exceptions.Exit):
                    # failed before filter's command ran (the configuration): its message is never lost
                    pass_through(failure_reason(exc))
                raise
        except BrokenPipeError:
            # The reader went away (`spamnb tokens msg | head`): stop quietly, and
            # point stdout at /dev/null so the flush at exit cannot complain again.
            _silence_stdout()
            ctx.exit(1)
        except (SourceError, ModelError, ValueError, OSError) as exc:
            if os.environ.get("SPAMNB_DEBUG"):
                raise
            if isinstance(exc, OSError) and exc.filename:
                text = f"{exc.filename}: {exc.strerror or exc}"
            else:
                text = str(exc)
            _error(text)
            ctx.exit(1)


def _error(text):
    click.echo(f"spamnb: error: {text}", err=True)


def _silence_stdout():
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real file descriptor (tests)
        pass


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="spamnb")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), metavar="FILE",
              help="A configuration file read after the system and user files (default $SPAMNB_CONFIG); "
                   "see `spamnb config`.")
@click.pass_context
def main(ctx, config_file):
    """spamnb: a naive Bayes spam filter for your own mail.

    \b
    Train on labelled mail, then classify a mailbox:
      spamnb train --ham ~/Mail/ham --spam ~/Mail/spam
      spamnb classify ~/Maildir
    \b
    Or run it as a procmail/maildrop filter (see `spamnb filter --help`).
    Without a model of your own, a default one trained on the shipped corpus is used.
    Settings can live in /etc/spamnb/spamnb.toml and ~/.config/spamnb/config.toml
    (`spamnb config` shows them).
    """
    if ctx.invoked_subcommand != "config":  # config --check reports a broken file itself
        config.load(ctx, config_file)




for _command in (train.train, evaluate.evaluate, mailbox.classify, learning.learn, learning.forget,
                 learning.learn_moves, queue.learn_queue, learning.compact, learning.prune, learning.cutoffs_,
                 delivery.filter_, delivery.serve, mailbox.sort, explain.explain, explain.info,
                 explain.tokens, explain.learned, imap.imap, config.config, stats.stats, remote.store, web.web,
                 history.history, setup.setup):
    main.add_command(_command)

# every command that takes a setting runs with the one resolver's values (options.take_settings)
for _path, _command in config.commands(main).items():
    _names = {p.name for p in _command.params}
    if any(r.name in _names and r.takes(_path) for r in TABLE):
        take_settings(_command)
