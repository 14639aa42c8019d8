"""``hermes plan calibrate``: the cluster model against Vidur's measured profiles.

Reads ``$HERMES_VIDUR`` or the shipped ``hermes/data/reference/vidur`` (per-layer operator medians of
LLaMA-2-7B / -70B on A100, H100, A40 at TP 1-8; NCCL all-reduce and send/recv against message
size) and prints :mod:`hermes.core.cluster.calibration`'s table: per cell the modelled and
measured milliseconds and the relative error, then the cells beyond 15%. ``--fit`` refits
the devices' efficiencies (:data:`hermes.core.cluster.devices.EFFICIENCY`) and prints them.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import os
import sys
from collections import defaultdict
from pathlib import Path
from statistics import median
from typing import Any

from hermes.core.cluster.calibration import (
    PROFILE_DEVICES,
    PROFILE_MODELS,
    TABLE_SIZES,
    TOLERANCE,
    Cell,
    ComputeRow,
    NetworkRow,
    compute_cells,
    exceptions,
    network_cells,
)

#: Vidur's per-layer operators (its block composition; no embedding, LM head or attention)
LAYER_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
             "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")


def vidur_dir() -> Path:
    """``$HERMES_VIDUR``, else Vidur's profiles shipped with Hermes (package data, MIT:
    ``hermes/data/reference/vidur``, its LICENSE beside them), found from any directory."""
    env = os.environ.get("HERMES_VIDUR")
    if env:
        return Path(env)
    from importlib import resources

    return Path(str(resources.files("hermes") / "data" / "reference" / "vidur"))


def read_compute(root: Path) -> list[ComputeRow]:
    """Median per-layer operator time per (device, model, tp, tokens) of every profile."""
    rows: list[ComputeRow] = []
    for dev in PROFILE_DEVICES:
        for model in PROFILE_MODELS:
            path = root / "compute" / dev / "meta-llama" / model / "mlp.csv.gz"
            if not path.exists():
                raise ValueError(f"missing Vidur profile {path} (set HERMES_VIDUR)")
            by: dict[tuple[int, int], list[float]] = defaultdict(list)
            with gzip.open(path, "rt", newline="") as f:
                for r in csv.DictReader(f):
                    ms = sum(float(r[f"time_stats.{op}.median"]) for op in LAYER_OPS)
                    by[(int(r["num_tensor_parallel_workers"]), int(r["num_tokens"]))].append(ms)
            rows += [ComputeRow(dev, model, tp, t, median(v)) for (tp, t), v in sorted(by.items())]
    return rows


def _nearest(values: list[int], target: int) -> int:
    return min(values, key=lambda v: abs(v - target))


def read_network(root: Path, sizes: tuple[int, ...] | None = TABLE_SIZES) -> list[NetworkRow]:
    """Median collective times; with ``sizes``, only the measured sizes nearest them."""
    rows: list[NetworkRow] = []
    for path in sorted((root / "network").glob("*/*.csv.gz")):
        profile, collective = path.parent.name, path.name.split(".")[0]
        by: dict[tuple[int, int, int], list[float]] = defaultdict(list)
        with gzip.open(path, "rt", newline="") as f:
            for r in csv.DictReader(f):
                key = (int(r["num_workers"]), int(r["devices_per_node"]), int(r["size"]))
                by[key].append(float(r[f"time_stats.{collective}.median"]))
        groups: dict[tuple[int, int], list[int]] = defaultdict(list)
        for w, d, s in by:
            groups[(w, d)].append(s)
        for (w, d), measured in groups.items():
            pick = set(measured) if sizes is None else {_nearest(measured, t) for t in sizes}
            rows += [NetworkRow(profile, collective, w, d, s, median(by[(w, d, s)]))
                     for s in sorted(pick)]
    return rows


def calibration_table(root: Path | None = None) -> list[Cell]:
    root = root or vidur_dir()
    return compute_cells(read_compute(root)) + network_cells(read_network(root))


def fit_efficiency(root: Path | None = None) -> list[dict[str, Any]]:
    """Least-squares efficiencies per profiled device over every measured (model, tp, tokens)
    (the log ratio of model to measurement)."""
    import numpy as np
    from scipy.optimize import least_squares  # type: ignore[import-untyped]

    from hermes.core.cluster.cost import linear_layer_s
    from hermes.core.cluster.devices import DEVICES, Efficiency
    from hermes.core.cluster.models import MODELS

    rows = read_compute(root or vidur_dir())
    out = []
    for key, dev_name in PROFILE_DEVICES.items():
        data = [r for r in rows if r.device == key]
        base = DEVICES[dev_name]

        def residuals(x: Any, data: list[ComputeRow] = data, base: Any = base) -> Any:
            eff = Efficiency(float(x[0]), float(x[1]), float(x[2]) * 1e-6, float(x[3]), "fit")
            return np.array([np.log(linear_layer_s(base, MODELS[PROFILE_MODELS[r.model]], r.tp,
                                                    r.tokens, eff) * 1e3 / r.layer_ms)
                             for r in data])

        sol = least_squares(residuals, [0.8, 0.6, 20.0, 3.0],
                            bounds=([0.2, 0.1, 0.0, 1.0], [1.2, 1.0, 200.0, 20.0]))
        err = np.abs(np.exp(residuals(sol.x)) - 1.0)
        out.append({"profile": key, "hbm": round(float(sol.x[0]), 3),
                    "flops": round(float(sol.x[1]), 3),
                    "layer_overhead_us": round(float(sol.x[2]), 1),
                    "knee": round(float(sol.x[3]), 2), "points": len(data),
                    "max_err": round(float(err.max()), 3),
                    "share_over_15pct": round(float((err > TOLERANCE).mean()), 3)})
    return out


def _worst(cells: list[Cell]) -> float:
    errs = [c.rel_error for c in cells]
    return max(errs, key=abs) if errs else 0.0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from hermes.cliout import print_table, write_json

    root = Path(args.vidur) if args.vidur else vidur_dir()
    if args.fit:
        print_table(fit_efficiency(root), title="device efficiencies fitted to Vidur")
        return 0
    print("reading Vidur profiles ...", file=sys.stderr)
    cells = calibration_table(root)
    rows = [c.to_dict() for c in cells]
    if not args.quiet:
        print_table(rows, title="cluster model vs Vidur (ms)")
    bad = exceptions(cells)
    by_kind: dict[str, list[Cell]] = defaultdict(list)
    for c in cells:
        by_kind[c.kind].append(c)
    summary = [{"kind": k, "cells": len(v), "within_15pct": sum(abs(c.rel_error) <= TOLERANCE for c in v),
                "worst_rel_error": round(_worst(v), 3)}
               for k, v in by_kind.items()]
    print_table(summary, title="summary")
    print_table([c.to_dict() for c in bad], title=f"cells beyond {TOLERANCE:.0%}", empty="(none)")
    write_json(args.json, rows)
    return 0


def add_calibrate_parser(sub: Any) -> None:
    s = sub.add_parser("calibrate", help="the cluster model against Vidur's measured operator "
                       "and collective times (a table of cells)")
    s.add_argument("--vidur", help="Vidur data directory (default $HERMES_VIDUR or "
                   "the profiles shipped with Hermes)")
    s.add_argument("--json", metavar="FILE", help="write the cells here")
    s.add_argument("--fit", action="store_true", help="refit the device efficiencies and print them")
    s.add_argument("--quiet", action="store_true", help="print only the summary and exceptions")
    s.set_defaults(func=cmd_calibrate)
