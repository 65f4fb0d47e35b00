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


#: A message none of whose tokens corpus() has: P(spam) is the prior (< 1/2), the filter says unsure.
# No text part: every text part gives tokens all mail shares (layout:plain-only, punct:excl:0).
UNKNOWN = b"X-Qq: qqqq\nContent-Type: application/x-zzzz\n\nzzzz yyyy\n"


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
    # tools/benchmarks/bench_online_growth.py reads these: one classify + learn time a message
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


def _tally(golds, labels):
    """The confusion counts of ``summary`` from gold labels and the filter's labels."""
    return {f"n_{g}_{lb}": sum(1 for x, y in zip(golds, labels) if (x, y) == (g, lb))
            for g in ("ham", "spam") for lb in ("ham", "unsure", "spam")}


def test_evaluate_command_json_and_scores(labelled_dirs, tmp_path):
    """Every figure of --json and every line of --scores against a computation of its own:
    models trained from scratch on the same folds, their labels from classify, the
    metrics by their formulas (pairs for the AUC). One ham has no token of the others:
    unsure in every fold, whatever its P."""
    import math

    (labelled_dirs / "ham" / "unknown").write_bytes(UNKNOWN)
    scores = tmp_path / "scores.tsv"
    r = CliRunner().invoke(main, ["evaluate", "--ham", str(labelled_dirs / "ham"), "--spam",
                                  str(labelled_dirs / "spam"), "--folds", "3", "--json",
                                  "--scores", str(scores), "--alpha", "0.5"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    rows = [ln.split("\t") for ln in scores.read_text().splitlines()[1:]]
    assert len(rows) == 46
    golds = [g for g, *_ in rows]
    raws = {name: raw for name, raw, _ in corpus(45)} | {"unknown": UNKNOWN}
    # The folds evaluate uses (seed 0, the input order), each scored by a model of its own.
    folds = stratified_kfold([g for g in golds], 3, seed=0)
    p, score, known, labels = [None] * 46, [None] * 46, [None] * 46, [None] * 46
    for f in range(3):
        model = SpamModel(alpha=0.5)
        train = [(raws[src.rsplit("/", 1)[1]], g) for (g, *_, src), k in zip(rows, folds) if k != f]
        model.learn(train, registry=False)
        X, _ = model._rows([model.tokens(raw) for raw, _ in train], grow=False)
        model.refine_rows(X, [lb == "spam" for _, lb in train])  # as `train` does
        for i in np.flatnonzero(folds == f):
            c = model.classify(raws[rows[i][4].rsplit("/", 1)[1]])
            p[i], score[i], labels[i] = c.spam_probability, c.score, c.label
            known[i] = c.n_tokens - c.n_unknown
    # --scores: gold, score, probability, known tokens (distinct in K-fold: only 0 matters)
    assert [float(x[1]) for x in rows] == [pytest.approx(v, rel=1e-5, abs=1e-5) for v in score]
    assert [float(x[2]) for x in rows] == [pytest.approx(v, rel=1e-5, abs=1e-12) for v in p]
    assert [int(x[3]) == 0 for x in rows] == [k == 0 for k in known]
    # --json
    n_ham, n_spam = golds.count("ham"), golds.count("spam")
    assert (s["n_ham"], s["n_spam"]) == (n_ham, n_spam) == (31, 15)
    assert [lb for (*_, src), lb in zip(rows, labels) if src.endswith("unknown")] == ["unsure"]
    counts = _tally(golds, labels)
    assert {k: s[k] for k in counts} == counts
    ham_s = [v for v, g in zip(score, golds) if g == "ham"]
    spam_s = [v for v, g in zip(score, golds) if g == "spam"]
    pairs = [1.0 if a > b else 0.5 if a == b else 0.0 for a in spam_s for b in ham_s]
    assert s["auc"] == pytest.approx(sum(pairs) / len(pairs), rel=1e-12)
    assert s["one_minus_auc_pct"] == pytest.approx(100 * (1 - sum(pairs) / len(pairs)), abs=1e-9)
    # 0.1% and 1% of 31 ham is no ham at all: spam recall above the highest ham score
    top_ham = max(ham_s)
    assert s["recall_at_fpr"] == {"0.001": pytest.approx(100 * sum(v > top_ham for v in spam_s) / n_spam),
                                  "0.01": pytest.approx(100 * sum(v > top_ham for v in spam_s) / n_spam)}
    n_hs, n_sh, n_hh, n_ss = (counts["n_ham_spam"], counts["n_spam_ham"], counts["n_ham_ham"],
                              counts["n_spam_spam"])
    assert s["fp_pct"] == pytest.approx(100 * n_hs / n_ham)
    assert s["fn_pct"] == pytest.approx(100 * n_sh / n_spam)
    assert s["accuracy_pct"] == pytest.approx(100 * (n_hh + n_ss) / 46)
    # lam%: hm = ham filed as spam, sm = spam not filed as spam; a rate of 0 or 1 moved half a message
    hm = min(max(n_hs / n_ham, 0.5 / n_ham), 1 - 0.5 / n_ham)
    sm = min(max((n_spam - n_ss) / n_spam, 0.5 / n_spam), 1 - 0.5 / n_spam)
    odds = math.sqrt(hm / (1 - hm) * sm / (1 - sm))
    assert s["lam_pct"] == pytest.approx(100 * odds / (1 + odds), rel=1e-12)
    for lam in (1, 9, 999):
        assert s["wacc_pct"][str(lam)] == pytest.approx(100 * (lam * n_hh + n_ss) / (lam * n_ham + n_spam))
        errors = lam * n_hs + n_sh
        assert s["tcr"][str(lam)] == (None if errors == 0 else pytest.approx(n_spam / errors))
    assert s["trained_messages"] == 46 and s["skipped"] == 0 and s["protocol"] == "3-fold cross-validation"
    assert s["train_seconds"] > 0 and s["messages_per_second"] > 0


def _split_dirs(tmp_path):
    """corpus(60) in train/{ham,spam} (the first 40) and test/{ham,spam}, and in test/ham
    a message with no token of the training mail."""
    for name, raw, label in corpus(60):
        part = "train" if int(name[1:]) < 40 else "test"
        (tmp_path / part / label).mkdir(parents=True, exist_ok=True)
        (tmp_path / part / label / name).write_bytes(raw)
    (tmp_path / "test" / "ham" / "unknown").write_bytes(UNKNOWN)


def test_evaluate_counts_what_classify_labels(tmp_path):
    """train/test through the command line: evaluate's counts are the labels `classify`
    gives the test messages with the model `train` made of the same training messages,
    at the model's cut-offs and at others, the message without known tokens unsure."""
    _split_dirs(tmp_path)
    model = str(tmp_path / "model.joblib")
    invoke = lambda *args: CliRunner().invoke(main, [str(a) for a in args])  # noqa: E731
    r = invoke("train", "--ham", tmp_path / "train/ham", "--spam", tmp_path / "train/spam",
               "--model", model, "--alpha", "0.5")
    assert r.exit_code == 0, r.output
    test_dirs = (tmp_path / "test/ham", tmp_path / "test/spam")

    def classified(*cut):
        r = invoke("classify", *test_dirs, "--model", model, "--format", "jsonl", *cut)
        assert r.exit_code == 0, r.output
        return {"/".join(row["path"].rsplit("/", 2)[1:]): row for row in map(json.loads, r.stdout.splitlines())}

    rows = classified()
    assert rows["ham/unknown"]["label"] == "unsure" and rows["ham/unknown"]["spam_probability"] < 0.5
    # cut-offs half-way between test messages' P, so the unsure band holds some of each class
    ham_p = sorted(r["spam_probability"] for k, r in rows.items() if k.startswith("ham/m"))
    spam_p = sorted(r["spam_probability"] for k, r in rows.items() if k.startswith("spam/"))
    mid = lambda ps, i: repr((ps[i] + ps[i + 1]) / 2)  # noqa: E731
    for cut in ([], ["--ham-cutoff", mid(ham_p, 7), "--spam-cutoff", mid(spam_p, 2)],
                ["--spam-cutoff", mid(spam_p, 0), "--ham-cutoff", mid(spam_p, 0)]):
        rows = classified(*cut)
        r = invoke("evaluate", "--ham", tmp_path / "train/ham", "--spam", tmp_path / "train/spam",
                   "--test-ham", test_dirs[0], "--test-spam", test_dirs[1], "--alpha", "0.5", "--json", *cut)
        assert r.exit_code == 0, r.output
        counts = _tally([k.split("/")[0] for k in rows], [row["label"] for row in rows.values()])
        assert {k: json.loads(r.stdout)[k] for k in counts} == counts, cut
        assert not cut or {row["label"] for row in rows.values()} == {"ham", "unsure", "spam"}


def test_evaluate_counts_what_classify_labels_on_the_cutoffs(tmp_path):
    """train/test with each cut-off exactly the P(spam) of a test message: evaluate counts
    it as the model's classify labels it (ham when P <= the ham cut-off, spam only when
    P > the spam cut-off), with the model train_test trains (the same P to the last bit:
    a model saved and loaded may differ in the last bits)."""
    from spamnb.cli.evaluate import _messages
    from spamnb.evaluation import metrics
    from spamnb.model import Cutoffs
    from spamnb.scale import parallel

    _split_dirs(tmp_path)
    train = _messages([str(tmp_path / "train/ham")], [str(tmp_path / "train/spam")], [], False, False, [0])
    test = _messages([str(tmp_path / "test/ham")], [str(tmp_path / "test/spam")], [], False, False, [0])
    result = ev.train_test(lambda: SpamModel(alpha=0.5), train, test)
    model = SpamModel(alpha=0.5)
    parallel.train(model, train, registry=False)  # as train_test does
    p = {src: model.classify(raw).spam_probability for src, raw, _ in test}
    assert list(result.proba) == [p[src] for src, _, _ in test]  # the same model, bit for bit
    golds = [lb for _, _, lb in test]
    ham_p = sorted(p[src] for src, _, lb in test if lb == "ham" and not src.endswith("unknown"))
    spam_p = sorted(p[src] for src, _, lb in test if lb == "spam")
    assert p[str(tmp_path / "test/ham/unknown")] not in ham_p + spam_p
    for ham_cut, spam_cut in ((ham_p[len(ham_p) // 2], spam_p[len(spam_p) // 2]),
                              (spam_p[1], spam_p[1]), (ham_p[-1], spam_p[0])):
        cut = Cutoffs(ham_cut, spam_cut)
        labels = [model.classify(raw, cutoffs=cut).label for _, raw, _ in test]
        s = metrics.summary(result.y, result.score, result.proba, tuple(cut), known=result.known)
        counts = _tally(golds, labels)
        assert {k: s[k] for k in counts} == counts, cut
        on = {src: label for (src, _, _), label in zip(test, labels) if p[src] in (ham_cut, spam_cut)}
        assert len(on) == (1 if ham_cut == spam_cut else 2)
        assert {label for src, label in on.items() if p[src] == spam_cut} <= {"unsure", "ham"}
        assert {label for src, label in on.items() if p[src] == ham_cut} == {"ham"}
        assert "spam" not in on.values()
    assert [lb for (src, _, _), lb in zip(test, labels) if src.endswith("unknown")] == ["unsure"]


def test_online_counts_what_the_models_of_the_run_label():
    """--online: message i is counted as the model trained on the messages before it labels
    it (the first by an empty model: no known token, unsure)."""
    from spamnb.evaluation import metrics

    msgs = corpus(15)
    result = ev.online(lambda: SpamModel(alpha=0.5), msgs)
    labels = []
    for i, (_, raw, _) in enumerate(msgs):
        m = SpamModel(alpha=0.5)
        m.learn([(r, lb) for _, r, lb in msgs[:i]], registry=False)
        labels.append(m.classify(raw).label)
    assert labels[0] == "unsure" and result.known[0] == 0
    s = metrics.summary(result.y, result.score, result.proba, tuple(SpamModel().cutoffs), known=result.known)
    counts = _tally([lb for _, _, lb in msgs], labels)
    assert {k: s[k] for k in counts} == counts


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
    # a ham with no known token: P(spam) is the prior, below the ham cut-off, and yet unsure
    (labelled_dirs / "ham" / "unknown").write_bytes(UNKNOWN)
    r = CliRunner().invoke(main, ["evaluate", "--ham", str(labelled_dirs / "ham"), "--spam",
                                  str(labelled_dirs / "spam"), "--folds", "3", "--spam-cutoff", "0.9",
                                  "--ham-cutoff", "0.5", "--plot", str(tmp_path / "roc.png"), "--json"])
    assert r.exit_code == 0, r.output
    points, lines = _cutoff_marks(drawn[0])
    assert len(points) == 2 and len(lines) == 2
    for marks in (points, lines):
        assert any("spam cut-off P=0.9" in k for k in marks) and any("ham cut-off P=0.5" in k for k in marks)
    # the ham cut-off's point is the table's share of ham and of spam not filed as ham
    s = json.loads(r.stdout)
    assert s["n_ham_unsure"] >= 1
    ham_pt = next(ln for k, ln in points.items() if k.startswith("ham cut-off"))
    np.testing.assert_allclose(ham_pt.get_xydata()[0],
                               [100 * (s["n_ham_unsure"] + s["n_ham_spam"]) / s["n_ham"],
                                100 * (s["n_spam_unsure"] + s["n_spam_spam"]) / s["n_spam"]])


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


def _with_a_label_error(labelled_dirs):
    """labelled_dirs, whose ranking is perfect, plus a spam filed as ham: a gold-label error."""
    spam = next(raw for _, raw, label in corpus(45) if label == "spam")
    (labelled_dirs / "ham" / "mislabelled").write_bytes(spam.replace(b"msg0", b"other"))
    return ["evaluate", "--ham", str(labelled_dirs / "ham"), "--spam", str(labelled_dirs / "spam"),
            "--folds", "3", "--alpha", "0.5"]


def test_evaluate_names_a_label_error_as_the_worst_ham_with_its_pairs(labelled_dirs, tmp_path):
    """--json: the planted label error is the worst ham, misordering a pair with every spam
    (all of (1-AUC)%); each spam's count is the one ham above it; the intervals are the
    library's on the same scores (--scores), with --seed."""
    from spamnb.evaluation import metrics

    scores = tmp_path / "scores.tsv"
    r = CliRunner().invoke(main, _with_a_label_error(labelled_dirs) + ["--json", "--scores", str(scores),
                                                                      "--seed", "4", "--worst", "3"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    rows = [ln.split("\t") for ln in scores.read_text().splitlines()[1:]]
    y = np.array([g == "spam" for g, *_ in rows], dtype=int)
    score = np.array([float(x[1]) for x in rows])
    ham = s["worst"]["ham"]
    assert [h["source"] for h in ham] == [str(labelled_dirs / "ham" / "mislabelled")]  # the others misorder none
    assert ham[0]["misordered_pairs"] == s["n_spam"] == 15
    assert ham[0]["one_minus_auc_pct"] == pytest.approx(s["one_minus_auc_pct"]) == pytest.approx(100 / 31)
    assert ham[0]["score"] == pytest.approx(score.max(), rel=1e-5)
    spam = s["worst"]["spam"]
    lowest = np.sort(score[y == 1])[:3]
    assert [x["score"] for x in spam] == [pytest.approx(v, rel=1e-5) for v in lowest]
    assert [x["source"] for x in spam] == [rows[i][4] for i in np.argsort(np.where(y == 1, score, np.inf))[:3]]
    assert [(x["misordered_pairs"], x["one_minus_auc_pct"]) for x in spam] == [(1, pytest.approx(100 / 31 / 15))] * 3
    iv = s["intervals"]
    expected = metrics.bootstrap_intervals(y, score, n=200, seed=4)  # the scores rounded by --scores
    assert iv["recall_at_fpr"] == expected["recall_at_fpr"]
    assert iv["one_minus_auc_pct"] == [pytest.approx(v, abs=1e-9) for v in expected["one_minus_auc_pct"]]
    assert (iv["resamples"], iv["seed"], iv["level"]) == (200, 4, 0.95)
    # one ham in 31: the resamples that draw it none have (1-AUC)% 0; those that draw it k times, k/31
    assert iv["one_minus_auc_pct"][0] == 0.0 and iv["one_minus_auc_pct"][1] in [pytest.approx(100 * k / 31)
                                                                                 for k in range(2, 5)]


def test_evaluate_table_shows_intervals_and_worst_lines(labelled_dirs):
    r = CliRunner().invoke(main, _with_a_label_error(labelled_dirs) + ["--bootstrap", "50", "--worst", "1"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    auc = next(ln for ln in lines if ln.startswith("ROC AUC:"))
    assert "(1-AUC)% = 3.2258, 95% [0.0000, " in auc
    assert "intervals:               95%, 50 bootstrap resamples of ham and spam apart (seed 0)" in lines
    assert next(ln for ln in lines if ln.startswith("spam recall at 0.1% FP:")).endswith(", 95% [0.00, 100.00]")
    at = lines.index("worst-ranked ham: score, spam scored at or below it, its part of (1-AUC)% = 3.2258, source")
    fields = lines[at + 1].split()
    assert fields[1:] == ["15", "spam", "3.2258", "(100%)", str(labelled_dirs / "ham" / "mislabelled")]
    assert lines[at + 2].startswith("worst-ranked spam: score, ham scored at or above it")
    assert lines[at + 3].split()[1:5] == ["1", "ham", "0.2151", "(7%)"] and len(lines) == at + 4


def test_evaluate_bootstrap_0_and_worst_0_leave_them_out(labelled_dirs):
    args = ["evaluate", "--ham", str(labelled_dirs / "ham"), "--spam", str(labelled_dirs / "spam"), "--folds", "3"]
    full = json.loads(CliRunner().invoke(main, args + ["--json"]).stdout)
    bare = json.loads(CliRunner().invoke(main, args + ["--json", "--bootstrap", "0", "--worst", "0"]).stdout)
    assert set(full) - set(bare) == {"intervals", "worst"}
    drop = ("intervals", "worst", "train_seconds", "tokenize_seconds", "messages_per_second")
    assert {k: v for k, v in full.items() if k not in drop} == {k: v for k, v in bare.items() if k not in drop}
    # a perfect ranking: nothing to name, and an interval of one point
    assert full["worst"] == {"ham": [], "spam": []} and full["intervals"]["one_minus_auc_pct"] == [0.0, 0.0]
    text = CliRunner().invoke(main, args + ["--bootstrap", "0", "--worst", "0"]).stdout
    assert "interval" not in text and "worst" not in text and "95%" not in text
    text = CliRunner().invoke(main, args).stdout
    assert "worst-ranked ham: none misorders a pair" in text.splitlines()
