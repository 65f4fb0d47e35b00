"""The HTML of each page. Every value that comes from a message (From, Subject,
Message-ID, tokens, the body) or from the request goes through :func:`e`
(``html.escape`` with quotes): a Subject of ``<img src=x onerror=...>`` shows
as those characters. Bodies are shown as text in ``<pre>``, never rendered;
no page has a script, and the Content-Security-Policy the server sends
(:data:`spamnb.web.app.CSP`) forbids any.
"""

from __future__ import annotations

import datetime
import html
from urllib.parse import urlencode

from spamnb.mail.mime import clipped
from spamnb.mail.tokennames import describe
from spamnb.storage import history
from spamnb.storage.redissite import BEAT, MAX_HOSTS, UP_BEATS
from spamnb.storage.scorer import sigmoid
from spamnb.web import charts
from spamnb.web.data import CORRECTIONS, MAX_MESSAGE, PAGE, logit

MAX_SHOWN = 200_000  # characters of a message's source shown on its page


def e(value) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def when(t) -> str:
    return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M") if t else ""


def layout(title, body, *, active="", flash="", nav=True, root="", refresh=None):
    """A whole page; ``root`` is the page's own address (``/s/KEY``), which every link carries;
    ``refresh``: seconds after which the browser loads it again (a view that watches)."""
    on = ' class="on"'
    nav = "" if not nav else "".join(f'<a href="{e(root)}/{p}"{on if p == active else ""}>{name}</a>'
                  for p, name in (("unsure", "Unsure"), ("history", "History"), ("overview", "Overview"),
                                  ("model", "Model"), ("scan", "Scan"), ("site", "Site")))
    note = f'<p class="flash">{flash}</p>' if flash else ""
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{e(title)} - spamnb</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            + (f'<meta http-equiv="refresh" content="{int(refresh)}">' if refresh else "")
            + f'<link rel="stylesheet" href="/static/style.css"></head><body>'
            f'<header><strong>spamnb</strong><nav>{nav}</nav></header><main><h1>{e(title)}</h1>{note}{body}'
            f'</main></body></html>')


def verdict_badge(label, score=None):
    text = e(label) + (f" {score:+.1f}" if score is not None else "")
    return f'<span class="v {e(label)}">{text}</span>'


def leaning(logodds) -> str:
    """Where a clue's contribution (log-odds) pushes, as the probability it alone would give
    from even odds: ``+2.2`` -> "90% spam", ``-4.6`` -> "99% ham"."""
    p = sigmoid(logodds)
    side, p = ("spam", p) if logodds > 0 else ("ham", 1 - p)
    shown = f"{100 * p:.0f}%" if p < 0.995 else ">99%"
    return f"{shown} {side}"


LIST_CHIPS = (4, 2)  # clues a row of a list shows: toward the score's side, against it
PAGE_CHIPS = (10, 10)  # on a message's own page and the Scan page


def signed(x) -> str:
    return f"{x:+.2f}"


def clue_chips(clues, shown=LIST_CHIPS, *, prior=False):
    """What moved a message's score (a :class:`spamnb.web.data.Clues`), as chips: each clue
    in words (the token on hover) with its contribution to the score in log-odds and its
    share of all the pushing, those pushing toward the score's side first (largest first),
    then those pushing against it; red pushes toward spam, green toward ham. The clues not
    shown are one chip a side ("31 more +4.20"); with ``prior`` (a message's own page), the
    prior is one too, every chip adds up to the score, and the side toward the verdict shows
    enough clues to give the verdict on their own (:meth:`spamnb.web.data.Clues.sides`)."""
    if clues is None or not clues.terms:
        return '<span class="muted">no known tokens</span>'
    items = []
    for side, group, rest_n, rest_sum in clues.sides(*shown, enough=prior):
        if prior and items:  # on a message's own page, each side on lines of its own
            items.append('<li class="break" aria-hidden="true"></li>')
        cls = "s" if side == "spam" else "h"
        for tok, c in group:
            n = clues.counts.get(tok, 0)
            times = f" ×{n}" if n > 1 else ""
            items.append(f'<li class="{cls}" title="{e(tok)} ({f"{n} times in the message, " if n > 1 else ""}'
                         f'{signed(c)} log-odds, pushing toward {side})">{e(describe(tok))}{times} '
                         f'<b>{signed(c)}</b> <small>{share(clues, c)}</small></li>')
        if rest_n:
            items.append(f'<li class="{cls} more" title="the other {rest_n} clues pushing toward {side}">'
                         f'{rest_n} more <b>{signed(rest_sum)}</b> <small>{share(clues, rest_sum)}</small></li>')
    if prior:
        items.append(f'<li class="prior" title="the score of a message with no known token: the classes\' '
                     f'learned proportion">prior <b>{signed(clues.prior)}</b> <small>{share(clues, clues.prior)}'
                     f'</small></li>')
    return '<ul class="clues">' + "".join(items) + "</ul>"


