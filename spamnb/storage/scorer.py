"""The compiled scorer: a model's log-odds weights in a file that loads in microseconds.

Why
---
``spamnb filter`` runs once per delivered message, so its start-up is the
product's latency. Loading the joblib model (vocabulary, counts, registry)
imports numpy and joblib and unpickles the whole model, far longer than a
delivery should wait; scoring one message needs none of that,
because every two-class model here is linear in its feature row
(:meth:`spamnb.model.SpamModel.linear_weights`)::

    score(x) = bias + Σ_w f(x)_w · weight_w        (log-odds, natural log)
    P(spam | x) = 1 / (1 + exp(−score(x)))

where f is the model's feature transform (one of :data:`spamnb.model.FEATURES`):

    counts       f_w = tf_w
    presence     f_w = 1                              (w occurs)
    presence-l2  f_w = 1 / sqrt(#distinct known tokens)
    logtf-l2     f_w = log(1 + tf_w) / ‖log(1 + tf)‖₂

and unknown tokens are dropped *before* the transform (as the vocabulary does).

So :func:`write_scorer` stores (bias, weights) next to the model, keyed by a
64-bit BLAKE2b hash of each token, and :func:`load_scorer` maps the file and
looks tokens up by binary search: standard library only (no numpy), nothing
read but the header until a token is looked up.

File layout (``<model>.scorer``; native byte order, recorded in the header)::

    b"SPAMNBSC"  uint32 format version  uint32 header length    (16 bytes, little-endian)
    header: UTF-8 JSON, space-padded so the arrays start 8-byte aligned
    uint64[n]     token hashes, ascending
    float64[n]    weights, in the same order
    float64[2n]   each token's counts (n_ham, n_spam)
    bytes[16m]    the keys of the m learned messages, ascending
    int8[m]       the class each was learned as

The counts and the learned messages are what the journal's learner
(:mod:`spamnb.storage.journal`) needs to append an update without loading the
model, and what scoring with the journal's changes needs (the multinomial
model: :meth:`Scorer.score`).

Staleness
---------
The header records the identity of the model file it was compiled from:
``(st_dev, st_ino, st_size, st_mtime_ns)`` and a BLAKE2b digest of the file's
last 4 KiB (where the model's ``stats`` -- update time and a per-save random
``save_id`` -- are pickled). :func:`spamnb.storage.modelfile.save_model` compiles the
scorer from the *new* file before renaming it into place, so however saves
race, a scorer either describes the model file beside it or does not match
it; a mismatch sends the filter down the full path (slow, never wrong).

Trust
-----
A scorer is data, not code (no pickle), but a forged one changes verdicts, so
:func:`load_scorer` applies the model files' rules (:func:`spamnb.storage.store.open_trusted`):
regular file, owned by us or root, not group/world-writable, reached through no
link another user could have planted.
"""

from __future__ import annotations

import bisect
import functools
import json
import math
import mmap
import os
import struct
import sys

from spamnb.nb.membership import holds
from spamnb.verdict import evidence

__all__ = ["MAGIC", "FORMAT_VERSION", "ScorerError", "REBUILDABLE", "Scorer", "scorer_path", "token_hash",
           "prior_log_odds", "feature_values", "check_header", "FEATURES", "PRIORS",
           "file_identity", "open_checked", "cannot_compile", "write_scorer", "load_scorer", "fresh_scorer",
           "remove_scorer", "state"]

MAGIC = b"SPAMNBSC"
FORMAT_VERSION = 2
_PREAMBLE = struct.Struct("<8sII")
SUFFIX = ".scorer"
# Bytes at the end of a model file that go into its identity digest.
TAIL_BYTES = 4096

try:  # the builtin BLAKE2 (what hashlib.blake2b is), without loading OpenSSL at every start-up
    from _blake2 import blake2b
except ImportError:  # pragma: no cover - Pythons built without it
    from hashlib import blake2b


