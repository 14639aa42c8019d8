"""Application arrival times from a Mooncake trace, resampled into a submission window.

The Hermes paper samples application arrival times from the Mooncake trace's arrival-time
distribution and rescales them into the submission window (10, 15 or 30 minutes for 3x, 2x
and 1x load). :func:`resample_arrivals` draws ``n`` request timestamps from the trace
(without replacement when the trace has enough, so bursts are kept), sorts them and maps the
trace's span ``[first, last]`` linearly onto ``[0, window_s]``. Seeded.

Trace files (JSONL, or JSONL.gz, ``timestamp`` in ms) are found by name or path: an explicit
path, then the directory in ``$HERMES_TRACES``, then, for the names ``conversation`` and
``synthetic``, the arrival times shipped with Hermes (package data ``hermes/data/traces``: the
timestamps of the Mooncake traces, Apache-2.0, see the README there), so the benchmarks run
from any directory. In ``$HERMES_TRACES`` the names map to the full traces' file names,
``mooncake_conversation_trace.jsonl`` and ``mooncake_synthetic_trace.jsonl``.
"""

from __future__ import annotations

import gzip
import json
import os
from functools import lru_cache
from importlib import resources
from pathlib import Path

import numpy as np

TRACE_FILES = {
    "conversation": "mooncake_conversation_trace.jsonl",
    "synthetic": "mooncake_synthetic_trace.jsonl",
}


#: the shipped arrival times of the named traces (``hermes/data/traces``)
SHIPPED_TRACES = {
    "conversation": "mooncake_conversation_arrivals.jsonl.gz",
    "synthetic": "mooncake_synthetic_arrivals.jsonl.gz",
}
#: the shipped requests (timestamp, input and output lengths) of the named traces
SHIPPED_REQUESTS = {
    "conversation": "mooncake_conversation_requests.jsonl.gz",
}


class TraceNotFoundError(FileNotFoundError):
    """The arrival trace could not be found; the message lists where it was looked for."""


def shipped_traces_dir() -> Path:
    """The arrival traces shipped with Hermes (package data), wherever it is installed."""
    return Path(str(resources.files("hermes") / "data" / "traces"))


def trace_path(trace: str | os.PathLike[str], *, shipped: dict[str, str] | None = None) -> Path:
    """Resolve a trace name (``conversation``/``synthetic``) or path to an existing file.
    ``shipped``: the packaged files of the names (default :data:`SHIPPED_TRACES`, the
    arrival times)."""
    if shipped is None:
        shipped = SHIPPED_TRACES
    text = str(trace)
    fname = TRACE_FILES.get(text, text)
    tried: list[Path] = []
    direct = Path(fname).expanduser()
    if text not in TRACE_FILES or direct.is_absolute():
        tried.append(direct)
        if direct.is_file():
            return direct
    env = os.environ.get("HERMES_TRACES")
    if env:
        tried.append(Path(env) / Path(fname).name)
    if text in shipped:
        tried.append(shipped_traces_dir() / shipped[text])
    for p in tried:
        if p.is_file():
            return p
    if text in shipped:  # the shipped copy is missing: a broken installation
        hint = "reinstall hermes-gateway, or set HERMES_TRACES to a directory holding " + fname
    else:
        hint = ("pass the path of a JSONL trace (one {\"timestamp\": MS} a line), set "
                "HERMES_TRACES to the directory that holds it, or use a shipped trace: "
                + ", ".join(shipped))
    raise TraceNotFoundError(
        f"arrival trace {text!r} not found; looked in: {', '.join(str(p) for p in tried)} ({hint})"
    )


@lru_cache(maxsize=8)
def _load(path: str) -> np.ndarray:
    ts = []
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                ts.append(float(json.loads(line)["timestamp"]))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: bad trace line (need 'timestamp' in ms): {exc}") from None
    if not ts:
        raise ValueError(f"{path}: empty trace")
    arr = np.sort(np.asarray(ts)) / 1000.0
    arr.setflags(write=False)
    return arr


@lru_cache(maxsize=4)
def _load_requests(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ts, inp, out = [], [], []
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                ts.append(float(r["timestamp"]) / 1000.0)
                inp.append(int(r["input_length"]))
                out.append(int(r["output_length"]))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: bad trace line (need 'timestamp' in ms, "
                                 f"'input_length', 'output_length'): {exc}") from None
    if not ts:
        raise ValueError(f"{path}: empty trace")
    arrays = (np.asarray(ts), np.asarray(inp), np.asarray(out))
    for a in arrays:
        a.setflags(write=False)
    return arrays


def load_trace_requests(trace: str | os.PathLike[str] = "conversation"
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(timestamps s, input lengths, output lengths)`` of a trace's requests, in the file's
    order (read-only arrays): an explicit path, the full trace in ``$HERMES_TRACES``, or for
    ``conversation`` the copy shipped with Hermes (those three columns of every request)."""
    return _load_requests(str(trace_path(trace, shipped=SHIPPED_REQUESTS)))


def load_trace_timestamps(trace: str | os.PathLike[str]) -> np.ndarray:
    """Sorted request timestamps of a Mooncake trace, in seconds (read-only array)."""
    return _load(str(trace_path(trace)))


def resample_arrivals(
    n: int, window_s: float, *, trace: str | os.PathLike[str] = "conversation", seed: int = 0
) -> np.ndarray:
    """``n`` sorted arrival times in ``[0, window_s]`` following the trace's arrival pattern."""
    if n <= 0:
        return np.zeros(0)
    ts = load_trace_timestamps(trace)
    rng = np.random.default_rng(seed)
    picked = np.sort(rng.choice(ts, size=n, replace=n > ts.size))
    lo, hi = float(ts[0]), float(ts[-1])
    if hi <= lo:
        return np.zeros(n)
    return (picked - lo) / (hi - lo) * window_s
