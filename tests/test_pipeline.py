"""The one pipeline: every door filters through filter_one, learns through learn, and
fails through boundary; the decision travels as one value.

The behaviour of each door is held by its own tests (test_fastpath, test_server,
test_spamd, test_imap, test_web...); here: the pipeline's own contract, and that no
door decides, learns or fails its own way again (a structural check, as test_layers').
"""

from __future__ import annotations

import ast
import io
import re
from pathlib import Path

import pytest

from conftest import sample_message
from spamnb.delivery import events, pipeline, wire
from spamnb.verdict import DECISION_OPTIONS, MODELS_OWN, Decision, DecisionError

PACKAGE = Path(__file__).resolve().parent.parent / "spamnb"


# -- the decision, one value -------------------------------------------------------------


def test_a_decision_is_one_value_by_the_options_names():
    d = Decision(spam_cutoff=0.9, ham_cutoff=0.2)
    assert d == Decision.of({"spam_cutoff": 0.9, "ham_cutoff": 0.2, "learn_": True})  # other names left alone
    assert d.given() == {"spam_cutoff": 0.9, "ham_cutoff": 0.2} and bool(d) and not MODELS_OWN
    assert d.cutoffs((0.5, 0.95)) == (0.2, 0.9)
    assert MODELS_OWN.cutoffs((0.4, 0.97)) == (0.4, 0.97)  # none given: the model's own
    assert len(Decision().values) == len(DECISION_OPTIONS)
    assert "spam_cutoff=0.9" in d.shown() and MODELS_OWN.shown() == "the model's cut-offs"
    with pytest.raises(DecisionError):
        Decision(cost_fp=10.0, spam_cutoff=0.9).check()  # costs and cut-offs: no decision
    with pytest.raises(TypeError):
        Decision(cost_of_coffee=1.0)


def test_the_decision_crosses_the_wire_whole():
    import socket

    d = Decision(cost_fp=20.0, cost_fn=1.0, **{DECISION_OPTIONS[2]: 0.4})
    a, b = socket.socketpair()
    try:
        wire.send_all(a, wire.encode_request("/m/model.joblib", "model.joblib", d, b"Subject: x\n\nhi\n"))
        header, n = wire.read_request_head(b, 1 << 20)
        assert header["decision"] == d and n == len(b"Subject: x\n\nhi\n")
    finally:
        a.close()
        b.close()


def test_at_most_four_files_name_a_decision_option():
    """A new decision option is its row, its part of the math, its test: the rest of the
    package carries the decision whole and never names the option (the unsure cost, whose
    name no model attribute shares, stands for them all)."""
    files = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if "cost_unsure" in p.read_text())
    assert len(files) <= 4 and set(files) <= {"verdict.py", "options.py", "nb/decision.py"}, files


# -- one function filters, one learns, one boundary ---------------------------------------


def _calls(path: Path) -> set[str]:
    """The names a module calls: ``f`` for ``f(...)``, ``mod.f`` for ``mod.f(...)``."""
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute):
                out.add(f"{getattr(f.value, 'id', '')}.{f.attr}")
            else:
                out.add(getattr(f, "id", ""))
    return out


def test_only_the_pipeline_decides_and_every_door_filters_through_it():
    """``decide``/``judge`` are called by the pipeline (and the hook that
    serves it) alone; each door calls ``filter_one``."""
    deciders = {"decide", "hook.decide", "judge", "verdict.judge"}
    for path in PACKAGE.rglob("*.py"):
        rel = str(path.relative_to(PACKAGE))
        if rel in ("delivery/pipeline.py", "delivery/hook.py", "verdict.py"):
            continue
        assert not (_calls(path) & deciders), rel
    doors = ["delivery/fastfilter.py", "delivery/server.py", "cli/imap.py", "web/data.py", "delivery/usermodels.py"]
    assert all("pipeline.filter_one" in _calls(PACKAGE / d) for d in doors), doors
    # spamd and the milter filter through the users' models (Models.filter), which calls it
    for door in ("delivery/spamd_protocol.py", "delivery/milter.py"):
        assert re.search(r"\bmodels\.filter\(", (PACKAGE / door).read_text()), door


def test_every_door_that_learns_what_a_user_sorted_learns_through_the_pipeline():
    """No door hands messages to a store's ``learn`` itself: ``pipeline.learn`` (or a
    source's ``learn``, for filter -u) does, and records them."""
    store_learn = re.compile(r"\b(backend|mine|served|store|self\.backend)\.learn\(|\blearn_messages\(")
    for path in PACKAGE.rglob("*.py"):
        rel = str(path.relative_to(PACKAGE))
        if rel.startswith(("storage/", "nb/")) or rel in ("delivery/pipeline.py", "model.py"):
            continue
        assert not store_learn.search(path.read_text()), rel


