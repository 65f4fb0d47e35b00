"""Sharded training: the same model for any number of workers or backend,
merges checked against sequential learning, streaming, hashing."""

from __future__ import annotations

import mailbox
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import SAMPLE_MAILDIR
from spamnb.scale import parallel as par
from spamnb.cli import main
from spamnb.cli.options import labelled
from spamnb.model import SpamModel
from spamnb.storage.modelfile import load_model
from spamnb.mail.sources import SourceError, iter_index
from spamnb.mail.tokenizer import TokenizerConfig, tokenize
from spamnb.nb.vocabulary import HashingVocabulary, Vocabulary


def run(args, code=0):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == code, result.output
    return result


def state(model):
    """Everything a model learned, for exact comparison."""
    est = model.estimator
    return (model.vocabulary.tokens() if not isinstance(model.vocabulary, HashingVocabulary)
            else len(model.vocabulary),
            est.class_count_.copy(), est.feature_count_.copy(), model.doc_freq.copy(), dict(model.registry))


def assert_same(a, b):
    sa, sb = state(a), state(b)
    assert sa[0] == sb[0]
    for x, y in zip(sa[1:4], sb[1:4]):
        np.testing.assert_array_equal(x, y)  # bit for bit
    assert sa[4] == sb[4]


def sharded(shards, runner=None, registry=True, **kw):
    kw.setdefault("refine_rounds", 0)  # learn() does not refine: compare the counting alone
    model = SpamModel(**kw)
    par.train(model, shards, runner=runner, registry=registry)
    return model


def learned(messages, registry=True, **kw):
    kw.setdefault("refine_rounds", 0)
    model = SpamModel(**kw)
    model.learn(((raw, lb) for _, raw, lb in messages), registry=registry)
    return model


@pytest.fixture(scope="module")
def messages(small_corpus):
    return [(m.source, m.raw, m.label) for m in iter_index(str(small_corpus.index))]


# -- the same model whatever runs the shards -------------------------------------------


@pytest.mark.parametrize("backend", ["multiprocessing", "loky"])
def test_jobs_1_and_2_give_identical_models(small_corpus, backend):
    shards = par.plan(index=[small_corpus.index], size=40)  # 8 shards of 300 messages
    one = sharded(shards, par.Runner(1), refine_rounds=10)
    two = sharded(shards, par.Runner(2, backend=backend), refine_rounds=10)
    assert_same(one, two)  # refined too: the row sample and its order do not depend on the workers
    assert one.messages.tolist() == [150, 150]
    assert one.class_count.sum() > 300  # refine() added copies of the hard messages


def test_shards_of_the_learning_batch_equal_learn_exactly(messages):
    # SHARD_SIZE is the learning batch: the same float sums in the same order
    assert_same(sharded(messages), learned(messages))


@pytest.mark.parametrize("features", ["presence", "counts"])
def test_merging_small_shards_equals_learn(messages, features):
    # integer-valued features: any order of additions is exact, so a merge of
    # 43 shards of 7 must give learn's model exactly (vocabulary order, ids, counts)
    assert_same(sharded(par.shards_of(messages, size=7), features=features),
                learned(messages, features=features))


def test_merging_small_shards_presence_l2_close_to_learn(messages):
    a, b = sharded(par.shards_of(messages, size=7)), learned(messages)
    assert a.vocabulary == b.vocabulary
    np.testing.assert_array_equal(a.doc_freq, b.doc_freq)
    np.testing.assert_allclose(a.estimator.feature_count_, b.estimator.feature_count_, rtol=1e-12)


def test_dask_cluster_gives_the_identical_model(small_corpus, tmp_path):
    distributed = pytest.importorskip("distributed")
    ref = tmp_path / "ref.joblib"
    run(["train", "--index", small_corpus.index, "--model", ref])
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                                  dashboard_address=None) as cluster:
        runner = par.Runner(backend="dask", scheduler=cluster.scheduler_address)
        shards = par.plan(index=[small_corpus.index], size=40)
        assert_same(sharded(shards, runner), sharded(shards, par.Runner(1)))
        path = tmp_path / "dask.joblib"
        run(["train", "--index", small_corpus.index, "--model", path, "--backend", "dask",
             "--scheduler", cluster.scheduler_address])
    assert_same(load_model(path), load_model(ref))


