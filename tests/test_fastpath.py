"""The fast filter path (compiled scorer, no numpy/click) against the click path.

The click command is the reference: for the same message, model and options
the fast path must write the same bytes and exit with the same status, and
must hand over to the click command whenever it cannot be sure (stale or
missing scorer, untrusted files, options it does not handle).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import SAMPLE_MAILDIR, sample_message
from spamnb.delivery import fastfilter
from spamnb.storage import scorer
from spamnb.cli import main
from spamnb.nb.decision import Cutoffs
from spamnb.delivery.hook import replace_verdicts
from spamnb.model import SpamModel
from spamnb.verdict import EXIT_CODES, cutoffs_from, header_lines, threshold
from spamnb.storage.modelfile import load_model, save_model
from spamnb.mail.sources import iter_index
from spamnb.storage import locate
from test_e2e import SPAMNB

ODD_INPUTS = [b"", b"Subject: no body", b"Subject: no body\r\n", b"just some text, not mail\n",
              b"\x00\xff\xfe binary junk", b"From: a@b.c\r\nSubject: crlf\r\n\r\nfree money now\r\n"]
OPTION_SETS = [[], ["--exit-zero"], ["--ham-cutoff", "0.2", "--spam-cutoff", "0.8"], ["--spam-cutoff", "0.3"],
               ["--ham-cutoff=0.99"], ["--cost-unsure", "0.3"], ["--cost-fp", "5", "--cost-fn", "2"],
               ["--allow-insecure-model", "--exit-zero", "--cost-fp=3"]]


def messages():
    return [p.read_bytes() for p in sorted((SAMPLE_MAILDIR / "cur").iterdir())]


@pytest.fixture
def compiled(trained_model, tmp_path):
    """A private model file with its scorer, written by save_model."""
    path = tmp_path / "m" / "model.joblib"
    save_model(trained_model, path)
    return path


def click_filter(args, raw):
    res = CliRunner().invoke(main, ["filter", *map(str, args)], input=raw)
    return res.stdout_bytes, res.exit_code


def expected(model, raw, name, args):
    """What the click command writes (its own code path, without starting click)."""
    opts = fastfilter.parse_args(args)
    decision = [opts[k] for k in ("cost_fp", "cost_fn", "cost_unsure", "spam_cutoff", "ham_cutoff")]
    cutoffs = cutoffs_from(model.cutoffs, *decision)
    c = model.classify(raw, cutoffs=Cutoffs(*cutoffs))
    out = replace_verdicts(raw, header_lines(c.label, c.spam_probability, c.score, name,
                                             required=threshold(cutoffs[1])))
    return out, 0 if opts["exit_zero"] else EXIT_CODES[c.label]


def fast(path, raw, args, is_default=False):
    opts = fastfilter.parse_args([*args, "--model", str(path)])
    out, label = fastfilter.cold(raw, str(path), is_default, opts)
    return out, 0 if opts["exit_zero"] else EXIT_CODES[label]


# -- the scorer itself --------------------------------------------------------------------

def test_token_hash_is_blake2b_64():
    for tok in ["free", "subject:win", "字符", "url:example.com", "\udcff lone surrogate"]:
        digest = hashlib.blake2b(tok.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        assert scorer.token_hash(tok) == int.from_bytes(digest, "little")


@pytest.mark.parametrize("model_type, features", [
    ("multinomial", "presence-l2"), ("multinomial", "counts"), ("multinomial", "logtf-l2"),
    ("multinomial", "presence"), ("bernoulli", "presence"), ("complement", "presence-l2"),
    ("complement", "counts")])
def test_scorer_scores_equal_the_model(small_corpus, tmp_path, model_type, features):
    model = SpamModel(model_type=model_type, features=features, alpha=0.5)
    model.learn((m.raw, m.label) for m in iter_index(str(small_corpus.index)))
    path = tmp_path / "model.joblib"
    save_model(model, path)
    sc = scorer.load_scorer(scorer.scorer_path(path))
    assert len(sc) == len(model.vocabulary) and sc.features == model.features
    raws = messages()[:40] + ODD_INPUTS
    toks = [model.tokens(r) for r in raws]
    want, p_want, _ = model.score_tokens(toks)
    for t, s, p in zip(toks, want, p_want):
        got, p_got, n_known = sc.score(t)
        assert got == pytest.approx(s, rel=1e-12, abs=1e-9)
        assert p_got == pytest.approx(p, rel=1e-12, abs=1e-15)
        assert n_known == len({x for x in t if x in model.vocabulary})
    resident = scorer.load_scorer(scorer.scorer_path(path)).resident()  # the server's dict lookups
    assert [resident.score(t) for t in toks] == [sc.score(t) for t in toks]


def test_the_scorers_features_and_priors_are_the_models():
    """The scorer's standard-library lists (what check_header accepts) are the model's."""
    import spamnb.model

    assert scorer.FEATURES == spamnb.model.FEATURES and scorer.PRIORS == spamnb.model.PRIORS


@pytest.mark.parametrize("field, value", [("bias", float("nan")), ("features", "tfidf"), ("prior", 3),
                                          ("cutoffs", [0.9, 0.1]), ("tokenizer", {"bogus": 1}), ("alpha", 0),
                                          ("class_count", [1.0, -2.0]), ("totals", "x"), ("bias", None)])
def test_a_scorer_header_out_of_range_is_a_damaged_scorer(compiled, field, value):
    """A header that parses but holds what no compiler writes: ScorerError 'damaged' (the
    filter then rebuilds the scorer or answers from the model), never a crash at scoring."""
    import json as json_

    path = scorer.scorer_path(compiled)
    data = open(path, "rb").read()
    hlen = int.from_bytes(data[12:16], "little")
    header = json_.loads(data[16:16 + hlen])
    header[field] = value
    text = json_.dumps(header).encode()
    text += b" " * (hlen - len(text)) if len(text) <= hlen else b""
    assert len(text) == hlen
    open(path, "wb").write(data[:16] + text + data[16 + hlen:])
    with pytest.raises(scorer.ScorerError, match="damaged header") as err:
        scorer.load_scorer(path)
    assert err.value.kind == "damaged"


def test_scorer_file_layout_and_mode(compiled, trained_model):
    path = scorer.scorer_path(compiled)
    raw = open(path, "rb").read()
    assert raw[:8] == b"SPAMNBSC"
    n = len(trained_model.vocabulary)
    m = len(trained_model.registry)
    hlen = int.from_bytes(raw[12:16], "little")
    assert (16 + hlen) % 8 == 0  # header padded: the arrays are 8-byte aligned
    assert len(raw) == 16 + hlen + 32 * n + 17 * m  # keys, weights, counts, learned keys and classes
    sc = scorer.load_scorer(path)
    fc = trained_model.estimator.feature_count_
    for key, c in list(trained_model.registry.items())[:50]:
        assert sc.learned_as(key) == c
    assert sc.learned_as(b"\0" * 16) is None
    keys = list(sc._keys)
    assert keys == sorted(keys) and len(keys) == n
    bias, weights = trained_model.linear_weights()
    assert sc.bias == bias
    vocab = trained_model.vocabulary.tokens()
    for i in (0, 7, n // 2, n - 1):
        assert sc.weight(vocab[i]) == weights[i]
        assert sc.counts(scorer.token_hash(vocab[i])) == (fc[0, i], fc[1, i])
    assert sc.weight("surely-not-a-token-in-this-model") is None
    assert os.stat(path).st_mode & 0o777 == 0o600


def test_no_scorer_for_infinite_weights(small_corpus, tmp_path, compiled):
    model = SpamModel(alpha=0.0)
    model.learn((m.raw, m.label) for m in iter_index(str(small_corpus.index)))
    assert not np.isfinite(model.linear_weights()[1]).all()
    # an old scorer at the same place goes away too
    shutil.copyfile(scorer.scorer_path(compiled), str(tmp_path / "zero.joblib.scorer"))
    save_model(model, tmp_path / "zero.joblib")
    assert not os.path.exists(tmp_path / "zero.joblib.scorer")
    raw = sample_message("spam", 0).read_bytes()
    with pytest.raises(fastfilter.Fallback):
        fast(tmp_path / "zero.joblib", raw, [])


def test_no_scorer_for_hashed_models(small_corpus, tmp_path, compiled):
    """A hashed model keeps no token list: a scorer keyed by tokens would be wrong."""
    model = SpamModel(hash_features=4096)
    model.learn((m.raw, m.label) for m in iter_index(str(small_corpus.index)))
    path = tmp_path / "hashed.joblib"
    shutil.copyfile(scorer.scorer_path(compiled), scorer.scorer_path(path))
    save_model(model, path)
    assert not os.path.exists(scorer.scorer_path(path))
    raw = sample_message("spam", 0).read_bytes()
    with pytest.raises(fastfilter.Fallback):
        fast(path, raw, [])
    proc = subprocess.run(SPAMNB + ["filter", "--model", str(path)], input=raw, capture_output=True)
    assert (proc.stdout, proc.returncode) == click_filter(["--model", path], raw)


# -- fast path == click path -------------------------------------------------------------

def test_fast_path_equals_click_path_on_real_and_odd_mail(compiled, trained_model):
    for raw in messages() + ODD_INPUTS + [messages()[3].replace(b"\n", b"\r\n")]:
        assert fast(compiled, raw, []) == expected(trained_model, raw, "model.joblib", [])


@pytest.mark.parametrize("args", OPTION_SETS)
def test_fast_path_equals_click_command_with_options(compiled, trained_model, args):
    for raw in [sample_message("spam", 1).read_bytes(), sample_message("ham", 2).read_bytes(),
                b"Subject: meeting notes\n\nclick here for the meeting notes, free of charge\n"]:
        want = click_filter([*args, "--model", compiled], raw)
        assert fast(compiled, raw, args) == want
        assert want == expected(trained_model, raw, "model.joblib", args)


@pytest.mark.parametrize("args, handled", [
    (["--model", "m"], True), (["--model=m", "--exit-zero"], True), (["--socket", "/s"], True),
    (["--evidence", "3"], False), (["--learn"], True), (["-u"], True), (["--help"], False),
    (["--model", "a", "--model", "b"], False), (["stray"], False), (["--spam-cutoff", "x"], False),
    (["--model"], False), (["--exit-zero=1"], False), (["--log-messages", "--log-format", "json"], True),
    (["--log-to", "syslog"], True), (["--log-format", "xml"], False)])
def test_parse_args_handles_only_what_it_knows(args, handled):
    assert (fastfilter.parse_args(args) is not None) == handled


# -- when the fast path must hand over --------------------------------------------------------

def test_stale_scorer_falls_back_to_the_full_path(compiled, spam_and_ham, tmp_path):
    older = tmp_path / "older.joblib"
    shutil.copyfile(compiled, older)  # model A
    model = load_model(compiled)
    model.learn([(spam_and_ham["ham"], "spam")])  # model B, and B's scorer
    save_model(model, compiled)
    shutil.copyfile(older, compiled)  # A's bytes again, B's scorer beside them
    raw = spam_and_ham["ham"]
    with pytest.raises(fastfilter.Fallback, match="stale"):
        fast(compiled, raw, [])
    proc = subprocess.run(SPAMNB + ["filter", "--model", str(compiled)], input=raw, capture_output=True)
    assert (proc.stdout, proc.returncode) == click_filter(["--model", compiled], raw)
    assert proc.stdout == expected(load_model(older), raw, "model.joblib", [])[0]


@pytest.fixture
def spam_and_ham():
    return {"spam": sample_message("spam", 1).read_bytes(), "ham": sample_message("ham", 1).read_bytes()}


@pytest.mark.parametrize("breakage", ["missing", "truncated", "garbage", "world-writable", "model-writable"])
def test_bad_or_missing_scorer_falls_back(compiled, spam_and_ham, breakage):
    sc = scorer.scorer_path(compiled)
    if breakage == "missing":
        os.unlink(sc)
    elif breakage == "truncated":
        data = open(sc, "rb").read()
        open(sc, "wb").write(data[:-8])
    elif breakage == "garbage":
        open(sc, "wb").write(b"SPAMNBSC" + b"\x00" * 100)
    elif breakage == "world-writable":
        os.chmod(sc, 0o666)
    else:
        os.chmod(compiled, 0o666)
    raw = spam_and_ham["spam"]
    with pytest.raises(fastfilter.Fallback):
        fast(compiled, raw, [])
    proc = subprocess.run(SPAMNB + ["filter", "--model", str(compiled)], input=raw, capture_output=True)
    assert (proc.stdout, proc.returncode) == click_filter(["--model", compiled], raw)
    if breakage == "model-writable":
        assert proc.returncode == 3 and proc.stdout == raw


def test_console_script_fast_path_imports_nothing_heavy(compiled, spam_and_ham):
    # The fast path ends with os._exit (no atexit handlers): report the modules there.
    code = ("import os, sys\n"
            "real_exit = os._exit\n"
            "def report(code):\n"
            "    sys.stderr.write('HEAVY=' + ','.join(sorted(m for m in "
            "('numpy', 'scipy', 'joblib', 'click') if m in sys.modules)))\n"
            "    sys.stderr.flush()\n"
            "    real_exit(code)\n"
            "os._exit = report\n"
            f"sys.argv = ['spamnb', 'filter', '--model', {str(compiled)!r}]\n"
            "from spamnb._entry import main\nmain()\n")
    raw = spam_and_ham["spam"]
    proc = subprocess.run([sys.executable, "-c", code], input=raw, capture_output=True,
                          env={**os.environ, "SPAMNB_SOCKET": "/nonexistent/socket"})
    assert proc.stderr.decode().endswith("HEAVY=")
    assert (proc.stdout, proc.returncode) == click_filter(["--model", compiled], raw)


def test_default_model_through_the_fast_path(trained_model, isolated_env, spam_and_ham):
    cache = isolated_env / "cache" / "spamnb" / f"default-model-{locate.DEFAULT_RECIPE}.joblib"
    save_model(trained_model, cache)
    raw = spam_and_ham["spam"]
    opts = fastfilter.parse_args([])
    out, label = fastfilter.cold(raw, str(cache), True, opts)
    assert b" model=default version=" in out
    proc = subprocess.run(SPAMNB + ["filter"], input=raw, capture_output=True, env=dict(os.environ))
    res = CliRunner().invoke(main, ["filter"], input=raw)
    assert (proc.stdout, proc.returncode) == (res.stdout_bytes, res.exit_code) == (out, EXIT_CODES[label])
    assert proc.stderr.decode() == res.stderr


def test_full_path_fallback_never_loses_mail_when_it_cannot_start(spam_and_ham, tmp_path):
    """Even an import failure of the click path (a broken numpy, say) passes the mail through."""
    code = ("import sys\nsys.modules['spamnb.cli'] = None\n"  # makes `from spamnb.cli import main` fail
            "sys.argv = ['spamnb', 'filter', '--model', '/no/such/model']\n"
            "from spamnb._entry import main\nmain()\n")
    raw = spam_and_ham["spam"]
    proc = subprocess.run([sys.executable, "-c", code], input=raw, capture_output=True)
    assert proc.returncode == 3 and proc.stdout == raw
    assert b"passed through unchanged" in proc.stderr


# -- classify --jobs ------------------------------------------------------------------------

def test_classify_jobs_gives_the_same_lines_in_input_order(trained_model_file, monkeypatch):
    import spamnb.scale.batch

    monkeypatch.setattr(spamnb.scale.batch, "BATCH", 7)  # several batches in flight for 103 messages
    outs = []
    for jobs in ("1", "2"):
        res = CliRunner().invoke(main, ["classify", str(SAMPLE_MAILDIR), "--model", str(trained_model_file),
                                        "--format", "tsv", "--jobs", jobs])
        assert res.exit_code == 0, res.output
        assert "messages/s" in res.stderr
        outs.append(res.stdout)
    assert outs[0] == outs[1] and outs[0].count("\n") == 103
