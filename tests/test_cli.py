"""The click commands, in-process with CliRunner: outputs checked against the
library's own numbers, errors checked to be one clear line and a non-zero exit."""

from __future__ import annotations

import email
import json
import math
import os
import re
import stat

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import SAMPLE_MAILDIR, gold_labels, learnable_cutoffs, sample_message, strip_from_line
from spamnb.storage import store
from spamnb.cli import main
from spamnb.delivery.hook import add_headers
from spamnb.verdict import header_lines, threshold
from spamnb.storage.modelfile import load_model
from spamnb.mail.tokenizer import TokenizerConfig, tokenize
from spamnb._version import __version__
from spamnb.storage import locate

COMMANDS = ["train", "classify", "learn", "forget", "filter", "sort", "explain", "info", "tokens"]


def run(args, input=None, code=0):
    """Invoke ``spamnb ARGS``; check the exit status and that nothing crashed."""
    result = CliRunner().invoke(main, [str(a) for a in args], input=input)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # an unexpected exception: show it whole
    assert "Traceback" not in result.output
    assert result.exit_code == code, result.output
    return result


def sigmoid(score):
    """1 / (1 + e^-score), without overflow for large |score|."""
    if score >= 0:
        return 1 / (1 + math.exp(-score))
    return math.exp(score) / (1 + math.exp(score))


def jsonl(result):
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.fixture
def spam_msg():
    return sample_message("spam", 0)


@pytest.fixture
def ham_msg():
    return sample_message("ham", 0)


# -- help ------------------------------------------------------------------------

@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_with_an_example(command):
    out = run([command, "--help"]).output
    assert "Example" in out or "procmail:" in out
    assert f"spamnb {command}" in out


def test_main_help_and_version():
    assert "spamnb train" in run(["--help"]).output
    assert __version__ in run(["--version"]).output


# -- train -----------------------------------------------------------------------

SUMMARY = re.compile(r"trained (\w+) model on (\d+) ham and (\d+) spam \((\d+) tokens, distinct per "
                     r"message; vocabulary (\d+)\) in [\d.]+ s")


def test_train_from_folders_summary_matches_model(small_corpus, tmp_path):
    path = tmp_path / "m.joblib"
    out = run(["train", "--ham", small_corpus.ham_dir, "--spam", small_corpus.spam_dir,
               "--model", path]).output
    kind, n_ham, n_spam, n_tok, n_vocab = SUMMARY.search(out).groups()
    model = load_model(path)
    assert (kind, int(n_ham), int(n_spam)) == ("multinomial", 150, 150)
    assert model.messages.tolist() == [150, 150]
    assert int(n_vocab) == len(model.vocabulary)
    raws = [p.read_bytes() for d in (small_corpus.ham_dir, small_corpus.spam_dir) for p in d.iterdir()]
    assert int(n_tok) == sum(len(set(tokenize(raw, model.tokenizer))) for raw in raws)
    assert f"saved to {path}" in out
    assert stat.S_IMODE(path.stat().st_mode) & 0o022 == 0


def test_train_index_equals_folders(small_corpus, trained_model, tmp_path):
    path = tmp_path / "m.joblib"
    run(["train", "--index", small_corpus.index, "--model", path])
    model = load_model(path)
    assert model.vocabulary.tokens() == trained_model.vocabulary.tokens()
    np.testing.assert_array_equal(model.estimator.feature_count_, trained_model.estimator.feature_count_)


def test_train_sources_are_repeatable(tiny_corpus, spam_msg, tmp_path):
    path = tmp_path / "m.joblib"
    run(["train", "--ham", tiny_corpus.ham_dir, "--spam", tiny_corpus.spam_dir, "--spam", spam_msg,
         "--model", path])
    assert load_model(path).messages.tolist() == [10, 11]


def test_train_twice_the_same_messages_counts_once(tiny_corpus, tmp_path):
    path = tmp_path / "m.joblib"
    out = run(["train", "--index", tiny_corpus.index, "--index", tiny_corpus.index, "--model", path]).output
    assert load_model(path).messages.tolist() == [10, 10]
    assert "40 messages read, 20 counted: 20 duplicates dropped\n" in out
    assert "messages read" not in run(["train", "--index", tiny_corpus.index, "--model", path]).output


def _maildir_plus_plus(root, ham_dir, spam_dir):
    """A Maildir++ with the ham in its inbox and the spam in its .Junk folder."""
    for folder, src in ((root, ham_dir), (root / ".Junk", spam_dir)):
        for sub in ("cur", "new", "tmp"):
            (folder / sub).mkdir(parents=True)
        for f in src.iterdir():
            (folder / "cur" / f.name).write_bytes(f.read_bytes())
    return root


def test_train_maildir_root_does_not_read_its_junk_folder_as_ham(small_corpus, tmp_path):
    """train -r --ham ~/Maildir --spam ~/Maildir/.Junk: the Junk messages are spam only."""
    md = _maildir_plus_plus(tmp_path / "Maildir", small_corpus.ham_dir, small_corpus.spam_dir)
    path = tmp_path / "m.joblib"
    out = run(["train", "-r", "--ham", md, "--spam", md / ".Junk", "--model", path]).output
    assert f"reading {md / '.Junk'} as spam only (-r does not read it again, as ham, in {md})" in out
    assert "duplicates" not in out and "both ham and spam" not in out
    ref = tmp_path / "ref.joblib"  # the same mail from two plain folders
    run(["train", "--ham", small_corpus.ham_dir, "--spam", small_corpus.spam_dir, "--model", ref])
    model, ref = load_model(path), load_model(ref)
    assert model.messages.tolist() == [150, 150]
    assert model.vocabulary.tokens() == ref.vocabulary.tokens()
    np.testing.assert_array_equal(model.estimator.feature_count_, ref.estimator.feature_count_)