def test_cli_train_jobs_2_equals_jobs_1(tiny_corpus, tmp_path):
    paths = [tmp_path / "1.joblib", tmp_path / "2.joblib"]
    for jobs, path in zip((1, 2), paths):
        run(["train", "--ham", tiny_corpus.ham_dir, "--spam", tiny_corpus.spam_dir, "--jobs", jobs,
             "--model", path])
    assert_same(load_model(paths[0]), load_model(paths[1]))


def test_count_matrix_equals_one_pass(messages):
    config = TokenizerConfig()
    vocab = Vocabulary()
    X = vocab.fit_transform([tokenize(raw, config) for _, raw, _ in messages], binary=True)
    for runner in (par.Runner(1), par.Runner(2)):
        sources, Y, y, v = par.count_matrix(SpamModel(), par.shards_of(messages, size=64), runner=runner)
        assert v == vocab and sources == [s for s, _, _ in messages]
        assert y.tolist() == [int(lb == "spam") for _, _, lb in messages]
        assert Y.has_canonical_format
        for a in ("data", "indices", "indptr"):
            np.testing.assert_array_equal(getattr(Y, a), getattr(X, a))


# -- duplicates ------------------------------------------------------------------------


def test_duplicates_count_once_and_moves_follow_learn(messages):
    # message 0 again in a later shard (unchanged), message 1 again under the other label (moved)
    src, raw, lb = messages[1]
    other = "spam" if lb == "ham" else "ham"
    stream = messages[:20] + [messages[0], (src, raw, other)] + messages[20:30]
    kw = dict(features="presence", refine_rounds=0)  # integer counts: exact comparison with learn's subtraction
    model = SpamModel(**kw)
    done = par.train(model, par.shards_of(stream, size=8))
    assert done == {"learned": 30, "moved": 1, "unchanged": 1, "conflicts": [int(other == "ham"), int(other == "spam")]}
    assert_same(model, learned(stream, **kw))
    assert model.class_count.sum() == 30


def _conflicting_stream(messages):
    """12 messages as ham, then 0-5 as spam (later shards of 4), 12 as ham and spam in one
    shard, 13 twice as spam: 14 messages, 7 given under both labels, 8 copies to drop."""
    ham = [(s, r, "ham") for s, r, _ in messages[:12]]
    spam = [(s, r, "spam") for s, r, _ in messages[:6]]
    (s12, r12, _), (s13, r13, _) = messages[12:14]
    return ham + spam + [(s12, r12, "ham"), (s12, r12, "spam"), (s13, r13, "spam"), (s13, r13, "spam")]


@pytest.mark.parametrize("keep_rows", [100, 5])
def test_conflicts_count_once_under_the_label_given_last_and_refine_never_sees_the_other(messages, keep_rows):
    stream = _conflicting_stream(messages)
    final = {raw: lb for _, raw, lb in stream}  # the label given last
    spec = par.CountSpec.of(SpamModel(features="presence"))
    merger = par.ShardMerger(Vocabulary(), {}, keep_rows=keep_rows)
    for shard in par.shards_of(stream, size=4):
        merger.add(par.count_shard(shard, spec))
    assert merger.done == {"learned": 14, "moved": 6, "unchanged": 2} and len(merger.conflicts) == 7
    assert merger.class_count.tolist() == [6, 8]
    # the refine sample: each message at most once, and only under the label it was counted as
    X, y = merger.sample()
    rows = {tuple(X.indices[X.indptr[i]:X.indptr[i + 1]]): int(y[i]) for i in range(X.shape[0])}
    assert len(rows) == X.shape[0] == min(keep_rows, 14)
    expected = {}
    for raw, lb in final.items():
        ids = sorted(merger.vocabulary.index(t) for t in set(tokenize(raw, spec.tokenizer)))
        expected[tuple(ids)] = int(lb == "spam")
    assert all(expected[r] == c for r, c in rows.items())


