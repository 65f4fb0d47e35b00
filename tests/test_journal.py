"""The journal: learning costs the message, every reader sees snapshot + journal
as one model, compaction folds it in, and nothing damaged is ever read as counts."""

from __future__ import annotations

import os

import numpy as np
import pytest

from spamnb.mail.identity import message_key
from spamnb.mail.sources import iter_index
from spamnb.model import SpamModel
from spamnb.storage import journal, scorer
from spamnb.storage.modelfile import compact, compile_scorer, load_model, load_with_journal, save_model, updating
from spamnb.storage.store import ModelError

from conftest import SAMPLE_INDEX


def _sample():
    """The shipped held-out sample (103 messages the small model never saw)."""
    return [(m.raw, m.label) for m in iter_index(str(SAMPLE_INDEX))]


@pytest.fixture
def journaled(model_file):
    """A private model with its scorer (what a saved model has)."""
    compile_scorer(model_file)
    return model_file


def _same_model(a, b, rel=1e-9):
    assert a.vocabulary.tokens() == b.vocabulary.tokens()
    np.testing.assert_allclose(a.estimator.feature_count_, b.estimator.feature_count_, rtol=rel, atol=1e-12)
    np.testing.assert_array_equal(a.estimator.class_count_, b.estimator.class_count_)
    np.testing.assert_array_equal(a.doc_freq, b.doc_freq)
    assert a.registry == b.registry


def test_learning_through_the_journal_is_learning_the_model(journaled):
    """learn / move / forget appended to the journal give the counts the full model
    gets from the same calls, and the snapshot file is not rewritten."""
    msgs = _sample()
    reference = load_model(journaled)
    mtime = os.stat(journaled).st_mtime_ns
    first, second = msgs[:40], msgs[40:60]
    done = journal.update(journaled, [(r, lb, None) for r, lb in first])
    assert done["learned"] + done["unchanged"] == 40
    reference.learn(first)
    flipped = [(r, "ham" if lb == "spam" else "spam") for r, lb in second + first[:5]]
    done = journal.update(journaled, [(r, lb, None) for r, lb in flipped])
    assert done["moved"] == 5 and done["learned"] == 20
    reference.learn(flipped)
    journal.update(journaled, [(r, lb, None) for r, lb in flipped[:7]], forget=True)
    reference.forget(flipped[:7])
    assert os.stat(journaled).st_mtime_ns == mtime  # the snapshot stays as it was
    _same_model(load_model(journaled), reference)


def test_forget_of_what_was_not_learned_writes_nothing(journaled):
    raw, label = _sample()[0]
    other = "ham" if label == "spam" else "spam"
    with pytest.raises(ValueError, match="nothing to forget"):
        journal.update(journaled, [(raw, other, None)], forget=True)
    assert not os.path.exists(journal.journal_path(journaled))


def test_scoring_with_the_journal_equals_the_full_model(journaled):
    """The cold path's scorer + journal overlay scores as the model with the updates."""
    msgs = _sample()
    journal.update(journaled, [(r, lb, None) for r, lb in msgs[:60]])
    full = load_model(journaled)
    sc = scorer.fresh_scorer(journaled)
    j = journal.read(journaled, sc.save_id, sc.folded)
    for raw, _ in msgs[50:]:
        toks = full.tokens(raw)
        sc.overlay = journal.Overlay.of(j, only={scorer.token_hash(t) for t in toks})
        got, p, known = sc.score(toks)
        want = full.classify_tokens(toks)
        assert got == pytest.approx(want.score, rel=1e-9, abs=1e-9)
        assert known == len({t for t in toks if t in full.vocabulary})


def test_compaction_folds_the_journal_and_keeps_later_records(journaled):
    msgs = _sample()
    journal.update(journaled, [(r, lb, None) for r, lb in msgs[:30]])
    before = load_model(journaled)
    assert compact(journaled, force=True) == 30
    after, j = load_with_journal(journaled)
    assert j is not None and len(j) == 0  # a fresh, empty journal for the new snapshot
    _same_model(after, before)
    assert scorer.state(journaled) == "fresh"
    assert after.stats["compacted"] > 0
    journal.update(journaled, [(r, lb, None) for r, lb in msgs[30:40]])
    before.learn(msgs[30:40])
    _same_model(load_model(journaled), before)


def test_a_crash_between_the_two_renames_counts_everything_once(journaled, monkeypatch):
    """Compaction installs the new snapshot, then dies before replacing the journal:
    the snapshot's marker says which records it holds; the rest still count."""
    msgs = _sample()
    journal.update(journaled, [(r, lb, None) for r, lb in msgs[:20]])
    reference = load_model(journaled)

    def die(*args, **kwargs):
        raise KeyboardInterrupt("kill -9")

    monkeypatch.setattr(journal, "write_fresh", die)
    with pytest.raises(KeyboardInterrupt):
        compact(journaled, force=True)
    monkeypatch.undo()
    _same_model(load_model(journaled), reference)
    journal.update(journaled, [(r, lb, None) for r, lb in msgs[20:30]])  # appends after the marker
    reference.learn(msgs[20:30])
    _same_model(load_model(journaled), reference)
    assert compact(journaled, force=True) == 10
    _same_model(load_model(journaled), reference)


