"""``spamnb train``: build a new model from labelled mail."""

from __future__ import annotations

import sys
import time

import click

from spamnb.cli.options import (check_alpha, model_factory, model_options, model_settings_options, notice,
                                runner_from, scale_options, shard_progress, skipper, source_options,
                                trust_index_option)


@click.command()
@click.option("--ham", multiple=True, metavar="SRC", help="Ham source (maildir, mbox, MH, folder, archive, file).")
@click.option("--spam", multiple=True, metavar="SRC", help="Spam source.")
@click.option("--index", multiple=True, metavar="FILE",
              help="TREC index file (`spam PATH` / `ham PATH` lines), or an archive holding one.")
@model_options
@click.option("--min-df", type=click.IntRange(min=1), default=1, show_default=True,
              help="Drop tokens seen in fewer messages than this.")
@click.option("--dedupe/--no-dedupe", default=True, show_default=True,
              help="Count a message given twice once (by its author's header fields and body) and record every "
                   "message's key in the model, for learn/forget; --no-dedupe counts every message "
                   "given and records no keys (huge corpora: a key costs ~100 bytes of memory).")
@model_settings_options
@scale_options
@source_options
@trust_index_option
def train(ham, spam, index, model_path, store, allow_insecure_model, min_df, dedupe, jobs, backend, scheduler,
          recursive, strict, trust_index, **settings):
    """Build a new model from labelled mail (replaces the model file).

    Messages are read, tokenized and counted in shards of 512, on --jobs
    processes or a Dask cluster, and merged in order: the model is the same
    whatever the number of workers. A message given twice counts once; given as
    ham and as spam, once under the label given last (spam sources are read
    after ham sources). With -r, a Maildir++ root does not read again its
    sub-folders given as sources of their own.

    \b
    Example:
      spamnb train --ham ~/Maildir/.Ham --spam ~/Maildir/.Junk --model model.joblib
      spamnb train --index corpora/spamassassin.tar.xz --model model.joblib
      spamnb train --index big/index --jobs 8 --model model.joblib
      spamnb train --index /shared/big/index --backend dask --scheduler tcp://10.0.0.1:8786
    """
    from spamnb.scale import parallel
    from spamnb.verdict import LABELS
    from spamnb.storage.where import own_backend

    if not (ham or spam or index):
        raise click.UsageError("give training mail: --ham SRC and --spam SRC, or --index FILE")
    if min_df > 1 and settings.get("hash_features"):
        raise click.UsageError("--min-df needs a vocabulary: it cannot be combined with --hash-features")
    check_alpha(settings.get("alpha"), refuse=True)
    model = model_factory(**settings)()
    runner = runner_from(jobs, backend, scheduler)
    backend = own_backend(model_path, store, allow_insecure=allow_insecure_model)
    backend.exists()  # a store that cannot be reached says so now, not after the training
    skipped = [0]
    start = time.perf_counter()
    on_error = skipper(skipped)
    shards = parallel.plan(ham, spam, index, recursive=recursive, strict=strict, on_error=on_error,
                           trust_index=trust_index)
    for folder, label, root, root_label in shards.nested:
        notice(f"reading {folder} as {label} only (-r does not read it again, as {root_label}, in {root})")
    tty = sys.stderr.isatty()
    done = parallel.train(model, shards, runner=runner, registry=dedupe, on_error=on_error,
                          progress=shard_progress() if tty else None)
    if tty:
        click.echo("", err=True)
    counts = model.messages
    missing = [name for name, n in zip(LABELS, counts) if n == 0]
    if missing:
        raise click.ClickException(
            f"no {' and no '.join(missing)} messages were read: a model needs both classes; "
            "nothing was saved")
    # Σ_w df_w: each message's distinct tokens, summed. (The estimator's feature
    # counts are sums of *feature values*, which are not token counts once rows are
    # scaled to unit length.)
    n_tokens = int(model.doc_freq.sum())
    if min_df > 1:
        model.prune(min_df)
    backend.replace(model)
    seconds = time.perf_counter() - start
    click.echo(
        f"trained {model.model_type} model on {int(counts[0])} ham and {int(counts[1])} spam "
        f"({n_tokens} tokens, distinct per message; vocabulary {len(model.vocabulary)}) in {seconds:.1f} s"
        + (f"; skipped {skipped[0]} unreadable" if skipped[0] else "")
        + _duplicates_line(done)
        + f"\nsaved to {backend.name}", err=True)


def _duplicates_line(done) -> str:
    """The summary's line on messages given more than once ('' when none was)."""
    dropped = done["moved"] + done["unchanged"]
    if not dropped:
        return ""
    line = (f"\n{done['learned'] + dropped} messages read, {done['learned']} counted: "
            f"{dropped} duplicate{'s' * (dropped != 1)} dropped")
    n_ham, n_spam = done["conflicts"]
    if n_ham + n_spam:
        line += (f"; {n_ham + n_spam} given as both ham and spam, counted once under the label given last ("
                 + ("spam" if not n_ham else "ham" if not n_spam else f"{n_spam} spam, {n_ham} ham") + ")")
    return line


