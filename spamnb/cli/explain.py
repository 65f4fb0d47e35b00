"""``spamnb explain``, ``info``, ``tokens`` and ``learned``: look inside a model and a message."""

from __future__ import annotations

import sys

import click

from spamnb.cli.options import decision_note, model_options, open_backend, skipper, source_options

#: ``spamnb learned``'s exit status when a message was not learned (or not as the class asked):
#: apart from 1, an error, and 2, a bad command line, as for every command.
NOT_LEARNED = 3


@click.command()
@click.argument("message", metavar="MSG", required=False)
@model_options
@click.option("--count", "-c", "count", type=click.IntRange(min=1), default=10, show_default=True,
              help="How many tokens to show on each side (spam-ward and ham-ward).")
@click.option("--word", "-w", "words", multiple=True, metavar="WORD",
              help="Instead of a message: what the model knows of WORD (repeatable), as bogofilter's "
                   "`bogoutil -w`. A token (subject:free, header:X-Mailer) is looked up as it is; a plain "
                   "word as a body word and in every namespace the model holds it in (subject:, "
                   "from:name:, url:path: ...).")
def explain(message, model_path, store, allow_insecure_model, count, words):
    """Show why a message got its score, or what the model knows of a word.

    The prior, then both sides: the tokens that pushed towards spam and
    those that pushed towards ham, each side's sum and count, and the
    strongest of each. The prior and the two sums add up to the score. All
    in log-odds (natural log); positive means spammier. MSG is a message
    file or - for standard input.

    With --word, for each token found (each once): its weight in each class
    (what the estimates count: with the default features, each message
    holding it adds 1/sqrt of its distinct tokens), how many learned
    messages hold it (the class too, when one alone does), its log-odds
    (what it alone adds to a message's score) and the probability it alone
    gives from even odds; the lines above the table say which column is
    which.

    \b
    Example:
      spamnb explain ~/Maildir/cur/1700000000.M1P2.host:2,S
      spamnb explain --word viagra --word subject:free
    """
    from spamnb.mail.sources import iter_messages

    if words and message:
        raise click.UsageError("give a message or --word, not both")
    if not words and not message:
        raise click.UsageError("give a message to explain (MSG, or - for standard input), or --word WORD")
    model = open_backend(model_path, store, allow_insecure_model).model()
    if words:
        explain_words(model, words)
        return
    msg = next(iter(iter_messages(message, strict=True)), None)
    if msg is None:
        raise click.ClickException(f"no message in {message}")
    toks = model.tokens(msg.raw)
    result = model.classify_tokens(toks)
    ev = model.explain(msg.raw, len(toks) + 1, toks=toks)  # every token the model knows: both sides whole
    click.echo(f"label {result.label}, P(spam) {result.spam_probability:.6f}, score {result.score:+.2f}")
    click.echo(f"{ev.prior:+10.3f}  prior and per-class constants")
    for name, side in (("spam-ward", [t for t in ev.tokens if t[2] > 0]),
                       ("ham-ward", [t for t in ev.tokens if t[2] < 0])):
        shown = side[:count]
        more = f"; the strongest {len(shown)}" if len(shown) < len(side) else ""
        click.echo(f"{sum(c for _, _, c in side):+10.3f}  {name}: {len(side)} token{'' if len(side) == 1 else 's'}"
                   f"{more}:" if side else f"{0:+10.3f}  {name}: no token")
        for tok, n, c in shown:
            click.echo(f"{c:+14.3f}  {tok}" + (f"  (x{n})" if n != 1 else ""))
    click.echo(f"{result.score:+10.3f}  score (prior + spam-ward + ham-ward)")
    click.echo(f"{result.n_tokens} tokens, {result.n_unknown} not in the vocabulary")


#: What each message holding a token adds to ``explain --word``'s weights, by the model's features.
WEIGHTS = {"counts": "the token's occurrences in it", "presence": "1",
           "presence-l2": "1/√n, n its distinct tokens, so that a long message weighs less",
           "logtf-l2": "log(1 + the token's occurrences), the message scaled to length 1"}


def explain_words(model, words):
    """``explain --word``: a table of what ``model`` knows of each of ``words``, each token
    once (a plain word and a token of its namespaces may name the same), under a header
    saying what each column is."""
    from spamnb.mail.tokennames import describe
    from spamnb.storage.scorer import sigmoid

    for line in columns(model):
        click.echo(line)
    click.echo(f"{'ham weight':>11} {'spam weight':>11} {'messages':>14} {'log-odds':>9} {'P(spam)':>8}  token")
    shown = set()
    for word in words:
        rows = model.lookup(word)
        if not rows:
            click.echo(f"{'':>11} {'':>11} {'':>14} {'':>9} {'':>8}  {word}: not in the model")
        for r in (r for r in rows if r["token"] not in shown):
            shown.add(r["token"])
            click.echo(f"{r['ham']:>11.3f} {r['spam']:>11.3f} {held_by(r):>14} {r['weight']:>+9.3f} "
                       f"{sigmoid(r['weight']):>8.4f}  {r['token']}  ({describe(r['token'])})")


