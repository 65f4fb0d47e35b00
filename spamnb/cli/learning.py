"""``spamnb learn`` and ``spamnb forget``: incremental training, one message at a time."""

from __future__ import annotations

import functools
import os

import click

from spamnb.cli.options import (cutoffs, decision_note, decision_options, history_of, history_options, model_options,
                                notice, open_backend, run_alone, skipper, source_options)


def _learn_options(f):
    """The options and arguments learn and forget share; ``label`` is the one of
    --spam and --ham given (both at once is a usage error, not "the last one wins")."""

    @functools.wraps(f)
    def command(spam, ham, **kwargs):
        if spam and ham:
            raise click.UsageError("give one label: --spam or --ham, not both")
        return f(label="spam" if spam else "ham" if ham else None, **kwargs)

    command = click.argument("sources", nargs=-1, required=True, metavar="SRC...")(
        model_options(source_options(history_options(command))))
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
def learn(label, sources, model_path, store, allow_insecure_model, recursive, strict, history):
    """Learn messages as spam or ham (as bogofilter -s / -n).

    Learning the same message twice under the same label counts once (by its
    author's header fields and body, whatever delivery or a mail client added);
    learning it under the other label moves it.
    Without a model of your own, learning starts from the default model.

    \b
    Example:
      spamnb learn --spam ~/Maildir/.Junk/cur/1700000000.M1P2.host:2,S
    """
    from spamnb.delivery.fastlearn import summary

    if label is None:
        raise click.UsageError("say what the messages are: --spam or --ham")
    messages, skipped = _labelled(sources, label, recursive, strict)
    done = learn_into_own(messages, label, model_path, store, allow_insecure_model, history)
    click.echo(summary(done, label, skipped[0]), err=True)


def learn_into_own(messages, label, model_path, store, allow_insecure_model, history) -> dict:
    """Learn ``messages`` (``(raw, label)``) into the user's own model, made from the
    default one at their first learn, and mark their verdicts corrected in the history:
    what `spamnb learn` does with what it read. Returns the backend's counts."""
    return own_learner(model_path, store, allow_insecure_model, history)(messages)


def own_learner(model_path, store, allow_insecure_model, history):
    """A function that learns a batch of ``(raw, label)`` into the user's own model (as
    :func:`learn_into_own`, the model opened once), each batch's corrections marked in the
    history as it is learned: a command that learns in batches holds one batch at a time."""
    from spamnb.storage.modelfile import default_seed
    from spamnb.storage.where import own_backend

    from spamnb.delivery import pipeline

    backend = open_backend(model_path, store, allow_insecure_model, build_default=False)
    own = [backend]  # the user's own from their first learn on

    def learn(messages) -> dict:
        marks = corrections(history, backend)  # beside the model filter used: its history holds the verdicts
        try:
            if own[0].is_default:  # a user's first learn: their own model, seeded with the default one
                own[0] = own_backend(model_path, store, allow_insecure=allow_insecure_model)
                notice(f"creating your model at {own[0].name}, starting from the default model")
            return pipeline.learn(own[0], messages, via="learn", recorder=marks, create=default_seed, warn=notice)
        finally:
            marks.close()

    return learn


def corrections(history, backend):
    """The recorder of a learning command: the corrections it makes, marked in the history
    of ``history`` (:func:`spamnb.cli.options.history_of`: a file, the store's, or none)
    when it closes, in one transaction. A history that fails is one line: the learning stands."""
    from spamnb.delivery.pipeline import HistoryOnly

    try:
        where = history_of(history, backend)
    except click.ClickException as exc:
        notice(f"history: corrections not recorded: {exc.format_message()}")
        where = None
    if where is not None and not isinstance(where, str):
        from spamnb.storage import redishistory

        return HistoryOnly(redishistory.Now(where, notice))
    if where:
        from spamnb.storage.history import Now

        return HistoryOnly(Now(where, notice))
    return HistoryOnly(None)


