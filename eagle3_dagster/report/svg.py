"""Inline SVG charts for the offline report: no scripts, no fonts, no network, one string each.

Every chart has a title, labelled axes with units, tick values, and the count or value written on
each bar, so it can be read without hovering (there is no script to hover with). Sizes are fixed
in CSS pixels (about 520 x 260) so two charts sit side by side in a 1280 px wide window.

    histogram(title, edges, counts, x_label=..., y_label=...)
    bars(title, labels, values, Axes(y_label=..., value_fmt=...))
    grouped_bars(title, categories, {"before": [...], "after": [...]}, Axes(y_label=...))
    hbars(title, [(label, value, note)], x_label=..., max_value=...)
    intervals(title, [(label, point, lo, hi, note)], x_label=..., marks={"margin": 0.05})
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

WIDTH, HEIGHT = 520, 260
MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 62, 16, 34, 58
COLORS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948")
_FONT = 'font-family="system-ui,Helvetica,Arial,sans-serif"'


def _e(v: object) -> str:
    return html.escape(str(v), quote=True)


def _nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if v <= m * exp:
            return m * exp
    return 10 * exp


def _num(v: float) -> str:
    if abs(v) >= 10_000:
        return f"{v / 1000:.0f}k"
    if abs(v) >= 1000:
        return f"{v / 1000:.1f}k".replace(".0k", "k")
    if float(v).is_integer():
        return str(int(v))
    return f"{v:.2f}".rstrip("0").rstrip(".")


def _frame(
    title: str,
    body: list[str],
    *,
    x_label: str,
    y_label: str,
    width: int = WIDTH,
    height: int = HEIGHT,
    legend: Sequence[tuple[str, str]] = (),
) -> str:
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{_e(title)}" {_FONT} font-size="11">',
        f"<title>{_e(title)}</title>",
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fff"/>',
        f'<text x="{width / 2:.0f}" y="18" text-anchor="middle" font-size="13" font-weight="bold">{_e(title)}</text>',
        f'<text x="{(MARGIN_L + width - MARGIN_R) / 2:.0f}" y="{height - 8}" text-anchor="middle">{_e(x_label)}</text>',
        f'<text x="14" y="{(MARGIN_T + height - MARGIN_B) / 2:.0f}" text-anchor="middle" '
        f'transform="rotate(-90 14 {(MARGIN_T + height - MARGIN_B) / 2:.0f})">{_e(y_label)}</text>',
    ]
    lx = width - MARGIN_R
    for name, color in reversed(list(legend)):
        lx -= 8 + 7 * len(name) + 16
        out.append(
            f'<rect x="{lx}" y="{MARGIN_T - 12}" width="10" height="10" fill="{color}"/>'
            f'<text x="{lx + 14}" y="{MARGIN_T - 3}">{_e(name)}</text>'
        )
    out.extend(body)
    out.append("</svg>")
    return "".join(out)


def _y_axis(top: float, *, width: int = WIDTH, height: int = HEIGHT, fmt: Callable[[float], str] = _num) -> list[str]:
    plot_h = height - MARGIN_T - MARGIN_B
    out = []
    for i in range(5):
        v = top * i / 4
        y = height - MARGIN_B - plot_h * i / 4
        out.append(
            f'<line x1="{MARGIN_L}" x2="{width - MARGIN_R}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e3e3e3"/>'
            f'<text x="{MARGIN_L - 5}" y="{y + 4:.1f}" text-anchor="end">{_e(fmt(v))}</text>'
        )
    out.append(
        f'<line x1="{MARGIN_L}" x2="{MARGIN_L}" y1="{MARGIN_T}" y2="{height - MARGIN_B}" stroke="#333"/>'
        f'<line x1="{MARGIN_L}" x2="{width - MARGIN_R}" y1="{height - MARGIN_B}" y2="{height - MARGIN_B}" '
        f'stroke="#333"/>'
    )
    return out


def empty(title: str, note: str = "no data") -> str:
    return _frame(
        title,
        [f'<text x="{WIDTH / 2:.0f}" y="{HEIGHT / 2:.0f}" text-anchor="middle" fill="#777">{_e(note)}</text>'],
        x_label="",
        y_label="",
    )


def histogram(
    title: str,
    edges: Sequence[float],
    counts: Sequence[int],
    *,
    x_label: str = "length (tokens)",
    y_label: str = "samples",
) -> str:
    """Bars over [edges[i], edges[i+1]); the count on each non-empty bar, n in the title."""
    if not counts or sum(counts) == 0:
        return empty(title)
    n = sum(counts)
    top = _nice_max(max(counts))
    if top < 20:  # small counts: whole-number ticks
        top = 4 * math.ceil(max(counts) / 4)
    plot_w = WIDTH - MARGIN_L - MARGIN_R
    plot_h = HEIGHT - MARGIN_T - MARGIN_B
    bw = plot_w / len(counts)
    body = _y_axis(top)
    for i, c in enumerate(counts):
        h = plot_h * c / top
        x = MARGIN_L + i * bw
        y = HEIGHT - MARGIN_B - h
        body.append(
            f'<rect x="{x + 1:.1f}" y="{y:.1f}" width="{max(bw - 2, 1):.1f}" height="{h:.1f}" '
            f'fill="{COLORS[0]}"><title>{_e(_num(edges[i]))}-{_e(_num(edges[i + 1]))} tokens: {c}</title></rect>'
        )
        if c:
            body.append(f'<text x="{x + bw / 2:.1f}" y="{y - 3:.1f}" text-anchor="middle" font-size="9">{c}</text>')
    step = max(1, len(counts) // 5)
    for i in range(0, len(edges), step):
        x = MARGIN_L + i * bw
        body.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{HEIGHT - MARGIN_B}" y2="{HEIGHT - MARGIN_B + 4}" stroke="#333"/>'
            f'<text x="{x:.1f}" y="{HEIGHT - MARGIN_B + 16}" text-anchor="middle">{_e(_num(edges[i]))}</text>'
        )
    return _frame(f"{title} (n={n})", body, x_label=x_label, y_label=y_label)


@dataclass(frozen=True)
class Axes:
    """A bar chart's axes: their labels, how a value on a bar (`value_fmt`) and a tick (`axis_fmt`) are
    written, and the top of the value axis (None: a round number over the largest value)."""

    x_label: str = ""
    y_label: str = ""
    value_fmt: Callable[[float], str] = _num
    axis_fmt: Callable[[float], str] = _num
    top: float | None = None


def bars(title: str, labels: Sequence[str], values: Sequence[float], axes: Axes = Axes()) -> str:
    """One bar per label, its value written on top."""
    if not values:
        return empty(title)
    return grouped_bars(title, labels, {"": list(values)}, axes)


def grouped_bars(
    title: str, categories: Sequence[str], series: dict[str, Sequence[float | None]], axes: Axes = Axes()
) -> str:
    """Per category one bar per series (e.g. before / after), values written on the bars; a missing
    value (None) is marked "n/a"."""
    if not categories:
        return empty(title)
    x_label, y_label, value_fmt, axis_fmt, top = axes.x_label, axes.y_label, axes.value_fmt, axes.axis_fmt, axes.top
    vals = [v for s in series.values() for v in s if v is not None]
    top = top if top is not None else _nice_max(max(vals) if vals else 0.0)
    plot_w = WIDTH - MARGIN_L - MARGIN_R
    plot_h = HEIGHT - MARGIN_T - MARGIN_B
    gw = plot_w / len(categories)
    k = max(len(series), 1)
    bw = min(48.0, (gw - 10) / k)
    body = _y_axis(top, fmt=axis_fmt)
    for ci, cat in enumerate(categories):
        gx = MARGIN_L + ci * gw + (gw - bw * k) / 2
        for si, (name, s) in enumerate(series.items()):
            v = s[ci] if ci < len(s) else None
            x = gx + si * bw
            if v is None:
                body.append(
                    f'<text x="{x + bw / 2:.1f}" y="{HEIGHT - MARGIN_B - 4}" text-anchor="middle" '
                    f'font-size="9" fill="#777">n/a</text>'
                )
                continue
            h = plot_h * min(float(v), top) / top if top else 0.0
            y = HEIGHT - MARGIN_B - h
            label = f"{name}: " if name else ""
            body.append(
                f'<rect x="{x + 1:.1f}" y="{y:.1f}" width="{max(bw - 2, 1):.1f}" height="{h:.1f}" '
                f'fill="{COLORS[si % len(COLORS)]}"><title>{_e(cat)} {_e(label)}{_e(value_fmt(v))}</title></rect>'
                f'<text x="{x + bw / 2:.1f}" y="{y - 3:.1f}" text-anchor="middle" font-size="9">'
                f"{_e(value_fmt(v))}</text>"
            )
        body.append(
            f'<text x="{MARGIN_L + ci * gw + gw / 2:.1f}" y="{HEIGHT - MARGIN_B + 16}" text-anchor="middle">'
            f"{_e(cat)}</text>"
        )
    legend = [(n, COLORS[i % len(COLORS)]) for i, n in enumerate(series) if n] if len(series) > 1 else []
    return _frame(title, body, x_label=x_label, y_label=y_label, legend=legend)


def hbars(
    title: str,
    rows: Sequence[tuple[str, float, str]],
    *,
    x_label: str = "",
    max_value: float = 1.0,
    value_fmt: Callable[[float], str] = lambda v: f"{100 * v:.1f}%",
    color: str | None = None,
) -> str:
    """Horizontal bars (label, value, note): e.g. pass rate per source, with 'n rows' as the note."""
    if not rows:
        return empty(title)
    left = 150
    row_h = 22
    height = MARGIN_T + row_h * len(rows) + 46
    plot_w = WIDTH - left - 135
    body = []
    for i in range(5):
        x = left + plot_w * i / 4
        body.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{MARGIN_T}" y2="{height - 40}" stroke="#e3e3e3"/>'
            f'<text x="{x:.1f}" y="{height - 26}" text-anchor="middle">{_e(value_fmt(max_value * i / 4))}</text>'
        )
    for i, (label, v, note) in enumerate(rows):
        y = MARGIN_T + i * row_h
        w = plot_w * max(0.0, min(float(v), max_value)) / max_value if max_value else 0.0
        short = label if len(label) <= 22 else label[:21] + "…"
        body.append(
            f'<text x="{left - 6}" y="{y + 15}" text-anchor="end">{_e(short)}</text>'
            f'<rect x="{left}" y="{y + 3}" width="{w:.1f}" height="{row_h - 6}" fill="{color or (COLORS[2] if v >= 0.999 else COLORS[1])}">'
            f"<title>{_e(label)}: {_e(value_fmt(v))} ({_e(note)})</title></rect>"
            f'<text x="{left + w + 4:.1f}" y="{y + 15}" font-size="10">{_e(value_fmt(v))} · {_e(note)}</text>'
        )
    body.append(f'<line x1="{left}" x2="{left}" y1="{MARGIN_T}" y2="{height - 40}" stroke="#333"/>')
    return _frame(title, body, x_label=x_label, y_label="", height=height)


def _span(rows: Sequence[tuple[str, float, float, float, str]], marks: dict[str, float]) -> tuple[float, float]:
    vals = [v for _, p, lo, hi, _ in rows for v in (p, lo, hi) if math.isfinite(v)] + [0.0, *marks.values()]
    lo, hi = min(vals), max(vals)
    pad = (hi - lo) * 0.08 or 0.1
    return lo - pad, hi + pad


def intervals(
    title: str,
    rows: Sequence[tuple[str, float, float, float, str]],
    *,
    x_label: str = "",
    marks: dict[str, float] | None = None,
    value_fmt: Callable[[float], str] = lambda v: f"{v:+.3f}",
) -> str:
    """One horizontal interval per row (label, point, lo, hi, note: e.g. the verdict), a dot at the point, a
    solid line at 0 and a dashed one at each mark (e.g. the promotion margin). A row without an interval
    (nan) shows its point alone."""
    if not rows:
        return empty(title)
    marks = marks or {}
    left, row_h = 150, 24
    height = MARGIN_T + row_h * len(rows) + 52
    plot_w = WIDTH - left - 120
    x0, x1 = _span(rows, marks)

    def x(v: float) -> float:
        return left + plot_w * (v - x0) / (x1 - x0)

    body = [f'<line x1="{x(0):.1f}" x2="{x(0):.1f}" y1="{MARGIN_T - 4}" y2="{height - 40}" stroke="#333"/>']
    for name, v in marks.items():
        body.append(
            f'<line x1="{x(v):.1f}" x2="{x(v):.1f}" y1="{MARGIN_T - 4}" y2="{height - 40}" stroke="#999" '
            f'stroke-dasharray="4 3"/><text x="{x(v) + 3:.1f}" y="{MARGIN_T - 6}" font-size="9" fill="#777">{_e(name)}</text>'
        )
    for i in range(5):
        v = x0 + (x1 - x0) * i / 4
        body.append(f'<text x="{x(v):.1f}" y="{height - 26}" text-anchor="middle">{_e(value_fmt(v))}</text>')
    for i, (label, point, lo, hi, note) in enumerate(rows):
        y = MARGIN_T + i * row_h + row_h / 2
        short = label if len(label) <= 22 else label[:21] + "…"
        color = COLORS[2] if lo > 0 else COLORS[3] if hi < 0 else COLORS[0]
        said = f"{value_fmt(point)} [{value_fmt(lo)}, {value_fmt(hi)}]" if math.isfinite(lo) else value_fmt(point)
        if math.isfinite(lo) and math.isfinite(hi):
            body.append(
                f'<line x1="{x(lo):.1f}" x2="{x(hi):.1f}" y1="{y:.1f}" y2="{y:.1f}" stroke="{color}" stroke-width="3"/>'
            )
        body.append(
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{_e(short)}</text>'
            f'<circle cx="{x(point):.1f}" cy="{y:.1f}" r="4" fill="{color}"><title>{_e(label)}: {_e(said)} '
            f"({_e(note)})</title></circle>"
            f'<text x="{left + plot_w + 6}" y="{y + 4:.1f}" font-size="10">{_e(note)}</text>'
        )
    return _frame(title, body, x_label=x_label, y_label="", height=height)
