"""The runtime's front end: a fixed time per request, and one serial server all requests share.

A served request passes the runtime's front end: the HTTP server, the tokenizer, the
detokenizer and the streaming of its answer. Two parts:

delay   ``request_overhead_s``: a fixed time per request in every TTFT (hand-offs between the
        API server and the engine); it occupies nothing, so it does not queue
serial   the work one front-end process does for every request, one request at a time (SGLang's
        TokenizerManager and DetokenizerManager, vLLM's API-server process, trtllm-serve's:
        one Python process each, however many GPUs serve): tokenizing the prompt
        (``frontend_prompt_token_s`` per prompt token, before the first token) and streaming
        the answer (``frontend_token_s`` per output token, and ``frontend_text_token_s`` per
        token of text each chunk repeats where the runtime streams the whole text so far:
        SGLang's default, ``incremental_streaming_output = False``,
        sgl-project/sglang python/sglang/srt/server_args.py, whose OpenAI adapter cuts each
        chunk's delta from the cumulative text, ``delta = text[offset:]``)

and, where a front end does some work for every request whatever its lengths (request set-up
and hand-offs: ``frontend_request_s``, r; fitted for the Dynamo front end of aiconfigurator's
benchmark rows, 0 on the runtimes' own servers), that too, before the first token. So the
per-request work is ``S = r + p isl + t osl + x osl (osl + 1) / 2`` and the instance serves at
most ``1 / S`` requests a second, whatever its GPUs do. In a closed loop of ``C`` clients:

- the C streams' tokens pass the one server: a stream gets a token at most every
  ``C (t osl + x osl (osl + 1) / 2) / osl`` seconds, which bounds the TPOT from below
  (``streamed_tpot``);
- a new request queues for the server behind the other ``C - 1`` clients' work, an M/D/1 queue
  at the load the loop sets (as the prompt budget's queue, ``dse.perf.phases.ttft_closed_loop``):
  ``W = (C - 1) S^2 / (a + sqrt(a^2 + 2 (C - 1) S^2))``, ``a = cycle - (C - 1) S``, in the
  TTFT (``wait_s``): 0 with one client, and as C grows the cycle tends to ``(C - 1) S``, so the
  throughput to ``1 / S``; the first C, submitted at once, wait on average for half the other
  prompts' tokenization.

At a request rate (dse.perf.queueing) the server is an M/D/1 queue at load ``rate x S``: the
instance's queue is the busier of the prompt budget and the front end (``serial_service_s``),
so its saturation rate is at most ``1 / S``.

A runtime may run ``k`` such processes (``frontend_processes``: SGLang's
``--tokenizer-worker-num``, vLLM's ``--api-server-count``, one per data-parallel rank by
default, several trtllm-serve servers behind a router), the requests spread evenly over them:
each serves ``C / k`` of the clients, so the streaming bound and the closed loop's wait are
those of ``C / k`` clients, and at a request rate the ``k`` servers act as one of service time
``S / k`` (the M/D/1 queue of their pooled capacity ``k / S``: exact at saturation, a little
above the M/D/k wait below it).

The numbers are the runtime's, fitted end to end (dse.calibration.fit, efficiency.toml
[runtimes.*]); every one 0 (a batch built without them): no serial front end.
"""

from __future__ import annotations

import numpy as np

from dse.perf.batch import Batch

SERIAL = ("frontend_prompt_token_s", "frontend_token_s", "frontend_text_token_s",
          "frontend_request_s")


def on(b: Batch) -> bool:
    """Whether any row has a serial front end."""
    return any(b.has_on(f) for f in SERIAL)


def front_end_s(b: Batch):
    """The front end's time in every TTFT, with no other request in the way: the fixed time per
    request (``request_overhead_s``), tokenizing the prompt and the serial work per request
    (0.0 when no row sets any)."""
    t = b.request_overhead_s if b.has_on("request_overhead_s") else 0.0
    if b.has_on("frontend_prompt_token_s"):
        t = t + b.frontend_prompt_token_s * b.isl
    if b.has_on("frontend_request_s"):
        t = t + b.frontend_request_s
    return t


def chunks(b: Batch):
    """The chunks a streamed answer of ``osl`` tokens goes out in: the first token at once, then
    one chunk every ``stream_interval`` (k) tokens, ``n = (osl - 1) / k + 1`` (``osl`` where
    every token is sent, k = 1: no arithmetic where no row streams chunks)."""
    k = getattr(b, "stream_interval", None)
    if k is None or (isinstance(b, Batch) and not b.has_on("stream_interval")):
        return b.osl
    return (np.maximum(b.osl, 1.0) - 1.0) / np.maximum(k, 1.0) + 1.0


def stream_s(b: Batch):
    """The serial server's time streaming one request's answer: ``t n + x n (osl + 1) / 2`` for
    its ``n`` chunks (``chunks``; n = osl where every token is a chunk), each chunk's work and,
    where a runtime streams the whole text so far, the text it repeats (the chunks end at
    evenly spaced tokens from the first to the last, ``(osl + 1) / 2`` on average)."""
    n = chunks(b)
    return b.frontend_token_s * n + b.frontend_text_token_s * n * (b.osl + 1.0) * 0.5


def serial_s(b: Batch):
    """The serial server's work per request, S (its fixed work, tokenizing the prompt and
    streaming the answer)."""
    return b.frontend_request_s + b.frontend_prompt_token_s * b.isl + stream_s(b)


def streamed_tpot(b: Batch, tpot, streams):
    """The TPOT a client sees: the engine's ``tpot``, or, where the front end cannot stream the
    ``streams`` running answers' tokens that fast, the time it takes to stream one token of each
    (``streams x stream_s / osl``)."""
    if not on(b):
        return tpot
    return np.maximum(tpot, streams / processes(b) * stream_s(b) / np.maximum(b.osl, 1.0))


def processes(b: Batch):
    """The front-end processes the requests are spread over (at least one)."""
    return np.maximum(getattr(b, "frontend_processes", 1.0), 1.0)


def wait_s(b: Batch, clients, cycle_s, first):
    """A request's mean wait for its serial server in a closed loop of ``clients`` (C) requests
    in flight, each returning every ``cycle_s`` plus this wait (the M/D/1 queue at the loop's
    load, module docstring), the first C (``first``: their share of the requests) waiting
    instead for half the other requests' work before their first token (fixed and
    tokenizing); with ``k`` processes the C / k clients of one process take the place of
    the C."""
    s = serial_s(b)
    m = np.maximum(clients / processes(b) - 1.0, 0.0)   # the other clients of its process
    k = m * s * s
    a = cycle_s - m * s
    steady = k / np.maximum(a + np.sqrt(a * a + 2.0 * k), 1e-30)
    burst = 0.5 * m * (b.frontend_request_s + b.frontend_prompt_token_s * b.isl)
    return first * burst + (1.0 - first) * steady


def serial_service_s(b: Batch, service_s):
    """The service time of the instance's busiest serial server at a request rate: the prompt
    budget's (``service_s``) or the front end's, S."""
    return np.maximum(service_s, serial_s(b) / processes(b)) if on(b) else service_s
