"""The ``spamnb`` command line: a thin click layer over the library.

Commands import what they need inside their own bodies, so that the
per-message ``filter`` hook does not pay for modules it never uses. Errors the
user can fix (missing files, bad models, bad options) end in one line on stderr
and a non-zero exit, never a traceback (``SPAMNB_DEBUG=1`` shows it).
"""

from __future__ import annotations

import os
import sys
import time

import click

from spamnb._version import __version__

class _Group(click.Group):
    """Turns library errors into clear one-line messages with exit status 1."""

    def invoke(self, ctx):
        from spamnb.mail.sources import SourceError
        from spamnb.storage.store import ModelError

        try:
            return super().invoke(ctx)
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
            click.echo(f"spamnb: error: {text}", err=True)
            ctx.exit(1)


def _silence_stdout():
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real file descriptor (tests)
        pass


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="spamnb")
def main():
    """spamnb: a naive Bayes spam filter for your own mail.

    \b
    Train on labelled mail, then classify a mailbox:
      spamnb train --ham ~/Mail/ham --spam ~/Mail/spam
      spamnb classify ~/Maildir
    \b
    Or run it as a procmail/maildrop filter (see `spamnb filter --help`).
    Without a model of your own, a default one trained on the shipped corpus is used.
    """


# -- shared options -----------------------------------------------------------


def model_options(f):
    f = click.option("--allow-insecure-model", is_flag=True,
                     help="Load a model file that other users can write (administrators only: "
                          "a model file is code).")(f)
    f = click.option("--model", "model_path", type=click.Path(dir_okay=False),
                     help="Model file (default $SPAMNB_MODEL, else $XDG_DATA_HOME/spamnb/model.joblib).")(f)
    return f


def decision_options(f):
    for name, text in [
        ("--ham-cutoff", "Decide ham when P(spam|x) <= this."),
        ("--spam-cutoff", "Decide spam when P(spam|x) > this."),
        ("--cost-unsure", "Loss of holding a message as unsure."),
        ("--cost-fn", "Loss of letting a spam through (default 1)."),
        ("--cost-fp", "Loss of filing a ham as spam (default 10)."),
    ]:
        f = click.option(name, type=float, help=text)(f)
    return f


def source_options(f):
    f = click.option("--strict", is_flag=True, help="Stop at the first unreadable message.")(f)
    f = click.option("--recursive", "-r", is_flag=True, help="Also read maildir/MH sub-folders.")(f)
    return f


def cutoffs_from(model_cutoffs, cost_fp, cost_fn, cost_unsure, spam_cutoff, ham_cutoff):
    """The decision to apply: explicit cut-offs, else costs, else the model's."""
    from spamnb.nb.decision import Cutoffs
    from spamnb.model import DEFAULT_COSTS

    if spam_cutoff is not None or ham_cutoff is not None:
        if any(c is not None for c in (cost_fp, cost_fn, cost_unsure)):
            raise click.UsageError("give either costs or cut-offs, not both")
        # One cut-off given: the other is the model's, moved just enough to keep ham <= spam.
        spam = spam_cutoff if spam_cutoff is not None else max(model_cutoffs.spam_cutoff, ham_cutoff)
        ham = ham_cutoff if ham_cutoff is not None else min(model_cutoffs.ham_cutoff, spam)
        return Cutoffs(float(ham), float(spam))
    if any(c is not None for c in (cost_fp, cost_fn, cost_unsure)):
        fp = DEFAULT_COSTS[0] if cost_fp is None else cost_fp
        fn = DEFAULT_COSTS[1] if cost_fn is None else cost_fn
        return Cutoffs.from_costs(fp, fn, cost_unsure)
    return model_cutoffs


def _skipper(counter):
    def on_error(source, exc):
        counter[0] += 1
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        click.echo(f"spamnb: skipped {source}: {reason}", err=True)
    return on_error


