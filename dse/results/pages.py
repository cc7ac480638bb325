"""What every dse page shares: the Markdown the summaries are written in, rendered as HTML, one
style sheet, tables that fit the page, and the figures' sizes.

``markdown_html`` renders the subset of Markdown that dse writes (``#`` headings, paragraphs,
``-`` / ``1.`` lists nested by two spaces, ``|`` tables, fenced code, ``**bold**``, ``*em*``,
`` `code` ``, links and images); anything else stays text. It is small enough to read, and it
never lets a literal ``**`` or ``##`` through to the page (a well-kept library would also do,
but none is installed with dse's dependencies and the subset is fixed by what dse writes).

**plotly.js, one copy per tree of pages.** A page with interactive plots does not inline the
plotting library (4.8 MB): ``plotly_head(page_dir)`` writes it once to
``<page_dir>/../_static/plotly.min.js`` (``STATIC``: beside the page's folder, so every page
written next to it shares it: ``reports/_static/`` for the published answers, ``DIR/_static/``
for ``dse report DIR``, ``runs/_static/`` for ``dse compare``'s default folder,
``runs/answers/_static/`` for ``dse answer``'s) and the page loads it by a relative
``<script src>``. Nothing is loaded from the network. A page copied without that file says so at
its top (``MISSING_JS``): which file to copy beside it and how to write it again; its PNG
figures (files beside the page, by name) still show the fronts.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

PNG_DPI = 200            # print resolution for every PNG figure (7 in wide: 1400 px)
FIG_IN = (7.0, 4.6)      # a figure's size, drawn at page width
FONT_PT = 11

CSS = """body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;
max-width:1180px;padding:1.2em 2em;color:#222;line-height:1.45}
h1{font-size:1.6em;margin:.4em 0}h2{font-size:1.25em;margin-top:1.6em;border-bottom:1px solid #ddd}
h3{font-size:1.08em}code{background:#f3f3f3;padding:0 .25em;border-radius:3px;font-size:.92em}
pre{background:#f6f6f6;padding:.8em;white-space:pre-wrap;overflow-wrap:anywhere}
.tablewrap{max-width:100%;overflow-x:auto;margin:.6em 0}
table{border-collapse:collapse;font-size:12.5px;max-width:100%}
td,th{padding:3px 7px;border-bottom:1px solid #e2e2e2;text-align:right;vertical-align:top}
td{white-space:nowrap}
th{background:#f4f6f8;font-weight:600;text-align:center;overflow-wrap:break-word;min-width:4em}
td:first-child,th:first-child{text-align:left}
.warning{border-left:4px solid #d9822b;background:#fff6ea;padding:.5em 1em;margin:1em 0}
.summary{border-left:4px solid #4a7bd0;background:#f7f9fd;padding:.2em 1.2em;margin:1em 0}
img.figure{width:100%;max-width:100%;height:auto;display:block;margin:.8em 0}
.overflows{outline:2px dashed #d33}
"""

# marks a table wrapper whose table is wider than the page (the Chromium test reads the mark)
CHECK_JS = """<script>window.addEventListener('load',function(){document.querySelectorAll(
'.tablewrap').forEach(function(w){if(w.scrollWidth>w.clientWidth+1)w.classList.add('overflows')});
document.body.setAttribute('data-layout-checked','1')});</script>"""


STATIC = "_static"               # the shared scripts' folder, beside the pages' folders
PLOTLY_JS = "plotly.min.js"


def plotly_file(page_dir: Path) -> Path:
    """Where the pages written in ``page_dir`` (and in its sibling folders) find plotly.js."""
    return Path(page_dir).resolve().parent / STATIC / PLOTLY_JS


def write_plotly(page_dir: Path) -> Path:
    """The shared plotly.js of ``page_dir``'s pages, written when it is missing or differs from
    the installed plotly's (a page and the library it is drawn for always agree)."""
    from plotly.offline import get_plotlyjs
    f = plotly_file(page_dir)
    js = get_plotlyjs().encode()
    if not f.is_file() or f.stat().st_size != len(js) or f.read_bytes() != js:
        f.parent.mkdir(parents=True, exist_ok=True)
        tmp = f.with_suffix(".tmp")
        tmp.write_bytes(js)
        tmp.replace(f)
    return f


# said at the top of a page whose plotly.js is missing (a page copied alone)
MISSING_JS = (
    "<div id='plotly-missing' class='warning' style='display:none'><strong>The interactive plots "
    "are not drawn:</strong> this page loads the plotting library from <code>{src}</code> (one "
    "copy shared by the pages written beside each other; nothing is loaded from the network), "
    "and it is not there. Copy that file along with the page (the same relative path; the PNG "
    "files beside the page too), or write the page again (<code>dse report</code>, <code>dse "
    "answer</code>, <code>dse compare</code>), which puts it there. The PNG figures show the "
    "same fronts.</div>")
_MISSING_CHECK = ("<script>window.addEventListener('load',function(){if(typeof Plotly==="
                  "'undefined'){var e=document.getElementById('plotly-missing');"
                  "if(e)e.style.display='block';}});</script>")


def plotly_head(page_dir: Path) -> tuple[str, str]:
    """(the ``<head>`` script tag that loads the shared plotly.js, the note shown at the top of
    the body when it is missing), writing the shared copy (``write_plotly``)."""
    write_plotly(page_dir)
    src = f"../{STATIC}/{PLOTLY_JS}"
    return (f"<script src='{src}' charset='utf-8'></script>{_MISSING_CHECK}",
            MISSING_JS.format(src=html.escape(src)))


def page(title: str, body: str, head: str = "") -> str:
    """A whole page: dse's style, ``body`` inside ``<body>``."""
    return (f"<!doctype html><html><head><meta charset='utf-8'><meta name='viewport' "
            f"content='width=device-width'><title>{html.escape(title)}</title>"
            f"<style>{CSS}</style>{head}</head>\n<body>\n{body}\n{CHECK_JS}</body></html>")


def plot_page(page_dir: Path, title: str, body: str) -> str:
    """A page with interactive plots (``to_html(include_plotlyjs=False)``): the shared
    plotly.js loaded in its head, a visible note at the top when that file is missing."""
    head, missing = plotly_head(page_dir)
    return page(title, missing + body, head)


def table(frame, labels: dict | None = None, digits: int = 4, classes: str = "") -> str:
    """A DataFrame as an HTML table that fits the page: columns named by ``labels`` (e.g.
    ``dse.spec.fields.label``), floats to ``digits`` significant figures, NaN as ``-``."""
    labels = labels or {}
    head = "".join(f"<th>{html.escape(str(labels.get(c, c)))}</th>" for c in frame.columns)
    rows = []
    for row in frame.itertuples(index=False):
        rows.append("<tr>" + "".join(f"<td>{html.escape(_cell(v, digits))}</td>" for v in row)
                    + "</tr>")
    cls = f" class='{classes}'" if classes else ""
    return (f"<div class='tablewrap'><table{cls}><thead><tr>{head}</tr></thead><tbody>"
            + "".join(rows) + "</tbody></table></div>")


def _cell(v, digits: int) -> str:
    if isinstance(v, float) or type(v).__name__.startswith("float"):
        v = float(v)
        return "-" if v != v or v in (float("inf"), float("-inf")) else f"{v:.{digits}g}"
    return str(v)


def figure(png_b64: str, alt: str) -> str:
    return f"<img class='figure' alt='{html.escape(alt)}' src='data:image/png;base64,{png_b64}'>"


def figure_file(name: str, alt: str | None = None) -> str:
    """A PNG beside the page, by its file name (not inlined: the page stays small)."""
    return (f"<img class='figure' alt='{html.escape(alt or name)}' "
            f"src='{html.escape(name)}'>")


def compact_png(path) -> None:
    """Rewrite a saved figure as a 256-colour palette PNG (no dithering): a chart's flat colours
    and anti-aliased edges fit in it, and the file is 2-3 times smaller (the published reports
    keep their PNGs in git). Same pixels' size; every figure dse writes goes through it."""
    from PIL import Image
    with Image.open(path) as im:
        im.load()
    im.convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT,
                               dither=Image.Dither.NONE).save(path, optimize=True)


def style_axes(ax) -> None:
    """Matplotlib axes legible at page width: larger tick and label fonts, a light grid."""
    ax.tick_params(labelsize=FONT_PT - 1)
    ax.xaxis.label.set_size(FONT_PT)
    ax.yaxis.label.set_size(FONT_PT)
    ax.title.set_size(FONT_PT + 1)
    ax.grid(alpha=0.3)


# --- Markdown (the subset dse writes) -> HTML --------------------------------------------------

_INLINE = (
    (re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)"), r"<img class='figure' alt='\1' src='\2'>"),
    (re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)"), r"<a href='\2'>\1</a>"),
    (re.compile(r"\*\*(.+?)\*\*"), r"<strong>\1</strong>"),
    (re.compile(r"(?<![\w*])\*(?!\s)([^*]+?)(?<!\s)\*(?![\w*])"), r"<em>\1</em>"),
)


def inline(text: str) -> str:
    """One line's inline Markdown, HTML-escaped: code spans first (their content is literal)."""
    parts = re.split(r"(`[^`]+`)", text)
    out = []
    for p in parts:
        if len(p) > 1 and p.startswith("`") and p.endswith("`"):
            out.append(f"<code>{html.escape(p[1:-1])}</code>")
            continue
        s = html.escape(p, quote=False)
        for rx, rep in _INLINE:
            s = rx.sub(rep, s)
        out.append(s)
    return "".join(out)


_LIST = re.compile(r"^(\s*)([-*+]|\d+[.)])\s+(.*)$")
_HEAD = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _row(line: str) -> list[str]:
    s = line.strip()
    s = s[1:] if s.startswith("|") else s
    s = s[:-1] if s.endswith("|") else s
    return [c.strip() for c in s.split("|")]


def _is_rule(line: str) -> bool:
    return bool(re.fullmatch(r"\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*", line))


def markdown_html(text: str) -> str:
    """``text`` (dse's Markdown subset) as HTML."""
    lines = text.splitlines()
    out: list[str] = []
    para: list[str] = []
    stack: list[tuple[int, str]] = []     # open lists: (indent, "ul" | "ol")

    def flush_para():
        if para:
            out.append("<p>" + inline(" ".join(s.strip() for s in para)) + "</p>")
            para.clear()

    def close_lists(indent: int = -1):
        while stack and stack[-1][0] > indent:
            out.append(f"</li></{stack.pop()[1]}>")

    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip().startswith("```"):
            flush_para()
            close_lists()
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith("```"):
                j += 1
            out.append("<pre><code>" + html.escape("\n".join(lines[i + 1:j])) + "</code></pre>")
            i = j + 1
            continue
        if not line.strip():
            flush_para()
            i += 1
            continue
        h = _HEAD.match(line)
        if h:
            flush_para()
            close_lists()
            n = len(h.group(1))
            out.append(f"<h{n}>{inline(h.group(2))}</h{n}>")
            i += 1
            continue
        if line.lstrip().startswith("|") and i + 1 < len(lines) and _is_rule(lines[i + 1]):
            flush_para()
            close_lists()
            head = _row(line)
            j = i + 2
            body = []
            while j < len(lines) and lines[j].lstrip().startswith("|"):
                body.append(_row(lines[j]))
                j += 1
            out.append("<div class='tablewrap'><table><thead><tr>"
                       + "".join(f"<th>{inline(c)}</th>" for c in head) + "</tr></thead><tbody>"
                       + "".join("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in r) + "</tr>"
                                 for r in body) + "</tbody></table></div>")
            i = j
            continue
        m = _LIST.match(line)
        if m:
            flush_para()
            indent, kind = len(m.group(1).expandtabs(4)), "ol" if m.group(2)[0].isdigit() else "ul"
            if stack and stack[-1][0] == indent and stack[-1][1] != kind:
                close_lists(indent - 1)
            if not stack or indent > stack[-1][0]:
                out.append(f"<{kind}><li>")
                stack.append((indent, kind))
            else:
                close_lists(indent)
                if stack and stack[-1][0] == indent:
                    out.append("</li><li>")
                else:
                    out.append(f"<{kind}><li>")
                    stack.append((indent, kind))
            out.append(inline(m.group(3)))
            i += 1
            continue
        if stack and line.startswith(" "):    # a list item's continuation line
            out.append(" " + inline(line.strip()))
            i += 1
            continue
        close_lists()
        para.append(line)
        i += 1
    flush_para()
    close_lists()
    return "\n".join(out)


# --- Markdown -> terminal text -----------------------------------------------------------------

_PLAIN = (
    (re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)"), r"\2"),              # an image: its file
    (re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)"), r"\1 (\2)"),           # a link: text (target)
    (re.compile(r"\*\*(.+?)\*\*"), r"\1"),
    (re.compile(r"(?<![\w*])\*(?!\s)([^*]+?)(?<!\s)\*(?![\w*])"), r"\1"),
)


def plain(text: str) -> str:
    """dse's Markdown subset as terminal text: the same lines without its markers (no ``**``,
    ``*em*``, backticks, ``#`` heading marks or code fences; a link keeps its text and target).
    Lists and tables stay lines; every command that prints an answer's or a page's Markdown to
    the terminal prints it through this."""
    out = []
    for line in text.splitlines():
        if line.strip().startswith("```"):
            continue
        h = _HEAD.match(line)
        if h:
            line = h.group(2)
        parts = re.split(r"(`[^`]+`)", line)
        done = []
        for p in parts:
            if len(p) > 1 and p.startswith("`") and p.endswith("`"):
                done.append(p[1:-1])
                continue
            for rx, rep in _PLAIN:
                p = rx.sub(rep, p)
            done.append(p)
        out.append("".join(done))
    return "\n".join(out)
