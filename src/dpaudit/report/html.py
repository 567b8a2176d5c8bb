"""Self-contained HTML pages: one per audit (``report.html`` beside ``results.json``) and one per
sweep (``dpaudit-aggregate --html``). No network and no server: the styles are inline and the
plots are embedded as data URIs, so a page opens from a mail attachment and prints to PDF.

The pages render blocks made elsewhere (``experiment.judging.outputs.report_blocks``: the same
blocks the console table prints), with cells formatted by ``files.cell_text`` as the console
formats them: no statistic is formatted a second time here.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from dpaudit.report import numbers
from dpaudit.report.files import cell_text
from dpaudit.report.plots import verdict_colour as _plot_colour

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto;
       max-width: 72rem; padding: 0 1rem; color: #1b1b1b; line-height: 1.4; }
h1 { font-size: 1.5rem; margin-bottom: .3rem; } h2 { font-size: 1.15rem; margin-top: 1.8rem;
     border-bottom: 1px solid #ddd; padding-bottom: .2rem; }
.banner { color: #fff; padding: .8rem 1rem; border-radius: .4rem; font-weight: 600; }
.banner .detail { font-weight: 400; display: block; margin-top: .3rem; }
table { border-collapse: collapse; margin: .5rem 0; font-size: .9rem; }
th, td { border: 1px solid #ddd; padding: .25rem .5rem; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
th { background: #f4f4f4; } p.line { margin: .3rem 0; }
img { max-width: 100%; border: 1px solid #eee; margin: .5rem 0; }
code, pre { font-family: ui-monospace, monospace; font-size: .85rem; }
pre { background: #f7f7f7; padding: .6rem; overflow-x: auto; white-space: pre-wrap; }
@media print { body { margin: 0; max-width: none; } details { display: none; } }
"""


def audit_page(result: Mapping, blocks: Sequence[Mapping], banner: str,
               images: Mapping[str, Path], title: str = "dpaudit audit") -> str:
    """The audit's page (module doc), in the console's order after the verdict banner.

    Args:
        result: the results (``results.json``'s dictionary).
        blocks: ``report_blocks(result)``: threat model and claim, claim test, bounds,
            white-box checks, notes, the verdict's message.
        banner: the verdict in a few words, led by what decided it.
        images: caption -> PNG file, embedded in this order.
        title: the page's heading.
    """
    status = str((result.get("verdict") or {}).get("status", ""))
    bracket = bracket_svg((result.get("verdict") or {}).get("training_data"))
    parts = [
        f"<h1>{_e(title)}</h1>",
        *([bracket] if bracket else []),
        f'<div class="banner" id="verdict" data-status="{_e(status)}" '
        f'style="background:{verdict_colour(status)}">{_e(banner)}</div>',
    ]
    for block in blocks:
        parts.append(f'<section id="{_e(block.get("id", ""))}">')
        if block.get("title"):
            parts.append(f"<h2>{_e(block['title'])}</h2>")
        if "table" in block:
            parts.append(table(block["table"]) if block["table"] else "<p>(none)</p>")
        parts += [f'<p class="line">{_e(line)}</p>' for line in block.get("lines", [])]
        parts.append("</section>")
    if images:
        parts.append('<section id="plots"><h2>plots</h2>')
        parts += [figure(caption, path) for caption, path in images.items()]
        parts.append("</section>")
    parts += _key_values("canaries", result.get("canary_info"))
    parts += _key_values("timing", result.get("timing"))
    parts += _key_values("provenance", result.get("provenance"))
    settings = result.get("settings")
    if settings:
        parts.append('<section id="settings"><h2>settings</h2><details><summary>the resolved '
                     "settings (as in results.json)</summary><pre>"
                     + _e(json.dumps(settings, indent=2, default=str)) + "</pre></details>"
                     "</section>")
    return page(title, "\n".join(parts))


