"""The report writer: one self-contained HTML page, Markdown, CSV/JSON tables; escaping, determinism, and a check in
a real headless Chromium that the page renders, its images load and hostile strings stay text."""
from __future__ import annotations

import base64
import html
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from scalelab.report.document import FigureBlock, Recommendation, Report, Section, TableBlock  # noqa: E402
from scalelab.report.render import format_value, md_cell, write_report  # noqa: E402

XSS_MODEL = "<script>alert(1)</script>"
XSS_IMG = '<img src=x onerror="window.__xss=1">'
AWKWARD_PATH = '/data/R&D "v2"/runs.csv'
TITLE = 'Study <b>one</b> & "two"'


def _png(path: Path, ys: list[float]) -> Path:
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot(range(len(ys)), ys)
    ax.set(xlabel="step", ylabel="loss")
    fig.savefig(path, dpi=60)
    plt.close(fig)
    return path


@pytest.fixture(scope="module")
def pngs(tmp_path_factory) -> list[Path]:
    d = tmp_path_factory.mktemp("figs")
    return [_png(d / "loss.png", [3, 2, 1.5, 1.2]), _png(d / "speedup.png", [1, 1.9, 3.6])]


def make_report(pngs: list[Path], extra_sections: list[Section] | None = None) -> Report:
    models = pd.DataFrame({"model": [XSS_MODEL, "resnet18", "cnn|v2\nwide"], "path": [AWKWARD_PATH, "a", "b"],
                           "throughput(samples/s)": [12345.678, 987.65432, float("nan")],
                           "global_batch": [128, 1024, 65536]})
    scaling = pd.DataFrame({"workers": [1, 2, 4], "speedup": [1.0, 1.91234, 3.5]})
    return Report(
        title=TITLE, subtitle="CPU, gloo, 2 ranks",
        recommendations=[f"Use model {XSS_MODEL} with batch 128.", "Use 2 workers | not 4."],
        sections=[
            Section("batch", "Batch size", question="Which batch size is fastest?",
                    sentences=[f"{XSS_MODEL} is fastest at batch 128.", "Line one\nline two"],
                    tables=[TableBlock("models", models, caption=f"Per model, read from {AWKWARD_PATH}")],
                    figures=[FigureBlock(pngs[0], caption=f"Loss of {XSS_IMG}")],
                    notes=["fp16 skipped: needs CUDA"]),
            Section("scaling", "Strong scaling", question="What speedup do more workers buy?",
                    sentences=["Speedup at 4 workers is 3.5 (efficiency 88 %)."],
                    tables=[TableBlock("speedup", scaling, caption="Speedup T(1)/T(N)")],
                    figures=[FigureBlock(pngs[1], caption="Speedup vs workers")]),
            *(extra_sections or []),
        ],
        definitions=["speedup(N) = T(1) / T(N)", "efficiency = speedup / N"],
        environment={"torch": "2.13.0", "data": AWKWARD_PATH, "host": "</td></tr><script>window.__xss=2</script>"},
        command='scalelab study --out "R&D" | tee log',
    )


class _Collect(HTMLParser):
    """Tags with their attributes and the visible text, as a browser's parser sees them."""

    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def _parse(text: str) -> _Collect:
    p = _Collect()
    p.feed(text)
    return p


# ---- without a browser ---------------------------------------------------------------------------------------------

def test_writes_html_markdown_tables_and_figures(tmp_path, pngs):
    files = write_report(make_report(pngs), tmp_path)
    assert set(files) == {"report.html", "report.md", "tables/batch_models.csv", "tables/batch_models.json",
                          "tables/scaling_speedup.csv", "tables/scaling_speedup.json",
                          "figures/batch_loss.png", "figures/scaling_speedup.png", "figures.json"}
    assert all(p.is_file() and p == tmp_path / rel for rel, p in files.items())
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]  # atomic writes leave no temp file
    assert (tmp_path / "figures/batch_loss.png").read_bytes() == pngs[0].read_bytes()


