"""``spamnb explain``, ``info`` and ``tokens``: look inside a model and a message."""

from __future__ import annotations

import sys

import click

from spamnb.cli.options import model_options, open_backend


@click.command()
@click.argument("message", metavar="MSG")
@model_options
@click.option("--count", "-c", "count", type=click.IntRange(min=1), default=15, show_default=True,
              help="How many tokens to show.")
def explain(message, model_path, store, allow_insecure_model, count):
    """Show why a message got its score: the prior and the strongest tokens.

    Contributions are in log-odds (natural log); positive means spammier.
    MSG is a message file or - for standard input.

    \b
    Example:
      spamnb explain ~/Maildir/cur/1700000000.M1P2.host:2,S
    """
    from spamnb.mail.sources import iter_messages

    model = open_backend(model_path, store, allow_insecure_model).model()
    msg = next(iter(iter_messages(message, strict=True)), None)
    if msg is None:
        raise click.ClickException(f"no message in {message}")
    toks = model.tokens(msg.raw)
    result = model.classify_tokens(toks)
    ev = model.explain(msg.raw, count, toks=toks)
    click.echo(f"label {result.label}, P(spam) {result.spam_probability:.6f}, score {result.score:+.2f}")
    click.echo(f"{ev.prior:+10.3f}  prior and per-class constants")
    for tok, n, c in ev.tokens:
        click.echo(f"{c:+10.3f}  {tok}" + (f"  (x{n})" if n != 1 else ""))
    click.echo(f"{result.n_tokens} tokens, {result.n_unknown} not in the vocabulary")


@click.command()
@model_options
@click.option("--rebuild-scorer", is_flag=True,
              help="Compile the model's scorer again (after copying a model: the filter's fast path "
                   "needs it; only for a trusted model, in a folder you can write).")
def info(model_path, store, allow_insecure_model, rebuild_scorer):
    """Show what a model holds, and whether its compiled scorer is fresh.

    The scorer (MODEL.scorer) lets `spamnb filter` answer without loading the
    model. It is stale or missing after a model was copied (cp); `filter`
    rebuilds it at the next delivery when it can, and --rebuild-scorer now.

    \b
    Example:
      spamnb info --model model.joblib
    """
    import datetime

    from spamnb.storage.store import ModelError

    backend = open_backend(model_path, store, allow_insecure_model)
    if rebuild_scorer:
        try:
            outcome = backend.rebuild_scorer()
        except ModelError as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(f"scorer of {backend.name}: {outcome}", err=True)
    model = backend.model()
    counts = model.messages
    stats = model.stats

    def when(t):
        return datetime.datetime.fromtimestamp(t).isoformat(timespec="seconds") if t else "never"

    before, after = backend.describe(model)
    rows = [
        *before,
        ("model type", f"{model.model_type}, features {model.features}"),
        ("alpha (λ)", f"{model.alpha:g}"),
        ("refine", f"{model.refine_rounds} rounds, margin {model.refine_margin:g}"),
        ("prior", model.prior),
        ("cut-offs", f"ham if P(spam) <= {model.cutoffs.ham_cutoff:g}, spam if > {model.cutoffs.spam_cutoff:g}"),
        ("messages", f"{int(counts[0])} ham, {int(counts[1])} spam"),
        ("vocabulary", f"{len(model.vocabulary)} tokens"
                       + (f" (automatic limit {stats['max_tokens']})" if stats.get("max_tokens") else "")),
        ("tokenizer", ", ".join(f"{k}={v}" for k, v in model.tokenizer.to_dict().items())),
        ("created", when(stats.get("created"))),
        ("updated", when(stats.get("updated"))),
        ("written by", f"spamnb {stats.get('spamnb_version')}"),
        *after,
    ]
    for k, v in rows:
        click.echo(f"{k + ':':<12} {v}")


@click.command()
@click.argument("message", metavar="FILE|-")
@model_options
@click.option("--default-settings", is_flag=True, help="Use the default tokenizer settings, not the model's.")
def tokens(message, model_path, store, allow_insecure_model, default_settings):
    """Print a message's tokens, one per line (like bogolexer).

    Uses the tokenizer settings of the model when one exists.

    \b
    Example:
      spamnb tokens message.eml | sort | uniq -c | sort -rn | head
    """
    from spamnb.mail.sources import iter_messages
    from spamnb.mail.tokenizer import TokenizerConfig, tokenize

    config = TokenizerConfig()
    if not default_settings:
        backend = open_backend(model_path, store, allow_insecure_model, build_default=False)
        if backend.exists() or model_path is not None or store is not None:  # one named must be there
            config = backend.tokenizer()
    out = sys.stdout
    for msg in iter_messages(message, strict=True):
        for tok in tokenize(msg.raw, config):
            out.write(tok + "\n")


