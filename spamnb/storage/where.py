"""Which backend a command uses: ``--store URL`` (or ``$SPAMNB_STORE``) names a
store (:mod:`spamnb.storage.redisstore`), else the model file of ``--model`` and
the usual search (:mod:`spamnb.storage.locate`, :mod:`spamnb.storage.filestore`)."""

from __future__ import annotations

import os

from spamnb.options import BY_KEY
from spamnb.storage.backend import Backend
from spamnb.storage.store import ModelError

STORE_ENV = BY_KEY[("store", "url")].env  # $SPAMNB_STORE: the store row's variable


def store_url(store=None, env=os.environ, model_path=None):
    """The store URL of ``--store``, else of ``$SPAMNB_STORE`` (an empty one is unset)
    unless an explicit ``--model`` names a file, else None: where the model is is one
    choice (:data:`spamnb.options.LOCATION`), whose layers
    :func:`spamnb.storage.settings.resolve` has already ordered."""
    from spamnb import options

    try:
        options.exclusive({"model_path": model_path, "store": store})
    except ValueError as exc:
        raise ModelError(str(exc)) from None
    return store or (env.get(STORE_ENV) if model_path is None else None) or None


def open_backend(model_path=None, store=None, *, allow_insecure=False, env=os.environ, notice=None,
                 build_default=True) -> Backend:
    """The backend a command uses: the store of ``--store``/``$SPAMNB_STORE`` when
    one is named, else the model file (``--model``, ``$SPAMNB_MODEL``, the XDG path,
    else the cached default model, built first when ``build_default`` and missing:
    ``notice(text)`` is told)."""
    url = store_url(store, env, model_path)
    if url is not None:
        from spamnb.storage.redisstore import RedisBackend

        return RedisBackend.from_url(url)
    from spamnb.storage import modelfile
    from spamnb.storage.filestore import FileBackend

    if build_default:
        path, is_default = modelfile.prepare_model(model_path, env=env, notice=notice)
    else:
        path, is_default = modelfile.resolve(model_path, env)
    return FileBackend(path, allow_insecure=allow_insecure, is_default=is_default)


def own_backend(model_path=None, store=None, *, allow_insecure=False, env=os.environ) -> Backend:
    """Where a command that writes the user's model writes (``train``, a first
    ``learn``): the store, else ``--model``/``$SPAMNB_MODEL``/the XDG path, never
    the default model's cache."""
    url = store_url(store, env, model_path)
    if url is not None:
        return open_backend(None, url, env=env)
    from spamnb.storage import modelfile
    from spamnb.storage.filestore import FileBackend

    return FileBackend(modelfile.own_model_path(model_path, env), allow_insecure=allow_insecure)
