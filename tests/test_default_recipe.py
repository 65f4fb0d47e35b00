"""The default model's recipe number follows what it is made of.

A cached default model keeps tokenizing as it was trained, so a release that changes
the shipped corpus or a fresh model's settings must give the cache a new name
(:data:`spamnb.storage.locate.DEFAULT_RECIPE`), or users who upgrade keep the old
model. This keeps each recipe's digest (tests/golden/default_recipe.json) and fails
when the digest changes while the number does not.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from spamnb.mail.tokenizer import ADDED_FIELDS
from spamnb.model import SpamModel
from spamnb.storage import locate, modelfile

GOLDEN = Path(__file__).parent / "golden" / "default_recipe.json"
SETTINGS = ("format_version", "model_type", "alpha", "refine", "prior", "features", "hash_features",
            "tokenizer", "cutoffs")


SHIPPED = Path(modelfile.__file__).resolve().parents[1] / "data" / "spamassassin.tar.xz"


def tokenizer_settings(d):
    """A tokenizer's settings without those a model file that lacks them reads the same
    (a setting added later, at its "as before" value): adding a setting that is off by
    default changes no model, so it must not make every user rebuild theirs."""
    return {k: v for k, v in d.items() if k not in ADDED_FIELDS or v != ADDED_FIELDS[k]}


def digest():
    """sha256 of the shipped corpus's bytes and a fresh model's settings."""
    state = SpamModel().to_state()
    state["tokenizer"] = tokenizer_settings(state["tokenizer"])
    h = hashlib.sha256(SHIPPED.read_bytes())
    h.update(json.dumps({k: state[k] for k in SETTINGS}, sort_keys=True, default=list).encode())
    return h.hexdigest()


def test_a_setting_added_at_its_as_before_value_keeps_the_recipe():
    d = SpamModel().to_state()["tokenizer"]
    assert "style_signals" in d and "style_signals" not in tokenizer_settings(d)  # added, off
    assert tokenizer_settings(d)["layout_signals"] is True  # added, and on: part of the recipe
    assert "min_word_len" in tokenizer_settings(d)  # a setting every model file has


def test_the_recipe_number_changes_with_the_corpus_or_the_defaults():
    known = json.loads(GOLDEN.read_text())
    now = digest()
    assert known.get(str(locate.DEFAULT_RECIPE)) == now, (
        f"the default model's corpus or settings changed: take the next DEFAULT_RECIPE in "
        f"spamnb/storage/locate.py and add \"{locate.DEFAULT_RECIPE + 1}\": \"{now}\" to {GOLDEN.name}"
        if now not in known.values() else "DEFAULT_RECIPE names another recipe's digest")
    assert len(set(known.values())) == len(known)  # one number per recipe


def test_building_a_new_recipe_removes_the_older_cached_ones(tmp_path, monkeypatch):
    """The older recipes' models and scorers go; their history becomes the new one's
    (a first-day user's verdicts stay on their page); lock files, a newer recipe's
    model (another release sharing the cache) and anything else stay."""
    cache = tmp_path / "spamnb"
    cache.mkdir()
    newer = f"default-model-{locate.DEFAULT_RECIPE + 1}.joblib"
    for name in ("default-model.joblib", "default-model.joblib.scorer", "default-model.joblib.lock",
                 "default-model.joblib.history.sqlite", newer, "model.joblib"):
        (cache / name).write_bytes(name.encode())
    monkeypatch.setenv("SPAMNB_CORPUS", str(SHIPPED))
    monkeypatch.setattr(modelfile, "build_default_model", SpamModel)  # an empty model: the build is not tested here
    path = modelfile.cache_default(cache / f"default-model-{locate.DEFAULT_RECIPE}.joblib")
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [path.name, path.name + ".lock", path.name + ".scorer", path.name + ".history.sqlite",
         "default-model.joblib.lock", newer, "model.joblib"])
    assert (cache / (path.name + ".history.sqlite")).read_bytes() == b"default-model.joblib.history.sqlite"
