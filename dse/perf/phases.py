"""The steps an instance runs, and what a request waits for.

Continuous batching (``dse.perf.serve``): ``concurrency`` sequences in flight on ``tp * pp *
dp`` chips, split into ``pp`` micro-batches that keep every stage busy. Three stage steps
(``dse.perf.step.step``, per micro-batch) price it:

decode     every running sequence's next token (``spec_tokens + 1`` with speculation): reads
           every weight once and every sequence's KV cache; what limits decoding (its
           compute, memory and network sums and the bound shares of its ops)
prompt     the same decodes plus the prompt tokens of the step that carries them: a whole
           prompt or chunk of ``max_num_tokens`` (or the average load, if larger) on the
           busiest attention data-parallel rank, attending to its cached prefix
ttft       the step that carries one of this request's chunks next to the other running
           decodes; a prompt's chunks attend to the cached prefix and the earlier chunks

The mean step mixes the prompt and decode steps in the share of steps that carry prompt
tokens (``prompt_load``). The unloaded TTFT (``ttft``) is the wait for the running step (and
the one an overlapped scheduler already planned), the steps that carry the request's chunks
and the runtime's front end; the closed-loop TTFT a benchmark measures (``ttft_closed_loop``) adds the wait for the
other requests' prompts, at the start-up burst and in steady state.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dse.perf import arch, frontend, lengths, spec
from dse.perf.batch import Batch
from dse.perf.step import Coefficients, StepTimes, bound_shares, step


@dataclass(frozen=True)
class Breakdown:
    """Times of the decode-only step, the prompt-carrying step and the TTFT prefill step
    (per-op StepTimes when a breakdown is asked for, else the step times alone)."""

    decode: StepTimes | np.ndarray
    mixed: StepTimes | np.ndarray
    prefill: StepTimes | np.ndarray

    def total(self, name: str) -> np.ndarray:
        v = getattr(self, name)
        return v.total_s if isinstance(v, StepTimes) else v


def sequences(b: Batch):
    """Sequences in flight, at least one (once per batch: never modify it in place)."""
    return b.memo("sequences", lambda: np.maximum(b.concurrency, 1.0))


def new_tokens(b: Batch):
    """Uncached prompt tokens per request (once per batch: never modify it in place)."""
    return b.memo("new_tokens", lambda: b.isl * (1.0 - b.prefix_hit_fraction))


def times(f, x):
    """``f * x`` for a phase flag ``f`` (``arch.phases``): ``x`` itself or 0.0 when ``f`` is the
    Python number 1.0 or 0.0 (no arithmetic; never modify the result in place)."""
    if isinstance(f, float):
        if f == 1.0:
            return x
        if f == 0.0:
            return 0.0
    return f * x


def add(a, x):
    """``a + x``, ``x`` (or ``a``) itself when the other is the Python number 0.0."""
    if isinstance(a, float) and a == 0.0:
        return x
    if isinstance(x, float) and x == 0.0:
        return a
    return a + x


@dataclass(frozen=True)
class PromptLoad:
    """Tokens per step of one instance (whole instance, all micro-batches)."""

    decoding: np.ndarray   # decode tokens (one per running sequence; 0 prefill-only)
    chunk: np.ndarray      # a prompt's tokens per step: a whole prompt or a scheduler's chunk
    avg: np.ndarray        # prompt tokens per step on average
    carried: np.ndarray    # prompt tokens of a step that carries some
    share: np.ndarray      # the share of steps that carry prompt tokens
    budget: np.ndarray     # prompt tokens a scheduler's step takes (its decodes come first)
    n_chunks: np.ndarray   # steps one prompt is chunked into
    per_chunk: np.ndarray  # a prompt's tokens per chunk (its chunks share them evenly)


def prompt_load(b: Batch, per_step=None) -> PromptLoad:
    """Prefill tokens per step on average, the tokens of a step that carries a prompt, and the
    share of steps that carry one (prompts arrive whole or in chunks of ``max_num_tokens``).
    ``per_step``: output tokens per sequence per step (speculative decoding), default 1."""
    c = sequences(b)
    both, pre_only, dec_only = arch.phases(b)
    new = new_tokens(b)
    decoding = times(1.0 - pre_only, c)
    # a scheduler (dp rank) fills its max_num_tokens with its decodes first, then prompt tokens;
    # a prompt longer than that budget runs in n steps of new / n tokens each
    budget = np.maximum(b.max_num_tokens - decoding / b.dp, 1.0)
    chunk = np.minimum(new, budget)
    n_chunks = np.maximum(np.ceil(new / budget), 1.0)
    prompts = c * new
    per_answer = prompts / b.osl
    if per_step is not None:             # hook: dse.perf.spec (answers finish sooner)
        per_answer = per_answer * per_step
    avg = add(times(both, per_answer), times(pre_only, prompts))
    carried = add(avg, times(both, np.maximum(chunk - avg, 0.0)))
    share = np.minimum(avg / np.maximum(carried, 1e-30), 1.0)
    return PromptLoad(decoding, chunk, avg, carried, share, budget, n_chunks, new / n_chunks)


@dataclass(frozen=True)
class Context:
    """What the steps of one call share: the decode context summed over the layers (and its
    local layers' share where their kernel differs), a prompt's uncached tokens, its cached
    prefix and its causal pairs summed over the layers."""

    dec_ctx: np.ndarray
    loc: dict
    new: np.ndarray
    prior: np.ndarray
    pairs: np.ndarray
    zero: float             # a decode-only step's prefill tokens (basis.load: no arithmetic)


def context(b: Batch, k: Coefficients) -> Context:
    """A decode attends to the prompt and half the answer on average (a length distribution's
    straggler the longer: dse.perf.lengths); a prompt's new tokens follow its cached ones."""
    c = sequences(b)
    new = new_tokens(b)
    prior = b.isl - new
    ctx_tokens = b.isl + 0.5 * b.osl
    if lengths.on(b):                    # hook: length distributions (dse.perf.lengths)
        ctx_tokens = lengths.decode_context_tokens(b) * lengths.straggler(b, c)
    # the local layers' share, where their decode runs another kernel form (step.dec_local)
    loc = dict(dec_local=arch.local_context_layers(b, ctx_tokens)) if k.attn_core.win_on else {}
    return Context(arch.context_layers(b, ctx_tokens), loc, new, prior,
                   arch.prefill_pairs_layers(b, new, prior), 0.0)


def decode_step(b: Batch, k: Coefficients, x: Context, dq, breakdown: bool, q=None,
                sums: bool = True):
    """The decode-only step of one micro-batch: its ``dq / pp`` decode tokens (``q`` per
    sequence with speculation) read the weights and their sequences' KV, and each returns a
    token; what limits decoding and the decode share of the cost. Returns the step and its
    ``(compute, memory, network, bound shares)`` sums (None without ``sums``: the same step
    alone, as the request-rate path's queue times read it)."""
    pp = b.pp
    out = step(k, dq / pp, x.zero, x.dec_ctx, x.new, x.prior, x.pairs, dq / pp,
               breakdown, sums or breakdown, decode_step=True, seq_tokens=q, keep=True,
               **x.loc)
    if not breakdown:
        return (out[0], out[1:]) if sums else (out, None)
    return out, (out.compute_s.sum(0), out.memory_s.sum(0), out.network_s.sum(0),
                 bound_shares(out))


def prompt_step(b: Batch, k: Coefficients, x: Context, dq, load: PromptLoad, breakdown: bool,
                q=None):
    """A step that carries prompt tokens (a whole prompt or chunk, or the average load if
    larger) next to the decodes; with a prefill-only instance the batch of C prompts. The
    busiest attention-DP rank holds an even share of the prompt tokens when every rank has a
    whole chunk, else a whole chunk; the prompts that finish return their first token."""
    pp, dp, carried = b.pp, b.dp, load.carried
    rank_mean = carried / dp
    if lengths.on(b):                    # hook: the busiest rank's prompt tokens (dse.perf.lengths)
        rank_mean = np.minimum(rank_mean * lengths.prefill_straggler(
            b, carried / np.maximum(x.new, 1.0) / dp), carried)
    rank_carried = np.maximum(rank_mean, np.minimum(load.chunk, carried))
    done = times(1.0 - arch.phases(b)[2], carried) / np.maximum(x.new, 1.0)
    return step(k, dq / pp, carried / pp, x.dec_ctx, x.new, x.prior, x.pairs,
                (dq + done) / pp, breakdown, pre_rank=rank_carried / pp, seq_tokens=q, **x.loc)


def ttft_step(b: Batch, k: Coefficients, x: Context, load: PromptLoad, breakdown: bool, q=None):
    """A step that carries one of this request's prefill chunks next to the other running
    decodes: the chunk sits on one attention-DP rank, and the n chunks of a prompt attend to
    the cached prefix and to the earlier chunks (on average half the uncached prompt)."""
    pp, chunk = b.pp, load.per_chunk
    others = times(1.0 - arch.phases(b)[1], np.maximum(sequences(b) - 1.0, 0.0))
    chunk_pairs = x.pairs / load.n_chunks
    chunk_prior = x.prior + 0.5 * np.maximum(x.new - chunk, 0.0)
    oq = others if q is None else others * q
    return step(k, oq / pp, chunk, x.dec_ctx, chunk, chunk_prior, chunk_pairs,
                oq / pp + 1.0, breakdown, pre_rank=chunk, seq_tokens=q, **x.loc)


def steps(b: Batch, breakdown: bool, load: PromptLoad, k: Coefficients | None = None, q=None,
          sums: bool = True):
    """The three steps (``Breakdown``), the decode step's compute, memory and network sums and
    bound shares (None without ``sums``), and (speculative decoding, ``q`` = draft tokens + 1
    per sequence per step) the draft time per step."""
    k = Coefficients(b) if k is None else k
    x = context(b, k)
    decoding = load.decoding
    dq = decoding if q is None else decoding * q      # hook: dse.perf.spec (verify k+1 tokens)
    decode, sums = decode_step(b, k, x, dq, breakdown, q, sums)
    out = Breakdown(decode, prompt_step(b, k, x, dq, load, breakdown, q),
                    ttft_step(b, k, x, load, breakdown, q))
    if q is None:
        return out, sums, None
    # hook: dse.perf.spec -- the k draft steps of every pass, priced from a 1-token decode step
    pp = b.pp
    one = step(k, decoding / pp, x.zero, x.dec_ctx, x.new, x.prior, x.pairs, decoding / pp,
               decode_step=True, **x.loc)
    return out, sums, spec.draft_s(b, k, decoding / pp, one, b.isl + 0.5 * b.osl)


def mean_steps(st: Breakdown, load: PromptLoad, draft):
    """The decode-only step, the mean step (steps that carry prompt tokens and steps that only
    decode, in proportion) and the TTFT chunk step, each with its draft steps (dse.perf.spec)."""
    t_decode = st.total("decode")
    t_mixed = load.share * st.total("mixed") + (1.0 - load.share) * t_decode
    t_prefill = st.total("prefill")
    if draft is not None:
        t_decode = t_decode + draft
        t_mixed = t_mixed + draft
        t_prefill = t_prefill + draft
    return t_decode, t_mixed, t_prefill


def ttft(b: Batch, pass_s, t_prefill, load: PromptLoad, extra=0.0, tail: bool = True):
    """Time to first token of a request that finds no other prompt waiting (``ttft_unloaded_s``):
    the wait for the running step (half a pass, ``pass_s`` = pp mean steps), with an overlapped
    scheduler loop (``overlap_schedule`` 1) the step it already planned (a whole pass), the pp
    stage steps of each of the prompt's chunks (``t_prefill``; the first token is sent when its
    step ends) and the runtime's front end (``request_overhead_s``). The two waits scale with
    the share of the others in flight, ``1 - 1/C``: with no other request running the loop
    is idle and takes the prompt at once. An overlapped loop (SGLang ``event_loop_overlap``,
    TensorRT-LLM ``_executor_loop_overlap``, vLLM ``step_with_batch_queue``) reads new requests
    after launching step k + 1, so a request that arrives during step k runs in step k + 2; a
    synchronous one (vLLM ``EngineCore.step``) puts it in step k + 1
    (reports/end-to-end/scheduler-loops.md); a runtime that holds prompts to batch them
    (``batch_wait_iters``) adds those steps (``batch_wait_s``);
    ``extra``: the tier fetch's steps (dse.perf.kvtier). A prefill-only instance: one pass of
    its batch of prompts. Also a p90-length prompt's (dse.perf.lengths; None without length
    distributions or ``tail``)."""
    both, pre_only, dec_only = arch.phases(b)
    pp = b.pp
    busy = 1.0 - 1.0 / sequences(b)
    wait = (0.5 + b.overlap_schedule) * pass_s * busy
    if b.has_on("batch_wait_iters"):
        wait = wait + batch_wait_s(b, pass_s) * busy
    t = arch.blend(pre_only, pass_s, wait + pp * load.n_chunks * t_prefill + extra)
    t = add(t, front_end_s(b))
    if not (tail and lengths.on(b)):
        return t, None
    longer = np.maximum(lengths.isl_quantile(b) - b.isl, 0.0) * (1.0 - b.prefix_hit_fraction)
    return t, t + arch.blend(pre_only, pass_s * longer / np.maximum(new_tokens(b), 1.0),
                             pp * t_prefill * longer / np.maximum(load.per_chunk, 1.0))


def batch_wait_s(b: Batch, pass_s):
    """The steps a prompt is held to batch more prompt tokens (TensorRT-LLM's batch waiting,
    ``batch_wait_timeout_iters`` / ``batch_wait_max_tokens_ratio``, tensorrt_llm/_torch/
    pyexecutor/py_executor.py ``_waiting_requests``): while decodes run, a scheduler without
    attention data parallelism holds the waiting prompts until their tokens and the running
    decodes reach ``batch_wait_tokens_fraction x max_num_tokens`` or ``batch_wait_iters`` steps
    have passed. One prompt with the decodes below that mark waits the whole timeout
    (``batch_wait_iters`` passes; the prompts that join its wait share it, not counted: at the
    rates where one prompt stays below the mark they are few); at or above it, none. A running
    sequence counts its decode token and its draft tokens (``1 + num_draft_tokens`` a
    generation request; ``spec_tokens``). The caller scales it by the share of time decodes
    run, ``1 - 1/C``."""
    decodes = sequences(b) / b.dp * (1.0 + b.spec_tokens)
    held = new_tokens(b) + decodes < b.batch_wait_tokens_fraction * b.max_num_tokens
    return np.where(held & (b.dp == 1.0), b.batch_wait_iters * pass_s, 0.0)


def front_end_s(b: Batch):
    """The runtime's front-end time per request with no other request in the way
    (``request_overhead_s`` and tokenizing the prompt, ``dse.perf.frontend``; 0.0 when no row
    sets either): once in every TTFT, whichever pools a request passes."""
    return frontend.front_end_s(b)


def prompt_service_s(b: Batch, t_decode, t_prefill, load: PromptLoad):
    """How long one prompt holds its scheduler's prompt budget, S: its new tokens at the rate of
    a step full of prompt tokens, the step time affine in its prompt tokens between the
    decode-only step (``t_decode``, none) and the TTFT chunk step (``t_prefill``, ``per_chunk``
    of them): ``S = pp * new * (t_decode / budget + (t_prefill - t_decode) / per_chunk)``. A
    prompt shorter than the budget shares its step with the next ones."""
    new = new_tokens(b)
    slope = np.maximum(t_prefill - t_decode, 0.0) / np.maximum(load.per_chunk, 1.0)
    return b.pp * new * (t_decode / load.budget + slope)


def ttft_closed_loop(b: Batch, unloaded, service_s, cycle_s, clients=None):
    """The mean TTFT of a closed-loop benchmark (``ttft_s``, ../shared/contracts/predict-cases.md):
    ``num_requests`` requests (0: 10 x concurrency, as InferenceX sends), ``C`` in flight at any
    time, all ``C`` submitted at once at the start and a new one each time one finishes. Each
    scheduler (attention-DP rank) takes ``m = C / dp`` of them and its prompts queue for its
    prompt budget, each holding it ``S`` (``service_s``, ``prompt_service_s``):

    burst   the first C requests arrive together: one waits on average for half of the other
            ``m - 1`` prompts, ``0.5 (m - 1) S``
    steady  a request waits for the prompts the other ``m - 1`` users sent meanwhile, an M/D/1
            queue at the load the closed loop sets: those users return every ``cycle + W``
            (``cycle_s``: the unloaded TTFT plus the answer's other tokens), so
            ``rho = (m - 1) S / (cycle + W)`` and ``W = rho S / (2 (1 - rho))``, solved for W:
            ``W = (m - 1) S^2 / (a + sqrt(a^2 + 2 (m - 1) S^2))``, ``a = cycle - (m - 1) S``
            (finite at any load, 0 with one request in flight)

    The mean weighs the burst by ``C / N`` of the requests. ``clients``: the benchmark's
    concurrency where the runtime runs fewer at once (``b``'s concurrency, dse.perf.serve):
    the C above are the running ones, and a request first waits for a slot
    (``admission_wait_s``). With a serial front end (``dse.perf.frontend``) a request also
    queues for it behind the other clients' work (``frontend.wait_s``); each queue's wait
    lengthens the cycle the other sees, so the two are solved once more with the other's wait
    (the loop's two serial stations). A prefill-only instance: the unloaded TTFT (one pass of
    its batch of prompts)."""
    c = sequences(b)
    others = np.maximum(c / b.dp - 1.0, 0.0)
    burst = 0.5 * others * service_s
    n = requests_sent(b, c if clients is None else clients)
    first = np.minimum(c / n, 1.0)
    fe = frontend.on(b)
    fe_wait = 0.0
    for _ in range(2 if fe else 1):
        cycle = add(cycle_s, fe_wait)
        k = others * service_s * service_s
        a = cycle - others * service_s
        steady = k / np.maximum(a + np.sqrt(a * a + 2.0 * k), 1e-30)
        wait = first * burst + (1.0 - first) * steady
        if clients is not None:
            # a slot is held from admission to the last token: the loaded TTFT without the
            # front end (the request passes it before the scheduler sees it) and the answer's
            # other tokens
            hold = cycle_s + wait - front_end_s(b)
            wait = wait + admission_wait_s(clients, c, hold, np.minimum(clients / n, 1.0))
        if fe:
            everyone = c if clients is None else clients
            fe_wait = frontend.wait_s(b, everyone, cycle_s + wait,
                                      np.minimum(everyone / n, 1.0))
    return unloaded + times(1.0 - arch.phases(b)[1], add(wait, fe_wait))


def requests_sent(b: Batch, clients):
    """The requests a closed-loop benchmark sends, ``num_requests`` (0 or absent: 10 x its
    concurrency ``clients``, as InferenceX sends)."""
    if not b.has_on("num_requests"):
        return np.maximum(10.0 * clients, 1.0)
    return np.maximum(np.where(b.num_requests > 0, b.num_requests, 10.0 * clients), 1.0)


def admission_wait_s(clients, running, hold_s, first):
    """The mean wait for a slot in a closed loop of ``clients`` requests in flight (C) on a
    runtime that runs at most ``running`` (K) at once, each holding its slot ``hold_s`` (R):
    the K slots finish K / R requests a second, so a client's cycle is C R / K.

    steady  (C / K - 1) R: the closed network of C clients and K servers with no think time,
            every server busy (deterministic service: the requests' lengths are alike)
    burst   the first C, submitted at once: K start, and the j-th of the other q = C - K waits
            ceil(j / K) R for its slot, on average over the C
            ``R (K w (w + 1) / 2 + (q - w K)(w + 1)) / C``, ``w = floor(q / K)``

    weighed by ``first``, the share of the requests that are the first C (``C / N``). 0 where
    the runtime runs them all (C <= K)."""
    k = np.maximum(running, 1.0)
    q = np.maximum(clients - k, 0.0)
    w = np.floor(q / k)
    burst = hold_s * (k * w * (w + 1.0) * 0.5 + (q - w * k) * (w + 1.0)) / np.maximum(clients, 1.0)
    steady = hold_s * q / k
    return first * burst + (1.0 - first) * steady
