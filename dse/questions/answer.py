"""Worked questions: a space file with an ``[answer]`` table, searched, reported and answered.

    [answer]
    analysis = "fast-mode"      # the module dse/questions/fast_mode.py
    speedup = 2.5               # anything else is passed to the analysis as ``ctx.params``

``dse answer SPACE [--out OUT] [--publish]`` runs the space (exhaustive when it fits, like
``dse run``), writes the Pareto report into ``OUT`` (default ``runs/answers/<space name>``;
``--publish``: ``reports/<space name>``, the published answers that ``python -m dse.questions``
regenerates) and then the analysis's answer: ``OUT/README.md`` (the question, then the answer in
numbers, then the method and tables), ``OUT/answer.json`` (the headline numbers, rounded to
``DIGITS`` significant digits: what the model resolves, so that a regeneration on the same model
rewrites the same file) and the analysis's figures; the question and the answer are also put at
the top of ``OUT/index.html`` (its uncertainty bands collapsed) and ``OUT/summary.md``. Every
number comes from the model: the run's front, or designs of the same space scored again
(``ctx.score``) with the same scorer.

An analysis module defines ``answer(ctx: Context) -> Answer``.
"""

from __future__ import annotations

import html
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
from dse.results.pages import figure_file, markdown_html
from dse.results.report import make_report
from dse.scoring.bands import check_samples
from dse.search.driver import run_space

QUESTIONS_DIR = Path(__file__).resolve().parents[2] / "spaces" / "questions"
PUBLISHED = Path("reports")              # --publish: reports/<space name>
UNPUBLISHED = Path("runs") / "answers"   # else: runs/answers/<space name> (not tracked)
DIGITS = 4                               # significant digits of answer.json's figures


