"""``spamnb stats``: what the filter did over a period, from its log lines."""

from __future__ import annotations

import sys
import time
from collections import Counter

import click


def _since(text):
    """A start time (epoch seconds) from ``7d``, ``24h``, ``30m`` or an ISO date/time (UTC)."""
    if text is None:
        return None
    units = {"d": 86400, "h": 3600, "m": 60}
    if text[-1:] in units and text[:-1].replace(".", "", 1).isdigit():
        return time.time() - float(text[:-1]) * units[text[-1]]
    import datetime

    try:
        t = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"{text!r}: give 7d, 24h, 30m or a date such as 2026-12-01",
                                 param_hint="--since") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=datetime.timezone.utc)
    return t.timestamp()


def _epoch(ts):
    import datetime

    try:
        return datetime.datetime.fromisoformat(str(ts).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def tally(lines, since=None):
    """The counts of the event lines (:func:`spamnb.delivery.events.parse`) at or after ``since``.

    A correction is counted once per message (by its Message-ID): the class the
    user taught last against the verdict it was filed with. A forget is never a
    correction, and takes back the message's (a message taught, forgotten and taught
    again, on whichever hosts, is one correction); a message taught twice the same
    way is one. Lines without a Message-ID count each."""
    from spamnb.delivery.events import UNSCANNED, parse

    verdicts, vias, learned, forgotten = Counter(), Counter(), Counter(), Counter()
    errors, unscanned, corrections = Counter(), Counter(), Counter()
    filed = {}  # Message-ID -> the verdict it got, to tell a correction from agreement
    taught = {}  # Message-ID -> [the class it was filed as (None: unknown), the class taught now or None]
    first = last = None
    for line in lines:
        ev = parse(line)
        if ev is None:
            continue
        t = _epoch(ev.get("ts"))
        if since is not None and (t is None or t < since):
            continue
        first = ev.get("ts") if first is None else first
        last = ev.get("ts")
        mid = ev.get("mid")
        mid = mid if mid and mid != "-" else None
        kind = ev["event"]
        if kind == "message":
            verdicts[ev.get("verdict")] += 1
            vias[ev.get("via")] += 1
            if ev.get("learned") not in (None, "no"):
                learned[(ev["learned"], ev.get("why") or "filter-u")] += 1
            if mid:
                filed[mid] = ev.get("verdict")
        elif kind == "error":
            n = int(ev["count"]) if str(ev.get("count", "")).isdigit() else 1  # a flood's line stands for many
            errors[(ev.get("via") or "-", ev.get("kind") or "-")] += n
            if ev.get("mail") == UNSCANNED:
                unscanned[ev.get("via") or "-"] += n
        elif kind == "forget":
            forgotten[(ev.get("class"), ev.get("source"))] += 1
            if mid in taught:
                taught[mid][1] = None
        elif kind == "learn":
            cls = ev.get("class")
            learned[(cls, ev.get("source"))] += 1
            was = filed.get(mid) if mid else None
            if was is None:
                was = ev.get("was")
            if was is None and ev.get("source") == "imap":  # a move into or out of Junk is a correction
                was = "ham" if cls == "spam" else "spam"
            if mid is None:
                if was and was != cls:
                    corrections[(was, cls)] += 1
                continue
            state = taught.setdefault(mid, [None, None])
            if state[0] is None:
                state[0] = was
            state[1] = cls
    for was, cls in taught.values():
        if was and cls and was != cls:
            corrections[(was, cls)] += 1
    return {"verdicts": verdicts, "vias": vias, "learned": learned, "forgotten": forgotten,
            "corrections": corrections, "errors": errors, "unscanned": unscanned, "first": first, "last": last}


@click.command()
@click.argument("logs", nargs=-1, type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--since", metavar="WHEN", help="Only events from then on: 7d, 24h, 30m, or a date (UTC).")
def stats(logs, since):
    """What the filter did, from its log lines (LOGS, or standard input).

    Reads the lines `spamnb serve`, `imap filter` and `filter --log-messages`
    write, in either --log-format, with or without a journald/syslog prefix:

    \b
      journalctl -u spamnb@alice --since today -o cat | spamnb stats
      spamnb stats --since 7d /var/log/mail.log

    Prints messages by verdict and by way in, the mail that went on unscanned
    (an error line with mail=unscanned: spamc passed it through, the filter
    delivered it unchanged, IMAP left it where it was) and the errors by kind,
    messages learned and forgotten by class and who taught them, and the
    corrections (a message learned as the other class than it was filed as:
    spam moved to ham is a false positive) with the rates. A correction counts
    once per message, its last teaching: a forget is never one, and a message
    taught, forgotten (on any host) and taught again is one.
    """
    start = _since(since)
    streams = []
    try:
        for name in logs or ("-",):
            streams.append(sys.stdin if name == "-" else open(name, encoding="utf-8", errors="replace"))
        t = tally((line for s in streams for line in s), start)
    finally:
        for s in streams:
            if s is not sys.stdin:
                s.close()
    total = sum(t["verdicts"].values())
    if not total and not t["learned"] and not t["errors"] and not t["forgotten"]:
        click.echo("no spamnb event lines in the input")
        return
    click.echo(f"from {t['first']} to {t['last']}")
    click.echo(f"messages: {total}")
    for v in ("ham", "unsure", "spam"):
        n = t["verdicts"][v]
        click.echo(f"  {v:<7} {n:>8}  {100 * n / total if total else 0:6.2f}%")
    click.echo("by way in: " + (", ".join(f"{k} {n}" for k, n in sorted(t["vias"].items())) or "none"))
    passed = sum(t["unscanned"].values())
    click.echo(f"passed unscanned: {passed}"
               + (" (" + ", ".join(f"{k} {n}" for k, n in sorted(t["unscanned"].items())) + ")" if passed else ""))
    click.echo(f"errors: {sum(t['errors'].values())}")
    for (via, kind), n in sorted(t["errors"].items()):
        click.echo(f"  {kind:<12} via {via:<7} {n:>8}")
    click.echo("learned:")
    for (cls, source), n in sorted(t["learned"].items()):
        click.echo(f"  {cls:<5} from {source:<9} {n:>8}")
    click.echo("forgotten:")
    for (cls, source), n in sorted(t["forgotten"].items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1]))):
        click.echo(f"  {cls:<5} from {source:<9} {n:>8}")
    click.echo("corrections:")
    click.echo(f"  spam moved to ham (false positives): {t['corrections'][('spam', 'ham')]}"
               + (f"  ({100 * t['corrections'][('spam', 'ham')] / t['verdicts']['spam']:.2f}% of spam verdicts)"
                  if t["verdicts"]["spam"] else ""))
    click.echo(f"  ham moved to spam (missed spam):     {t['corrections'][('ham', 'spam')]}"
               + (f"  ({100 * t['corrections'][('ham', 'spam')] / t['verdicts']['ham']:.2f}% of ham verdicts)"
                  if t["verdicts"]["ham"] else ""))
    click.echo(f"  unsure sorted: {t['corrections'][('unsure', 'ham')]} to ham, "
               f"{t['corrections'][('unsure', 'spam')]} to spam")
