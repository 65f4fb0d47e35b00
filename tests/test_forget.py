"""``forget`` undoes ``learn`` exactly, on every path.

Learning a message with tokens the model has never seen adds them to the
vocabulary, and |V| is in every smoothed estimate (the multinomial's
denominator Σ_w' n_cw' + |V|·λ). A token belongs to the vocabulary while some
learned message holds it (:mod:`spamnb.nb.membership`), so forgetting the
message takes its new tokens out again and every score is what it was before,
to 1e-9: in memory, through the journal (the cold path's scorer, the full
model that adds the journal, the server following it), through the full model
without a scorer, after compaction, and through spamd TELL (the real spamc).
"""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest

from spamnb.delivery.hook import decide
from spamnb.model import SpamModel
from spamnb.storage.modelfile import compact, learn_messages, load_model
from spamnb.storage import journal
from spamnb.storage.scorer import fresh_scorer, scorer_path, token_hash
from test_fastpath import compiled, messages  # noqa: F401 (compiled: a fixture)
from test_spamd import Served, needs_spamc, request, spamc, split_reply

EXACT = 1e-9


def novel(raw: bytes, tag: str) -> bytes:
    """``raw`` with a subject of words no model has seen: learning it grows the vocabulary."""
    words = " ".join(f"zq{tag}novel{i}" for i in range(12))
    return raw.replace(b"Subject:", f"Subject: {words}".encode(), 1)


def model_scores(model):
    return model.score_tokens([model.tokens(raw) for raw in messages()])[0]


def scorer_scores(path):
    """The cold path's scores: the scorer with the journal's changes to each message's tokens."""
    tokenize = load_model(path).tokens  # the same tokenizer settings as the scorer's
    scores = []
    for raw in messages():
        sc, toks = fresh_scorer(str(path)), tokenize(raw)
        j = journal.read(str(path), sc.save_id, sc.folded)
        if j is not None:
            sc.overlay = journal.Overlay.of(j, only={token_hash(t) for t in set(toks)})
        scores.append(sc.score(toks)[0])
    return np.array(scores)


def test_in_memory_learn_then_forget_restores_every_score(trained_model):
    model = copy.deepcopy(trained_model)
    before, n = model_scores(model), len(model.vocabulary)
    for label in ("spam", "ham"):
        raw = novel(messages()[0], label)
        model.learn([(raw, label)])
        assert len(model.vocabulary) > n
        model.forget([(raw, label)])
        assert len(model.vocabulary) == n
        np.testing.assert_allclose(model_scores(model), before, rtol=0, atol=EXACT)


def test_a_move_keeps_the_tokens_and_forget_after_it_restores(trained_model):
    model = copy.deepcopy(trained_model)
    before, n = model_scores(model), len(model.vocabulary)
    raw = novel(messages()[1], "move")
    model.learn([(raw, "ham")])
    grown = len(model.vocabulary)
    model.learn([(raw, "spam")])  # moved: its tokens stay in the vocabulary
    assert len(model.vocabulary) == grown
    model.forget([(raw, "spam")])
    assert len(model.vocabulary) == n
    np.testing.assert_allclose(model_scores(model), before, rtol=0, atol=EXACT)


@pytest.mark.parametrize("model_type", ["multinomial", "bernoulli", "complement"])
def test_every_model_type_is_restored(tiny_corpus, model_type):
    model = SpamModel(model_type=model_type)
    model.learn(_corpus(tiny_corpus))
    before, n = model_scores(model), len(model.vocabulary)
    raw = novel(messages()[2], model_type)
    model.learn([(raw, "spam")])
    model.forget([(raw, "spam")])
    assert len(model.vocabulary) == n
    np.testing.assert_allclose(model_scores(model), before, rtol=0, atol=EXACT)


def _corpus(corpus):
    return [(p.read_bytes(), label) for label in ("ham", "spam") for p in sorted((corpus.root / label).iterdir())]