SUPPORT = ("answer", "common", "context", "sampled", "train_common")     # modules of dse/questions that are not analyses


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
                 progress: bool = False, bands: int | None = None, seed: int = 0,
                 publish: bool = False, digits: int | None = DIGITS) -> Path:
    """Run the space, write its report and its answer; returns the report folder: ``out``, else
    ``reports/<space name>`` when ``publish``, else ``runs/answers/<space name>``.
    ``digits``: significant digits of answer.json's figures (None: full precision, for the tests
    that recompute them from the model).
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
    o = answer_dir(space.name, out, publish)
    previous = _previous(o)
    make_report(str(d), str(o))
    front = open_run(d).front
    ans = mod.answer(Context(space, d, o, spec, front))
    ans.numbers = resolved(ans.numbers, digits)   # what answer.json keeps, leads and bands quote
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
    _write(o, space, ans, d, previous, band, lead, publish=publish, digits=digits)
    return o


def answer_dir(name: str, out: str | None = None, publish: bool = False) -> Path:
    """Where an answer is written: ``out``, else ``reports/<name>`` when published (tracked in
    git; ``python -m dse.questions``, ``dse answer --publish``), else ``runs/answers/<name>``."""
    return Path(out) if out else (PUBLISHED if publish else UNPUBLISHED) / name


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
    "2026-12-06 (twenty-second pass, issue 28): no runtime runs its overlapped scheduler loop "
    "under pipeline parallelism (TensorRT-LLM's PyExecutor runs _executor_loop_pp at pp > 1; "
    "SGLang and vLLM switch theirs off), nor under a speculative method the loop does not run "
    "(SGLang 0.5.x: any but its opt-in V2 drafting; vLLM: a draft model; TensorRT-LLM keeps it "
    "for MTP and a draft model), so a design with layout.pp > 1, or such a speculative design, "
    "no longer waits for a planned step in its TTFT; a runtime's batch waiting counts a running "
    "sequence's draft tokens toward its mark. Before it (twenty-first pass): a runtime that "
    "holds prompts to batch them "
    "(TensorRT-LLM's batch waiting: serving.batch_wait_iters, batch_wait_tokens_fraction) adds "
    "the steps it holds one to the TTFT, and a runtime that streams every k-th token "
    "(serving.stream_interval) does its front end's streaming work per chunk (both off by "
    "default); the end-to-end refit reads InferenceX's TensorRT-LLM Llama-3.1-70B recipe's "
    "batch waiting and sets apart the TTFTs of its TensorRT-LLM DeepSeek runs that compiled "
    "kernels while measured (no client warm-up before 2026-01-21): an eager step's per-layer "
    "time 72.4 us (76.8), a runtime's own server's time per request 29.2 ms (33.3), SGLang's "
    "scheduler time per running sequence 14.2 us (13.2). Before it (twentieth pass): the "
    "scheduler loop is part of a request's TTFT "
    "(serving.overlap_schedule): SGLang's overlap loop, TensorRT-LLM's overlap scheduler and "
    "vLLM's async scheduling (each its runtime's default; vLLM's from 0.14) plan the next step "
    "while the GPU runs this one, so a request waits for the running step and for the one "
    "already planned, and its first token goes out when its prompt's last step ends (dse "
    "charged one whole step after it instead, even with nothing else running); with no other "
    "request in flight the loop is idle and takes the prompt at once; aiconfigurator's "
    "benchmark rows are scored with the token budgets its generator launched them with "
    "(TensorRT-LLM and vLLM: the batch per worker + isl + 1500 tokens a step; SGLang: isl + "
    "1500) and its vLLM 0.12 rows with their synchronous loop; the end-to-end refit on them "
    "puts an eager step's per-layer time at 76.8 us (66.6), a decode-only step's at 17.7 us "
    "(16.1), a runtime's own server's time per request at 33.3 ms (32.7), Dynamo's at 103 ms "
    "(107) and SGLang's scheduler time per running sequence at 13.2 us (11.3). "
    "Before it (seventeenth pass): a benchmark whose harness drew the request "
    "lengths around the stated ones (a case's length_dist uniform[aL,bL]: InferenceX's "
    "uniform [0.8 L, L] prompts and answers) is scored at the mean lengths with their spread; "
    "the end-to-end refit on it puts a runtime's own server's time per request at 32.7 ms "
    "(27.4), the front end's time per prompt token at 5.12 us (4.18), an eager step's "
    "per-layer time at 66.6 us (64.8) and a decode-only step's at 16.1 us (15.8). Before it "
    "(fourteenth and fifteenth passes): the serial front end does some "
    "work for every request whatever its lengths (serving.frontend_request_s: request set-up "
    "and hand-offs), set for Dynamo's front end of aiconfigurator's benchmark rows from its "
    "published saturation rate (5.29 ms) and none on the runtimes' own servers; the front "
    "end's time per output token is set from SGLang's detokenizer saturating (26 us, was "
    "fitted at 21.9) instead of fitted; the end-to-end refit on them puts an eager step's "
    "per-layer time at 64.8 us (68.1), a decode-only step's at 15.8 us (15.4), a runtime's "
    "own server's time per request at 27.4 ms (25.9) and the front end's time per prompt "
    "token at 4.18 us (4.71); training: Megatron's communication-overlap "
    "settings (training.tp_comm_overlap, overlap_p2p_comm, overlap_grad_reduce, "
    "p2p_scatter_gather), DualPipe's bubble as DeepSeek-V3's Table 2 gives it, the per-layer "
    "overhead as its own part and paid per linear layer (an MoE layer two per local expert: "
    "Transformer Engine 2.9 runs one GEMM per expert; a setting runs one grouped kernel "
    "instead), wide-EP MoE training priced on the "
    "rows each rank receives, the context-parallel communication type, recomputed norms and "
    "MoE activations, sliding-window layers at their window, and the training refit on them. "
    "Before it "
    "(eleventh pass, 2026-12-05): fp4 (MXFP4) experts on a chip without fp4 tensor "
    "cores (Hopper, MI300X) run a W4A16 MXFP4 kernel (weights widened to bf16, bf16 MMAs; its "
    "own MoE family fitted on aiconfigurator-core's w4a16_mxfp4 tables), not the fp8 "
    "block-scaled one, so gpt-oss-120b decodes slower there; the end-to-end refit then puts "
    "a decode-only step's per-layer time at 15.4 us (23.0) and an eager one's at 68.1 us "
    "(61.3); the request-rate path's goodput bound steps in log concurrency (another crossing "
    "on a few non-monotone rows); training: the attention kernel a job runs "
    "(training.attention_kernel: cuDNN, FlashAttention-3/2, Triton, Megatron's unfused) at "
    "its published rate, and the training refit on it. Before it (tenth pass): a decode-only "
    "step replays as a CUDA graph (the three"
    " runtimes' defaults) and pays its own per-layer time, 23.0 us, where a step carrying "
    "prompt tokens runs eagerly at 61.3 us (one shared 27.7 us before); the front end's time "
    "per output token refits to 21.7 us (32.6 us); the MoE kernel fit reads SGLang's and "
    "vLLM's DeepSeek tables as the grouped top-k their collectors ran (128 of 256 experts "
    "hit); InferenceX's TensorRT-LLM MoE rows before 2025-11-03 ran ep = tp (their recipe); "
    "training: the attention backward costs 2.88 forward times (FlashAttention-2/3 papers). "
    "Before it "
    "(ninth pass): the per-request time belongs to the front end, not the "
    "runtime: the Hopper set's gap-analysis rows ran behind Dynamo's front end (aiconfigurator's "
    "benchmark template), fitted apart at 131 ms, so a runtime's own server pays 26 ms per "
    "request (the eighth pass gave TensorRT-LLM 108, SGLang 230 and vLLM 12 ms, each runtime's "
    "share of those rows); one serial time per output token for every runtime (32.6 us); the "
    "front end may run several processes (serving.frontend_processes: one by default for "
    "TensorRT-LLM and SGLang, one per data-parallel rank for vLLM); the end-to-end refit on "
    "the merged model. Before it (eighth pass): the runtime's front end is one serial server shared "
    "by the clients (per prompt token, per output token and SGLang's repeated streamed text, "
    "fitted end to end; the per-request lumps drop to 108 / 230 / 12 ms for TensorRT-LLM / "
    "SGLang / vLLM); a closed loop above the runtime's running cap waits for a slot; int4 "
    "experts run their own MoE kernel family (Marlin); TensorRT-LLM's wide EP (dp, ep > 1) runs "
    "its WideEP kernel fit; request-rate roots no longer depend on the designs scored beside "
    "them. Before it (seventh pass): every runtime serves the fastest MLA kernel its chip's "
    "tables show (SGLang's Hopper flash_attention tables ran at 0.12-0.19 of peak where "
    "TensorRT-LLM's run at 0.66-0.70); under attention data parallelism a rank's MoE kernel pays "
    "the remote entries of the tokens dispatched to it only, and SGLang's wide EP runs DeepGEMM "
    "fitted on the wide-EP tables (a wide-EP MoE layer no longer slows down with ep); TPU: 2D "
    "weight-stationary tp and the KV cache split by sequence (layout.tp_x, layout.kv_sharding), "
    "matmul and decode attention from the MXU, no GPU launch or per-layer times, tp collectives "
    "as rings over the ICI links; a topology's numbers per group size (a design's values no "
    "longer depend on the designs scored beside it); request-rate roots by a bracketed secant "
    "(within ~1e-6 of the bisection); the end-to-end refit leaves out the queue-suspect cases "
    "(per-layer 26.9 us; front ends 121 / 329 / 22 ms). Before it (sixth pass): ttft_s became "
    "the closed-loop benchmark's mean, the runtimes' front-end and scheduler times were fitted, "
    "shared experts run where the dense MLP runs, and EP without attention DP sends no "
    "all-to-all.")


def resolved(v, digits: int | None = DIGITS):
    """``v`` (numbers, dicts and lists of them) with every float rounded to ``digits``
    significant digits, what the model resolves (its parameters are fitted to a few percent):
    a regeneration on the same model writes the same digits. A float with an integer value
    (a count, a design id) is kept exact; ``digits`` None keeps every float as it is."""
    if digits is None:
        return v
    if isinstance(v, dict):
        return {k: resolved(x, digits) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [resolved(x, digits) for x in v]
    if isinstance(v, (float, np.floating)) and not isinstance(v, bool):
        v = float(v)
        if not np.isfinite(v) or v.is_integer():
            return v
        return float(f"{v:.{digits - 1}e}")
    if isinstance(v, np.integer):
        return int(v)
    return v


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
           band: dict | None = None, lead: list | None = None, publish: bool = False,
           digits: int | None = DIGITS) -> None:
    """README.md (the question, the answer with its lead numbers and bands, what moved, the
    details, the figures), answer.json, and the question and answer at the top of summary.md and
    index.html (the bands collapsed there)."""
    q = space.question.strip()
    cmd = f"dse answer {_rel(space.file)}" + (" --publish" if publish else "")
    band_md = markdown(band) if band is not None else ""
    first = lead_markdown(lead or [], band)
    top = (first + "\n\n" if first else "") + ans.headline.strip()
    folded = (f"<details>\n<summary>{band_summary(band)}</summary>\n\n{band_md}\n</details>\n\n"
              if band_md else "")
    md = (f"# {space.name}\n\n**Question.** {q}\n\n## Answer\n\n{top}\n\n" + folded
          + moved(previous, ans)
          + (f"{ans.details.strip()}\n\n" if ans.details.strip() else "")
          + "".join(f"![{f}]({f})\n\n" for f in ans.figures)
          + f"Regenerate: `{cmd}`. The Pareto report of the run is in `index.html` and "
            f"`summary.md`; its front in `front.csv`.\n")
    (o / "README.md").write_text(md)
    doc = {"space": _rel(space.file), "analysis": space.answer.get("analysis"),
           "question": q, "first_lines": first, "lead": lead or [],
           "headline": ans.headline.strip(), "numbers": ans.numbers,
           **({"bands": band} if band is not None else {}),
           **({"moved_from": previous} if previous else {})}
    (o / "answer.json").write_text(json.dumps(resolved(json.loads(json.dumps(
        doc, default=_json_default)), digits), indent=2) + "\n")
    summary = o / "summary.md"
    if summary.is_file():
        summary.write_text(f"## Answer\n\n{top}\n\n" + folded
                           + "(details: README.md)\n\n" + summary.read_text())
    page = o / "index.html"
    if page.is_file():
        page.write_text(answer_page(page.read_text(), q, top, band, band_md,
                                    [f for f in ans.figures if f.endswith(".png")
                                     and (o / f).is_file()]))


def band_summary(band: dict) -> str:
    """The one line a collapsed band block shows."""
    return (f"Uncertainty bands of the answer's {len(band['numbers'])} numbers "
            f"({band['samples']} parameter samples): click to open")


def answer_page(text: str, question: str, top: str, band: dict | None, band_md: str,
                figures: list[str]) -> str:
    """The report page ``text`` with the question and then the answer (its lead numbers and
    headline, the bands collapsed, the figures beside the page by name) right under its title;
    the Pareto report of the run follows under its own heading."""
    block = (f"<p class='question'><strong>Question.</strong> {html.escape(question)}</p>"
             "<section id='answer' style='border:2px solid #2a6;padding:0.6em 1em;margin:1em 0'>"
             f"<h2>Answer</h2><div>{markdown_html(top)}</div>"
             + (f"<details class='bands'><summary>{html.escape(band_summary(band))}</summary>"
                f"{markdown_html(band_md)}</details>" if band_md else "")
             + "".join(figure_file(f) for f in figures)
             + "</section><h2>The run's Pareto report</h2>")
    i = text.find("</h1>")
    if i >= 0:
        return text[:i + 5] + block + text[i + 5:]
    i = text.find("<body>")
    return text[:i + 6] + block + text[i + 6:] if i >= 0 else block + text


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
