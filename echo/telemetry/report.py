"""report.html: one self-contained page (inline SVG, inline CSS, no script, no network).

Input is the summary dict the job writes as summary.json, so the report can be re-rendered from
a summary alone (`render_html(json.load(...))`). Every string that came from a log line is
escaped: source addresses and reasons are attacker-controlled text.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any, Final

from echo.telemetry.bins import bin_labels

W: Final = 760  # chart width in px; the page is one column
DASH: Final = "\u2013"  # en dash: "no value"
COLORS: Final = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2")


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _fmt(x: float | int | None, digits: int = 1) -> str:
    if x is None:
        return "\u2013"
    if isinstance(x, int):
        return f"{x:,}"
    return f"{x:,.{digits}f}"


def bar_chart(
    labels: Sequence[str], values: Sequence[float], *, title: str, unit: str = "", color: int = 0
) -> str:
    """Vertical bars, one per label (histograms)."""
    h, top, bottom, left = 220, 24, 46, 56
    n = max(1, len(values))
    vmax = max([*values, 1])
    bw = (W - left - 10) / n
    parts = [f'<text x="{left}" y="16" class="t">{_e(title)}</text>']
    for i, (label, v) in enumerate(zip(labels, values, strict=True)):
        bh = (h - top - bottom) * v / vmax
        x = left + i * bw
        y = h - bottom - bh
        parts.append(
            f'<rect x="{x + 2:.1f}" y="{y:.1f}" width="{bw - 4:.1f}" height="{bh:.1f}" '
            f'fill="{COLORS[color]}"><title>{_e(label)}: {_fmt(v)}{_e(unit)}</title></rect>'
            f'<text x="{x + bw / 2:.1f}" y="{y - 3:.1f}" class="v">{_fmt(v)}</text>'
            f'<text x="{x + bw / 2:.1f}" y="{h - bottom + 14}" class="l">{_e(label)}</text>'
        )
    parts.append(_axis(left, top, h - bottom, W - 10))
    return _svg(h, parts)


def hbar_chart(
    labels: Sequence[str], values: Sequence[float], *, title: str, color: int = 1
) -> str:
    """Horizontal bars (reasons, sources): long labels stay readable."""
    row, left = 22, 250
    h = 30 + row * max(1, len(values))
    vmax = max([*values, 1])
    parts = [f'<text x="4" y="16" class="t">{_e(title)}</text>']
    if not values:
        parts.append('<text x="4" y="40" class="l0">none</text>')
    for i, (label, v) in enumerate(zip(labels, values, strict=True)):
        y = 26 + i * row
        bw = (W - left - 80) * v / vmax
        parts.append(
            f'<text x="{left - 6}" y="{y + 14}" class="r">{_e(label)[:48]}</text>'
            f'<rect x="{left}" y="{y + 2}" width="{bw:.1f}" height="{row - 6}" '
            f'fill="{COLORS[color]}"><title>{_e(label)}: {_fmt(v)}</title></rect>'
            f'<text x="{left + bw + 4:.1f}" y="{y + 14}" class="l0">{_fmt(v)}</text>'
        )
    return _svg(h, parts)


def line_chart(times: Sequence[str], series: dict[str, Sequence[int]], *, title: str) -> str:
    """One line per series over time buckets (connections over time)."""
    h, top, bottom, left, right = 260, 30, 40, 56, W - 10
    n = len(times)
    vmax = max([1, *(max(v, default=0) for v in series.values())])

    def x(i: int) -> float:
        return left + (right - left) * (i / (n - 1) if n > 1 else 0.5)

    def y(v: float) -> float:
        return h - bottom - (h - top - bottom) * v / vmax

    parts = [f'<text x="{left}" y="16" class="t">{_e(title)}</text>']
    for k, (name, values) in enumerate(series.items()):
        pts = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(values))
        parts.append(
            f'<polyline points="{pts}" fill="none" stroke="{COLORS[k]}" stroke-width="1.5">'
            f"<title>{_e(name)}</title></polyline>"
            f'<rect x="{left + 10 + k * 175}" y="{top - 8}" width="10" height="10" '
            f'fill="{COLORS[k]}"/><text x="{left + 24 + k * 175}" y="{top + 1}" class="l0">'
            f"{_e(name)}</text>"
        )
    for i in sorted({0, n // 2, n - 1}) if n else []:
        parts.append(f'<text x="{x(i):.1f}" y="{h - bottom + 16}" class="l">{_e(times[i])}</text>')
    parts.append(f'<text x="{left - 4}" y="{y(vmax) + 4:.1f}" class="r">{_fmt(vmax)}</text>')
    parts.append(_axis(left, top, h - bottom, right))
    return _svg(h, parts)


def _axis(left: float, top: float, base: float, right: float) -> str:
    return (
        f'<line x1="{left}" y1="{base}" x2="{right}" y2="{base}" stroke="#888"/>'
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{base}" stroke="#888"/>'
    )


def _svg(h: int, parts: list[str]) -> str:
    return (
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {h}" '
        f'width="{W}" height="{h}" role="img">{"".join(parts)}</svg>'
    )


def _table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    if not rows:
        return "<p class=muted>none</p>"
    head = "".join(f"<th>{_e(c)}</th>" for c in columns)
    body = "".join(
        "<tr>"
        + "".join(f"<td>{_e(_fmt(r[c]) if isinstance(r[c], int) else r[c])}</td>" for c in columns)
        + "</tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


CSS: Final = """
body{font:14px system-ui,sans-serif;margin:24px auto;max-width:800px;color:#111}
h1{font-size:22px}h2{font-size:17px;margin-top:32px;border-bottom:1px solid #ddd}
.cards{display:flex;flex-wrap:wrap;gap:10px}.card{border:1px solid #ddd;border-radius:6px;
padding:8px 12px;min-width:120px}.card b{display:block;font-size:20px}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;
text-align:right}td:first-child,th:first-child{text-align:left;font-family:monospace}
.chart text{font:11px system-ui,sans-serif}.chart .t{font-weight:bold;font-size:13px}
.chart .l{text-anchor:middle}.chart .v{text-anchor:middle;fill:#333}.chart .r{text-anchor:end}
.muted{color:#777}pre{background:#f5f5f5;padding:6px;overflow-x:auto}
"""


def _waits(w: dict[str, Any]) -> str:
    return f"p50 {_fmt(w['p50'])} s · p90 {_fmt(w['p90'])} s · p99 {_fmt(w['p99'])} s"


def _sizes_chart(sizes: dict[str, int], title: str, color: int) -> str:
    return bar_chart(list(sizes), list(sizes.values()), title=title, color=color)


def _lobby_section(lob: dict[str, Any]) -> list[str]:
    """Lobbies (echo-lobby --events): sizes, waits, chat and refusals."""
    fill, start, chat, refusals = (
        lob["time_to_fill_s"],
        lob["time_to_start_s"],
        lob["chat"],
        lob["refusals"],
    )
    cards = [
        ("lobbies", lob["created"]),
        ("re-homed", lob["rehomed"]),
        ("joins", lob["joins"]),
        ("started", lob["started"]),
        ("never filled", fill["never"]),
        ("chat lines", chat["lines"]),
        ("chat bytes", chat["bytes"]),
        ("refusals", refusals["total"]),
        # absent in a summary.json written before these events were counted
        ("seats resumed", lob.get("resumed", 0)),
        ("matches", lob.get("matched", {}).get("matches", 0)),
        ("players matched", lob.get("matched", {}).get("members", 0)),
    ]
    by_code = sorted(refusals["by_code"].items(), key=lambda kv: -kv[1])
    left = sorted(lob["left"].items(), key=lambda kv: -kv[1])
    return [
        "<h2>Lobbies</h2>",
        f"<p class=muted>lobby servers: {_e(', '.join(lob['servers']) or DASH)}</p>",
        '<div class="cards">',
        *(f'<div class="card">{_e(k)}<b>{_fmt(v)}</b></div>' for k, v in cards),
        "</div>",
        _sizes_chart(lob["sizes"]["at_start"], "lobbies by members at start", 2),
        _sizes_chart(lob["sizes"]["peak"], "lobbies by most members at once", 0),
        f"<p>time to fill (to full, or to start if earlier): {_waits(fill)}</p>",
        bar_chart(bin_labels(fill["edges"], "s"), fill["histogram"], title="time to fill"),
        f"<p>time to start: {_waits(start)}</p>",
        bar_chart(
            bin_labels(start["edges"], "s"), start["histogram"], title="time to start", color=3
        ),
        f"<p>{_fmt(chat['lines'])} chat lines, {_fmt(chat['bytes'])} bytes, in "
        f"{_fmt(chat['lobbies_with_chat'])} lobbies · {_fmt(chat['bytes_per_line'])} "
        "bytes per line</p>",
        hbar_chart(
            [k for k, _ in by_code], [v for _, v in by_code], title="requests refused, by code"
        ),
        hbar_chart(
            [k for k, _ in left], [v for _, v in left], title="members left, by reason", color=0
        ),
    ]


def render_html(s: dict[str, Any]) -> str:
    """The whole report page for a summary dict."""
    out = [
        *_head(s),
        *_connections_section(s),
        *_rejections_section(s),
        *_abuse_section(s),
        *_lifetimes_section(s),
        *_rtt_section(s),
    ]
    lobbies = s.get("lobbies")  # absent in a summary.json written before the lobby service
    if lobbies and lobbies["created"] + lobbies["joins"] + lobbies["refusals"]["total"]:
        out.extend(_lobby_section(lobbies))
    out.extend(_quality_section(s))
    out.append("</body></html>\n")
    return "\n".join(out)


def _head(s: dict[str, Any]) -> list[str]:
    """The page's head, title, time span and headline cards."""
    cards = [
        ("events", s["events_total"]),
        ("bad lines", s["bad_lines"]),
        ("HELLOs", s["hello_received"]),
        ("rejected", s["hello_rejected_total"]),
        ("duologues", s["duologues_created"]),
        ("joined", s["duologues_connected"]),
        ("never joined", s["duologues_expired"]),
        ("sources", s["distinct_sources"]),
    ]
    return [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        "<title>echo telemetry report</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>echo server telemetry</h1>",
        f"<p class=muted>{_e(s['first_ts'])} → {_e(s['last_ts'])} · servers: "
        f"{_e(', '.join(s['servers']) or DASH)} · {_fmt(s['lines_total'])} lines read</p>",
        '<div class="cards">',
        *(f'<div class="card">{_e(k)}<b>{_fmt(v)}</b></div>' for k, v in cards),
        "</div>",
    ]


def _connections_section(s: dict[str, Any]) -> list[str]:
    cot = s["connections_over_time"]
    times = [p["t"] for p in cot["series"]]
    names = ("hello_received", "duologue_created", "duologue_connected", "hello_rejected")
    return [
        f"<h2>Connections over time</h2><p class=muted>per {cot['bucket_s'] // 60} min</p>",
        line_chart(
            times, {n: [p[n] for p in cot["series"]] for n in names}, title="events per bucket"
        ),
    ]


def _rejections_section(s: dict[str, Any]) -> list[str]:
    rej = sorted(s["hello_rejected"].items(), key=lambda kv: -kv[1])
    closed = sorted(s["duologues_closed"].items(), key=lambda kv: -kv[1])
    return [
        "<h2>Rejections</h2>",
        hbar_chart([k for k, _ in rej], [v for _, v in rej], title="HELLOs rejected, by reason"),
        hbar_chart(
            [k for k, _ in closed],
            [v for _, v in closed],
            title="duologues closed, by reason",
            color=0,
        ),
    ]


def _abuse_section(s: dict[str, Any]) -> list[str]:
    top = s["top_sources"]
    cols = ("source", "rejections", "duologues", "expiries")
    rows = top["by_rejections"][:10]
    return [
        "<h2>Abuse candidates</h2>",
        "<p class=muted>Many rejections or many never-joined duologues from one address or "
        "one IPv6 /64 is what a per-IP flood or a spoofer looks like.</p>",
        hbar_chart(
            [r["source"] for r in rows],
            [r["rejections"] for r in rows],
            title="top sources by rejections",
        ),
        "<h3>Sources by rejections</h3>" + _table(top["by_rejections"], cols),
        "<h3>Sources by duologues</h3>" + _table(top["by_duologues"], cols),
        "<h3>IPv6 prefixes by rejections</h3>" + _table(top["prefixes_by_rejections"], cols),
        "<h3>IPv6 prefixes by duologues</h3>" + _table(top["prefixes_by_duologues"], cols),
    ]


def _lifetimes_section(s: dict[str, Any]) -> list[str]:
    life = s["lifetime_s"]
    msgs = s["messages"]
    return [
        "<h2>Duologue lifetimes</h2>",
        f"<p>{_fmt(life['count'])} joined duologues · p50 {_fmt(life['p50'])} s · "
        f"p90 {_fmt(life['p90'])} s · p99 {_fmt(life['p99'])} s</p>",
        bar_chart(bin_labels(life["edges"], "s"), life["histogram"], title="lifetime (seconds)"),
        "<h2>Messages per duologue</h2>",
        f"<p>{_fmt(msgs['total'])} echoes answered · mean {_fmt(msgs['mean'])} per duologue</p>",
        bar_chart(
            bin_labels(msgs["edges"]), msgs["histogram"], title="echoes per duologue", color=2
        ),
    ]


def _rtt_section(s: dict[str, Any]) -> list[str]:
    rtt = s["client_rtt"]
    out = ["<h2>Echo round trips (reported by clients)</h2>"]
    if rtt["clients_with_rtt"]:
        keys = ("rtt_ms_p50", "rtt_ms_p90", "rtt_ms_p99", "rtt_ms_max")
        out.append(
            bar_chart(
                [k[7:] for k in keys],
                [rtt[k]["median"] or 0.0 for k in keys],
                title="median client's round trip by percentile (ms)",
                unit=" ms",
                color=3,
            )
        )
        out.append(
            bar_chart(
                bin_labels(rtt["p50_edges_ms"], "ms"),
                rtt["p50_histogram"],
                title="clients by their median round trip",
                color=3,
            )
        )
    out.append(
        f"<p>{_fmt(rtt['clients'])} client summaries, states: "
        f"{_e(', '.join(f'{k} {v}' for k, v in rtt['states'].items()) or DASH)}</p>"
    )
    return out


def _quality_section(s: dict[str, Any]) -> list[str]:
    out = [
        "<h2>Input quality</h2>",
        f"<p>{_fmt(s['bad_lines'])} bad lines of {_fmt(s['lines_total'])}; "
        f"{_fmt(s['unknown_events'])} events of types this job does not know.</p>",
    ]
    if s["bad_line_samples"]:
        out.append("<pre>" + "\n".join(_e(x) for x in s["bad_line_samples"]) + "</pre>")
    return out