def test_journal_path_cold_full_model_and_compaction(compiled):
    before_sc, before_m = scorer_scores(compiled), model_scores(load_model(compiled))
    n = fresh_scorer(str(compiled)).header["n"]
    raw = novel(messages()[0], "journal")
    assert learn_messages(compiled, [(raw, "spam")])["learned"] == 1
    assert learn_messages(compiled, [(raw, "spam")], forget=True)["forgotten"] == 1
    assert os.path.exists(str(compiled) + ".journal")  # the journal's path, not the full model's
    np.testing.assert_allclose(scorer_scores(compiled), before_sc, rtol=0, atol=EXACT)  # cold path
    np.testing.assert_allclose(model_scores(load_model(compiled)), before_m, rtol=0, atol=EXACT)
    compact(compiled, force=True)
    assert fresh_scorer(str(compiled)).header["n"] == n
    assert len(load_model(compiled).vocabulary) == n
    np.testing.assert_allclose(scorer_scores(compiled), before_sc, rtol=0, atol=EXACT)
    np.testing.assert_allclose(model_scores(load_model(compiled)), before_m, rtol=0, atol=EXACT)


def test_full_model_path_without_a_scorer(compiled):
    before = model_scores(load_model(compiled))
    raw = novel(messages()[3], "full")
    for forget in (False, True):
        os.unlink(scorer_path(compiled))  # no scorer: learn_messages loads, updates and saves the model
        learn_messages(compiled, [(raw, "ham")], forget=forget)
    np.testing.assert_allclose(model_scores(load_model(compiled)), before, rtol=0, atol=EXACT)


def _served_scores(s):
    model = s.backend.view()
    return np.array([decide(model, raw).score for raw in messages()])


def test_spamd_tell_learn_then_forget(compiled):
    s = Served(compiled)
    try:
        before = _served_scores(s)
        raw = novel(messages()[0], "tell")
        for action in ({"Set": "local"}, {"Remove": "local"}):
            reply = split_reply(s.ask(request("TELL", raw, Message_class="spam", **action)))
            assert reply[0].startswith(b"SPAMD/1.1 0 EX_OK"), reply
        np.testing.assert_allclose(_served_scores(s), before, rtol=0, atol=EXACT)
    finally:
        s.stop()


@needs_spamc
def test_spamc_learn_then_forget_gives_the_same_check(compiled):
    s = Served(compiled)
    try:
        raw = novel(messages()[1], "spamc")
        before = spamc(s.port, "-c", raw=raw).stdout
        exact = _served_scores(s)
        assert spamc(s.port, "-L", "spam", raw=raw).stdout == b"Message successfully un/learned\n"
        assert spamc(s.port, "-c", raw=raw).stdout != before
        assert spamc(s.port, "-L", "forget", raw=raw).stdout == b"Message successfully un/learned\n"
        assert spamc(s.port, "-c", raw=raw).stdout == before
        np.testing.assert_allclose(_served_scores(s), exact, rtol=0, atol=EXACT)
    finally:
        s.stop()



def _classify_scores(model):
    import json
    import subprocess

    from test_e2e import SAMPLE_MAILDIR, SPAMNB

    out = subprocess.run(SPAMNB + ["classify", "--format", "jsonl", "--model", str(model), str(SAMPLE_MAILDIR)],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    return np.array([json.loads(line)["score"] for line in out.splitlines()])


@pytest.mark.parametrize("strict", [[], ["--strict"]], ids=["fast path", "click"])
def test_the_commands_learn_then_forget(compiled, tmp_path, strict):
    """``spamnb learn`` then ``spamnb forget`` of a file, by the fast path and by click
    (``--strict`` is the click command's), then ``spamnb classify``: the scores of before."""
    import subprocess

    from test_e2e import SPAMNB

    before = _classify_scores(compiled)
    msg = tmp_path / "new.eml"
    msg.write_bytes(novel(messages()[4], "cli"))
    for command in ("learn", "forget"):
        subprocess.run(SPAMNB + [command, "--spam", *strict, "--model", str(compiled), str(msg)],
                       capture_output=True, timeout=120, check=True)
    np.testing.assert_allclose(_classify_scores(compiled), before, rtol=0, atol=EXACT)
