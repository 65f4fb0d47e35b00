"""``spamnb explain``: both sides of a score, and the word lookup (``--word``, as bogofilter's
``bogoutil -w``); the readable names of tokens the page and the lookup show."""

from __future__ import annotations

import math
import re

import pytest

from spamnb.mail.tokennames import describe, lookups
from spamnb.web.pages import leaning
from test_cli import run, spam_msg  # noqa: F401 (spam_msg: a fixture)


def parse(out):
    """``(prior, {side: (sum, count, [contributions shown])}, score)`` of explain's lines."""
    lines = out.splitlines()
    prior = float(lines[1].split()[0])
    sides, current = {}, None
    for line in lines[2:-2]:
        if "-ward:" in line:
            value, name, rest = line.split(None, 2)
            count = 0 if rest.startswith("no token") else int(rest.split()[0])
            current = sides[name.rstrip(":")] = (float(value), count, [])
        else:
            current[2].append(float(line.split()[0]))
    return prior, sides, float(lines[-2].split()[0])


def test_explain_shows_both_sides_and_they_add_up_to_the_score(trained_model, trained_model_file, spam_msg):
    raw = spam_msg.read_bytes()
    ev = trained_model.explain(raw, 10 ** 6)
    spamward = [c for _, _, c in ev.tokens if c > 0]
    hamward = [c for _, _, c in ev.tokens if c < 0]
    assert spamward and hamward  # a real message pushes both ways
    prior, sides, score = parse(run(["explain", spam_msg, "--model", trained_model_file, "-c", "3"]).stdout)
    assert sides["spam-ward"][:2] == (pytest.approx(sum(spamward), abs=5e-4), len(spamward))
    assert sides["ham-ward"][:2] == (pytest.approx(sum(hamward), abs=5e-4), len(hamward))
    assert len(sides["spam-ward"][2]) == 3 and len(sides["ham-ward"][2]) == 3  # the strongest of each side
    assert sides["spam-ward"][2] == pytest.approx(sorted(spamward, reverse=True)[:3], abs=5e-4)
    assert sides["ham-ward"][2] == pytest.approx(sorted(hamward)[:3], abs=5e-4)
    assert prior + sides["spam-ward"][0] + sides["ham-ward"][0] == pytest.approx(score, abs=2e-3)
    assert score == pytest.approx(trained_model.classify(raw).score, abs=5e-4)


ROW = re.compile(r"^ *([\d.]+) +([\d.]+) +(\d+)(?:, all (ham|spam))? +([+-][\d.]+) +([\d.]+)  (\S+)  \(")


def test_word_lookup_prints_what_the_model_knows(trained_model, trained_model_file):
    """Each token once (the plain word's namespaces hold subject:free, named again), its weights,
    the messages holding it (and the class, where one alone does), under a header naming the
    columns, as bogoutil -w gives message counts."""
    out = run(["explain", "--model", trained_model_file, "--word", "Free", "-w", "subject:free",
               "-w", "zzqqxxnever"]).stdout
    lines = out.splitlines()
    assert lines[0].startswith("messages: how many learned messages hold the token (150 ham and 150 spam")
    assert lines[1].startswith("ham weight, spam weight: ") and "features presence-l2" in lines[1]
    assert lines[3].split()[:5] == ["ham", "weight", "spam", "weight", "messages"]
    found = [ROW.match(line) for line in lines[4:] if "not in the model" not in line]
    assert all(found) and len(found) == len(lines) - 5, out
    rows = {m.group(7): m.groups() for m in found}
    assert len(rows) == len(found)  # subject:free, a namespace of Free and asked for again, once
    voc = trained_model.vocabulary
    fc = trained_model.estimator.feature_count_
    assert "free" in rows and "subject:free" in rows  # the plain word in its namespaces, folded
    assert all(tok == "free" or tok.endswith(":free") for tok in rows)
    bias, weights = trained_model.linear_weights()
    for tok, (ham, spam, messages, only, logodds, p, _) in rows.items():
        i = voc.index(tok)
        assert (float(ham), float(spam)) == (pytest.approx(fc[0, i], abs=5e-4), pytest.approx(fc[1, i], abs=5e-4))
        assert int(messages) == trained_model.doc_freq[i]
        assert only == ("spam" if fc[0, i] == 0 else "ham" if fc[1, i] == 0 else None)
        assert float(logodds) == pytest.approx(weights[i], abs=5e-4)
        assert float(p) == pytest.approx(1 / (1 + math.exp(-weights[i])), abs=5e-5)
    assert "zzqqxxnever: not in the model" in out
    assert "(the word “free”)" in out and "(“free” in the Subject header)" in out


