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
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from privpipe.reports.decide import advantage_interval, pareto_front, recommend
from privpipe.reports.decide import points as decide_points

__all__ = [
    "GLOSSARY",
    "LATE_KEYS",
    "MAX_TABLE_COLUMNS",
    "SECTIONS",
    "Figures",
    "attack_svg",
    "distribution_svg",
    "fmt_count",
    "fmt_error",
    "fmt_one_in",
    "fmt_rate",
    "kind_group",
    "render_figures",
    "render_html",
    "render_markdown",
    "text_box",
    "tradeoff_figure",
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
table{border-collapse:collapse;margin:.6em 0;font-size:.92em;max-width:100%}
th,td{border:1px solid #d8dee8;padding:.25em .55em;text-align:left;vertical-align:top;
overflow-wrap:break-word}
th{background:#f2f5f9}td.num{text-align:right;font-variant-numeric:tabular-nums;
white-space:nowrap}
.meta{color:#5a6473}.warn{color:#a4000f;font-weight:600}
.decision{border:2px solid #2e7d32;background:#f1f8f1;padding:.6em 1em;border-radius:4px}
.decision p.choice{font-size:1.15em;font-weight:600;margin:.2em 0}
figure{margin:1em 0}figure svg{max-width:100%;height:auto}
figcaption{color:#5a6473;font-size:.9em}
ul.findings li{margin:.3em 0}
dl dt{font-weight:600;margin-top:.5em}dl dd{margin-left:1.2em}
.dist{display:inline-block;vertical-align:top;margin:0 1em 1em 0}
@media print{body{max-width:none;margin:0;font-size:10pt}table{font-size:8.5pt;
page-break-inside:auto}tr,figure,.dist{break-inside:avoid}h2{break-after:avoid}}
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


def fmt_one_in(value: Any) -> str:
    """A probability that is a ratio, as a ratio: 0.2 -> ``1 in 5`` (``n/a``, ``0``)."""
    if value is None:
        return "n/a"
    x = float(value)
    if x <= 0:
        return "0"
    n = 1.0 / x
    return f"1 in {n:,.0f}" if n >= 10 or abs(n - round(n)) < 0.05 else f"1 in {n:.1f}"


def fmt_exp(epsilon: Any) -> str:
    """The multiplicative bound of ε-DP as a ratio: ``e^ε = 2.72``."""
    if epsilon is None:
        return "n/a"
    return f"e^ε = {math.exp(float(epsilon)):.3g}"


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
    # the padding leaves room for a browser whose fallback font is wider than DejaVu Sans
    fig.savefig(buf, format="svg", metadata={"Date": None}, bbox_inches="tight", pad_inches=0.3)
    plt.close(fig)
    text = buf.getvalue()
    start = text.find("<svg")
    text = text[start:] if start >= 0 else text
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    return text.strip()


_KINDS: Final = {  # group -> (marker, colour)
    "table (full-domain)": ("s", "#1f77b4"),
    "Mondrian": ("D", "#2ca02c"),
    "central DP": ("o", "#ff7f0e"),
    "local DP": ("^", "#9467bd"),
    "continual": ("v", "#8c564b"),
    "raw": ("X", "#d62728"),
    "other": ("P", "#7f7f7f"),
}


def kind_group(name: str, entry: Mapping[str, Any], audit: Mapping[str, Any]) -> str:
    """The plot's kind of a release: full-domain table, Mondrian, central/local DP,
    continual, raw (Mondrian is told apart by its local recoding)."""
    kind = str(entry.get("kind") or "")
    if kind == "raw":
        return "raw"
    if kind in ("k_anonymity", "l_diversity", "t_closeness"):
        levels = (audit.get("generalisation") or {}).get(name) or {}
        if any(str(v.get("text", "")).startswith("local recoding") for v in levels.values()):
            return "Mondrian"
        return "table (full-domain)"
    if "continual" in kind:
        return "continual"
    if kind.startswith("local"):
        return "local DP"
    if kind.startswith("dp_"):
        return "central DP"
    return "other"


def _bound_advantage(entry: Mapping[str, Any]) -> float | None:
    """The guarantee's bound on the common accuracy, mapped to advantage over the prior."""
    ai = ((entry.get("common") or {}).get("attribute_inference")) or {}
    bound, prior = ai.get("bound"), ai.get("prior_accuracy")
    if bound is None or prior is None or float(prior) >= 1.0:
        return None
    return (float(bound) - float(prior)) / (1.0 - float(prior))


def _plot_points(audit: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any], float, float]]:
    out = []
    for name, e in _entries(audit):
        s = e.get("summary") or {}
        if s.get("error") is not None and s.get("attribute_advantage") is not None:
            out.append((name, e, float(s["error"]), float(s["attribute_advantage"])))
    return out


def text_box(text: Any, renderer: Any) -> Any:
    """The display-space box of a label's text alone (an annotation's leader excluded)."""
    from matplotlib.text import Text

    if hasattr(text, "update_positions"):  # an annotation places its text when drawn
        text.update_positions(renderer)
    return Text.get_window_extent(text, renderer)


def _overlaps(a: Any, b: Any, pad: float = 1.0) -> bool:
    return not (
        a.x1 + pad <= b.x0 or b.x1 + pad <= a.x0 or a.y1 + pad <= b.y0 or b.y1 + pad <= a.y0
    )


_OFFSETS: Final = [
    (dx * r, dy * r)
    for r in (6, 14, 24, 36, 50, 66, 84)
    for dx, dy in ((1, 1), (1, -1), (-1, 1), (-1, -1), (1, 0), (-1, 0), (0, 1), (0, -1))
]


def _place_labels(fig: Any, ax: Any, items: Sequence[tuple[str, float, float]]) -> list[Any]:
    """Annotate each point with its name at the first offset (growing rings around the
    point) whose text box overlaps no label placed before and no marker; a leader line
    joins labels placed away from their point. Written by hand (no adjustText)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    from matplotlib.transforms import Bbox

    markers = []
    for _, x, y in items:
        px, py = ax.transData.transform((x, y))
        markers.append(Bbox.from_extents(px - 5, py - 5, px + 5, py + 5))
    placed: list[Any] = []
    legend = ax.get_legend()
    if legend is not None:
        markers.append(legend.get_window_extent(renderer))
    frame = ax.get_window_extent(renderer)
    texts: list[Any] = []
    for name, x, y in items:
        chosen = None
        for inside in (True, False):  # within the axes if possible
            for dx, dy in _OFFSETS:
                ann = ax.annotate(
                    _mpl(name),
                    (x, y),
                    xytext=(dx, dy),
                    textcoords="offset points",
                    fontsize=8,
                    ha="left" if dx > 0 else "right" if dx < 0 else "center",
                    va="bottom" if dy > 0 else "top" if dy < 0 else "center",
                )
                box = text_box(ann, renderer)
                fits = not inside or (
                    box.x0 >= frame.x0 and box.x1 <= frame.x1
                    and box.y0 >= frame.y0 and box.y1 <= frame.y1
                )  # fmt: skip
                if fits and not any(_overlaps(box, o) for o in [*placed, *markers]):
                    chosen = (ann, box, dx, dy)
                    break
                ann.remove()
            if chosen is not None:
                break
        if chosen is None:  # crowded: stack below everything placed so far
            low = min([b.y0 for b in [*placed, *markers]], default=0.0)
            px, py = ax.transData.transform((x, y))
            dy = (low - py) * 72.0 / fig.dpi - 12.0
            ann = ax.annotate(
                _mpl(name), (x, y), xytext=(0, dy), textcoords="offset points", fontsize=8,
                ha="center", va="top",
            )  # fmt: skip
            chosen = (ann, text_box(ann, renderer), 0, dy)
        ann, box, dx, dy = chosen
        if abs(dx) > 10 or abs(dy) > 10:  # far from its point: the same text with a leader
            props = {"ha": ann.get_ha(), "va": ann.get_va()}
            ann.remove()
            ann = ax.annotate(
                _mpl(name), (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=8,
                arrowprops={"arrowstyle": "-", "color": "#888888", "lw": 0.6}, **props,
            )  # fmt: skip
        placed.append(box)
        texts.append(ann)
    return texts


def tradeoff_figure(audit: Mapping[str, Any]) -> tuple[Any, list[Any]] | None:
    """The trade-off figure and its label texts (for tests): x = common error, y = common
    attribute advantage over the prior with its 95% interval, a marker and colour per kind,
    the Pareto front, the chance line and the guarantees' bounds. None without points."""
    pts = _plot_points(audit)
    if not pts:
        return None
    with plt.rc_context(_RC):
        fig, ax = plt.subplots(figsize=(7.6, 4.8))
        seen: set[str] = set()
        for name, e, x, y in pts:
            group = kind_group(name, e, audit)
            marker, colour = _KINDS[group]
            iv = advantage_interval(e)
            if iv is not None:
                ax.errorbar(
                    [x], [y], yerr=[[max(0.0, y - iv[0])], [max(0.0, iv[1] - y)]], fmt="none",
                    ecolor=colour, elinewidth=1, capsize=3, alpha=0.8, zorder=2,
                )  # fmt: skip
            ax.scatter(
                [x], [y], marker=marker, color=colour, s=42, zorder=3, edgecolors="white",
                linewidths=0.5, label=None if group in seen else group,
            )  # fmt: skip
            seen.add(group)
            bound = _bound_advantage(e)
            if bound is not None:
                ax.scatter(
                    [x], [bound], marker="_", s=220, color="#c0392b", linewidths=2, zorder=4,
                    label=None if "bound" in seen else "bound implied by the guarantee",
                )  # fmt: skip
                seen.add("bound")
        front = pareto_front(decide_points(audit))
        if len(front) > 0:
            fx = [float(p.error or 0.0) for p in front]  # the front is measured
            fy = [float(p.advantage or 0.0) for p in front]
            ax.plot(
                fx, fy, "--", color="#2e7d32", linewidth=1.2, zorder=1,
                drawstyle="steps-post" if len(front) > 1 else "default",
                label="Pareto front (no release both more useful and safer)",
            )  # fmt: skip
        ax.axhline(0.0, color="#555555", linewidth=0.8, linestyle=":", zorder=0)
        ax.plot([], [], ":", color="#555555", label="chance: no gain over the public prior")
        xs = [p[2] for p in pts]
        ys = [p[3] for p in pts]
        span_x = max(xs) - min(xs) or 0.1
        ax.set_xlim(min(0.0, min(xs)) - 0.05 * span_x, max(xs) + 0.12 * span_x)
        lo_y = min([0.0, *ys]) - 0.05
        ax.set_ylim(lo_y, max(1.0, max(ys) + 0.05))
        ax.set_xlabel("common workload mean relative error (lower is more useful)")
        ax.set_ylabel("attribute advantage over the prior\n(common attacker; lower is safer)")
        ax.grid(True, alpha=0.3)
        ax.legend(
            loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7.5, frameon=False,
            title="marker = kind of release", title_fontsize=8,
        )  # fmt: skip
        texts = _place_labels(fig, ax, [(p[0], p[2], p[3]) for p in pts])
        return fig, texts


def tradeoff_svg(audit: Mapping[str, Any]) -> str | None:
    """The trade-off figure as inline SVG (None when no release has both measures)."""
    made = tradeoff_figure(audit)
    if made is None:
        return None
    with plt.rc_context(_RC):
        return _svg(made[0])


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


MAX_TABLE_COLUMNS: Final = 8
"""No table has more columns than this: wider ones are split (the first column repeated),
so nothing is hidden in print or on a narrow screen."""


def _split_columns(head: Sequence[str], keep: int = 1) -> list[list[int]]:
    """Column index groups of at most MAX_TABLE_COLUMNS, each repeating the first ``keep``."""
    rest = list(range(keep, len(head)))
    width = MAX_TABLE_COLUMNS - keep
    if not rest:
        return [list(range(len(head)))]
    return [list(range(keep)) + rest[i : i + width] for i in range(0, len(rest), width)]


def _table(
    head: Sequence[str],
    rows: Sequence[Sequence[str]],
    cls: str,
    keep: int = 1,
    row_attrs: Sequence[str] | None = None,
    tid: str | None = None,
) -> str:
    """Tables of pre-rendered cells (``<td>...</td>``), split to MAX_TABLE_COLUMNS."""
    out = []
    groups = _split_columns(head, keep)
    for gi, cols in enumerate(groups):
        suffix = f" part-{gi + 1}" if len(groups) > 1 else ""
        ident = f' id="{_e(tid)}"' if tid and gi == 0 else ""
        out.append(f'<table class="{_e(cls)}{suffix}"{ident}><thead><tr>')
        out += [f"<th>{_e(head[c])}</th>" for c in cols]
        out.append("</tr></thead><tbody>")
        for ri, r in enumerate(rows):
            attrs = row_attrs[ri] if row_attrs else ""
            out.append(f"<tr{attrs}>" + "".join(r[c] for c in cols) + "</tr>")
        out.append("</tbody></table>")
    return "".join(out)


def _td(text: Any) -> str:
    return f"<td>{_e(text)}</td>"


def _common(e: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    c = e.get("common") or {}
    return c.get("attribute_inference") or {}, c.get("membership") or {}


def _interval_text(iv: Any) -> str:
    if not iv or len(iv) < 2 or iv[0] is None:
        return "n/a"
    return f"{fmt_rate(iv[0])} – {fmt_rate(iv[1])}"


def _summary_table(audit: Mapping[str, Any], attacks: Sequence[str]) -> str:
    """The common measures of every release (one table), then the kind-specific attack
    rates (split into tables of at most MAX_TABLE_COLUMNS columns)."""
    head = [
        "Release",
        "Kind · guarantee",
        "Common error",
        "Attribute accuracy",
        "Prior accuracy",
        "Advantage over prior (95%)",
        "Risk vs control",
        "Membership advantage",
    ]
    rows = []
    attrs = []
    for name, e in _entries(audit):
        s = e.get("summary") or {}
        ai, mem = _common(e)
        iv = advantage_interval(e)
        adv = s.get("attribute_advantage")
        adv_text = fmt_rate(adv) + (f" ({_interval_text(iv)})" if iv else "")
        rows.append(
            [
                _td(name),
                _td(f"{kind_group(name, e, audit)} · {e.get('guarantee_text') or ''}"),
                _num_td(s.get("error")),
                _num_td(s.get("attribute_accuracy", ai.get("accuracy"))),
                _num_td(ai.get("prior_accuracy")),
                f'<td class="num" data-value="{_dv(adv)}">{_e(adv_text)}</td>',
                _num_td(s.get("attribute_risk", ai.get("risk"))),
                _num_td(s.get("membership_advantage", mem.get("advantage"))),
            ]
        )
        attrs.append(f' data-release="{_e(name)}"')
    out = [_table(head, rows, "summary", row_attrs=attrs, tid="summary-table")]
    if attacks:
        head2 = ["Release", *[f"{a} rate" for a in attacks]]
        rows2 = []
        for name, e in _entries(audit):
            cells = [_td(name)]
            for a in attacks:
                r = (e.get("attacks") or {}).get(a) or {}
                cells.append(_num_td(r.get("rate")))
            rows2.append(cells)
        out.append(
            "<h3>Kind-specific attacks (detail; not comparable across methods)</h3>"
            + _table(head2, rows2, "summary-attacks", row_attrs=attrs)
        )
    return "".join(out)


# --------------------------------------------------------------------------- sections


def _recommendation(audit: Mapping[str, Any]) -> Mapping[str, Any]:
    rec = audit.get("recommendation")
    return rec if isinstance(rec, Mapping) else recommend(audit)


def _recommendation_html(audit: Mapping[str, Any]) -> str:
    rec = _recommendation(audit)
    sentences = [str(x) for x in rec.get("sentences") or []]
    out = ['<div class="decision">']
    if sentences:
        out.append(f'<p class="choice">{_e(sentences[0])}</p>')
    out += [f"<p>{_e(x)}</p>" for x in sentences[1:]]
    out.append("</div>")
    head = ["Release", "Decision", "Common error", "Attribute advantage", "95% interval",
            "Membership advantage"]  # fmt: skip
    rows = []
    front = list(rec.get("front") or [])
    dominated = rec.get("dominated") or {}
    for name, p in (rec.get("points") or {}).items():
        if name == rec.get("choice"):
            status = "recommended (on the front)"
        elif name in front:
            status = "on the Pareto front"
        elif name in dominated:
            status = "dominated by " + ", ".join(dominated[name])
        else:
            status = "not compared: " + str((rec.get("not_compared") or {}).get(name, ""))
        rows.append(
            [
                _td(name),
                _td(status),
                _num_td(p.get("error")),
                _num_td(p.get("attribute_advantage")),
                _td(_interval_text(p.get("interval"))),
                _num_td(p.get("membership_advantage")),
            ]
        )
    if rows:
        out.append(_table(head, rows, "recommendation"))
    out.append(
        f'<p class="meta">Rule: {_e(rec.get("rule"))} Threshold report.max_advantage = '
        f'<span data-value="{_dv(rec.get("max_advantage"))}">'
        f"{_e(fmt_rate(rec.get('max_advantage')))}</span>.</p>"
    )
    return "".join(out)


def _budget_html(audit: Mapping[str, Any]) -> str:
    b = audit.get("budget") or {}
    per = b.get("releases") or {}
    out = []
    if per:
        head = ["Release", "Published", "Charged to", "ε", "δ", "e^ε (odds ratio bound)", "Unit"]
        rows = [
            [
                _td(n),
                _td("yes" if c.get("published") else "no"),
                _td(c.get("ledger") or ""),
                _num_td(c.get("epsilon"), fmt_error),
                _num_td(c.get("delta"), fmt_error),
                _td(fmt_exp(c.get("epsilon"))),
                _td(str(c.get("unit") or "") + (f" ({c['note']})" if c.get("note") else "")),
            ]
            for n, c in per.items()
        ]
        out.append(_table(head, rows, "budget"))
    else:
        out.append("<p>No release of this run spends privacy budget.</p>")
    left, spent, life = b.get("remaining"), b.get("spent"), b.get("lifetime")
    if left:
        out.append(
            '<p>Left on the ledger after this run: <span class="num" data-value='
            f'"{_dv(left.get("epsilon"))}">ε = {_e(fmt_error(left.get("epsilon")))}</span>, '
            f"δ = {_e(fmt_error(left.get('delta')))}"
            + (
                f" (spent ε = {_e(fmt_error(spent.get('epsilon')))} of a lifetime "
                f"ε = {_e(fmt_error(life.get('epsilon')))})"
                if spent and life
                else ""
            )
            + ".</p>"
        )
    elif b.get("ledger_note"):
        out.append(f"<p>{_e(b['ledger_note'])}.</p>")
    if b.get("note"):
        out.append(f'<p class="meta">{_e(b["note"])}</p>')
    return "".join(out)


def _generalisation_html(audit: Mapping[str, Any]) -> str:
    gen = audit.get("generalisation") or {}
    if not gen:
        return "<p>No anonymised table in this run.</p>"
    qis: dict[str, None] = {}
    for levels in gen.values():
        qis.update(dict.fromkeys(levels))
    head = ["Release", *qis]
    rows = [
        [_td(n), *[_td(((levels.get(q) or {}).get("text")) or "—") for q in qis]]
        for n, levels in gen.items()
    ]
    return (
        _table(head, rows, "generalisation")
        + '<p class="meta">Level 0 is the raw value; "of N" is the hierarchy\'s top level '
        "(everything suppressed to one label). Mondrian recodes each class locally, so it has "
        "no single level per attribute.</p>"
    )


_SERIES: Final = ["#1d2430", "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b",
                  "#e377c2", "#17becf", "#bcbd22", "#d62728", "#7f7f7f"]  # fmt: skip


def distribution_svg(column: str, block: Mapping[str, Any]) -> str:
    """A small hand-written SVG bar chart: per value, the raw share (dark) and each
    release's estimated share (colours as in its legend)."""
    values = [str(v) for v in block.get("values") or []]
    candidates: list[tuple[str, Any]] = [("raw data", block.get("raw"))]
    candidates += [(str(n), v) for n, v in (block.get("releases") or {}).items()]
    series: list[tuple[str, list[float]]] = [
        (n, [float(x) for x in v]) for n, v in candidates if v is not None
    ]
    bar, gap, label_w, plot_w = 5, 6, 130, 240
    legend_h = 14 * len(series) + 8
    group_h = bar * len(series) + gap
    height = legend_h + group_h * len(values) + 10
    width = label_w + plot_w + 60
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{_e(column)}: published vs '
        'raw shares" font-family="DejaVu Sans, sans-serif" font-size="10">'
    ]
    for i, (name, _) in enumerate(series):
        y = 10 + 14 * i
        out.append(
            f'<rect x="{label_w}" y="{y - 8}" width="10" height="8" '
            f'fill="{_SERIES[i % len(_SERIES)]}"/><text x="{label_w + 14}" y="{y}">'
            f"{_e(name)}</text>"
        )
    for vi, value in enumerate(values):
        top = legend_h + vi * group_h
        shown = value if len(value) <= 20 else value[:19] + "…"
        out.append(
            f'<text x="{label_w - 4}" y="{top + group_h / 2 + 3:.1f}" text-anchor="end">'
            f"{_e(shown)}</text>"
        )
        for si, (_, shares) in enumerate(series):
            share = float(shares[vi]) if vi < len(shares) else 0.0
            w = max(0.0, min(1.0, share)) * plot_w
            out.append(
                f'<rect x="{label_w}" y="{top + si * bar}" width="{w:.1f}" height="{bar - 1}" '
                f'fill="{_SERIES[si % len(_SERIES)]}"><title>{_e(series[si][0])}: '
                f"{_e(fmt_rate(share))}</title></rect>"
            )
    out.append(
        f'<line x1="{label_w}" y1="{legend_h - 2}" x2="{label_w}" y2="{height - 6}" '
        'stroke="#888" stroke-width="0.6"/></svg>'
    )
    return "".join(out)


def _distributions_html(audit: Mapping[str, Any]) -> str:
    d = audit.get("distributions") or {}
    cols = d.get("columns") or {}
    if not cols:
        return "<p>No 1-way distributions in this audit.</p>"
    out = []
    for col, block in cols.items():
        out.append(
            f'<figure class="dist" data-column="{_e(col)}">{distribution_svg(col, block)}'
            f"<figcaption>{_e(col)}: share of records per value, raw data (dark) and each "
            "release's estimate.</figcaption></figure>"
        )
    if d.get("rule"):
        out.append(f'<p class="meta">Values shown: {_e(d["rule"])}.</p>')
    return "".join(out)


def _publication_attacks_html(audit: Mapping[str, Any]) -> str:
    pa = audit.get("publication_attacks") or {}
    if not pa:
        return "<p>No attack on the publication as a whole in this audit.</p>"
    out = []
    for attack, entries in pa.items():
        rows_in = [e for e in entries or [] if isinstance(e, Mapping)]
        out.append(f'<h3 data-attack="{_e(attack)}">{_e(str(attack).replace("_", " "))}</h3>')
        if not rows_in:
            out.append("<p>No entries.</p>")
            continue
        keys: dict[str, None] = {"releases": None}
        for e in rows_in:
            keys.update(dict.fromkeys(k for k in e if k != "finding"))
        head = list(keys)
        rows = []
        for e in rows_in:
            cells = []
            for k in head:
                v = e.get(k)
                if isinstance(v, int | float) and not isinstance(v, bool):
                    cells.append(_num_td(v, _fmt_any))
                elif k == "breach" and v:
                    cells.append('<td class="warn">yes</td>')
                else:
                    cells.append(_td(_fmt_any(v)))
            rows.append(cells)
        out.append(_table(head, rows, "publication-attack"))
        out.append('<ul class="findings">')
        for e in rows_in:
            cls = ' class="warn"' if e.get("breach") else ""
            out.append(f"<li{cls}>{_e(e.get('finding') or '')}</li>")
        out.append("</ul>")
    return "".join(out)


GLOSSARY: Final = {
    "common error": "mean relative error of a release on the one common workload (the same "
    "count queries for every release), |estimate - true| / max(true, floor)",
    "attribute accuracy": "the common attacker's share of member targets whose MAP guess of "
    "the sensitive value (from the target's quasi-identifiers, the release and the public "
    "prior) equals the true value",
    "prior accuracy": "the same attacker's accuracy from the public prior alone (the "
    "baseline any publication leaves)",
    "advantage over the prior": "(accuracy - prior accuracy) / (1 - prior accuracy): the "
    "share of what the prior got wrong that the release lets the attacker get right; 0 is "
    "chance, 1 is full disclosure",
    "risk vs control": "(accuracy on members - accuracy on control records) / (1 - control "
    "accuracy), as in anonymeter: what the release leaks about its members beyond what it "
    "teaches about everyone",
    "membership advantage": "true-positive rate minus false-positive rate of the attacker's "
    "membership test, members against control records; 0 is chance",
    "95% interval": "Wilson score interval of a measured share over its targets",
    "bound": "the most a release's guarantee allows an attack (ε-DP: e^ε/(1+e^ε) + δ on a "
    "guess; (ε,δ)-DP membership: (e^ε - 1 + 2δ)/(e^ε + 1); k-anonymity: 1 in k)",
    "e^ε": "the factor by which ε-DP lets any one person change the odds of any outcome "
    "(e^1 = 2.72)",
    "Pareto front": "the releases no other release beats on both utility and the common "
    "attacker's advantage",
    "dominates": "no worse on every common measure and better on at least one",
    "within 10%": "share of the workload's queries answered within 10% relative error",
    "suppressed share": "share of input records left out of (or starred in) a table",
    "prosecutor risk / linkage": "average 1/|candidate rows| of a target that knows its QIs "
    "(a ratio: 1 in k at most under k-anonymity)",
}


def _glossary(audit: Mapping[str, Any]) -> dict[str, str]:
    """Every rate's definition: the common measures' (reports.audit.COMMON_DEFINITIONS,
    when present), ours, then the run's attack definitions."""
    from privpipe.reports import audit as audit_module

    out: dict[str, str] = {}
    common = getattr(audit_module, "COMMON_DEFINITIONS", None)
    if isinstance(common, Mapping):
        out.update({str(k).replace("_", " "): str(v) for k, v in common.items()})
    for k, v in GLOSSARY.items():
        out.setdefault(k, v)
    attacks = (audit.get("methodology") or {}).get("attacks") or {}
    for k, v in attacks.items():
        out.setdefault(str(k).replace("_", " "), str(v))
    return out


def _glossary_html(audit: Mapping[str, Any]) -> str:
    out = ['<dl class="glossary">']
    for k, v in _glossary(audit).items():
        out.append(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>")
    out.append("</dl>")
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
        if name == "linkage" and a.get("rate") is not None:  # 1/|candidates|: a ratio
            rate_text = f"{fmt_rate(a['rate'])} ({fmt_one_in(a['rate'])})"
            out.append(
                f'<tr><td>{_e(name)}</td><td class="num" data-value="{_dv(a["rate"])}">'
                f"{_e(rate_text)}</td>"
            )
        else:
            out.append(f"<tr><td>{_e(name)}</td>{_num_td(a.get('rate'))}")
        out.append(f"<td>{_e(fmt_rate(lo))} – {_e(fmt_rate(hi))}</td>")
        out.append(_num_td(a.get("targets"), fmt_count))
        if name == "linkage" and a.get("bound") is not None:
            out.append(
                f'<td class="num" data-value="{_dv(a["bound"])}">'
                f"{_e(fmt_rate(a['bound']))} ({_e(fmt_one_in(a['bound']))})</td>"
            )
        else:
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


SECTIONS: Final = (
    ("recommendation", "Recommendation"),
    ("findings", "Findings"),
    ("dataset", "Dataset"),
    ("summary", "Summary"),
    ("tradeoff", "Utility against the common attacker"),
    ("budget", "Privacy budget"),
    ("generalisation", "Generalisation levels"),
    ("distributions", "Published against raw distributions"),
    ("publication-attacks", "Publication attacks"),
    ("attacks", "Kind-specific attacks"),
    ("releases", "Releases"),
    ("glossary", "Glossary"),
    ("methodology", "Methodology"),
)
"""The report's sections in order (ids of the HTML, headings of both): decision first."""

TRADEOFF_CAPTION: Final = (
    "x: mean relative error of each release on the common workload (the same queries for "
    "every release; lower is more useful). y: the common attacker's attribute advantage over "
    "the public prior, (accuracy − prior accuracy) / (1 − prior accuracy), with its Wilson "
    "95% interval (lower is safer; 0, the dotted line, is chance). Marker and colour give the "
    "kind of release; red ticks the bound a guarantee implies; the dashed green line joins "
    "the Pareto front."
)


LATE_KEYS: Final = ("publication_attacks", "findings")
"""Audit keys the plots never read: a run fills them last (the publication attacks, which
may run in a worker process, and the findings they add), so ``render_figures`` can draw
the plots while they are still coming."""


@dataclass(frozen=True)
class Figures:
    """The report's matplotlib plots as inline SVG (``render_figures``): the trade-off
    figure and each attack's bars (None where there is nothing to plot)."""

    tradeoff: str | None
    attacks: tuple[tuple[str, str | None], ...]


def render_figures(audit: Mapping[str, Any]) -> Figures:
    """The plots of ``render_html``, drawn from the audit without its ``LATE_KEYS`` (so the
    same whether drawn before or after those are filled, and always drawn so)."""
    early = {k: v for k, v in audit.items() if k not in LATE_KEYS}
    return Figures(
        tradeoff_svg(early), tuple((a, attack_svg(early, a)) for a in _attack_names(early))
    )


def _tradeoff_html(svg: str | None) -> str:
    if not svg:
        return (
            "<p>No release has both a common workload error and a common attacker's "
            "advantage (summary.error and summary.attribute_advantage).</p>"
        )
    return f"<figure>{svg}<figcaption>{_e(TRADEOFF_CAPTION)}</figcaption></figure>"


def _attacks_html(figures: Figures) -> str:
    parts = [
        "<p>Each attack below is specific to a kind of release and measures something "
        "different; compare releases with the common measures above.</p>"
    ]
    for a, svg in figures.attacks:
        if svg:
            parts.append(f'<figure class="attack" data-attack="{_e(a)}">{svg}<figcaption>{_e(a)}: '
                         "headline rate per release with its Wilson 95% interval; red bars mark "
                         "the theoretical bound of the guarantee, diamonds the bounded quantity."
                         "</figcaption></figure>")  # fmt: skip
    if not figures.attacks:
        parts.append("<p>No attack results.</p>")
    return "".join(parts)


def render_html(audit: Mapping[str, Any], figures: Figures | None = None) -> str:
    """The self-contained report.html (a str; same audit -> same bytes). ``figures``: its
    plots drawn already (``render_figures`` of this audit, e.g. while its ``LATE_KEYS``
    were still coming); drawn here when None."""
    title = _title(audit)
    run = audit.get("run") or {}
    attacks = _attack_names(audit)
    figures = render_figures(audit) if figures is None else figures
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
    findings = '<ul class="findings">' + "".join(
        f"<li>{_e(f)}</li>" for f in audit.get("findings") or []
    )
    bodies = {
        "recommendation": _recommendation_html(audit),
        "findings": findings + "</ul>",
        "dataset": _dataset_html(audit.get("dataset") or {}),
        "summary": _summary_table(audit, attacks),
        "tradeoff": _tradeoff_html(figures.tradeoff),
        "budget": _budget_html(audit),
        "generalisation": _generalisation_html(audit),
        "distributions": _distributions_html(audit),
        "publication-attacks": _publication_attacks_html(audit),
        "attacks": _attacks_html(figures),
        "releases": "".join(_release_html(n, e) for n, e in _entries(audit)),
        "glossary": _glossary_html(audit),
        "methodology": _methodology_html(audit.get("methodology") or {}),
    }
    for sid, heading in SECTIONS:
        parts.append(f'<section id="{sid}"><h2>{_e(heading)}</h2>{bodies[sid]}</section>')
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


def _rate(e: Mapping[str, Any], attack: str) -> Any:
    return ((e.get("attacks") or {}).get(attack) or {}).get("rate")


def _md_table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines: list[str] = []
    for cols in _split_columns(head):
        lines += ["", "| " + " | ".join(_md(head[c]) for c in cols) + " |"]
        lines.append("|" + "---|" * len(cols))
        lines += ["| " + " | ".join(_md(r[c]) for c in cols) + " |" for r in rows]
    return lines


def _md_sections(audit: Mapping[str, Any], attacks: Sequence[str]) -> dict[str, list[str]]:
    rec = _recommendation(audit)
    out: dict[str, list[str]] = {}
    out["recommendation"] = [f"**{rec['sentences'][0]}**"] if rec.get("sentences") else []
    out["recommendation"] += [f"- {x}" for x in (rec.get("sentences") or [])[1:]]
    out["recommendation"] += ["", f"Rule: {rec.get('rule')} Threshold report.max_advantage = "
                              f"{fmt_rate(rec.get('max_advantage'))}."]  # fmt: skip
    out["findings"] = [f"- {f}" for f in audit.get("findings") or []]
    ds = audit.get("dataset") or {}
    combos = ds.get("qi_combinations") or {}
    out["dataset"] = [
        f"- rows: {fmt_count(ds.get('rows'))}",
        f"- quasi-identifiers: {', '.join(ds.get('quasi_identifiers') or [])}",
        f"- sensitive attribute: {ds.get('sensitive') or 'n/a'}",
    ]
    if combos.get("distinct") is not None:
        out["dataset"].append(f"- distinct QI combinations: {fmt_count(combos['distinct'])}")
    if combos.get("unique_share_of_rows") is not None:
        out["dataset"].append(
            f"- rows unique on the QIs: {fmt_rate(combos['unique_share_of_rows'])}"
        )
    head = ["Release", "Kind · guarantee", "Common error", "Attribute accuracy",
            "Prior accuracy", "Advantage over prior (95%)", "Risk vs control",
            "Membership advantage"]  # fmt: skip
    rows = []
    for name, e in _entries(audit):
        s = e.get("summary") or {}
        ai, mem = _common(e)
        iv = advantage_interval(e)
        rows.append(
            [
                name,
                f"{kind_group(name, e, audit)} · {e.get('guarantee_text') or ''}",
                fmt_rate(s.get("error")),
                fmt_rate(s.get("attribute_accuracy", ai.get("accuracy"))),
                fmt_rate(ai.get("prior_accuracy")),
                fmt_rate(s.get("attribute_advantage")) + (f" ({_interval_text(iv)})" if iv else ""),
                fmt_rate(s.get("attribute_risk", ai.get("risk"))),
                fmt_rate(s.get("membership_advantage", mem.get("advantage"))),
            ]
        )
    out["summary"] = _md_table(head, rows)
    if attacks:
        out["summary"] += ["", "Kind-specific attack rates (detail; not comparable):"]
        out["summary"] += _md_table(
            ["Release", *[f"{a} rate" for a in attacks]],
            [
                [n, *[fmt_rate(_rate(e, a)) for a in attacks]]
                for n, e in _entries(audit)
            ],
        )  # fmt: skip
    if audit.get("sweeps"):
        out["summary"] += [
            "",
            "Sweeps: " + "; ".join(f"{k}: {' → '.join(v)}" for k, v in audit["sweeps"].items()),
        ]
    out["tradeoff"] = [TRADEOFF_CAPTION + " (The plot is in report.html.)"]
    b = audit.get("budget") or {}
    out["budget"] = _md_table(
        ["Release", "Published", "Charged to", "ε", "δ", "e^ε", "Unit"],
        [
            [n, "yes" if c.get("published") else "no", c.get("ledger") or "",
             fmt_error(c.get("epsilon")), fmt_error(c.get("delta")), fmt_exp(c.get("epsilon")),
             c.get("unit") or ""]
            for n, c in (b.get("releases") or {}).items()
        ],
    ) if b.get("releases") else ["No release of this run spends privacy budget."]  # fmt: skip
    if b.get("remaining"):
        out["budget"] += [
            "",
            f"Left on the ledger: ε = {fmt_error(b['remaining'].get('epsilon'))}, "
            f"δ = {fmt_error(b['remaining'].get('delta'))}.",
        ]
    gen = audit.get("generalisation") or {}
    qis: dict[str, None] = {}
    for levels in gen.values():
        qis.update(dict.fromkeys(levels))
    out["generalisation"] = (
        _md_table(
            ["Release", *qis],
            [[n, *[((lv.get(q) or {}).get("text")) or "—" for q in qis]] for n, lv in gen.items()],
        )
        if gen
        else ["No anonymised table in this run."]
    )
    dist = (audit.get("distributions") or {}).get("columns") or {}
    out["distributions"] = []
    for col, block in dist.items():
        names = ["raw data", *[n for n, v in (block.get("releases") or {}).items() if v]]
        series = [block.get("raw"), *[v for v in (block.get("releases") or {}).values() if v]]
        out["distributions"] += ["", f"**{col}**"]
        out["distributions"] += _md_table(
            ["Value", *names],
            [
                [v, *[fmt_rate(sh[i]) if sh else "n/a" for sh in series]]
                for i, v in enumerate(block.get("values") or [])
            ],
        )
    pa = audit.get("publication_attacks") or {}
    out["publication-attacks"] = [] if pa else ["No attack on the publication as a whole."]
    for attack, entries in pa.items():
        rows_in = [e for e in entries or [] if isinstance(e, Mapping)]
        keys: dict[str, None] = {"releases": None}
        for e in rows_in:
            keys.update(dict.fromkeys(k for k in e if k != "finding"))
        out["publication-attacks"] += ["", f"### {str(attack).replace('_', ' ')}"]
        out["publication-attacks"] += _md_table(
            list(keys), [[_fmt_any(e.get(k)) for k in keys] for e in rows_in]
        )
        out["publication-attacks"] += [""] + [
            f"- {'BREACH: ' if e.get('breach') else ''}{e.get('finding') or ''}" for e in rows_in
        ]
    out["attacks"] = ["See each release below (kind-specific; not comparable across methods)."]
    rel: list[str] = []
    for name, e in _entries(audit):
        u = e.get("utility") or {}
        rel += ["", f"### {name}", "", f"{e.get('kind')} · {e.get('guarantee_text') or ''}", ""]
        for k in _MD_UTILITY_KEYS:
            if k in u:
                rel.append(f"- {k.replace('_', ' ')}: {_fmt_value(k, u[k])}")
        if e.get("information_loss"):
            rel.append("- information loss: " + _fmt_any(e["information_loss"]))
        for m in e.get("error_by_model") or []:
            rel.append(
                f"- standard error per count, {m.get('model')} ({fmt_count(m.get('parties'))} "
                f"parties): {fmt_error(m.get('std_error'))}"
            )
        for a, r in (e.get("attacks") or {}).items():
            lo, hi = (r.get("interval") or [None, None])[:2]
            bound = f", bound {fmt_rate(r.get('bound'))}" if r.get("bound") is not None else ""
            rel.append(
                f"- attack {a}: {fmt_rate(r.get('rate'))} "
                f"(95% CI {fmt_rate(lo)}–{fmt_rate(hi)}{bound})"
            )
    out["releases"] = rel
    out["glossary"] = [f"- **{k}**: {v}" for k, v in _glossary(audit).items()]
    meth: list[str] = []
    for section, body in (audit.get("methodology") or {}).items():
        if isinstance(body, Mapping):
            meth.append(f"- **{section.replace('_', ' ')}**")
            meth += [f"  - {str(k).replace('_', ' ')}: {_fmt_any(v)}" for k, v in body.items()]
        else:
            meth.append(f"- **{section.replace('_', ' ')}**: {_fmt_any(body)}")
    out["methodology"] = meth
    return out


def render_markdown(audit: Mapping[str, Any]) -> str:
    """report.md: the same sections as the HTML, in the same order, without plots."""
    attacks = _attack_names(audit)
    run = audit.get("run") or {}
    lines = [f"# {_title(audit)}", ""]
    meta = [f"{k}: {run[k]}" for k in ("run_id", "finished", "privpipe_version") if run.get(k)]
    if meta:
        lines += [" · ".join(meta), ""]
    bodies = _md_sections(audit, attacks)
    for sid, heading in SECTIONS:
        lines += [f"## {heading}", "", *bodies[sid], ""]
    return "\n".join(lines).rstrip("\n") + "\n"