def share(clues, c) -> str:
    """A contribution's share of all the pushing, as a chip shows it."""
    part = clues.share(c)
    return f"{100 * part:.0f}%" if part >= 0.005 or not part else "&lt;1%"


def clue_sum(clues) -> str:
    """The sum the chips make, in one line: prior + toward spam + toward ham = score."""
    spam = sum(c for _, c in clues.terms if c > 0)
    ham = sum(c for _, c in clues.terms if c < 0)
    return (f'<p class="sum">prior {signed(clues.prior)} + toward spam {signed(spam)} + toward ham {signed(ham)} '
            f'= score <b>{signed(clues.score)}</b>, P(spam) = {clues.p:.6f}</p>')


def clue_section(clues, shown=PAGE_CHIPS, title="What moved its score", note=""):
    """A message's chips with their sum and what the numbers mean (its page, the Scan page)."""
    if clues is None or not clues.terms:
        return f"<h2>{e(title)}</h2>{clue_chips(clues)}"
    return (f'<h2>{e(title)}</h2>{note}{clue_sum(clues)}{clue_chips(clues, shown, prior=True)}'
            f'<p class="muted">Each chip is what that clue adds to the score, in log-odds: its weight in the '
            f'model times its value in this message ({e(FEATURE_VALUE.get(clues.features, "its feature value"))}; '
            f'×n: it occurs n times). Red ones push toward spam (+), green ones toward ham (−); the percentage is '
            f'the clue\'s share of all the pushing, both ways. With the prior they add up to the score; '
            f'P(spam) = 1 / (1 + e<sup>−score</sup>).</p>')


#: What a token's count in a message becomes, by the model's features (spamnb.model.FEATURES).
FEATURE_VALUE = {"counts": "its count", "presence": "1, however often it occurs",
                 "presence-l2": "1/√N for each of the message's N known tokens, however often it occurs",
                 "logtf-l2": "log(1 + its count), scaled so that the message's values have length 1"}


def learn_form(mid, label, csrf, back, text=None, root=""):
    return (f'<form method="post" action="{e(root)}/learn" class="inline"><input type="hidden" name="id" value="{int(mid)}">'
            f'<input type="hidden" name="label" value="{e(label)}"><input type="hidden" name="csrf" value="{e(csrf)}">'
            f'<input type="hidden" name="back" value="{e(back)}">'
            f'<button class="{e(label)}" type="submit">{e(text or label.capitalize())}</button></form>')