def test_train_counts_a_message_given_as_ham_and_spam_once_as_the_last_label(small_corpus, tmp_path):
    path = tmp_path / "m.joblib"
    out = run(["train", "--spam", small_corpus.spam_dir, "--ham", small_corpus.ham_dir,
               "--ham", small_corpus.spam_dir, "--model", path]).output  # spam is read after ham
    assert load_model(path).messages.tolist() == [150, 150]
    assert ("450 messages read, 300 counted: 150 duplicates dropped; 150 given as both ham and spam, "
            "counted once under the label given last (spam)\n") in out


@pytest.mark.parametrize("model_type", ["bernoulli", "complement"])
def test_train_model_options_are_stored(tiny_corpus, tmp_path, model_type):
    path = tmp_path / "m.joblib"
    run(["train", "--index", tiny_corpus.index, "--model", path, "--model-type", model_type,
         "--alpha", "0.5", "--prior", "uniform", "--cost-fp", "3", "--cost-fn", "1"])
    model = load_model(path)
    assert (model.model_type, model.alpha, model.prior) == (model_type, 0.5, "uniform")
    # C_fp / (C_fp + C_fn) = 3/4, no unsure band without --cost-unsure
    assert (model.cutoffs.ham_cutoff, model.cutoffs.spam_cutoff) == (0.75, 0.75)
    info = run(["info", "--model", path]).output
    assert f"model type:  {model_type}" in info
    assert "alpha (λ):   0.5" in info
    assert "ham if P(spam) <= 0.75, spam if > 0.75" in info


def test_train_cutoffs_and_tokenizer_options(tiny_corpus, tmp_path):
    path = tmp_path / "m.joblib"
    run(["train", "--index", tiny_corpus.index, "--model", path, "--spam-cutoff", "0.8",
         "--ham-cutoff", "0.2", "--only-headers", "Subject, From", "--features", "counts", "--min-df", "2"])
    model = load_model(path)
    assert (model.cutoffs.ham_cutoff, model.cutoffs.spam_cutoff) == (0.2, 0.8)
    assert model.tokenizer.only_headers == ("subject", "from")
    assert model.features == "counts"
    assert model.doc_freq.min() >= 2


def test_train_min_df_prunes(small_corpus, trained_model, tmp_path):
    path = tmp_path / "m.joblib"
    run(["train", "--index", small_corpus.index, "--model", path, "--min-df", "3"])
    model = load_model(path)
    expected = int((trained_model.doc_freq >= 3).sum())
    assert len(model.vocabulary) == expected < len(trained_model.vocabulary)


def test_train_one_class_only_is_refused(tiny_corpus, tmp_path):
    path = tmp_path / "m.joblib"
    out = run(["train", "--ham", tiny_corpus.ham_dir, "--model", path], code=1).output
    assert "no spam messages were read" in out and "nothing was saved" in out
    assert not path.exists()


@pytest.mark.parametrize("args, code, text", [
    ([], 2, "give training mail"),
    (["--ham", "/no/such/dir", "--spam", "/no/such/dir"], 1, "no such file or directory: /no/such/dir"),
    (["--index", "/no/such/index"], 1, "/no/such/index"),
    (["--ham", "H", "--spam", "S", "--model-type", "svm"], 2, "'svm' is not one of"),
    (["--ham", "H", "--spam", "S", "--alpha", "-1"], 2, "--alpha"),
    (["--ham", "H", "--spam", "S", "--spam-cutoff", "0.9", "--cost-fp", "2"], 2, "not both"),
])
def test_train_errors(args, code, text, tmp_path):
    out = run(["train", "--model", tmp_path / "m.joblib", *args], code=code).output
    assert text in out


def test_train_labelled_index_given_as_ham_is_refused(tiny_corpus, tmp_path):
    out = run(["train", "--ham", tiny_corpus.index, "--spam", tiny_corpus.spam_dir,
               "--model", tmp_path / "m.joblib"], code=1).output
    assert "labelled index file" in out


# -- classify ----------------------------------------------------------------------

def test_classify_jsonl_matches_the_model(trained_model, trained_model_file):
    result = run(["classify", SAMPLE_MAILDIR, "--model", trained_model_file, "--format", "jsonl"])
    rows = jsonl(result)
    assert len(rows) == 103
    assert all(set(r) == {"path", "label", "spam_probability", "score"} for r in rows)
    raws = [open(r["path"], "rb").read() for r in rows]
    for r, c in zip(rows, trained_model.classify_many(raws)):
        assert (r["label"], r["spam_probability"]) == (c.label, c.spam_probability)
        assert r["score"] == pytest.approx(c.score)
        assert r["label"] == trained_model.cutoffs.label(r["spam_probability"])
        # the score is the log-odds of the probability: p = 1 / (1 + e^-score)
        assert r["spam_probability"] == pytest.approx(sigmoid(r["score"]), rel=1e-9, abs=1e-300)
    gold = gold_labels()
    correct = sum(r["label"] == gold[os.path.basename(r["path"])] for r in rows)
    assert correct / len(rows) >= 0.9  # 300 training messages: measured 102/103
    counts = {lb: sum(r["label"] == lb for r in rows) for lb in ("spam", "unsure", "ham")}
    assert f"103 messages: {counts['spam']} spam, {counts['unsure']} unsure, {counts['ham']} ham" in result.stderr


