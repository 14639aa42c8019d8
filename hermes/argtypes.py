"""argparse value types shared by the command lines (``hermes``, ``hermeslet``).

Each raises :class:`argparse.ArgumentTypeError`, so argparse names the flag in its error and
exits with status 2 before any work starts.
"""

from __future__ import annotations

import argparse
import math


def _finite(text: str, zero_ok: bool, want: str) -> float:
    """``text`` as a finite number >= 0 (``zero_ok``) or > 0; else the error saying ``want``."""
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if math.isnan(v) or math.isinf(v) or not (v >= 0 if zero_ok else v > 0):
        raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}")
    return v


def nonneg_float(text: str) -> float:
    """A finite number >= 0."""
    return _finite(text, True, "a finite number >= 0")


def positive_float(text: str) -> float:
    """A finite number > 0."""
    return _finite(text, False, "a number > 0")


def positive_int(text: str) -> int:
    """An integer >= 1."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def positive_floats(text: str) -> list[float]:
    """Comma-separated finite numbers > 0, at least one."""
    try:
        out = [positive_float(x.strip()) for x in text.split(",") if x.strip()]
    except argparse.ArgumentTypeError:
        out = []
    if not out:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers > 0, got {text!r}")
    return out


def int_list(text: str) -> list[int]:
    """Comma-separated integers, at least one."""
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    return out


def fraction(text: str) -> float:
    """A number in [0, 1)."""
    v = _finite(text, True, "a fraction in [0, 1)")
    if v >= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1), got {text!r}")
    return v
