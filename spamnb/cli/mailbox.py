"""``spamnb classify`` and ``spamnb sort``: a verdict for every message of a mailbox."""

from __future__ import annotations

import os
import sys
import time

import click

from spamnb.cli.options import cutoffs, decision_options, model_options, open_backend, skipper, source_options


@click.command()
@click.argument("sources", nargs=-1, required=True, metavar="SRC...")
@model_options
@click.option("--format", "fmt", type=click.Choice(["table", "jsonl", "tsv"]), default="table",
              show_default=True, help="Output format.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=1, show_default=True,
              help="Worker processes (output stays in input order).")
@decision_options
@source_options
def classify(sources, model_path, store, allow_insecure_model, fmt, jobs, decision, recursive, strict):
    """Classify messages: one line each with label, spam probability and score.

    SRC is a maildir, mbox, MH folder, folder of files, archive, file, or - for
    standard input. The score is the log-odds log P(spam|x) - log P(ham|x).

    \b
    Example:
      spamnb classify ~/Maildir --format jsonl
    """
    import collections
    import json

    from spamnb.mail.sources import iter_messages

    backend = open_backend(model_path, store, allow_insecure_model)
    model, is_default = backend.model(), backend.is_default
    cut = cutoffs(model.cutoffs, decision)
    skipped = [0]
    # iter_messages checks its source when called: a missing one fails here, before any output.
    readers = [iter_messages(spec, recursive=recursive, strict=strict, on_error=skipper(skipped))
               for spec in sources]
    messages = (m for reader in readers for m in reader)
    out = sys.stdout
    counts = {"ham": 0, "unsure": 0, "spam": 0}
    start = time.perf_counter()
    if fmt == "table":
        out.write(f"{'label':<7} {'P(spam)':>9} {'score':>9}  message\n")
    pending = collections.deque()  # sources of messages read but not yet printed

    def raws():
        for m in messages:
            pending.append(m.source)
            yield m.raw

    from spamnb.scale.batch import classify_parallel

    for result in classify_parallel(model, raws(), cutoffs=cut, jobs=jobs):
        source = pending.popleft()
        counts[result.label] += 1
        if fmt == "jsonl":
            out.write(json.dumps({"path": source, "label": result.label,
                                  "spam_probability": result.spam_probability,
                                  "score": _finite(result.score)}) + "\n")
        elif fmt == "tsv":
            out.write(f"{source}\t{result.label}\t{result.spam_probability:.6f}\t{result.score:.3f}\n")
        else:
            out.write(f"{result.label:<7} {result.spam_probability:>9.6f} {result.score:>9.2f}  {source}\n")
    seconds = time.perf_counter() - start
    n = sum(counts.values())
    click.echo(
        f"{n} messages: {counts['spam']} spam, {counts['unsure']} unsure, {counts['ham']} ham "
        f"({n / seconds if seconds > 0 else 0:.0f} messages/s)"
        + (" [default model]" if is_default else "")
        + (f"; skipped {skipped[0]} unreadable" if skipped[0] else ""), err=True)


def _finite(x, bound=1e300):
    """JSON has no infinity: clamp the scores of λ = 0 models."""
    return max(-bound, min(bound, x)) if x == x else None




@click.command()
@click.argument("maildir", type=click.Path(exists=True, file_okay=False))
@model_options
@click.option("--spam-folder", default=".Junk", show_default=True, help="Maildir++ folder for spam.")
@click.option("--unsure-folder", default=None, help="Maildir++ folder for unsure messages (default: leave them).")
@click.option("--dry-run", "-n", is_flag=True, help="Say what would move; move nothing.")
@decision_options
def sort(maildir, model_path, store, allow_insecure_model, spam_folder, unsure_folder, dry_run,
         decision):
    """File spam (and optionally unsure mail) out of a maildir into Maildir++ folders.

    Messages keep their file names and their cur/ or new/ place. A move is a
    hard link into the folder, then an unlink of the original, within the
    maildir: a message is never overwritten or lost, even while mail is
    delivered. Missing folders are made (cur/, new/, tmp/, maildirfolder).

    \b
    Example:
      spamnb sort ~/Maildir --spam-folder .Junk --unsure-folder .Unsure --dry-run
    """
    from spamnb.delivery.maildir_sort import MoveSkipped, check_folder_name, move, plan_moves

    try:
        folders = {"spam": check_folder_name(spam_folder),
                   "unsure": unsure_folder and check_folder_name(unsure_folder)}
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    backend = open_backend(model_path, store, allow_insecure_model)
    model, is_default = backend.model(), backend.is_default
    cut = cutoffs(model.cutoffs, decision)
    moved = skipped = 0
    for src, dst, label in plan_moves(model, maildir, folders, cut):
        click.echo(f"{label:<6} {os.path.relpath(src, maildir)} -> {os.path.relpath(dst, maildir)}")
        try:
            if dry_run or move(src, dst):
                moved += 1
        except MoveSkipped as exc:
            skipped += 1
            click.echo(f"spamnb: skipped: {exc}", err=True)
    click.echo(f"{'would move' if dry_run else 'moved'} {moved} message(s)"
               + (f", skipped {skipped}" if skipped else "")
               + (" [default model]" if is_default else ""), err=True)


