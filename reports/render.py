"""report.md and report.html from an audit dict (``reports.audit``), deterministically.

The HTML is one self-contained file: inline CSS, inline SVG plots drawn by matplotlib
(Agg backend, fixed ``svg.hashsalt``, text kept as text, no date metadata), no script,
no external URL or asset. Every text put into HTML is escaped. Numbers shown in tables
carry their exact audit.json value in a ``data-value`` attribute, so tests (and other
tools) can check the page against audit.json.

Pure core: matplotlib, numpy and the standard library only (no Beam).
"""

from __future__ import annotations

import html
import io
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

__all__ = [
    "attack_svg",
    "fmt_count",
    "fmt_error",
    "fmt_rate",
    "render_html",
    "render_markdown",
    "tradeoff_svg",
]

BASELINE_NAME: Final = "raw data (no protection)"
_RC: Final[Any] = {  # Any: matplotlib types the keys as a Literal union
    "svg.hashsalt": "privpipe-report",
    "svg.fonttype": "none",
    "svg.id": None,
    "font.family": "DejaVu Sans",
    "font.size": 9.0,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "figure.dpi": 100,
}
_CSS: Final = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d2430;
max-width:1100px;margin:2em auto;padding:0 1em;background:#fff}
h1{font-size:1.6em;margin-bottom:.2em}h2{border-bottom:2px solid #d8dee8;padding-bottom:.2em;
margin-top:2em}h3{margin-bottom:.3em}
table{border-collapse:collapse;margin:.6em 0;font-size:.92em}
.scroll{overflow-x:auto;max-width:100%}
th,td{border:1px solid #d8dee8;padding:.25em .55em;text-align:left;vertical-align:top}
th{background:#f2f5f9}td.num{text-align:right;font-variant-numeric:tabular-nums}
.meta{color:#5a6473}.warn{color:#a4000f;font-weight:600}
figure{margin:1em 0}figure svg{max-width:100%;height:auto}
figcaption{color:#5a6473;font-size:.9em}
ul.findings li{margin:.3em 0}
dl dt{font-weight:600;margin-top:.5em}dl dd{margin-left:1.2em}
"""


# --------------------------------------------------------------------------- formatting


def fmt_rate(value: Any) -> str:
    """A share as a percentage with one decimal (``n/a`` for None)."""
    if value is None:
        return "n/a"
    return f"{100.0 * float(value):.1f}%"


def fmt_error(value: Any) -> str:
    """An absolute error or other measure with three significant figures."""
    if value is None:
        return "n/a"
    number = float(value)
    if number != 0 and abs(number) < 0.001:
        return f"{number:.2e}"
    return f"{number:,.3f}".rstrip("0").rstrip(".") if not number.is_integer() else f"{number:,.0f}"


def fmt_count(value: Any) -> str:
    if value is None:
        return "n/a"
    return f"{int(value):,}"


def _fmt_any(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return fmt_count(value)
    if isinstance(value, float):
        return fmt_error(value)
    if isinstance(value, list):
        return ", ".join(_fmt_any(v) for v in value)
    if isinstance(value, Mapping):
        return ", ".join(f"{k}: {_fmt_any(v)}" for k, v in value.items())
    return str(value)


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _dv(value: Any) -> str:
    """The data-value attribute: the exact JSON number (or null)."""
    return _e(json.dumps(value))


def _num_td(value: Any, fmt: Any = fmt_rate) -> str:
    return f'<td class="num" data-value="{_dv(value)}">{_e(fmt(value))}</td>'


def _mpl(text: str) -> str:
    """Text for matplotlib: ``$`` would start mathtext."""
    return text.replace("$", r"\$")


# --------------------------------------------------------------------------- data views


def _entries(audit: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(display name, entry) of the baseline (first, when present) and every release."""
    out: list[tuple[str, Mapping[str, Any]]] = []
    if audit.get("baseline"):
        out.append((BASELINE_NAME, audit["baseline"]))
    out += [(str(n), e) for n, e in (audit.get("releases") or {}).items()]
    return out


def _attack_names(audit: Mapping[str, Any]) -> list[str]:
    names: dict[str, None] = {}
    for _, e in _entries(audit):
        for a in e.get("attacks") or {}:
            names[str(a)] = None
    return list(names)


# --------------------------------------------------------------------------- plots


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None}, bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    start = text.find("<svg")
    text = text[start:] if start >= 0 else text
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    return text.strip()


def tradeoff_svg(audit: Mapping[str, Any]) -> str | None:
    """Workload error (x) against attack success (y): one point per release, sweeps as
    curves. None when no release has both numbers."""
    points: dict[str, tuple[float, float]] = {}
    for name, e in _entries(audit):
        s = e.get("summary") or {}
        if s.get("error") is not None and s.get("attack_success") is not None:
            points[name] = (float(s["error"]), float(s["attack_success"]))
    if not points:
        return None
    with plt.rc_context(_RC):
        fig, ax = plt.subplots(figsize=(7.0, 4.4))
        swept: set[str] = set()
        cmap = plt.get_cmap("tab10")
        for i, (sweep, members) in enumerate((audit.get("sweeps") or {}).items()):
            xy = [points[m] for m in members if m in points]
            if not xy:
                continue
            swept.update(members)
            ax.plot(
                [p[0] for p in xy],
                [p[1] for p in xy],
                "-o",
                color=cmap(i % 10),
                label=_mpl(f"sweep {sweep}"),
                markersize=5,
            )
        single = [n for n in points if n not in swept]
        if single:
            ax.scatter(
                [points[n][0] for n in single],
                [points[n][1] for n in single],
                color="#333333",
                marker="s",
                s=28,
                label="release",
                zorder=3,
            )
        for name, (x, y) in points.items():
            ax.annotate(_mpl(name), (x, y), xytext=(4, 4), textcoords="offset points", fontsize=8)
        ax.set_xlabel("workload mean relative error (lower is more useful)")
        ax.set_ylabel("attack success (headline attack rate)")
        ax.set_ylim(-0.03, 1.05)
        ax.set_xlim(left=min(-0.02, min(p[0] for p in points.values()) - 0.02))
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize=8, frameon=True, framealpha=0.9, title="legend")
        return _svg(fig)


def attack_svg(audit: Mapping[str, Any], attack: str) -> str | None:
    """Bars of one attack's headline rate per release with Wilson 95% intervals; the
    theoretical bound (red bar) and the measured bounded quantity (diamond) as markers."""
    rows: list[tuple[str, Mapping[str, Any]]] = [
        (n, (e.get("attacks") or {})[attack])
        for n, e in _entries(audit)
        if attack in (e.get("attacks") or {})
    ]
    rows = [(n, a) for n, a in rows if a.get("rate") is not None]
    if not rows:
        return None
    with plt.rc_context(_RC):
        width = max(4.5, 0.75 * len(rows) + 2.0)
        fig, ax = plt.subplots(figsize=(min(width, 11.0), 3.6))
        xs = list(range(len(rows)))
        rates = [float(a["rate"]) for _, a in rows]
        lows = [
            float((a.get("interval") or [r, r])[0]) for (_, a), r in zip(rows, rates, strict=True)
        ]
        highs = [
            float((a.get("interval") or [r, r])[1]) for (_, a), r in zip(rows, rates, strict=True)
        ]
        err = [
            [max(0.0, r - lo) for r, lo in zip(rates, lows, strict=True)],
            [max(0.0, hi - r) for r, hi in zip(rates, highs, strict=True)],
        ]
        ax.bar(xs, rates, color="#4c72b0", width=0.6, label="rate (Wilson 95% interval)")
        ax.errorbar(xs, rates, yerr=err, fmt="none", ecolor="#1d2430", capsize=3, linewidth=1)
        bx = [x for x, (_, a) in zip(xs, rows, strict=True) if a.get("bound") is not None]
        if bx:
            bounds = [float(rows[x][1]["bound"]) for x in bx]
            measured = []
            mx = []
            for x in bx:
                a = rows[x][1]
                value = a.get(str(a.get("bound_rate") or "rate"))
                if value is not None:
                    mx.append(x)
                    measured.append(float(value))
            ax.scatter(
                bx,
                bounds,
                marker="_",
                s=500,
                color="#c0392b",
                linewidths=2,
                label="theoretical bound",
                zorder=4,
            )
            if mx:
                ax.scatter(
                    mx,
                    measured,
                    marker="D",
                    s=22,
                    color="#e08e0b",
                    label="bounded quantity (measured)",
                    zorder=5,
                )
        ax.set_xticks(xs)
        ax.set_xticklabels(
            [_mpl(n) for n, _ in rows],
            rotation=20 if len(rows) > 4 else 0,
            ha="right" if len(rows) > 4 else "center",
        )
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("share of targets")
        ax.set_title(_mpl(attack))
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
        return _svg(fig)


# --------------------------------------------------------------------------- HTML


def _title(audit: Mapping[str, Any]) -> str:
    run = audit.get("run") or {}
    if run.get("compared"):
        return "Privacy audit: comparison of " + ", ".join(str(x) for x in run["compared"])
    return f"Privacy audit: {run.get('name') or 'run'}"


def _summary_table(audit: Mapping[str, Any], attacks: Sequence[str]) -> str:
    head = [
        "Release",
        "Kind",
        "Guarantee",
        "Queries answered",
        "Mean rel. error",
        "Within 10%",
        "Mean abs. error",
    ]
    head += [f"{a} rate" for a in attacks]
    out = ['<div class="scroll"><table class="summary" id="summary-table"><thead><tr>']
    out += [f"<th>{_e(h)}</th>" for h in head]
    out.append("</tr></thead><tbody>")
    for name, e in _entries(audit):
        u = e.get("utility") or {}
        out.append(f'<tr data-release="{_e(name)}"><td>{_e(name)}</td><td>{_e(e.get("kind"))}</td>')
        out.append(f"<td>{_e(e.get('guarantee_text') or '')}</td>")
        out.append(_num_td(u.get("queries"), fmt_count))
        out.append(_num_td(u.get("mean_relative_error")))
        out.append(_num_td(u.get("within_10pct")))
        out.append(_num_td(u.get("mean_absolute_error"), fmt_error))
        for a in attacks:
            rate = ((e.get("attacks") or {}).get(a) or {}).get("rate")
            out.append(_num_td(rate))
        out.append("</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


_SHARES: Final = frozenset(
    {"mean_relative_error", "within_10pct", "suppressed_share", "unique_share_of_rows"}
)


def _fmt_value(key: str, value: Any) -> str:
    """A value of a key/value table: shares as percentages, counts with separators."""
    if key in _SHARES and isinstance(value, int | float) and not isinstance(value, bool):
        return fmt_rate(value)
    return _fmt_any(value)


def _kv_table(rows: Mapping[str, Any], cls: str = "kv") -> str:
    out = [f'<table class="{_e(cls)}"><tbody>']
    for k, v in rows.items():
        if isinstance(v, int | float) and not isinstance(v, bool):
            fmt = fmt_rate if k in _SHARES else fmt_count if isinstance(v, int) else fmt_error
            out.append(f"<tr><th>{_e(k)}</th>{_num_td(v, fmt)}</tr>")
        else:
            out.append(f"<tr><th>{_e(k)}</th><td>{_e(_fmt_any(v))}</td></tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _dataset_html(ds: Mapping[str, Any]) -> str:
    combos = ds.get("qi_combinations") or {}
    rows: dict[str, Any] = {
        "rows": ds.get("rows"),
        "quasi-identifiers": ", ".join(ds.get("quasi_identifiers") or []),
        "sensitive attribute": ds.get("sensitive") or "n/a",
    }
    for k in ("distinct", "unique"):
        if combos.get(k) is not None:
            rows[f"{k} QI combinations"] = combos[k]
    out = [_kv_table(rows, "dataset")]
    share = combos.get("unique_share_of_rows")
    if share is not None:
        out.append(
            f'<p>Share of rows unique on the quasi-identifiers: <span class="num" '
            f'data-value="{_dv(share)}">{_e(fmt_rate(share))}</span></p>'
        )
    cols = ds.get("columns") or {}
    if cols:
        out.append(
            '<table class="columns"><thead><tr><th>column</th><th>distinct values</th></tr>'
            "</thead><tbody>"
        )
        for c, info in cols.items():
            out.append(
                f"<tr><td>{_e(c)}</td>{_num_td((info or {}).get('distinct'), fmt_count)}</tr>"
            )
        out.append("</tbody></table>")
    return "".join(out)


def _attacks_table(attacks: Mapping[str, Mapping[str, Any]]) -> str:
    out = [
        '<table class="attacks"><thead><tr><th>attack</th><th>rate</th><th>95% interval</th>'
        "<th>targets</th><th>bound</th><th>bounded quantity</th><th>other rates</th></tr>"
        "</thead><tbody>"
    ]
    skip = {"rate", "targets", "interval", "bound", "bound_rate", "details", "details_withheld"}
    for name, a in attacks.items():
        lo, hi = (a.get("interval") or [None, None])[:2]
        br = str(a.get("bound_rate") or "rate")
        other = {k: v for k, v in a.items() if k not in skip}
        measured = a.get(br)
        warn = (
            a.get("bound") is not None
            and measured is not None
            and float(measured) > float(a["bound"]) + 1e-9
        )
        out.append(f"<tr><td>{_e(name)}</td>{_num_td(a.get('rate'))}")
        out.append(f"<td>{_e(fmt_rate(lo))} – {_e(fmt_rate(hi))}</td>")
        out.append(_num_td(a.get("targets"), fmt_count))
        out.append(_num_td(a.get("bound")))
        cls = ' class="warn"' if warn else ""
        out.append(
            f"<td{cls}>{_e(br)} = {_e(fmt_rate(measured))}{' (above bound)' if warn else ''}</td>"
        )
        others = ", ".join(
            f"{k} {fmt_rate(v) if isinstance(v, float) else _fmt_any(v)}" for k, v in other.items()
        )
        out.append(f"<td>{_e(others)}</td></tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _release_html(name: str, e: Mapping[str, Any]) -> str:
    u = e.get("utility") or {}
    out = [f'<section class="release" id="release-{_e(_slug(name))}"><h3>{_e(name)}</h3>']
    out.append(
        f'<p class="meta">{_e(e.get("kind"))} · {_e(e.get("guarantee_text") or "")}'
        f"{' · verified' if e.get('verified') else ''}</p>"
    )
    if e.get("records"):
        out.append("<h4>Records</h4>" + _kv_table(e["records"]))
    keys = (
        "method",
        "queries",
        "mean_absolute_error",
        "mean_relative_error",
        "max_absolute_error",
        "within_10pct",
        "marginals_answered",
        "marginals_not_answerable",
        "queries_not_answerable",
        "unresolved_labels",
        "relative_floor",
    )
    out.append(
        "<h4>Workload utility</h4>" + _kv_table({k: u[k] for k in keys if k in u}, "utility")
    )
    by_way = u.get("by_way") or {}
    if by_way:
        out.append(
            '<table class="by-way"><thead><tr><th>marginals</th><th>queries</th>'
            "<th>mean abs. error</th><th>mean rel. error</th><th>within 10%</th></tr>"
            "</thead><tbody>"
        )
        for w, s in by_way.items():
            out.append(
                f"<tr><td>{_e(w)}-way</td>{_num_td(s.get('queries'), fmt_count)}"
                f"{_num_td(s.get('mean_absolute_error'), fmt_error)}"
                f"{_num_td(s.get('mean_relative_error'))}"
                f"{_num_td(s.get('within_10pct'))}</tr>"
            )
        out.append("</tbody></table>")
    worst = sorted(
        (m for m in u.get("per_marginal") or [] if m.get("mean_relative_error") is not None),
        key=lambda m: (-float(m["mean_relative_error"]), m["columns"]),
    )[:5]
    if worst:
        out.append("<p>Least accurate marginals:</p><ul>")
        out += [
            f"<li>{_e(' × '.join(m['columns']))}: mean relative error "
            f'<span data-value="{_dv(m["mean_relative_error"])}">'
            f"{_e(fmt_rate(m['mean_relative_error']))}</span></li>"
            for m in worst
        ]
        out.append("</ul>")
    if u.get("custom"):
        out.append("<h4>Custom queries (aggregated)</h4>" + _kv_table(u["custom"]))
    if e.get("information_loss"):
        out.append(
            "<h4>Information loss</h4>" + _kv_table(e["information_loss"], "information-loss")
        )
    if e.get("error_by_model"):
        out.append(
            "<h4>Central, multiparty and local error</h4>"
            '<table class="models"><thead><tr><th>model</th><th>parties</th>'
            "<th>standard error per count</th></tr></thead><tbody>"
        )
        for m in e["error_by_model"]:
            out.append(
                f"<tr><td>{_e(m.get('model'))}</td>{_num_td(m.get('parties'), fmt_count)}"
                f"{_num_td(m.get('std_error'), fmt_error)}</tr>"
            )
        out.append("</tbody></table>")
    if e.get("attacks"):
        out.append("<h4>Attacks</h4>" + _attacks_table(e["attacks"]))
    out.append("</section>")
    return "".join(out)


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-") or "release"


def _methodology_html(m: Mapping[str, Any]) -> str:
    out = ["<dl>"]
    for section, body in m.items():
        out.append(f"<dt>{_e(section.replace('_', ' '))}</dt>")
        if isinstance(body, Mapping):
            out.append("<dd><dl>")
            for k, v in body.items():
                out.append(f"<dt>{_e(str(k).replace('_', ' '))}</dt><dd>{_e(_fmt_any(v))}</dd>")
            out.append("</dl></dd>")
        else:
            out.append(f"<dd>{_e(_fmt_any(body))}</dd>")
    out.append("</dl>")
    return "".join(out)


def render_html(audit: Mapping[str, Any]) -> str:
    """The self-contained report.html (a str; same audit -> same bytes)."""
    title = _title(audit)
    run = audit.get("run") or {}
    attacks = _attack_names(audit)
    parts = [
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
        f"<header><h1>{_e(title)}</h1>",
    ]
    meta = [f"{k}: {run[k]}" for k in ("run_id", "finished", "privpipe_version") if run.get(k)]
    if meta:
        parts.append(f'<p class="meta">{_e(" · ".join(meta))}</p>')
    parts.append("</header>")
    parts.append('<section id="findings"><h2>Findings</h2><ul class="findings">')
    parts += [f"<li>{_e(f)}</li>" for f in audit.get("findings") or []]
    parts.append("</ul></section>")
    parts.append(
        '<section id="dataset"><h2>Dataset</h2>'
        f"{_dataset_html(audit.get('dataset') or {})}</section>"
    )
    parts.append(
        f'<section id="summary"><h2>Summary</h2>{_summary_table(audit, attacks)}</section>'
    )
    parts.append('<section id="tradeoff"><h2>Utility against attack success</h2>')
    svg = tradeoff_svg(audit)
    if svg:
        parts.append(
            f"<figure>{svg}<figcaption>Each point is a release: its workload mean relative "
            "error and its highest attack rate; sweeps are drawn as curves.</figcaption></figure>"
        )
    else:
        parts.append("<p>No release has both a workload score and an attack result.</p>")
    parts.append("</section>")
    parts.append('<section id="attacks"><h2>Attacks</h2>')
    for a in attacks:
        svg = attack_svg(audit, a)
        if svg:
            parts.append(f'<figure class="attack" data-attack="{_e(a)}">{svg}<figcaption>{_e(a)}: '
                         "headline rate per release with its Wilson 95% interval; red bars mark "
                         "the theoretical bound of the guarantee, diamonds the bounded quantity."
                         "</figcaption></figure>")  # fmt: skip
    if not attacks:
        parts.append("<p>No attack results.</p>")
    parts.append("</section>")
    parts.append('<section id="releases"><h2>Releases</h2>')
    parts += [_release_html(n, e) for n, e in _entries(audit)]
    parts.append("</section>")
    parts.append(
        '<section id="methodology"><h2>Methodology</h2>'
        f"{_methodology_html(audit.get('methodology') or {})}</section>"
    )
    parts.append(
        '<footer class="meta"><p>Generated by privpipe from audit.json.</p></footer>'
        "</body></html>\n"
    )
    return "\n".join(parts)


# --------------------------------------------------------------------------- Markdown


def _md(text: Any) -> str:
    """Text for a Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


_MD_UTILITY_KEYS: Final = (
    "method",
    "queries",
    "mean_absolute_error",
    "mean_relative_error",
    "max_absolute_error",
    "within_10pct",
    "marginals_answered",
    "marginals_not_answerable",
)


def render_markdown(audit: Mapping[str, Any]) -> str:
    """report.md: the same content as the HTML without plots."""
    attacks = _attack_names(audit)
    run = audit.get("run") or {}
    lines = [f"# {_title(audit)}", ""]
    meta = [f"{k}: {run[k]}" for k in ("run_id", "finished", "privpipe_version") if run.get(k)]
    if meta:
        lines += [" · ".join(meta), ""]
    lines += ["## Findings", ""]
    lines += [f"- {f}" for f in audit.get("findings") or []]
    ds = audit.get("dataset") or {}
    combos = ds.get("qi_combinations") or {}
    lines += [
        "",
        "## Dataset",
        "",
        f"- rows: {fmt_count(ds.get('rows'))}",
        f"- quasi-identifiers: {', '.join(ds.get('quasi_identifiers') or [])}",
        f"- sensitive attribute: {ds.get('sensitive') or 'n/a'}",
    ]
    if combos.get("distinct") is not None:
        lines.append(f"- distinct QI combinations: {fmt_count(combos['distinct'])}")
    if combos.get("unique_share_of_rows") is not None:
        lines.append(f"- rows unique on the QIs: {fmt_rate(combos['unique_share_of_rows'])}")
    head = [
        "Release",
        "Kind",
        "Guarantee",
        "Queries",
        "Mean rel. error",
        "Within 10%",
        "Mean abs. error",
    ]
    head += [f"{a} rate" for a in attacks]
    lines += ["", "## Summary", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, e in _entries(audit):
        u = e.get("utility") or {}
        cells = [
            name,
            e.get("kind"),
            e.get("guarantee_text") or "",
            fmt_count(u.get("queries")),
            fmt_rate(u.get("mean_relative_error")),
            fmt_rate(u.get("within_10pct")),
            fmt_error(u.get("mean_absolute_error")),
        ]
        cells += [fmt_rate(((e.get("attacks") or {}).get(a) or {}).get("rate")) for a in attacks]
        lines.append("| " + " | ".join(_md(c) for c in cells) + " |")
    if audit.get("sweeps"):
        lines += [
            "",
            "Sweeps: " + "; ".join(f"{k}: {' → '.join(v)}" for k, v in audit["sweeps"].items()),
        ]
    lines += ["", "## Releases"]
    for name, e in _entries(audit):
        u = e.get("utility") or {}
        lines += ["", f"### {name}", "", f"{e.get('kind')} · {e.get('guarantee_text') or ''}", ""]
        for k in _MD_UTILITY_KEYS:
            if k in u:
                lines.append(f"- {k.replace('_', ' ')}: {_fmt_value(k, u[k])}")
        if e.get("information_loss"):
            lines.append("- information loss: " + _fmt_any(e["information_loss"]))
        for m in e.get("error_by_model") or []:
            lines.append(
                f"- standard error per count, {m.get('model')} ({fmt_count(m.get('parties'))} "
                f"parties): {fmt_error(m.get('std_error'))}"
            )
        for a, r in (e.get("attacks") or {}).items():
            lo, hi = (r.get("interval") or [None, None])[:2]
            bound = f", bound {fmt_rate(r.get('bound'))}" if r.get("bound") is not None else ""
            lines.append(
                f"- attack {a}: {fmt_rate(r.get('rate'))} "
                f"(95% CI {fmt_rate(lo)}–{fmt_rate(hi)}{bound})"
            )
    lines += ["", "## Methodology", ""]
    for section, body in (audit.get("methodology") or {}).items():
        if isinstance(body, Mapping):
            lines.append(f"- **{section.replace('_', ' ')}**")
            lines += [f"  - {str(k).replace('_', ' ')}: {_fmt_any(v)}" for k, v in body.items()]
        else:
            lines.append(f"- **{section.replace('_', ' ')}**: {_fmt_any(body)}")
    return "\n".join(lines) + "\n"
