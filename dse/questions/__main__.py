"""``python -m dse.questions [NAME ...]``: regenerate the worked questions' reports.

Every ``spaces/questions/*.toml`` (or the named ones) is answered into ``reports/<name>/``, as
``dse answer spaces/questions/<name>.toml`` does one of them.
"""

import argparse
import os
import sys
import time

from dse.errors import InputError
from dse.questions import QUESTIONS_DIR, answer_space


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m dse.questions", description=__doc__)
    p.add_argument("names", nargs="*", help="question names (default: all)")
    a = p.parse_args(argv)
    files = sorted(QUESTIONS_DIR.glob("*.toml"))
    if a.names:
        known = {f.stem: f for f in files}
        try:
            files = [known[n] for n in a.names]
        except KeyError as e:
            print(f"dse: error: unknown question {e.args[0]!r}; known: {', '.join(known)}",
                  file=sys.stderr)
            return 2
    for f in files:
        t0 = time.monotonic()
        try:
            out = answer_space(os.path.relpath(f))
        except InputError as e:
            print(f"dse: error: {e}", file=sys.stderr)
            return 2
        print(f"{f.stem}: {out} ({time.monotonic() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