def test_classify_tsv_and_table(trained_model_file, spam_msg, ham_msg):
    rows = jsonl(run(["classify", spam_msg, ham_msg, "--model", trained_model_file, "--format", "jsonl"]))
    tsv = run(["classify", spam_msg, ham_msg, "--model", trained_model_file, "--format", "tsv"]).stdout
    lines = [line.split("\t") for line in tsv.splitlines()]
    assert [(p, lb) for p, lb, _, _ in lines] == [(r["path"], r["label"]) for r in rows]
    assert [float(x[2]) for x in lines] == [pytest.approx(r["spam_probability"], abs=1e-6) for r in rows]
    assert [lb for _, lb, _, _ in lines] == ["spam", "ham"]
    table = run(["classify", spam_msg, ham_msg, "--model", trained_model_file]).stdout.splitlines()
    assert table[0].split() == ["label", "P(spam)", "score", "message"]
    assert table[1].split()[0] == "spam" and table[1].endswith(rows[0]["path"])
    assert table[2].split()[0] == "ham"


def test_classify_stdin(trained_model_file, spam_msg):
    rows = jsonl(run(["classify", "-", "--model", trained_model_file, "--format", "jsonl"],
                     input=spam_msg.read_bytes()))
    # read as the file would be: this one starts with an mbox From line, so it is an mbox
    assert [(r["path"], r["label"]) for r in rows] == [("-:#1", "spam")]


def test_spam_cutoff_changes_labels(trained_model, trained_model_file):
    # a message the model is unsure about by its own cut-offs: P(spam) strictly inside (0, 1)
    raw = b"Subject: meeting notes\n\nclick here for the meeting notes, free of charge\n"
    p = trained_model.classify(raw).spam_probability
    assert 0 < p < 1
    base = ["classify", "-", "--model", trained_model_file, "--format", "jsonl"]
    label = lambda *opts: jsonl(run([*base, *opts], input=raw))[0]["label"]  # noqa: E731
    assert label("--spam-cutoff", p / 2, "--ham-cutoff", 0) == "spam"
    assert label("--spam-cutoff", p, "--ham-cutoff", 0) == "unsure"  # spam needs p > cut-off
    assert label("--spam-cutoff", (1 + p) / 2) in ("unsure", "ham")
    assert label("--ham-cutoff", p) == "ham"  # ham when p <= cut-off; spam cut-off follows up
    assert label("--ham-cutoff", 1) == "ham"
    # costs: C_fp = C_fn -> one cut-off at 1/2
    assert label("--cost-fp", 1, "--cost-fn", 1) == ("spam" if p > 0.5 else "ham")


def test_cutoffs_and_costs_together_are_refused(trained_model_file, spam_msg):
    out = run(["classify", spam_msg, "--model", trained_model_file, "--spam-cutoff", "0.5",
               "--cost-fp", "2"], code=2).output
    assert "either costs or cut-offs" in out


def test_bad_cutoff_values(trained_model_file, spam_msg):
    # a usage error, like every bad decision option (spamnb.verdict.DecisionError)
    out = run(["classify", spam_msg, "--model", trained_model_file, "--spam-cutoff", "0.2",
               "--ham-cutoff", "0.6"], code=2).output
    assert "ham_cutoff <= spam_cutoff" in out


@pytest.mark.parametrize("args, code, text", [
    (["/no/such/mail"], 1, "no such file or directory: /no/such/mail"),
    ([SAMPLE_MAILDIR, "/no/such/mail"], 1, "no such file or directory"),
    ([SAMPLE_MAILDIR, "--format", "xml"], 2, "'xml' is not one of"),
    ([], 2, "Missing argument"),
])
def test_classify_errors(trained_model_file, args, code, text):
    result = run(["classify", "--model", trained_model_file, *args], code=code)
    assert text in result.output
    if code == 1:
        assert result.stdout == ""  # sources are checked before anything is printed


# -- learn / forget ------------------------------------------------------------------

def test_learn_counts_once_and_moves(model_file, spam_msg):
    before = load_model(model_file)
    out = run(["learn", "--spam", spam_msg, "--model", model_file]).output
    assert "learned 1 as spam, moved 0; already learned: 0" in out
    assert load_model(model_file).messages.tolist() == [150, 151]
    out = run(["learn", "--spam", spam_msg, "--model", model_file]).output
    assert "learned 0 as spam, moved 0; already learned: 1" in out
    assert load_model(model_file).messages.tolist() == [150, 151]
    out = run(["learn", "--ham", spam_msg, "--model", model_file]).output
    assert "moved 1" in out
    after = load_model(model_file)
    assert after.messages.tolist() == [151, 150]
    # the spam counts are back to what they were before the message was learned
    n = len(before.vocabulary)  # (features are floats: equal up to rounding)
    np.testing.assert_allclose(after.estimator.feature_count_[1, :n], before.estimator.feature_count_[1],
                               rtol=0, atol=1e-9)


def test_learn_identity_is_the_message_id(model_file, tmp_path):
    a = tmp_path / "a.eml"
    b = tmp_path / "b.eml"
    a.write_bytes(b"Message-ID: <same@example.org>\nSubject: one\n\nfirst body\n")
    # the same message after a filter added its verdict
    b.write_bytes(b"Message-ID: <same@example.org>\nSubject: one\nX-Spam-Flag: YES\n\nfirst body\n")
    run(["learn", "--spam", a, "--model", model_file])
    assert "already learned: 1" in run(["learn", "--spam", b, "--model", model_file]).output
    c = tmp_path / "c.eml"  # no Message-ID: the content is the identity
    c.write_bytes(b"Subject: three\n\nthird body\n")
    run(["learn", "--spam", c, "--model", model_file])
    assert "already learned: 1" in run(["learn", "--spam", c, "--model", model_file]).output
    assert load_model(model_file).messages.tolist() == [150, 152]


