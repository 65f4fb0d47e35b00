"""``spamnb evaluate``: measure a model configuration on labelled mail."""

from __future__ import annotations

import json

import click

from spamnb.cli.options import (check_alpha, labelled, model_factory, model_settings_options, notice,
                                runner_from, scale_options, skipper, source_options, trust_index_option)


def _messages(ham, spam, index, recursive, strict, skipped, trust_index=False):
    return [(m.source, m.raw, m.label)
            for m in labelled(ham, spam, index, recursive=recursive, strict=strict, trust_index=trust_index,
                              on_error=skipper(skipped))]


@click.command()
@click.option("--ham", multiple=True, metavar="SRC", help="Ham source.")
@click.option("--spam", multiple=True, metavar="SRC", help="Spam source.")
@click.option("--index", multiple=True, metavar="FILE", help="TREC index file or archive holding one.")
@click.option("--folds", type=click.IntRange(min=2), default=None,
              help="Stratified K-fold cross-validation (the default protocol, K=10).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of folds, --shuffle and --bootstrap.")
@click.option("--test-ham", multiple=True, metavar="SRC", help="Train on the sources above, test on this ham.")
@click.option("--test-spam", multiple=True, metavar="SRC", help="... and this spam.")
@click.option("--test-index", multiple=True, metavar="FILE", help="... or this index.")
@click.option("--online", is_flag=True,
              help="TREC's protocol: in order, classify each message, then learn it (warns when the "
                   "order is sorted by label: use --shuffle then).")
@click.option("--train-on", type=click.Choice(["all", "errors", "margin"]), default="all", show_default=True,
              help="With --online: learn every message, only errors (and unsures), or also "
                   "those within --margin.")
@click.option("--margin", type=click.FloatRange(min=0), default=5.0, show_default=True,
              help="Thick threshold, in log-odds, for --train-on margin.")
@click.option("--shuffle", is_flag=True, help="With --online: shuffle the order (deterministic with --seed).")
@click.option("--bootstrap", "resamples", type=click.IntRange(min=0), default=200, show_default=True,
              help="95% intervals of (1-AUC)% and the recalls from N resamples of ham and spam apart "
                   "(0: none).")
@click.option("--worst", type=click.IntRange(min=0), default=5, show_default=True,
              help="Name the N highest-scored ham and N lowest-scored spam, with the pairs each "
                   "misorders (0: none).")
@click.option("--json", "as_json", is_flag=True, help="Print the metrics as JSON.")
@click.option("--plot", type=click.Path(dir_okay=False), help="Write the ROC curve and score histograms (PNG), the model's cut-offs marked on both.")
@click.option("--scores", type=click.Path(dir_okay=False),
              help="Write each message's gold label, score, probability, known tokens and source (TSV).")
