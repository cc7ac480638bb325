"""The request-rate path's root finding (dse.perf.queueing): per row, the largest concurrency at
which an increasing quantity stays at or under its target, as ``queueing.bisect_increasing``
finds it, in a few evaluations of the queue's quantities instead of 24 of the whole model.

``Root`` is one such problem over the rows: a bracketed secant (Dekker's method) on a residual
about affine in C, falling back to the bracket's geometric midpoint where the secant lands
outside it or shrinks less than a bisection would, and stepping half the tolerance past a
converged point to close the bracket. (The queue's quantities are curved, not affine, between
their kinks: on dse.bench's queueing designs the TTFT, TPOT and S at the middle of a +-3%
interval of C miss the chord through its ends by a median 3e-6, 3e-6 and 4e-7 relative, ~the
interval squared; so a closed form on two points lands within the roots' ~1e-6 only from
points already that close, and the secant's ~4-5 steps a root stay. The saturation's residual
``C S - t R`` is quadratic even where S and R are affine: solving that quadratic on the last
two points' S and R cut its points 2.5% and no pass, its rows crossing kinks.)
Every point's side is the predicate the bisection tests, so the answer is a point that passes
within the tolerance of the smallest that fails above it: the bisection's answer (to its
resolution, or ``NOISE``) where the quantity is increasing, at a jump of it (one more prefill
chunk) the same point just below the jump. Where the quantity is not monotone (a KV tier's
fetch-or-recompute switch, a prefill chunk's jump) the bisection's answer is whichever crossing
its midpoints lead to, and this may be another. A row still open after ``SECANT_STEPS``
secant steps finishes by ``SECTIONS`` points per bracket at once (a jump: the secant stalls
there), in a pass of its own (``Root.tail``: those few rows, not every row the root holds).
A row's points depend on its values only, never on the rows scored with it.

``solve`` steps several problems together; those that share a ``Probe`` ask it in one pass a
step (a pass of the model costs a fixed ~1.5-2 ms of Python and numpy calls besides its
points: dse.bench's queueing entry made 55 passes and 30 recomputing sub-passes of the queue's
times before the request rate's and goodput's three roots shared one, 31 and 18 after), and
their sections share the probe's ``tail``. A probe scores the rows asked about at all the
concurrencies asked (a concurrency of shape (points, rows), a row's asks in its slots in turn:
one pass of the model), on a batch of only those rows once the points it would score in vain
exceed those rows and ``TAKE_ROWS`` (a batch and its coefficients cost about one point a row,
measured, and a fixed time: 554k points a bench call instead of 671k).

Tried on dse.bench's 20,000 queueing designs and measured, not kept: solving the rate's and
goodput's roots on [1, cap] in the saturation's passes, each row's answer on [1, c_sat] once
its c_sat is known (30 passes instead of 31 but 1.47M points instead of 554k, and 8 rows on
another crossing: above saturation the queue's quantities cross kinks the roots then chase);
sections after two or three secant steps that fell back to bisection instead of after
``SECANT_STEPS`` (37-42 passes instead of 31: the sections' tail passes run next to the other
rows' secant passes); ``SECTIONS`` 7 or 31 (35 passes and 499k points, 29 and 652k: no
better within the machine's noise).

What a bench call costs (the same 20,000 designs, CPU time at a load of 5-7 on 2 cores, so
+-5%): ~0.48-0.52 s, of which the probe's 31 passes of ``queue_probe.queue_times`` ~0.27 s (a pass
~1.7-2 ms fixed, Python and numpy calls, plus ~0.33 us a point scored: 521k points scored for
358k asked, the shared probe's grid being as deep as the row that asks most), 17 recursive
sub-passes for the rows whose KV tier recomputes at some point (~2 ms each on 3-50 points:
~39 ms, and ~11 ms taking their rows), the final float64 scoring at the operating point ~47 ms
and the p90 TPOT's float64 pass ~28 ms, the step coefficients ~35 ms, and this module's own
bookkeeping ~50 ms. Since then ``queue_probe.share_memos`` gives the runner's and the tier split's
batches the probe batch's concurrency-free memos (~17 a pass), ``queueing.md1_decay`` takes
Halley's steps, goodput's TTFT bound its secant in log C (``log_secant``: 47k points asked
instead of 72k; all roots 333k asked, 467k scored) and the tier's recomputing rows ride in
the probe's passes as tier-off twins (``queue_probe.probe``: 2 sub-passes instead of 17).

A take cost ~0.5 us a row (169 columns, 135 coefficient arrays), more than a point, so a grid
split by the rows' number of asks costs more than its padding (since ``Batch.take_lazy``, below:
~0.9 ms and ~0.07 us a row, then the ~60 columns the pass reads). 10^5 designs per CPU-second is
0.2 s here: less the final scoring, the TPOT pass and the coefficients (~0.11 s) that leaves
~0.09 s, some 15 passes and ~180k points scored (9 a design; 23.4 now) with no bookkeeping:
not within reach of the root finding alone; the points themselves (the step model's four
steps a point) would have to cost less.

Tried on them and measured, not kept (a later pass; points asked / scored, passes):
regula falsi (Illinois-weighted) through the bracket's ends where the secant is rejected
(358k / 504k, 32: no change; of the saturation's ~1,250 rows that end in sections most are
not at a jump but converging from one side on a residual that bends over a wide bracket, e.g.
C S - R from 53 and 3,664 to a root at 104.6); falsi after two points in a row on one side
(~375k asked: worse); with the falsi, ``SECANT_STEPS`` 12 (293k / 433k but 38 passes) or 16
(276k / 420k, 45 passes): the same CPU time at 12, slower at 16 (a straggler's pass costs its
fixed time); a pair of points a tolerance apart about a secant step under 50 tolerances, to
close the bracket in one pass (346k asked but 583k scored: the pairs deepen the shared grid).
The saturation's upper guess from S and R affine between C = 1 and the cap (the root of
``C S(C) = t R(C)`` on their chords, above the root where R bends up) instead of the power
law: its points 137k -> 129k, 14 passes still (~2% of the whole, within the noise: not kept);
its secant in log C (225k) or on ``log(rho / t)`` in log C (151k), or on ``1 - t R / (C S)``
in 1 / C (134k); the rate's secant in log C (94k against 65k), the TPOT bound's (~40k
against 22k): worse or no better. No bracket that ended in sections held a prefill chunk
count's jump (``ceil(new / budget)``), and with the KV tier off the saturation asked as many
points (150k against 137k): the tier's switch cost its recursive sub-passes (now its twins'
columns in the passes), not points.

The points' cost (a third pass, issue 28; dse.bench's 20,000 queueing designs, CPU time at a
load of 5-8 on 2 cores, so +-10%): a pass was ~2.6 ms fixed and ~0.22-0.33 us a point (472k
points scored, 33 passes of ``queue_probe.queue_times``), besides ~30 ms of coefficients (float64
and float32), ~40 ms of the final float64 scoring, ~30 ms of the float64 p90 TPOT pass and
~40 ms of this module's bookkeeping. Kept, each the same numbers: the collectives' kernel branch
picked by a bit blend (``forms.select``: ``np.where`` branches per element, ~5 multiplies' time
on these arrays, ~16 picks a point), the probe's rows taken lazily (``Batch.take_lazy``: a pass
reads ~60 of the ~170 columns) and through the batches replaced from them, ``forms.iadd``'s
shape test in Python (``np.broadcast_shapes``: ~8 us, 30 times a pass), the batch's
concurrency-free memos shared with the fit's and the final scoring's batches
(``queue_probe.at_concurrency``), the tier link's time without ``np.where`` (``kvtier.over_link``),
the runner's cap by ``np.minimum`` (``memory_fit.running``), and ``queueing.md1_decay``'s expm1
from exp where x >= 0.5 (numpy's float64 expm1 has no SIMD loop: 15.8 -> 12.6 ms of a call).
With the decode-only steps' tokens and flags as Python numbers (``basis.load``): at 20,000
designs (dse.bench's) ~50-53k -> ~56-59k designs per CPU-second, at 65,536 ~52-53k -> ~60-63k
(best of 5, old and new alternated three times, load ~5.5). Tried,
not kept: the float32 coefficients rounded from the float64 ones instead of computed again
(~12 ms; tests/test_kvtier.py wants the probe's float32 times bitwise those of float32
coefficients); a take weighed at half or a quarter of a point a row now that takes cost less
(no better within the noise); the large passes in row blocks of 2,500-10,000 rows for the
cache (slower: ~2.6 ms fixed a block). Not tried: one step call for the decode and draft
steps, and one for the prompt and TTFT steps (the Python of two step calls a pass, ~2% by the
profile; the decode step sums its total in another order than the draft's, so stacking those
two moves the float32 times). Where a point's time goes: ~four steps of ~150-200 numpy calls
each on arrays of (points, rows), of which numpy's float32 exp (the MoE's touched experts, once
a step) costs ~14 multiplies; no single term dominates, so 10^5 designs per CPU-second asks
for a step model with fewer terms a point, or fewer points.

A fourth pass (issue 28), measured in instructions (valgrind's cachegrind: one warm call on
dse.bench's 20,000 queueing designs, which the machine's load does not move) besides CPU
time: 1,654M instructions before. Where they went: the probe's takes (``ndarray.take``, ~7%),
copies (~7%), ``np.where`` (~5%), boolean-mask and two-axis fancy indexing (~12%, much of it
this module's bookkeeping), numpy's float64 exp and log (no SIMD loop on an AVX2 machine:
~7%, the roots' clamps and closing tests and ``queueing.md1_decay``), the step model's float32
arithmetic (~25%) and the float64 final scoring. Kept, the same numbers to the bit: a root
carries from step to step only the values its caller reads (``Root``'s ``keep``: none for the
rate's concurrency and the TPOT bound, the four that give the others for the saturation), its
secant steps read its arrays as views where no row is in sections, its clamps' exp once per
row, its brackets closed against ``exp(tol)`` (the log only within 1e-9 of it), settled rows
dropped by index arrays taken once, the probe's points placed and read by flat indices of its
grid (no two-axis fancy index) and goodput's pruning computed on the open rows only: 1,654M ->
1,477M instructions (31 passes and 470k points scored still). Tried, not kept (passes, points
scored; 31 and 470k before): sections that grow and aim, at a row's j-th step in sections
``8 2^j - 1`` points evenly through its bracket and the chord's root through its ends with
four points about it, after 7 secant steps (28 and 447k, ~1,460M instructions; branch
r-sections): the roots move within their tolerance, and tests/test_builder_equivalence.py
holds the shipped spaces' scored metrics to 1e-12 (one goodput moved 5.6e-8); a row's asks
beyond a pass's depth waiting a step where a few rows ask more than most (32-40 and 417-500k:
the rows that wait become the stragglers); the TTFT's or TPOT's bound starting a step after
the rate's (31-34, 495-523k); takes where the points scored in vain exceed a take's cost
1.5-5 times over (31, 454-463k: within the noise); a lazy gather of the coefficients (~15% of
the fields a take gathers are not read here: ~1%). What is left: ~31 passes of a fixed
~1.5-2 ms and ~0.1-0.3 us a point (the step model), the float64 final scoring and p90 TPOT
pass and the coefficients; 10^5 designs per CPU-second still asks for fewer passes (a pass per
step of the slowest rows: kinks and jumps at the roots) or a leaner step model a point.

A fifth pass (issue 28, deliverable 6; CPU time of warm calls on dse.bench's 20,000 queueing
designs at a load of 0.2-1, a call ~0.23-0.27 s, 74-87k designs per CPU-second, one tree's own
number moving +-8% from run to run). The probe's passes are float32 already
(``serve._served``: ``queue_probe.probe(b, k, np.float32)``); float64 are only the operating
point's scoring (~24 ms) and the two passes whose numbers are returned, the p90 TPOT's on
every row (~12 ms) and goodput's at the TPOT's bound (~4 ms with its take). Where a call goes
(timers around the functions): 31 passes and 3 sub-passes of ``queue_probe.queue_times``
~165 ms (490k points scored for 354k asked; a pass ~0.8 ms fixed, ~0.12 us a row held, ~0.2
us a point: ~650 numpy calls on whole (points, rows) arrays a pass, ~110 a step, no source
line above ~5% of them, ~6 of them the same operation twice), the probe's 15 takes ~15-20 ms
(~0.2 us a row), the coefficients ~16 ms (float64 and float32), the roots' bookkeeping ~30 ms
(goodput's TTFT test's ``md1_wait_quantile_s`` ~10 of it). tests/test_builder_equivalence.py
holds spaces/questions/rack-goodput.toml's scored metrics to 1e-12: a change of a row's points or
of the float32 arithmetic fails it, so what is left must give the same bits. No point is
asked twice (a row's points over passes and roots: 3,313 repeats of 354k, all the first
pass's rows whose cap is 1). Tried, the same bits, measured, not kept: the passes over 24,576
points in 2-3 blocks of their rows, for the caches (alone, a (8, 20,000) pass 39 -> 25 ms and a
(4, 14,772) one 12 -> 9.4 ms, but in the call the shared probe's (3, 14,772) passes 9.5 ->
11.5 ms: the blocks' fixed time and takes; of the call's passes only the (4, 14,772) one is
past the cache's cliff, ~2 ms to win); the whole call in chunks of 10,000 rows (68k designs
per CPU-second against 77k: each chunk pays every pass's fixed time and its own stragglers);
the steps' sums in place (``_compose``'s total, ``forms.fastest``'s first branch: no change,
allocation is not the cost); ``np.copyto(where=)`` for ``forms.select`` (2.7-5x slower). 10^5
designs per CPU-second is ~25% of the call: at the same bits neither the step model's
arithmetic a pass nor the passes' fixed time (~27 ms) holds that much; it asks for a leaner
step model a point, or root finding that may move the roots within their tolerance (and new
goldens for rack-goodput.toml). Measured for the latter (main, 2026-12-06, the bench's 20,000
designs, three alternated runs each at a load of ~2): ``NOISE`` 2e-6 -> 1e-4 moves TTFT by up
to 4.4e-4 and TPOT by 8.8e-5 (relative) for a median 51k -> 56k designs per CPU-second; 1e-3
(TTFT up to 5.7e-3) 58k. A looser root buys ~10%, not the 25%.

A sixth pass (issue 28, deliverable 6), where the returned numbers may move within a stated
budget (every returned float column of the bench's 20,000 designs: max relative change <= 1e-3,
median <= 1e-5, the NaN/inf pattern unchanged). The roots' tolerance is a modelling choice:
the model is good to ~10% (calibration error factors 1.13-1.34), so a root placed to 2e-6 in
log C was precision the numbers do not have. ``NOISE`` is 1e-4 in log C for the saturation and
goodput's two bounds, whose answers are well conditioned (the saturation rate, goodput and the
capped p90 TPOT move <= 9.2e-5); the rate's root, the operating point every reported metric is
scored at, takes ``queueing.RATE_NOISE`` = 2e-5: its queue waits amplify an error of C up to
~50 times near saturation (1 / (1 - rho); at 1e-4 the p90 TTFT over lengths moved 2.7e-3, the
TTFT 1.0e-3). Also: the p90 TPOT and goodput at the TPOT's bound come from the float32 probe
(<= 9e-7 relative), and the coefficients are computed once, in float32 (``serve._served``): a
float64 batch's rows at a rate take those rounded up (``Coefficients.astype``, ``blend``: ~6e-8
relative; ~18 ms of a call computed in float64 before, ~7 now; its other rows keep float64
ones, so a row's numbers do not depend on its batch). Measured on the bench's 20,000 designs:
31 passes and 3 float64 ones, 461k + 23k points scored -> 32 passes (all float32) and 411k
points; concurrency moved <= 9.9e-5, the saturation rate 9.6e-5, goodput 9.4e-5, the p90 TTFT
over lengths 8.7e-4 (medians <= 4e-7); past 1e-3 only rows at a step of the model and what is
ill conditioned at any tolerance: 1-2 rows land on the other side of a step of the decode
step (a collective's kernel switch 2e-6 to 5e-6 from the root, inside even the old tolerance:
decode network time 23-168%, as ``queueing``'s docstring allows), 1 infeasible row (reason 152: no sequence fits) whose
queue wait of ~2,700 s moves 1.65e-3 (1 / (1 - rho) amplifies the coefficients' rounding), the
whole-number ``max_concurrent_sequences`` one sequence apart on 7 rows, and small fractions
(``kv_offloaded_fraction``, ``prefix_cache_evicted_fraction``) by <= 1e-4 absolute. Tried and
not kept (passes, points scored): a pair of points a quarter tolerance either side of a secant
step under 2-8 tolerances, to close in one pass (32, 505-536k: the pairs deepen the grid); at
most 2 or 3 points of a row a pass over the roots sharing a probe, the later roots' rows
waiting (46 or 36, 389k or 436k: the same numbers, but the waiting bounds' tails grow); a row
past ``SECANT_STEPS`` whose next point closes its bracket kept out of sections (33, 397k);
``SECANT_STEPS`` 7-10 and ``SECTIONS`` 11-23 (30-36, 391-436k: within the noise); ``TAKE_ROWS``
0-8192 (no better); the saturation's points as first brackets of the rate's root (within 1.5x
of its answer on 0.1% of its rows: no use); the operating point scored in float32 (~7% faster,
but ``usd_per_mtok_input`` moved 3.6e-2, a cancellation: the reported numbers stay float64).

A seventh pass (issue 28, deliverable 6), every returned number the same to the bit (the
bench's 20,000 designs: all 45 returned columns bitwise equal to main's at 54b4412), measured in
instructions of one warm call (valgrind's callgrind, instrumentation on around the call only):
1,340M -> 1,260M, and in CPU time (5 processes of 3 warm calls each, main and branch
alternated, OMP_NUM_THREADS=1): a median 95.9k -> 102.0k designs per CPU-second at a load
of 0.2-0.6, 84.5k -> 100.1k at 1.4-2.2 (calls 64-112k: the load moves a call +-15%). Kept:
the probe's float32 batch converted as read (``Batch.astype_lazy``: 136 of 170 columns) and the KV tier's
recomputing rows taken as read (``tier_split.recomputing`` iterated every column, so the lazy
batch converted them all), -1.8%; a batch's column cached as an instance attribute on its first
read (``Batch.__getattr__``: ~6,000 reads a call), -1.2%; the M/D/1 decay solved once for the
p90 and p99 waits (``queueing.md1_wait_quantiles_s``), -1.3%; a probe take's fields off on
every row not tested again and ``forms.iadd``'s usual shape test without a generator, -0.6%;
``Coefficients.gather`` without the decode context's cache (its (points, rows) arrays were
taken on every gather and never read: each batch's steps compute their own), -0.4%;
``kvtier.cache_split`` and ``tier_hit`` without ``np.where`` where every row caches and has hit
tokens, -0.8%. Tried, not kept: ``forms.select`` for ``tier_split.fetch``'s ``np.where`` (no
fewer instructions). Not built: the p90 TPOT's ask in the shared passes (it needs the
operating point, known only once the rate's root settles; a pass's fixed time, ~0.5%). Where
a call goes now (callgrind): ``ndarray.take`` ~10% (the coefficients' gathers, 40k rows over 18
takes, the lazily taken columns, the memos), ``np.where`` ~3.8% (the roots' float64
bookkeeping, the tier), libm's float64 exp/log/log1p ~7% (``md1_decay``'s Halley steps, the
roots' clamps), the float32 step arithmetic and the Python of ~30 passes.

An eighth pass (issue 28, deliverable 6; the returned columns may move 2e-4 relative of main's
at 967e839 on the bench's 20,000 queueing designs), measured in instructions of one warm call
(callgrind, instrumentation on around the call: main 1,307.8M) and in CPU time of warm calls
alternated in one process (a load of 1.3-2.8 moves a call +-15% from run to run). Tried and
reverted: the decode step and the drafts' 1-token decode step in one ``step`` call, their tokens
stacked on a new axis (one step's Python a pass less; 1,282M, -2.0%; 78.1k -> 81.0k designs per
CPU-second in one process): its drafts' total, summed in the decode step's order, is a float32
rounding off the full path's, so ``queue_probe.queue_times`` no longer gives
``serve._instance(queue=True)``'s bits (tests/test_queueing_roots.py, one row in 42 at 7e-8
once the end-to-end refit of the twenty-first TTFT pass moved the numbers). Where a call goes
(CPU time, ~213 ms at a load of 1.5): the probe's passes ~135 ms (``queue_times`` ~125: ~1 ms
fixed a pass, ~0.2-0.35 us a point, (8,
1,250) and (1, 10,000) grids alike: points, not rows), the float64 scoring at the operating
point ~35 (~6 of it the recursive ``_instance`` of the ~14 rows whose tier recomputes there),
the finish ~10, the coefficients ~9, ``md1_wait_quantiles_s`` ~7, ``queue_cap`` ~6. Kept, the
same bits: a probe batch taken before one of its rows first recomputed its tier is taken
again, with the row's tier-off twin, after the pass that found it (``queue_probe.probe``;
tests/test_kvtier.py): one row of the 9,909 the saturation's second pass took ran a 1-row
sub-pass in each of passes 3-7 (~1-1.4 ms each, 9 sub-passes a call -> 4), 1,282M -> 1,268M, in
CPU time (best of 3 calls, median of 8-10, alternated in one process, load ~2.8) 84.4k -> 88.3k.
With the stacking too: 1,314.9M -> 1,268.0M (-3.6%; main's count moves ~0.5% from run to run),
and in CPU time of separate processes alternated (best of 3, median of 6, load ~3) 94.8k both:
below that noise. What bounds the rest: the saturation root must give main's bits, since a row
whose operating point is its saturation (or within ~1e-3 of it) scores its
waits at 1 / (1 - rho): ``NOISE`` 1.6e-4 (points scored 407.5k -> 403.8k) moved 22 such rows'
``ttft_p90_length_s`` by up to 1.3e-3; the rate's root may move (``RATE_NOISE`` 1.9e-5: every
column within 2e-4). Tried, not kept (points scored, instructions; main 30 passes, 287.7k asked,
407.5k scored): closing points in the shared probe's free slots (a row's slots up to 3, the
roots' open ones first: ``CLOSE`` 0.9 tolerance or ``REACH`` 0.5-2 times the secant's last step
ratio past the secant point, on the side it comes from) 388-390k but 1,366-1,399M and 243
against 234 ms (the 4th shared pass then takes 10,341 rows, +24M in ``ndarray.take``, and the
extra points' bookkeeping +10M of fancy indexing; 3 rows past 2e-4, one a decode step's flip,
``tpot_p90_s`` 17%); the saturation's probe at depth 2 (428-432k, no fewer passes); the
saturation's first points from ``1 / rho`` affine in ``1 / C`` through C = 1 and the cap, alone
or +-5-30% about it (open rows per step 9,900 9,898 9,699 7,788 5,451 3,656 against 9,895 9,865
8,890 5,887 3,288: its stragglers are kinks, not starts); goodput's two bounds bracketed first
by the saturation's points (the TTFT bound's open rows 9,911 9,404 7,300 2,580 against 10,382
9,567 9,246 6,277; 403k, but 1,427M: the TTFT test's M/D/1 on ~70k points, and 11 goodput rows
on another crossing, up to 14.7%); the rate's root from one first point (the two guesses'
geometric mean) with takes weighed by the passes to come (387k, 1,302M, 218.1 against 218.3 ms);
the TPOT bound in a probe of its own (42 passes, 1,430M); the prompt and TTFT steps in one
stacked call (the same bits, 1,310.5M: the prompt step's per-row prefix arrays become (points,
rows) ones); ``SECTIONS`` 31 or 63 for the shared roots alone (29 passes, 413-421k). 10^5
designs per CPU-second at this load asks ~15% more than this pass found: fewer points need the
saturation free to move (its kinks cost ~108k points, ~37k of them in sections), and the rest is
the step model's ~0.2 us a point.
"""