def test_word_lookup_names_the_class_of_a_token_one_class_alone_holds():
    """The model keeps one count of messages for both classes; a token only spam (or only ham)
    holds has them all in that class, however many weights refine added."""
    from spamnb.model import SpamModel

    model = SpamModel()
    model.learn([(b"Subject: hi\n\ncheap pills\n", "spam"), (b"Subject: re\n\ncheap pills now\n", "spam"),
                 (b"Subject: lunch\n\ncheap lunch\n", "ham")])
    rows = {r["token"]: r for r in model.lookup("pills") + model.lookup("cheap") + model.lookup("lunch")}
    assert (rows["pills"]["messages"], rows["pills"]["by_class"]) == (2, (0, 2))
    assert (rows["lunch"]["messages"], rows["lunch"]["by_class"]) == (1, (1, 0))
    assert (rows["cheap"]["messages"], rows["cheap"]["by_class"]) == (3, None)


def test_word_lookup_and_a_message_are_one_or_the_other(trained_model_file, spam_msg):
    assert "not both" in run(["explain", spam_msg, "--model", trained_model_file, "-w", "free"], code=2).output
    assert "--word" in run(["explain", "--model", trained_model_file], code=2).output


@pytest.mark.parametrize("token, words", [
    ("date:shape:a,_9_a_9_9:9:9_+9", "Date header's shape “a,_9_a_9_9:9:9_+9”"),
    ("message-id:shape:9.a9", "Message-ID header's shape “9.a9”"),
    ("subject:free", "“free” in the Subject header"),
    ("from:addr:a@b.org", "From address “a@b.org”"),
    ("reply-to:name:none", "Reply-To without a display name"),
    ("to:count:4", "addresses in To: 4"),
    ("header:X-Mailer", "a header X-Mailer"),
    ("skip:c 20", "a long word (20 or more characters) starting “c”"),
    ("url:path:buy", "a link's path holding “buy”"),
    ("html:tag:form", "an HTML <form> tag"),
    ("free", "the word “free”"),
    ("10:30", "the word “10:30”"),
    ("zq<x\"'", "the word “zq<x\"'”"),
])
def test_a_token_in_words(token, words):
    assert describe(token) == words


def test_a_plain_word_is_looked_up_in_its_namespaces():
    known = ["free", "subject:free", "url:path:free", "freedom", "x-mailer:afree", "header:Free"]
    assert lookups("FREE", known) == ["free", "subject:free", "url:path:free"]
    assert lookups("header:Free", known) == ["header:Free"]
    assert lookups("Free") == ["free", "subject:free"]


def test_a_clue_shows_the_probability_it_pushes_towards():
    assert leaning(math.log(9)) == "90% spam" and leaning(-math.log(9)) == "90% ham"
    assert leaning(50) == ">99% spam" and leaning(-1e9) == ">99% ham"


def test_word_lookup_in_a_hashed_model_knows_only_columns_learned_messages_hold():
    """A hashed vocabulary has a column for every token: a word no learned message held is
    not in the model, not a row of zero counts."""
    from spamnb.model import SpamModel

    model = SpamModel(hash_features=1 << 20)
    model.learn([(b"Subject: hi\n\nhello cheap pills\n", "spam"), (b"Subject: lunch\n\nmeeting at noon\n", "ham")])
    assert model.lookup("zzqqxxneverseen") == []
    rows = model.lookup("pills")
    assert [r["token"] for r in rows] == ["pills"] and rows[0]["spam"] > 0 and rows[0]["messages"] == 1
