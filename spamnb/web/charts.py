"""The Overview's pictures, drawn here as inline SVG: readable without JavaScript,
no charting library, and nothing fetched. Every text in them is escaped.

One chart shape serves all three: stacked bars over a category axis (days, or
score bins), with optional vertical markers (the cut-offs).
"""

from __future__ import annotations

from html import escape

COLOURS = {"spam": "#c0392b", "ham": "#2e7d32", "unsure": "#e0a800", "false positive": "#8e24aa",
           "false negative": "#1565c0", "unsure taught": "#e0a800"}
W, H, LEFT, BOTTOM, TOP = 720, 220, 44, 36, 14


def stacked_bars(title, labels, series, *, markers=(), tick_every=1, x_range=None):
    """An SVG of bars stacked by series.

    ``labels``: one per bar (shown every ``tick_every``); ``series``:
    ``{name: [value per bar]}``; ``markers``: ``(x, text)`` vertical lines,
    ``x`` in the units of ``x_range`` = ``(lo, hi)`` spanning the bars.
    """
    n = max(len(labels), 1)
    totals = [sum(vals[i] for vals in series.values()) for i in range(len(labels))]
    top = max(totals, default=0) or 1
    plot_w, plot_h = W - LEFT - 10, H - BOTTOM - TOP
    bw = plot_w / n
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H + 18}" width="{W}" height="{H + 18}" '
           f'role="img" aria-label="{escape(title)}"><title>{escape(title)}</title>',
           f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{W - 10}" y2="{TOP + plot_h}" stroke="#555"/>',
           f'<text x="{LEFT - 6}" y="{TOP + 4}" text-anchor="end" font-size="11">{top}</text>',
           f'<text x="{LEFT - 6}" y="{TOP + plot_h}" text-anchor="end" font-size="11">0</text>']
    for i, label in enumerate(labels):
        y = TOP + plot_h
        for name, vals in series.items():
            v = vals[i]
            if not v:
                continue
            h = plot_h * v / top
            y -= h
            out.append(f'<rect x="{LEFT + i * bw + 1:.1f}" y="{y:.1f}" width="{max(bw - 2, 1):.1f}" height="{h:.1f}" '
                       f'fill="{COLOURS.get(name, "#607d8b")}"><title>{escape(str(label))}: {v} '
                       f'{escape(name)}</title></rect>')
        if i % tick_every == 0:
            out.append(f'<text x="{LEFT + i * bw + bw / 2:.1f}" y="{TOP + plot_h + 14}" text-anchor="middle" '
                       f'font-size="10">{escape(str(label))}</text>')
    if x_range:
        lo, hi = x_range
        for i, (x, text) in enumerate(markers):  # the first labelled to its left, the others to their right
            px = LEFT + plot_w * (min(max(x, lo), hi) - lo) / (hi - lo)
            side = f'x="{px - 3:.1f}" text-anchor="end"' if i == 0 else f'x="{px + 3:.1f}"'
            out.append(f'<line x1="{px:.1f}" y1="{TOP - 4}" x2="{px:.1f}" y2="{TOP + plot_h}" stroke="#000" '
                       f'stroke-dasharray="4 3"/><text {side} y="{TOP + 8 + 14 * i}" font-size="11">'
                       f'{escape(text)}</text>')
    x = LEFT
    for name in series:
        out.append(f'<rect x="{x}" y="{H + 4}" width="10" height="10" fill="{COLOURS.get(name, "#607d8b")}"/>'
                   f'<text x="{x + 14}" y="{H + 13}" font-size="11">{escape(name)}</text>')
        x += 24 + 7 * len(name)
    out.append("</svg>")
    return "".join(out)