def pager(page, total, base, params):
    pages = max((total + PAGE - 1) // PAGE, 1)
    links = []
    if page > 0:
        links.append(f'<a rel="prev" href="{e(base)}?{e(urlencode({**params, "page": page - 1}))}">newer</a>')
    links.append(f"page {page + 1} of {pages} ({total} messages)")
    if page + 1 < pages:
        links.append(f'<a rel="next" href="{e(base)}?{e(urlencode({**params, "page": page + 1}))}">older</a>')
    return '<p class="pager">' + " · ".join(links) + "</p>"


NAMED = 3  # messages a note names by subject; the rest it counts
SUBJECT_WIDTH = 60  # characters of a subject a note shows


def named(subject) -> str:
    """A message named by its subject in a sentence: quoted, clipped, escaped."""
    return f"“{e(clipped(subject, SUBJECT_WIDTH))}”" if subject else "(no subject)"


def learned_note(subjects, label) -> str:
    """What a choice learned, by subject: 'Learned as ham: “Prognose für Sie”, “Re: meeting”
    and 1 more' (the rows' numbers say nothing to a person)."""
    names = [named(s) for s in subjects[:NAMED]]
    if len(subjects) > NAMED:
        names.append(f"{len(subjects) - NAMED} more")
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return f"Learned as {e(label)}: {listed}"


def moved_note(moved, root=""):
    if moved is None:
        return ""
    if not moved:
        return "Re-scored the unsure messages: none moved."
    items = ", ".join(f'<a href="{e(root)}/message/{int(mid)}">#{int(mid)} {named(subject)}</a> '
                      f'{e(was)} → {verdict_badge(now)}' for mid, subject, was, now in moved[:20])
    more = f" and {len(moved) - 20} more" if len(moved) > 20 else ""
    return f"Re-scored the unsure messages: {len(moved)} moved: {items}{more}."


def unsure_page(rows, total, page, clues, csrf, flash="", *, root=""):
    if not rows:
        body = f'<p>No unsure mail waiting. <a href="{e(root)}/history">The history</a> has every verdict.</p>'
        return layout("Unsure mail", body, active="unsure", flash=flash, root=root)
    back = f"/unsure?page={page}"
    items = []
    for r in rows:
        now = ""
        if r["now_verdict"] and r["now_verdict"] != r["verdict"]:
            now = f' <span class="moved">now {verdict_badge(r["now_verdict"], r["now_score"])}</span>'
        items.append(
            f'<tr id="m{r["id"]}"><td class="pick"><input type="checkbox" name="id" value="{int(r["id"])}" '
            f'form="batch" aria-label="choose #{int(r["id"])}"></td><td class="when">{e(when(r["t"]))}</td>'
            f'<td><a href="{e(root)}/message/{r["id"]}" class="subject">{e(r["subject"] or "(no subject)")}</a>'
            f'<div class="from">{e(r["sender"])}</div>{clue_chips(clues.get(r["id"]))}</td>'
            f'<td>{verdict_badge(r["verdict"], r["score"])}{now}</td>'
            f'<td class="act">{learn_form(r["id"], "spam", csrf, back, root=root)}'
            f'{learn_form(r["id"], "ham", csrf, back, root=root)}</td></tr>')
    batch = (f'<form method="post" action="{e(root)}/learn" id="batch" class="batch">'
             f'<input type="hidden" name="csrf" value="{e(csrf)}"><input type="hidden" name="back" value="{e(back)}">'
             f'The messages ticked: <button class="spam" type="submit" name="label" value="spam">Spam</button>'
             f'<button class="ham" type="submit" name="label" value="ham">Ham</button></form>')
    body = (batch + f'<table class="list unsure"><thead><tr><th></th><th>Date</th><th>Message and its clues</th>'
            f'<th>Score</th><th>It is</th></tr></thead><tbody>{"".join(items)}</tbody></table>'
            + pager(page, total, root + "/unsure", {}))
    return layout("Unsure mail", body, active="unsure", flash=flash, root=root)


def history_page(rows, total, page, params, clues, csrf, flash="", *, root=""):
    q, verdict, since, until = (params.get(k, "") for k in ("q", "verdict", "since", "until"))
    options = "".join(f'<option value="{v}"{" selected" if v == verdict else ""}>{v or "any verdict"}</option>'
                      for v in ("", "spam", "ham", "unsure"))
    form = (f'<form method="get" action="{e(root)}/history" class="search"><input type="search" name="q" value="{e(q)}" '
            f'placeholder="sender, subject or recipient"><select name="verdict">{options}</select>'
            f'<label>from <input type="date" name="since" value="{e(since)}"></label>'
            f'<label>to <input type="date" name="until" value="{e(until)}"></label><button>Search</button></form>')
    back = "/history?" + urlencode({**params, "page": page})
    items = []
    for r in rows:
        label = r["corrected"] or r["verdict"]
        other = "ham" if label == "spam" else "spam"
        if r["corrected"]:
            state = f'taught as {verdict_badge(r["corrected"])}'
        elif r["learned"]:
            state = f'learned as {e(r["learned"])}'
        else:
            state = ""
        act = (learn_form(r["id"], other, csrf, back, f"wrong? learn as {other}", root=root)
               if r["kept"] and label != "unsure"
               else learn_form(r["id"], "spam", csrf, back, root=root) + learn_form(r["id"], "ham", csrf, back,
                                                                                    root=root) if r["kept"]
               else '<span class="muted">not kept</span>')
        items.append(
            f'<tr id="m{r["id"]}"><td class="when">{e(when(r["t"]))}</td>'
            f'<td>{verdict_badge(r["verdict"], r["score"])}</td>'
            f'<td><a href="{e(root)}/message/{r["id"]}" class="subject">{e(r["subject"] or "(no subject)")}</a>'
            f'<div class="from">{e(r["sender"])}</div>{clue_chips(clues[r["id"]]) if r["id"] in clues else ""}</td>'
            f'<td>{e(r["via"])}{" → " + e(r["dest"]) if r["dest"] else ""}'
            f'{" on " + e(r["host"]) if r.get("host") else ""}'
            f'<div class="muted">{e(r["user"])}</div></td><td>{state}</td><td class="act">{act}</td></tr>')
    table = (f'<table class="list history"><thead><tr><th>Date</th><th>Verdict</th><th>Message</th><th>Via</th>'
             f'<th>Learned</th><th></th></tr></thead><tbody>{"".join(items)}</tbody></table>') if rows else \
        "<p>No verdict matches.</p>"
    return layout("History", form + table + pager(page, total, root + "/history",
                                                   {k: v for k, v in params.items() if v}),
                  active="history", flash=flash, root=root)


def message_page(row, raw, clues, csrf, flash="", *, root=""):
    facts = [("Date", when(row["t"])), ("From", row["sender"]), ("Subject", row["subject"]),
             ("Message-ID", row["message_id"]), ("User", row["user"]), ("Size", f'{row["size"]} bytes'),
             ("Via", row["via"]), ("Host", row.get("host")),
             # who sent it, where the door knew (the client's address: spamd, the milter; the rest: the milter)
             ("Client address", row.get("client")), ("HELO", row.get("helo")),
             ("Envelope sender", row.get("env_sender")), ("Envelope recipients", row.get("rcpt")),
             ("Queue ID", row.get("qid")),
             ("Went to", row["dest"]), ("Learned at delivery", row["learned"]),
             ("Corrected to", row["corrected"])]  # on this page, by an IMAP move, TELL or spamnb learn
    dl = "".join(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in facts if v)
    back = f"/message/{row['id']}"
    body = [f'<p>{verdict_badge(row["verdict"], row["score"])} P(spam) = {row["p"]:.6f}</p><dl>{dl}</dl>']
    if raw is None:
        body.append('<p class="muted">The message itself was not kept (only unsure messages and the most recent '
                    'others are, for a while), so it cannot be shown or learned here.</p>')
    else:
        body.append(f'<p>{learn_form(row["id"], "spam", csrf, back, root=root)} '
                    f'{learn_form(row["id"], "ham", csrf, back, root=root)}</p>')
        now = "" if clues is None or row["score"] is None or round(clues.score, 2) == round(row["score"], 2) else \
            f'<p class="muted">Scored {signed(row["score"])} when it came; the model now scores it ' \
            f'{signed(clues.score)}: these are its clues now.</p>'
        body.append(clue_section(clues, note=now))
        text = raw.decode("utf-8", "replace")
        cut = len(text) > MAX_SHOWN
        body.append(f'<h2>Source (as text, never rendered)</h2><pre class="source">{e(text[:MAX_SHOWN])}</pre>'
                    + ('<p class="muted">(cut)</p>' if cut else ""))
    return layout(f"Message #{row['id']}", "".join(body), flash=flash, root=root)


def scan_page(csrf, *, root="", raw=None, clues=None, flash="", error=""):
    """The Scan page: a form to paste or upload a message; with ``raw`` and its ``clues``, its
    verdict, what moved its score, buttons that learn it, and its source as text. ``error``:
    HTML (escaped by the caller) said above the form."""
    body = [f'<p class="flash error">{error}</p>' if error else ""]
    if raw is not None:
        body.append(scan_result(raw, clues, csrf, root))
    body.append(f'<h2>{"Scan another message" if raw is not None else "Paste or upload a message"}</h2>'
                f'<form method="post" action="{e(root)}/scan" enctype="multipart/form-data" id="scan" class="scan">'
                f'<input type="hidden" name="csrf" value="{e(csrf)}">'
                f'<label for="message">The message as its mail file holds it, headers and body (Show original, '
                f'View source):</label><textarea name="message" id="message" rows="12" spellcheck="false">'
                f'</textarea><label>or a mail file: <input type="file" name="file" id="file"></label>'
                f'<p><button type="submit">Scan</button> <span class="muted">Nothing is kept or learned until you '
                f'press a Learn button; at most {MAX_MESSAGE / 1e6:.0f} MB.</span></p></form>')
    return layout("Scan a message", "".join(body), active="scan", flash=flash, root=root)


def scan_result(raw, clues, csrf, root):
    """A scanned message: its From and Subject, its verdict under the model now, the buttons
    that learn it (they send it back whole, as base64: nothing of it is kept between two
    requests), what moved its score and its source as text."""
    import base64

    f = history.fields(raw)
    facts = "".join(f"<dt>{k}</dt><dd>{e(v)}</dd>" for k, v in (("From", f["sender"]), ("Subject", f["subject"]))
                    if v)
    teach = (f'<form method="post" action="{e(root)}/scan" enctype="multipart/form-data" id="teach">'
             f'<input type="hidden" name="csrf" value="{e(csrf)}">'
             f'<input type="hidden" name="raw64" value="{base64.b64encode(raw).decode("ascii")}">'
             f'<button class="spam" type="submit" name="label" value="spam">Learn as spam</button>'
             f'<button class="ham" type="submit" name="label" value="ham">Learn as ham</button></form>')
    text = raw.decode("utf-8", "replace")
    cut = '<p class="muted">(cut)</p>' if len(text) > MAX_SHOWN else ""
    return (f'<section id="verdict"><p>{verdict_badge(clues.label, clues.score)} P(spam) = {clues.p:.6f} '
            f'<span class="muted">({len(raw)} bytes, under the model as it is now)</span></p><dl>{facts}</dl>'
            f'{teach}{clue_section(clues)}<h2>Source (as text, never rendered)</h2><pre class="source">'
            f'{e(text[:MAX_SHOWN])}</pre>{cut}</section>')


def taught_note(raw, label, done) -> str:
    """What a Learn button of the Scan page did (``done``: the counts of the learn)."""
    name = named(history.fields(raw)["subject"])
    if done.get("moved"):
        return f"Learned as {e(label)}: {name} (it was learned as the other class before: moved)."
    if done.get("learned"):
        return f"Learned as {e(label)}: {name}."
    return f"{name} was already learned as {e(label)}: nothing changed."


def too_large_note(size) -> str:
    return (f"This message is {size / 1e6:.1f} MB: the page takes messages up to {MAX_MESSAGE / 1e6:.0f} MB, the "
            f"most the tokenizer reads of one. Nothing was scanned or learned.")


def overview_page(per_day, days, bins, cutoffs, corrections, facts, *, root=""):
    day_labels = [d[5:] for d in days]
    day_series = {v: [per_day.get(d, {}).get(v, 0) for d in days] for v in ("ham", "unsure", "spam")}
    edges, counts = bins
    lo, hi = edges[0], edges[-1]
    markers = [(logit(cutoffs[0]), f"ham ≤ {cutoffs[0]:g}"), (logit(cutoffs[1]), f"spam > {cutoffs[1]:g}")]
    hist = charts.stacked_bars("Scores (log-odds) of the last 30 days", [f"{x:g}" for x in edges[:-1]],
                               {v: counts[v] for v in ("ham", "unsure", "spam")}, markers=markers,
                               tick_every=5, x_range=(lo, hi))
    corr = charts.stacked_bars("Corrections per day", day_labels,
                               {k: [corrections.get(d, {}).get(k, 0) for d in days] for k in CORRECTIONS},
                               tick_every=3) if corrections else '<p class="muted">No corrections yet.</p>'
    size = "".join(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in facts if k in ("messages", "vocabulary", "size"))
    per_day_chart = charts.stacked_bars("Messages per day by verdict", day_labels, day_series, tick_every=3)
    body = (f'<h2>Messages per day</h2>{per_day_chart}'
            f'<h2>Score histogram</h2><p class="muted">Scores below -40 and above 40 are counted in the end bars; '
            f'the dashed lines are the cut-offs.</p>{hist}'
            f'<h2>Corrections</h2><p class="muted">What you taught here: spam that was ham (false positive), '
            f'ham that was spam (false negative), unsure mail.</p>{corr}'
            f'<h2>Model size</h2><dl>{size}</dl>')
    return layout("Overview", body, active="overview", root=root)


def model_page(facts, preview, older_than, max_messages, *, word="", found=(), root=""):
    dl = "".join(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in facts)
    dropped, before = preview
    form = (f'<form method="get" action="{e(root)}/model" class="search"><label>tokens unseen for '
            f'<input type="number" name="older_than" min="0" value="{int(older_than)}"> days</label> '
            f'<label>in at most <input type="number" name="max_messages" min="0" value="{int(max_messages)}"> '
            f'messages</label><button>Preview</button></form>')
    body = (f"<dl>{dl}</dl><h2>Prune preview</h2>{form}<p>spamnb prune --older-than {int(older_than)} "
            f"--max-messages {int(max_messages)} would drop <strong>{dropped}</strong> of {before} tokens. "
            f"Nothing is changed here: run the command to prune.</p>")
    return layout("Model", body + word_lookup(word, found, root), active="model", root=root)


def word_lookup(word, found, root):
    """The Model page's word lookup (``spamnb explain --word``): a form, and what the model
    knows of the word asked for."""
    form = (f'<form method="get" action="{e(root)}/model" class="search" id="lookup"><input type="search" '
            f'name="word" value="{e(word)}" placeholder="a word or a token"><button>Look up</button></form>')
    if not word:
        return f"<h2>Word lookup</h2>{form}"
    if not found:
        return f'<h2>Word lookup</h2>{form}<p>{e(word)}: not in the model.</p>'
    rows = "".join(f'<tr><td><code>{e(r["token"])}</code><div class="muted">{e(describe(r["token"]))}</div></td>'
                   f'<td>{r["ham"]:.3f}</td><td>{r["spam"]:.3f}</td><td>{r["messages"]}</td>'
                   f'<td>{r["weight"]:+.3f}</td><td>{leaning(r["weight"])}</td></tr>' for r in found)
    return (f'<h2>Word lookup</h2>{form}<table class="list words"><thead><tr><th>Token</th><th>ham</th>'
            f'<th>spam</th><th>messages</th><th>log-odds</th><th>pushes to</th></tr></thead>'
            f'<tbody>{rows}</tbody></table><p class="muted">ham and spam: the token\'s counts in each class '
            f'(as the model\'s features count them: <code>spamnb explain --word</code> says how); messages: the learned '
            f'messages holding it; log-odds: what it alone adds to a score.</p>')


def ago(seconds) -> str:
    """A duration in words: "4 s", "3 min", "2 h"."""
    seconds = max(0.0, seconds)
    return (f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200
            else f"{seconds / 3600:.0f} h")


def clock(t, now) -> str:
    """A beat's time: the time of day when it is today, else the date too."""
    if t is None:
        return "?"
    day = datetime.date.fromtimestamp
    return datetime.datetime.fromtimestamp(t).strftime("%H:%M:%S" if day(t) == day(now) else "%Y-%m-%d %H:%M:%S")


def shown(n) -> str:
    """A count of the store, or "?" for one that is not a count (a hostile or damaged value)."""
    return "?" if n is None else str(n)


def host_state(r, now) -> str:
    """Up (its last beat under three beats old), stopped (its last beat said so), or silent since
    its last beat."""
    if r["up"]:
        return f'<span class="state up">up</span> <span class="muted">beat {ago(now - r["beat"])} ago</span>'
    if r["stopped"] is not None:
        return f'<span class="state stopped">stopped</span> at {e(clock(r["stopped"], now))}'
    return (f'<span class="state silent">silent</span> since {e(clock(r["beat"], now))} '
            f'<span class="muted">({ago(now - r["beat"]) if r["beat"] is not None else "?"})</span>')


def hosts_table(view, most):
    now = view["now"]
    if view["error"]:
        return f'<p class="flash">The store did not answer: {e(view["error"])}</p>'
    if not view["hosts"]:
        return ('<p>No host beat in the last hour: a <code>spamnb serve</code> or <code>spamnb imap filter '
                '--watch</code> using this store beats every few seconds.</p>')
    rows = []
    for r in view["hosts"]:
        rate = "–" if r["per_minute"] is None else f"{r['per_minute']:.1f}"
        counts = " / ".join(shown(r[k]) for k in ("ham", "unsure", "spam"))
        rows.append(f'<tr class="host"><td class="name">{e(r["host"])}</td><td>{e(r["role"])}</td>'
                    f'<td class="st">{host_state(r, now)}</td><td class="n">{rate}</td><td class="n">{counts}</td>'
                    f'<td class="n">{shown(r["unscanned"])}</td><td class="n">{shown(r["errors"])}</td>'
                    f'<td class="n">{shown(r["learned"])} / {shown(r["forgotten"])}</td>'
                    f'<td>{e(r["version"])}</td><td class="when">{e(clock(r["started"], now))}</td></tr>')
    more = (f'<p class="muted">Other hosts beat in the last hour too: the {most} whose beats are newest are '
            f'shown.</p>' if view["more"] else "")
    return (f'<table class="list site"><thead><tr><th>Host</th><th>Process</th><th>State</th><th>Messages a '
            f'minute</th><th>Ham / unsure / spam</th><th>Unscanned</th><th>Errors</th><th>Learned / forgotten</th>'
            f'<th>Version</th><th>Started</th></tr></thead><tbody>{"".join(rows)}</tbody></table>{more}')


def server_rows(role, servers):
    return "".join(f'<tr class="server"><td>{e(role)}</td><td><code>{e(s["address"])}</code></td>'
                   f'<td><span class="state {"up" if s["up"] else "silent"}">{"up" if s["up"] else "down"}</span>'
                   f'</td><td><code>{e(s["flags"])}</code></td></tr>' for s in servers)


def store_servers(servers):
    """The store's servers: a Sentinel group's as its Sentinels report them, or one Redis's role."""
    if "sentinels" not in servers:
        if "error" in servers:
            return f'<p class="flash">The store did not say its role: {e(servers["error"])}</p>'
        replicas = "" if servers.get("replicas") is None else f', {servers["replicas"]} replica(s) connected'
        return f'<p>One Redis (no Sentinels in the URL): its role is <strong>{e(servers["role"])}</strong>{replicas}.</p>'
    items, table = [], ""
    for address, view in servers["sentinels"]:
        if "error" in view:
            items.append(f'<li><code>{e(address)}</code>: did not answer ({e(view["error"])})</li>')
            continue
        items.append(f'<li><code>{e(address)}</code>: names <code>{e(view["primary"]["address"])}</code> the primary'
                     f' and {len(view["replicas"])} replica(s)</li>')
        if not table:  # the servers as the first Sentinel that answered reports them
            table = (f'<p>As <code>{e(address)}</code> reports them:</p><table class="list servers"><thead><tr>'
                     f'<th>Role</th><th>Address</th><th>State</th><th>Flags</th></tr></thead><tbody>'
                     f'{server_rows("primary", [view["primary"]])}{server_rows("replica", view["replicas"])}'
                     f'</tbody></table>')
    if not table:
        table = ('<p class="flash">No Sentinel answered: the store\'s servers cannot be shown now (the hosts '
                 'above are read from the store itself).</p>')
    return (f'<p>A Sentinel group, service <code>{e(servers["service"])}</code>. Its Sentinels:</p>'
            f'<ul class="sentinels">{"".join(items)}</ul>{table}')


def site_page(view, *, most=MAX_HOSTS, root=""):
    """The Site view: every host that beat into the store in the last hour, and the store's
    servers (``view``: :meth:`spamnb.web.storesite.StoreSite.site_view`; None for a model file)."""
    if view is None:
        body = ('<p>The Site view shows the hosts that share a store: run <code>spamnb web --store URL</code>. '
                'With a model file there is one host, this one.</p>')
        return layout("Site", body, active="site", root=root)
    intro = (f'<p class="muted">Every <code>spamnb serve</code> and <code>spamnb imap filter --watch</code> using this '
             f'store beats every {BEAT:g} s with what it counted since it started. A host is up while its last beat '
             f'is younger than {UP_BEATS} of its beats, silent after (stopped: it said so as it stopped); the hosts '
             f'that beat in the last hour are shown, newest beat first, {most} at most. Messages a minute: the '
             f'verdicts between its beat of about a minute before and its last. This page loads itself again '
             f'every {BEAT:g} s.</p>')
    body = (intro + hosts_table(view, most) + "<h2>The store</h2>" + store_servers(view["servers"]))
    return layout("Site", body, active="site", root=root, refresh=BEAT)


def error_page(status, text, nav=True, root=""):
    """An error; with ``nav`` (and the page's ``root``), the page's links."""
    return layout(f"{status}", f"<p>{e(text)}</p>", nav=nav, root=root)


STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#263238;color:#fff;padding:8px 16px;display:flex;gap:24px;align-items:center}
header a{color:#cfd8dc;margin-right:14px;text-decoration:none}header a.on{color:#fff;font-weight:bold}
main{padding:8px 16px;max-width:1200px}
table.list{border-collapse:collapse;width:100%}
table.list td,table.list th{border-bottom:1px solid #ddd;padding:6px;vertical-align:top;text-align:left}
.when{white-space:nowrap;color:#555}.from{color:#555;font-size:12px}.muted{color:#777}
.subject{font-weight:600;color:#111;overflow-wrap:anywhere}
.v{padding:1px 6px;border-radius:3px;color:#fff;font-size:12px;white-space:nowrap}
.v.spam{background:#c0392b}.v.ham{background:#2e7d32}.v.unsure{background:#e0a800;color:#222}
.moved{display:block;margin-top:4px;font-size:12px}
ul.clues{list-style:none;margin:4px 0 0;padding:0;display:flex;flex-wrap:wrap;gap:4px}
ul.clues li{font-size:12px;padding:0 4px;border-radius:3px}ul.clues li.s{background:#fbe3e0}
ul.clues li.h{background:#e3f1e4}code{overflow-wrap:anywhere}
ul.clues li.s b{color:#a32a1e}ul.clues li.h b{color:#1f6b24}ul.clues small{color:#555}
ul.clues li.more{border:1px dashed #999}ul.clues li.break{flex-basis:100%;height:0;padding:0}ul.clues li.prior{background:#eceff1}p.sum{margin:4px 0}
form.inline{display:inline}button{margin:2px;padding:3px 10px;cursor:pointer}
button.spam{background:#c0392b;color:#fff;border:0}button.ham{background:#2e7d32;color:#fff;border:0}
.flash{background:#fff8e1;border:1px solid #e0c060;padding:6px}
pre.source{white-space:pre-wrap;overflow-wrap:anywhere;background:#fff;border:1px solid #ddd;padding:8px;
max-height:600px;overflow:auto}
dl{display:grid;grid-template-columns:max-content auto;gap:2px 12px}dt{font-weight:600}
dd{margin:0;overflow-wrap:anywhere}
form.search{margin:8px 0;display:flex;gap:8px;flex-wrap:wrap;align-items:center}
form.batch{margin:8px 0}td.pick{width:1em}
form.scan textarea{display:block;width:100%;box-sizing:border-box;font:12px/1.3 monospace;margin:4px 0 8px}
.flash.error{background:#fdecea;border-color:#e0a0a0}#teach{margin:8px 0}
.pager{margin:10px 0}
.state{padding:1px 6px;border-radius:3px;color:#fff;font-size:12px}.state.up{background:#2e7d32}
.state.silent{background:#c0392b}.state.stopped{background:#78909c}
td.n{text-align:right;white-space:nowrap}td.name{font-weight:600;min-width:8em}td.st{white-space:nowrap}
table.site td{overflow-wrap:anywhere}
"""
