"""The storage contract and the operations written once over it: the contract's
docstring lists exactly what :class:`Backend` has, both backends implement it, and
:mod:`spamnb.storage.upkeep` does on a model file what ``prune``, ``cutoffs``,
``compact`` and ``--metrics`` say."""

from __future__ import annotations

import os
import re

import pytest

from spamnb.nb.decision import Cutoffs
from spamnb.storage import backend, upkeep
from spamnb.storage.filestore import FileBackend
from spamnb.storage.modelfile import load_model
from spamnb.storage.redisstore import RedisBackend


def test_the_contracts_table_names_exactly_what_a_backend_has():
    listed = set()
    for line in backend.__doc__.splitlines():
        if line.startswith("``"):
            cell = line.split("  ")[0]
            listed |= {re.sub(r"\(.*", "", name) for name in re.findall(r"``([^`]+)``", cell)}
    has = {name for name in dir(backend.Backend) if not name.startswith("_")}
    assert listed == has


@pytest.mark.parametrize("cls", [FileBackend, RedisBackend])
def test_both_backends_implement_every_primitive(cls):
    assert not cls.__abstractmethods__


def test_upkeep_on_a_model_file(model_file):
    b = FileBackend(model_file)
    size = os.path.getsize(model_file)
    tokens = len(load_model(model_file).vocabulary)
    assert upkeep.age_out(b, max_tokens=tokens - 3, dry_run=True) == (3, tokens)
    assert os.path.getsize(model_file) == size and len(load_model(model_file).vocabulary) == tokens  # nothing saved
    dropped, before = upkeep.age_out(b, max_tokens=tokens - 5, limit=tokens - 7)
    assert (dropped, before) == (7, tokens)  # the limit bounds this run too
    m = load_model(model_file)
    assert len(m.vocabulary) == tokens - 7 and m.stats["max_tokens"] == tokens - 7
    old, new = upkeep.set_cutoffs(b, lambda old: Cutoffs(0.25, 0.75))
    assert new == Cutoffs(0.25, 0.75) == load_model(model_file).cutoffs and old != new
    assert upkeep.compact(b) == 0 and upkeep.trusted(b) and upkeep.serves(b, str(model_file))
    health = upkeep.health(b.resident())
    assert (health.size, health.journal_bytes, health.up, health.last_success) == (None, 0, None, None)
    b.view()
    assert upkeep.health(b).size[0] == tokens - 7


def test_a_store_refuses_a_token_limit_before_asking_it():
    store = RedisBackend.from_url("redis://127.0.0.1:1/?timeout=0.1")  # nothing listens there
    for kwargs in ({"limit": 10}, {"max_tokens": 10}):
        with pytest.raises(backend.ModelError, match="a store has no token limit"):
            upkeep.age_out(store, older_than_days=9, **kwargs)
    assert not upkeep.serves(store, "/x") and upkeep.trusted(store) and upkeep.compact(store) == 0
    with pytest.raises(backend.ModelError, match="no compiled scorer"):
        upkeep.rebuild_scorer(store)