from __future__ import annotations

import numpy as np

RESOLUTION = 2.0 ** -24        # the bisection's: 24 halvings of the log C range
NOISE = 1e-4                   # and at least this (log C): the roots' tolerance, a modelling
                               # choice (float32 times place a root to ~1e-6; sixth pass)
TAKE_ROWS = 2048               # take the rows asked once the points scored in vain exceed
                               # those rows and this (a take's fixed time)
SECANT_STEPS = 8               # a row's secant steps before it finishes by sections
SECTIONS = 15                  # points per bracket and step there (16-fold narrower)
MAX_STEPS = 60                 # a bound only: a bisection step at least every other step


class Probe:
    """``at(rows)`` (``rows`` None: every row) -> a function of those rows' concurrency (shape
    (rows,) or (points, rows)) returning a tuple of arrays. ``probe(asks)``, ``asks`` a list of
    ``(idx, c)`` (sorted rows, their concurrency), scores them all in one call and returns a
    tuple of arrays per ask: a row's asks fill its slots of the points axis in turn, so asks on
    other rows (other roots', or their sections) share the slots (as many points as the row
    asked most, not one per ask). ``tail()``: the probe the roots that share this one send
    their sections to (their few rows at many points: a pass of their own)."""

    def __init__(self, at, n: int):
        self.at, self.n = at, n
        self.every = at(None)
        self.rows, self.fn = None, self.every
        self.pos = None                   # (a row's position among the rows held; -1: not held)
        self._tail = None

    def tail(self) -> Probe:
        if self._tail is None:
            self._tail = Probe(self.at, self.n)
        return self._tail

    def __call__(self, asks: list) -> list:
        idxs = [i for i, _ in asks]
        # each ask's slot per row: the asks before it on that row (a row's points, in turn)
        if len(asks) == 1:
            union, slots, k = idxs[0], [0], 1
        else:
            count = np.zeros(self.n, dtype=np.int64)
            slots = []
            for i in idxs:
                slots.append(count[i])
                count[i] += 1
            union, k = np.flatnonzero(count), int(count.max())
        if self.rows is not None and not np.all(self.pos[union] >= 0):   # not all held
            self.rows, self.fn, self.pos = None, self.every, None
        held = self.n if self.rows is None else len(self.rows)
        # take the rows asked where scoring the others too would cost more than taking them:
        # the points scored in vain this pass against the rows taken (a take costs about one
        # point a row, measured, and a fixed time; later passes ask fewer of the same rows)
        if k * (held - len(union)) > TAKE_ROWS + len(union):
            self.rows, self.fn, held = union, self.at(union), len(union)
            self.pos = np.full(self.n, -1, dtype=np.int64)
            self.pos[union] = np.arange(held)
        if len(asks) == 1 and len(idxs[0]) == held:
            return [tuple(np.broadcast_to(v, (held,)) for v in self.fn(asks[0][1]))]
        where = idxs if self.rows is None else [self.pos[i] for i in idxs]
        cc = np.ones((k, held))               # (the rows not asked about: any concurrency)
        # (each ask's slots and positions as flat indices of the grid: a one-axis take and
        # put, not a two-axis fancy index)
        flat = [s * held + p for s, p in zip(slots, where)]
        for f, (_, c) in zip(flat, asks):
            cc.put(f, c)
        out = [_flat(v, cc.shape) for v in self.fn(cc)]
        return [tuple(v.take(f) if v.ndim == 1 else v[0].take(p) for v in out)
                for f, p in zip(flat, where)]


