"""Evaluation plots (``spamnb evaluate --plot``); needs the optional matplotlib.

Two panels: the ROC curve with the false-positive rate (ham misclassification)
on a log scale, as TREC's spam track draws it, and the score distributions of
ham and spam. The model's cut-offs are marked on both: on the ROC curve the
operating point each one reaches (the share of ham and of spam whose P(spam)
is past it, counted as the metrics table counts them), on the histograms a
vertical line at the score where P(spam) equals the cut-off, log(c / (1 − c)).
"""

from __future__ import annotations

import numpy as np

from spamnb.evaluation.metrics import confusion_at_cutoffs, roc_curve


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable(
            "plotting needs matplotlib: pip install 'spamnb[plot]' (or pip install matplotlib)"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def check_available() -> None:
    """Raise :class:`PlotUnavailable` now if plots cannot be drawn."""
    _pyplot()


def _cutoff_marks(y, proba, cutoffs, known=None):
    """``[(label, what, ham %, spam %, score or None)]``, one per cut-off (one for a
    two-state filter): the ROC operating point, the share of ham and of spam past
    the cut-off by the rule of :func:`confusion_at_cutoffs` (so the figures are
    the table's), and the score where P(spam) is the cut-off (None at 0 or 1)."""
    ham_c, spam_c = cutoffs
    c = confusion_at_cutoffs(y, proba, ham_c, spam_c, known)
    n_ham, n_spam = max(c.n_ham, 1), max(c.n_spam, 1)
    spam_mark = (c.n_ham_spam / n_ham * 100, c.n_spam_spam / n_spam * 100)
    if ham_c >= spam_c:  # a two-state filter: one cut-off
        marks = [("cut-off", spam_c, "filed as spam", spam_mark)]
    else:
        marks = [("ham cut-off", ham_c, "not filed as ham",
                  ((c.n_ham_unsure + c.n_ham_spam) / n_ham * 100,
                   (c.n_spam_unsure + c.n_spam_spam) / n_spam * 100)),
                 ("spam cut-off", spam_c, "filed as spam", spam_mark)]
    out = []
    for name, cut, what, (ham_pct, spam_pct) in marks:
        score = float(np.log(cut / (1 - cut))) if 0 < cut < 1 else None
        out.append((f"{name} P={cut:g}", what, ham_pct, spam_pct, score))
    return out


def evaluation_figure(y, score, title="", proba=None, cutoffs=None, known=None):
    """The figure of :func:`plot_evaluation` (a matplotlib ``Figure``; close it when done).

    ``cutoffs``: the model's ``(ham_cutoff, spam_cutoff)``, marked on both panels;
    ``proba``: each message's P(spam) (default: from ``score``, the log-odds);
    ``known``: how many of each message's tokens the model knew (none: unsure,
    as in the table).
    """
    plt = _pyplot()
    y = np.asarray(y)
    score = np.asarray(score, dtype=float)
    fig, (roc_ax, hist_ax) = plt.subplots(1, 2, figsize=(11, 4.5))
    fpr, tpr, _ = roc_curve(y, score)
    floor = 0.5 / max(1, int((y == 0).sum()))  # one half of a ham: where log scale starts
    roc_ax.step(np.maximum(fpr, floor) * 100, tpr * 100, where="post", label="ROC curve")
    roc_ax.set_xscale("log")
    roc_ax.set_xlabel("ham misclassification % (log scale)")
    roc_ax.set_ylabel("spam caught %")
    roc_ax.set_title("ROC")
    roc_ax.grid(True, which="both", alpha=0.3)
    marks = []
    if cutoffs is not None:
        if proba is None:
            with np.errstate(over="ignore"):
                proba = 1 / (1 + np.exp(-score))
        marks = _cutoff_marks(y, np.asarray(proba, dtype=float), cutoffs, known)
    styles = [("tab:green", "o", ":"), ("k", "s", "--")][-len(marks):] if marks else []
    for (label, what, ham_pct, spam_pct, _), (color, marker, _ls) in zip(marks, styles):
        roc_ax.plot([max(ham_pct, floor * 100)], [spam_pct], marker=marker, color=color, linestyle="none",
                    markersize=7, markerfacecolor="none", markeredgewidth=1.5,
                    label=f"{label}: {what}\n{ham_pct:.2f}% of ham, {spam_pct:.1f}% of spam")
    # Below the spam caught at no false positive the curve is only a vertical line at the
    # floor: start the axis there (rounded down to 10%), so the operating points stand apart.
    lowest = min([tpr[fpr == 0].max() * 100] + [m[3] for m in marks])
    roc_ax.set_ylim(max(0.0, 10 * np.floor((lowest - 2) / 10)), 101)
    if marks:
        roc_ax.legend(loc="lower right", fontsize="small")
    finite = score[np.isfinite(score)]
    lo, hi = (np.percentile(finite, [0.5, 99.5]) if finite.size else (-1, 1))
    cut_scores = [m[4] for m in marks if m[4] is not None]
    lo, hi = min([lo] + cut_scores), max([hi] + cut_scores)  # the lines stay in view
    bins = np.linspace(lo, hi, 60)
    clipped = np.clip(score, lo, hi)
    hist_ax.hist(clipped[y == 0], bins=bins, alpha=0.6, label="ham", log=True)
    hist_ax.hist(clipped[y == 1], bins=bins, alpha=0.6, label="spam", log=True)
    for (label, _, _, _, cut_score), (color, _, ls) in zip(marks, styles):
        if cut_score is not None:
            hist_ax.axvline(cut_score, color=color, linestyle=ls, linewidth=1.2,
                            label=f"{label} (score {cut_score:.2f})")
    hist_ax.set_xlabel("score: log P(spam|x) − log P(ham|x)")
    hist_ax.set_ylabel("messages")
    hist_ax.set_title("score distributions")
    bottom, top = hist_ax.get_ylim()
    hist_ax.set_ylim(bottom, top * 30)  # headroom on the log scale: the legend above the bars
    hist_ax.legend(fontsize="small", loc="upper center", ncol=2)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_evaluation(path, y, score, title="", proba=None, cutoffs=None, known=None):
    """Write the ROC curve and the score histograms of one evaluation to ``path`` (PNG),
    with the cut-offs marked when given (see :func:`evaluation_figure`)."""
    plt = _pyplot()
    fig = evaluation_figure(y, score, title=title, proba=proba, cutoffs=cutoffs, known=known)
    try:
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
