"""spamnb.verdict: the one source of every delivery decision, checked against textbook numbers."""

from __future__ import annotations

import email
import email.policy
import math
import subprocess
import sys
from fractions import Fraction as F

import pytest

from spamnb import verdict
from spamnb._version import __version__
from spamnb.delivery.hook import add_headers
from spamnb.nb.decision import Cutoffs, bayes_decision, spam_loss_matrix
from spamnb.verdict import DecisionError, cutoffs_from, cutoffs_from_costs, header_lines, label_for


def test_exit_codes_are_bogofilters():
    assert verdict.EXIT_CODES == {"spam": 0, "ham": 1, "unsure": 2}
    assert verdict.EXIT_ERROR == 3


def test_default_costs_give_the_documented_cutoffs():
    # C_fp = 10, C_fn = 1, C_u = 0.5: ham if p <= C_u/C_fn = 0.5, spam if p > 1 - C_u/C_fp = 0.95
    assert cutoffs_from_costs(*verdict.DEFAULT_COSTS) == (0.5, 0.95)
    assert cutoffs_from((0.2, 0.9)) == (0.2, 0.9)  # nothing given: the model's


def test_cutoffs_from_costs_by_hand():
    assert cutoffs_from_costs(F(10), F(1)) == (F(10, 11), F(10, 11))  # two actions: C_fp/(C_fp+C_fn)
    assert cutoffs_from_costs(F(10), F(1), F(1, 2)) == (F(1, 2), F(19, 20))
    # an unsure band needs C_u < C_fp·C_fn/(C_fp+C_fn) = 10/11; C_u = 1 has none
    assert cutoffs_from_costs(F(10), F(1), F(1)) == (F(10, 11), F(10, 11))
    assert cutoffs_from_costs(3.0, 1.0, 0.25) == (0.25, 1 - 0.25 / 3)


@pytest.mark.parametrize("costs", [(10.0, 1.0, 0.5), (1.0, 1.0, 0.1), (5.0, 2.0, None), (10.0, 1.0, 2.0)])
def test_the_cutoffs_are_the_minimum_risk_decision(costs):
    """label_for(p, cutoffs_from_costs(...)) is argmin_i R(a_i|x) of the loss matrix, for every p."""
    ps = [i / 400 for i in range(401)]
    actions = bayes_decision([[1 - p, p] for p in ps], spam_loss_matrix(*costs))
    cut = cutoffs_from_costs(*costs)
    for p, a in zip(ps, actions):
        # on a cut-off both actions have the same risk; the rule breaks ties towards ham
        risks_tie = any(math.isclose(p, c) for c in cut)
        assert risks_tie or label_for(p, cut) == verdict.ACTIONS[a], (p, cut)


def test_explicit_cutoffs_and_one_cutoff_given():
    model = (0.5, 0.95)
    assert cutoffs_from(model, spam_cutoff=0.7, ham_cutoff=0.2) == (0.2, 0.7)
    assert cutoffs_from(model, spam_cutoff=0.3) == (0.3, 0.3)  # the model's ham cut-off moves down to it
    assert cutoffs_from(model, ham_cutoff=0.99) == (0.99, 0.99)  # the spam cut-off moves up to it
    assert cutoffs_from(model, cost_fp=1.0) == (0.5, 0.5)  # C_fn defaults to 1: threshold 1/2


@pytest.mark.parametrize("kwargs, message", [
    ({"cost_fp": 1.0, "spam_cutoff": 0.5}, "either costs or cut-offs"),
    ({"cost_fp": -1.0}, "positive and finite"),
    ({"cost_fn": 0.0}, "positive and finite"),
    ({"cost_unsure": float("nan")}, "positive and finite"),
    ({"cost_fp": float("inf")}, "positive and finite"),
    ({"spam_cutoff": 0.2, "ham_cutoff": 0.3}, "ham_cutoff <= spam_cutoff"),
    ({"spam_cutoff": 1.5}, "<= 1"),
    ({"ham_cutoff": float("nan")}, "<= 1"),
])
def test_bad_decisions_are_plain_errors(kwargs, message):
    with pytest.raises(DecisionError, match=message):
        cutoffs_from((0.5, 0.95), **kwargs)


def test_label_for_boundaries():
    cut = (0.5, 0.95)
    assert [label_for(p, cut) for p in (0.0, 0.5, 0.50001, 0.95, 0.950001, 1.0)] == [
        "ham", "ham", "unsure", "unsure", "spam", "spam"]
    assert label_for(1.0, (0.5, 1.0)) == "unsure"  # p > 1 never happens: nothing is spam
    with pytest.raises(DecisionError):
        label_for(float("nan"), cut)


def test_the_library_cutoffs_use_the_same_rule():
    c = Cutoffs.from_costs(10, 1, F(1, 2))
    assert (c.ham_cutoff, c.spam_cutoff) == (F(1, 2), F(19, 20))  # exact with rational costs
    assert tuple(c) == cutoffs_from_costs(F(10), F(1), F(1, 2))
    assert [c.label(p) for p in (0.5, 0.7, 0.96)] == ["ham", "unsure", "spam"]


