"""Durations as a person writes them: ``90s``, ``45m``, ``8h``, ``1d`` or plain seconds."""

from __future__ import annotations

import math
import re

from dse.errors import InputError


def parse_duration(text: str, what: str = "--budget") -> float:
    """'90s', '45m', '8h', '1d' or plain seconds -> seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", str(text))
    if not m:
        raise InputError(f"{what} {text!r} is not a duration", hint="e.g. 90s, 45m, 8h")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def seconds(value: float | str | None, what: str = "budget") -> float | None:
    """A duration in seconds: a number >= 0, or a duration such as "90s", "45m", "8h"
    (None stays None)."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not (math.isfinite(value) and value >= 0):
            raise InputError(f"{what} {value!r} must be a number of seconds >= 0",
                             hint="or a duration such as 90s, 45m, 8h")
        return float(value)
    return parse_duration(str(value), what)
