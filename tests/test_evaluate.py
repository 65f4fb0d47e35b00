"""Evaluation protocols: no peeking, exact fold models, and the command."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from spamnb.evaluation import evaluate as ev
from spamnb.cli import main
from spamnb.evaluation.folds import stratified_kfold
from spamnb.model import SpamModel


def corpus(n=40, seed=0):
    """Small synthetic labelled mail: spam talks money, ham talks code."""
    rng = np.random.default_rng(seed)
    spam_words = ["cash", "winner", "free", "offer", "click", "viagra", "prize", "money"]
    ham_words = ["python", "meeting", "patch", "review", "lunch", "kernel", "thanks", "draft"]
    shared = ["the", "and", "today", "please", "about", "this"]
    out = []
    for i in range(n):
        label = "spam" if i % 3 == 0 else "ham"
        pool = spam_words if label == "spam" else ham_words
        # a little noise: one word from the other class
        other = ham_words if label == "spam" else spam_words
        words = list(rng.choice(pool, 6)) + list(rng.choice(shared, 4)) + [str(rng.choice(other))]
        raw = f"Subject: {words[0]} {words[1]}\n\n{' '.join(words)} msg{i}\n".encode()
        out.append((f"m{i}", raw, label))
    return out


def test_cross_validation_equals_models_trained_from_scratch():
    msgs = corpus(30)
    folds = stratified_kfold([lb for _, _, lb in msgs], 3, seed=1)
    result = ev.cross_validate(lambda: SpamModel(alpha=0.5), msgs, folds=folds)
    for f in range(3):
        model = SpamModel(alpha=0.5)
        train = [(raw, lb) for (_, raw, lb), g in zip(msgs, folds) if g != f]
        model.learn(train, registry=False)
        X, _ = model._rows([model.tokens(raw) for raw, _ in train], grow=False)
        model.refine_rows(X, [lb == "spam" for _, lb in train])  # as `train` does
        test = [raw for (_, raw, _), g in zip(msgs, folds) if g == f]
        scores = [r.score for r in model.classify_many(test)]
        np.testing.assert_allclose(result.score[folds == f], scores, rtol=1e-9, atol=1e-9)


def test_online_classifies_before_learning():
    msgs = corpus(12)
    seen = []

    class Spy(SpamModel):
        def score_tokens(self, token_lists):
            seen.append(("score", int(self.class_count.sum())))
            return super().score_tokens(token_lists)

    result = ev.online(lambda: Spy(alpha=0.5), msgs)
    # message i is scored by a model that has learned exactly the i messages before it
    assert seen == [("score", i) for i in range(len(msgs))]
    assert result.n_trained == len(msgs)
    # the very first message is scored by an empty model: no evidence, P = 1/2
    assert result.proba[0] == pytest.approx(0.5)


def test_online_matches_replayed_models():
    msgs = corpus(10)
    result = ev.online(lambda: SpamModel(alpha=0.5), msgs)
    for i in (3, 7):
        m = SpamModel(alpha=0.5)
        m.learn([(raw, lb) for _, raw, lb in msgs[:i]], registry=False)
        assert m.classify(msgs[i][1]).score == pytest.approx(result.score[i], rel=1e-9, abs=1e-9)


def test_online_times_each_step_without_tokenizing():
    # scripts/bench_online_growth.py reads these: one classify + learn time a message
    msgs = corpus(15)
    result = ev.online(lambda: SpamModel(alpha=0.5), msgs, train_on="errors")
    assert result.step_seconds.shape == (len(msgs),) and (result.step_seconds >= 0).all()
    assert result.step_seconds.sum() == pytest.approx(result.classify_seconds + result.train_seconds)


def test_online_train_on_errors_learns_less():
    msgs = corpus(60)
    all_ = ev.online(lambda: SpamModel(alpha=0.5), msgs)
    errors = ev.online(lambda: SpamModel(alpha=0.5), msgs, train_on="errors")
    margin = ev.online(lambda: SpamModel(alpha=0.5), msgs, train_on="margin", margin=1e9)
    assert errors.n_trained < all_.n_trained
    assert margin.n_trained == len(msgs)  # every score is within an infinite margin
    with pytest.raises(ValueError, match="train_on"):
        ev.online(SpamModel, msgs, train_on="sometimes")


def test_train_test_scores_every_test_message():
    msgs = corpus(30)
    result = ev.train_test(lambda: SpamModel(alpha=0.5), msgs[:20], msgs[20:])
    assert result.sources == [s for s, _, _ in msgs[20:]]
    assert result.n_trained == 20


@pytest.fixture
def labelled_dirs(tmp_path):
    for name, raw, label in corpus(45):
        d = tmp_path / label
        d.mkdir(exist_ok=True)
        (d / name).write_bytes(raw)
    return tmp_path


def test_evaluate_command_json_and_scores(labelled_dirs, tmp_path):
    scores = tmp_path / "scores.tsv"
    r = CliRunner().invoke(main, ["evaluate", "--ham", str(labelled_dirs / "ham"), "--spam",
                                  str(labelled_dirs / "spam"), "--folds", "3", "--json",
                                  "--scores", str(scores), "--alpha", "0.5"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["n_ham"] == 30 and s["n_spam"] == 15
    assert s["n_ham_ham"] + s["n_ham_unsure"] + s["n_ham_spam"] == 30
    for key in ("auc", "one_minus_auc_pct", "lam_pct", "recall_at_fpr", "wacc_pct", "tcr",
                "train_seconds", "messages_per_second", "fp_pct", "fn_pct"):
        assert key in s
    lines = scores.read_text().splitlines()[1:]
    assert len(lines) == 45 and {ln.split("\t")[0] for ln in lines} == {"ham", "spam"}


def test_evaluate_command_protocol_errors(labelled_dirs):
    args = ["evaluate", "--ham", str(labelled_dirs / "ham"), "--spam", str(labelled_dirs / "spam")]
    r = CliRunner().invoke(main, args + ["--online", "--folds", "3"])
    assert r.exit_code != 0 and "one protocol" in r.output
    r = CliRunner().invoke(main, ["evaluate", "--ham", str(labelled_dirs / "ham")])
    assert r.exit_code != 0 and "both ham and spam" in r.output
    assert "Traceback" not in r.output


def test_evaluate_online_table(labelled_dirs):
    r = CliRunner().invoke(main, ["evaluate", "--ham", str(labelled_dirs / "ham"), "--spam",
                                  str(labelled_dirs / "spam"), "--online", "--shuffle", "--seed", "3",
                                  "--train-on", "errors"])
    assert r.exit_code == 0, r.output
    assert "online (train on errors, shuffled)" in r.stdout
    assert "(1-AUC)%" in r.stdout and "lam%" in r.stdout


def test_label_order_sorted_by_class_is_recognised():
    rng = np.random.default_rng(0)
    sorted_ = ["ham"] * 400 + ["spam"] * 200
    assert ev.grouped_by_label(sorted_) and ev.grouped_by_label(sorted_[::-1])
    assert ev.label_runs(sorted_) == (2, pytest.approx(1 + 2 * 400 * 200 / 600))
    assert ev.grouped_by_label(sorted_[:200] + sorted_[400:500] + sorted_[200:400] + sorted_[500:])  # 4 blocks
    assert not ev.grouped_by_label(list(rng.permutation(sorted_)))
    assert not ev.grouped_by_label(["ham", "spam"] * 300)
    # Mail as it arrives comes in bursts (spam in runs of 1 to 10, ham between), still in
    # far more runs than an index listed class by class.
    bursty = []
    while len(bursty) < 3000:
        bursty += ["ham"] * int(rng.geometric(1 / 30)) + ["spam"] * int(rng.integers(1, 11))
    assert not ev.grouped_by_label(bursty)
    assert not ev.grouped_by_label(["ham"] * 50)  # one class: nothing to say (the metrics refuse it)
    assert not ev.grouped_by_label(["ham", "spam"])  # too few to tell


def test_evaluate_online_warns_when_the_order_is_sorted_by_label(labelled_dirs):
    args = ["evaluate", "--ham", str(labelled_dirs / "ham"), "--spam", str(labelled_dirs / "spam"), "--online"]
    r = CliRunner().invoke(main, args)  # --ham then --spam: all ham, then all spam
    assert r.exit_code == 0, r.output
    warning = [ln for ln in r.stderr.splitlines() if "--shuffle" in ln]
    assert len(warning) == 1 and "sorted by label" in warning[0], r.stderr
    assert "(1-AUC)%" in r.stdout
    r = CliRunner().invoke(main, args + ["--shuffle"])
    assert r.exit_code == 0 and "--shuffle" not in r.stderr, r.stderr


def test_evaluate_plot_writes_a_png(labelled_dirs, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "roc.png"
    r = CliRunner().invoke(main, ["evaluate", "--ham", str(labelled_dirs / "ham"), "--spam",
                                  str(labelled_dirs / "spam"), "--folds", "3", "--plot", str(png)])
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def _cutoff_marks(fig):
    """{label: artist} of the cut-off marks on the ROC (points) and histogram (lines) panels."""
    roc_ax, hist_ax = fig.axes[:2]
    points = {ln.get_label(): ln for ln in roc_ax.get_lines() if "cut-off" in ln.get_label()}
    lines = {ln.get_label(): ln for ln in hist_ax.get_lines() if "cut-off" in ln.get_label()}
    return points, lines


def test_plot_marks_the_cutoffs_on_the_roc_curve_and_the_histogram():
    pytest.importorskip("matplotlib")
    from spamnb.evaluation import metrics, plots

    rng = np.random.default_rng(0)
    y = np.r_[np.zeros(400, int), np.ones(200, int)]
    score = np.r_[rng.normal(-6, 3, 400), rng.normal(5, 3, 200)]
    proba = 1 / (1 + np.exp(-score))
    fig = plots.evaluation_figure(y, score, proba=proba, cutoffs=(0.5, 0.95))
    try:
        points, lines = _cutoff_marks(fig)
        assert len(points) == 2 and len(lines) == 2, (points, lines)
        c = metrics.confusion_at_cutoffs(y, proba, 0.5, 0.95)
        # The operating points: % of ham and % of spam past each cut-off, as the table counts them.
        spam_pt = next(ln for k, ln in points.items() if k.startswith("spam cut-off"))
        ham_pt = next(ln for k, ln in points.items() if k.startswith("ham cut-off"))
        np.testing.assert_allclose(np.r_[spam_pt.get_xydata()[0]],
                                   [max(c.n_ham_spam / 400, 0.5 / 400) * 100, c.n_spam_spam / 200 * 100])
        np.testing.assert_allclose(np.r_[ham_pt.get_xydata()[0]],
                                   [(c.n_ham_unsure + c.n_ham_spam) / 400 * 100,
                                    (c.n_spam_unsure + c.n_spam_spam) / 200 * 100])
        assert "0.95" in spam_pt.get_label() and "0.5" in ham_pt.get_label()
        # The histogram's lines: the scores where P(spam) is each cut-off, log(c / (1 - c)).
        xs = sorted(ln.get_xdata()[0] for ln in lines.values())
        np.testing.assert_allclose(xs, [0.0, np.log(0.95 / 0.05)])
        assert any("cut-off" in t.get_text() for t in fig.axes[0].get_legend().get_texts())
        assert any("cut-off" in t.get_text() for t in fig.axes[1].get_legend().get_texts())
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_plot_of_a_two_state_filter_marks_one_cutoff():
    pytest.importorskip("matplotlib")
    from spamnb.evaluation import plots

    y = np.r_[np.zeros(50, int), np.ones(50, int)]
    score = np.linspace(-10, 10, 100)
    fig = plots.evaluation_figure(y, score, cutoffs=(0.7, 0.7))  # proba from the score
    points, lines = _cutoff_marks(fig)
    assert len(points) == 1 and len(lines) == 1
    np.testing.assert_allclose(next(iter(lines.values())).get_xdata()[0], np.log(0.7 / 0.3))
    fig = plots.evaluation_figure(y, score, cutoffs=(0.0, 1.0))  # no finite score: points only
    points, lines = _cutoff_marks(fig)
    assert len(points) == 2 and not lines


def test_evaluate_plot_draws_the_models_cutoffs(labelled_dirs, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from spamnb.evaluation import plots

    drawn = []
    real = plots.evaluation_figure
    monkeypatch.setattr(plots, "evaluation_figure", lambda *a, **k: drawn.append(real(*a, **k)) or drawn[-1])
    r = CliRunner().invoke(main, ["evaluate", "--ham", str(labelled_dirs / "ham"), "--spam",
                                  str(labelled_dirs / "spam"), "--folds", "3", "--spam-cutoff", "0.9",
                                  "--ham-cutoff", "0.2", "--plot", str(tmp_path / "roc.png")])
    assert r.exit_code == 0, r.output
    points, lines = _cutoff_marks(drawn[0])
    assert len(points) == 2 and len(lines) == 2
    for marks in (points, lines):
        assert any("spam cut-off P=0.9" in k for k in marks) and any("ham cut-off P=0.2" in k for k in marks)


def test_evaluate_plot_without_matplotlib_fails_before_working(labelled_dirs, tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("no matplotlib here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    calls = []
    monkeypatch.setattr(ev, "cross_validate", lambda *a, **k: calls.append(1))
    r = CliRunner().invoke(main, ["evaluate", "--ham", str(labelled_dirs / "ham"), "--spam",
                                  str(labelled_dirs / "spam"), "--plot", str(tmp_path / "x.png")])
    assert r.exit_code != 0 and "matplotlib" in r.output and "Traceback" not in r.output
    assert calls == []  # refused before any evaluation work
