"""Compare app models with the measured reference profiles (``app-profiles.json``).

The reference file ships with the package (``hermes/data/reference/app-profiles.json.gz``,
found from any directory). Nothing here is needed at run time: the app models carry
hand-picked parameters, and this module measures how far they are from the file.
Path: ``$HERMES_REFERENCE`` (plain or gzipped JSON), else the shipped copy.
"""

from __future__ import annotations

import gzip
import json
import os
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from hermes.core.records import RunRecord


def reference_path() -> Path:
    """Where the reference profiles are: ``$HERMES_REFERENCE``, else the shipped copy."""
    env = os.environ.get("HERMES_REFERENCE")
    if env:
        return Path(env)
    from importlib import resources

    return Path(str(resources.files("hermes") / "data" / "reference" / "app-profiles.json.gz"))


def load_reference(path: str | Path | None = None) -> dict | None:
    """The reference profiles (JSON, gzipped when the name ends in ``.gz``), or ``None`` when
    the file is absent."""
    p = Path(path) if path is not None else reference_path()
    if not p.is_file():
        return None
    if p.suffix == ".gz":
        with gzip.open(p, "rt") as fh:
            return json.load(fh)
    with p.open() as fh:
        return json.load(fh)


def stage_samples(records: Iterable[RunRecord]) -> dict[str, dict[str, list[float]]]:
    """Per LLM unit, the reference's metrics measured on run records.

    ``prompt_tokens``/``completion_tokens``: one value per request; ``parallelism``: one per
    invocation; ``loops``: invocations per run (runs that reach the unit).
    """
    out: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for rec in records:
        loops: dict[str, int] = defaultdict(int)
        for u in rec.units:
            if not u.is_llm:
                continue
            s = out[u.unit]
            for r in u.requests or ():
                s["prompt_tokens"].append(r.input_tokens)
                s["completion_tokens"].append(r.output_tokens)
            s["parallelism"].append(len(u.requests or ()))
            loops[u.unit] += 1
        for unit, k in loops.items():
            out[unit]["loops"].append(k)
    return {u: dict(m) for u, m in out.items()}


def compare(
    records: Iterable[RunRecord],
    reference_app: dict,
    metrics: tuple[str, ...] = ("prompt_tokens", "completion_tokens"),
) -> dict[str, dict[str, tuple[float, float]]]:
    """Per reference stage and metric, ``(model mean, measured mean)``."""
    model = stage_samples(records)
    result: dict[str, dict[str, tuple[float, float]]] = {}
    for stage in reference_app["stage_order"]:
        ref = reference_app[stage] if stage in reference_app else reference_app["stages"][stage]
        result[stage] = {
            m: (
                float(np.mean(model[stage][m])) if stage in model else float("nan"),
                float(np.mean(ref[m])),
            )
            for m in metrics
            if ref.get(m)
        }
    return result
