"""What broke on a new user's first day (issue: "Tried as a new user would"), each
reproduced through the command line first, then held here."""

from __future__ import annotations

import mailbox
import os
import random
import subprocess

import click
import pytest
from click.testing import CliRunner

from conftest import sample_message
from spamnb.cli import main
from spamnb.mail.tokenizer import tokenize
from spamnb.storage.modelfile import load_model
from spamnb.storage import locate
from test_e2e import SPAMNB


def run(args, input=None, code=0):
    result = CliRunner().invoke(main, [str(a) for a in args], input=input)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == code, result.output
    return result


@pytest.fixture
def mbox_file(tmp_path):
    """An mbox of 6 spam and 6 ham of the sample maildir."""
    path = tmp_path / "mixed.mbox"
    box = mailbox.mbox(str(path))
    for i in range(6):
        for label in ("spam", "ham"):
            box.add(mailbox.mboxMessage(sample_message(label, i).read_bytes()))
    box.close()
    return path


# -- 1. train without --model writes the user's own model -------------------------

def test_train_without_model_writes_the_users_model(tiny_corpus, isolated_env):
    res = run(["train", "--index", tiny_corpus.index])
    user = isolated_env / "data" / "spamnb" / "model.joblib"
    assert f"saved to {user}" in res.stderr
    assert user.exists()
    assert not (isolated_env / "cache" / "spamnb" / f"default-model-{locate.DEFAULT_RECIPE}.joblib").exists()
    info = run(["info"]).stdout
    assert f"model file:  {user}\n" in info and "(default model)" not in info
    # and it is the user's: learn and forget work on it
    msg = sample_message("spam", 0)
    assert "learned 1 as spam" in run(["learn", "--spam", msg]).stderr
    assert "forgot 1 spam" in run(["forget", "--spam", msg]).stderr


def test_train_honours_spamnb_model(tiny_corpus, tmp_path, monkeypatch):
    target = tmp_path / "mine.joblib"
    monkeypatch.setenv("SPAMNB_MODEL", str(target))
    run(["train", "--index", tiny_corpus.index])
    assert target.exists()


# -- 4. standard input is read as the file would be --------------------------------

def test_stdin_mbox_is_many_messages(trained_model_file, mbox_file, model_file):
    data = mbox_file.read_bytes()
    as_path = run(["classify", "--model", trained_model_file, "--format", "tsv", mbox_file]).stdout
    as_stdin = run(["classify", "--model", trained_model_file, "--format", "tsv", "-"], input=data).stdout
    assert len(as_stdin.splitlines()) == 12
    assert [line.split("\t")[1:] for line in as_stdin.splitlines()] == \
        [line.split("\t")[1:] for line in as_path.splitlines()]
    assert as_stdin.splitlines()[0].startswith("-:#1\t")
    before = load_model(model_file).messages.sum()
    res = run(["learn", "--spam", "--model", model_file, "-"], input=data)
    assert "learned" in res.stderr
    after = load_model(model_file)
    # 12 messages read; those the model had already learned count once (moved or unchanged)
    assert after.messages.sum() - before + int(res.stderr.split("already learned: ")[1].split()[0]) \
        + int(res.stderr.split("moved ")[1].split(";")[0]) == 12


def test_stdin_single_message_is_one(trained_model_file):
    raw = b"Subject: hello\n\nsee you at lunch\n"
    rows = run(["classify", "--model", trained_model_file, "--format", "tsv", "-"], input=raw).stdout
    assert [r.split("\t")[0] for r in rows.splitlines()] == ["-"]


# -- 5. no evidence is no verdict -------------------------------------------------

NOT_MAIL = {
    "empty": b"",
    "elf": b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 8,
    # fixed bytes: os.urandom started with a field ("n$9:") about once in 450 runs, which is
    # mail by spamnb's rule (a header field at the top), and failed a clean CI run
    "random": random.Random(17).randbytes(3000),
    "text": b"Just some notes I typed,\nnot a message at all.\n",
    "blank-first": b"\nSubject: body only\n",
}


@pytest.mark.parametrize("name", sorted(NOT_MAIL))
def test_input_that_is_not_mail_is_unsure_on_every_path(name, trained_model_file, tmp_path):
    raw = NOT_MAIL[name]
    assert tokenize(raw) == []
    # the installed command: the fast path (compiled scorer) ...
    fast = subprocess.run([*SPAMNB, "filter", "--model", str(trained_model_file)], input=raw,
                          capture_output=True, env={**os.environ, "SPAMNB_SOCKET": str(tmp_path / "none")})
    assert fast.returncode == 2, fast.stderr
    assert b"X-Spam-Status: No, " in fast.stdout and b" tests=SPAMNB_UNSURE " in fast.stdout
    # ... the click command (evidence forces it) and classify
    full = run(["filter", "--model", trained_model_file, "--evidence", "3"], input=raw, code=2)
    assert b"X-Spam-Status: No, " in full.stdout_bytes and b" tests=SPAMNB_UNSURE " in full.stdout_bytes
    path = tmp_path / "msg"
    path.write_bytes(raw)
    row = run(["classify", "--model", trained_model_file, "--format", "tsv", path]).stdout
    assert row.split("\t")[1] == "unsure"