class ScorerError(Exception):
    """A scorer file is missing, untrusted, damaged or not for this model.

    ``kind`` says which, for callers that act on it: ``"missing"``, ``"stale"``
    (compiled from another model file), ``"damaged"``, ``"untrusted"`` (the
    scorer file fails the trust checks) -- all four mean the model may be fine
    and its scorer can be compiled again -- or ``"model"``: the model file itself
    is missing, not a regular file or not trusted, which the full path reports.
    """

    def __init__(self, message: str, kind: str = "damaged"):
        super().__init__(message)
        self.kind = kind


# ScorerError kinds that a new scorer, compiled from the model, would cure, in words.
REBUILDABLE = {"missing": "missing", "stale": "stale (compiled for another model file)",
               "damaged": "damaged", "untrusted": "not trusted (owner or permissions)"}
# The other kinds: "model" (see ScorerError) and "journal": the journal holds
# changes this scorer cannot add (a model other than multinomial, or an
# infinite prior); the full model, which replays them, answers until the
# next compaction.


def scorer_path(model_path) -> str:
    """Where the scorer of ``model_path`` lives: beside it, ``<model>.scorer``."""
    return os.fspath(model_path) + SUFFIX


def _token_digest(token: str) -> bytes:
    """BLAKE2b-64 of a token's UTF-8 bytes (lone surrogates kept)."""
    return blake2b(token.encode("utf-8", "surrogatepass"), digest_size=8).digest()


def token_hash(token: str) -> int:
    """64-bit key of a token: :func:`_token_digest` read little-endian."""
    return int.from_bytes(_token_digest(token), "little")


# -- identity and trust ------------------------------------------------------------


def file_identity(fd: int, st: os.stat_result | None = None) -> dict:
    """Identity of an open model file: stat fields that survive a rename, and a tail digest.

    ``st``: the file's ``os.fstat`` when the caller already has it.
    """
    st = st or os.fstat(fd)
    start = max(0, st.st_size - TAIL_BYTES)
    tail = os.pread(fd, st.st_size - start, start)
    return {"dev": st.st_dev, "ino": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "tail": blake2b(tail, digest_size=16).hexdigest()}


def open_checked(path, *, allow_insecure: bool = False, what: str = "scorer") -> tuple[int, os.stat_result]:
    """:func:`spamnb.storage.store.open_trusted`, with its refusals as ScorerError: a
    "no" only sends the caller to the full path, which says what is wrong. The
    error's kind is ``"model"`` for the model file (``what="model"``); for the
    scorer file ``"missing"``, ``"untrusted"`` or ``"damaged"``."""
    from spamnb.storage.store import ModelError, open_trusted

    try:
        return open_trusted(path, allow_insecure=allow_insecure, what=what)
    except FileNotFoundError:
        raise ScorerError(f"no {what} file {path}", "model" if what == "model" else "missing") from None
    except ModelError as exc:
        raise ScorerError(str(exc), "model" if what == "model" else "untrusted") from None
    except OSError as exc:
        raise ScorerError(f"cannot open {what} {path}: {exc.strerror or exc}",
                          "model" if what == "model" else "damaged") from None


# -- writing -----------------------------------------------------------------------


def cannot_compile(model, weights=None) -> str | None:
    """Why ``model`` has no scorer (such models are scored by the full path only), or None.

    ``weights``: ``model.linear_weights()`` when the caller has them. A 64-bit
    hash collision between two tokens, the one other reason, is found only
    while compiling (:func:`write_scorer`).
    """
    from spamnb.model import FEATURES
    from spamnb.nb.vocabulary import Vocabulary

    if type(model.vocabulary) is not Vocabulary:
        return "its features are hashed (columns, not tokens to key a scorer by)"
    if model.features not in FEATURES:
        return f"the scorer cannot compute features {model.features!r}"
    import numpy as np

    bias, w = weights if weights is not None else model.linear_weights()
    if not math.isfinite(bias):
        return "its prior is infinite (a class with no messages under the 'learned' prior)"
    if not bool(np.isfinite(w).all()):
        return "its weights are not finite (λ = 0)"
    return None


