"""Evaluation plots (``spamnb evaluate --plot``); needs the optional matplotlib.

Two panels: the ROC curve with the false-positive rate (ham misclassification)
on a log scale, as TREC's spam track draws it, and the score distributions of
ham and spam with the decision cut-offs marked.
"""

from __future__ import annotations

import numpy as np

from spamnb.evaluation.metrics import roc_curve


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


def plot_evaluation(path, y, score, title="", cutoff_scores=()):
    """Write the ROC curve and the score histograms of one evaluation to ``path`` (PNG)."""
    plt = _pyplot()
    y = np.asarray(y)
    score = np.asarray(score, dtype=float)
    fig, (roc_ax, hist_ax) = plt.subplots(1, 2, figsize=(11, 4.5))
    fpr, tpr, _ = roc_curve(y, score)
    floor = 0.5 / max(1, int((y == 0).sum()))  # one half of a ham: where log scale starts
    roc_ax.step(np.maximum(fpr, floor) * 100, tpr * 100, where="post")
    roc_ax.set_xscale("log")
    roc_ax.set_xlabel("ham misclassification % (log scale)")
    roc_ax.set_ylabel("spam caught %")
    roc_ax.set_title("ROC")
    roc_ax.grid(True, which="both", alpha=0.3)
    finite = score[np.isfinite(score)]
    lo, hi = (np.percentile(finite, [0.5, 99.5]) if finite.size else (-1, 1))
    bins = np.linspace(lo, hi, 60)
    clipped = np.clip(score, lo, hi)
    hist_ax.hist(clipped[y == 0], bins=bins, alpha=0.6, label="ham", log=True)
    hist_ax.hist(clipped[y == 1], bins=bins, alpha=0.6, label="spam", log=True)
    for c in cutoff_scores:
        hist_ax.axvline(c, color="k", linestyle="--", linewidth=1)
    hist_ax.set_xlabel("score: log P(spam|x) − log P(ham|x)")
    hist_ax.set_ylabel("messages")
    hist_ax.set_title("score distributions")
    hist_ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
