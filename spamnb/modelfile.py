"""Model files: where they live, loading them safely, updating them under a lock.

A model file is one joblib file holding :meth:`SpamModel.to_state`'s dict.
Saving is atomic and writers are serialised (:mod:`spamnb.store`); loading
refuses foreign-writable files, because loading joblib runs pickle.

The default model
-----------------
A new user with no model still gets a working filter: when no ``--model`` is
given and ``$SPAMNB_MODEL`` / the XDG path holds no model, spamnb trains one on
the shipped SpamAssassin corpus (``corpora/spamassassin.tar.xz`` beside the
package, or ``$SPAMNB_CORPUS``) on first use and caches it in
``$XDG_CACHE_HOME/spamnb/default-model.joblib``. Output then says that the
default model is in use.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

from spamnb import store
from spamnb.store import ModelError

DEFAULT_NAME = "default"


def shipped_corpus() -> Path | None:
    """The shipped training corpus, or None when this install has none."""
    env = os.environ.get("SPAMNB_CORPUS")
    if env:
        return Path(env)
    path = Path(__file__).resolve().parent.parent / "corpora" / "spamassassin.tar.xz"
    return path if path.exists() else None


def default_cache_path(env=os.environ) -> Path:
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "spamnb" / "default-model.joblib"


def load_model(path, *, allow_insecure=False):
    """Load a :class:`SpamModel` from ``path``; ModelError with a clear message otherwise."""
    from spamnb.model import ModelFormatError, SpamModel

    state = store.load_checked(path, allow_insecure=allow_insecure)
    try:
        return SpamModel.from_state(state)
    except ModelFormatError as exc:
        raise ModelError(f"cannot use model {path}: {exc}") from None


def save_model(model, path) -> None:
    """Write ``model`` to ``path`` atomically (the folder is created if needed)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    store.save_atomic(model.to_state(), path)


def build_default_model(progress=None):
    """Train the default model on the shipped corpus."""
    from spamnb.model import SpamModel
    from spamnb.sources import iter_index

    corpus = shipped_corpus()
    if corpus is None or not corpus.exists():
        raise ModelError(
            "no model yet and no shipped corpus to build the default one from; "
            "train one with `spamnb train --ham DIR --spam DIR` (or set SPAMNB_CORPUS)"
        )
    model = SpamModel()
    messages = ((m.raw, m.label) for m in iter_index(str(corpus), on_error=lambda *_: None))
    if progress is not None:
        messages = progress(messages)
    model.learn(messages, registry=False)
    return model


def resolve(path, env=os.environ):
    """Which model a command uses: ``(path, is_default)``.

    An explicit ``--model`` path is used as it is. Otherwise ``$SPAMNB_MODEL`` or
    the XDG data path when a model is there, else the cached default model.
    """
    if path is not None:
        return Path(path), False
    user = Path(store.default_model_path(env))
    # An empty $SPAMNB_MODEL is unset (as store.default_model_path reads it).
    if user.exists() or env.get("SPAMNB_MODEL"):
        return user, False
    return default_cache_path(env), True


def open_model(path, *, allow_insecure=False, env=os.environ, notice=None):
    """Resolve and load the model a command should use: ``(model, path, is_default)``.

    The default model is built and cached when it does not exist yet;
    ``notice(text)`` is told so.
    """
    path, is_default = resolve(path, env)
    if is_default:
        if notice:
            notice(f"no model of yours yet: using the default model trained on the shipped corpus ({path})")
        if not path.exists():
            if notice:
                notice("building the default model (once)...")
            with store.model_lock(path):
                if not path.exists():
                    save_model(build_default_model(), path)
    return load_model(path, allow_insecure=allow_insecure), path, is_default


@contextmanager
def updating(path, *, allow_insecure=False, create=None):
    """Read-modify-write a model file under its exclusive lock.

    Yields the loaded model (or ``create()``'s when the file does not exist);
    the model is saved atomically when the block ends without an exception, so
    an error inside the block leaves the file as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with store.model_lock(path):
        if path.exists():
            model = load_model(path, allow_insecure=allow_insecure)
        elif create is not None:
            model = create()
        else:
            raise ModelError(f"no model at {path}; train one with `spamnb train`")
        yield model
        save_model(model, path)