def test_train_reports_conflicts_and_refines_as_without_them(messages):
    stream = _conflicting_stream(messages)
    once = list({raw: (src, raw, lb) for src, raw, lb in stream}.values())  # each message once, its last label
    model = SpamModel(features="presence")
    done = par.train(model, par.shards_of(stream, size=4))
    assert done == {"learned": 14, "moved": 6, "unchanged": 2, "conflicts": [0, 7]}
    clean = SpamModel(features="presence")
    par.train(clean, par.shards_of(once, size=4))
    assert model.messages.tolist() == clean.messages.tolist() == [6, 8]
    # training on errors added what it adds without the contradictory copies
    assert model.stats["refine_copies"] == clean.stats["refine_copies"]


def test_a_copy_with_a_clients_fields_moves_at_merge_time(messages):
    # the same message by its identity, but a mail client's fields are tokens the first copy lacks
    src, raw, _ = messages[0]
    copy = raw.replace(b"\n\n", b"\nStatus: RO\nX-Keywords: $Junk\n\n", 1)
    stream = [(src, raw, "ham")] + messages[1:9] + [(src, copy, "spam")] + messages[9:12]
    model = SpamModel(features="presence")
    done = par.train(model, par.shards_of(stream, size=4))
    assert done["moved"] == 1 and done["conflicts"] == [0, 1]
    assert (model.estimator.feature_count_ >= 0).all() and (model.doc_freq >= 0).all()
    assert model.messages.sum() == 12


def test_no_registry_counts_every_message(messages):
    stream = messages[:10] * 3
    model = sharded(par.shards_of(stream, size=4), registry=False)
    assert model.class_count.sum() == 30 and model.registry == {}
    np.testing.assert_array_equal(model.doc_freq, 3 * learned(messages[:10]).doc_freq)


def test_sharded_training_needs_a_fresh_model(messages):
    model = learned(messages[:5])
    with pytest.raises(ValueError, match="new model"):
        par.train(model, messages[5:10])


# -- streaming -----------------------------------------------------------------------


@pytest.mark.parametrize("jobs, backend", [(1, "multiprocessing"), (2, "multiprocessing"), (2, "loky")])
def test_a_generator_source_is_consumed_lazily(messages, jobs, backend):
    consumed = []
    lead = []  # messages taken from the source but not yet merged, at each merge

    def source():
        for m in messages * 2:
            consumed.append(1)
            yield m

    def progress(n):
        lead.append(len(consumed) - n)

    par.train(SpamModel(), par.shards_of(source(), size=10), runner=par.Runner(jobs, backend=backend),
              progress=progress, registry=False)
    assert len(consumed) == 600 and len(lead) == 60
    if jobs == 1:
        assert lead == [0] * 60  # one shard at a time
    else:
        # a bounded window: at most 2 x jobs shards in flight beyond the one merged
        # (parallel.ordered_map), so never more than (2 x jobs + 1) shards of 10 ahead
        assert max(lead) <= (2 * jobs + 1) * 10, lead


def _twice(x, plus):
    return 2 * x + plus


@pytest.mark.parametrize("jobs", [1, 2])
def test_ordered_map_keeps_item_order_with_a_bounded_window(jobs):
    taken = []

    def items():
        for i in range(40):
            taken.append(i)
            yield i

    out = []
    for r in par.ordered_map(_twice, items(), 1, jobs=jobs):
        out.append(r)
        assert len(taken) - len(out) <= 2 * jobs  # never more than 2 x jobs in flight
    assert out == [2 * i + 1 for i in range(40)]


def test_classify_parallel_runs_through_the_ordered_window(messages, monkeypatch):
    from spamnb.scale import batch

    model = learned(messages)
    raws = [raw for _, raw, _ in messages[:50]]
    expected = list(model.classify_many(raws))
    calls = []

    def spy(func, items, *args, **kw):
        calls.append(kw)
        return par.ordered_map(func, items, *args, **kw)

    monkeypatch.setattr(batch, "ordered_map", spy)
    monkeypatch.setattr(batch, "BATCH", 7)
    assert _same(batch.classify_parallel(model, iter(raws), jobs=2), expected)
    assert calls == ([{"jobs": 2}] if par.can_fork() else [])
    calls.clear()
    monkeypatch.setattr(batch, "can_fork", lambda: False)  # e.g. macOS: this process classifies
    assert _same(batch.classify_parallel(model, iter(raws), jobs=2), expected)
    assert calls == []