@model_settings_options
@scale_options
@source_options
@trust_index_option
def evaluate(ham, spam, index, folds, seed, test_ham, test_spam, test_index, online, train_on, margin,
             shuffle, resamples, worst, as_json, plot, scores, jobs, backend, scheduler, recursive, strict, trust_index,
             **settings):
    """Measure a model configuration on labelled mail.

    \b
    Protocols (same sources as `train`):
      --folds K        stratified K-fold cross-validation (default, K=10)
      --test-* SRC     train on the sources, test on other ones
      --online         TREC spam track: classify each message, then learn it
    \b
    --jobs/--backend: K-fold tokenizes and counts the messages on that many
    processes (or a Dask cluster), and train/test its training messages; the
    figures are the same for any number of workers. --online is sequential.
    \b
    Metrics: counts, accuracy and misclassification % at the model's cut-offs,
    ROC AUC and (1-AUC)%, lam%, spam recall at 0.1% and 1% false positives,
    weighted accuracy and total cost ratio (λ = 1, 9, 999), speeds; a 95%
    bootstrap interval of (1-AUC)% and of both recalls (--bootstrap), and the
    worst-ranked ham and spam by name (--worst).
    \b
    Example:
      spamnb evaluate --index corpora/spamassassin.tar.xz --folds 10
      spamnb evaluate --index ../shared/corpora/trec06c-dev/index --online --shuffle \\
          --only-headers subject,from,to,content-type,content-transfer-encoding
    \b
    (trec06c-dev, the TREC 2006 Chinese corpus part, is research use only and
    not shipped: see docs/corpora.md.)
    """
    import numpy as np

    from spamnb.evaluation import evaluate as ev
    from spamnb.evaluation import metrics

    check_alpha(settings.get("alpha"), refuse=False)
    make_model = model_factory(**settings)
    runner = runner_from(jobs, backend, scheduler)
    if plot:
        from spamnb.evaluation.plots import PlotUnavailable, check_available

        try:
            check_available()  # before the long run, not after it
        except PlotUnavailable as exc:
            raise click.ClickException(str(exc)) from None
    if not (ham or spam or index):
        raise click.UsageError("give labelled mail: --ham SRC and --spam SRC, or --index FILE")
    testing = bool(test_ham or test_spam or test_index)
    if sum([online, testing, folds is not None]) > 1:
        raise click.UsageError("choose one protocol: --folds, --test-..., or --online")
    skipped = [0]
    if not (online or testing):  # K-fold: the workers read the messages themselves
        from spamnb.scale import parallel

        messages = parallel.plan(ham, spam, index, recursive=recursive, strict=strict, trust_index=trust_index,
                                 on_error=skipper(skipped))
    else:
        messages = _messages(ham, spam, index, recursive, strict, skipped, trust_index)
    if online:
        if shuffle:
            order = np.random.default_rng(seed).permutation(len(messages))
            messages = [messages[i] for i in order]
        else:
            _warn_if_sorted_by_label([label for _, _, label in messages])
        result = ev.online(make_model, messages, train_on=train_on, margin=margin)
        protocol = f"online (train on {train_on}{', shuffled' if shuffle else ''})"
    elif testing:
        test = _messages(test_ham, test_spam, test_index, recursive, strict, skipped, trust_index)
        result = ev.train_test(make_model, messages, test, runner=runner)
        protocol = "train/test"
    else:
        k = folds or 10
        result = ev.cross_validate(make_model, messages, k=k, seed=seed, runner=runner)
        protocol = f"{k}-fold cross-validation"
    if len(set(result.y.tolist())) < 2:
        raise click.ClickException("the test messages need both ham and spam to compute the metrics")
    cut = make_model().cutoffs
    summary = metrics.summary(result.y, result.score, result.proba, (cut.ham_cutoff, cut.spam_cutoff),
                              known=result.known)
    n = len(result.y)
    summary.update(protocol=protocol, train_seconds=result.train_seconds,
                   tokenize_seconds=result.tokenize_seconds,
                   messages_per_second=n / max(result.classify_seconds + result.tokenize_seconds, 1e-9),
                   trained_messages=result.n_trained, skipped=skipped[0])
    if resamples:
        summary["intervals"] = metrics.bootstrap_intervals(result.y, result.score, n=resamples, seed=seed)
    if worst:
        summary["worst"] = result.worst(worst)
    if scores:
        result.write_tsv(scores)
    if plot:
        from spamnb.evaluation.plots import plot_evaluation

        plot_evaluation(plot, result.y, result.score, title=protocol, proba=result.proba,
                        cutoffs=(cut.ham_cutoff, cut.spam_cutoff), known=result.known)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        click.echo(format_summary(summary))


def _warn_if_sorted_by_label(labels) -> None:
    """One line on stderr when --online would run an order sorted by label (--ham then --spam,
    or a TREC index listed class by class, as the shipped ones are)."""
    from spamnb.evaluation.evaluate import grouped_by_label, label_runs

    if grouped_by_label(labels):
        runs, expected = label_runs(labels)
        how = (f"sorted by label (all {labels[0]}, then all {labels[-1]})" if runs <= 2 else
               f"grouped by label ({runs} runs of one label; a random order has about {expected:.0f})")
        notice(f"warning: the messages are {how}, and --online takes them in that order: "
               f"add --shuffle, or give them in the order they arrived")


