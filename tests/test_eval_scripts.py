"""The evaluation scripts and the corpora kept outside the project.

The Chinese corpus (trec06c-dev) is not shipped: its licence allows research
use only. The scripts read it from ``<repo>/../shared/corpora/trec06c-dev`` or
``--corpus PATH`` (or the index they are given) and, when it is not there,
print one line and exit 2 (``tools/shared_corpora.py``). These tests never
read ``../shared``: they give the scripts paths that do not exist, and a small
Chinese corpus made of the project's own golden messages.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from conftest import ROOT

TOOLS = ROOT / "tools"
GOLDEN = ROOT / "tests" / "golden"


def script(name):
    """A script of tools/ by its file name, whichever folder holds it."""
    (path,) = TOOLS.glob(f"*/{name}")
    return path


def run_script(name, *args, cwd):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, str(script(name)), *map(str, args)], capture_output=True,
                          text=True, timeout=120, cwd=cwd, env=env)


def test_the_chinese_corpus_is_looked_for_beside_the_repository():
    shared_corpora = _script_module("shared_corpora")
    assert shared_corpora.TREC06C == ROOT.parent / "shared" / "corpora" / "trec06c-dev"
    assert shared_corpora.EXIT_ABSENT == 2


# Each script that evaluates on trec06c-dev, given a corpus that is not there.
ABSENT = [
    ("cjk_ablation.py", ["--corpus", "{missing}", "none"], "pass --corpus PATH"),
    ("bench_tokenizer.py", ["{missing}/index"], "give its path"),
    ("compare_peers.py", ["{missing}/index", "--halves", "--peers", "spamnb"], "give its path"),
    ("run_peers.py", ["{missing}/index", "--halves", "--peers", "spamnb"], "give its path"),
    ("model_ablation.py", ["{missing}/index", "--folds", "2"], "give its path"),
    ("tokenizer_ablation.py", ["{missing}/index", "--folds", "2"], "give its path"),
    ("bench_online.py", ["{missing}/index"], "give its path"),
]


@pytest.mark.parametrize("script, args, how", ABSENT, ids=[a[0] for a in ABSENT])
def test_an_absent_chinese_corpus_is_one_line_and_exit_2(tmp_path, script, args, how):
    missing = tmp_path / "shared" / "corpora" / "trec06c-dev"
    proc = run_script(script, *[a.format(missing=missing) for a in args], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"{script}: skipped: no corpus at {missing}")
    assert "trec06c-dev is not shipped (research-use licence)" in lines[0]
    assert how in lines[0] and "corpora/README.md" in lines[0]


def test_bench_tokenizer_skips_an_absent_default_and_measures_the_rest(tmp_path):
    """Without INDEX it measures ../shared/corpora/spamassassin and the --corpus
    folder, skipping one that is not there with the line. Run from a copy of the
    scripts in a repository of its own, beside which there is no ../shared, with
    a small Chinese corpus as --corpus."""
    repo = tmp_path / "repo"
    (repo / "tools" / "benchmarks").mkdir(parents=True)
    for name in ("__init__.py", "shared_corpora.py", "benchmarks/__init__.py", "benchmarks/bench_tokenizer.py"):
        shutil.copy(TOOLS / name, repo / "tools" / name)
    corpus = chinese_corpus(tmp_path / "data" / "trec06c-dev")
    proc = subprocess.run([sys.executable, str(repo / "tools" / "benchmarks" / "bench_tokenizer.py"), "--corpus", str(corpus),
                           "--repeat", "1"], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr
    sa = tmp_path / "shared" / "corpora" / "spamassassin"
    assert proc.stderr.splitlines() == [f"bench_tokenizer.py: skipped: no corpus at {sa}; the evaluation "
                                        f"corpora live beside the repository, in {sa.parent}"]
    assert "| trec06c-dev | 24 |" in proc.stdout and "spamassassin" not in proc.stdout


def chinese_corpus(root):
    """24 messages, a TREC index: the project's own Chinese golden messages,
    each copied under several names, so that both md5 halves hold both classes."""
    lines = []
    for label, prefix in (("ham", "cn_ham_"), ("spam", "cn_spam_")):
        (root / label).mkdir(parents=True)
        sources = sorted(GOLDEN.glob(prefix + "*.eml"))
        for i in range(12):
            name = f"{label}/{i:03d}"
            shutil.copyfile(sources[i % len(sources)], root / name)
            lines.append(f"{label} {name}\n")
    (root / "index").write_text("".join(lines))
    return root


def test_cjk_ablation_reads_the_corpus_given(tmp_path):
    from spamnb.evaluation.folds import hash_folds

    corpus = chinese_corpus(tmp_path / "elsewhere")

    labels = [line.split()[0] for line in (corpus / "index").read_text().splitlines()]
    fold = hash_folds([line.split()[1] for line in (corpus / "index").read_text().splitlines()], 2)
    assert {(lb, int(f)) for lb, f in zip(labels, fold)} == {("ham", 0), ("ham", 1), ("spam", 0), ("spam", 1)}
    proc = run_script("cjk_ablation.py", "--corpus", corpus, "none", "bigram", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["none", "bigram"]
    assert all("(1-AUC)%" in line and "recall@0.1%FPR" in line for line in lines)


def test_protocols_names_the_worst_ranked_with_their_share(capsys):
    """protocols.py's lines under each protocol: ham 0.1, 0.9 and spam 0.5, 0.8 have
    (1-AUC)% = 50, all of it the ham at 0.9's (above both spam); the lower spam is below
    that ham (1 pair, half of it). Sources under the shared corpora are shown relative to them."""
    import numpy as np

    protocols = _script_module("protocols")
    shared = protocols.shared_corpora.SHARED
    sources = [str(shared / "sa/ham/a"), str(shared / "sa/ham/b"), "/elsewhere/c", str(shared / "sa/spam/d")]
    protocols.worst_lines("cv10", np.array([0, 0, 1, 1]), np.array([0.1, 0.9, 0.5, 0.8]), sources, 1)
    assert capsys.readouterr().out.splitlines() == [
        "cv10     A's worst ham     +0.90      2 spam 50.0000 of 50.0000 (1-AUC)% (100%)  sa/ham/b",
        "cv10     A's worst spam    +0.50      1 ham  25.0000 of 50.0000 (1-AUC)% (50%)  /elsewhere/c",
    ]


def _script_module(name):
    """tools/KIND/NAME.py (or tools/NAME.py) imported as the scripts import it: tools.KIND.NAME."""
    import importlib

    path = TOOLS / f"{name}.py"
    dotted = f"tools.{name}" if path.exists() else f"tools.{script(name + '.py').parent.name}.{name}"
    sys.path.insert(0, str(ROOT))
    try:
        return importlib.import_module(dotted)
    finally:
        sys.path.remove(str(ROOT))


def test_first_day_frontier_shift_leaves_exactly_the_target_share_not_ham():
    """100 ham scored 0..99: the 5% shift leaves the 5 highest (95..99) at or above 0."""
    import numpy as np

    frontier = _script_module("first_day_frontier")
    ham = np.arange(100.0)
    delta = frontier.shift_for(ham)
    assert np.sum(ham - delta >= 0) == 5
    # caught: spam above the spam cut-off (log 19) after the shift
    spam = np.array([delta + 2.0, delta + 3.0, delta + 10.0])
    assert frontier.caught(spam, delta) == pytest.approx(200 / 3)


def test_first_day_frontier_length_all_counts_unknown_tokens_in_the_unit_length():
    """presence-l2: a message of k known and u unknown distinct tokens scores each known
    token 1/sqrt(k + u) with length=all, 1/sqrt(k) otherwise."""
    import numpy as np

    from spamnb.model import SpamModel

    frontier = _script_module("first_day_frontier")
    model = SpamModel()
    model.learn([(b"Subject: cheap pills\n\ncheap pills now\n", "spam"),
                 (b"Subject: meeting\n\nthe meeting is at noon\n", "ham")])
    raw = b"Subject: meeting\n\ncheap meeting zanzibar quokka\n"
    toks = set(model.tokens(raw))
    k = sum(t in model.vocabulary for t in toks)
    u = len(toks) - k
    assert k and u
    known = frontier.known_rows(model, [model.tokens(raw)])
    everything = frontier.over_all_tokens(known, frontier.distinct([model.tokens(raw)]))
    assert np.allclose(known.data, 1 / np.sqrt(k))
    assert np.allclose(everything.data, 1 / np.sqrt(k + u))


@pytest.mark.parametrize("lever, message", [
    ("floor=abc", "floor takes a number, not 'abc'"),
    ("length=some", "length is known or all, not 'some'"),
    ("nonsense=1", "unknown setting 'nonsense'"),
])
def test_first_day_frontier_refuses_a_bad_lever_before_training(lever, message):
    frontier = _script_module("first_day_frontier")
    with pytest.raises(SystemExit, match=message):
        frontier.split(lever)


def test_first_week_readdresses_spam_to_the_mailbox_owner():
    """The owner is the address most often in To: and Cc:; readdressing replaces the
    whole To: field (its continuation lines too) and keeps every other byte."""
    week = _script_module("first_week")
    mailbox = [
        ("a", b"To: Owner <owner@example.com>, x@example.com\nSubject: a\n\nbody\n", "ham"),
        ("b", b"To: y@example.com\nCc: owner@EXAMPLE.com\nSubject: b\n\nbody\n", "ham"),
        ("c", b"To: owner@example.com\n\nbody\n", "ham"),
    ]
    assert week.owner_address(mailbox) == "owner@example.com"
    spam = b"From: s@spam.test\nTo: a@b.test,\n  c@d.test\nSubject: buy\n\nTo: not a header\n"
    assert week.readdressed(spam, "owner@example.com") == (
        b"From: s@spam.test\nSubject: buy\nTo: owner@example.com\n\nTo: not a header\n")


def test_first_week_orders_a_mailbox_by_date_undated_last():
    week = _script_module("first_week")
    msgs = [("late", b"Date: Tue, 2 Jan 2001 10:00:00 -0800\n\n", "ham"),
            ("none", b"Subject: x\n\n", "ham"),
            ("early", b"Date: Mon, 1 Jan 2001 10:00:00 -0800\n\n", "ham"),
            ("bad", b"Date: yesterday\n\n", "ham")]
    assert [m[0] for m in week.by_date(msgs)] == ["early", "late", "bad", "none"]


def test_living_filter_readdresses_only_the_spam_of_the_stream():
    living = _script_module("living_filter")
    ham = ("h", b"To: owner@example.com\n\nhello\n", "ham")
    spam = ("s", b"To: someone@else.test\nSubject: buy\n\nnow\n", "spam")
    assert living.with_owner([ham, spam]) == [ham, ("s", b"Subject: buy\nTo: owner@example.com\n\nnow\n", "spam")]
    with pytest.raises(SystemExit, match="no ham"):
        living.with_owner([spam])


def test_protocols_names_the_absent_corpus_itself(tmp_path, monkeypatch, capsys):
    """The scripts built on protocols.py (first_day_frontier, first_week) say which corpus
    is missing, not only the folder of corpora."""
    protocols = _script_module("protocols")
    monkeypatch.setattr(protocols.shared_corpora, "SHARED", tmp_path / "corpora")
    with pytest.raises(SystemExit) as stop:
        protocols.corpus("enron-ham-dev")
    assert stop.value.code == 2
    assert f"no corpus at {tmp_path / 'corpora' / 'enron-ham-dev'};" in capsys.readouterr().err


def _dated_message(day, subject, body, *, crlf=False, extra=b""):
    raw = (b"Received: from relay.example.net\nFrom: someone@example.org\nTo: phishing@pot\n" + extra +
           b"Date: %s\nSubject: %s\nContent-Type: text/plain\n\n%s\n"
           % (time.strftime("%a, %d %b %Y %H:%M:%S +0000", time.gmtime(1_000_000_000 + day * 86400)).encode(),
              subject, body))
    return raw.replace(b"\n", b"\r\n") if crlf else raw


def test_living_filter_first_day_after_setup_on_a_made_stream():
    """--start setup's machinery, fast: the header cut and the honeypot's address, setup's own
    proposal and training on the earliest sorted mail, the later stream, the windows' figures."""
    living = _script_module("living_filter")
    ham = [(f"ham/{i}", _dated_message(i, b"budget meeting %d" % i, b"the quarterly budget report and schedule"),
            "ham") for i in range(40)][::-1]  # given newest first: dated() sorts them
    spam = [(f"spam/{i}", _dated_message(i, b"you are a winner %d" % i,
                                         b"Dear phishing@pot claim your bitcoin prize now", crlf=True), "spam")
            for i in range(30)]
    cut = living.dated(ham, living.README_FIELDS)
    assert [m[0] for m in cut[:2]] == ["ham/0", "ham/1"] and cut[0][3] < cut[1][3]
    assert cut[0][1] == b"From: someone@example.org\nSubject: budget meeting 0\nContent-Type: text/plain\n\n" \
                        b"the quarterly budget report and schedule\n"
    bad = living.dated(spam, living.README_FIELDS, "owner@corp.example")
    assert all(b"\r" not in raw and b"pot" not in raw and b"Received" not in raw and b"To:" not in raw
               and b"Dear owner@corp.example" in raw for _, raw, _, _ in bad)
    readdressed = living.dated(spam, living.README_FIELDS + (b"to",), "owner@corp.example", readdress=True)
    assert b"To: owner@corp.example" in readdressed[0][1]

    folders, now = living.sorted_mail(cut, bad, 30, 10)
    assert [(f.role, len(f.messages)) for f in folders] == [("ham", 30), ("spam", 10)]
    proposal, model = living.setup_start(folders, now, screen=None)
    assert proposal.enough and proposal.young == 0 and model.class_count.tolist() == [30, 10]
    few, kept = living.setup_start(living.sorted_mail(cut, bad, 29, 10)[0], now, screen=model)
    assert not few.enough and kept is model  # too little sorted: setup keeps the screening (default) model

    stream = living.next_messages(cut[30:], bad[10:], seed=1, n=15)
    assert len(stream) == 15 and {m[2] for m in stream} == {"ham", "spam"}
    assert [m[0] for m in stream if m[2] == "ham"] == [m[0] for m in cut[30:30 + len(stream) - sum(
        m[2] == "spam" for m in stream)]]  # each class keeps its date order
    assert living.next_messages(cut[30:], bad[10:], seed=1, n=15) == stream
    assert len(living.next_messages(cut[30:], bad[10:], seed=1, n=100)) == 30  # both classes used up

    state = model.to_state()
    scores, labels, n = living.living(stream, living.FILTER_U, 0, lambda: type(model).from_state(state))
    golds = [m[2] for m in stream]
    assert labels == golds and n["actions"] == 0  # the made classes share no word: all filed right
    rows = living.first_day_rows([(labels, golds)], [(0, 5), (5, 15)])
    assert [[r[0] for r in row] for row in rows] == [[0.0, 100.0, 0.0], [0.0, 100.0, 0.0]]
    assert living.target_met(rows[-1]) == (True, True)
    wrong = ["spam" if g == "ham" else "ham" for g in golds]
    assert living.target_met(living.first_day_rows([(wrong, golds)], [(0, 15)])[0]) == (False, False)