def bracket_svg(training: Mapping | None, width: int = 720) -> str:
    """The user's epsilon on a line, between the certified lower side and the measured upper
    side (an inline SVG figure; empty when there is no claimed epsilon to draw).

    The claim (Opacus' accountant) is a diamond, the measured upper side a bar that closes
    the bracket from above (solid when verified, dashed when not), the certified lower side
    one that closes it from below (at 0, dashed, when there is none)."""
    if not training or training.get("epsilon_claimed") is None:
        return ""
    claimed = float(training["epsilon_claimed"])
    upper, lower = training.get("epsilon_upper"), training.get("epsilon_lower")
    top = max(v for v in (claimed, upper, lower) if v is not None) * 1.25 or 1.0
    x0, x1, y = 40, width - 40, 70

    def x(v: float) -> float:
        return x0 + (x1 - x0) * min(max(v / top, 0.0), 1.0)

    verified = training.get("upper_status") == "verified"
    low_x = x(lower) if lower is not None else x(0.0)
    high_x = x(upper) if upper is not None else x1
    items = [
        f'<line x1="{x0}" y1="{y}" x2="{x1}" y2="{y}" stroke="#555" stroke-width="1.5"/>',
        f'<rect x="{low_x:.1f}" y="{y - 14}" width="{max(high_x - low_x, 1):.1f}" height="28" '
        'fill="#2a7ab9" fill-opacity="0.15"/>',
    ]
    for v in (0.0, top / 2, top):
        items.append(f'<text x="{x(v):.1f}" y="{y + 32}" font-size="11" text-anchor="middle" '
                     f'fill="#555">{numbers.point(v)}</text>')

    def bar(at: float, label: str, solid: bool, anchor: str, colour: str) -> str:
        dash = "" if solid else ' stroke-dasharray="4 3"'
        return (f'<line x1="{at:.1f}" y1="{y - 20}" x2="{at:.1f}" y2="{y + 20}" '
                f'stroke="{colour}" stroke-width="3"{dash}/><text x="{at:.1f}" y="{y - 26}" '
                f'font-size="12" text-anchor="{anchor}" fill="{colour}">{_e(label)}</text>')

    items.append(bar(low_x, f"certified >= {numbers.lower(lower)}" if lower is not None else
                     "no certified lower side", lower is not None, "start", "#1a7f37"))
    if upper is not None:
        items.append(bar(high_x, ("verified" if verified else "measured")
                         + f" <= {numbers.upper(upper)}", verified,
                         "end" if high_x > x1 - 80 else "middle", "#b42318"))
    cx = x(claimed)
    items.append(f'<path d="M {cx:.1f} {y - 8} L {cx + 8:.1f} {y} L {cx:.1f} {y + 8} '
                 f'L {cx - 8:.1f} {y} Z" fill="#111"/><text x="{cx:.1f}" y="{y + 50}" '
                 f'font-size="12" text-anchor="middle">claimed {numbers.point(claimed)} '
                 f'({_e(str(training.get("accountant", "")).upper())})</text>')
    caption = (f"your training's epsilon ({str(training.get('accountant', '')).upper()}, "
               f"delta {float(training.get('delta', 0)):.2g}): the diamond is the claim, the "
               "bracket runs from the certified lower side to the measured upper side")
    return (f'<figure id="bracket"><svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
            f'height="130" role="img" aria-label="{_e(caption)}">{"".join(items)}</svg>'
            f"<figcaption>{_e(caption)}</figcaption></figure>")


def page(title: str, body: str) -> str:
    """A complete HTML document around ``body``, with the inline style."""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{_e(title)}</title><style>{_STYLE}</style></head>\n<body>\n{body}\n"
            "</body></html>\n")