def format_summary(s) -> str:
    """The metrics as an aligned text table."""
    rec, iv = s["recall_at_fpr"], s.get("intervals")
    rows = [
        ("protocol", s["protocol"]),
        ("messages", f"{s['n_ham']} ham, {s['n_spam']} spam"),
        ("cut-offs", f"ham if P(spam) <= {s['cutoffs'][0]:g}, spam if > {s['cutoffs'][1]:g}"),
        ("ham", f"{s['n_ham_ham']} ham, {s['n_ham_unsure']} unsure, {s['n_ham_spam']} spam"),
        ("spam", f"{s['n_spam_spam']} spam, {s['n_spam_unsure']} unsure, {s['n_spam_ham']} ham"),
        ("accuracy", f"{s['accuracy_pct']:.3f} %"),
        ("ham misclassified (FP)", f"{s['fp_pct']:.3f} %"),
        ("spam misclassified (FN)", f"{s['fn_pct']:.3f} %"),
        ("ROC AUC", f"{s['auc']:.6f}  ((1-AUC)% = {s['one_minus_auc_pct']:.4f}{_interval(iv, None, '.4f')})"),
        ("lam%", f"{s['lam_pct']:.4f}"),
        ("spam recall at 0.1% FP", f"{rec['0.001']:.2f} %{_interval(iv, '0.001', '.2f')}"),
        ("spam recall at 1% FP", f"{rec['0.01']:.2f} %{_interval(iv, '0.01', '.2f')}"),
    ]
    if iv:
        rows.append(("intervals", f"{100 * iv['level']:g}%, {iv['resamples']} bootstrap resamples of ham and "
                                  f"spam apart (seed {iv['seed']})"))
    for lam in ("1", "9", "999"):
        tcr = s["tcr"][lam]
        rows.append((f"WAcc / TCR (λ={lam})", f"{s['wacc_pct'][lam]:.3f} % / "
                                           f"{'inf' if tcr is None else format(tcr, '.2f')}"))
    rows += [
        ("train seconds", f"{s['train_seconds']:.2f} (tokenizing {s['tokenize_seconds']:.2f})"),
        ("messages/s classified", f"{s['messages_per_second']:.0f}"),
    ]
    width = max(len(k) for k, _ in rows) + 2
    lines = [f"{k + ':':<{width}}{v}" for k, v in rows]
    if "worst" in s:
        lines += _worst_lines(s["worst"], s["one_minus_auc_pct"])
    return "\n".join(lines)


def _interval(iv, rate, fmt) -> str:
    """``  [low, high]`` of (1-AUC)% (``rate`` None) or of the recall at ``rate``; '' without intervals."""
    if not iv:
        return ""
    low, high = iv["one_minus_auc_pct"] if rate is None else iv["recall_at_fpr"][rate]
    return f", {100 * iv['level']:g}% [{low:{fmt}}, {high:{fmt}}]"


def _worst_lines(worst, total_pct) -> list:
    """The worst-ranked messages, one line each: the share of (1-AUC)% each accounts for
    shows when the figure is one or two messages (whose gold label may be wrong)."""
    lines = []
    for label, other, where in (("ham", "spam", "at or below"), ("spam", "ham", "at or above")):
        rows = worst[label]
        lines.append(f"worst-ranked {label}: " + ("none misorders a pair" if not rows else
                     f"score, {other} scored {where} it, its part of (1-AUC)% = {total_pct:.4f}, source"))
        lines += [f"  {r['score']:+8.2f} {r['misordered_pairs']:7d} {other:<4} {r['one_minus_auc_pct']:.4f}"
                  f" {_share(r['one_minus_auc_pct'], total_pct):<6} {r['source']}" for r in rows]
    return lines


def _share(part, whole) -> str:
    return f"({100 * part / whole:.0f}%)" if whole else "(-)"