def test_model_name_and_notice():
    assert verdict.model_name("/x/y/model.joblib", False) == "model.joblib"
    assert verdict.model_name("/x/cache/default-model.joblib", True) == "default"
    assert "default model" in verdict.default_model_notice("/p")


def test_verdict_imports_only_cheap_modules():
    """The cold path imports verdict before it asks the server: no numpy, json, re."""
    code = ("import sys; before = set(sys.modules); import spamnb.verdict; "
            "print(' '.join(sorted(set(sys.modules) - before)))")
    new = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True).stdout.split())
    assert not new & {"numpy", "json", "re", "click", "joblib", "scipy"}, new

T = verdict.threshold(0.95)  # log 19, the default spam cut-off as log-odds


def test_header_lines_exact_text():
    """SpamAssassin's form: the flag on spam only, Yes/No, score= and required= (the
    form spamass-milter's ``%*s score=%d`` reads), tests= spamnb's verdict."""
    v = __version__.encode()
    assert header_lines("spam", 0.999874, 9.0, "model.joblib", required=T) == [
        b"X-Spam-Flag: YES",
        b"X-Spam-Status: Yes, score=9.00 required=2.94 tests=SPAMNB_SPAM probability=0.999874"
        b" model=model.joblib version=" + v,
    ]
    assert header_lines("ham", 0.0000004, -14.7312, "default", required=T) == [
        b"X-Spam-Status: No, score=-14.73 required=2.94 tests=SPAMNB_HAM probability=0.000000"
        b" model=default version=" + v,
    ]
    assert header_lines("unsure", 0.5, 0.0, "m", required=T) == [
        b"X-Spam-Status: No, score=0.00 required=2.94 tests=SPAMNB_UNSURE probability=0.500000"
        b" model=m version=" + v,
    ]
    # an infinite score (a learned prior of an empty class) is written as a number
    assert b"score=-999.90 required=36.74 " in header_lines("ham", 0.0, -math.inf, "m", required=verdict.threshold(1.0))[0]


def test_threshold_is_the_spam_cutoff_as_log_odds():
    assert T == pytest.approx(math.log(19))
    assert verdict.threshold(0.5) == 0.0 and math.isfinite(verdict.threshold(0.0))


def test_header_lines_model_name_is_header_safe():
    # A comma or a space would end the field's "model=" item; non-ASCII and newlines cannot go in a header.
    lines = header_lines("ham", 0.1, -2.2, "my, modèl\n.joblib", required=T)
    status = lines[0]
    assert status.isascii() and b"\n" not in status
    assert b"model=my\\u002c\\u0020mod\\u00e8l\\n.joblib version=" in status


@pytest.mark.parametrize("label", ["spam", "ham", "unsure"])
def test_is_verdict_block_takes_exactly_the_lines_of_the_label(label):
    lines = header_lines(label, 0.5, 1.0, "m", [("a", 1.0)] * 30, required=T)
    for eol in (b"\n", b"\r\n"):
        block = b"".join(line + eol for line in lines)
        assert verdict.is_verdict_block(block, label) and verdict.is_verdict_block(eol + block, label)
        others = [other for other in ("spam", "ham", "unsure") if other != label]
        assert not any(verdict.is_verdict_block(block, other) for other in others)
    ham = b"".join(line + b"\n" for line in header_lines("ham", 0.1, -3.0, "m", required=T))
    assert not verdict.is_verdict_block(b"X-Spam-Flag: YES\n" + ham, "ham")  # a flag on ham
    assert not verdict.is_verdict_block(ham + b"X-Other: 1\n", "ham")


def test_evidence_header_items_and_signs():
    lines = header_lines("spam", 0.9, 2.2, "m", [("url:example.biz", 2.314), ("subject:free", 1.87),
                                                        ("from:friend", -0.5)], required=T)
    assert lines[2] == b"X-Spam-Evidence: url:example.biz:+2.31, subject:free:+1.87, from:friend:-0.50"


def test_long_evidence_is_folded_under_the_line_limit():
    evidence = [(f"url:some-long-domain-name-{i}.example", 1.0 + i / 100) for i in range(60)]
    lines = header_lines("spam", 0.9, 2.2, "m", evidence, required=T)
    ev = lines[2:]
    assert ev[0].startswith(b"X-Spam-Evidence: ") and len(ev) > 1
    assert all(line.startswith(b"\t") for line in ev[1:])  # continuation lines
    assert max(len(line) for line in ev) <= verdict.FOLD_WIDTH
    unfolded = b" ".join(line.lstrip(b"\t") for line in ev)
    assert unfolded == b"X-Spam-Evidence: " + ", ".join(
        f"{tok}:{c:+.2f}" for tok, c in evidence).encode()
    # and the folded field survives insertion and parsing as one header
    msg = email.message_from_bytes(add_headers(b"Subject: s\n\nb\n", lines), policy=email.policy.default)
    assert str(msg["X-Spam-Evidence"]).count(":+") == 60


