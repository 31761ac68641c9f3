"""Write a `Report` (scalelab.report.document) as one self-contained HTML page, as Markdown, and its tables as
CSV + JSON. Layout only: every number and sentence comes from the Report.

    write_report(report, out_dir) -> {"report.html": ..., "report.md": ..., "tables/<section>_<name>.csv": ...,
                                      "figures/<section>_<file>.png": ...}

Output is a pure function of the Report: no clock, no absolute path of the machine, environment sorted by key,
so rebuilding a report from the same stored runs gives byte-identical files. Every file is written atomically.
"""
from __future__ import annotations

import base64
import json
import math
import numbers
import re
from dataclasses import dataclass
from pathlib import Path

import jinja2
import pandas as pd

from scalelab.report.document import Report, Section, TableBlock
from scalelab.store import write_bytes_atomic

TEMPLATES = Path(__file__).parent / "templates"
MISSING = "—"  # NaN / None / NA: an empty cell would read as "forgot to fill in"
_MIME = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif",
         ".svg": "image/svg+xml", ".webp": "image/webp"}


# ---- numbers ---------------------------------------------------------------------------------------------------

def format_value(value) -> str:
    """A cell for reading: integers exact with thousands separators, other reals to 4 significant digits
    (12,350 / 123.5 / 0.001235 / 1.235e-05), missing values as an em dash, anything else as str()."""
    if value is None or value is pd.NA or value is pd.NaT:
        return MISSING
    if isinstance(value, bool) or type(value).__name__ == "bool_":  # numpy bool is not numbers.Integral
        return str(bool(value))
    if isinstance(value, numbers.Integral):
        return f"{int(value):,}"
    if isinstance(value, numbers.Real):
        x = float(value)
        if math.isnan(x):
            return MISSING
        if math.isinf(x):
            return "∞" if x > 0 else "−∞"
        if x.is_integer() and abs(x) < 1e15:  # counts stored as float (a column with a NaN): show them exactly
            return f"{int(x):,}"
        rounded = float(f"{x:.4g}")
        if 1000 <= abs(rounded) < 1e15:  # "g" alone would write 1.235e+04 here
            return f"{rounded:,.0f}"
        return f"{x:.4g}"
    return str(value)


