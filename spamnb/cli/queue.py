"""``spamnb learn-queue``: learn what Dovecot's IMAPSieve pipe program could not (its queue)."""

from __future__ import annotations

import os
import time

import click

from spamnb.cli.options import history_options, model_options


@click.command("learn-queue")
@click.option("--list", "show", is_flag=True, help="List the learns waiting and where the log is; learn nothing.")
@click.option("--max-seconds", type=click.FloatRange(min=0), metavar="S",
              help="Start no new learn after S seconds: the rest waits for the next run (the IMAPSieve pipe "
                   "program gives 5, within Dovecot's sieve_pipe_exec_timeout).")
@click.option("--quiet", "-q", is_flag=True, help="Say nothing when all went well (for cron, which mails what "
                                                  "a job prints).")
@model_options
@history_options
def learn_queue(show, max_seconds, quiet, model_path, store, allow_insecure_model, history):
    """Learn the moves Dovecot's IMAPSieve could not learn when you made them.

    When the IMAPSieve pipe program (spamnb-learn) cannot learn a message you
    moved into or out of Junk (the model's lock busy, its folder not writable,
    spamnb not runnable), it keeps the message in
    ~/.local/state/spamnb/learn-queue/, and the next move learns the queue
    first. This command learns it too, oldest first (a message moved into Junk
    and out again is learned as you meant), and removes each message once it is
    learned: run it from a timer. At most 200 messages and 20 MB wait; past
    that the oldest are dropped. What is not a mail message is dropped at once.
    A learn that fails stops the run, the rest waiting behind it (exit 1).
    Learning a message twice changes nothing.

    Each learn, queued learn, failure and drop is a line in
    ~/.local/state/spamnb/learn.log (rotated at 1 MiB to learn.log.1), and in
    syslog when there is one.

    \b
    Examples:
      spamnb learn-queue --list
      spamnb learn-queue -q        # from cron: */15 * * * *
    """
    from spamnb.delivery import learnqueue as lib

    queue, log = lib.queue_dir(), lib.log_path()
    if show:
        _show(lib, queue, log)
        return
    if not lib.waiting(queue):
        if not quiet:
            click.echo(f"no learns wait in {queue}", err=True)
        return
    started = time.monotonic()
    held = lib.lock(queue, lib.LOCK_WAIT if max_seconds is None else max_seconds)
    if held is None:  # the other one learns what waits, ours too: it lists the queue after each learn
        if not quiet:
            click.echo("another spamnb learn-queue is learning the queue", err=True)
        return
    try:
        say = (lambda text: None) if quiet else click.echo
        left = None if max_seconds is None else max(0.0, max_seconds - (time.monotonic() - started))
        done = lib.retry(queue, log, _learner(lib, model_path, store, allow_insecure_model, history),
                         seconds=left, say=say)
    finally:
        os.close(held)
    _report(done, queue, quiet)


def _learner(lib, model_path, store, allow_insecure_model, history):
    """``learn(raw, label)`` for :func:`spamnb.delivery.learnqueue.retry`: as `spamnb learn`
    learns (the model opened at the first message), any failure a one-line
    :class:`spamnb.delivery.learnqueue.Failed`."""
    from spamnb.cli.learning import own_learner
    from spamnb.delivery.fastlearn import summary
    from spamnb.verdict import failure_reason

    opened = []

    def learn(raw, label):
        try:
            if not opened:
                opened.append(own_learner(model_path, store, allow_insecure_model, history))
            return summary(opened[0]([(raw, label)]), label)
        except click.ClickException as exc:
            raise lib.Failed(exc.format_message()) from None
        except Exception as exc:  # noqa: BLE001 - whatever it is, the message stays queued
            raise lib.Failed(failure_reason(exc)) from None

    return learn


def _report(done, queue, quiet):
    if done.failed:
        raise click.ClickException(f"a learn failed: {done.failed}; {done.left} learn(s) wait in {queue}")
    if not quiet or done.left:
        left = f"; {done.left} wait in {queue} for the next run" if done.left else ""
        click.echo(f"learned {done.learned}, dropped {done.dropped}{left}", err=True)


def _show(lib, queue, log):
    entries = lib.waiting(queue)
    for name, label in entries:
        path = os.path.join(queue, name)
        try:
            raw = lib.read(path)
        except (OSError, ValueError):
            raw = b""
        click.echo(lib.line("waiting", label, lib.message_id(raw), f"{len(raw)} bytes", lib.queued_when(name)))
    click.echo(f"{len(entries)} learn(s) wait in {queue} (at most {lib.MAX_MESSAGES} messages, "
               f"{lib.MAX_BYTES // 2**20} MB); the log: {log}", err=True)