def _header_block_end(raw):
    return raw.index(b"\n\n") + 1


def _delivered(raw, how):
    """``raw`` as a delivery agent or a mail client hands it back later."""
    if how == "from-line":  # a file with a From_ line (read as a one-message mbox: body From quoted)
        end = _header_block_end(raw)
        return (b"From someone@example.org  Mon Sep  2 16:21:48 2002\n" + strip_from_line(raw[:end])
                + raw[end:].replace(b"\nFrom ", b"\n>From "))
    if how == "no-from-line":
        return strip_from_line(raw)
    if how == "trailing-newline":
        return raw + b"\n"
    if how == "crlf":
        return raw.replace(b"\n", b"\r\n")
    if how == "client-headers":  # a mail client's status fields, below the original ones
        end = _header_block_end(raw)
        return raw[:end] + b"Status: RO\nX-Status: A\nX-Keywords: $Junk\nContent-Length: 1234\n" + raw[end:]
    if how == "mta-headers":  # the MTA's trace fields, above the original ones
        return (b"Return-Path: <someone@example.org>\nDelivered-To: me@example.net\n"
                b"Received: from mx.example.net by mail.example.net; Mon, 2 Sep 2002 16:21:48 +0100\n"
                + strip_from_line(raw))
    if how == "mbox-saved":  # a client's mbox: From_ line, its status fields, a blank line after each
        end = _header_block_end(raw)
        body = raw[end:].replace(b"\nFrom ", b"\n>From ")
        return (b"From x@y  Mon Sep  2 16:21:48 2002\n" + strip_from_line(raw[:end])
                + b"Status: RO\nX-Mozilla-Status: 0001\n" + body + b"\n")
    raise AssertionError(how)


DELIVERY_CHANGES = ["from-line", "no-from-line", "trailing-newline", "crlf", "client-headers",
                    "mta-headers", "mbox-saved"]


@pytest.mark.parametrize("message_id", [True, False], ids=["message-id", "no-message-id"])
@pytest.mark.parametrize("how", DELIVERY_CHANGES)
def test_filter_learned_message_is_known_to_learn_after_delivery(model_file, how, message_id):
    """`filter -u` learns a message; the copy a client saved is the same message to learn/forget."""
    raw = strip_from_line(sample_message("spam", 3).read_bytes())
    if not message_id:
        raw = re.sub(rb"(?im)^message-id:.*\n", b"", raw)
    raw = raw.replace(b"\n\n", b"\n\nFrom the desk of the manager\n", 1)  # a body line mbox quotes
    if how == "no-from-line":  # procmail pipes the message with its From_ line, the maildir copy has none
        raw = b"From someone@example.org  Mon Sep  2 16:21:48 2002\n" + raw
    sure = learnable_cutoffs(load_model(model_file), raw)  # filed spam, near enough the cut-off to learn
    out = run(["filter", "--model", model_file, "-u", *sure], input=raw, code=0).stdout_bytes
    assert load_model(model_file).messages.tolist() == [150, 151]
    saved = model_file.parent / "saved.eml"
    for copy in (_delivered(raw, how), _delivered(out, how)):  # as delivered, and as spamnb filed it
        saved.write_bytes(copy)
        assert "already learned: 1" in run(["learn", "--spam", saved, "--model", model_file]).output
        assert load_model(model_file).messages.tolist() == [150, 151]
    assert "moved 1" in run(["learn", "--ham", saved, "--model", model_file]).output
    assert load_model(model_file).messages.tolist() == [151, 150]
    run(["forget", "--ham", _write(saved, _delivered(strip_from_line(raw), "crlf")), "--model", model_file])
    assert load_model(model_file).messages.tolist() == [150, 150]


def _write(path, raw):
    path.write_bytes(raw)
    return path


def test_learn_says_how_many_duplicates_it_dropped(model_file, spam_msg, tmp_path):
    """500 spam given, 499 counted: the summary says why."""
    folder = tmp_path / "junk"
    folder.mkdir()
    raw = strip_from_line(spam_msg.read_bytes())
    (folder / "1.eml").write_bytes(raw)
    (folder / "2.eml").write_bytes(raw + b"\n")  # the same message, saved twice
    (folder / "3.eml").write_bytes(sample_message("spam", 4).read_bytes())
    out = run(["learn", "--spam", folder, "--model", model_file]).output
    assert "learned 2 as spam, moved 0; already learned: 0; 1 duplicate dropped (given twice)" in out
    assert load_model(model_file).messages.tolist() == [150, 152]
    out = run(["learn", "--spam", folder, "--model", model_file]).output
    assert "learned 0 as spam, moved 0; already learned: 2; 1 duplicate dropped (given twice)" in out


def test_forget_undoes_learn_exactly(model_file, spam_msg):
    before = load_model(model_file)
    run(["learn", "--spam", spam_msg, "--model", model_file])
    out = run(["forget", "--spam", spam_msg, "--model", model_file]).output
    assert "forgot 1 spam message(s)" in out
    after = load_model(model_file)
    assert after.messages.tolist() == [150, 150]
    n = len(before.vocabulary)  # (features are floats: equal up to rounding)
    np.testing.assert_allclose(after.estimator.feature_count_[:, :n], before.estimator.feature_count_,
                               rtol=0, atol=1e-9)
    np.testing.assert_allclose(after.estimator.feature_count_[:, n:], 0, atol=1e-9)


