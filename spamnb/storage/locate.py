"""Where models, their verdict histories and the filter server's socket live: paths only, ``os`` only.

Both filter paths resolve the model here, so they can never disagree about
which model a delivery uses: the full click path (through
:func:`spamnb.storage.modelfile.resolve`) and the fast path (:mod:`spamnb.delivery.fastfilter`),
which must not import joblib, numpy or even :mod:`pathlib` to stay quick.

Resolution order (the same everywhere):

1. an explicit ``--model PATH``, as given;
2. ``$SPAMNB_MODEL`` when set and non-empty (even if nothing is there yet:
   the command then says there is no model);
3. ``$XDG_DATA_HOME/spamnb/model.joblib`` (``~/.local/share/...`` when
   ``XDG_DATA_HOME`` is unset or relative) when a model is there;
4. else the cached default model ``$XDG_CACHE_HOME/spamnb/default-model-N.joblib``
   (N: :data:`DEFAULT_RECIPE`).

Which history a command records its verdicts in and marks its corrections in is
decided here too, by :func:`history_path`, for every command and both ways of
filtering and learning.
"""

import os

__all__ = ["DEFAULT_RECIPE", "default_model_path", "default_cache_path", "resolve_model", "history_path",
           "default_socket_path"]

#: The default model's recipe: the shipped corpus and a fresh model's settings
#: (the tokenizer's included). A change of either takes the next number, so that an
#: upgrade builds the new default model rather than using the one cached before it
#: (a cached model keeps tokenizing as it was trained, so it would never change).
#: tests/test_default_recipe.py keeps each number's digest and fails until it is taken.
#: 1: default-model.joblib, before layout and exclamation tokens; 2: with them.
#: A tokenizer setting added later and left at its "as before" value (``ADDED_FIELDS``
#: in spamnb/mail/tokenizer.py; style_signals, off, is one) changes no token, so the
#: digest leaves it out and adding one keeps the number.
DEFAULT_RECIPE = 2


_XDG = {"data": ("XDG_DATA_HOME", (".local", "share")), "cache": ("XDG_CACHE_HOME", (".cache",)),
        "config": ("XDG_CONFIG_HOME", (".config",))}


def xdg_home(kind, env=os.environ) -> str:
    """spamnb's folder of an XDG ``kind`` (data, cache, config): ``$XDG_DATA_HOME/spamnb``
    when that variable is an absolute path (the XDG spec says to ignore relative ones),
    else ``~/.local/share/spamnb`` (``~`` from ``$HOME`` in ``env``). The one place of
    the XDG fallbacks."""
    var, default = _XDG[kind]
    base = env.get(var)
    if not base or not os.path.isabs(base):
        base = os.path.join(env.get("HOME") or os.path.expanduser("~"), *default)
    return os.path.join(base, "spamnb")


def default_model_path(env=os.environ) -> str:
    """The user's model: ``$SPAMNB_MODEL`` if set and non-empty; else
    ``$XDG_DATA_HOME/spamnb/model.joblib`` if ``XDG_DATA_HOME`` is an absolute
    path (the XDG spec says to ignore relative ones); else
    ``~/.local/share/spamnb/model.joblib`` (``~`` from ``$HOME`` in `env`).
    """
    explicit = env.get("SPAMNB_MODEL")
    if explicit:
        return os.path.expanduser(explicit)
    return os.path.join(xdg_home("data", env), "model.joblib")


def default_cache_path(env=os.environ) -> str:
    """The cached default model (trained on the shipped corpus on first use)."""
    return os.path.join(xdg_home("cache", env), f"default-model-{DEFAULT_RECIPE}.joblib")


def imap_config_path(env=os.environ) -> str:
    """``spamnb imap``'s settings: ``$XDG_CONFIG_HOME/spamnb/imap.toml`` (``~/.config/...``
    when ``XDG_CONFIG_HOME`` is unset or relative)."""
    return os.path.join(xdg_home("config", env), "imap.toml")


def resolve_model(path, env=os.environ) -> tuple[str, bool]:
    """Which model a command uses: ``(path, is_default)`` (see the module docstring)."""
    if path is not None:
        return os.fspath(path), False
    user = default_model_path(env)
    # An empty $SPAMNB_MODEL is unset (as default_model_path reads it).
    if os.path.exists(user) or env.get("SPAMNB_MODEL"):
        return user, False
    return default_cache_path(env), True


#: a model's history is this file beside it: ``MODEL.history.sqlite``
HISTORY_SUFFIX = ".history.sqlite"


def history_path(history, model_path):
    """The verdict history a command records in and marks corrections in, or None.

    ``history``: the ``--history FILE`` option or ``[history] path``, that file;
    False (``--no-history``) for none; None (or empty) for the default, the file
    beside ``model_path``, the model file as the command names it (a symlink's own
    name: where ``filter`` records, whatever the link points at today). A store's
    model (``model_path`` None) has no file to sit beside: only a named file records.
    """
    if history is False:
        return None
    if history:
        return os.fspath(history)
    return None if model_path is None else os.fspath(model_path) + HISTORY_SUFFIX


def history_setting(opts):
    """The history unit of a fast path's parsed options (``history``, ``no_history``), as
    :func:`history_path` takes it: False for ``--no-history``, else ``--history``'s file or
    None for the default."""
    return False if opts["no_history"] else opts["history"]


def default_socket_path(env=os.environ) -> str:
    """The filter server's socket: ``$SPAMNB_SOCKET``, else
    ``$XDG_RUNTIME_DIR/spamnb/socket``, else ``/tmp/spamnb-$UID/socket``.

    The folder is the server's to create with mode 0700; an empty variable is unset.
    """
    explicit = env.get("SPAMNB_SOCKET")
    if explicit:
        return os.path.expanduser(explicit)
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        return os.path.join(runtime, "spamnb", "socket")
    return os.path.join("/tmp", f"spamnb-{os.geteuid()}", "socket")


def local_user() -> str:
    """The name of the user running this (a history row's and a log line's ``user``):
    $LOGNAME or $USER, which login, procmail and systemd set, before a password-database
    lookup, which can take milliseconds (NSS) on the cold filter's path."""
    name = os.environ.get("LOGNAME") or os.environ.get("USER")
    if name:
        return name[:64]
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        return str(os.geteuid())
