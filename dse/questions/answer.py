"""Worked questions: a space file with an ``[answer]`` table, searched, reported and answered.

    [answer]
    analysis = "fast-mode"      # the module dse/questions/fast_mode.py
    speedup = 2.5               # anything else is passed to the analysis as ``ctx.params``

``dse answer SPACE [--out OUT]`` runs the space (exhaustive when it fits, like ``dse run``), writes
the Pareto report into ``OUT`` (default ``reports/<space name>``) and then the analysis's answer:
``OUT/README.md`` (the answer in numbers at the top, then the method and tables),
``OUT/answer.json`` (the headline numbers) and the analysis's figures; the answer is also put at
the top of ``OUT/index.html`` and ``OUT/summary.md``. Every number comes from the model: the run's
front, or designs of the same space scored again (``ctx.score``) with the same scorer.

An analysis module defines ``answer(ctx: Context) -> Answer``.
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import numpy as np

from dse.api import open_run
from dse.build.space import load_space
from dse.errors import InputError, suggest
from dse.questions import sampled
from dse.questions.context import Answer, Context
from dse.questions.sampled import lead_markdown, markdown
from dse.results.pages import markdown_html
from dse.results.report import make_report
from dse.scoring.bands import check_samples
from dse.search.driver import run_space

QUESTIONS_DIR = Path(__file__).resolve().parents[2] / "spaces" / "questions"


SUPPORT = ("answer", "common", "context", "sampled")     # modules of dse/questions that are not analyses


def analysis_module(name: str, file: str = ""):
    mod = re.sub(r"[^a-z0-9_]", "_", str(name).lower())
    try:
        if mod in SUPPORT or mod.startswith("_"):
            raise ModuleNotFoundError(mod)
        m = importlib.import_module(f"dse.questions.{mod}")
    except ModuleNotFoundError:
        raise InputError(f"unknown analysis {name!r}", file=file, where="answer.analysis",
                         hint=suggest(name, available(), "analyses")) from None
    if not hasattr(m, "answer"):
        raise InputError(f"dse.questions.{mod} has no answer()", file=file, where="answer.analysis")
    return m


def available() -> list[str]:
    here = Path(__file__).parent
    return sorted(p.stem.replace("_", "-") for p in here.glob("*.py")
                  if not p.stem.startswith("_") and p.stem not in SUPPORT)


def answer_space(space_path: str, out: str | None = None, run_dir: str | None = None,
                 progress: bool = False, bands: int | None = None, seed: int = 0) -> Path:
    """Run the space, write its report and its answer; returns the report folder.
    ``bands``: parameter samples the analysis is re-run under for its numbers' 90% bands
    (default ``dse.scoring.bands.DEFAULT_SAMPLES``, 0: none; ``dse/questions/sampled.py``)."""
    bands = check_samples(bands)
    space = load_space(space_path)
    spec = dict(space.answer or {})
    if "analysis" not in spec:
        raise InputError("the space has no [answer] analysis", file=space_path, where="answer",
                         hint='add [answer] analysis = "..." (one of: ' + ", ".join(available()) + ")")
    mod = analysis_module(spec.pop("analysis"), space_path)
    if space.size > 10**7:
        raise InputError(f"the space has {space.size:,} designs", file=space_path,
                         hint="a worked question should enumerate in minutes: <= 10^7 designs")
    d = run_space(space, run_dir, strategy="exhaustive", progress=progress)
    o = Path(out) if out else Path("reports") / space.name
    previous = _previous(o)
    make_report(str(d), str(o))
    front = open_run(d).front
    ans = mod.answer(Context(space, d, o, spec, front))
    band, values, attr = None, None, None
    if bands:
        def make(f, tmp, sample):
            return Context(space, d, tmp, spec, f, sample)
        got = sampled.sampled_answers(mod, make, space, front, bands, seed, progress)
        band = sampled.summarize(ans.numbers, got["values"], bands, seed, got["draws"].note)
        values = got["values"]
        if ans.lead:
            attr = sampled.attribution(mod, make, space, front, bands, seed, progress, ans,
                                      values)
    lead = sampled.leads(ans, values, attr)
    _write(o, space, ans, d, previous, band, lead)
    return o


def first_lines(out) -> str:
    """The first lines of a written answer (``OUT/answer.json``): its lead numbers with their
    bands, resolution and what would change them, in Markdown (the terminal prints them
    through ``dse.results.pages.plain``)."""
    try:
        doc = json.loads((Path(out) / "answer.json").read_text())
    except (OSError, ValueError):
        return ""
    return str(doc.get("first_lines", "")).strip()


# what changed in the model since the previous published answers (said in every answer that moved)
MODEL_CHANGE = (
    "2026-12-05 (sixth pass, issue 28: how ops compose into a serving step, fitted end to end on "
    "916 measured Hopper deployments of three runtimes): ttft_s is the closed-loop benchmark's "
    "mean (the start-up burst and the steady wait for the other users' prompts, from the "
    "prompt budget per step); a prompt past the budget runs in even chunks; each runtime's "
    "front end per request (TensorRT-LLM 121 ms, SGLang 331 ms, vLLM 22 ms) is in both TTFTs "
    "and its scheduler's time per running sequence in every step (2.8 us, 23 us, ~0); the "
    "per-layer time is refitted with them (40.7 -> 26.9 us); a served GEMM's fixed time is the "
    "smallest any runtime's table fits on the chip; shared experts run where the dense MLP "
    "runs (replicated per attention-DP rank under TensorRT-LLM and vLLM); expert parallelism "
    "without attention data parallelism sends no all-to-all (one all-reduce of the experts' "
    "outputs). TTFT limits (ttft_s) now bind where a batch's prompts queue for the budget. "
    "Before it (fifth pass): the kernel fits separate the benchmarks' warm L2 cache from the "
    "cold-cache rates the scorer uses.")


def _previous(o: Path) -> dict | None:
    """The answer before the current model change (kept across regenerations on one model)."""
    try:
        prev = json.loads((o / "answer.json").read_text())
    except (OSError, ValueError):
        return None
    kept = prev.get("moved_from") or {}
    if kept.get("model_change") == MODEL_CHANGE:
        return kept
    if "headline" not in prev:
        return None
    return {"headline": prev["headline"], "numbers": prev.get("numbers", {}),
            "model_change": MODEL_CHANGE}


def _flat(d, prefix=""):
    out = {}
    for k, v in (d or {}).items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[f"{prefix}{k}"] = float(v)
    return out


def moved(previous: dict | None, ans: Answer, limit: int = 12) -> str:
    """What moved since the previous answer: its headline (or that the headline is unchanged)
    and the headline numbers that changed most (relative), with the model change that moved
    them; empty when there is no previous answer or nothing at all changed."""
    if not previous:
        return ""
    same = previous["headline"].strip() == ans.headline.strip()
    old, new = _flat(previous["numbers"]), _flat(ans.numbers)
    rows = []
    for k in sorted(set(old) & set(new)):
        a, b = old[k], new[k]
        if a != b and np.isfinite(a) and np.isfinite(b):
            rel = (b - a) / abs(a) if a else np.inf
            rows.append((abs(rel), k, a, b, rel))
    rows.sort(reverse=True)
    if same and not rows:
        return ""
    lines = ["## What moved since the previous model", "", MODEL_CHANGE, ""]
    if same:
        top = rows[0][0]
        lines += [f"The headline's text is unchanged (its rounded figures did not move); the numbers "
                  f"behind it moved by at most {top:.2%}:" if np.isfinite(top)
                  else "The headline is unchanged; the numbers behind it:", ""]
    else:
        lines += ["The previous answer was:", ""] + [
            f"> {ln}" for ln in previous["headline"].strip().splitlines()] + [""]
    if rows:
        lines += ["| headline number | before | after | change |", "|---|---|---|---|"]
        lines += [f"| {k} | {a:.4g} | {b:.4g} | {rel:+.2%} |" if np.isfinite(rel) else
                  f"| {k} | {a:.4g} | {b:.4g} | new |" for _, k, a, b, rel in rows[:limit]]
        lines.append("")
    return "\n".join(lines) + "\n"


def _write(o: Path, space, ans: Answer, d: Path, previous: dict | None = None,
           band: dict | None = None, lead: list | None = None) -> None:
    q = space.question.strip()
    cmd = f"dse answer {_rel(space.file)}"
    band_md = markdown(band) if band is not None else ""
    first = lead_markdown(lead or [], band)
    top = (first + "\n\n" if first else "") + ans.headline.strip()
    md = (f"# {space.name}\n\n**Question.** {q}\n\n## Answer\n\n{top}\n\n"
          + (band_md + "\n" if band_md else "")
          + moved(previous, ans)
          + (f"{ans.details.strip()}\n\n" if ans.details.strip() else "")
          + "".join(f"![{f}]({f})\n\n" for f in ans.figures)
          + f"Regenerate: `{cmd}`. The Pareto report of the run is in `index.html` and "
            f"`summary.md`; its front in `front.csv`.\n")
    (o / "README.md").write_text(md)
    (o / "answer.json").write_text(json.dumps(
        {"space": _rel(space.file), "analysis": space.answer.get("analysis"),
         "question": q, "first_lines": first, "lead": lead or [],
         "headline": ans.headline.strip(), "numbers": ans.numbers,
         **({"bands": band} if band is not None else {}),
         **({"moved_from": previous} if previous else {})},
        indent=2, default=_json_default) + "\n")
    summary = o / "summary.md"
    if summary.is_file():
        summary.write_text(f"## Answer\n\n{top}\n\n"
                           + (band_md + "\n" if band_md else "")
                           + "(details: README.md)\n\n" + summary.read_text())
    page = o / "index.html"
    if page.is_file():
        text = page.read_text()
        block = ("<section id='answer' style='border:2px solid #2a6;padding:0.6em 1em;margin:1em 0'>"
                 f"<h2>Answer</h2><div>{markdown_html(top)}"
                 "</div>" + (f"<div class='bands'>{markdown_html(band_md)}</div>"
                             if band_md else "")
                 + "".join(f"<img src='data:image/png;base64,{_b64(o / f)}' "
                           "class='figure'>" for f in ans.figures
                                    if f.endswith(".png") and (o / f).is_file())
                 + "</section>")
        i = text.find("<body>")
        text = text[:i + 6] + block + text[i + 6:] if i >= 0 else block + text
        page.write_text(text)


def _b64(path: Path) -> str:
    import base64
    return base64.b64encode(path.read_bytes()).decode()


def _rel(path: str) -> str:
    p = Path(path).resolve()
    try:
        return str(p.relative_to(Path.cwd()))
    except ValueError:
        return str(p)


def _json_default(v):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    if isinstance(v, np.ndarray):
        return v.tolist()
    return str(v)
