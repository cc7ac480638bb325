"""Mutation check of the physics tests: does changing one physics term by 20% fail a test that
is not a golden?

    python tests/mutation.py                     # every scorer field the model reads
    python tests/mutation.py gemm_fraction moe_fraction --factor 0.8

For each field of the scorer's struct of arrays (``dse.perf.batch.FIELDS``: hardware specs,
fitted kernel and efficiency parameters, model structure, layout, workload) it runs the
physics tests (hand-worked closed-form cases, TTFT, EP all-to-all and overlap, disaggregated
serving, properties: not ``tests/test_goldens.py``) with that field multiplied by ``--factor``
wherever the scorer reads it (``DSE_MUTATE=field=factor``, applied by ``tests/conftest.py``),
stopping at the first failure, and prints which test caught it. A field no test catches is a
term whose physics no test pins down. Run it after changing the model; it takes about a minute
per uncaught field on two cores.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ["tests/test_closed_form.py", "tests/test_ttft_physics.py", "tests/test_ep_overlap.py",
         "tests/test_disaggregated.py", "tests/test_properties.py", "tests/test_kernel_comm.py",
         "tests/test_cost_model.py"]
# layout, workload and switches: inputs a test sets itself, not terms of the model
NOT_PHYSICS = {"tp", "pp", "ep", "dp", "prefill_tp", "prefill_pp", "prefill_ep", "prefill_dp",
               "disaggregated", "phase", "isl", "osl", "concurrency", "prefill_concurrency",
               "demand_output_tokens_per_s", "use_rental", "a2a_mode", "two_batch_overlap",
               "dense_replicated", "tied", "prefill_chip_ratio"}


def main(argv=None) -> int:
    sys.path.insert(0, str(ROOT))
    from dse.perf.batch import FIELDS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("fields", nargs="*", help="fields to mutate (default: every physics field)")
    ap.add_argument("--factor", type=float, default=1.2)
    a = ap.parse_args(argv)
    names = a.fields or [f for f in FIELDS if f not in NOT_PHYSICS]
    missed, t0 = [], time.perf_counter()
    for i, name in enumerate(names, 1):
        env = dict(os.environ, DSE_MUTATE=f"{name}={a.factor}")
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                            *TESTS], cwd=ROOT, env=env, capture_output=True, text=True)
        caught = [ln.split(" ")[1] for ln in r.stdout.splitlines() if ln.startswith("FAILED ")]
        rate = (time.perf_counter() - t0) / i
        status = f"caught by {caught[0]}" if caught else ("NOT CAUGHT" if r.returncode == 0
                                                           else f"error (exit {r.returncode})")
        if not caught:
            missed.append(name)
        print(f"[{i}/{len(names)}, {rate:.0f} s each, ETA {rate * (len(names) - i) / 60:.0f} min]"
              f" {name} x {a.factor}: {status}", flush=True)
    print(f"{len(names) - len(missed)} of {len(names)} fields caught; not caught: "
          f"{', '.join(missed) or 'none'}")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
