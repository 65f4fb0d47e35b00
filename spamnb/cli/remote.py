"""``spamnb store push`` and ``pull``: move a model between a file and a store."""

from __future__ import annotations

import click

from spamnb.cli.options import notice


def _store(url, user):
    from spamnb.checks import is_store_url, redact
    from spamnb.storage.where import open_backend

    if not is_store_url(url):
        raise click.UsageError(f"{redact(url)!r} is not a store URL: redis://HOST:PORT/DB, rediss://..., unix:///PATH "
                               f"or redis+sentinel://HOST:PORT,.../SERVICE/DB (rediss+sentinel://: TLS)")
    backend = open_backend(None, url)
    return backend.for_user(user) if user else backend


_user = click.option("--user", metavar="NAME",
                     help="The model of this user (spamd's User:, IMAP's login) instead of the store's own.")


@click.group("store")
def store():
    """Move a model between a file and a store shared by several hosts.

    \b
    Example (docs/many-hosts.md):
      spamnb store push ~/.local/share/spamnb/model.joblib 'redis://mx-store:6379/0?password_file=/etc/spamnb/redis.pw'
      spamnb serve --spamd 0.0.0.0:783 --allow 192.0.2.0/24 --store 'redis://mx-store:6379/0?password_file=...'
    """


@store.command("push")
@click.argument("model", type=click.Path(dir_okay=False, exists=True))
@click.argument("url")
@_user
@click.option("--allow-insecure-model", is_flag=True, help="Read a model file that other users can write.")
def push(model, url, user, allow_insecure_model):
    """Copy the model file MODEL (with its journal's updates) into the store at URL,
    replacing the model there. Hosts using the store score with it from their next message."""
    from spamnb.storage.filestore import FileBackend

    target = _store(url, user)
    m = FileBackend(model, allow_insecure=allow_insecure_model).model()
    target.replace(m)
    ham, spam = (int(n) for n in m.messages)
    notice(f"pushed {model} to {target.name}: {len(m.vocabulary)} tokens, {ham} ham and {spam} spam learned")


@store.command("pull")
@click.argument("url")
@click.argument("model", type=click.Path(dir_okay=False))
@_user
def pull(url, model, user):
    """Copy the model in the store at URL into the model file MODEL (replacing it)."""
    from spamnb.checks import redact
    from spamnb.storage.filestore import FileBackend

    m = _store(url, user).model()
    FileBackend(model).replace(m)
    notice(f"pulled {redact(url)} into {model}: {len(m.vocabulary)} tokens")