@click.command()
@_learn_options
def forget(label, sources, model_path, store, allow_insecure_model, recursive, strict, history):
    """Undo learning messages as spam or ham (as bogofilter -S / -N).

    \b
    Example:
      spamnb forget --spam message.eml
    """
    from spamnb.delivery.fastlearn import forgot

    if label is None:
        raise click.UsageError("say how the messages were learned: --spam or --ham")
    backend = open_backend(model_path, store, allow_insecure_model, build_default=False)
    if backend.is_default:
        raise click.ClickException("there is no model of yours to forget from")
    from spamnb.delivery import pipeline

    marks = corrections(history, backend)
    messages, _ = _labelled(sources, label, recursive, strict)
    try:
        done = pipeline.learn(backend, messages, via="forget", forget=True, recorder=marks, warn=notice)
    finally:
        marks.close()
    click.echo(forgot(done, label), err=True)


@click.command()
@model_options
@click.option("--if-needed", is_flag=True,
              help="Only when the journal has grown past its bound (what learners start in the background).")
@click.option("--quiet", "-q", is_flag=True, help="Say nothing when all went well.")
def compact(model_path, store, allow_insecure_model, if_needed, quiet):
    """Fold the model's journal into a new model file.

    learn, forget and filter -u append each message to MODEL.journal rather
    than rewriting the model; readers add the journal to the model, and the
    journal is folded in automatically once it passes its bound. Deliveries
    and learners go on while a compaction runs.

    \b
    Example:
      spamnb compact
    """
    from spamnb.storage import upkeep

    backend = open_backend(model_path, store, allow_insecure_model, build_default=False)
    if backend.is_default:
        raise click.ClickException("there is no model of yours to compact")
    n = upkeep.compact(backend, force=not if_needed, warn=notice)
    if not quiet:
        click.echo(f"folded {n} journal update(s) into {backend.name}" if n else "nothing to fold", err=True)


@click.command()
@model_options
@click.option("--older-than", type=click.IntRange(min=0), default=None, metavar="DAYS",
              help="Drop tokens not seen in a learned message for more than DAYS days ...")
@click.option("--max-messages", type=click.IntRange(min=0), default=1, show_default=True, metavar="N",
              help="... and in at most N learned messages (old and rare, like bogoutil -a).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=None, metavar="N",
              help="Then keep at most N tokens: the rarest, least recently seen go first.")
@click.option("--limit", default=None, metavar="N|off",
              help="Set the model's automatic size limit: every compaction keeps at most N tokens.")
@click.option("--dry-run", is_flag=True, help="Say what would be dropped, change nothing.")
def prune(model_path, store, allow_insecure_model, older_than, max_messages, max_tokens, limit, dry_run):
    """Drop old, rare tokens to bound the model's size (as bogofilter's ageing).

    The model records the day each token was last in a learned message. The
    tokens kept keep their counts exactly. Without options, prune drops tokens
    unseen for 90 days that are in at most one learned message.

    \b
    Examples:
      spamnb prune                        # old tokens seen once
      spamnb prune --older-than 30 --max-messages 2
      spamnb prune --limit 500000         # keep the model under 500,000 tokens from now on
    """
    if limit is not None:
        if limit == "off":
            limit = 0
        elif not limit.isdigit() or int(limit) < 1:
            raise click.UsageError(f"--limit must be a number of tokens or 'off', not {limit!r}")
        limit = int(limit)
    if older_than is None and max_tokens is None and limit is None:
        older_than = 90
    from spamnb.storage import upkeep

    backend = open_backend(model_path, store, allow_insecure_model, build_default=False)
    if backend.is_default:
        raise click.ClickException("there is no model of yours to prune")
    dropped, before = upkeep.age_out(backend, older_than_days=older_than, max_messages=max_messages,
                                     max_tokens=max_tokens, limit=limit, dry_run=dry_run)
    if dry_run:
        click.echo(f"would drop {dropped} of {before} tokens", err=True)
        return
    click.echo(f"dropped {dropped} of {before} tokens; {before - dropped} kept"
               + (f"; automatic limit {'off' if not limit else limit}" if limit is not None else ""), err=True)