def test_learned_says_how_a_message_was_learned_without_learning_it(model_file, spam_msg, tmp_path):
    """`spamnb learned`: learned as spam / as ham / not learned, by the message's identity (a
    copy as delivered is the same message), the model untouched; exit 0 when every message
    was learned (as --spam or --ham asks), 3 when one was not."""
    def files():
        return {p.name: p.read_bytes() for p in model_file.parent.iterdir()}

    raw = strip_from_line(spam_msg.read_bytes())
    delivered = tmp_path / "delivered.eml"
    delivered.write_bytes((b"X-Spam-Flag: YES\nStatus: RO\n" + raw).replace(b"\n", b"\r\n"))
    res = run(["learned", "--model", model_file, delivered], code=3)
    assert res.stdout == f"{delivered}: not learned\n"
    assert res.stderr == f"1 message: 0 learned as spam, 0 as ham, 1 not learned, in {model_file}\n"
    run(["learn", "--spam", "--model", model_file, spam_msg])
    before = files()
    res = run(["learned", "--model", model_file, delivered])
    assert res.stdout == f"{delivered}: learned as spam\n"
    run(["learned", "--spam", "--model", model_file, delivered])
    assert run(["learned", "--ham", "--model", model_file, delivered], code=3).stdout.endswith("learned as spam\n")
    other = tmp_path / "other.eml"
    other.write_bytes(b"From: a@example.org\nSubject: never seen\n\nnot learned at all\n")
    res = run(["learned", "--model", model_file, delivered, other], code=3)
    assert res.stdout.splitlines() == [f"{delivered}: learned as spam", f"{other}: not learned"]
    assert files() == before  # nothing learned, nothing written
    assert "one class" in run(["learned", "--spam", "--ham", "--model", model_file, other], code=2).stderr
    assert run(["learned", "--model", model_file, tmp_path / "missing.eml"], code=1).stderr.count("\n") == 1
    run(["forget", "--spam", "--model", model_file, spam_msg])
    assert run(["learned", "--model", model_file, delivered], code=3).stdout.endswith(": not learned\n")


def test_forget_what_was_not_learned_is_refused(model_file, spam_msg):
    before = model_file.read_bytes()
    out = run(["forget", "--spam", spam_msg, "--model", model_file], code=1).output
    assert "not learned" in out
    run(["learn", "--ham", spam_msg, "--model", model_file])
    out = run(["forget", "--spam", spam_msg, "--model", model_file], code=1).output
    assert "learned as ham, not as spam" in out
    assert before != model_file.read_bytes()  # the learn above did change it...
    assert load_model(model_file).messages.tolist() == [151, 150]  # ...the failed forget did not


@pytest.mark.parametrize("command", ["learn", "forget"])
def test_learn_forget_need_a_label(command, model_file, spam_msg):
    out = run([command, spam_msg, "--model", model_file], code=2).output
    assert "--spam or --ham" in out


def test_forget_without_a_model_of_yours(spam_msg):
    out = run(["forget", "--spam", spam_msg], code=1).output
    assert "no model of yours" in out


def test_learn_missing_source(model_file):
    out = run(["learn", "--spam", "/no/such/msg", "--model", model_file], code=1).output
    assert "no such file or directory" in out


# -- filter ------------------------------------------------------------------------

def expected_filter_output(model, raw, name, cutoffs=None):
    c = model.classify(raw, cutoffs=cutoffs)
    spam_cut = (cutoffs or model.cutoffs).spam_cutoff
    return add_headers(raw, header_lines(c.label, c.spam_probability, c.score, name,
                                         required=threshold(spam_cut))), c


@pytest.mark.parametrize("label, code", [("spam", 0), ("ham", 1)])
def test_filter_adds_headers_byte_exact(trained_model, trained_model_file, label, code):
    raw = sample_message(label, 1).read_bytes()
    result = run(["filter", "--model", trained_model_file], input=raw, code=code)
    out = result.stdout_bytes
    expected, c = expected_filter_output(trained_model, raw, "small.joblib")
    assert c.label == label
    assert out == expected
    # by hand: the two lines sit just before the first blank line, nothing else changed
    cut = raw.index(b"\n\n") + 1
    added = out[cut:len(out) - (len(raw) - cut)]
    assert out[:cut] == raw[:cut] and out[cut + len(added):] == raw[cut:]
    flag = b"X-Spam-Flag: YES\n" if label == "spam" else b""  # SpamAssassin's rule: on spam only
    word, test = (b"Yes", b"SPAM") if label == "spam" else (b"No", b"HAM")
    assert re.fullmatch(flag + rb"X-Spam-Status: " + word + rb", score=-?\d+\.\d\d required=2\.94 tests=SPAMNB_" + test
                        + rb" probability=\d\.\d{6} model=small\.joblib version=" + __version__.encode() + rb"\n",
                        added)


def test_filter_unsure_and_exit_zero(trained_model_file):
    raw = b"Subject: meeting notes\n\nclick here for the meeting notes, free of charge\n"
    res = run(["filter", "--model", trained_model_file, "--ham-cutoff", "0", "--spam-cutoff", "1"],
              input=raw, code=2)
    assert b"\nX-Spam-Status: No, score=" in res.stdout_bytes  # SpamAssassin's clients: not spam
    assert b" required=36.74 tests=SPAMNB_UNSURE " in res.stdout_bytes  # spamnb's verdict; T of cut-off 1
    assert b"X-Spam-Flag" not in res.stdout_bytes
    for label in ("spam", "ham"):
        run(["filter", "--model", trained_model_file, "--exit-zero"],
            input=sample_message(label).read_bytes(), code=0)


