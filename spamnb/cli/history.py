"""``spamnb history``: the verdict history, listed and searched, as the page's History shows it."""

from __future__ import annotations

import re
import time

import click

from spamnb.cli.options import model_options, open_site, options, resolved

#: ``--since 7d``: how far back a NUMBER followed by one of these goes, in seconds.
AGO = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
#: The table's columns: (title, width) of each clipped one; the Message-ID ends the line whole.
COLUMNS = (("time", 16), ("verdict", 7), ("score", 7), ("taught", 6), ("from", 28), ("subject", 44))


def when(text, option):
    """What ``--since``/``--until`` say, as :meth:`spamnb.web.data.Site.search` takes it: a day
    (YYYY-MM-DD, as it is) or how long ago (``30m``, ``12h``, ``7d``, ``2w``: seconds since
    the epoch); a usage error for anything else."""
    from spamnb.web.data import day_start

    if text is None or day_start(text) is not None:
        return text or ""
    m = re.fullmatch(r"(\d{1,6})([mhdw])", text.strip())
    if m is None:
        raise click.BadParameter(f"{text!r} is neither a day (YYYY-MM-DD) nor a time ago such as 30m, 12h, 7d "
                                 "or 2w", param_hint=option)
    return time.time() - int(m.group(1)) * AGO[m.group(2)]


def printable(text, width=None) -> str:
    """``text`` for one line of a terminal: blanks of any kind as one space, what is not
    printable (control, format and bidirectional characters a hostile Subject may hold) as
    ``?``, cut to ``width`` characters (the last an ellipsis) and padded to it."""
    text = "".join(c if c.isprintable() else "?" for c in " ".join((text or "").split()))
    if width is None:
        return text
    return (text[:width - 1] + "…" if len(text) > width else text).ljust(width)


def line(row) -> str:
    """One row of the table (:data:`COLUMNS`), then its Message-ID."""
    t = time.strftime("%Y-%m-%d %H:%M", time.localtime(row["t"]))
    score = "" if row["score"] is None else f"{row['score']:+.2f}"
    cells = (t, row["verdict"], score, row["corrected"] or "-", row["sender"], row["subject"] or "(no subject)")
    return "  ".join(printable(c, w) if i != 2 else c.rjust(w)
                     for i, (c, (_, w)) in enumerate(zip(cells, COLUMNS))) + "  " + printable(row["message_id"])


#: The fields of ``--format jsonl`` and ``tsv``, in order: the page's columns, the envelope's last
#: (the SMTP client's address, its HELO, the envelope sender, the recipients, the queue id: None,
#: an empty tsv field, where the door did not know them).
FIELDS = ("id", "t", "verdict", "score", "p", "corrected", "corrected_t", "sender", "subject", "message_id", "user",
          "via", "dest", "host", "size", "learned", "now_verdict", "now_score", "kept", "client", "helo",
          "env_sender", "rcpt", "qid")


def show(rows, fmt):
    """Print ``rows`` (newest first) in ``fmt``: table, jsonl or tsv."""
    import json

    if fmt == "table":
        click.echo("  ".join(title.ljust(w) if title != "score" else title.rjust(w) for title, w in COLUMNS)
                   + "  message-id")
    for row in rows:
        row = {**row, "kept": bool(row.get("kept"))}  # SQLite's 0/1, the store's bool
        if fmt == "table":
            click.echo(line(row))
        elif fmt == "jsonl":
            click.echo(json.dumps({k: row.get(k) for k in FIELDS}, ensure_ascii=False))
        else:
            click.echo("\t".join("" if row.get(k) is None else printable(str(row[k])) for k in FIELDS))


@click.command()
@model_options
@options("history", command="history")
@click.option("--since", metavar="WHEN", help="Verdicts from this day (YYYY-MM-DD) or this long ago (30m, 12h, "
                                             "7d, 2w) on.")
@click.option("--until", metavar="WHEN", help="Verdicts up to this day (YYYY-MM-DD, included) or this long ago.")
@click.option("--verdict", type=click.Choice(["spam", "ham", "unsure"]), help="Only verdicts of this class.")
@click.option("--search", "text", metavar="TEXT", default="",
              help="Only messages whose From or Subject, or envelope sender or recipients, hold TEXT, as the "
                   "page's search finds it.")
@click.option("--user", metavar="NAME", default="", help="Only verdicts for this user (the spamd User:, the IMAP "
                                                         "login, else the local user).")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True,
              help="Show at most this many (the newest).")
@click.option("--format", "fmt", type=click.Choice(["table", "jsonl", "tsv"]), default="table", show_default=True,
              help="Output format: a line a verdict, clipped to the terminal's use; jsonl and tsv hold every field "
                   "whole, the SMTP envelope's too.")
@click.pass_context
def history(ctx, model_path, store, allow_insecure_model, history, since, until, verdict, text, user, limit, fmt):
    """List and search the verdict history, as the page's History does.

    One line a verdict, newest first: time, verdict, score, the class you
    taught it as (- when none), From, Subject (decoded) and Message-ID. It
    reads the history `spamnb web` shows: beside the model
    (MODEL.history.sqlite), --history FILE ([history] path), or with --store
    the store's, every host's verdicts. How many matched is said on stderr.

    \b
    Examples:
      spamnb history --since 7d --verdict unsure
      spamnb history --search paypal --format jsonl
      spamnb history --store redis://mail.example.org/0 --user bob --limit 10
    """
    import sqlite3

    from spamnb.storage.history import HistoryError

    s = resolved(ctx, ("model_path", "store", "history"))
    since, until = when(since, "--since"), when(until, "--until")
    site = open_site(s["model_path"].value, s["store"].value, s["history"])
    try:
        with site.request():
            rows, total = site.search(q=text, verdict=verdict or "", since=since, until=until, user=user, size=limit)
    except HistoryError as exc:  # a malformed row: it names the row and what to do
        raise click.ClickException(str(exc)) from None
    except sqlite3.Error as exc:  # a damaged or locked file
        raise click.ClickException(f"cannot read the history {site.history_path}: {exc}") from None
    show(rows, fmt)
    click.echo(f"{len(rows)} of {total} verdict{'s' * (total != 1)} matching, newest first, in {site.history_path}",
               err=True)
