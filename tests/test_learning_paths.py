"""Learning through every path gives the same model: ``filter -u`` cold, through
the server and through click, each learning a verdict only within the margin
(:func:`spamnb.verdict.learns_verdict`); ``learn`` by its fast path and by
click; the server follows what other processes learn; and the client that asks
the server to learn starts no numpy."""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest

from conftest import learnable_cutoffs, sample_message
from spamnb.delivery import fastfilter
from spamnb.storage import journal
from spamnb.storage.modelfile import compile_scorer, load_model
from test_e2e import SPAMNB
from test_fastpath import compiled  # noqa: F401 (fixture)
from spamnb.verdict import EXIT_CODES, LEARN_MARGIN
from test_server import cold, serving, sock_path, start_server, through_server  # noqa: F401 (fixtures)


def _copy(model, name):
    """A copy of the model with its own scorer (a copied scorer is stale: another
    inode), under the same file name (the name is in the verdict)."""
    (model.parent / name).mkdir(mode=0o700)
    dst = model.parent / name / model.name
    shutil.copy2(model, dst)
    compile_scorer(dst)
    return dst


def _run(args, raw=b"", env=None):
    env = {**os.environ, "SPAMNB_SOCKET": "/nonexistent/spamnb.sock", **(env or {})}
    proc = subprocess.run(SPAMNB + args, input=raw, capture_output=True, timeout=120, env=env)
    return proc.stdout, proc.returncode, proc.stderr.decode()


