"""Classifying many messages on several cores, results in input order.

``spamnb classify --jobs N`` hands batches of raw messages to N worker
processes through the executor window sharded training uses
(:func:`spamnb.scale.parallel.ordered_map`). The workers are forked after the
model is loaded, so they share its pages copy-on-write instead of each loading
the file again; a message crosses the process boundary once (its bytes), a
result once (a small :class:`spamnb.model.Classification`). At most ``2·N``
batches are in flight, so memory stays bounded however large the mailbox, and
results come back in the order the messages were read.

Where workers are not forked (:func:`spamnb.scale.parallel.can_fork`: not on
macOS, nor without ``fork``), fresh interpreters would each have to load the
model first, so this process classifies everything itself.
"""

from __future__ import annotations

from spamnb.model import batches
from spamnb.scale.parallel import can_fork, ordered_map

# Messages per task: large enough that pickling and scheduling are noise
# next to tokenizing, small enough to keep both workers busy to the end.
# Read at call time, so tests can make it small.
BATCH = 128

_MODEL = None  # the model inherited by forked workers


def _classify_batch(raws, cutoffs):
    return list(_MODEL.classify_many(raws, cutoffs=cutoffs))


def classify_parallel(model, raws, *, cutoffs=None, jobs=2, batch=None):
    """Like ``model.classify_many(raws, cutoffs=cutoffs)``, on ``jobs`` processes.

    Yields :class:`Classification` in input order, in batches of ``batch``
    messages (default :data:`BATCH`). ``jobs <= 1``, or a platform where
    workers are not forked, classifies in this process.
    """
    global _MODEL
    if jobs <= 1 or not can_fork():
        yield from model.classify_many(raws, cutoffs=cutoffs)
        return
    _MODEL = model  # set before ordered_map forks its workers
    try:
        for results in ordered_map(_classify_batch, batches(raws, batch or BATCH), cutoffs, jobs=jobs):
            yield from results
    finally:
        _MODEL = None
