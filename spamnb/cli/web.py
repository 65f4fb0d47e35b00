"""``spamnb web``: the page that shows what the filter did and learns your corrections."""

from __future__ import annotations

import click

from spamnb.cli.options import model_options, open_site, options, resolved


@click.command()
@model_options
@options("history", "listen", ("allow", "web"), command="web")
@click.option("--verbose", "-v", is_flag=True, help="Log each request (its path, never the token).")
@click.pass_context
def web(ctx, model_path, store, allow_insecure_model, history, listen, allow, verbose):
    """Show what the filter did and correct it, in your browser.

    Pages: Unsure mail (with Spam / Ham buttons that learn the message, as
    `spamnb learn` does, and re-score the rest; tick several to learn them at
    once), History (every verdict the filter, the server and imap filter
    recorded, searchable, with a "wrong?" button), Overview (pictures of the
    last days), Model (what `spamnb info` says, a word lookup as `spamnb
    explain --word`, and a prune preview), Scan (paste or upload a
    message: its verdict, what moved its score, and buttons that learn it)
    and, with --store, Site (every host's heartbeat: up or silent, its
    counts; the store's servers as its Sentinels report them). A message's
    chips show what each clue added to its score (log-odds) and its share of
    all the pushing.

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
    from spamnb.delivery import access
    from spamnb.web.app import WebServer

    from spamnb import checks

    # the one resolver's values (the options' are its too): where the model is comes whole from one layer
    s = resolved(ctx, ("model_path", "store", "allow_insecure_model", "history", "listen", "allow"))
    model_path, store, listen, allow = (s[n].value for n in ("model_path", "store", "listen", "allow"))
    allow_insecure_model, allow = bool(s["allow_insecure_model"].value), allow or ()
    try:
        nets = checks.networks(allow)
    except ValueError as exc:
        raise click.UsageError(f"--allow {exc}") from None
    try:
        where = checks.tcp_address(listen, any_port=True)
        checks.exposure(where[0], nets, "--allow CIDR (e.g. --allow 192.0.2.0/24)")
    except ValueError as exc:
        raise click.UsageError(f"--listen {exc}") from None
    # store: the resolver's (an option, $SPAMNB_STORE or a file's [store] url, when the model is there)
    site = open_site(model_path, store, s["history"], page=True, allow_insecure_model=allow_insecure_model)
    try:
        server = WebServer((where[0], where[1]), site, allowed=access.LOOPBACK + nets, verbose=verbose)
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {listen}: {exc.strerror or exc}") from None
    shown = (f"the store {site.backend.name} and its history (every host's verdicts)" if store
             else f"{site.model_path} and its history {site.history_path}")
    click.echo(f"spamnb web: serving {shown}", err=True)
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