@pytest.mark.parametrize("cut", [1, 5, 40, -17, -1])
def test_a_damaged_tail_is_ignored_reported_and_cut_off(journaled, cut):
    msgs = _sample()
    journal.update(journaled, [(r, lb, None) for r, lb in msgs[:3]])
    good = os.path.getsize(journal.journal_path(journaled))
    reference = load_model(journaled)  # the model before the record that gets damaged
    journal.update(journaled, [(r, lb, None) for r, lb in msgs[3:4]])
    data = open(journal.journal_path(journaled), "rb").read()
    if cut > 0:  # a record cut short (an append killed mid-write)
        data = data[:good + cut]
    else:  # a flipped byte inside the last record
        data = data[:cut] + bytes([data[cut] ^ 0xFF]) + (data[cut + 1:] if cut != -1 else b"")
    open(journal.journal_path(journaled), "wb").write(data)
    _same_model(load_model(journaled), reference)  # never read as counts
    warnings = []
    journal.update(journaled, [(r, lb, None) for r, lb in msgs[4:5]], warn=warnings.append)
    assert warnings and "damaged tail" in warnings[0]
    reference.learn(msgs[4:5])
    _same_model(load_model(journaled), reference)


def test_the_journal_gets_the_model_files_trust_checks(journaled):
    journal.update(journaled, [(r, lb, None) for r, lb in _sample()[:2]])
    jpath = journal.journal_path(journaled)
    os.chmod(jpath, 0o666)
    with pytest.raises(ModelError, match="writable"):
        load_model(journaled)
    with pytest.raises(ModelError, match="writable"):
        journal.update(journaled, [(r, lb, None) for r, lb in _sample()[2:3]])
    os.chmod(jpath, 0o600)
    load_model(journaled)


def test_a_journal_of_another_snapshot_is_stale(journaled):
    """`train` (a save without a marker) makes the old journal stale: ignored, then replaced."""
    msgs = _sample()
    journal.update(journaled, [(r, lb, None) for r, lb in msgs[:5]])
    fresh = SpamModel()
    save_model(fresh, journaled)
    assert load_model(journaled).registry == {}
    journal.update(journaled, [(r, lb, None) for r, lb in msgs[5:6]])
    assert len(load_model(journaled).registry) == 1


def test_updating_folds_the_journal(journaled):
    msgs = _sample()
    journal.update(journaled, [(r, lb, None) for r, lb in msgs[:5]])
    with updating(journaled) as model:
        assert len(model.registry) == len(load_model(journaled).registry)
        model.learn(msgs[5:8])
    assert not os.path.exists(journal.journal_path(journaled))
    after = load_model(journaled)
    assert all(after.known(message_key(r), r) is not None for r, _ in msgs[:8])


def test_age_out_keeps_the_counts_of_the_tokens_it_keeps(trained_model):
    model = SpamModel.from_state(trained_model.to_state())
    model.last_seen[: len(model.vocabulary)] = 100
    n = len(model.vocabulary)
    model.last_seen[n - 400:n] = 10  # the last tokens learned: old, and many of them rare
    tokens = model.vocabulary.tokens()
    fc = model.estimator.feature_count_.copy()
    df = model.doc_freq.copy()
    old_rare = [i for i in range(n - 400, n) if df[i] <= 1]
    dropped = model.age_out(older_than_days=30, max_messages=1, now_day=100)
    assert dropped == len(old_rare) > 0
    kept = [i for i in range(len(tokens)) if i not in set(old_rare)]
    assert model.vocabulary.tokens() == [tokens[i] for i in kept]
    np.testing.assert_array_equal(model.estimator.feature_count_, fc[:, kept])
    np.testing.assert_array_equal(model.doc_freq, df[kept])
    model.age_out(max_tokens=1000, now_day=100)
    assert len(model.vocabulary) == 1000


def test_a_reader_opening_the_journal_first_never_pairs_an_old_snapshot_with_a_new_journal(model_file, tmp_path):
    """load_model opens the journal before the snapshot: a compaction between the
    two (snapshot renamed first, then the journal replaced) still gives every update,
    where the other order would drop the journal's updates as stale for a moment."""
    from spamnb.storage import journal, modelfile

    raws = [b"Subject: order %d\n\nwords of message %d here\n" % (i, i) for i in range(6)]
    modelfile.learn_messages(model_file, [(r, "spam") for r in raws[:3]])
    expected = int(modelfile.load_model(model_file).class_count.sum()) + 3
    opened = journal.open_journal(model_file)  # a reader opens the journal ...
    modelfile.learn_messages(model_file, [(r, "ham") for r in raws[3:]])  # ... an update lands ...
    assert modelfile.compact(model_file, force=True)  # ... and a compaction (new snapshot, new journal)
    model = modelfile.load_snapshot(model_file)  # ... then the reader loads the snapshot
    modelfile.add_journal(model, model_file, opened=opened)
    assert int(model.class_count.sum()) == expected == int(modelfile.load_model(model_file).class_count.sum())