def write_scorer(model, path, identity: dict) -> bool:
    """Compile ``model`` to a scorer file at ``path`` (atomically, mode 0600).

    ``identity`` is :func:`file_identity` of the model file the scorer stands for.
    Returns False, and removes any old scorer at ``path``, when the model
    cannot be compiled: a hashed vocabulary (columns, not tokens), non-finite
    weights (λ = 0 models give ±inf/NaN) or two vocabulary tokens with the
    same 64-bit hash. Those models are scored by
    the full path only.
    """
    from array import array

    import numpy as np

    from spamnb._version import __version__
    from spamnb.nb.vocabulary import Vocabulary

    path = os.fspath(path)
    if type(model.vocabulary) is not Vocabulary:  # hashed columns: no token list to key by
        remove_scorer(path)
        return False
    bias, weights = model.linear_weights()
    # The cheap refusals before hashing the vocabulary: the filter asks again at
    # each delivery of a model that can never have a scorer.
    if cannot_compile(model, (bias, weights)) is not None:
        remove_scorer(path)
        return False
    tokens = model.vocabulary.tokens()
    # token_hash of every token, read from one buffer of digests (no Python int per token).
    # 0.12-0.13 CPU s for 137,189 tokens; a list comprehension or a chain of C maps
    # measured the same (docs/tokenizer-speed.md): the cost is BLAKE2b's, per token.
    keys = np.frombuffer(b"".join(map(_token_digest, tokens)), dtype="<u8").astype(np.uint64)
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    if len(keys) > 1 and bool((keys[1:] == keys[:-1]).any()):  # 64-bit collision
        remove_scorer(path)
        return False
    est = model.estimator
    counts = np.ascontiguousarray(np.asarray(est.feature_count_, dtype=np.float64).T[order])  # (n, 2)
    registry = sorted(model.registry.items())
    stats = model.stats
    header = {
        "format": "spamnb-scorer", "spamnb_version": __version__, "byteorder": sys.byteorder,
        "bias": float(bias), "features": model.features,
        "cutoffs": [float(model.cutoffs.ham_cutoff), float(model.cutoffs.spam_cutoff)],
        "tokenizer": model.tokenizer.to_dict(), "model": identity, "n": int(len(keys)),
        # what the journal's learner and scoring with the journal need (docs/naive-bayes.md §5)
        "model_type": model.model_type, "alpha": float(model.alpha), "prior": model.prior,
        "class_count": [float(c) for c in est.class_count_],
        "totals": [float(t) for t in np.asarray(est.feature_count_).sum(axis=1)],
        "save_id": stats.get("save_id"), "journal": stats.get("journal"),
        "legacy": len(model.legacy_registry), "m": len(registry),
    }
    text = json.dumps(header, sort_keys=True).encode("utf-8")
    text += b" " * (-(_PREAMBLE.size + len(text)) % 8)  # arrays start 8-byte aligned
    from spamnb.storage.store import companion_mode, write_bytes_atomic

    model_path = path[:-len(SUFFIX)] if path.endswith(SUFFIX) else path
    write_bytes_atomic(path, [
        _PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(text)), text,
        keys.tobytes(),  # native byte order, as the header says
        np.asarray(weights, dtype=np.float64)[order].tobytes(),
        counts.tobytes(),
        b"".join(k for k, _ in registry),
        array("b", [c for _, c in registry]).tobytes(),
    ], mode=companion_mode(model_path))
    return True


