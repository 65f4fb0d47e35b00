"""``spamnb learn`` and ``spamnb forget``: incremental training, one message at a time."""

from __future__ import annotations

import functools

import click

from spamnb.cli.options import model_options, notice, skipper, source_options


def _learn_options(f):
    """The options and arguments learn and forget share; ``label`` is the one of
    --spam and --ham given (both at once is a usage error, not "the last one wins")."""

    @functools.wraps(f)
    def command(spam, ham, **kwargs):
        if spam and ham:
            raise click.UsageError("give one label: --spam or --ham, not both")
        return f(label="spam" if spam else "ham" if ham else None, **kwargs)

    command = click.argument("sources", nargs=-1, required=True, metavar="SRC...")(
        model_options(source_options(command)))
    command = click.option("--ham", is_flag=True, help="The messages are ham.")(command)
    return click.option("--spam", is_flag=True, help="The messages are spam.")(command)


def _labelled(sources, label, recursive, strict):
    """``(raw, label)`` of every message in ``sources``; unreadable ones are reported
    and counted in the returned one-element list."""
    from spamnb.mail.sources import iter_messages, mail_only, reporter

    skipped = [0]
    report = reporter(strict, skipper(skipped))
    read = (m for spec in sources
            for m in iter_messages(spec, label=label, recursive=recursive, strict=strict, on_error=report))
    return [(m.raw, label) for m in mail_only(read, report)], skipped


@click.command()
@_learn_options
def learn(label, sources, model_path, allow_insecure_model, recursive, strict):
    """Learn messages as spam or ham (as bogofilter -s / -n).

    Learning the same message twice under the same label counts once (by its
    author's header fields and body, whatever delivery or a mail client added);
    learning it under the other label moves it.
    Without a model of your own, learning starts from the default model.

    \b
    Example:
      spamnb learn --spam ~/Maildir/.Junk/cur/1700000000.M1P2.host:2,S
    """
    from spamnb.storage.modelfile import own_model_path, resolve, updating

    if label is None:
        raise click.UsageError("say what the messages are: --spam or --ham")
    path, is_default = resolve(model_path)
    if is_default:  # a user's first learn: their own model, seeded with the default one
        path = own_model_path()
        notice(f"creating your model at {path}, starting from the default model")
    messages, skipped = _labelled(sources, label, recursive, strict)
    with updating(path, allow_insecure=allow_insecure_model, create=_default_seed) as model:
        done = model.learn(messages)
    n = done["duplicates"]
    click.echo(f"learned {done['learned']} as {label}, moved {done['moved']}, "
               f"{done['unchanged']} already known"
               + (f", {n} duplicate{'s' * (n != 1)} dropped (given twice)" if n else "")
               + (f"; skipped {skipped[0]}" if skipped[0] else ""), err=True)


def _default_seed():
    """A new model's starting point: the cached default model, else a fresh build."""
    from spamnb.storage.modelfile import build_default_model, default_cache_path, load_model

    cached = default_cache_path()
    return load_model(cached) if cached.exists() else build_default_model()


@click.command()
@_learn_options
def forget(label, sources, model_path, allow_insecure_model, recursive, strict):
    """Undo learning messages as spam or ham (as bogofilter -S / -N).

    \b
    Example:
      spamnb forget --spam message.eml
    """
    from spamnb.storage.modelfile import resolve, updating

    if label is None:
        raise click.UsageError("say how the messages were learned: --spam or --ham")
    path, is_default = resolve(model_path)
    if is_default:
        raise click.ClickException("there is no model of yours to forget from")
    messages, _ = _labelled(sources, label, recursive, strict)
    with updating(path, allow_insecure=allow_insecure_model) as model:
        n = model.forget(messages)
    click.echo(f"forgot {n} {label} message(s)", err=True)