def table(rows: Sequence[Mapping], columns: Sequence[str] | None = None,
          links: Mapping[str, Sequence[str | None]] | None = None,
          colours: Sequence[str | None] | None = None) -> str:
    """``rows`` as an HTML table, cells as the console formats them; ``links``: column ->
    one href per row (None: plain); ``colours``: one background per row (None: none)."""
    cols = list(columns) if columns is not None else list(rows[0].keys()) if rows else []
    head = "".join(f"<th>{_e(c)}</th>" for c in cols)
    body = []
    for i, r in enumerate(rows):
        cells = []
        for c in cols:
            value = r.get(c, "")
            text = _e(cell_text(value))
            href = (links or {}).get(c, [None] * len(rows))[i]
            if href:
                text = f'<a href="{_e(href)}">{text}</a>'
            num = isinstance(value, (int, float)) and not isinstance(value, bool)
            cells.append(f'<td class="num">{text}</td>' if num else f"<td>{text}</td>")
        colour = colours[i] if colours else None
        style = f' style="background:{colour}22"' if colour else ""
        body.append(f"<tr{style}>{''.join(cells)}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def figure(caption: str, path: str | Path) -> str:
    """A PNG embedded as a data URI, with its caption."""
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return (f'<figure><img alt="{_e(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{_e(caption)}</figcaption></figure>")


def _key_values(name: str, mapping) -> list[str]:
    if not isinstance(mapping, Mapping) or not mapping:
        return []
    rows = [{"key": k, "value": _summary(v)} for k, v in mapping.items()]
    return [f'<section id="{name}"><h2>{name}</h2>', table(rows, ["key", "value"]), "</section>"]


def _summary(value):
    """A value for a key/value row: scalars as they are, long lists by their length."""
    if isinstance(value, (list, tuple)) and len(value) > 8:
        return f"{len(value)} values: {', '.join(map(str, value[:4]))}, ..."
    if isinstance(value, Mapping):
        return json.dumps(value, default=str)[:300]
    return value


def verdict_colour(status: str | None) -> str:
    """The verdict's colour as the plots mark it, as a CSS colour (grey if unknown)."""
    colour = _plot_colour(status)
    return colour if colour.startswith("#") else "#555555"


def sweep_page(summary: Mapping, plot: Path | None, key: str | None) -> str:
    """A sweep's page: every job's verdict and numbers (coloured as the plots colour them,
    linked to the job's own page when it has one) and the swept setting's plot.

    Args:
        summary: ``collect_sweep``'s summary (``sweep_summary.json``).
        plot: the swept setting against epsilon and sigma_upper (``plots.plot_sweep``), or None.
        key: the swept setting's name, or None when no numeric setting varies.
    """
    root = Path(summary["directory"])
    rows = list(summary.get("jobs", []))
    cols = ["job", "overrides", "status", "eps_certified", "eps_estimate", "eps_claimed",
            "sigma_configured", "sigma_upper", "privacy_bug"]
    shown = [{**r, "privacy_bug": "YES" if r["privacy_bug"] else "no"} for r in rows]
    links = [f"{r['job']}/report.html" if (root / r["job"] / "report.html").exists() else None
             for r in rows]
    parts = [f"<h1>dpaudit sweep: {_e(root.name)}</h1>",
             f"<p class=\"line\">{len(rows)} finished audit(s) in {_e(root)}"
             + (f"; swept: <code>{_e(key)}</code>" if key else "") + "</p>",
             '<section id="jobs"><h2>jobs</h2>',
             table(shown, cols, links={"job": links},
                   colours=[verdict_colour(r["status"]) for r in rows]) if rows
             else "<p>(no finished audits)</p>", "</section>"]
    if plot is not None:
        parts += ['<section id="plots"><h2>plots</h2>',
                  figure(f"{key} against epsilon and sigma_upper", plot), "</section>"]
    for name, what in (("pending", "pending (no results.json yet)"),
                       ("other_tasks", "not audits (no verdict)"),
                       ("unreadable", "left out (unreadable)")):
        items = summary.get(name) or []
        if items:
            text = ", ".join(f"{k} ({v})" for k, v in items.items()) if isinstance(
                items, Mapping) else ", ".join(map(str, items))
            parts.append(f'<p class="line" id="{name}">{_e(what)}: {_e(text)}</p>')
    parts += _key_values("provenance", summary.get("provenance"))
    return page(f"dpaudit sweep {root.name}", "\n".join(parts))


def _e(text) -> str:
    return html.escape(str(text), quote=True)
