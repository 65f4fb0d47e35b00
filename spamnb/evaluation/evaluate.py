"""Evaluation protocols: K-fold cross-validation, train/test, and TREC's online run.

Every protocol returns :class:`Scores`: for each test message its gold label, its
score (log-odds, the ranking metrics' input), P(spam | x) and how many of its
tokens the model knew (the decision metrics' input: the filter's rule,
:func:`spamnb.verdict.label_for`), in the order the messages were given. :func:`spamnb.evaluation.metrics.summary`
turns them into the figures; ``--scores FILE`` writes them so anyone can
recompute those figures.

The protocols never let a model see a test message's label before scoring it:

* K-fold: each fold is scored by a model trained on the other folds only. The
  messages are tokenized and counted once; a fold's model keeps exactly the
  tokens seen in its training folds, so it equals a model trained from scratch
  on them (``test_evaluate`` checks this against :meth:`SpamModel.learn`).
* train/test: one model from the training sources, scored on the test sources.
* online (TREC spam track): in the given order, classify each message, *then*
  train on its gold label: always, only on errors, or when the score falls
  within a margin of the decision ("thick threshold").
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from spamnb.evaluation.folds import stratified_kfold
from spamnb.evaluation.metrics import worst_ranked
from spamnb.model import HAM, LABELS, SPAM, SpamModel, label_id, log_odds, refine, transform_features
from spamnb.nb.vocabulary import document_frequency
from spamnb.verdict import evidence, label_for

TRAIN_ON = ("all", "errors", "margin")


@dataclass
class Scores:
    """Per-message results of an evaluation, in input order."""

    sources: list = field(default_factory=list)
    y: np.ndarray = None  # 1 spam, 0 ham
    score: np.ndarray = None  # log P(spam|x) − log P(ham|x)
    proba: np.ndarray = None  # P(spam|x)
    train_seconds: float = 0.0
    classify_seconds: float = 0.0
    tokenize_seconds: float = 0.0
    n_trained: int = 0
    #: Tokens of each message the model knew (K-fold: distinct tokens); 0 means no
    #: evidence, and the filter calls such a message unsure whatever its P(spam).
    known: np.ndarray = None
    step_seconds: np.ndarray = None  # online: each message's classify + learn, tokenizing excluded

    def worst(self, n=5) -> dict:
        """The ``n`` highest-scored ham and ``n`` lowest-scored spam that misorder a pair
        (:func:`spamnb.evaluation.metrics.worst_ranked`), named: ``{"ham": [...], "spam":
        [...]}``, each entry ``source``, ``score`` (log-odds), ``misordered_pairs`` (a ham's
        spam scored at or below it, a spam's ham at or above it) and ``one_minus_auc_pct``
        (its share of (1-AUC)%). When one or two entries carry most of (1-AUC)%, the figure
        is about those messages (read them: a gold label may be wrong)."""
        return {label: [{"source": self.sources[i], "score": float(self.score[i]), "misordered_pairs": pairs,
                         "one_minus_auc_pct": share} for i, pairs, share in rows]
                for label, rows in zip(("ham", "spam"), worst_ranked(self.y, self.score, n))}

    def write_tsv(self, path) -> None:
        """``label<TAB>score<TAB>probability<TAB>known<TAB>source`` per line (``--scores``);
        ``known`` is how many of the message's tokens the model knew (0: unsure)."""
        with open(path, "w", encoding="utf-8") as f:
            f.write("# gold\tscore\tspam_probability\tknown_tokens\tsource\n")
            for src, y, s, p, k in zip(self.sources, self.y, self.score, self.proba, self.known):
                f.write(f"{LABELS[int(y)]}\t{s:.6g}\t{p:.6g}\t{int(k)}\t{src}\n")


def _tokenize(model: SpamModel, messages):
    start = time.perf_counter()
    sources, token_lists, y = [], [], []
    for source, raw, label in messages:
        sources.append(source)
        token_lists.append(model.tokens(raw))
        y.append(label_id(label))
    return sources, token_lists, np.asarray(y, dtype=np.int64), time.perf_counter() - start


def cross_validate(make_model, messages, k=10, seed=0, folds=None, runner=None) -> Scores:
    """Stratified K-fold cross-validation; scores of all folds pooled.

    Parameters
    ----------
    make_model : callable () -> SpamModel
        A fresh, untrained model with the settings to evaluate.
    messages : iterable of (source, raw bytes, label), or a :func:`spamnb.scale.parallel.plan`
    k, seed : fold count and shuffling seed of :func:`spamnb.evaluation.folds.stratified_kfold`.
    folds : array of fold ids, optional
        Use these folds instead (e.g. :func:`spamnb.evaluation.folds.hash_folds`).
    runner : spamnb.scale.parallel.Runner, optional
        Where the messages are tokenized and counted (default: this process).
        The count matrix, hence every score, is the same for any runner.
    """
    from spamnb.scale import parallel

    template = make_model()
    t0 = time.perf_counter()
    # One count matrix of all messages, built shard by shard (in parallel with a runner):
    # the same matrix vocabulary.fit_transform of all token lists gives.
    sources, X, y, _ = parallel.count_matrix(template, messages, runner=runner)
    tok_s = time.perf_counter() - t0
    fold = np.asarray(folds) if folds is not None else stratified_kfold(y, k, seed)
    score, proba = np.empty(len(y)), np.empty(len(y))
    known = np.empty(len(y), dtype=np.int64)
    train_s = classify_s = 0.0
    for f in np.unique(fold):
        tr, te = fold != f, fold == f
        t0 = time.perf_counter()
        Xtr = X[tr]
        cols = np.flatnonzero(document_frequency(Xtr))  # the fold's own vocabulary
        est = template.new_estimator()  # a fresh estimator, sized by the fold's columns
        Ftr = transform_features(Xtr[:, cols], template.features)
        est.partial_fit(Ftr, y[tr], classes=[HAM, SPAM])
        refine(est, Ftr, y[tr], template.refine_rounds, template.refine_margin)  # as `train` does
        t1 = time.perf_counter()
        Xte = X[te][:, cols]
        log_post = est.predict_log_proba(transform_features(Xte, template.features))
        # the tokens the fold's model knows: those of its training folds (a hashed model
        # knows every token, as the filter's does)
        known[te] = np.diff((X[te] if template.hash_features is not None else Xte).indptr)
        classify_s += time.perf_counter() - t1
        train_s += t1 - t0
        score[te] = log_odds(log_post)
        proba[te] = np.exp(log_post[:, SPAM])
    return Scores(sources, y, score, proba, train_s, classify_s, tok_s, int(len(y)), known)


def train_test(make_model, train, test, runner=None) -> Scores:
    """Train one model on ``train``, score ``test`` (both iterables of (source, raw, label)).

    Training is sharded (:func:`spamnb.scale.parallel.train`, on ``runner``); scoring runs here.
    """
    from spamnb.scale import parallel

    model = make_model()
    t0 = time.perf_counter()
    parallel.train(model, train, runner=runner, registry=False)
    train_s = time.perf_counter() - t0
    sources, token_lists, y, tok_s = _tokenize(model, test)
    t1 = time.perf_counter()
    score, proba, n_unknown = model.score_tokens(token_lists)
    known = np.array([len(t) for t in token_lists], dtype=np.int64) - n_unknown
    return Scores(sources, y, score, proba, train_s, time.perf_counter() - t1, tok_s,
                  int(model.messages.sum()), known)


def label_runs(labels) -> tuple:
    """``(runs, expected)``: how many runs of one label ``labels`` come in, in this
    order, and how many a random order of the same labels has on average
    (``1 + 2·n_ham·n_spam/n``, as in the Wald–Wolfowitz runs test).

    >>> label_runs(["ham", "ham", "spam", "spam"])
    (2, 3.0)
    """
    labels = list(labels)
    n = len(labels)
    if not n:
        return 0, 0.0
    runs = 1 + sum(a != b for a, b in zip(labels, labels[1:]))
    first = labels[0]
    n_first = sum(lb == first for lb in labels)
    return runs, 1 + 2 * n_first * (n - n_first) / n


def grouped_by_label(labels) -> bool:
    """True if the order is sorted by label (all ham then all spam, or the
    reverse: two runs), or grouped by label in a few blocks: at most a fiftieth
    of the runs a random order would have (``--ham A --spam B --index C``,
    indexes listed class by class one after the other).

    :func:`online` on such an order measures the order, not the filter (it
    learns no spam until the ham runs out). Mail in the order it arrived comes
    in bursts, but in far more runs: 3,000 messages, 15% spam in bursts of 1 to
    10, have about a fifth of a random order's runs. Both labels are needed,
    and enough messages to tell a sorted order from chance.
    """
    runs, expected = label_runs(labels)
    return runs < expected and runs <= max(2.0, expected / 50)


def online(make_model, messages, train_on="all", margin=0.0) -> Scores:
    """TREC's online protocol: classify each message, then learn its gold label.

    Sequential by nature (each step needs the model of all steps before it),
    so it never runs on a :class:`spamnb.scale.parallel.Runner`. The messages
    are taken in the order given: chronological, or shuffled; an order sorted by
    label (:func:`grouped_by_label`) gives figures about that order.

    Parameters
    ----------
    train_on : {'all', 'errors', 'margin'}
        Learn every message; only those the model's cut-offs misfiled (an
        unsure counts as an error); or those and the ones whose |score|
        (log-odds) is at most ``margin`` ("thick threshold").
    margin : float >= 0
        The thick threshold's half-width, in log-odds.
    """
    if train_on not in TRAIN_ON:
        raise ValueError(f"train_on must be one of {', '.join(TRAIN_ON)}, not {train_on!r}")
    model = make_model()
    sources, scores, probas, ys, known, steps = [], [], [], [], [], []
    tok_s = classify_s = train_s = 0.0
    n_trained = 0
    for source, raw, label in messages:
        y = label_id(label)
        t0 = time.perf_counter()
        toks = model.tokens(raw)
        t1 = time.perf_counter()
        s, p, n_unknown = model.score_tokens([toks])  # classify first: the label is not known yet
        t2 = time.perf_counter()
        k = evidence(len(toks) - int(n_unknown[0]), model.messages)  # 0 while a class is empty
        wrong = label_for(p[0], model.cutoffs, known=k) != LABELS[y]  # an unsure counts as an error
        if train_on == "all" or wrong or (train_on == "margin" and abs(s[0]) <= margin):
            model.learn_tokens([toks], [y])
            n_trained += 1
        t3 = time.perf_counter()
        train_s += t3 - t2
        steps.append(t3 - t1)
        tok_s += t1 - t0
        classify_s += t2 - t1
        sources.append(source)
        scores.append(s[0])
        probas.append(p[0])
        ys.append(y)
        known.append(k)
    return Scores(sources, np.asarray(ys, dtype=np.int64), np.asarray(scores), np.asarray(probas),
                  train_s, classify_s, tok_s, n_trained, np.asarray(known, dtype=np.int64), np.asarray(steps))
