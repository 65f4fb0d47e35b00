"""Classifying many messages on several cores, results in input order.

``spamnb classify --jobs N`` hands batches of raw messages to N worker
processes. The workers are forked after the model is loaded, so they share
its pages copy-on-write instead of each loading the file again; a message
crosses the process boundary once (its bytes), a result once (a small
:class:`spamnb.model.Classification`). At most ``2·N`` batches are in flight,
so memory stays bounded however large the mailbox, and results come back in
the order the messages were read.
"""

from __future__ import annotations

import collections
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

from spamnb.model import batches

# Messages per task: large enough that pickling and scheduling are noise
# next to tokenizing, small enough to keep both workers busy to the end.
BATCH = 128

_MODEL = None  # the model inherited by forked workers


def _classify_batch(raws, cutoffs):
    return list(_MODEL.classify_many(raws, cutoffs=cutoffs))


def classify_parallel(model, raws, *, cutoffs=None, jobs=2, batch=BATCH):
    """Like ``model.classify_many(raws, cutoffs=cutoffs)``, on ``jobs`` processes.

    Yields :class:`Classification` in input order. ``jobs <= 1`` (or a
    platform without ``fork``) classifies in this process.
    """
    global _MODEL
    if jobs <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        yield from model.classify_many(raws, cutoffs=cutoffs)
        return
    _MODEL = model
    try:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
            pending = collections.deque()
            for chunk in batches(raws, batch):
                pending.append(pool.submit(_classify_batch, chunk, cutoffs))
                while len(pending) >= 2 * jobs:
                    yield from pending.popleft().result()
            while pending:
                yield from pending.popleft().result()
    finally:
        _MODEL = None