@click.command("cutoffs")
@model_options
@decision_options
def cutoffs_(model_path, store, allow_insecure_model, decision):
    """Show or set the model's stored cut-offs, in place (no retraining).

    Every command decides with the cut-offs stored in the model unless given
    others; this changes what is stored, and keeps every count, including what
    learn, filter -u and spamd TELL added. A running `spamnb serve` answers with
    them from the next message (it reloads the changed file; a store's hosts read
    them with the next message). Without options it prints them.

    \b
    Examples:
      spamnb cutoffs
      spamnb cutoffs --spam-cutoff 0.99 --ham-cutoff 0.2
      spamnb cutoffs --cost-fp 20 --cost-unsure 0.5 --model /var/lib/spamnb/model.joblib
    """
    backend = open_backend(model_path, store, allow_insecure_model, build_default=False)
    if not decision:
        if not backend.exists():
            raise click.ClickException(f"no model at {backend.name}")
        cut = cutoffs(backend.view().cutoffs, decision)  # the stored ones (a scorer's are a pair)
        click.echo(f"ham <= {cut.ham_cutoff:.6g} < unsure <= {cut.spam_cutoff:.6g} < spam  ({backend.name})")
        decision_note()
        return
    from spamnb.storage import upkeep

    if backend.is_default:
        raise click.ClickException("the default model is rebuilt from the shipped corpus: set the cut-offs "
                                   "of a model of yours (--model), or give them to each command")
    old, new = upkeep.set_cutoffs(backend, lambda old: cutoffs(old, decision))
    click.echo(f"cut-offs of {backend.name}: ham <= {old.ham_cutoff:.6g} -> {new.ham_cutoff:.6g}, "
               f"spam > {old.spam_cutoff:.6g} -> {new.spam_cutoff:.6g}", err=True)


@click.command("learn-moves")
@click.argument("maildir", required=False, type=click.Path(file_okay=False), metavar="[MAILDIR]")
@click.option("--junk", default=".Junk", show_default=True, metavar="FOLDER",
              help="The Maildir++ folder spam is filed in.")
@click.option("--unsure-folder", default=".Unsure", show_default=True, metavar="FOLDER",
              help="The Maildir++ folder unsure mail is filed in: moved out of it into kept mail, a message "
                   "is learned as ham (into Junk, as spam).")
@click.option("--dry-run", "-n", is_flag=True, help="Say what it would learn; learn and record nothing.")
@click.option("--quiet", "-q", is_flag=True, help="Say nothing when all went well (for cron, which mails what "
                                                  "a job prints).")
@model_options
@history_options
def learn_moves(maildir, junk, unsure_folder, dry_run, quiet, model_path, store, allow_insecure_model, history):
    """Learn from your moves into and out of Junk in a local Maildir (run from cron or a timer).

    Compares the Maildir (default ~/Maildir) with what the last run saw: a
    message you moved into .Junk is learned as spam, one you moved out of it
    (or out of .Unsure) into another folder as ham (a spam learned as ham, or
    a ham learned as spam, is moved to the other class). Out of .Junk into Trash, a move between
    two other folders and a copy teach nothing. Messages are recognised by their
    Maildir unique name and their identity, as `spamnb learn` recognises them.

    The first run records the Maildir and learns nothing: what is in .Junk then
    is your past sorting (`spamnb setup` learns it). The state lives beside the
    model (MODEL.moves.json); one run per model at a time. It never moves,
    changes or deletes a message.

    \b
    Examples:
      spamnb learn-moves                   # ~/Maildir
      spamnb learn-moves -q ~/Maildir      # from cron: */10 * * * *
    """
    from spamnb.delivery import maildir_moves as lib
    from spamnb.delivery.setup import role_of
    from spamnb.storage.modelfile import own_model_path

    maildir = maildir or os.path.join(os.path.expanduser("~"), "Maildir")
    junk, unsure = (_maildir_folder(name, option) for name, option in ((junk, "--junk"),
                                                                      (unsure_folder, "--unsure-folder")))
    state_path = lib.state_path(own_model_path(model_path))
    say = (lambda text: None) if quiet else (lambda text: click.echo(text, err=True))
    lock = run_alone(state_path, "spamnb learn-moves")
    try:
        _learn_moves(lib, state_path, maildir, junk, unsure, role_of, dry_run, say,
                     lambda: own_learner(model_path, store, allow_insecure_model, history))
    except lib.MovesError as exc:
        raise click.ClickException(str(exc)) from None
    except MemoryError:
        raise click.ClickException(f"out of memory in a run over {maildir}: what it learned before is recorded, "
                                   "the next run goes on from there") from None
    finally:
        os.close(lock)


