"""``spamnb web``: the page that shows what the filter did and learns your corrections."""

from __future__ import annotations

import os

import click

from spamnb.cli.options import model_options, notice


@click.command()
@model_options
@click.option("--history", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="The history to show (default MODEL.history.sqlite, beside the model; with --store, the "
                   "store's: every host's verdicts).")
@click.option("--listen", default="127.0.0.1:8783", show_default=True, metavar="HOST:PORT",
              help="Where to listen (a PORT alone is on 127.0.0.1; port 0 picks a free one).")
@click.option("--allow", multiple=True, metavar="CIDR",
              help="Networks whose browsers may connect besides this machine (repeatable); needed to "
                   "listen on an address other than loopback. They still need the token.")
@click.option("--verbose", "-v", is_flag=True, help="Log each request (its path, never the token).")
def web(model_path, store, allow_insecure_model, history, listen, allow, verbose):
    """Show what the filter did and correct it, in your browser.

    Pages: Unsure mail (with Spam / Ham buttons that learn the message, as
    `spamnb learn` does, and re-score the rest; tick several to learn them at
    once), History (every verdict the filter, the server and imap filter
    recorded, searchable, with a "wrong?" button), Overview (pictures of the
    last days) and Model (what `spamnb info` says, a word lookup as `spamnb
    explain --word`, and a prune preview).

    It prints its address with a secret token, as Jupyter does: open that
    URL, which leads to the page's own address (/s/KEY/...); every request
    needs that address, which stops working when the page stops. No cookie
    is set (a browser would send it to every port of this host). Stops on
    Ctrl-C.

    \b
    Example:
      spamnb web
      spamnb web --listen 192.0.2.10:8783 --allow 192.0.2.0/24
    """
    from spamnb.delivery import spamd
    from spamnb.storage.history import HistoryError, open_db
    from spamnb.storage.locate import history_path
    from spamnb.storage.modelfile import resolve
    from spamnb.web.app import WebServer
    from spamnb.web.data import Site

    from spamnb import checks
    from spamnb.storage.where import STORE_ENV

    try:
        nets = checks.networks(allow)
    except ValueError as exc:
        raise click.UsageError(f"--allow {exc}") from None
    try:
        where = checks.tcp_address(listen, any_port=True)
        checks.exposure(where[0], nets, "--allow CIDR (e.g. --allow 192.0.2.0/24)")
    except ValueError as exc:
        raise click.UsageError(f"--listen {exc}") from None
    if store or (model_path is None and os.environ.get(STORE_ENV)):
        _serve_store(store or os.environ[STORE_ENV], history, where, nets, listen, verbose)
        return
    path, is_default = resolve(model_path)
    if not path.exists():
        raise click.ClickException(f"no model at {path}; train one with `spamnb train`")
    history = os.path.abspath(history_path(history, path))  # beside the model as named, where filter records
    path = path.resolve()
    try:
        open_db(history).close()  # made (0600) when missing: the page works before the first message
    except HistoryError as exc:
        raise click.ClickException(str(exc)) from None
    site = Site(path, is_default, history, allow_insecure=allow_insecure_model, log=notice)
    try:
        server = WebServer((where[0], where[1]), site, allowed=spamd.LOOPBACK + nets, verbose=verbose)
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {listen}: {exc.strerror or exc}") from None
    click.echo(f"spamnb web: serving {path} and its history {history}", err=True)
    _run(server)


def _serve_store(url, history, where, nets, listen, verbose):
    """The page over the store's model and its history (every host's verdicts)."""
    from click.core import ParameterSource

    from spamnb.delivery import spamd
    from spamnb.storage.history import HistoryError
    from spamnb.storage.redishistory import RedisHistory
    from spamnb.storage.redisstore import RedisBackend
    from spamnb.storage.store import ModelError
    from spamnb.web.app import WebServer
    from spamnb.web.storesite import StoreSite

    if history and click.get_current_context().get_parameter_source("history") == ParameterSource.COMMANDLINE:
        raise click.UsageError("with --store the page shows the store's history: --history FILE is for a model file")
    try:
        backend = RedisBackend.from_url(url)
        backend.settings()  # a store that is empty, unreachable or malformed: said now, not on the page
        hist = RedisHistory(backend)
        hist.check()
    except (ModelError, HistoryError) as exc:
        raise click.ClickException(str(exc)) from None
    site = StoreSite(backend, log=notice, hist=hist)
    try:
        server = WebServer((where[0], where[1]), site, allowed=spamd.LOOPBACK + nets, verbose=verbose)
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {listen}: {exc.strerror or exc}") from None
    click.echo(f"spamnb web: serving the store {backend.name} and its history (every host's verdicts)", err=True)
    _run(server)


def _run(server):
    import signal
    import threading

    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
    click.echo(f"spamnb web: open {server.url()}", err=True)
    try:
        while not stop.wait(1.0):
            pass
    finally:
        server.shutdown()
        server.server_close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