def _is_numeric(series: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(series) and not pd.api.types.is_bool_dtype(series)


# ---- Markdown escaping ---------------------------------------------------------------------------------------------

# Backslash escapes of CommonMark: the characters that can start markup inline (`|` ends a table cell,
# `<` raw HTML, `&` an entity, `$` math on GitHub). Parentheses are left alone: they only matter after `]`.
_MD_SPECIAL = re.compile(r"([\\`*\[\]<>|#~&$])")
_MD_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")  # intraword "_" cannot open emphasis
_MD_LINE_START = re.compile(r"^([-+])(?=\s|$|-)")  # "- x", "+ x", "---": a list item or a rule
_MD_ORDERED = re.compile(r"^(\d{1,9})([.)])(?=\s|$)")  # "1. x": an ordered list; "2.13" is just a number
_NEWLINES = re.compile(r"\r\n|\r|\n")


def md_text(text: object, newline: str = " ") -> str:
    """User text made inert in Markdown: shown literally, never markup; newlines become `newline`."""
    s = str(text).strip()
    s = _MD_SPECIAL.sub(r"\\\1", s)
    s = _MD_UNDERSCORE.sub(r"\\_", s)
    s = _MD_ORDERED.sub(r"\1\\\2", _MD_LINE_START.sub(r"\\\1", s))
    return _NEWLINES.sub(newline, s)


def md_cell(text: object) -> str:
    """A pipe-table cell: as md_text, with newlines as <br> (our own markup; the user's `<` is escaped)."""
    return md_text(text, newline="<br>")


# ---- preparing the document for both writers -----------------------------------------------------------------------

@dataclass
class _Figure:
    file: str            # name under figures/, e.g. "amp_curves.png"
    caption: str
    data: bytes | None   # None: the file was missing
    mime: str
    drawn: dict | None = None  # what it drew (report.drawn), written to figures.json

    @property
    def data_uri(self) -> str:
        return f"data:{self.mime};base64,{base64.b64encode(self.data).decode('ascii')}" if self.data else ""


def _frame_for_display(frame: pd.DataFrame) -> pd.DataFrame:
    # A named index carries data (e.g. after a groupby); an unnamed one is just row numbers.
    if any(n is not None for n in frame.index.names):
        frame = frame.reset_index()
    if isinstance(frame.columns, pd.MultiIndex):
        frame = frame.set_axis([" / ".join(map(str, c)) for c in frame.columns], axis=1)
    return frame


def _table_context(section: Section, table: TableBlock, max_rows: int) -> dict:
    """What the page shows of a table: its answer columns (`table.columns`), and the whole table when that is more."""
    stem = f"{section.id}_{table.name}"
    whole = _frame_for_display(table.frame)
    shown = whole[table.columns] if table.columns is not None else whole
    out = {"name": table.name, "caption": table.caption or table.name, "stem": stem, **_cells(shown, max_rows),
           "csv": f"tables/{stem}.csv", "json": f"tables/{stem}.json", "full": None}
    if shown.shape[1] < whole.shape[1]:
        out["full"] = {"count": whole.shape[1], **_cells(whole, max_rows)}
    return out


def _cells(frame: pd.DataFrame, max_rows: int) -> dict:
    numeric = [_is_numeric(frame.iloc[:, i]) for i in range(frame.shape[1])]
    head = frame.head(max_rows)
    rows = [[{"text": format_value(v), "num": numeric[i]} for i, v in enumerate(row)]
            for row in head.itertuples(index=False, name=None)]
    truncated = (f"Showing the first {len(head):,} of {len(frame):,} rows; the full table is in the files below."
                 if len(frame) > len(head) else "")
    return {"columns": [{"label": str(c), "num": numeric[i]} for i, c in enumerate(frame.columns)], "rows": rows,
            "truncated": truncated}


def _safe_file_part(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.") or "figure"


def _figures(section: Section, taken: set[str]) -> list[_Figure]:
    out = []
    for fig in section.figures:
        suffix = fig.path.suffix.lower()
        if suffix not in _MIME:
            raise ValueError(f"figure {str(fig.path)!r}: type {suffix or '(none)'} cannot be embedded; "
                             f"use one of {sorted(_MIME)}")
        base = f"{section.id}_{_safe_file_part(fig.path.stem)}"
        name, n = base + suffix, 2
        while name in taken:  # two figures with the same file name from different folders
            name, n = f"{base}-{n}{suffix}", n + 1
        taken.add(name)
        data = fig.path.read_bytes() if fig.path.is_file() else None
        out.append(_Figure(name, fig.caption, data, _MIME[suffix], fig.drawn))
    return out


def _context(report: Report, max_rows: int) -> dict:
    taken: set[str] = set()
    sections = []
    for s in report.sections:
        sections.append({"id": s.id, "anchor": f"sec-{s.id}", "title": s.title, "question": s.question,
                         "sentences": list(s.sentences), "notes": list(s.notes), "empty": s.is_empty,
                         "tables": [_table_context(s, t, max_rows) for t in s.tables],
                         "figures": _figures(s, taken)})
    toc = ([{"anchor": "recommendations", "title": "Recommendations"}]
           + [{"anchor": s["anchor"], "title": s["title"]} for s in sections]
           + [{"anchor": "definitions", "title": "Measurement definitions"},
              {"anchor": "environment", "title": "Environment"}])
    by_id = {s["id"]: s for s in sections}
    recommendations = []
    for rec in report.recommendations:
        text, where = (rec, None) if isinstance(rec, str) else (rec.text, by_id.get(rec.section))
        figure = next((f for f in where["figures"] if f.data), None) if where else None
        recommendations.append({"text": text, "anchor": where["anchor"] if where else None,
                                "title": where["title"] if where else None, "figure": figure})
    return {"title": report.title, "subtitle": report.subtitle, "recommendations": recommendations,
            "sections": sections, "toc": toc, "definitions": list(report.definitions),
            "environment": sorted((str(k), str(v)) for k, v in report.environment.items()),
            "command": report.command}


# ---- the two writers -----------------------------------------------------------------------------------------------

def render_html(ctx: dict) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True)
    return env.get_template("report.html.j2").render(**ctx)


def _md_table(header: list[str], numeric: list[bool], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(md_cell(h) for h in header) + " |",
             "|" + "|".join("---:" if num else "---" for num in numeric) + "|"]
    lines += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in rows]
    return lines


def _md_list(items: list[str], empty: str) -> list[str]:
    return [f"- {md_text(i)}" for i in items] if items else [f"*{empty}*"]