def _flat(v, shape):
    """``v`` (a probe's output, of ``shape`` or broadcast to it) flat when it has a value per
    point, else its first row as a (1, rows) array."""
    v = np.asarray(v)
    if v.shape == shape and v.flags.c_contiguous:
        return v.reshape(-1)
    if v.ndim < 2 or v.shape[0] == 1:             # (the same value at every point of a row)
        return np.broadcast_to(v, (1, shape[-1]))
    return np.ascontiguousarray(np.broadcast_to(v, shape)).reshape(-1)


def _pick(ok, yes: dict, no: dict) -> dict:
    return {k: np.where(ok, yes[k], no[k]) for k in no}


def _put(out: dict, idx, got: dict, sel=None) -> None:
    for k, v in got.items():
        out[k][idx] = v if sel is None else v[sel]


class Root:
    """Per row (``on``; the others: ``lo``), the largest C in ``[lo, hi]`` that passes, as
    ``queueing.bisect_increasing`` finds it: ``lo`` where ``lo`` fails, ``hi`` less the
    bisection's resolution where ``hi`` passes, else found by ``solve`` (``c``, and ``out``
    the values there).

    ``test(idx, c, vals)`` -> ``(residual, ok, out)`` for the rows ``idx`` at ``c`` from the
    probe's values ``vals`` there: ``ok`` the predicate (NaN fails, as in the bisection),
    ``residual`` increasing in C, about affine (in log C with ``log_secant``: the secant
    through the last two points is taken there), 0 at the root (inf or NaN: a bisection step),
    ``out`` a dict of arrays; ``lo_out``, ``hi_out`` the same triple at ``lo`` and ``hi``;
    ``keep``: the keys of ``out`` the caller reads (None: all; the others are not carried from
    step to step).

    Every row's points depend on its own values only (its secant steps, then, after
    ``SECANT_STEPS`` of them, ``SECTIONS`` points per step), never on the other rows of the
    batch: a design's root is the same whatever it is scored with (tests/test_chunk_invariance)."""

    def __init__(self, probe, test, lo, hi, lo_out, hi_out, on, guess=None, log_secant=False,
                 keep=None, noise=None):
        self.probe, self.test, self.log_secant = probe, test, log_secant
        self.tail = probe.tail()          # (sections: their own pass, few rows)
        lo = np.broadcast_to(np.asarray(lo, dtype=np.float64), np.shape(on))
        hi = np.maximum(hi, lo)
        res = np.log(hi / lo) * RESOLUTION
        fails_lo = ~lo_out[1] | ~on | (res <= 0)
        at_hi = hi_out[1] & ~fails_lo
        self.c = np.where(fails_lo, lo, hi * np.exp(-res))
        no = lo_out[2] if keep is None else {k: lo_out[2][k] for k in keep}
        self.out = _pick(at_hi, hi_out[2], no)
        idx = np.flatnonzero(~fails_lo & ~at_hi)
        self.idx, self.a, self.b = idx, lo[idx].astype(np.float64), hi[idx].astype(np.float64)
        self.tol = np.maximum(res[idx], NOISE if noise is None else noise)
        self.up, self.down = np.exp(0.5 * self.tol), np.exp(-0.5 * self.tol)   # (the clamps)
        self.wide = np.exp(self.tol)                 # (a bracket is closed at b / a <= wide)
        self.x1, self.x2 = self.a.copy(), self.b.copy()
        self.f1 = np.asarray(lo_out[0], dtype=np.float64)[idx]
        self.f2 = np.asarray(hi_out[0], dtype=np.float64)[idx]
        self.at_a = {k: v[idx] for k, v in self.out.items()}
        self.last = 2.0 * (self.b - self.a)                # (the first secant step is free)
        self.prev = self.last.copy()
        self.steps = np.zeros(len(idx), dtype=np.int64)
        self.s = self.pts = self.sec = self.m = None
        # two first points from the physics (the caller's guesses, a lower and an upper one),
        # then secants through them
        self.guess = None if guess is None else \
            tuple(np.broadcast_to(g, np.shape(on))[idx] for g in guess)

    def active(self) -> bool:
        return len(self.idx) > 0

    def asks(self) -> list:
        a, b = self.a, self.b
        if self.guess is not None:                     # the caller's two first points
            lo_s = np.minimum(np.maximum(self.guess[0], a * np.exp(self.tol)), b)
            hi_s = np.maximum(np.minimum(self.guess[1], b * np.exp(-self.tol)), a)
            self.s, self.guess = (np.minimum(lo_s, hi_s), np.maximum(lo_s, hi_s)), None
            return [(self.probe, self.idx, self.s[0]), (self.probe, self.idx, self.s[1])]
        self.sec = sec = self.steps >= SECANT_STEPS
        # the secant's rows: every row but those in sections (all of them, as a view, on most
        # steps: no copy of each array the step reads)
        self.m = m = slice(None) if not sec.any() else ~sec
        asks = []
        if not sec.all():
            self.s = self._secant(m)
            asks.append((self.probe, self.idx[m], self.s))
        if sec.any():                                  # sections: the points of each bracket
            g = np.arange(1, SECTIONS + 1) / (SECTIONS + 1.0)
            self.pts = a[sec][None, :] * (b[sec] / a[sec])[None, :] ** g[:, None]
            asks += [(self.tail, self.idx[sec], p) for p in self.pts]
        return asks

    def _secant(self, m) -> np.ndarray:
        """The next point of the rows ``m``: the secant, a geometric bisection where it lands
        outside the bracket or shrinks less than a bisection would."""
        a, b, x1, f1, x2, f2 = (v[m] for v in (self.a, self.b, self.x1, self.f1, self.x2,
                                               self.f2))
        tol, prev, up, down = self.tol[m], self.prev[m], self.up[m], self.down[m]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            if self.log_secant:                    # (a residual nearer affine in log C)
                l1, l2 = np.log(x1), np.log(x2)
                s = np.exp(l2 - f2 * (l2 - l1) / (f2 - f1))
            else:
                s = x2 - f2 * (x2 - x1) / (f2 - f1)
            bad = ~np.isfinite(s) | (s <= a) | (s >= b) | (np.abs(s - x2) > 0.5 * prev)
        s = np.where(bad, np.sqrt(a * b), s)
        # converged (a step under the tolerance): a step of half of it past the last point,
        # to the other side, closes the bracket
        step = x2 * (0.5 * tol)
        close = np.abs(s - x2) < step
        s = np.where(close, np.where(x2 == a, x2 + step, x2 - step), s)
        s = np.minimum(np.maximum(s, a * up), b * down)
        self.prev[m] = self.last[m]
        self.last[m] = np.where(bad, b - a, np.abs(s - x2))
        return s

    def update(self, got: list) -> None:
        if isinstance(self.s, tuple):                  # the two first points
            for s, g in zip(self.s, got):
                f, ok, at_s = self.test(self.idx, s, g)
                ok, fail = ok & (s > self.a), ~ok & (s < self.b)
                self.a, self.b = np.where(ok, s, self.a), np.where(fail, s, self.b)
                self.at_a = _pick(ok, at_s, self.at_a)
                self.x1, self.f1 = self.x2, self.f2
                self.x2, self.f2 = s.astype(np.float64), np.asarray(f, dtype=np.float64)
            self.s = None
            return self._settle(self._closed())
        sec, first = self.sec, 0
        if not sec.all():
            m = self.m
            f, ok, at_s = self.test(self.idx[m], self.s, got[0])
            self.b[m] = np.where(ok, self.b[m], self.s)
            self.a[m] = np.where(ok, self.s, self.a[m])
            for k, v in self.at_a.items():
                v[m] = np.where(ok, at_s[k], v[m])
            self.x1[m], self.f1[m] = self.x2[m], self.f2[m]
            self.x2[m], self.f2[m] = self.s, f
            first = 1
        if sec.any():
            self._sections(sec, got[first:])
        self.steps += 1
        self._settle(self._closed())

    def _closed(self) -> np.ndarray:
        """The rows whose bracket is within the tolerance, ``log(b / a) <= tol``: the log taken
        only where ``b / a`` is within 1e-9 of ``exp(tol)`` (elsewhere the comparison with it
        decides the same; numpy's float64 log has no SIMD loop here)."""
        r = self.b / self.a
        done = r <= self.wide * (1.0 - 1e-9)
        near = np.flatnonzero((r > self.wide * (1.0 - 1e-9)) & (r < self.wide * (1.0 + 1e-9)))
        if near.size:
            done[near] = np.log(r[near]) <= self.tol[near]
        return done

    def _sections(self, sec, got: list) -> None:
        """The brackets of the rows ``sec`` from the first of their points that fails (and the
        point before it)."""
        idx, pts = self.idx[sec], self.pts
        m, k = len(idx), len(pts)
        vals = tuple(np.concatenate([np.asarray(v) for v in column]) for column in zip(*got))
        _, ok, at = self.test(np.tile(idx, k), pts.ravel(), vals)
        ok = ok.reshape(k, m)
        first = np.where(ok.all(0), k, np.argmin(ok, 0))
        rows, before = np.arange(m), np.maximum(first - 1, 0)
        moved = first > 0
        self.a[sec] = np.where(moved, pts[before, rows], self.a[sec])
        self.b[sec] = np.where(first < k, pts[np.minimum(first, k - 1), rows], self.b[sec])
        for key, v in self.at_a.items():
            v[sec] = np.where(moved, at[key].reshape(k, m)[before, rows], v[sec])
        self.pts = None

    def settle(self, done) -> None:
        """Settle the open rows ``done`` (a mask over ``idx``) where they stand: at the largest
        point found to pass (their answer no longer matters to the caller)."""
        self._settle(done)

    def _settle(self, done) -> None:
        if not np.any(done):
            return
        # (the rows as indices once, each array taken by them: a boolean mask is read again
        # for every array it selects from)
        gone, keep = np.flatnonzero(done), np.flatnonzero(~done)
        idx = self.idx.take(gone)
        self.c[idx] = self.a.take(gone)
        for k, v in self.at_a.items():
            self.out[k][idx] = v.take(gone)
        for name in ("idx", "a", "b", "tol", "up", "down", "wide", "x1", "f1", "x2", "f2",
                     "last", "prev", "steps"):
            setattr(self, name, getattr(self, name).take(keep))
        self.at_a = {k: v.take(keep) for k, v in self.at_a.items()}


