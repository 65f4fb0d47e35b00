"""The spam model: tokenizer settings + vocabulary + naive Bayes counts + decision.

:class:`SpamModel` ties the pipeline together for two classes, ham (0) and spam (1)::

    raw bytes --tokenize--> tokens --Vocabulary--> CSR row --NB--> joint log-likelihoods
              --log-sum-exp--> P(spam | x) --Bayes decision (cut-offs)--> ham / unsure / spam

The *state* is counts (the estimator's ``class_count_`` / ``feature_count_``), the
vocabulary, the per-token document frequency and a registry of learned messages;
everything else is derived. A model is stored as a plain dict of builtins and
numpy arrays (:meth:`SpamModel.to_state`), never as pickled spamnb classes, so a
file written by one version can be checked and refused cleanly by another.

The score reported everywhere is the log-odds

    score(x) = log P(spam | x) − log P(ham | x)
             = [log P(spam) + log P(x | spam)] − [log P(ham) + log P(x | ham)]

and P(spam | x) = P(spam)·P(x|spam) / Σ_c P(c)·P(x|c) (docs/naive-bayes.md §2), computed
with log-sum-exp by the estimator.

:class:`MailVectorizer` is the model's first steps (tokenizer, vocabulary, features)
as a scikit-learn transformer, for pipelines of raw mail (docs/library.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from spamnb.nb import naive_bayes
from spamnb._version import __version__
from spamnb.nb.decision import Cutoffs
from spamnb.nb.estimator import Transformer, not_fitted
from spamnb.nb.membership import ZERO
from spamnb.mail.identity import (ALREADY, DUPLICATE, FORGOTTEN, KEY_BYTES, LEARNED, MOVED, legacy_message_key,
                                  message_key, tally)
from spamnb.mail.tokenizer import TokenizerConfig, tokenize
from spamnb.nb.vocabulary import HashingVocabulary, Vocabulary, vocabulary_from_state
from spamnb.verdict import DEFAULT_COSTS, LABELS, evidence, label_for

FORMAT = "spamnb-model"
# 2: message keys are message_key()'s (robust to what delivery changes); a version 1
# file is still read, its keys kept apart and moved over as their messages come back.
FORMAT_VERSION = 2
READS_VERSIONS = (1, 2)

HAM, SPAM = 0, 1  # column of each class: verdict.LABELS[HAM] == "ham"

MODEL_TYPES = {
    "multinomial": naive_bayes.MultinomialNB,
    "bernoulli": naive_bayes.BernoulliNB,
    "complement": naive_bayes.ComplementNB,
}
# The class prior (docs/naive-bayes.md §4):
#   learned   N_c / N: log 0, an infinite score, while a class has no message yet
#   laplace   (N_c + 1) / (N + 2), Laplace's rule of succession: finite from the
#             first message on, and within 1/N of N_c/N once both classes have
#             some (after 1 spam and no ham, P(spam) = 2/3, not 1)
#   smoothed  (N_c + λ) / (N + 2λ), with the counts' λ (0.01: still ~log 100 after one message)
#   uniform   1/2
PRIORS = ("learned", "laplace", "smoothed", "uniform")
DEFAULT_PRIOR = "laplace"

# What a message's row holds (Rennie et al. 2003 transforms; tools/studies/model_ablation.py):
#   counts       x_w = tf_w, the multinomial model of docs/naive-bayes.md §5
#   presence     x_w = 1 if w occurs (boolean features; Metsis et al. 2006)
#   presence-l2  x_w = 1 / sqrt(#distinct tokens): presence scaled to unit length,
#                so long messages stop outvoting short ones
#   logtf-l2     x_w = log(1 + tf_w), scaled to unit length
FEATURES = ("counts", "presence", "presence-l2", "logtf-l2")

# Defaults chosen by measurement (tools/studies/model_ablation.py, see docs/accuracy.md).
DEFAULT_FEATURES = "presence-l2"
DEFAULT_ALPHA = 0.01
# Training on errors after the counting pass ("thick threshold", see refine()):
# rounds and margin (log-odds) by measurement, docs/accuracy.md.
DEFAULT_REFINE_ROUNDS = 10
DEFAULT_REFINE_MARGIN = 10.0
# At most this many training rows are kept for refine(): memory stays bounded
# (~12 bytes per token a row) however large the corpus (a uniform sample beyond it).
REFINE_MAX_ROWS = 10_000

# Messages are tokenized and counted in batches of this many, so training holds
# one batch of token lists at a time, never the whole corpus.
BATCH = 512


def refine(estimator, X, y, rounds=DEFAULT_REFINE_ROUNDS, margin=DEFAULT_REFINE_MARGIN):
    """Training on errors with a margin ("thick threshold"), after the counting pass.

    Each round scores the training rows X (feature rows, labels y in {0, 1}) and
    adds once more, to the counts, every row not classified right by at least
    ``margin`` in log-odds:

        hard = { i : s_i · (log P(spam|x_i) − log P(ham|x_i)) < margin },  s_i = +1 spam, −1 ham

    It stops early when no row is hard. The estimator is still a naive Bayes
    model: its counts are those of the corpus with its hard messages repeated,
    which moves weight to the tokens that tell the hard cases apart (the
    "training on errors" lever; on the SpamAssassin corpus it takes
    (1-AUC)% from 0.053 to 0.013 at λ = 0.01). Returns the rows added.
    """
    if np.unique(np.asarray(y)).size < 2:  # one class: nothing to separate, and each row would
        return 0                              # be "hard" under a finite (Laplace) prior, every round
    sign = np.where(np.asarray(y) == SPAM, 1.0, -1.0)
    added = 0
    for _ in range(rounds):
        jll = estimator.predict_joint_log_proba(X)
        with np.errstate(invalid="ignore"):
            hard = np.flatnonzero(~(sign * (jll[:, SPAM] - jll[:, HAM]) >= margin))
        if not hard.size:
            break
        estimator.partial_fit(X[hard], y[hard])  # n_cw += f(x_i) for the hard rows
        added += hard.size
    return added


class ModelFormatError(ValueError):
    """A stored model this version cannot read (wrong format or version)."""


def label_id(label: str) -> int:
    """'ham' -> 0, 'spam' -> 1 (ValueError otherwise)."""
    try:
        return LABELS.index(label)
    except ValueError:
        raise ValueError(f"unknown label {label!r}: expected 'ham' or 'spam'") from None


@dataclass
class Classification:
    """The outcome for one message."""

    label: str  # 'ham' | 'unsure' | 'spam'
    spam_probability: float  # P(spam | x)
    score: float  # log-odds log P(spam|x) − log P(ham|x)
    n_tokens: int
    n_unknown: int  # tokens not in the vocabulary (ignored)


@dataclass
class Evidence:
    """What moved a decision: the prior and the strongest tokens, in log-odds."""

    prior: float  # log P(spam) − log P(ham), plus any per-class constant of the model
    tokens: list = field(default_factory=list)  # [(token, count, contribution)] strongest first
    score: float = 0.0


class SpamModel:
    """A two-class (ham/spam) naive Bayes mail filter.

    Parameters
    ----------
    model_type : {'multinomial', 'bernoulli', 'complement'}
        The naive Bayes event model (docs/naive-bayes.md §5).
    alpha : float >= 0
        Smoothing λ of every estimate.
    prior : {'laplace', 'learned', 'smoothed', 'uniform'}
        Class prior: (N_k + 1)/(N + 2), N_k/N, (N_k + λ)/(N + 2λ), or 1/2 (see :data:`PRIORS`).
    features : {'counts', 'presence', 'presence-l2', 'logtf-l2'}
        What a message's row holds (see :data:`FEATURES`). Bernoulli always
        uses presence.
    tokenizer : TokenizerConfig
    cutoffs : Cutoffs
        Decision cut-offs on P(spam | x); default from :data:`DEFAULT_COSTS`.
    hash_features : int, optional
        Hash tokens into this many columns (:class:`HashingVocabulary`)
        instead of keeping a vocabulary: memory bounded by the column count.
    """

    def __init__(self, model_type="multinomial", alpha=DEFAULT_ALPHA, prior=DEFAULT_PRIOR, features=DEFAULT_FEATURES,
                 tokenizer: TokenizerConfig | None = None, cutoffs: Cutoffs | None = None,
                 hash_features: int | None = None, refine_rounds: int = DEFAULT_REFINE_ROUNDS,
                 refine_margin: float = DEFAULT_REFINE_MARGIN):
        if model_type not in MODEL_TYPES:
            raise ValueError(f"unknown model type {model_type!r}: choose from {', '.join(MODEL_TYPES)}")
        if prior not in PRIORS:
            raise ValueError(f"unknown prior {prior!r}: choose from {', '.join(PRIORS)}")
        self.model_type = model_type
        self.alpha = float(alpha)
        self.prior = prior
        if features not in FEATURES:
            raise ValueError(f"unknown features {features!r}: choose from {', '.join(FEATURES)}")
        self.features = "presence" if model_type == "bernoulli" else features
        self.tokenizer = tokenizer or TokenizerConfig()
        self.cutoffs = cutoffs or Cutoffs.from_costs(*DEFAULT_COSTS)
        self.hash_features = None if hash_features is None else int(hash_features)
        if refine_rounds < 0 or not refine_margin >= 0:
            raise ValueError("refine rounds and margin must be >= 0")
        self.refine_rounds = int(refine_rounds)
        self.refine_margin = float(refine_margin)
        self.vocabulary = Vocabulary() if hash_features is None else HashingVocabulary(hash_features)
        # messages containing each token, with spare room (a hashed model has all its columns from the start)
        self._df = np.zeros(max(1024, len(self.vocabulary)), dtype=np.int64)
        # the day (UTC, days since 1970) each token was last in a learned message: what prune() ages by
        self.last_seen = np.zeros(len(self._df), dtype=np.int32)
        self.registry: dict[bytes, int] = {}  # message key -> class it was learned as
        # keys of a format version 1 file (legacy_message_key), until their message comes back
        self.legacy_registry: dict[bytes, int] = {}
        self.stats = {"created": time.time(), "updated": None, "spamnb_version": __version__,
                      "refine_copies": [0, 0]}  # class counts added by refine(), not messages
        self.estimator = self.new_estimator()
        self.estimator.partial_fit(np.zeros((0, 0)), np.zeros(0, dtype=int), classes=[HAM, SPAM])
        if len(self.vocabulary):
            self.estimator.grow_features(len(self.vocabulary))

    def new_estimator(self):
        kwargs = dict(alpha=self.alpha, fit_prior=self.prior != "uniform",
                      smooth_prior=self.prior in ("smoothed", "laplace"),
                      prior_alpha=1.0 if self.prior == "laplace" else None)
        return MODEL_TYPES[self.model_type](**kwargs)

    # -- counts ------------------------------------------------------------

    @property
    def class_count(self) -> np.ndarray:
        """Class counts N_c of the estimator, (ham, spam): messages, plus refine()'s copies."""
        return self.estimator.class_count_

    @property
    def messages(self) -> np.ndarray:
        """Messages learned per class, (ham, spam)."""
        return self.estimator.class_count_ - np.asarray(self.stats.get("refine_copies", (0, 0)))

    def refine_rows(self, X, y) -> int:
        """:func:`refine` this model on training feature rows X (labels 0/1) with its settings."""
        y = np.asarray(y, dtype=np.int64)
        before = self.estimator.class_count_.copy()
        added = refine(self.estimator, X, y, self.refine_rounds, self.refine_margin)
        copies = np.asarray(self.stats.get("refine_copies", (0, 0)), dtype=float)
        self.stats["refine_copies"] = (copies + self.estimator.class_count_ - before).tolist()
        return added

    @property
    def doc_freq(self) -> np.ndarray:
        """Learned messages containing each token (a view, in vocabulary order)."""
        return self._df[: len(self.vocabulary)]

    def tokens(self, raw: bytes) -> list[str]:
        """The tokens of one message under this model's tokenizer settings."""
        return tokenize(raw, self.tokenizer)

    def _rows(self, token_lists, grow):
        """Feature rows of token lists, and their unknown-token counts."""
        return feature_rows(self.vocabulary, token_lists, self.features, grow=grow)

    def _update(self, token_lists, y, sign):
        """Add (sign=+1) or subtract (sign=-1) a batch of messages' counts; returns the
        columns a subtraction touched (for :meth:`_drop_emptied`)."""
        if not token_lists:
            return None
        X, _ = self._rows(token_lists, grow=sign > 0)
        y = np.asarray(y, dtype=np.int64)
        if sign > 0:
            self.estimator.partial_fit(X, y)  # grows feature_count_ with the vocabulary
            if X.shape[1] > len(self._df):  # grow by doubling: O(1) amortised per new token
                self._df = _grown(self._df, max(X.shape[1], 2 * len(self._df)))
            np.add.at(self._df, X.indices, 1)  # df_w += #messages containing w; O(nnz), not O(V)
            self.last_seen = _grown(self.last_seen, len(self._df))
            self.last_seen[X.indices] = today()
        else:  # the registry knows these messages were learned in these classes
            try:
                self.estimator.forget(X, y)  # the exact inverse of learning the same rows
            except ValueError:
                self._subtract_clipped(X, y)
            np.subtract.at(self._df, X.indices, 1)
            np.maximum(self._df, 0, out=self._df)
        self.stats["updated"] = time.time()
        return X.indices if sign < 0 else None

    def _drop_emptied(self, cols) -> None:
        """Take the tokens among columns ``cols`` that no learned message holds any more
        out of the model (:mod:`spamnb.nb.membership`), so that forgetting a message
        leaves |V|, and with it every smoothed estimate, as it was before the message
        was learned. O(len(cols)): the last tokens move into the freed columns. A
        hashed model keeps its columns (its |V| never grew)."""
        if cols is None or not len(cols) or type(self.vocabulary) is not Vocabulary:
            return
        held = (self.estimator.feature_count_[:, cols] > ZERO).any(axis=0)
        if held.all():
            return
        n = len(self.vocabulary)
        src, dst = self.estimator.drop_features(cols[~held])  # repeated ids are dropped once
        k = self.estimator.n_features_in_
        self.vocabulary.shrink(src, dst, k)
        for a in (self._df, self.last_seen):
            a[dst] = a[src]
            a[k:n] = 0

    def _subtract_clipped(self, X, y):
        """Take rows out of their classes' counts, no count below zero.

        For a copy of a learned message that tokenizes differently from the copy
        learned: the same :func:`message_key`, but header fields a mail client
        added since (``Status: RO``) are tokens, and with length-scaled features
        every value of the row differs a little. The row learned is not stored,
        so the copy's row is taken out as far as the counts allow.
        """
        est = self.estimator
        fc = np.zeros((2, X.shape[1]))
        fc[:, : est.feature_count_.shape[1]] = est.feature_count_
        cc = est.class_count_.copy()
        for c in (HAM, SPAM):
            rows = X[y == c]
            fc[c] -= np.asarray(rows.sum(axis=0)).ravel()
            cc[c] -= rows.shape[0]
        est.set_counts(np.maximum(cc, 0.0), np.maximum(fc, 0.0))

    def learn(self, messages, *, registry=True):
        """Learn labelled messages: an iterable of ``(raw_bytes, label)``.

        With ``registry`` (the default) each message is remembered by
        :func:`message_key`: learning it again under the same label changes
        nothing, learning it under the other label *moves* it (its counts are
        subtracted from the old class first). Returns a dict of counts:
        ``learned``, ``moved``, ``unchanged`` (known before this call) and
        ``duplicates`` (copies of a message given earlier in this call, under
        the same label). :meth:`learn_each` says it of each message.
        """
        done = tally(self.learn_each(messages, registry=registry))
        return {k: done[k] for k in ("learned", "moved", "unchanged", "duplicates")}

    def learn_each(self, messages, *, registry=True) -> list[str]:
        """:meth:`learn`, saying what it did to each message, in the order given: one of
        :data:`spamnb.mail.identity.COUNTS`' outcomes (learned, moved, already, duplicate)."""
        out = []
        given: set = set()  # keys of the messages of this call so far
        for batch in batches(messages, BATCH):
            if not registry:
                self._update([self.tokens(raw) for raw, _ in batch], [label_id(lb) for _, lb in batch], +1)
                out += [LEARNED] * len(batch)
                continue
            add: dict[bytes, tuple[list, int]] = {}  # key -> (tokens, class) to add
            sub_toks, sub_y = [], []
            for raw, label in batch:
                y = label_id(label)
                key = message_key(raw)
                old = add[key][1] if key in add else self.known(key, raw)
                again = key in given
                given.add(key)
                if old == y:
                    out.append(DUPLICATE if again else ALREADY)
                    continue
                toks = self.tokens(raw)
                out.append(LEARNED if old is None else MOVED)
                if old is not None and key not in add:  # learned in an earlier batch: out of its class
                    sub_toks.append(toks)
                    sub_y.append(old)
                add[key] = (toks, y)  # a move within this batch just replaces the pending add
            emptied = self._update(sub_toks, sub_y, -1)
            self._update([t for t, _ in add.values()], [y for _, y in add.values()], +1)
            self._drop_emptied(emptied)  # after the adds: a moved message's tokens stay where they are
            self.registry.update((key, y) for key, (_, y) in add.items())
        return out

    def learn_tokens(self, token_lists, labels):
        """Learn already tokenized messages (no registry): labels 'ham'/'spam' or 0/1."""
        y = [label if isinstance(label, (int, np.integer)) else label_id(label) for label in labels]
        self._update(list(token_lists), y, +1)

    def add_counts(self, class_count, feature_count, doc_freq, *, tokens=None, registry_items=()):
        """Add counts made elsewhere (shards, :mod:`spamnb.scale.parallel`) to the model, exactly.

        Parameters
        ----------
        class_count : array (2,)
            Messages per class, N_c.
        feature_count : array (2, F)
            Per-class sums of the messages' feature rows (this model's
            transform), n_cw; ``doc_freq`` (F,): messages containing each column.
        tokens : sequence of str, optional
            The tokens of the F columns; they are looked up in (and added to)
            the vocabulary. Without it the columns are this model's ids 0..F-1
            (a caller that grew ``self.vocabulary`` itself).
        registry_items : iterable of (key, class)
            Message keys to record (later learn/forget see them as learned).

        Counts are added as n_cw ← n_cw + Δn_cw: on a fresh model the result is
        bit-for-bit the given arrays. Costs O(|V|) (the estimator re-derives its
        weights once), so merge shards first and add once.
        """
        cc = np.asarray(class_count, dtype=np.float64)
        fc = np.asarray(feature_count, dtype=np.float64)
        df = np.asarray(doc_freq, dtype=np.int64)
        if cc.shape != (2,) or fc.ndim != 2 or fc.shape[0] != 2 or df.shape != (fc.shape[1],):
            raise ValueError(f"counts have shapes {cc.shape}, {fc.shape}, {df.shape}; "
                             "expected (2,), (2, F), (F,)")
        if tokens is None:
            ids = np.arange(fc.shape[1])
            if fc.shape[1] > len(self.vocabulary):
                raise ValueError(f"{fc.shape[1]} columns of counts for a vocabulary of {len(self.vocabulary)}")
        else:
            ids = self.vocabulary.ids(tokens, grow=True)
            if ids.shape != (fc.shape[1],):
                raise ValueError(f"{ids.size} tokens for {fc.shape[1]} columns of counts")
        n = len(self.vocabulary)
        est = self.estimator
        new_fc = np.zeros((2, n))
        new_fc[:, : est.n_features_in_] = est.feature_count_
        np.add.at(new_fc, (slice(None), ids), fc)  # n_cw += Δn_cw (hashed ids may repeat)
        est.set_counts(est.class_count_ + cc, new_fc)
        self._df = _grown(self._df, n)
        np.add.at(self._df, ids, df)  # df_w += Δdf_w
        self.last_seen = _grown(self.last_seen, n)
        self.last_seen[ids] = today()
        self.registry.update(registry_items)
        self.stats["updated"] = time.time()

    def apply_journal(self, overlay) -> None:
        """Add the summed changes of the model's journal (a
        :class:`spamnb.storage.journal.Overlay` read with the tokens' texts):
        n_cw ← n_cw + Δn_cw, N_c ← N_c + ΔN_c, df_w ← df_w + Δdf_w (none below
        zero), the learned messages' classes, and each token's last-seen time.
        The learner that wrote the records computed every change from these
        same counts, so the result is the model the updates would have made."""
        if not overlay:
            return
        hashes = list(overlay.tokens)
        ids = self.vocabulary.ids([overlay.texts[h] for h in hashes], grow=True)
        est = self.estimator
        n = len(self.vocabulary)
        fc = np.zeros((2, n))
        fc[:, : est.n_features_in_] = est.feature_count_
        d = np.array([overlay.tokens[h] for h in hashes], dtype=np.float64).reshape(-1, 4)
        fc[0, ids] += d[:, 0]
        fc[1, ids] += d[:, 1]
        cc = est.class_count_ + np.asarray(overlay.d_messages)
        est.set_counts(np.maximum(cc, 0.0), np.maximum(fc, 0.0))
        self._df = _grown(self._df, n)
        self._df[ids] = np.maximum(self._df[ids] + d[:, 2].astype(np.int64), 0)
        self.last_seen = _grown(self.last_seen, n)
        self.last_seen[ids] = np.maximum(self.last_seen[ids], (d[:, 3] // 86400).astype(np.int32))
        for key, c in overlay.registry.items():
            if c < 0:
                self.registry.pop(key, None)
            else:
                self.registry[key] = c
        self.stats["updated"] = overlay.last_time
        self._drop_emptied(ids)

    def forget(self, messages):
        """Undo learning: an iterable of ``(raw_bytes, label)``.

        A message the registry knows under the other label, or not at all, is
        refused with ValueError before anything changes (bogofilter would
        subtract anyway and corrupt its counts). A message given twice is
        forgotten once. Returns the number forgotten (:meth:`forget_each`: what
        it did to each message).
        """
        return self.forget_each(messages).count(FORGOTTEN)

    def forget_each(self, messages) -> list[str]:
        """:meth:`forget`, saying what it did to each message, in the order given:
        forgotten, or duplicate (a copy of one forgotten earlier in this call)."""
        toks, ys, keys, out = [], [], {}, []
        for raw, label in messages:
            y = label_id(label)
            key = message_key(raw)
            if key in keys:  # another copy of a message forgotten here: once is all
                out.append(DUPLICATE)
                continue
            known = self.known(key, raw)
            if known != y:
                where = "not learned" if known is None else f"learned as {LABELS[known]}"
                raise ValueError(f"message was {where}, not as {label}: nothing to forget")
            toks.append(self.tokens(raw))
            ys.append(y)
            keys[key] = None
            out.append(FORGOTTEN)
        self._drop_emptied(self._update(toks, ys, -1))
        for key in keys:
            del self.registry[key]
        return out

    def known(self, key: bytes, raw: bytes):
        """The class ``raw`` (whose :func:`message_key` is ``key``) was learned as, else None.

        A message learned by a model of format version 1 is found by its old key
        (the exact bytes it had then) and its entry moved to its key now.
        """
        known = self.registry.get(key)
        if known is None and self.legacy_registry:
            known = self.legacy_registry.pop(legacy_message_key(raw), None)
            if known is not None:
                self.registry[key] = known
        return known

    def prune(self, min_df=2):
        """Drop tokens seen in fewer than ``min_df`` learned messages."""
        keep = self.vocabulary.prune(self.doc_freq, min_df=min_df)
        self._keep_features(keep)
        return len(keep)

    def age_out(self, *, older_than_days=None, max_messages=1, max_tokens=None, now_day=None):
        """Drop tokens by age and rarity, as bogofilter's ageing does; returns how many.

        A token goes when it was last in a learned message more than
        ``older_than_days`` days ago *and* is in at most ``max_messages`` learned
        messages (its document frequency): old and rare. Then, with
        ``max_tokens``, the model keeps at most that many tokens, dropping the
        rarest first and, among equally rare ones, the longest unseen.
        The tokens kept keep their counts exactly (their class totals and |V|
        change, as the tokens dropped are no longer part of the model).
        """
        n = len(self.vocabulary)
        if type(self.vocabulary) is not Vocabulary:
            raise ValueError("a model with hashed features has no tokens to age out")
        now_day = today() if now_day is None else now_day
        seen = self.last_seen[:n]
        df = self.doc_freq
        drop = np.zeros(n, dtype=bool)
        if older_than_days is not None:
            drop |= (seen < now_day - older_than_days) & (df <= max_messages)
        if max_tokens is not None and n - drop.sum() > max_tokens:
            order = np.lexsort((seen, df))  # rarest first, then least recently seen
            order = order[~drop[order]]
            drop[order[: n - drop.sum() - max_tokens]] = True
        if not drop.any():
            return 0
        keep = np.flatnonzero(~drop)
        self.vocabulary.select(keep)
        self._keep_features(keep)
        return int(drop.sum())

    def _keep_features(self, keep):
        self.estimator.select_features(keep)
        self._df = self._df[keep]
        self.last_seen = _grown(self.last_seen, len(keep) and int(keep[-1]) + 1)[keep]

    # -- scoring -----------------------------------------------------------

    def score_tokens(self, token_lists):
        """Log-odds scores and P(spam | x) for token lists; also unknown-token counts."""
        X, n_unknown = self._rows(token_lists, grow=False)
        log_post = self.estimator.predict_log_proba(X)  # normalised by log-sum-exp
        return log_odds(log_post), np.exp(log_post[:, SPAM]), n_unknown

    def classify_many(self, raws, *, cutoffs: Cutoffs | None = None):
        """Classify an iterable of raw messages; yields :class:`Classification`."""
        for batch in batches(raws, BATCH):
            yield from self.classify_token_lists([self.tokens(raw) for raw in batch], cutoffs=cutoffs)

    def classify_token_lists(self, token_lists, *, cutoffs: Cutoffs | None = None):
        """Classify messages already tokenized with :meth:`tokens`, scored together;
        yields :class:`Classification`."""
        cut = cutoffs or self.cutoffs
        score, p, n_unknown = self.score_tokens(token_lists)
        for toks, s, pi, u in zip(token_lists, score, p, n_unknown):
            known = evidence(len(toks) - int(u), self.messages)
            yield Classification(label_for(pi, cut, known=known), float(pi), float(s),
                                 len(toks), int(u))

    def classify(self, raw: bytes, *, cutoffs: Cutoffs | None = None) -> Classification:
        """Classify one raw message."""
        return self.classify_tokens(self.tokens(raw), cutoffs=cutoffs)

    def classify_tokens(self, toks, *, cutoffs: Cutoffs | None = None) -> Classification:
        """Classify one message already tokenized with :meth:`tokens`."""
        return next(self.classify_token_lists([toks], cutoffs=cutoffs))

    def linear_weights(self):
        """The model as log-odds weights: score(x) = bias + Σ_w f(x_w)·weight_w.

        Every two-class model here is linear in the feature row f(x) (see :data:`FEATURES`):
        multinomial weight_w = log P(w|spam) − log P(w|ham); Bernoulli moves the
        Σ_w log(1 − p_cw) terms into the bias. Read off the estimator itself: the
        bias is the score of an empty message, weight_w that of a message holding
        only w, minus the bias. Infinite (λ = 0) weights give NaN; use
        :meth:`score_tokens` for those models.
        """
        import scipy.sparse as sp

        n = len(self.vocabulary)
        est = self.estimator
        with np.errstate(invalid="ignore"):
            empty = est.predict_joint_log_proba(sp.csr_matrix((1, n)))
            bias = float(empty[0, SPAM] - empty[0, HAM])
            jll = est.predict_joint_log_proba(sp.identity(n, format="csr"))
            weights = (jll[:, SPAM] - jll[:, HAM]) - bias
        return bias, weights

    def lookup(self, word: str) -> list[dict]:
        """What the model holds of ``word`` (a word lookup, as bogofilter's ``bogoutil -w``): of
        the token itself, or of a plain word as a body word and in each namespace it is known
        in (:func:`spamnb.mail.tokennames.lookups`), the body word first. A row for each token
        it knows: ``{"token", "ham", "spam", "messages", "by_class", "weight"}``, where ham and
        spam are the class's feature counts, the weights the estimates come from (occurrences
        with ``features="counts"``; sums of each message's normalised weight with the ``-l2``
        features; with refine's copies of hard messages counted again), messages the learned
        messages holding it (of both classes: the model keeps one count, :attr:`doc_freq`),
        by_class those messages as ``(ham, spam)`` where the counts tell (a token that one
        class alone holds), else None, and weight its log-odds (what a message
        holding it once, and nothing else, scores beyond the prior: :meth:`linear_weights`'
        weight of that token alone). With hashed features, a token's row is its column's,
        shared with the tokens hashed there, and a column no learned message holds is no row."""
        import scipy.sparse as sp

        from spamnb.mail.tokennames import lookups

        listed = type(self.vocabulary) is Vocabulary  # hashed columns have no names to look through
        tokens = lookups(word, self.vocabulary.tokens() if listed and ":" not in word else None)
        found = [(tok, self.vocabulary.index(tok)) for tok in dict.fromkeys(tokens)]
        # a hashed vocabulary gives every token a column: one no learned message holds is not known
        found = [(tok, i) for tok, i in found if i is not None and (listed or self.doc_freq[i] > 0)]
        if not found:
            return []
        n, cols = len(self.vocabulary), np.array([i for _, i in found])
        est = self.estimator
        rows = sp.csr_matrix((np.ones(len(cols)), (np.arange(len(cols)), cols)), shape=(len(cols), n))
        with np.errstate(invalid="ignore"):
            empty = est.predict_joint_log_proba(sp.csr_matrix((1, n)))
            jll = est.predict_joint_log_proba(rows)
        weights = (jll[:, SPAM] - jll[:, HAM]) - (empty[0, SPAM] - empty[0, HAM])
        fc = est.feature_count_
        return [{"token": tok, "ham": float(fc[HAM, i]), "spam": float(fc[SPAM, i]),
                 "messages": int(self.doc_freq[i]), "by_class": _by_class(fc[:, i], int(self.doc_freq[i])),
                 "weight": float(w)}
                for (tok, i), w in zip(found, weights)]

    def explain(self, raw: bytes, n: int = 15, *, toks=None) -> Evidence:
        """The prior and the ``n`` tokens that moved the decision most.

        ``toks``: the message's :meth:`tokens`, when the caller has them already.
        """
        toks = self.tokens(raw) if toks is None else toks
        X, _ = self._rows([toks], grow=False)
        occurrences, _ = self.vocabulary.transform([toks])  # raw counts, for the reader
        bias, weights = self.linear_weights()
        ids, values = X.indices, X.data
        contrib = values * weights[ids]  # f(x_w) · weight_w
        order = np.argsort(-np.abs(contrib), kind="stable")[:n]
        names = self.vocabulary.describe(ids[order], toks)  # hashed columns: the message's tokens there
        times = occurrences[0, ids[order]].toarray().ravel()
        score = log_odds(self.estimator.predict_log_proba(X))  # the same row scored
        return Evidence(
            prior=bias,
            tokens=[(name, int(t), float(contrib[i])) for name, t, i in zip(names, times, order)],
            score=float(score[0]),
        )

    # -- persistence -------------------------------------------------------

    def to_state(self) -> dict:
        """Plain dict of builtins and arrays, for :func:`spamnb.storage.store.save_atomic`."""
        est = self.estimator
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "spamnb_version": __version__,
            "model_type": self.model_type,
            "alpha": self.alpha,
            "refine": [self.refine_rounds, self.refine_margin],
            "prior": self.prior,
            "features": self.features,
            "hash_features": self.hash_features,
            "tokenizer": self.tokenizer.to_dict(),
            "cutoffs": (float(self.cutoffs.ham_cutoff), float(self.cutoffs.spam_cutoff)),
            "vocabulary": self.vocabulary.to_state(),
            "class_count": np.asarray(est.class_count_, dtype=np.float64),
            "feature_count": np.asarray(est.feature_count_, dtype=np.float64),
            "doc_freq": self.doc_freq.copy(),
            "last_seen": self.last_seen[: len(self.vocabulary)].copy(),
            "registry": _pack_registry(self.registry),
            "legacy_registry": _pack_registry(self.legacy_registry),
            "stats": dict(self.stats),
        }

    @classmethod
    def from_state(cls, state) -> "SpamModel":
        """Rebuild a model from :meth:`to_state`'s dict; ModelFormatError if unreadable."""
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise ModelFormatError("not a spamnb model file")
        version = state.get("format_version")
        if version not in READS_VERSIONS:
            raise ModelFormatError(
                f"model format version {version!r} is not supported by spamnb {__version__} "
                f"(it reads versions {', '.join(map(str, READS_VERSIONS))}); retrain the model with this version"
            )
        try:
            model = cls(
                model_type=state["model_type"], alpha=state["alpha"], prior=state["prior"],
                refine_rounds=state["refine"][0], refine_margin=state["refine"][1],
                features=state["features"], tokenizer=TokenizerConfig.from_dict(state["tokenizer"]),
                cutoffs=Cutoffs(*state["cutoffs"]), hash_features=state.get("hash_features"),
            )
            model.vocabulary = vocabulary_from_state(state["vocabulary"])
            fc = np.asarray(state["feature_count"], dtype=np.float64)
            cc = np.asarray(state["class_count"], dtype=np.float64)
            if fc.shape != (2, len(model.vocabulary)) or cc.shape != (2,):
                raise ModelFormatError("model counts do not match its vocabulary")
            model.estimator.set_counts(cc, fc)
            model._df = np.array(state["doc_freq"], dtype=np.int64)
            if model._df.shape != (len(model.vocabulary),):
                raise ModelFormatError("model document frequencies do not match its vocabulary")
            seen = state.get("last_seen")  # absent before ageing: the day of the last update
            if seen is None:
                seen = np.full(len(model._df), int((state["stats"].get("updated") or 0) // 86400))
            model.last_seen = np.array(seen, dtype=np.int32)
            if model.last_seen.shape != model._df.shape:
                raise ModelFormatError("model last-seen days do not match its vocabulary")
            model.registry = _unpack_registry(state["registry"])
            model.legacy_registry = _unpack_registry(state.get("legacy_registry", {}))
            if version == 1:  # keys of the old message_key: found again by known()
                model.legacy_registry, model.registry = model.registry, {}
            model.stats = dict(state["stats"])
            model._drop_emptied(np.arange(len(model.vocabulary)))  # a file from before forget dropped them
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, ModelFormatError):
                raise
            raise ModelFormatError(f"model file is damaged: {exc}") from None
        return model


def _by_class(counts, messages):
    """``(ham, spam)`` of the ``messages`` holding a token whose feature counts per class are
    ``counts``, where they tell: all of one class when the other's count is zero
    (:data:`spamnb.nb.membership.ZERO`); None when both classes hold it (the model keeps
    one count of messages for both)."""
    held = [c > ZERO for c in counts]
    if held == [True, False]:
        return messages, 0
    if held == [False, True]:
        return 0, messages
    return None


def _pack_registry(registry: dict) -> dict:
    """The registry as two flat objects (16-byte keys joined, their classes as int8):
    joblib pickles a dict entry by entry in pure Python, two objects per learned message."""
    keys = list(registry)
    if not all(type(k) is bytes and len(k) == KEY_BYTES for k in keys):
        return dict(registry)
    return {"keys16": b"".join(keys), "classes": np.fromiter(registry.values(), dtype=np.int8, count=len(keys))}


def _unpack_registry(state) -> dict:
    """Inverse of :func:`_pack_registry`; also reads a plain dict (older files)."""
    if "keys16" not in state:
        return dict(state)
    blob, classes = state["keys16"], state["classes"]
    if len(blob) != KEY_BYTES * len(classes):
        raise ValueError("registry keys do not match their classes")
    return dict(zip([blob[i:i + KEY_BYTES] for i in range(0, len(blob), KEY_BYTES)], classes.tolist()))


def binary_features(features) -> bool:
    """Whether a :data:`FEATURES` transform starts from presence (else from counts)."""
    return features not in ("counts", "logtf-l2")


def log_odds(log_post):
    """score = log P(spam|x) − log P(ham|x) from rows of log posteriors (NaN-free for ±inf)."""
    with np.errstate(invalid="ignore"):
        return log_post[:, SPAM] - log_post[:, HAM]


def feature_rows(vocabulary, token_lists, features, *, grow=False):
    """The :data:`FEATURES` rows (CSR, one a message) of token lists in ``vocabulary``'s
    columns, and each message's count of tokens not in it (``grow``: added to it instead)."""
    X, n_unknown = vocabulary.transform(token_lists, grow=grow, binary=binary_features(features))
    return transform_features(X, features), n_unknown


def transform_features(X, features):
    """Apply a :data:`FEATURES` transform, in place, to a CSR count (or presence) matrix."""
    if features in ("counts", "presence"):
        return X
    if features == "logtf-l2":
        np.log1p(X.data, out=X.data)  # d_w = log(1 + tf_w)
    # x ← x / ‖x‖₂ (Rennie et al. 2003, length normalisation); empty rows stay empty
    lengths = np.diff(X.indptr)
    rows = np.repeat(np.arange(X.shape[0]), lengths)
    norms = np.sqrt(np.bincount(rows, weights=X.data * X.data, minlength=X.shape[0]))
    norms[lengths == 0] = 1.0
    X.data /= np.repeat(norms, lengths)
    return X


def today() -> int:
    """Today as days since 1970-01-01 (UTC): the unit of a token's last-seen day."""
    return int(time.time() // 86400)


def _grown(a, n):
    """``a`` padded with zeros to length ``n``."""
    if len(a) >= n:
        return a
    out = np.zeros(n, dtype=a.dtype)
    out[: len(a)] = a
    return out


def batches(iterable, size):
    """Lists of up to ``size`` consecutive items of ``iterable``, lazily."""
    batch = []
    for item in iterable:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


class MailVectorizer(Transformer):
    """Raw messages into scikit-learn: bytes -> the CSR matrix of their feature rows.

    A scikit-learn transformer made of :class:`SpamModel`'s own first steps (the
    tokenizer, the vocabulary, the :data:`FEATURES` transform), so that
    ``make_pipeline(MailVectorizer(), MultinomialNB())`` is a spam filter that
    ``GridSearchCV`` tunes and scikit-learn's metrics judge, and, given the same
    settings (``tokenizer``, ``features``, ``hash_features``) and the same
    messages, its columns are a model's tokens in the model's order and its rows
    the rows the model scores.

    Parameters
    ----------
    tokenizer : TokenizerConfig, optional
        The tokenizer's settings (default ``TokenizerConfig()``).
    features : {'counts', 'presence', 'presence-l2', 'logtf-l2'}, default 'counts'
        What a message's row holds (:data:`FEATURES`; a :class:`SpamModel` uses
        ``'presence-l2'`` unless told otherwise).
    hash_features : int, optional
        Hash tokens into this many columns instead of keeping a vocabulary.

    X is a sequence of raw messages: ``bytes`` as stored (``str`` is encoded as
    UTF-8). Attributes after ``fit``: ``vocabulary_`` (the token -> column map,
    :class:`spamnb.nb.vocabulary.Vocabulary`). ``partial_fit`` adds the new tokens
    of more messages as new columns on the right, so the rows ``transform`` gives
    afterwards are wider, which the count estimators' ``partial_fit`` takes as new
    features.
    """

    def __init__(self, *, tokenizer=None, features="counts", hash_features=None):
        self.tokenizer = tokenizer
        self.features = features
        self.hash_features = hash_features

    def _config(self):
        if self.features not in FEATURES:
            raise ValueError(f"unknown features {self.features!r}: choose from {', '.join(FEATURES)}")
        if self.tokenizer is not None and not isinstance(self.tokenizer, TokenizerConfig):
            raise ValueError(f"tokenizer must be a TokenizerConfig or None, got {type(self.tokenizer).__name__}")
        return self.tokenizer or TokenizerConfig()

    def _new_vocabulary(self):
        n = self.hash_features
        return Vocabulary() if n is None else HashingVocabulary(n)

    def _token_lists(self, X):
        """Token lists of X's messages, a batch at a time (bounded memory)."""
        config = self._config()
        if isinstance(X, (bytes, bytearray, str)):
            raise ValueError("X is one message: pass a sequence of raw messages (bytes)")
        for batch in batches(X, BATCH):
            lists = []
            for raw in batch:
                if isinstance(raw, str):
                    raw = raw.encode("utf-8", "surrogateescape")
                elif not isinstance(raw, (bytes, bytearray, memoryview)):
                    raise ValueError(f"a message must be bytes (or str), got {type(raw).__name__}")
                lists.append(tokenize(bytes(raw), config))
            yield lists

    def _rows(self, X, grow):
        blocks = [feature_rows(self.vocabulary_, lists, self.features, grow=grow)[0]
                  for lists in self._token_lists(X)]
        d = len(self.vocabulary_)  # a block made before the vocabulary grew is narrower: the same rows
        blocks = [sp.csr_matrix((b.data, b.indices, b.indptr), shape=(b.shape[0], d)) for b in blocks]
        return sp.vstack(blocks, format="csr") if blocks else sp.csr_matrix((0, d))

    def fit(self, X, y=None):
        """Learn the vocabulary of the messages X (y is ignored)."""
        self._config()
        self.vocabulary_ = self._new_vocabulary()
        return self.partial_fit(X)

    def partial_fit(self, X, y=None):
        """Add the new tokens of the messages X to the vocabulary, as new columns on the right."""
        if not hasattr(self, "vocabulary_"):
            self._config()
            self.vocabulary_ = self._new_vocabulary()
        for lists in self._token_lists(X):
            for toks in lists:
                self.vocabulary_.ids(toks, grow=True)
        return self

    def fit_transform(self, X, y=None):
        """:meth:`fit` then :meth:`transform`, in one pass over the messages."""
        self._config()
        self.vocabulary_ = self._new_vocabulary()
        return self._rows(X, grow=True)

    def transform(self, X):
        """The feature rows of the messages X, shape (len(X), len(vocabulary_)); tokens
        not in the vocabulary are left out."""
        if not hasattr(self, "vocabulary_"):
            raise not_fitted(self, "transform")
        return self._rows(X, grow=False)

    def get_feature_names_out(self, input_features=None):
        """The token of each column, in column order (hashed: ``#hash:J``)."""
        if not hasattr(self, "vocabulary_"):
            raise not_fitted(self, "get_feature_names_out")
        return np.asarray(self.vocabulary_.tokens(), dtype=object)

    def __sklearn_is_fitted__(self):
        return hasattr(self, "vocabulary_")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.two_d_array = False  # a sequence of messages, not a table
        tags.input_tags.string = True
        tags.transformer_tags.preserves_dtype = []
        return tags