def remove_scorer(path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# -- reading -----------------------------------------------------------------------


class Scorer:
    """A loaded scorer: :meth:`score` token lists with the compiled weights, plus
    the changes of the model's journal in :attr:`overlay` (set by the caller)."""

    def __init__(self, header: dict, keys, weights, counts=None, reg_keys=b"", reg_classes=b""):
        self.bias = float(header["bias"])
        self.features = header["features"]
        self.cutoffs = tuple(header["cutoffs"])
        self.tokenizer = header["tokenizer"]
        self.identity = header["model"]
        self.header = header
        self._keys = keys
        self._weights = weights
        self._counts = counts
        self._reg_keys = reg_keys
        self._reg_classes = reg_classes
        self._table = None  # token hash -> index, once resident()
        self.overlay = None  # a journal.Overlay, or None

    def __len__(self):
        return len(self._keys)

    @functools.cached_property
    def tokenizer_config(self):
        """The tokenizer settings as :class:`spamnb.mail.tokenizer.TokenizerConfig`, made
        once a scorer (a server scores every message with the one it keeps)."""
        from spamnb.mail.tokenizer import TokenizerConfig

        return TokenizerConfig.from_dict(self.tokenizer)

    @property
    def save_id(self):
        return self.header.get("save_id")

    @property
    def folded(self):
        """What journal the snapshot folded, and up to where (see :mod:`spamnb.storage.journal`)."""
        return self.header.get("journal")

    def with_overlay(self, overlay) -> "Scorer":
        """This scorer (sharing its mapped arrays) with ``overlay`` as its journal's changes."""
        new = Scorer.__new__(Scorer)
        new.__dict__.update(self.__dict__)
        new.overlay = overlay
        return new

    def matches(self, identity: dict) -> bool:
        """Whether this scorer was compiled from the model file with ``identity``."""
        return self.identity == identity

    def resident(self) -> "Scorer":
        """Index the tokens in a dict, for a process that scores many messages
        (``spamnb serve``): a lookup is then one hash probe instead of a binary
        search over the mapped file. Costs about 100 bytes per token; the
        one-message filter path does not call it. Returns self."""
        self._table = {h: i for i, h in enumerate(self._keys.tolist())}
        return self

    def index(self, h: int):
        """Position of the token with hash ``h`` in the arrays, or None."""
        if self._table is not None:
            return self._table.get(h)
        i = bisect.bisect_left(self._keys, h)
        if i < len(self._keys) and self._keys[i] == h:
            return i
        return None

    def weight(self, token: str):
        """The token's compiled weight, or None when it is not in the snapshot's vocabulary."""
        i = self.index(token_hash(token))
        return None if i is None else self._weights[i]

    def counts(self, h: int):
        """The snapshot's ``(n_ham, n_spam)`` of the token with hash ``h``, or None."""
        i = self.index(h)
        return None if i is None else (self._counts[2 * i], self._counts[2 * i + 1])

    def learned_as(self, key: bytes):
        """The class the snapshot learned the message with ``key`` as, or None."""
        m = len(self._reg_classes)
        lo, hi = 0, m
        keys = self._reg_keys
        while lo < hi:  # binary search over the sorted 16-byte keys
            mid = (lo + hi) // 2
            if bytes(keys[16 * mid:16 * mid + 16]) < key:
                lo = mid + 1
            else:
                hi = mid
        if lo < m and bytes(keys[16 * lo:16 * lo + 16]) == key:
            return self._reg_classes[lo]
        return None

    def score(self, tokens) -> tuple[float, float, int]:
        """``(score, P(spam|x), n_known)`` of one message's tokens.

        ``n_known`` counts the distinct tokens found in the vocabulary (0 while
        the model has not learned both classes: :func:`spamnb.verdict.evidence`).
        """
        score, known = self._linear(tokens)
        return score, sigmoid(score), evidence(len(known), self.messages)

    def explain(self, tokens, n: int) -> tuple[float, float, int, list]:
        """:meth:`score` and the ``n`` known tokens that moved the score most, as
        ``(token, contribution)`` with contribution f(x)_w · weight_w, the terms
        of the sum (what :meth:`spamnb.model.SpamModel.explain` gives)."""
        score, known = self._linear(tokens)
        top = sorted(known, key=lambda term: -abs(term[1]))[:n]  # stable: ties keep message order
        return score, sigmoid(score), evidence(len(known), self.messages), top

    def _linear(self, tokens):
        """``(score, [(token, f(x)_w · weight_w)])``: score = bias + Σ_w f(x)_w · weight_w
        over the message's known tokens (unknown ones are dropped)."""
        tf: dict[str, int] = {}
        for t in tokens:
            tf[t] = tf.get(t, 0) + 1
        if self.overlay:
            bias, known = self._with_journal(tf)
        else:
            bias, known = self.bias, []  # (token, weight, tf) of known tokens
            for t, n in tf.items():
                w = self.weight(t)
                if w is not None:
                    known.append((t, w, n))
        values = feature_values(self.features, [n for _, _, n in known])
        terms = [(t, w * v) for (t, w, _), v in zip(known, values)]
        return bias + math.fsum(c for _, c in terms), terms

    @property
    def messages(self):
        """Messages per class (ham, spam) of the snapshot plus the journal (with refine()'s copies)."""
        cc = self.header["class_count"]
        if not self.overlay:
            return cc
        return [cc[c] + self.overlay.d_messages[c] for c in (0, 1)]

    def _with_journal(self, tf):
        """``(bias, [(token, weight, tf)])`` of the snapshot plus the journal's changes.

        The multinomial model only (docs/naive-bayes.md §5), as
        :class:`spamnb.nb.naive_bayes.MultinomialNB` scores it (a token whose
        messages were all forgotten is unknown again: :mod:`spamnb.nb.membership`):

            weight_w = [log(n_sw + λ) − log(n_hw + λ)] − D,  D = log(T_s + |V|·λ) − log(T_h + |V|·λ)

        with T_c = Σ_w n_cw. The journal changes the counts of its tokens, the
        totals T_c, |V| (tokens new to the model) and the class counts: the
        weights of its tokens are computed from their counts, the others'
        compiled weights move by the change of D, and the bias (the prior
        log-odds) is recomputed from the class counts. |V| changes by the
        records' ``new_vocab``: tokens that joined less those that left.
        """
        h = self.header
        ov = self.overlay
        if h.get("model_type") != "multinomial":
            raise ScorerError("the journal holds changes only the full model can add", "journal")
        lam = float(h["alpha"])
        V = self.header["n"] + ov.new_vocab
        T = [h["totals"][c] + ov.d_totals[c] for c in (0, 1)]
        D_old = _log_den_odds(h["totals"], self.header["n"], lam)
        D = _log_den_odds(T, V, lam)
        bias = prior_log_odds(h["prior"], lam, [h["class_count"][c] + ov.d_messages[c] for c in (0, 1)])
        if not (math.isfinite(bias) and math.isfinite(D)):
            raise ScorerError("with the journal's changes the model's weights are not finite", "journal")
        shift = D_old - D
        known = []
        for t, n in tf.items():
            th = token_hash(t)
            i = self.index(th)
            d = ov.tokens.get(th)
            if d is None:
                if i is not None:
                    known.append((t, self._weights[i] + shift, n))
                continue
            nh, ns = (0.0, 0.0) if i is None else (self._counts[2 * i], self._counts[2 * i + 1])
            nh, ns = max(nh + d[0], 0.0), max(ns + d[1], 0.0)
            if not holds(nh, ns):
                continue
            known.append((t, math.log(ns + lam) - math.log(nh + lam) - D, n))
        return bias, known


#: The feature transforms :func:`feature_values` computes (:data:`spamnb.model.FEATURES`)
#: and the priors :func:`prior_log_odds` knows (:data:`spamnb.model.PRIORS`), without numpy.
FEATURES = ("counts", "presence", "presence-l2", "logtf-l2")
PRIORS = ("learned", "laplace", "smoothed", "uniform")


def check_header(header) -> None:
    """ValueError, naming the field, unless ``header`` holds what a :class:`Scorer`
    reads, each of its type and in its range: a finite bias, known features and
    prior, cut-offs ``0 <= ham <= spam <= 1``, tokenizer settings this version
    knows, λ > 0, and per class finite, non-negative message counts and totals. A
    scorer file's header and a store's settings (:mod:`spamnb.storage.redisstore`)
    are both held to it, as a model file is held to
    :meth:`spamnb.model.SpamModel.from_state`'s checks."""
    from spamnb.mail.tokenizer import TokenizerConfig
    from spamnb.verdict import check_cutoffs

    if not isinstance(header, dict):
        raise ValueError("not a JSON object")

    def number(name, value, low=-math.inf):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or value < low:
            raise ValueError(f"{name} must be a finite number{' >= 0' if low == 0 else ''}, not {value!r}")

    missing = [k for k in ("bias", "features", "cutoffs", "tokenizer", "model_type", "alpha", "prior",
                           "class_count", "totals") if k not in header]
    if missing:
        raise ValueError(f"no {', '.join(missing)}")
    number("bias", header["bias"])
    if header["features"] not in FEATURES:
        raise ValueError(f"unknown features {header['features']!r}")
    if header["prior"] not in PRIORS:
        raise ValueError(f"unknown prior {header['prior']!r}")
    if not isinstance(header["model_type"], str):
        raise ValueError(f"model_type must be a name, not {header['model_type']!r}")
    number("alpha", header["alpha"], 0)
    if header["alpha"] <= 0:
        raise ValueError("alpha must be above 0")
    cut = header["cutoffs"]
    if not isinstance(cut, list) or len(cut) != 2:
        raise ValueError(f"cutoffs must be two numbers, not {cut!r}")
    for c in cut:
        number("a cut-off", c)
    check_cutoffs(*cut)
    for name in ("class_count", "totals"):
        pair = header[name]
        if not isinstance(pair, list) or len(pair) != 2:
            raise ValueError(f"{name} must be two numbers, not {pair!r}")
        for c in pair:
            number(name, c, 0)
    TokenizerConfig.from_dict(header["tokenizer"])


def _log_den_odds(totals, n_vocab, lam):
    """D = log(T_s + |V|·λ) − log(T_h + |V|·λ): the multinomial's denominators, as log-odds."""
    den = [totals[c] + n_vocab * lam for c in (0, 1)]
    if den[0] <= 0 or den[1] <= 0:
        return math.nan
    return math.log(den[1]) - math.log(den[0])


def prior_log_odds(prior: str, lam: float, class_count) -> float:
    """log P(spam) − log P(ham) of the model's prior (as
    :meth:`spamnb.nb.naive_bayes._BaseNB._class_log_prior`; docs/naive-bayes.md §4):
    ``learned`` N_k/N, ``laplace`` (N_k + 1)/(N + 2), ``smoothed`` (N_k + λ)/(N + 2λ),
    ``uniform`` 1/2, and uniform while there is no observation at all."""
    nh, ns = class_count
    if prior == "uniform":
        return 0.0
    if prior in ("smoothed", "laplace"):
        lam = 1.0 if prior == "laplace" else lam
        nh, ns = nh + lam, ns + lam
    if nh + ns <= 0:
        return 0.0
    if nh <= 0 or ns <= 0:
        return math.inf if nh <= 0 else -math.inf
    return math.log(ns) - math.log(nh)


def feature_values(features: str, tfs) -> list:
    """f(x)_w of a message's known tokens, given their counts tf_w (see
    :data:`spamnb.model.FEATURES`; the standard-library twin of
    :func:`spamnb.model.transform_features`)."""
    if features == "counts":  # f_w = tf_w
        return [float(n) for n in tfs]
    if features == "presence":  # f_w = 1
        return [1.0] * len(tfs)
    if features == "presence-l2":  # f_w = 1 / sqrt(#distinct known tokens)
        return [1.0 / math.sqrt(len(tfs))] * len(tfs) if tfs else []
    if features == "logtf-l2":  # f_w = log(1 + tf_w) / ‖log(1 + tf)‖₂
        d = [math.log1p(n) for n in tfs]
        norm = math.sqrt(math.fsum(v * v for v in d)) or 1.0
        return [v / norm for v in d]
    raise ScorerError(f"the scorer cannot score features {features!r}")  # a later version's


def sigmoid(score: float) -> float:
    """P(spam|x) = 1 / (1 + exp(−score)), without overflow for large |score|."""
    if score >= 0:
        return 1.0 / (1.0 + math.exp(-score))
    e = math.exp(score)
    return e / (1.0 + e)


def fresh_scorer(model_path, *, allow_insecure: bool = False) -> Scorer:
    """The scorer of the model at ``model_path`` if that model is trusted and the
    scorer was compiled from that very file (:func:`file_identity`); ScorerError
    otherwise (the caller then loads the model itself, which says what is wrong)."""
    fd, st = open_checked(model_path, allow_insecure=allow_insecure, what="model")
    try:
        identity = file_identity(fd, st)
    finally:
        os.close(fd)
    sc = load_scorer(scorer_path(model_path), allow_insecure=allow_insecure)
    if not sc.matches(identity):
        raise ScorerError(f"scorer of {model_path} is stale", "stale")
    return sc


def state(model_path, *, allow_insecure: bool = False) -> str:
    """The scorer of the model at ``model_path``: ``"fresh"``, or the
    :class:`ScorerError` kind that keeps :func:`fresh_scorer` from using it."""
    try:
        fresh_scorer(model_path, allow_insecure=allow_insecure)
    except ScorerError as exc:
        return exc.kind
    return "fresh"


def load_scorer(path, *, allow_insecure: bool = False) -> Scorer:
    """Map a scorer file; ScorerError when it is missing, untrusted or damaged."""
    path = os.fspath(path)
    fd, st = open_checked(path, allow_insecure=allow_insecure)
    try:
        pre = os.pread(fd, _PREAMBLE.size, 0)
        if len(pre) != _PREAMBLE.size:
            raise ScorerError(f"scorer {path} is truncated")
        magic, version, hlen = _PREAMBLE.unpack(pre)
        if magic != MAGIC or version != FORMAT_VERSION:
            raise ScorerError(f"scorer {path} has an unknown format")
        try:
            header = json.loads(os.pread(fd, hlen, _PREAMBLE.size))
            n = int(header["n"])
        except (ValueError, KeyError, TypeError):
            raise ScorerError(f"scorer {path} has a damaged header") from None
        start = _PREAMBLE.size + hlen
        try:
            m = int(header["m"])
            check_header(header)
        except (KeyError, TypeError, ValueError) as exc:
            raise ScorerError(f"scorer {path} has a damaged header ({exc})") from None
        if header.get("byteorder") != sys.byteorder or start % 8 or n < 0 or m < 0 \
                or st.st_size != start + 32 * n + 17 * m:
            raise ScorerError(f"scorer {path} is damaged or from another machine")
        if st.st_size == start:
            empty = memoryview(b"")
            return Scorer(header, empty.cast("Q"), empty.cast("d"), empty.cast("d"), b"", b"")
        mm = mmap.mmap(fd, st.st_size, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    view = memoryview(mm)
    at = start
    keys = view[at:at + 8 * n].cast("Q")
    weights = view[at + 8 * n:at + 16 * n].cast("d")
    counts = view[at + 16 * n:at + 32 * n].cast("d")
    at += 32 * n
    return Scorer(header, keys, weights, counts, view[at:at + 16 * m], view[at + 16 * m:].cast("b"))