def solve(roots: list, settle=None) -> None:
    """Step the problems ``roots`` (each with its own ``Probe``, ``root.probe``: the rows each
    holds are its own) until every row is settled (``MAX_STEPS`` bounds it: a bisection step at
    least every other step). ``settle()``, after each step, may settle rows whose answer no
    longer matters (``Root.settle``)."""
    for _ in range(MAX_STEPS):
        if settle is not None:
            settle()
        live = [r for r in roots if r.active()]
        if not live:
            return
        # a pass per probe: the roots that share a probe (their secant points) ask it together,
        # each root's sections go to its own tail
        asks = [r.asks() for r in live]
        got = [{} for _ in live]
        probes = []
        for a in asks:
            for x in a:
                if not any(x[0] is p for p in probes):
                    probes.append(x[0])
        for probe in probes:
            mine = [(i, j) for i, a in enumerate(asks) for j, x in enumerate(a) if x[0] is probe]
            for (i, j), v in zip(mine, probe([asks[i][j][1:] for i, j in mine])):
                got[i][j] = v
        for r, a, g in zip(live, asks, got):
            r.update([g[j] for j, _ in enumerate(a)])        # its few points, not rows
    for r in roots:                  # (not reached)
        if r.active():
            r.c[r.idx] = r.a
            _put(r.out, r.idx, r.at_a)