def test_filter_crlf_and_edge_inputs(trained_model, trained_model_file):
    name = "small.joblib"
    crlf = sample_message("spam", 2).read_bytes().replace(b"\n", b"\r\n")
    for raw in [crlf, b"Subject: no body", b"Subject: no body\r\n", b"", b"just some text, not mail\n",
                b"\x00\xff\xfe binary junk"]:
        res = CliRunner().invoke(main, ["filter", "--model", str(trained_model_file)], input=raw)
        assert res.exit_code in (0, 1, 2), res.output
        assert res.stdout_bytes == expected_filter_output(trained_model, raw, name)[0]
    out = run(["filter", "--model", trained_model_file], input=crlf, code=0).stdout_bytes
    head = out.split(b"\r\n\r\n", 1)[0]
    assert b"\r\nX-Spam-Flag: YES\r\nX-Spam-Status: Yes, " in head
    assert b"\n" not in head.replace(b"\r\n", b"")  # every added line ends in CRLF


def test_filter_evidence_header(trained_model, trained_model_file, spam_msg):
    raw = spam_msg.read_bytes()
    out = run(["filter", "--model", trained_model_file, "--evidence", "5"], input=raw).stdout_bytes
    ev = trained_model.explain(raw, 5).tokens
    field = re.search(rb"\nX-Spam-Evidence: (.*(\n\t.*)*)\n", out).group(1).decode()
    items = field.replace("\n\t", " ").split(", ")  # unfolded
    assert items == [f"{tok}:{c:+.2f}" for tok, _, c in ev]


def test_filter_long_evidence_is_folded(trained_model_file, spam_msg):
    out = run(["filter", "--model", trained_model_file, "--evidence", "60"],
              input=spam_msg.read_bytes()).stdout_bytes
    head = out.split(b"\n\n", 1)[0]
    evidence = head[head.index(b"X-Spam-Evidence: "):].split(b"\n")
    assert len(evidence) > 1 and max(len(line) for line in evidence) <= 78
    msg = email.message_from_bytes(out)
    assert len(msg["X-Spam-Evidence"].split(",")) == 60


def test_filter_learn_when_confident(model_file):
    spam = sample_message("spam", 3).read_bytes()
    sure = learnable_cutoffs(load_model(model_file), spam)
    run(["filter", "--model", model_file, "--learn", *sure], input=spam, code=0)
    assert load_model(model_file).messages.tolist() == [150, 151]
    run(["filter", "--model", model_file, "-u", *sure], input=spam, code=0)  # same message: counted once
    assert load_model(model_file).messages.tolist() == [150, 151]
    unsure = b"Subject: meeting notes\n\nclick here for the meeting notes, free of charge\n"
    run(["filter", "--model", model_file, "-u", "--ham-cutoff", "0", "--spam-cutoff", "1"],
        input=unsure, code=2)
    assert load_model(model_file).messages.tolist() == [150, 151]  # unsure: not learned


def _write_state(path, **changes):
    state = load_model(path).to_state()
    state.update(changes)
    store.save_atomic(state, path)


# Each breaks a private copy of the model (or its folder) and names the message expected.
BREAKERS = {
    "missing": (lambda p: p.unlink(), "no model at"),
    "truncated": (lambda p: p.write_bytes(p.read_bytes()[:1000]), "corrupt or truncated"),
    "garbage": (lambda p: p.write_bytes(b"this is not a model\n" * 10), "corrupt or truncated"),
    "empty": (lambda p: p.write_bytes(b""), "corrupt or truncated"),
    "future-version": (lambda p: _write_state(p, format_version=99), "format version 99 is not supported"),
    "not-a-model": (lambda p: store.save_atomic({"hello": 1}, p), "not a spamnb model file"),
    "damaged-counts": (lambda p: _write_state(p, class_count=[1.0, 2.0, 3.0]), "do not match"),
    "world-writable": (lambda p: p.chmod(0o666), "writable by group or others"),
    "group-writable": (lambda p: p.chmod(0o620), "writable by group or others"),
    "open-folder": (lambda p: p.parent.chmod(0o777), "its folder"),
    "directory": (lambda p: (p.unlink(), p.mkdir()), "directory"),
}


@pytest.mark.parametrize("breaker", sorted(BREAKERS))
def test_filter_passes_mail_through_on_any_model_failure(model_file, breaker, spam_msg):
    brk, text = BREAKERS[breaker]
    brk(model_file)
    raw = spam_msg.read_bytes()
    res = run(["filter", "--model", model_file], input=raw, code=3)
    assert res.stdout_bytes == raw
    assert text in res.stderr and "passed through unchanged" in res.stderr


# Every breaker against `info`; three kinds of breakage against every command.
BAD_MODEL_CASES = ([("info", b) for b in sorted(set(BREAKERS) - {"directory"})]
                   + [(c, b) for c in ["classify", "explain", "sort", "learn", "forget", "tokens"]
                      for b in ["missing", "truncated", "future-version", "world-writable"]
                      if (c, b) != ("learn", "missing")])  # learn creates a missing model


@pytest.mark.parametrize("command, breaker", BAD_MODEL_CASES)
def test_commands_refuse_bad_models_clearly(model_file, breaker, command, spam_msg, request):
    brk, text = BREAKERS[breaker]
    brk(model_file)
    sample_maildir = request.getfixturevalue("sample_maildir") if command == "sort" else None
    args = {"classify": [spam_msg], "explain": [spam_msg], "info": [], "sort": [sample_maildir],
            "learn": ["--spam", spam_msg], "forget": ["--spam", spam_msg], "tokens": [spam_msg]}[command]
    res = run([command, "--model", model_file, *args], code=1)
    assert text in res.stderr
    assert res.stderr.count("\n") <= 2  # one clear line, not a dump
    if command == "sort":
        assert not (sample_maildir / ".Junk").exists()