def labelled(ham, spam, index, *, recursive=False, strict=False, on_error=None):
    """All messages of the --ham/--spam/--index sources, as sources.Message."""
    from spamnb.mail.sources import iter_index, iter_messages

    for label, specs in (("ham", ham), ("spam", spam)):
        for spec in specs:
            yield from iter_messages(spec, label=label, recursive=recursive, strict=strict,
                                     on_error=on_error)
    for spec in index:
        yield from iter_index(spec, strict=strict, on_error=on_error)


def _shard_progress():
    """A progress callback for sharded work: messages merged so far, in place on stderr."""
    def show(n):
        click.echo(f"\r  {n} messages...", err=True, nl=False)
    return show


def _notice(text):
    click.echo(f"spamnb: {text}", err=True)


def _open(model_path, allow_insecure_model):
    from spamnb.storage.modelfile import open_model

    return open_model(model_path, allow_insecure=allow_insecure_model, notice=_notice)


# -- train ---------------------------------------------------------------------


def model_settings_options(f):
    """Options that define a model: event model, λ, prior, features, tokenizer, decision."""
    opts = [
        click.option("--model-type", type=click.Choice(["multinomial", "bernoulli", "complement"]),
                     default="multinomial", show_default=True, help="Naive Bayes event model."),
        click.option("--alpha", type=click.FloatRange(min=0.0), default=None,
                     help="Smoothing λ >= 0 (0 = maximum likelihood, 1 = Laplace; default 0.01)."),
        click.option("--refine-rounds", type=click.IntRange(min=0), default=None,
                     help="Rounds of training on errors after counting: the training messages not "
                          "classified right by --refine-margin are added again (default 10; 0 = off)."),
        click.option("--refine-margin", type=click.FloatRange(min=0.0), default=None,
                     help="The margin, in log-odds, for --refine-rounds (default 10)."),
        click.option("--prior", type=click.Choice(["learned", "smoothed", "uniform"]), default="learned",
                     show_default=True, help="Class prior: N_k/N, (N_k+λ)/(N+2λ), or 1/2."),
        click.option("--features", type=click.Choice(["counts", "presence", "presence-l2", "logtf-l2"]),
                     default=None, help="What a message's row holds (default presence-l2: each token "
                                        "once, the message scaled to unit length)."),
        click.option("--only-headers", metavar="LIST", help="Comma-separated header names: tokenize only these."),
        click.option("--skip-headers", metavar="LIST", help="Comma-separated header names never tokenized."),
        click.option("--bigrams/--no-bigrams", default=None, help="Also use word pairs as tokens."),
        click.option("--max-part-bytes", type=click.IntRange(min=1),
                     help="Tokenize at most this many bytes of each part."),
        click.option("--hash-features", type=click.IntRange(min=1, max=2**31 - 1), metavar="N",
                     help="Hash tokens into N columns (e.g. 1048576) instead of keeping a vocabulary: "
                          "memory bounded by N, at a small cost in accuracy."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return decision_options(f)


def scale_options(f):
    """Where tokenizing and counting run: --jobs local processes, or a Dask cluster."""
    opts = [
        click.option("--jobs", "-j", type=click.IntRange(min=1), default=1, show_default=True,
                     help="Worker processes tokenizing and counting (the model is the same for any N)."),
        click.option("--backend", type=click.Choice(["multiprocessing", "loky", "dask"]), default="multiprocessing",
                     show_default=True,
                     help="multiprocessing: local worker processes forked from this one (fast to start); "
                          "loky: fresh local interpreters; dask: the workers of a Dask cluster (--scheduler)."),
        click.option("--scheduler", metavar="ADDRESS",
                     help="Dask scheduler address, e.g. tcp://10.0.0.1:8786 (with --backend dask)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def runner_from(jobs, backend, scheduler):
    """The :class:`spamnb.scale.parallel.Runner` of the --jobs/--backend/--scheduler options."""
    from spamnb.scale.parallel import Runner

    if backend == "dask" and not scheduler:
        raise click.UsageError("--backend dask needs --scheduler ADDRESS")
    if scheduler and backend != "dask":
        raise click.UsageError("--scheduler is for --backend dask")
    return Runner(jobs=jobs, backend=backend, scheduler=scheduler)


def model_factory(model_type, alpha, prior, features, only_headers, skip_headers, bigrams,
                  max_part_bytes, cost_fp, cost_fn, cost_unsure, spam_cutoff, ham_cutoff, hash_features=None,
                  refine_rounds=None, refine_margin=None):
    """A function making fresh, untrained models with the settings of the options.

    Settings are checked here, once, so a bad value fails before any mail is read.
    """
    from spamnb import model as model_mod
    from spamnb.nb.decision import Cutoffs
    from spamnb.mail.tokenizer import TokenizerConfig

    changes = {}
    if only_headers is not None:
        changes["only_headers"] = _header_list(only_headers)
    if skip_headers is not None:
        changes["skip_headers"] = _header_list(skip_headers)
    if bigrams is not None:
        changes["bigrams"] = bigrams
    if max_part_bytes is not None:
        changes["max_part_bytes"] = max_part_bytes
    tok = TokenizerConfig.from_dict({**TokenizerConfig().to_dict(), **changes})
    default_cut = Cutoffs.from_costs(*model_mod.DEFAULT_COSTS)
    cutoffs = cutoffs_from(default_cut, cost_fp, cost_fn, cost_unsure, spam_cutoff, ham_cutoff)
    kwargs = {"alpha": alpha, "features": features, "hash_features": hash_features,
              "refine_rounds": refine_rounds, "refine_margin": refine_margin}
    kwargs = {k: v for k, v in kwargs.items() if v is not None}

    def make():
        return model_mod.SpamModel(model_type=model_type, prior=prior, tokenizer=tok, cutoffs=cutoffs, **kwargs)

    make()
    return make


@main.command()
@click.option("--ham", multiple=True, metavar="SRC", help="Ham source (maildir, mbox, MH, folder, archive, file).")
@click.option("--spam", multiple=True, metavar="SRC", help="Spam source.")
@click.option("--index", multiple=True, metavar="FILE",
              help="TREC index file (`spam PATH` / `ham PATH` lines), or an archive holding one.")
@model_options
@click.option("--min-df", type=click.IntRange(min=1), default=1, show_default=True,
              help="Drop tokens seen in fewer messages than this.")
@click.option("--dedupe/--no-dedupe", default=True, show_default=True,
              help="Count a message given twice once (by Message-ID, else content) and record every "
                   "message's key in the model, for learn/forget; --no-dedupe counts every message "
                   "given and records no keys (huge corpora: a key costs ~100 bytes of memory).")
@model_settings_options
@scale_options
@source_options
def train(ham, spam, index, model_path, allow_insecure_model, min_df, dedupe, jobs, backend, scheduler,
          recursive, strict, **settings):
    """Build a new model from labelled mail (replaces the model file).

    Messages are read, tokenized and counted in shards of 512, on --jobs
    processes or a Dask cluster, and merged in order: the model is the same
    whatever the number of workers.

    \b
    Example:
      spamnb train --ham ~/Maildir/.Ham --spam ~/Maildir/.Junk --model model.joblib
      spamnb train --index corpora/spamassassin.tar.xz --model model.joblib
      spamnb train --index big/index --jobs 8 --model model.joblib
      spamnb train --index /shared/big/index --backend dask --scheduler tcp://10.0.0.1:8786
    """
    from spamnb.scale import parallel
    from spamnb.model import LABELS
    from spamnb.storage.modelfile import resolve, save_model

    if not (ham or spam or index):
        raise click.UsageError("give training mail: --ham SRC and --spam SRC, or --index FILE")
    if min_df > 1 and settings.get("hash_features"):
        raise click.UsageError("--min-df needs a vocabulary: it cannot be combined with --hash-features")
    model = model_factory(**settings)()
    runner = runner_from(jobs, backend, scheduler)
    path, _ = resolve(model_path)
    skipped = [0]
    start = time.perf_counter()
    on_error = _skipper(skipped)
    shards = parallel.plan(ham, spam, index, recursive=recursive, strict=strict, on_error=on_error)
    tty = sys.stderr.isatty()
    parallel.train(model, shards, runner=runner, registry=dedupe, on_error=on_error,
                   progress=_shard_progress() if tty else None)
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
    from spamnb.storage.store import model_lock

    with model_lock(path):  # a concurrent learn/forget finishes first, then sees the new model
        save_model(model, path)
    seconds = time.perf_counter() - start
    click.echo(
        f"trained {model.model_type} model on {int(counts[0])} ham and {int(counts[1])} spam "
        f"({n_tokens} tokens, distinct per message; vocabulary {len(model.vocabulary)}) in {seconds:.1f} s"
        + (f"; skipped {skipped[0]} unreadable" if skipped[0] else "")
        + f"\nsaved to {path}", err=True)


def _header_list(text):
    return tuple(h.strip().lower() for h in text.split(",") if h.strip())


# -- classify ------------------------------------------------------------------


@main.command()
@click.argument("sources", nargs=-1, required=True, metavar="SRC...")
@model_options
@click.option("--format", "fmt", type=click.Choice(["table", "jsonl", "tsv"]), default="table",
              show_default=True, help="Output format.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=1, show_default=True,
              help="Worker processes (output stays in input order).")
@decision_options
@source_options
def classify(sources, model_path, allow_insecure_model, fmt, jobs, cost_fp, cost_fn, cost_unsure,
             spam_cutoff, ham_cutoff, recursive, strict):
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

    model, path, is_default = _open(model_path, allow_insecure_model)
    cut = cutoffs_from(model.cutoffs, cost_fp, cost_fn, cost_unsure, spam_cutoff, ham_cutoff)
    skipped = [0]
    # iter_messages checks its source when called: a missing one fails here, before any output.
    readers = [iter_messages(spec, recursive=recursive, strict=strict, on_error=_skipper(skipped))
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


# -- learn / forget --------------------------------------------------------------


def _learn_options(f):
    """The options and arguments learn and forget share."""
    f = click.argument("sources", nargs=-1, required=True, metavar="SRC...")(model_options(source_options(f)))
    f = click.option("--ham", "label", flag_value="ham", help="The messages are ham.")(f)
    f = click.option("--spam", "label", flag_value="spam", help="The messages are spam.")(f)
    return f


def _labelled(sources, label, recursive, strict):
    """``(raw, label)`` of every message in ``sources``; unreadable ones are reported
    and counted in the returned one-element list."""
    from spamnb.mail.sources import iter_messages

    skipped = [0]
    messages = [(m.raw, label) for spec in sources
                for m in iter_messages(spec, label=label, recursive=recursive, strict=strict,
                                       on_error=_skipper(skipped))]
    return messages, skipped


@main.command()
@_learn_options
def learn(label, sources, model_path, allow_insecure_model, recursive, strict):
    """Learn messages as spam or ham (as bogofilter -s / -n).

    Learning the same message twice under the same label counts once (by its
    Message-ID, else its content); learning it under the other label moves it.
    Without a model of your own, learning starts from the default model.

    \b
    Example:
      spamnb learn --spam ~/Maildir/.Junk/cur/1700000000.M1P2.host:2,S
    """
    from spamnb.storage.modelfile import resolve, updating

    if label is None:
        raise click.UsageError("say what the messages are: --spam or --ham")
    path, is_default = resolve(model_path)
    if is_default:  # a user's first learn: their own model, seeded with the default one
        from spamnb.storage import store
        path = store.default_model_path()
        _notice(f"creating your model at {path}, starting from the default model")
    messages, skipped = _labelled(sources, label, recursive, strict)
    with updating(path, allow_insecure=allow_insecure_model, create=_default_seed) as model:
        done = model.learn(messages)
    click.echo(f"learned {done['learned']} as {label}, moved {done['moved']}, "
               f"{done['unchanged']} already known" + (f"; skipped {skipped[0]}" if skipped[0] else ""),
               err=True)


def _default_seed():
    """A new model's starting point: the cached default model, else a fresh build."""
    from spamnb.storage.modelfile import build_default_model, default_cache_path, load_model

    cached = default_cache_path()
    return load_model(cached) if cached.exists() else build_default_model()


@main.command()
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


# -- filter --------------------------------------------------------------------


class _FilterCommand(click.Command):
    """``filter`` never loses mail: a bad command line passes the message through too.

    Click rejects bad options (``--evidence abc``, a stray argument) while
    parsing, before the command body runs; it would then print usage, write
    nothing and exit 2, the *unsure* status. Here the message goes to stdout
    unchanged and the exit status is 3, as for any other error.
    """

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.ClickException as exc:
            from spamnb.delivery.hook import EXIT_ERROR

            click.echo(f"spamnb filter: {exc.format_message().rstrip('.')}; message passed through unchanged",
                       err=True)
            try:
                stdout = sys.stdout.buffer
                stdout.write(sys.stdin.buffer.read())
                stdout.flush()
            except OSError:
                pass
            raise click.exceptions.Exit(EXIT_ERROR) from None


@main.command("filter", cls=_FilterCommand)
@model_options
@click.option("--exit-zero", is_flag=True, help="Exit 0 for any classification (for procmail's :0fw).")
@click.option("--learn", "-u", "learn_", is_flag=True,
              help="Also learn the message as what it was classified, when not unsure (as bogofilter -u).")
@click.option("--evidence", type=click.IntRange(min=0), default=0, metavar="N",
              help="Add an X-Spam-Evidence header with the N strongest tokens.")
@click.option("--socket", "socket_path", metavar="PATH",
              help="Ask the `spamnb serve` server on this socket first (default $SPAMNB_SOCKET, else "
                   "$XDG_RUNTIME_DIR/spamnb/socket, else /tmp/spamnb-$UID/socket; used when it is there).")
@decision_options
def filter_(model_path, allow_insecure_model, exit_zero, learn_, evidence, socket_path,
            cost_fp, cost_fn, cost_unsure, spam_cutoff, ham_cutoff):
    """Filter one message from standard input to standard output.

    Adds X-Spam-Flag: YES|NO and X-Spam-Status: Yes|No|Unsure, probability=...,
    score=..., model=..., version=... to the header. Exit status as bogofilter's:
    0 spam, 1 ham, 2 unsure, 3 error (0 for all with --exit-zero). On any error
    the message is written out unchanged and the exit status is 3: mail is never lost.

    Started as the `spamnb` program, it answers through a running `spamnb serve`
    when it can, else from the model's compiled scorer, else the full way:
    the output is the same whichever way answers.

    \b
    procmail:
      :0fw
      | spamnb filter --exit-zero
      :0:
      * ^X-Spam-Flag: YES
      .Junk/
    """
    from spamnb.delivery.hook import EXIT_CODES, EXIT_ERROR

    stdin = sys.stdin.buffer
    stdout = sys.stdout.buffer
    raw = b""
    try:
        raw = stdin.read()
        out, label = _filter_message(raw, model_path, allow_insecure_model, learn_, evidence,
                                     (cost_fp, cost_fn, cost_unsure, spam_cutoff, ham_cutoff))
        code = 0 if exit_zero else EXIT_CODES[label]
    except BaseException as exc:  # noqa: BLE001 - mail is never lost, whatever went wrong
        click.echo(f"spamnb filter: {exc.__class__.__name__}: {exc}; message passed through unchanged",
                   err=True)
        out, code = raw, EXIT_ERROR
    try:
        stdout.write(out)
        stdout.flush()
    except OSError:
        code = EXIT_ERROR
    sys.exit(code)


def _filter_message(raw, model_path, allow_insecure_model, learn_, n_evidence, decision):
    from spamnb.delivery.hook import add_headers, header_lines

    model, path, is_default = _open(model_path, allow_insecure_model)
    cut = cutoffs_from(model.cutoffs, *decision)
    toks = model.tokens(raw)  # once, for the decision and the evidence
    result = model.classify_tokens(toks, cutoffs=cut)
    evidence = None
    if n_evidence:
        evidence = [(tok, c) for tok, _, c in model.explain(raw, n_evidence, toks=toks).tokens]
    from spamnb.delivery.fastfilter import model_name

    name = model_name(path, is_default)  # the header says the same on both paths
    lines = header_lines(result.label, result.spam_probability, result.score, name, __version__, evidence)
    if learn_ and result.label != "unsure" and not is_default:
        from spamnb.storage.modelfile import updating

        with updating(path, allow_insecure=allow_insecure_model) as m:
            m.learn([(raw, result.label)])
    return add_headers(raw, lines), result.label


# -- serve -----------------------------------------------------------------------


@main.command()
@click.option("--socket", "socket_path", metavar="PATH",
              help="Socket to listen on (default $SPAMNB_SOCKET, else $XDG_RUNTIME_DIR/spamnb/socket, "
                   "else /tmp/spamnb-$UID/socket; its folder is made mode 0700).")
@model_options
@click.option("--max-bytes", type=click.IntRange(min=1), default=64 * 1024 * 1024, show_default=True,
              help="Refuse messages larger than this (the client then filters them itself).")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              help="Drop a request that has not arrived whole within this many seconds.")
def serve(socket_path, model_path, allow_insecure_model, max_bytes, timeout):
    """Keep the model loaded and filter messages for `spamnb filter`.

    `spamnb filter` uses the server when its socket is there and it serves the
    same model, and does the work itself otherwise, with the same result. The
    model is reloaded when its file changes (after learn, forget or train).
    Only your own processes may connect. Stops on SIGTERM or Ctrl-C.

    \b
    Example:
      spamnb serve &
      spamnb filter --exit-zero < message.eml
    """
    from spamnb.storage.locate import default_socket_path
    from spamnb.delivery.server import ServerError, serve as run_server

    _, path, _ = _open(model_path, allow_insecure_model)  # builds the default model if needed
    try:
        run_server(socket_path or default_socket_path(), str(path), allow_insecure=allow_insecure_model,
                   max_bytes=max_bytes, timeout=timeout)
    except ServerError as exc:
        raise click.ClickException(str(exc)) from None


# -- sort ------------------------------------------------------------------------


@main.command()
@click.argument("maildir", type=click.Path(exists=True, file_okay=False))
@model_options
@click.option("--spam-folder", default=".Junk", show_default=True, help="Maildir++ folder for spam.")
@click.option("--unsure-folder", default=None, help="Maildir++ folder for unsure messages (default: leave them).")
@click.option("--dry-run", "-n", is_flag=True, help="Say what would move; move nothing.")
@decision_options
def sort(maildir, model_path, allow_insecure_model, spam_folder, unsure_folder, dry_run,
         cost_fp, cost_fn, cost_unsure, spam_cutoff, ham_cutoff):
    """File spam (and optionally unsure mail) out of a maildir, by rename.

    Messages keep their file names and their cur/ or new/ place; moving is a
    rename within the maildir, so it is atomic and safe while mail is delivered.

    \b
    Example:
      spamnb sort ~/Maildir --spam-folder .Junk --unsure-folder .Unsure --dry-run
    """
    from spamnb.delivery.maildir_sort import plan_moves

    model, _, is_default = _open(model_path, allow_insecure_model)
    cut = cutoffs_from(model.cutoffs, cost_fp, cost_fn, cost_unsure, spam_cutoff, ham_cutoff)
    folders = {"spam": spam_folder, "unsure": unsure_folder}
    from spamnb.delivery.maildir_sort import move

    moved = 0
    for src, dst, label in plan_moves(model, maildir, folders, cut):
        click.echo(f"{label:<6} {os.path.relpath(src, maildir)} -> {os.path.relpath(dst, maildir)}")
        if dry_run or move(src, dst):
            moved += 1
    click.echo(f"{'would move' if dry_run else 'moved'} {moved} message(s)"
               + (" [default model]" if is_default else ""), err=True)


# -- explain / info / tokens -------------------------------------------------------


@main.command()
@click.argument("message", metavar="MSG")
@model_options
@click.option("-n", "count", type=click.IntRange(min=1), default=15, show_default=True,
              help="How many tokens to show.")
def explain(message, model_path, allow_insecure_model, count):
    """Show why a message got its score: the prior and the strongest tokens.

    Contributions are in log-odds (natural log); positive means spammier.
    MSG is a message file or - for standard input.

    \b
    Example:
      spamnb explain ~/Maildir/cur/1700000000.M1P2.host:2,S
    """
    from spamnb.mail.sources import iter_messages

    model, _, is_default = _open(model_path, allow_insecure_model)
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


@main.command()
@model_options
def info(model_path, allow_insecure_model):
    """Show what a model holds.

    \b
    Example:
      spamnb info --model model.joblib
    """
    import datetime

    model, path, is_default = _open(model_path, allow_insecure_model)
    counts = model.messages
    stats = model.stats

    def when(t):
        return datetime.datetime.fromtimestamp(t).isoformat(timespec="seconds") if t else "never"

    rows = [
        ("model file", f"{path}" + (" (default model)" if is_default else "")),
        ("size", f"{os.path.getsize(path) / 1e6:.1f} MB"),
        ("model type", f"{model.model_type}, features {model.features}"),
        ("alpha (λ)", f"{model.alpha:g}"),
        ("refine", f"{model.refine_rounds} rounds, margin {model.refine_margin:g}"),
        ("prior", model.prior),
        ("cut-offs", f"ham if P(spam) <= {model.cutoffs.ham_cutoff:g}, spam if > {model.cutoffs.spam_cutoff:g}"),
        ("messages", f"{int(counts[0])} ham, {int(counts[1])} spam"),
        ("vocabulary", f"{len(model.vocabulary)} tokens"),
        ("tokenizer", ", ".join(f"{k}={v}" for k, v in model.tokenizer.to_dict().items())),
        ("created", when(stats.get("created"))),
        ("updated", when(stats.get("updated"))),
        ("written by", f"spamnb {stats.get('spamnb_version')}"),
    ]
    for k, v in rows:
        click.echo(f"{k + ':':<12} {v}")


@main.command()
@click.argument("message", metavar="FILE|-")
@model_options
@click.option("--default-settings", is_flag=True, help="Use the default tokenizer settings, not the model's.")
def tokens(message, model_path, allow_insecure_model, default_settings):
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
        from spamnb.storage.modelfile import resolve

        path, is_default = resolve(model_path)
        if path.exists() or model_path is not None:  # an explicit --model must be there
            from spamnb.storage.modelfile import load_model

            config = load_model(path, allow_insecure=allow_insecure_model).tokenizer
    out = sys.stdout
    for msg in iter_messages(message, strict=True):
        for tok in tokenize(msg.raw, config):
            out.write(tok + "\n")


def _register_evaluate():
    from spamnb.cli.evaluate import evaluate

    main.add_command(evaluate)


_register_evaluate()