def test_tables_csv_and_json_hold_the_raw_values(tmp_path, pngs):
    write_report(make_report(pngs), tmp_path)
    csv = pd.read_csv(tmp_path / "tables/batch_models.csv")
    assert list(csv["model"]) == [XSS_MODEL, "resnet18", "cnn|v2\nwide"]
    assert csv["throughput(samples/s)"][0] == 12345.678  # unformatted, full precision
    records = json.loads((tmp_path / "tables/batch_models.json").read_text())
    assert records[0]["path"] == AWKWARD_PATH and records[2]["throughput(samples/s)"] is None
    assert records[2]["global_batch"] == 65536


def test_html_is_self_contained(tmp_path, pngs):
    write_report(make_report(pngs), tmp_path)
    text = (tmp_path / "report.html").read_text()
    assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/|url\(|@import", text, re.I)
    tags = _parse(text).tags
    assert not [t for t, _ in tags if t in ("script", "link", "iframe", "object", "embed", "base")]
    imgs = [a["src"] for t, a in tags if t == "img"]
    assert len(imgs) == 2 and all(src.startswith("data:image/png;base64,") for src in imgs)
    assert [base64.b64decode(src.split(",", 1)[1]) for src in imgs] == [p.read_bytes() for p in pngs]
    assert all(a["href"].startswith("#") for t, a in tags if t == "a")
    assert {a["href"][1:] for t, a in tags if t == "a"} <= {a.get("id") for _, a in tags}  # no dead TOC link


@pytest.mark.parametrize("kind", ["title", "subtitle", "recommendation", "question", "sentence", "note", "cell",
                                  "column", "table_caption", "figure_caption", "definition", "env_key",
                                  "env_value", "command"])
def test_every_user_string_is_escaped_in_html(tmp_path, pngs, kind):
    payload = f'<i id="evil-{kind}">x</i> & "q" \'s\''
    frame = pd.DataFrame({payload if kind == "column" else "c": [payload if kind == "cell" else "v"]})
    pick = lambda k, default: payload if kind == k else default  # noqa: E731
    report = Report(
        title=pick("title", "T"), subtitle=pick("subtitle", "S"), recommendations=[pick("recommendation", "r")],
        sections=[Section("s", "Sec", question=pick("question", "q"), sentences=[pick("sentence", "s")],
                          notes=[pick("note", "n")],
                          tables=[TableBlock("t", frame, caption=pick("table_caption", "tc"))],
                          figures=[FigureBlock(pngs[0], caption=pick("figure_caption", "fc"))])],
        definitions=[pick("definition", "d")], environment={pick("env_key", "k"): pick("env_value", "v")},
        command=pick("command", "scalelab study"))
    write_report(report, tmp_path)
    parsed = _parse((tmp_path / "report.html").read_text())
    assert not [a for _, a in parsed.tags if a.get("id", "").startswith("evil-")]  # never became an element
    assert payload in "".join(parsed.text) or payload in [a.get("alt") for t, a in parsed.tags if t == "img"]


def test_markdown_cells_keep_the_table_shape(tmp_path, pngs):
    write_report(make_report(pngs), tmp_path)
    md = (tmp_path / "report.md").read_text()
    table = [line for line in md.splitlines() if line.startswith("| model")]
    assert table, md
    start = md.splitlines().index(table[0])
    rows = md.splitlines()[start:start + 5]  # header, rule, 3 rows
    unescaped_pipes = [len(re.findall(r"(?<!\\)\|", line)) for line in rows]
    assert unescaped_pipes == [5] * 5, rows
    assert r"cnn\|v2<br>wide" in rows[4]
    assert r"\<script\>alert(1)\</script\>" in rows[2] and "<script>" not in md
    assert "![Loss of " in md and "](figures/batch_loss.png)" in md
    assert md_cell("a|b\r\nc") == r"a\|b<br>c"


def test_numbers_are_formatted_for_reading(tmp_path, pngs):
    assert [format_value(v) for v in (12345.678, 987.65432, 0.00123456, 65536, 2.0, float("nan"), None, True)] \
        == ["12,350", "987.7", "0.001235", "65,536", "2", "—", "—", "True"]
    write_report(make_report(pngs), tmp_path)
    text = (tmp_path / "report.html").read_text()
    assert '<td class="num">12,350</td>' in text and '<td class="num">65,536</td>' in text
    assert "| 12,350 |" in (tmp_path / "report.md").read_text()


def test_same_report_gives_identical_bytes(tmp_path, pngs):
    # Figures copied elsewhere: the source folder must not leak into the output.
    elsewhere = tmp_path / "copy"
    elsewhere.mkdir()
    copies = [Path(shutil.copy(p, elsewhere / p.name)) for p in pngs]
    a = write_report(make_report(pngs), tmp_path / "a")
    b = write_report(make_report(copies), tmp_path / "b")
    again = write_report(make_report(pngs), tmp_path / "a")
    assert set(a) == set(b) == set(again)
    for rel in a:
        assert a[rel].read_bytes() == b[rel].read_bytes() == again[rel].read_bytes(), rel


def test_empty_section_says_no_data_and_full_report_has_none(tmp_path, pngs):
    full = tmp_path / "full"
    write_report(make_report(pngs), full)
    assert "No data" not in (full / "report.html").read_text() + (full / "report.md").read_text()
    empty = Section("comm", "Communication", question="How much time is communication?",
                    notes=["needs 2 ranks; ran with 1"])
    write_report(make_report(pngs, [empty]), tmp_path / "some")
    html_text = (tmp_path / "some/report.html").read_text()
    block = html_text[html_text.index('id="sec-comm"'):]
    assert "No data for this section." in block[:block.index("</section>")]
    assert "**No data for this section.**" in (tmp_path / "some/report.md").read_text()


def test_missing_figure_and_long_table_are_said_not_hidden(tmp_path, pngs):
    long = pd.DataFrame({"step": range(120), "loss": [1 / (i + 1) for i in range(120)]})
    sec = Section("curves", "Curves", sentences=["s"], tables=[TableBlock("loss", long)],
                  figures=[FigureBlock(tmp_path / "gone.png", "gone")])
    files = write_report(make_report(pngs, [sec]), tmp_path / "out", max_rows=10)
    text = files["report.html"].read_text()
    assert "Figure not available: curves_gone.png" in text
    assert "Showing the first 10 of 120 rows" in text
    assert len(pd.read_csv(files["tables/curves_loss.csv"])) == 120


def test_bad_identifiers_are_refused():
    with pytest.raises(ValueError, match="section id"):
        Section("../x", "X")
    with pytest.raises(ValueError, match="duplicate section ids"):
        Report("T", sections=[Section("a", "A"), Section("a", "B")])
    with pytest.raises(ValueError, match="share a file name"):
        Report("T", sections=[Section("a_b", "A", tables=[TableBlock("c", pd.DataFrame())]),
                              Section("a", "B", tables=[TableBlock("b_c", pd.DataFrame())])])
    with pytest.raises(ValueError, match="cannot be embedded"):
        write_report(Report("T", sections=[Section("a", "A", figures=[FigureBlock(Path("x.pdf"))])]), Path("/nope"))


# ---- in a real browser ---------------------------------------------------------------------------------------------

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

# The report forbids scripts (CSP), so the checks run in a wrapper page that loads it in an iframe;
# --allow-file-access-from-files lets a file:// page read a file:// iframe's DOM. The result is written into the
# wrapper's DOM, which --dump-dom prints once the page and its timers have run (--virtual-time-budget).
WRAPPER = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>wrapper</title></head><body>
<pre id="result">pending</pre><iframe id="report" src="report.html" width="1200" height="900"></iframe>
<script>
document.getElementById("report").addEventListener("load", () => setTimeout(() => {
  const r = {};
  try {
    const w = document.getElementById("report").contentWindow, d = w.document;
    r.title = d.title;
    r.xss = [w.__xss, window.__xss].filter(v => v !== undefined);
    r.scripts = d.querySelectorAll("script").length;
    r.handlers = [...d.querySelectorAll("*")].flatMap(e => [...e.attributes].map(a => a.name))
                   .filter(n => n.startsWith("on"));
    r.images = [...d.images].map(i => ({complete: i.complete, width: i.naturalWidth, shown: i.offsetHeight}));
    r.sections = [...d.querySelectorAll("section")].map(s => ({
      id: s.id, height: s.offsetHeight,
      text: [...s.children].filter(c => c.tagName !== "H2").map(c => c.innerText).join(" ").trim()}));
    r.nodata = d.querySelectorAll(".nodata").length;
    r.text = d.body.innerText;
  } catch (e) { r.error = String(e); }
  document.getElementById("result").textContent = JSON.stringify(r);
}, 50));
</script></body></html>
"""


def _chromium() -> str | None:
    return next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)


def test_report_renders_in_headless_chromium(tmp_path, pngs):
    browser = _chromium()
    if browser is None:
        pytest.skip(f"no Chromium binary on PATH (looked for {', '.join(CHROMIUM_NAMES)}); "
                    "install it with: apt-get install -y chromium")
    report = make_report(pngs)
    write_report(report, tmp_path / "out")
    wrapper = tmp_path / "out" / "check.html"
    wrapper.write_text(WRAPPER)
    proc = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--host-resolver-rules=MAP * ~NOTFOUND", f"--user-data-dir={tmp_path / 'profile'}",
         "--allow-file-access-from-files", "--virtual-time-budget=5000", "--dump-dom", wrapper.as_uri()],
        capture_output=True, text=True, timeout=60)
    found = re.search(r'<pre id="result">(.*?)</pre>', proc.stdout, re.S)
    assert found and found.group(1) != "pending", f"no result from Chromium:\n{proc.stdout[-2000:]}\n" \
                                                  f"{proc.stderr[-2000:]}"
    r = json.loads(html.unescape(found.group(1)))  # --dump-dom serialises the JSON text HTML-escaped
    assert "error" not in r, r.get("error")
    assert r["title"] == TITLE  # the <title> shows the literal string: escaped, not parsed
    assert r["xss"] == [] and r["scripts"] == 0 and r["handlers"] == []
    assert len(r["images"]) == 2
    assert all(i["complete"] and i["width"] > 0 and i["shown"] > 0 for i in r["images"]), r["images"]
    ids = [s["id"] for s in r["sections"]]
    assert ids == ["recommendations", "sec-batch", "sec-scaling", "definitions", "environment"]
    assert all(s["text"] and s["height"] > 0 for s in r["sections"]), r["sections"]
    assert r["nodata"] == 0
    for literal in (XSS_MODEL, XSS_IMG, AWKWARD_PATH, "</td></tr><script>window.__xss=2</script>"):
        assert literal in r["text"], literal


# ---- what a reader sees: the answer's columns, the whole table a click away, nothing wider than the page --------

def wide_report(pngs: list[Path]) -> Report:
    """A section with a 40-column table (the scaling tables have 43) whose answer is 6 columns."""
    wide = pd.DataFrame({f"metric_{i}_with_a_long_name(ms)": [1234.5678 * (i + 1), 2.5, 3.75] for i in range(40)})
    wide.insert(0, "workers", [1, 2, 4])
    shown = ["workers", *wide.columns[1:6]]
    return Report(title="wide", recommendations=[Recommendation("Use 2 workers.", "wide")],
                  sections=[Section("wide", "A wide table", sentences=["It is wide."],
                                    tables=[TableBlock("wide", wide, "Forty columns.", columns=shown)],
                                    figures=[FigureBlock(pngs[0], caption="A figure")])])


def test_a_wide_table_shows_its_answer_and_keeps_every_column_a_click_away(tmp_path, pngs):
    files = write_report(wide_report(pngs), tmp_path)
    page = files["report.html"].read_text()
    shown_table, full = page.split("<details>", 1)
    assert shown_table.count("metric_") == 5 + 0 and "All 41 columns" in full and full.count("metric_") >= 40
    assert "6 of 41 columns shown" in files["report.md"].read_text()
    assert len(pd.read_csv(files["tables/wide_wide.csv"]).columns) == 41  # the files keep every column


def test_the_answer_columns_of_a_table():
    from scalelab.report.build import answer_columns

    narrow = pd.DataFrame(columns=["a", "b", "c"])
    assert answer_columns(narrow) is None  # shown whole
    wide = pd.DataFrame(columns=["sync", *(f"x{i}" for i in range(20)), "step(ms)", "step_ci_low(ms)",
                                 "step_ci_high(ms)", "overlap", "quality"])
    assert answer_columns(wide) == ["sync", "step(ms)", "step_ci_low(ms)", "step_ci_high(ms)", "overlap", "quality"]
    assert answer_columns(wide, ["sync", "overlap", "gone"]) == ["sync", "overlap"]


def test_recommendations_come_first_with_their_evidence(tmp_path, pngs):
    page = write_report(wide_report(pngs), tmp_path)["report.html"].read_text()
    assert page.index('id="recommendations"') < page.index('id="toc"')
    rec = page[page.index('id="recommendations"'):page.index('id="toc"')]
    assert 'class="thumb"' in rec and 'href="#sec-wide"' in rec and "Use 2 workers." in rec


LAYOUT = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>layout</title></head><body style="margin:0">
<pre id="result">pending</pre><iframe id="report" src="report.html" width="1400" height="900" style="border:0"></iframe>
<script>
document.getElementById("report").addEventListener("load", () => setTimeout(() => {
  const r = {};
  try {
    const d = document.getElementById("report").contentWindow.document;
    r.pageWidth = d.documentElement.scrollWidth;
    r.scrolling = [...d.querySelectorAll("table")].filter(t => !t.closest("details"))
      .filter(t => t.parentElement.scrollWidth > t.parentElement.clientWidth + 1)
      .map(t => (t.querySelector("caption") || {}).textContent || "?");
    r.details = d.querySelectorAll("details").length;
  } catch (e) { r.error = String(e); }
  document.getElementById("result").textContent = JSON.stringify(r);
}, 50));
</script></body></html>
"""


def test_at_1400_pixels_nothing_is_wider_than_the_page(tmp_path, pngs):
    """In headless Chromium at a 1,400 px viewport the page does not scroll sideways and no table outside a
    <details> scrolls: wide tables show their answer columns."""
    browser = _chromium()
    if browser is None:
        pytest.skip(f"no Chromium binary on PATH (looked for {', '.join(CHROMIUM_NAMES)}); "
                    "install it with: apt-get install -y chromium")
    write_report(wide_report(pngs), tmp_path / "out")
    (tmp_path / "out" / "layout.html").write_text(LAYOUT)
    proc = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--host-resolver-rules=MAP * ~NOTFOUND", f"--user-data-dir={tmp_path / 'profile'}",
         "--allow-file-access-from-files", "--window-size=1400,1000", "--virtual-time-budget=5000", "--dump-dom",
         (tmp_path / "out" / "layout.html").as_uri()], capture_output=True, text=True, timeout=60)
    found = re.search(r'<pre id="result">(.*?)</pre>', proc.stdout, re.S)
    assert found and found.group(1) != "pending", proc.stderr[-2000:]
    r = json.loads(html.unescape(found.group(1)))
    assert "error" not in r, r["error"]
    assert r["pageWidth"] <= 1400 and r["scrolling"] == [] and r["details"] == 1, r


def test_the_scaling_sections_tables_carry_each_rows_run_id_and_other_sections_do_not():
    """A person who reads a scaling sentence finds the run it speaks of (`scalelab explain RUN`)."""
    from scalelab.lab.base import Result
    from scalelab.lab.registry import get
    from scalelab.report.build import section_for

    frame = pd.DataFrame({"run_id": ["run-20261127-074326-ef2f73", "run-20261127-074454-c584f6"], "mode": "strong",
                          "workers": [1, 2], "global_batch": 64, "step(ms)": [10.0, 6.0], "quality": "ok"})
    import dataclasses

    quiet = lambda name: dataclasses.replace(get(name), interpret=None)  # the tables alone, no sentences
    scaling, _ = section_for(quiet("scale"), Result("scale", {"scale_strong": frame}))
    block = scaling.tables[0]
    assert block.columns[-1] == "run_id" and list(block.frame["run_id"]) == list(frame["run_id"])
    other, _ = section_for(quiet("batch_sweep"), Result("batch_sweep", {"batch_sweep": frame}))
    assert "run_id" not in other.tables[0].frame.columns