def test_no_known_token_is_unsure_whatever_the_prior(trained_model_file):
    """Mail whose every token is new to the model: P(spam|x) is the prior alone."""
    from conftest import filter_message
    from spamnb.storage.scorer import fresh_scorer

    model = load_model(trained_model_file)
    unknown = ["zzqxv-never-seen", "qqzxv-never-seen"]
    result = model.classify_tokens(unknown)
    assert result.n_tokens == result.n_unknown == 2 and result.label == "unsure"
    # a prior far from 1/2 would otherwise decide it: the label stays unsure
    assert model.classify_tokens([]).label == "unsure"
    # the compiled scorer (cold path, server) says the same
    sc = fresh_scorer(trained_model_file)
    assert sc.score(unknown)[2] == 0
    out, label, _ = filter_message(model, b"Subject: x\n\nhello\n", "m")
    assert label in ("ham", "spam", "unsure")  # known tokens: a real verdict


def test_binary_junk_is_not_learned(model_file, tmp_path, tiny_corpus):
    junk = tmp_path / "junk"
    junk.mkdir()
    for name, raw in NOT_MAIL.items():
        (junk / name).write_bytes(raw)
    before = load_model(model_file)
    res = run(["learn", "--spam", "--model", model_file, junk])
    assert res.stderr.count("not a mail message") == len(NOT_MAIL)
    after = load_model(model_file)
    assert after.messages.tolist() == before.messages.tolist()
    assert len(after.vocabulary) == len(before.vocabulary)
    # and train skips them too, with a note, counting only the mail
    target = tmp_path / "t.joblib"
    res = run(["train", "--ham", tiny_corpus.ham_dir, "--spam", tiny_corpus.spam_dir, "--spam", junk,
               "--model", target])
    assert res.stderr.count("not a mail message") == len(NOT_MAIL)
    assert load_model(target).messages.tolist() == [10, 10]


# -- 6. λ = 0 on the command line ---------------------------------------------------

def test_alpha_zero_is_refused_by_train_and_warned_by_evaluate(tiny_corpus, tmp_path):
    res = run(["train", "--index", tiny_corpus.index, "--alpha", "0", "--model", tmp_path / "m"], code=2)
    assert "maximum likelihood" in res.stderr and "spamnb.nb.naive_bayes" in res.stderr
    assert not (tmp_path / "m").exists()
    res = run(["evaluate", "--index", tiny_corpus.index, "--alpha", "0", "--folds", "2"])
    assert "warning: --alpha 0 is maximum likelihood" in res.stderr


# -- 12. one error style ------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ["classify", "--format", "xml", "x"],          # click's own usage error
    ["classify", "/no/such/mail"],                 # a library error
    ["train"],                                     # a usage error of ours
    ["nosuchcommand"],
    ["info", "--model", "RANDOM"],                 # not a model file
])
def test_every_error_is_one_spamnb_error_line(args, tmp_path):
    random_file = tmp_path / "random.joblib"
    random_file.write_bytes(os.urandom(2000))
    random_file.chmod(0o600)
    args = [str(random_file) if a == "RANDOM" else a for a in args]
    res = subprocess.run([*SPAMNB, *args], capture_output=True, text=True)
    assert res.returncode in (1, 2)
    assert res.stderr.startswith("spamnb: error: ") and res.stderr.count("\n") == 1, res.stderr
    assert "Traceback" not in res.stderr and "Error:" not in res.stderr
    if "RANDOM" in args or str(random_file) in args:
        assert "is not a spamnb model file" in res.stderr
        assert "KeyError" not in res.stderr and "IndexError" not in res.stderr


def test_filter_errors_use_the_same_style(tmp_path):
    raw = sample_message("spam", 0).read_bytes()
    res = subprocess.run([*SPAMNB, "filter", "--model", str(tmp_path / "none.joblib")], input=raw,
                         capture_output=True)
    assert res.returncode == 3 and res.stdout == raw
    assert res.stderr.decode().startswith("spamnb: error: no model at ")
    assert res.stderr.decode().rstrip().endswith("; message passed through unchanged")
    res = subprocess.run([*SPAMNB, "filter", "--bogus"], input=raw, capture_output=True)
    assert res.returncode == 3 and res.stdout == raw
    assert res.stderr.decode().startswith("spamnb: error: ")


# -- 14. one label ---------------------------------------------------------------------

def test_learn_refuses_two_labels(model_file):
    before = model_file.read_bytes()
    msg = sample_message("ham", 0)
    for args in (["--spam", "--ham"], ["--ham", "--spam"]):
        res = run(["learn", *args, "--model", model_file, msg], code=2)
        assert "not both" in res.stderr
        res = run(["forget", *args, "--model", model_file, msg], code=2)
    assert model_file.read_bytes() == before


# -- 15. one meaning per short flag ------------------------------------------------------

def test_a_short_flag_means_one_thing_in_every_command():
    meaning = {}
    clashes = []
    for name, command in main.commands.items():
        for param in command.params:
            if not isinstance(param, click.Option):
                continue
            longs = tuple(sorted(o for o in param.opts + param.secondary_opts if o.startswith("--")))
            for short in (o for o in param.opts + param.secondary_opts if not o.startswith("--")):
                if meaning.setdefault(short, longs) != longs:
                    clashes.append(f"{name}: {short} is {longs}, elsewhere {meaning[short]}")
    assert clashes == []