def _same(got, expected):
    """The same classifications; scores to 1e-12 relative: a batch of 7 rows and one of
    512 take different product kernels (nb.kernels.product gathers small batches), which
    sum a row's terms in another order."""
    got = list(got)
    return len(got) == len(expected) and all(
        (g.label, g.n_tokens, g.n_unknown) == (e.label, e.n_tokens, e.n_unknown)
        and g.score == pytest.approx(e.score, rel=1e-12, abs=1e-12)
        and g.spam_probability == pytest.approx(e.spam_probability, rel=1e-9, abs=1e-15)
        for g, e in zip(got, expected))


# -- planning ------------------------------------------------------------------------


def _flat(shards):
    out = []
    for shard in shards:
        msgs, skipped = shard.read()
        assert not skipped
        out.extend((s, raw, lb) for s, raw, lb in msgs)
    return out


def test_plan_reads_the_messages_labelled_reads(small_corpus, small_archive, tmp_path):
    box = mailbox.mbox(tmp_path / "box.mbox")
    for p in sorted(small_corpus.spam_dir.iterdir())[:5]:
        box.add(p.read_bytes())
    box.flush()
    maildir = tmp_path / "Maildir"
    shutil.copytree(SAMPLE_MAILDIR, maildir)
    ham = [maildir, small_corpus.ham_dir / sorted(p.name for p in small_corpus.ham_dir.iterdir())[0]]
    spam = [small_corpus.spam_dir, tmp_path / "box.mbox"]
    index = [small_corpus.index, small_archive]
    want = [(m.source, m.raw, m.label) for m in labelled(ham, spam, index)]
    shards = list(par.plan(ham, spam, index, size=100))
    assert [len(s) for s in shards[:-1]] == [100] * (len(shards) - 1)
    assert _flat(shards) == want
    # message files travel as paths (the worker reads them), other kinds as bytes
    assert all(raw is None for _, raw, _ in shards[0].items)
    assert all(raw is not None for _, raw, _ in shards[-1].items)


def test_plan_checks_every_source_first(tmp_path, small_corpus):
    with pytest.raises(SourceError, match="no such file or directory"):
        par.plan(ham=[small_corpus.ham_dir], spam=[tmp_path / "nope"])
    with pytest.raises(SourceError, match="labelled index"):
        par.plan(ham=[small_corpus.index])
    with pytest.raises(SourceError, match="no such index file"):
        par.plan(index=[tmp_path / "nope"])


def test_unreadable_entries_are_reported_in_order(small_corpus, tmp_path):
    lines = small_corpus.index.read_text().splitlines()[:6]
    index = tmp_path / "index"
    for name in ("ham", "spam"):
        (tmp_path / name).symlink_to(small_corpus.root / name)
    index.write_text("\n".join(lines[:2] + ["ham ham/missing-1"] + lines[2:] + ["spam nope/2"]) + "\n")
    seen = []
    model = SpamModel()
    # the folders are links out of the index's folder: an index we trust
    par.train(model, par.plan(index=[index], size=3, trust_index=True), runner=par.Runner(2),
              on_error=lambda source, exc: seen.append((source.rsplit("/", 2)[-2:], type(exc))))
    assert seen == [(["ham", "missing-1"], FileNotFoundError), (["nope", "2"], FileNotFoundError)]
    assert model.class_count.sum() == 6
    with pytest.raises(SourceError, match="missing-1"):
        par.train(SpamModel(), par.plan(index=[index], strict=True, trust_index=True), runner=par.Runner(1))


def test_bad_index_line_is_an_error(tmp_path):
    (tmp_path / "index").write_text("ham a\nnot a line\n")
    (tmp_path / "a").write_bytes(b"Subject: x\n\nhello\n")
    with pytest.raises(SourceError, match="line 2"):
        par.train(SpamModel(), par.plan(index=[tmp_path / "index"]))


def test_runner_settings_are_checked():
    with pytest.raises(ValueError, match="scheduler"):
        par.Runner(backend="dask")
    with pytest.raises(ValueError, match="backend"):
        par.Runner(backend="spark")
    with pytest.raises(ValueError, match="jobs"):
        par.Runner(jobs=0)