def render_markdown(ctx: dict) -> str:
    out = [f"# {md_text(ctx['title'])}", ""]
    if ctx["subtitle"]:
        out += [md_text(ctx["subtitle"]), ""]
    out += ["## Contents", ""]
    out += [f"{i}. [{md_text(e['title'])}](#{e['anchor']})" for i, e in enumerate(ctx["toc"], 1)] + [""]
    # Explicit anchors: renderers derive heading ids differently, and titles are arbitrary text.
    out += ['<a id="recommendations"></a>', "", "## Recommendations", ""]
    out += _md_list([r["text"] + (f" ([{r['title']}](#{r['anchor']}))" if r["anchor"] else "")
                     for r in ctx["recommendations"]], "No recommendations: no experiment produced one.") + [""]
    for s in ctx["sections"]:
        out += [f'<a id="{s["anchor"]}"></a>', "", f"## {md_text(s['title'])}", ""]
        if s["question"]:
            out += [f"**Question:** {md_text(s['question'])}", ""]
        for sentence in s["sentences"]:
            out += [md_text(sentence), ""]
        for note in s["notes"]:
            out += [f"> **Note:** {md_text(note)}", ""]
        if s["empty"]:
            out += ["**No data for this section.**", ""]
        for t in s["tables"]:
            out += [f"**{md_text(t['caption'])}**", ""]
            if t["columns"]:
                out += _md_table([c["label"] for c in t["columns"]], [c["num"] for c in t["columns"]],
                                 [[c["text"] for c in row] for row in t["rows"]]) + [""]
            if not t["rows"]:
                out += ["*No rows.*", ""]
            if t["truncated"]:
                out += [f"*{md_text(t['truncated'])}*", ""]
            if t["full"]:
                out += [f"*{len(t['columns'])} of {t['full']['count']} columns shown; every column is in the "
                        "files.*", ""]
            out += [f"Data: [CSV]({t['csv']}) · [JSON]({t['json']})", ""]
        for f in s["figures"]:
            if f.data is None:
                out += [f"**Figure not available: {md_text(f.file)} (missing when the report was written).**", ""]
                continue
            out += [f"![{md_text(f.caption or f.file)}](figures/{f.file})", ""]
            if f.caption:
                out += [f"*{md_text(f.caption)}*", ""]
    out += ['<a id="definitions"></a>', "", "## Measurement definitions", ""]
    out += _md_list(ctx["definitions"], "No definitions recorded.") + [""]
    out += ['<a id="environment"></a>', "", "## Environment", ""]
    if ctx["environment"]:
        out += _md_table(["key", "value"], [False, False], [list(kv) for kv in ctx["environment"]]) + [""]
    else:
        out += ["*No environment recorded.*", ""]
    if ctx["command"]:
        # A fence longer than any backtick run inside keeps the command verbatim.
        fence = "`" * max(3, 1 + max((len(r) for r in re.findall(r"`+", ctx["command"])), default=0))
        out += ["Command:", "", fence, ctx["command"], fence, ""]
    return "\n".join(out).rstrip("\n") + "\n"


# ---- files ---------------------------------------------------------------------------------------------------------

def table_csv(frame: pd.DataFrame) -> bytes:
    """The raw table (full precision, no formatting) as CSV."""
    return _frame_for_display(frame).to_csv(index=False, lineterminator="\n").encode("utf-8")


def table_json(frame: pd.DataFrame) -> bytes:
    """The raw table as JSON records (NaN → null), like `experiments.grid.write_table`."""
    records = json.loads(_frame_for_display(frame).to_json(orient="records", double_precision=15))
    return (json.dumps(records, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def figures_json(ctx: dict) -> bytes:
    """Every figure of the report as data, keyed by its file under figures/: its section, caption and what it
    drew (report.drawn: axis labels, legend entries, the table and column of each series; null where the figure
    recorded nothing), the figures' side of what the report's audit reads."""
    records = {f"figures/{f.file}": {"section": s["id"], "caption": f.caption, "drawn": f.drawn}
               for s in ctx["sections"] for f in s["figures"]}
    return (json.dumps(records, indent=1, ensure_ascii=False, sort_keys=True) + "\n").encode("utf-8")


def write_report(report: Report, out_dir: Path, *, max_rows: int = 64) -> dict[str, Path]:
    """Write report.html, report.md, tables/*.csv|json, figures/* and figures.json under `out_dir`.

    Returns every written file keyed by its path relative to `out_dir` (POSIX separators). Tables longer than
    `max_rows` are cut in the HTML and Markdown (with a line saying so); their CSV/JSON are always complete.
    Files of earlier reports in `out_dir` are left alone.
    """
    if max_rows < 1:
        raise ValueError(f"max_rows={max_rows}: must be at least 1")
    report.validate()
    out_dir = Path(out_dir)
    ctx = _context(report, max_rows)
    written: dict[str, Path] = {}

    def put(rel: str, data: bytes) -> None:
        write_bytes_atomic(out_dir / rel, data)
        written[rel] = out_dir / rel

    for section in report.sections:
        for table in section.tables:
            put(f"tables/{section.id}_{table.name}.csv", table_csv(table.frame))
            put(f"tables/{section.id}_{table.name}.json", table_json(table.frame))
    for s in ctx["sections"]:
        for f in s["figures"]:
            if f.data is not None:
                put(f"figures/{f.file}", f.data)
    put("figures.json", figures_json(ctx))
    put("report.md", render_markdown(ctx).encode("utf-8"))
    put("report.html", render_html(ctx).encode("utf-8"))  # last: its presence means the rest is there
    return written