def test_allow_insecure_model_loads_a_writable_file(model_file, spam_msg):
    model_file.chmod(0o666)
    rows = jsonl(run(["classify", spam_msg, "--model", model_file, "--format", "jsonl",
                      "--allow-insecure-model"]))
    assert rows[0]["label"] == "spam"


@pytest.mark.parametrize("args", [
    ["--evidence", "abc"], ["stray-argument"], ["--spam-cutoff", "x"], ["--no-such-option"],
    ["--spam-cutoff", "0.5", "--cost-fp", "2"], ["--spam-cutoff", "2"],
])
def test_filter_passes_mail_through_on_bad_options(trained_model_file, spam_msg, args):
    raw = spam_msg.read_bytes()
    res = run(["filter", "--model", trained_model_file, *args], input=raw, code=3)
    assert res.stdout_bytes == raw
    assert "passed through unchanged" in res.stderr


def test_filter_model_is_a_directory_option(tmp_path, spam_msg):
    raw = spam_msg.read_bytes()
    res = run(["filter", "--model", tmp_path], input=raw, code=3)
    assert res.stdout_bytes == raw


# -- sort --------------------------------------------------------------------------

def _files(maildir):
    """The messages of a maildir tree (not the Maildir++ folder marker, tests/test_sort.py)."""
    return {p.relative_to(maildir): p.read_bytes() for p in maildir.rglob("*")
            if p.is_file() and p.name not in (".keep", "maildirfolder")}


def test_sort_dry_run_changes_nothing(trained_model_file, sample_maildir):
    before = _files(sample_maildir)
    res = run(["sort", sample_maildir, "--model", trained_model_file, "--dry-run"])
    assert _files(sample_maildir) == before
    assert not (sample_maildir / ".Junk").exists()
    planned = [line for line in res.stdout.splitlines() if line.startswith("spam")]
    assert f"would move {len(planned)} message(s)" in res.stderr
    assert planned  # the sample holds 30 spam


def test_sort_moves_spam_by_rename(trained_model_file, sample_maildir):
    rows = jsonl(run(["classify", sample_maildir, "--model", trained_model_file, "--format", "jsonl"]))
    spam = {os.path.relpath(r["path"], sample_maildir) for r in rows if r["label"] == "spam"}
    before = _files(sample_maildir)
    res = run(["sort", sample_maildir, "--model", trained_model_file])
    after = _files(sample_maildir)
    assert f"moved {len(spam)} message(s)" in res.stderr
    assert sorted(after.values()) == sorted(before.values())  # nothing lost, nothing duplicated
    moved = {str(p) for p in after if str(p).startswith(".Junk/")}
    assert moved == {".Junk/" + s for s in spam}  # same cur/ or new/, same name (flags kept)
    for sub in ("cur", "new", "tmp"):
        assert (sample_maildir / ".Junk" / sub).is_dir()
    # sorting again finds nothing more to move
    assert "moved 0 message(s)" in run(["sort", sample_maildir, "--model", trained_model_file]).stderr


def test_sort_unsure_folder_and_cutoffs(trained_model_file, sample_maildir):
    run(["sort", sample_maildir, "--model", trained_model_file, "--spam-folder", ".Spam",
         "--unsure-folder", ".Unsure", "--ham-cutoff", "0", "--spam-cutoff", "1"])
    # every message with 0 < P(spam) <= 1 is unsure under these cut-offs; none is spam
    assert not (sample_maildir / ".Spam").exists()
    assert list((sample_maildir / ".Unsure" / "cur").iterdir())


def test_sort_never_overwrites(trained_model_file, sample_maildir, spam_msg):
    target = sample_maildir / ".Junk" / "cur" / spam_msg.name
    target.parent.mkdir(parents=True)
    target.write_bytes(b"someone else's message\n")
    run(["sort", sample_maildir, "--model", trained_model_file])
    assert target.read_bytes() == b"someone else's message\n"
    assert (sample_maildir / "cur" / spam_msg.name).exists()  # left where it was


def test_sort_new_messages_stay_in_new(trained_model_file, sample_maildir, spam_msg):
    (sample_maildir / "cur" / spam_msg.name).rename(sample_maildir / "new" / "1700000000.M1P1.host")
    run(["sort", sample_maildir, "--model", trained_model_file])
    assert (sample_maildir / ".Junk" / "new" / "1700000000.M1P1.host").exists()


@pytest.mark.parametrize("make, code, text", [
    (lambda d: d / "missing", 2, "does not exist"),
    (lambda d: (d / "plain").mkdir() or d / "plain", 1, "is not a maildir"),
])
def test_sort_errors(trained_model_file, tmp_path, make, code, text):
    res = run(["sort", make(tmp_path), "--model", trained_model_file], code=code)
    assert text in res.output


# -- explain / info / tokens ---------------------------------------------------------