def test_a_worker_of_another_version_refuses(messages):
    spec = par.CountSpec(TokenizerConfig(), "presence-l2", version="0.0.0-other")
    with pytest.raises(RuntimeError, match="same version"):
        par.count_shard(next(iter(par.shards_of(messages[:3]))), spec)


@pytest.mark.parametrize("args, text", [
    (["--backend", "dask"], "--scheduler"),
    (["--scheduler", "tcp://127.0.0.1:1"], "--backend dask"),
    (["--hash-features", "64", "--min-df", "2"], "--min-df"),
    (["--jobs", "0"], "--jobs"),
])
def test_cli_scale_option_errors(tiny_corpus, tmp_path, args, text):
    out = run(["train", "--index", tiny_corpus.index, "--model", tmp_path / "m.joblib", *args], code=2).output
    assert text in out


# -- hashing -------------------------------------------------------------------------


def test_hashing_columns_are_stable():
    v = HashingVocabulary(2**20)
    # BLAKE2b-64 of the UTF-8 bytes, little-endian, mod 2^20 (pinned: models depend on it)
    assert [v.column(t) for t in ["viagra", "subject:free", "héllo", ""]] == [466802, 471422, 220435, 42724]
    assert v.ids(["viagra", "x", "viagra"]).tolist() == [466802, v.column("x"), 466802]
    assert HashingVocabulary(7).column("viagra") == int.from_bytes(
        __import__("hashlib").blake2b(b"viagra", digest_size=8).digest(), "little") % 7


def test_hashing_transform_adds_up_collisions():
    v = HashingVocabulary(2)
    docs = [["a", "b", "c", "a"], [], ["b"]]
    cols = {t: v.column(t) for t in "abc"}
    X, unknown = v.transform(docs)
    expect = np.zeros((3, 2))
    for i, doc in enumerate(docs):
        for t in doc:
            expect[i, cols[t]] += 1
    assert X.shape == (3, 2) and X.has_canonical_format
    np.testing.assert_array_equal(X.toarray(), expect)
    np.testing.assert_array_equal(v.transform(docs, binary=True)[0].toarray(), expect > 0)
    assert unknown.tolist() == [0, 0, 0] and len(v) == 2 and "anything" in v


def test_hashing_vocabulary_state_and_errors():
    v = HashingVocabulary(1000)
    assert HashingVocabulary.from_state(v.to_state()) == v
    assert v.describe([v.column("cash"), 5], ["cash", "cash"]) == ["cash", "#hash:5"]
    with pytest.raises(ValueError):
        v.prune(np.zeros(1000), min_df=2)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError):
            HashingVocabulary(bad)


def test_hashed_model_trains_saves_and_classifies(messages, small_corpus, tmp_path):
    kw = dict(hash_features=4096, features="presence")
    model = sharded(par.shards_of(messages, size=32), par.Runner(2), **kw)
    assert_same(model, learned(messages, **kw))  # integer counts: exact
    assert model.estimator.feature_count_.shape == (2, 4096)
    path = tmp_path / "h.joblib"
    run(["train", "--index", small_corpus.index, "--hash-features", "4096", "--features", "presence",
         "--refine-rounds", "0", "--model", path])
    loaded = load_model(path)
    assert isinstance(loaded.vocabulary, HashingVocabulary) and loaded.hash_features == 4096
    assert_same(loaded, model)
    raw = messages[-1][1]
    assert loaded.classify(raw) == model.classify(raw)
    top = loaded.explain(raw, 5).tokens[0][0]
    assert any(t in tokenize(raw, loaded.tokenizer) for t in top.split("|"))


@pytest.mark.parametrize("extra", [[], ["--hash-features", "4096"]])
def test_cli_evaluate_jobs_gives_the_same_figures(tiny_corpus, extra):
    outs = [run(["evaluate", "--index", tiny_corpus.index, "--folds", "2", "--json", "--jobs", j, *extra]).output
            for j in ("1", "2")]
    import json

    a, b = (json.loads(o) for o in outs)
    for key in ("auc", "accuracy_pct", "lam_pct", "n_ham_spam"):
        assert a[key] == b[key]