def _learn_moves(lib, state_path, maildir, junk, unsure, role_of, dry_run, say, learner):
    """One run of learn-moves: compare, then learn the moves a batch at a time (one batch
    of mail in memory), the state saved after each; ``learner()``: :func:`own_learner`."""
    from spamnb.delivery.imap import subject_line
    from spamnb.mail.identity import MovesLearned

    state = lib.State.load(state_path)
    where = os.path.realpath(maildir)
    seen = state.seen(where)
    out, now = lib.compare(maildir, seen, junk, role_of, unsure)
    if not os.path.isdir(os.path.join(maildir, junk)):
        say(f"{maildir} has no folder {junk} (yet): nothing can move into or out of it")
    if out.first:
        say(f"first run over {maildir}: recorded {out.messages} messages in {out.folders} folders; your "
            f"moves into and out of {junk} are learned from the next run")
    for move, why in out.skipped:  # said even with -q: a correction of yours that is not learned
        click.echo(f"spamnb: {move.what}: not learned (recorded as seen): {why}", err=True)
    if dry_run:
        for batch in lib.batches(out.learn, messages=1):  # one message at a time
            for move, raw in batch:
                say(f"{move.what}: learning it as {move.label}: {subject_line(raw) if raw else move.path}")
        say(f"(dry run) would learn {out.count('spam')} as spam and {out.count('ham')} as ham; "
            "nothing learned or recorded")
        return
    done = dict(seen or {})  # what is saved after each batch: the last run's, and each move learned since
    final = dict(now)
    for move, _ in out.skipped:
        lib.settle(done, now, move)
    learn, learned = [], MovesLearned()
    for batch in lib.batches(out.learn):
        _learn_batch(lib, batch, now, seen, done, final, learned, learn, learner, say)
        del batch  # before the next batch is read: one batch of mail in memory at a time
        state.record(where, done)
        state.save()  # after each batch: a run that dies is resumed from here, a failed learn redone
    state.record(where, final)
    state.save()
    if not out.first:
        say(learned.said(f" in {maildir}"))


def _learn_batch(lib, batch, now, seen, done, final, learned, learn, learner, say):
    """Learn one batch (``[(move, raw), ...]``) and settle its moves in ``done``, counting in
    ``learned`` what changed the model (by class) and what was learned already; a
    message gone since the comparison is left for the next run in ``final``."""
    from spamnb.delivery.imap import subject_line

    items = []
    for move, raw in batch:
        if raw is None:  # moved or deleted since the comparison: the next run sees where
            say(f"{move.what}: gone before it was learned: {move.path}")
            lib.unsettle(final, seen or {}, move)
            continue
        say(f"{move.what}: learning it as {move.label}: {subject_line(raw)}")
        items.append((move, raw))
    if items:
        if not learn:
            learn.append(learner())  # the model opened once, at the first batch that learns
        items.sort(key=lambda item: item[0].label != "spam")
        outcomes = learn[0]([(raw, move.label) for move, raw in items])["outcomes"]
        learned.count([move.label for move, _ in items], outcomes)
    for move, raw in batch:
        if raw is not None:
            lib.settle(done, now, move)


def _maildir_folder(name, option):
    """A Maildir++ folder's name as it is on disk (``Junk`` is ``.Junk``)."""
    name = name if name.startswith(".") else "." + name
    if "/" in name or name in (".", ".."):
        raise click.UsageError(f"{option} names a Maildir++ folder such as .Junk, not {name!r}")
    return name