def test_explain_contributions_add_up_to_the_score(trained_model, trained_model_file, spam_msg):
    raw = spam_msg.read_bytes()
    c = trained_model.classify(raw)
    out = run(["explain", spam_msg, "--model", trained_model_file, "--count", "100000"]).stdout.splitlines()
    assert out[0] == f"label {c.label}, P(spam) {c.spam_probability:.6f}, score {c.score:+.2f}"
    assert out[1].endswith("prior and per-class constants")
    sides = [line for line in out if "-ward:" in line]
    assert [line.split()[1] for line in sides] == ["spam-ward:", "ham-ward:"]
    tokens = [float(line.split()[0]) for line in out[2:-2] if "-ward:" not in line]
    prior = float(out[1].split()[0])
    # score = bias + sum of token contributions (a linear model); 3 decimals each
    assert prior + sum(tokens) == pytest.approx(c.score, abs=0.0005 * (len(tokens) + 1) + 1e-6)
    assert prior + sum(float(line.split()[0]) for line in sides) == pytest.approx(c.score, abs=0.0015)
    assert out[-2].startswith(f"{c.score:+10.3f}  score")
    assert out[-1] == f"{c.n_tokens} tokens, {c.n_unknown} not in the vocabulary"
    short = run(["explain", "-", "--model", trained_model_file, "-c", "3"], input=raw).stdout.splitlines()
    assert len(short) == 1 + 1 + (1 + 3) * 2 + 1 + 1
    assert short[2:6] == [out[2][:-1] + "; the strongest 3:", *out[3:6]]  # strongest first
    assert short[:2] == out[:2] and short[-2:] == out[-2:]


def test_explain_errors(trained_model_file, tmp_path):
    assert "no such file" in run(["explain", "/no/such/msg", "--model", trained_model_file], code=1).output
    (tmp_path / "empty").mkdir()
    assert "no message in" in run(["explain", tmp_path / "empty", "--model", trained_model_file],
                                  code=1).output


def test_info_reports_the_model(trained_model, trained_model_file):
    out = run(["info", "--model", trained_model_file]).stdout
    assert f"model file:  {trained_model_file}\n" in out
    assert f"model type:  {trained_model.model_type}" in out
    assert "messages:    150 ham, 150 spam" in out
    assert f"vocabulary:  {len(trained_model.vocabulary)} tokens" in out
    assert "cut-offs:    ham if P(spam) <= 0.5, spam if > 0.95" in out  # costs 10, 1, 0.5
    assert f"written by:  spamnb {__version__}" in out


def test_tokens(spam_msg, tiny_corpus, tmp_path):
    raw = spam_msg.read_bytes()
    expected = tokenize(raw, TokenizerConfig())
    assert run(["tokens", spam_msg]).stdout.splitlines() == expected
    assert run(["tokens", "-"], input=raw).stdout.splitlines() == expected
    # with a model: the model's tokenizer settings
    path = tmp_path / "m.joblib"
    run(["train", "--index", tiny_corpus.index, "--model", path, "--only-headers", "subject"])
    only_subject = run(["tokens", spam_msg, "--model", path]).stdout.splitlines()
    assert only_subject == tokenize(raw, load_model(path).tokenizer)
    assert len(only_subject) < len(expected)
    assert run(["tokens", spam_msg, "--model", path, "--default-settings"]).stdout.splitlines() == expected


def test_tokens_errors(spam_msg):
    assert "no such file" in run(["tokens", "/no/such/msg"], code=1).output
    assert "no model at /no/such/model" in run(["tokens", spam_msg, "--model", "/no/such/model"],
                                               code=1).output


# -- the default model ----------------------------------------------------------------

def test_default_model_for_a_new_user(small_archive, monkeypatch, spam_msg, isolated_env):
    monkeypatch.setenv("SPAMNB_CORPUS", str(small_archive))
    cache = isolated_env / "cache" / "spamnb" / f"default-model-{locate.DEFAULT_RECIPE}.joblib"
    user = isolated_env / "data" / "spamnb" / "model.joblib"
    res = run(["classify", spam_msg, "--format", "jsonl"])
    assert "using the default model" in res.stderr and "building the default model" in res.stderr
    assert "[default model]" in res.stderr
    assert jsonl(res)[0]["label"] == "spam"
    assert cache.exists() and not user.exists()
    assert load_model(cache).messages.tolist() == [150, 150]
    res = run(["classify", spam_msg])  # cached now: no second build
    assert "using the default model" in res.stderr and "building" not in res.stderr
    assert "(default model)" in run(["info"]).stdout
    out = run(["filter", "--exit-zero"], input=spam_msg.read_bytes()).stdout_bytes
    assert b" model=default version=" in out
    # an empty SPAMNB_MODEL is the same as none
    monkeypatch.setenv("SPAMNB_MODEL", "")
    assert "(default model)" in run(["info"]).stdout
    monkeypatch.delenv("SPAMNB_MODEL")
    # the first learn makes the user's own model, starting from the cached default one
    # (no corpus any more: it must not rebuild)
    monkeypatch.setenv("SPAMNB_CORPUS", str(isolated_env / "gone.tar.gz"))
    res = run(["learn", "--ham", spam_msg])
    assert f"creating your model at {user}" in res.stderr
    assert load_model(user).messages.tolist() == [151, 150]
    assert "(default model)" not in run(["info"]).stdout
    assert "[default model]" not in run(["classify", spam_msg]).stderr


def test_no_model_and_no_corpus_is_a_clear_error(spam_msg):
    res = run(["classify", spam_msg], code=1)
    assert res.stderr.count("\n") == 1  # one line: what is missing and what to do
    assert "no model of yours, and no shipped corpus" in res.stderr and "spamnb train" in res.stderr
    assert "using the default model" not in res.stderr


def test_spamnb_model_variable_names_the_model(trained_model_file, monkeypatch, spam_msg, tmp_path):
    monkeypatch.setenv("SPAMNB_MODEL", str(trained_model_file))
    assert f"model file:  {trained_model_file}\n" in run(["info"]).stdout
    monkeypatch.setenv("SPAMNB_MODEL", str(tmp_path / "absent.joblib"))
    assert "no model at" in run(["info"], code=1).stderr