def columns(model) -> list[str]:
    """The lines above ``explain --word``'s table: which column is which, in ``model``'s terms."""
    copies = sum(model.stats.get("refine_copies", (0, 0)))
    return [f"messages: how many learned messages hold the token ({int(model.messages[0])} ham and "
            f"{int(model.messages[1])} spam were learned); the model keeps one count for both classes, so a "
            f"class is named only where it alone holds the token",
            f"ham weight, spam weight: what the estimates count, each message of that class holding the token "
            f"adding {WEIGHTS.get(model.features, 'its feature value')} (features {model.features})"
            + ("; training's repeats of hard messages (refine) add again" if copies else ""),
            "log-odds: what the token alone adds to a score; P(spam): the probability it alone gives from even "
            "odds"]


def held_by(row) -> str:
    """The messages column of a :meth:`spamnb.model.SpamModel.lookup` row: how many, and
    the class when one alone holds the token."""
    n, by_class = row["messages"], row["by_class"]
    if by_class is None or n == 0:
        return str(n)
    return f"{n}, all {'ham' if by_class[0] else 'spam'}"


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

    from spamnb.storage import upkeep
    from spamnb.storage.store import ModelError

    backend = open_backend(model_path, store, allow_insecure_model)
    if rebuild_scorer:
        try:
            outcome = upkeep.rebuild_scorer(backend)
        except ModelError as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(f"scorer of {backend.name}: {outcome}", err=True)
    model = backend.model()
    counts = model.messages
    stats = model.stats

    def when(t):
        return datetime.datetime.fromtimestamp(t).isoformat(timespec="seconds") if t else "never"

    decision_note()
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




@click.command()
@click.argument("sources", nargs=-1, required=True, metavar="MSG...")
@model_options
@click.option("--spam", is_flag=True, help="Ask whether each was learned as spam.")
@click.option("--ham", is_flag=True, help="Ask whether each was learned as ham.")
@source_options
def learned(sources, model_path, store, allow_insecure_model, spam, ham, recursive, strict):
    """Say whether each message was learned, and as what, learning nothing.

    A line a message: "learned as spam", "learned as ham" or "not learned",
    found by the message's identity (as learn and forget know it, whatever
    delivery or a mail client added) among the messages the model (or the
    store, with --store) learned. MSG is a message file, a folder, an mbox,
    or - for standard input.

    Exit status: 0 when every message was learned (as --spam or --ham says,
    when given), 3 when one was not (or could not be read), 1 on an error,
    2 on a bad command line.

    \b
    Examples:
      spamnb learned ~/Maildir/.Junk/cur/1700000000.M1P2.host:2,S
      spamnb learned --spam message.eml && echo "learned as spam already"
    """
    import collections

    from spamnb.mail.sources import iter_messages

    if spam and ham:
        raise click.UsageError("ask about one class: --spam or --ham, not both")
    want = "spam" if spam else "ham" if ham else None
    backend = open_backend(model_path, store, allow_insecure_model)
    skipped, pending, counts = [0], collections.deque(), collections.Counter()
    readers = [iter_messages(spec, recursive=recursive, strict=strict, on_error=skipper(skipped)) for spec in sources]

    def raws():
        for m in (m for reader in readers for m in reader):
            pending.append(m.source)
            yield m.raw

    for label in backend.learned_as(raws()):
        counts[label] += 1
        click.echo(f"{pending.popleft()}: {'learned as ' + label if label else 'not learned'}")
    click.echo(summary(counts, backend, skipped[0]), err=True)
    if counts[None] or any(counts[other] for other in ("spam", "ham") if want and other != want) or skipped[0]:
        raise click.exceptions.Exit(NOT_LEARNED)


def summary(counts, backend, skipped) -> str:
    """The line ``spamnb learned`` ends with, on stderr."""
    n = sum(counts.values())
    return (f"{n} message{'s' * (n != 1)}: {counts['spam']} learned as spam, {counts['ham']} as ham, "
            f"{counts[None]} not learned, in {backend.name}" + (" (the default model)" if backend.is_default else "")
            + (f"; skipped {skipped} unreadable" if skipped else ""))