class _Lines:
    def __init__(self):
        self.out = io.StringIO()
        self.rec = events.Recorder(fmt="text", write=lambda line: self.out.write(line + "\n"))


def test_the_boundary_writes_one_line_and_answers_as_the_door_does():
    lines = _Lines()
    with pipeline.boundary("milter", lambda reason, exc: ("accept", reason), recorder=lines.rec,
                           facts={"raw": b"Message-ID: <a@b>\n\nx\n", "user": "u"}) as b:
        raise OSError(28, "No space left on device")
    assert b.result[0] == "accept" and "No space left on device" in b.result[1]
    line = lines.out.getvalue()
    assert line.count("\n") == 1 and "event=error" in line and "via=milter" in line and "mail=unscanned" in line
    assert "mid=<a@b>" in line and "user=u" in line
    with pipeline.boundary("x", lambda reason, exc: 1) as b:
        pass
    assert b.result is None  # nothing failed: nothing said


def test_filter_one_decides_places_the_headers_and_records_once(trained_model):
    raw = sample_message("spam").read_bytes()
    lines = _Lines()
    out = pipeline.filter_one(raw, pipeline.ModelSource(trained_model, "m"), via="socket",
                              decision=Decision(spam_cutoff=0.5, ham_cutoff=0.5), recorder=lines.rec, user="u")
    assert out.label in ("spam", "ham", "unsure") and out.decided.cutoffs == (0.5, 0.5)
    assert out.message() == out.kept[:out.pos] + out.block + out.kept[out.pos:]
    assert b"X-Spam-Status: " in out.block and b"model=m " in out.block
    assert lines.out.getvalue().count("event=message") == 1
    bare = pipeline.filter_one(raw, pipeline.ModelSource(trained_model, "m"), via="web", headers=False)
    assert bare.block == b"" and bare.message() == raw and bare.decided.lines is None


class _Store:
    """A store whose learn says what it did to each message (``outcomes``, in order)."""

    def __init__(self, *outcomes):
        self.outcomes = list(outcomes)
        self.calls = []

    def learn(self, items, *, forget=False, **kw):
        from spamnb.mail.identity import tally

        self.calls.append((items, forget))
        return tally(self.outcomes)


def _mail(n):
    return f"Message-ID: <{n}@example.org>\nSubject: {n}\n\nbody {n}\n".encode()


def test_learn_records_only_the_messages_that_changed_the_model():
    """A batch where one message was learned and others were learned so already (or given
    twice) records the one: a correction is marked only where the model learned one."""
    lines = _Lines()
    store = _Store("already", "learned", "duplicate", "moved")
    done = pipeline.learn(store, [(_mail(i), "spam") for i in range(4)], via="tell", recorder=lines.rec, user="u")
    assert (done["learned"], done["unchanged"], done["duplicates"], done["moved"]) == (1, 1, 1, 1)
    out = lines.out.getvalue()
    assert out.count("event=learn") == 2 and "<1@example.org>" in out and "<3@example.org>" in out
    assert "<0@example.org>" not in out and "<2@example.org>" not in out
    assert "was=ham" in out.splitlines()[1] and "was=" not in out.splitlines()[0]  # the move says what it was
    for outcomes, want in ((("already",), 0), (("forgotten", "duplicate"), 1)):
        lines = _Lines()
        pipeline.learn(_Store(*outcomes), [(_mail(i), "spam") for i in range(len(outcomes))], via="tell",
                       forget=outcomes[0] == "forgotten", recorder=lines.rec)
        assert lines.out.getvalue().count("event=learn" if outcomes == ("already",) else "event=forget") == want


def test_a_record_that_fails_never_costs_the_verdict(trained_model, capsys):
    """A log line or history row that cannot be written (stderr gone, a disk full) is a
    warning: the message keeps the verdict it was given (and what it learned), so no door
    filters it a second time."""
    class Broken:
        def message(self, *args, **kwargs):
            raise OSError(28, "No space left on device")

    raw = sample_message("spam").read_bytes()
    out = pipeline.filter_one(raw, pipeline.ModelSource(trained_model, "m"), via="filter", recorder=Broken())
    assert out.label == "spam" and b"X-Spam-Status: Yes" in out.message()
    assert "warning: the verdict was not recorded: [Errno 28] No space left on device" in capsys.readouterr().err