def _same(a, b):
    assert a.vocabulary.tokens() == b.vocabulary.tokens()
    np.testing.assert_allclose(a.estimator.feature_count_, b.estimator.feature_count_, rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(a.estimator.class_count_, b.estimator.class_count_)
    assert a.registry == b.registry


def _messages():
    return [sample_message(label, i).read_bytes() for label in ("ham", "spam") for i in range(4)]


def test_filter_u_cold_path_learns_what_the_click_command_learns(compiled):
    fast, slow = _copy(compiled, "fast"), _copy(compiled, "slow")
    snapshot = os.stat(fast).st_mtime_ns
    filed = 0
    for raw in _messages():
        out_fast, code_fast, err = _run(["filter", "-u", "--model", str(fast)], raw)
        assert err == ""
        out_slow, code_slow, _ = _run(["filter", "-u", "--evidence", "0", "--model", str(slow)], raw)  # click
        assert (out_fast, code_fast) == (out_slow, code_slow)
        filed += code_fast != 2
    learned = len(journal.read(fast, *_base(fast)))
    assert 0 < learned < filed  # some verdicts in the margin, some not
    assert os.stat(fast).st_mtime_ns == snapshot  # only the journal grew
    _same(load_model(fast), load_model(slow))


def _filter_u(way, model, raw, cutoffs, sock):
    """The label ``filter -u`` gives ``raw`` by one way of answering (learning it or not)."""
    if way == "click":  # --evidence: only the click command gives it
        _, code, err = _run(["filter", "-u", "--evidence", "0", "--model", str(model), *cutoffs], raw)
        assert err == ""
        return {c: label for label, c in EXIT_CODES.items()}[code]
    opts = fastfilter.parse_args(["-u", "--model", str(model), *cutoffs])
    if way == "cold":
        return fastfilter.cold(raw, str(model), False, opts)[1]
    return fastfilter.via_server(sock, raw, str(model), False, opts)[1]  # Fallback if the server declines


@pytest.mark.parametrize("way", ["click", "cold", "server"])
def test_filter_u_learns_a_verdict_only_within_the_margin(way, compiled, sock_path, request):
    """The same message and verdict, the cut-off moved: LEARN_MARGIN + 1 log-odds from
    its score, not learned; LEARN_MARGIN - 1, learned (ham and spam, every way)."""
    if way == "server":
        request.getfixturevalue("serving")
    for label, i in (("ham", 0), ("spam", 1)):
        raw = sample_message(label, i).read_bytes()
        for distance, learned in ((LEARN_MARGIN + 1, False), (LEARN_MARGIN - 1, True)):
            before = load_model(compiled)
            cuts = learnable_cutoffs(before, raw, distance)
            assert _filter_u(way, compiled, raw, cuts, sock_path) == label
            added = (load_model(compiled).messages - before.messages).tolist()
            assert added == ([int(label == "ham"), int(label == "spam")] if learned else [0, 0]), (label, distance)


def _base(path):
    from spamnb.storage.modelfile import load_snapshot

    stats = load_snapshot(path).stats
    return stats.get("save_id"), stats.get("journal")


def test_learn_fast_path_equals_the_click_command(compiled, tmp_path):
    fast, slow = _copy(compiled, "fast"), _copy(compiled, "slow")
    files = [sample_message("ham", i) for i in range(3)]
    assert all(f.read_bytes().startswith(b"From ") for f in files)  # saved with their envelope line
    _, code, err_fast = _run(["learn", "--spam", "--model", str(fast), *map(str, files)],
                             env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert code == 0 and _no_numpy(err_fast)
    err_fast = "".join(line + "\n" for line in err_fast.splitlines() if not line.startswith("import time:"))
    _, code, err_slow = _run(["learn", "--spam", "--strict", "--model", str(slow), *map(str, files)])  # click
    assert code == 0 and err_fast == err_slow == "learned 3 as spam, moved 0; already learned: 0\n"
    _same(load_model(fast), load_model(slow))
    _, code, err = _run(["forget", "--spam", "--model", str(fast), str(files[0])])
    assert (code, err) == (0, "forgot 1 spam message(s)\n")
    _, code, err = _run(["forget", "--spam", "--model", str(fast), str(files[0])])
    assert code == 1 and err == "spamnb: error: message was not learned, not as spam: nothing to forget\n"


def _no_numpy(stderr):
    """Whether a process run with PYTHONPROFILEIMPORTTIME imported none of the heavy modules."""
    imported = [line.split("|")[-1].strip() for line in stderr.splitlines() if line.startswith("import time:")]
    return bool(imported) and not any(m.split(".")[0] in ("numpy", "scipy", "joblib", "click") for m in imported)


def test_the_server_learns_filter_u_and_the_client_starts_no_numpy(serving, sock_path, compiled):
    reference = _copy(compiled, "reference")
    env = {"SPAMNB_SOCKET": sock_path, "PYTHONPROFILEIMPORTTIME": "1"}
    for raw in _messages():
        out, code, err = _run(["filter", "-u", "--model", str(compiled)], raw, env)
        assert _no_numpy(err)
        assert not [line for line in err.splitlines() if not line.startswith("import time:")]
        want = _run(["filter", "-u", "--model", str(reference)], raw)
        assert (out, code) == want[:2]
    _same(load_model(compiled), load_model(reference))


def test_the_server_follows_what_other_processes_learn(serving, sock_path, compiled):
    raw = sample_message("ham", 3).read_bytes()
    before = through_server(sock_path, compiled, raw)
    for i in range(3):  # appends by another process, each one seen at the next request
        _, code, _ = _run(["learn", "--spam", "--model", str(compiled), str(sample_message("ham", 3 + i))])
        assert code == 0
        assert through_server(sock_path, compiled, raw) == cold(compiled, raw)
    assert through_server(sock_path, compiled, raw) != before
    _, code, _ = _run(["compact", "--model", str(compiled)])  # a new snapshot: reloaded, same answer
    assert code == 0 and through_server(sock_path, compiled, raw) == cold(compiled, raw)


def test_compact_prune_and_info(compiled):
    for i in range(3):
        _run(["learn", "--spam", "--model", str(compiled), str(sample_message("ham", i))])
    out, code, err = _run(["info", "--model", str(compiled)])
    assert code == 0 and b"journal:     3 update(s)" in out and b"compacted:   never" in out
    _, code, err = _run(["compact", "--model", str(compiled)])
    assert (code, err) == (0, f"folded 3 journal update(s) into {compiled}\n")
    out, _, _ = _run(["info", "--model", str(compiled)])
    assert b"journal:     empty" in out and b"compacted:   never" not in out
    n = len(load_model(compiled).vocabulary)
    _, code, err = _run(["prune", "--model", str(compiled), "--max-tokens", "1000", "--dry-run"])
    assert (code, err) == (0, f"would drop {n - 1000} of {n} tokens\n")
    assert len(load_model(compiled).vocabulary) == n
    _, code, err = _run(["prune", "--model", str(compiled), "--limit", "2000"])
    assert code == 0 and len(load_model(compiled).vocabulary) == 2000
    assert load_model(compiled).stats["max_tokens"] == 2000
    out, _, _ = _run(["info", "--model", str(compiled)])
    assert b"(automatic limit 2000)" in out
    _, code, err = _run(["prune", "--model", str(compiled), "--limit", "lots"])
    assert code == 2 and "--limit must be a number of tokens or 'off'" in err


def test_a_journal_past_its_bound_is_folded_in(compiled, monkeypatch):
    """learn compacts in place; filter -u's cold path starts `spamnb compact` in the background."""
    from spamnb.storage.modelfile import learn_messages

    monkeypatch.setattr(journal, "MAX_BYTES", 1)
    raw = sample_message("ham", 5).read_bytes()
    learn_messages(compiled, [(raw, "spam")])
    assert journal.read(compiled, *_base(compiled)) is not None and not len(journal.read(compiled, *_base(compiled)))
    assert load_model(compiled).stats["compacted"]
    started = []
    monkeypatch.setattr(fastfilter, "compact_in_background", lambda path, allow=False: started.append(path))
    spam = sample_message("spam", 5).read_bytes()
    opts = fastfilter.parse_args(["-u", "--model", str(compiled), *learnable_cutoffs(load_model(compiled), spam)])
    fastfilter.cold(spam, str(compiled), False, opts)
    assert started == [str(compiled)]
    proc = subprocess.run(SPAMNB + ["compact", "--if-needed", "--quiet", "--model", str(compiled)],
                          capture_output=True, timeout=120)  # what the background process runs
    assert proc.returncode == 0 and proc.stderr == b""


def test_concurrent_filter_u_through_the_server_loses_nothing(serving, sock_path, compiled, tmp_path):
    """8 deliveries at a time, each learned by the server: every verdict learned once."""
    from concurrent.futures import ThreadPoolExecutor

    msgs = [sample_message(label, i).read_bytes() for label in ("ham", "spam") for i in range(20)]
    env = {"SPAMNB_SOCKET": sock_path}
    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda raw: _run(["filter", "-u", "--model", str(compiled)], raw, env)[1], msgs))
    learned = len(journal.read(compiled, *_base(compiled)))  # the verdicts within the margin, once each
    assert 0 < learned < sum(code != 2 for code in codes)
    model = load_model(compiled)
    from spamnb.mail.identity import message_key

    assert sum(model.known(message_key(raw), raw) is not None for raw in msgs) == learned


def test_a_message_file_is_read_no_further_than_its_limit_whatever_its_size_said():
    """The size is looked at first, but a file can grow after (a delivery still writing) or
    say 0 (/proc's): what is read stops one byte past the limit and the file is refused."""
    from spamnb.delivery.fastlearn import read_regular

    status = "/proc/self/status"  # a regular file of size 0 that holds about a kilobyte
    assert os.stat(status).st_size == 0 and len(read_regular(status, 1 << 20)) > 100
    assert read_regular(status, 100) is None
