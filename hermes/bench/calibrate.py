"""``hermes bench calibrate``: fit the engine cost model to measured GPU operator times.

Reads Vidur's published per-operator profiles (``$HERMES_VIDUR`` or
the shipped ``hermes/data/reference/vidur``: ``compute/<gpu>/meta-llama/<model>/mlp.csv.gz``, medians
in ms against ``num_tokens`` and ``num_tensor_parallel_workers``) and produces the calibrated
coefficients of :class:`~hermes.core.costmodel.CostModel` for each setup of :data:`SPECS`
(``--write`` regenerates :mod:`hermes.core.engine_calibration`, the committed table the core
reads; nothing here is needed at run time). Then it prices a grid of iterations with the
model and with the reference and prints both with the relative error of each cell.

What each term comes from (one iteration; Vidur's own composition of an iteration,
``vidur/entities/execution_time.py``: per-layer operators x layers + CPU overhead):

- **Per-token operators** (QKV / output projections, MLP up / act / down, two RMSNorms, rope,
  the residual add; Vidur counts one add per layer and no embedding or LM head, whose time
  is inside its sampler's CPU+GPU time): the measured medians summed per layer, times the
  layers, against the iteration's tokens (prefill tokens + decode sequences). Fitted as a
  piecewise-linear function of the tokens on fixed knots (:data:`KNOTS`), least squares on
  the relative error over every profiled token count (1..4,096); beyond 4,096 tokens the last
  segment's slope is extrapolated (the profiles stop there).
- **The paper's A100-40GB** (``llama2-7b-a100-cal``): Vidur's A100 is the 80 GB card (1,935 GB/s
  PCIe; its network profiles are of pairwise-NVLink A100 nodes). The 40 GB card has the same
  tensor cores and 1,555 GB/s: a linear-layer GEMM takes ``max(measured, its one-token time x
  1,935 / 1,555)``: weight streaming 24% slower where it is memory-bound, unchanged where the
  measured time is compute-bound.
- **Decode attention** (not in the published snapshot, derived): the KV bytes read,
  ``2 x layers x kv_heads x head_dim x 2 B`` per context token, at the *achieved* HBM
  bandwidth of the profiled one-token linear layers (weight bytes / measured time: ~1.52 TB/s
  on the 80 GB card, 79% of its peak; the same 79% of 1,555 GB/s on the 40 GB card). Why that
  fraction: a decode attention kernel is a stream over the KV cache like a GEMV over the
  weights; paged kernels (vLLM's paged_attention v2, FlashInfer) reach 70-85% of peak on long
  contexts, and the GEMVs measured on the same GPU are the in-situ figure.
- **Prefill attention** (derived): ``4 x layers x hidden`` FLOPs per (new token, attended
  token) pair, causal, at 50% of the 312 TFLOPS fp16 peak: FlashAttention-2's forward pass
  reaches 50-73% of peak on A100 (Dao, 2023); 50% for serving's short, variable-length
  batches.
- **CPU per iteration** (schedule, sampler, prepare inputs, process outputs; Vidur's
  ``cpu_overheads.csv`` for LLaMA-2-7B, TP 1, on A100, batch 8..64, repository
  microsoft/vidur, file ``data/profiling/a100/cpu_overheads.csv`` at commit 0633efa; the
  medians are :data:`VIDUR_CPU_MS`, not in the shipped profiles): a linear fit ``c0 + c1 x sequences``.
  ``vllm-0.4``: all four (vLLM of that era ran them in the engine loop, synchronously with
  the GPU: ~2 ms at batch 8, ~7.6 ms at 64). ``vllm-v1``: schedule + sampler + prepare inputs
  (V1 builds and detokenises outputs in a separate process, overlapped with the GPU).
  Outside batch 8..64 the fit is extrapolated.

Reference ("measured") per cell: the measured per-layer operators at the cell's tokens
(interpolated between the two nearest profiled token counts), x layers (the 40 GB rule above
for that setup), + the derived attention terms, + the CPU medians of :data:`VIDUR_CPU_MS`
(interpolated; the linear fit outside 8..64). The model: ``CostModel.iteration_s`` of the
committed coefficients. The error thus measures the compact model against the measured
operator tables and CPU profile; attention is derived on both sides and contributes none.
No real forward pass is timed here (a GPU check is left for a machine that has one).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import math
import os
import pprint
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np

#: Vidur per-layer operators summed into one layer's per-token time (its block composition)
LAYER_OPS = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
#: the weight-streaming GEMMs among them (memory-bound at few tokens)
GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")

#: knots (iteration tokens) of the piecewise-linear per-token operator time: a pair at each
#: step of the measured staircase (GEMM tile / wave quantisation: e.g. +44% from 128 to 136
#: tokens on the A100), sparser where the time grows smoothly
KNOTS = (1, 32, 64, 72, 128, 136, 192, 200, 256, 264, 384, 392, 512, 520, 576, 592, 640, 648,
         768, 776, 960, 968, 1152, 1168, 1280, 1296, 1408, 1424, 1792, 2048, 2080, 2560, 2592,
         3072, 3584, 4096)

#: Vidur ``cpu_overheads.csv`` medians (ms), LLaMA-2-7B, TP 1, A100 (microsoft/vidur
#: data/profiling/a100/cpu_overheads.csv @ 0633efa, MIT): batch -> (schedule, sampler e2e,
#: prepare inputs e2e, process model outputs)
VIDUR_CPU_MS: dict[int, tuple[float, float, float, float]] = {
    8: (0.1651, 0.8878, 0.2932, 0.6244),
    16: (0.2783, 0.9446, 0.4391, 1.1354),
    24: (0.3817, 0.9560, 0.5363, 1.6339),
    32: (0.5798, 1.1264, 0.6710, 2.2457),
    40: (0.6169, 1.0757, 0.7922, 2.6512),
    48: (0.7416, 1.1630, 0.9148, 3.2317),
    56: (0.8395, 1.2473, 1.0398, 3.6074),
    64: (0.9522, 1.3703, 1.1630, 4.1083),
}
#: which CPU parts are on the iteration's critical path, per scheduler mode (module doc)
CPU_PARTS = {"vllm-0.4": (0, 1, 2, 3), "vllm-v1": (0, 1, 2)}
#: scheduler settings per mode: (max_batched_tokens, chunked_prefill, max_num_seqs)
MODE_SCHED = {"vllm-v1": (8192, True, 256), "vllm-0.4": (4096, False, 256)}

#: dense fp16 tensor peak of the profiled cards (datasheets: A100 312 TFLOPS; H100 SXM5 989.4;
#: the H200 has the H100's compute)
PEAK_FP16_FLOPS = {"a100": 312e12, "h100": 989.4e12}
PREFILL_ATTN_MFU = 0.5


@dataclass(frozen=True, slots=True)
class Spec:
    """One setup to calibrate: which profile, which card."""

    gpu: str  # profile directory
    model: str  # meta-llama/<model>
    layers: int
    tp: int
    profiled_bw: float  # peak HBM bytes/s of the profiled card
    card_bw: float  # peak HBM bytes/s of the setup's card
    kv_capacity_tokens: int
    card: str


SPECS: dict[str, Spec] = {
    # the Hermes paper's card: A100-40GB PCIe; ~20 GB of KV after weights and activations
    "llama2-7b-a100-cal": Spec("a100", "Llama-2-7b-hf", 32, 1, 1935e9, 1555e9, 40_000,
                               "A100-40GB (1,555 GB/s), derived from the A100-80GB profile"),
    # the profiled card: 0.9 x 80 GB - 13.5 GB weights - ~2.5 GB activations = ~56 GB of KV
    "llama2-7b-a100-80g-cal": Spec("a100", "Llama-2-7b-hf", 32, 1, 1935e9, 1935e9, 110_000,
                                   "A100-80GB (1,935 GB/s), as profiled"),
    # Vidur's H100 is the DGX H100's SXM5 card (its network profiles: h100_dgx), 3,352 GB/s;
    # 0.9 x 80 GB - 13.5 GB - ~2.5 GB = ~56 GB of KV, as the A100-80GB
    "llama2-7b-h100-cal": Spec("h100", "Llama-2-7b-hf", 32, 1, 3352e9, 3352e9, 110_000,
                               "H100-80GB SXM5 (3,352 GB/s), as profiled"),
    # H200: the H100's compute with 141 GB at 4,800 GB/s; 0.9 x 141 - 16 = ~111 GB of KV.
    # Only a slower card's memory-bound GEMMs are rescaled (the 40 GB rule above), so its
    # linear layers are priced as the H100's: what `hermes bench forward` on an H200 checks
    "llama2-7b-h200-cal": Spec("h100", "Llama-2-7b-hf", 32, 1, 3352e9, 4800e9, 220_000,
                               "H200 (4,800 GB/s), derived from the H100 profile"),
}


#: uncalibrated setups priced against a calibrated setup's reference (same model and card)
REFERENCE_OF = {"llama2-7b-a100": "llama2-7b-a100-cal",
                "llama2-7b-a100-ideal": "llama2-7b-a100-cal"}


def vidur_dir() -> Path:
    """``$HERMES_VIDUR``, else Vidur's profiles shipped with Hermes (package data, MIT:
    ``hermes/data/reference/vidur``, its LICENSE beside them), found from any directory."""
    env = os.environ.get("HERMES_VIDUR")
    if env:
        return Path(env)
    from importlib import resources

    return Path(str(resources.files("hermes") / "data" / "reference" / "vidur"))


# ----------------------------------------------------------------------------- measured tables
@dataclass(slots=True)
class Profile:
    """Measured per-layer operator medians (ms) of one model on one GPU at one TP degree."""

    tokens: np.ndarray  # profiled token counts, ascending
    layer_ms: np.ndarray  # sum of LAYER_OPS per layer
    gemm_ms: np.ndarray  # sum of GEMM_OPS per layer
    shape: dict[str, int]

    def at(self, tokens: float) -> tuple[float, float]:
        """(layer ms, GEMM ms) at ``tokens``, interpolated between profiled counts."""
        if tokens > self.tokens[-1]:
            raise ValueError(f"{tokens} tokens: beyond the profile ({int(self.tokens[-1])})")
        return (float(np.interp(tokens, self.tokens, self.layer_ms)),
                float(np.interp(tokens, self.tokens, self.gemm_ms)))


def load_profile(spec: Spec, root: Path | None = None) -> Profile:
    """The measured operator medians of ``spec``'s model and GPU (median over duplicate
    rows of a token count)."""
    path = (root or vidur_dir()) / "compute" / spec.gpu / "meta-llama" / spec.model / "mlp.csv.gz"
    by: dict[int, list[dict[str, str]]] = defaultdict(list)
    shape: dict[str, int] = {}
    with gzip.open(path, "rt", newline="") as f:
        for row in csv.DictReader(f):
            if int(row["num_tensor_parallel_workers"]) != spec.tp:
                continue
            by[int(row["num_tokens"])].append(row)
            shape = {k: int(row[k]) for k in ("n_head", "n_kv_head", "n_embd", "n_expanded_embd")}
    if not by:
        raise ValueError(f"{path}: no rows for tensor parallelism {spec.tp}")
    toks = sorted(by)

    def med(rows: list[dict[str, str]], ops: tuple[str, ...]) -> float:
        return sum(median(float(r[f"time_stats.{op}.median"]) for r in rows) for op in ops)

    return Profile(
        tokens=np.array(toks, dtype=np.float64),
        layer_ms=np.array([med(by[t], LAYER_OPS) for t in toks]),
        gemm_ms=np.array([med(by[t], GEMM_OPS) for t in toks]),
        shape=shape,
    )


# ----------------------------------------------------------------------------- derived terms
def weight_bytes_per_layer(shape: dict[str, int], tp: int) -> float:
    """fp16 bytes of one layer's linear weights on one GPU (QKV, output, gate+up, down)."""
    d, ff = shape["n_embd"], shape["n_expanded_embd"]
    kv = d * shape["n_kv_head"] // shape["n_head"]
    return 2.0 * (d * (d + 2 * kv) + d * d + 3 * d * ff) / tp


def kv_bytes_per_token(spec: Spec, shape: dict[str, int]) -> int:
    """KV cache bytes per token, all layers, on one GPU (K and V, fp16)."""
    kv = shape["n_embd"] * shape["n_kv_head"] // shape["n_head"]
    return 2 * spec.layers * kv * 2 // spec.tp


@dataclass(frozen=True, slots=True)
class Derived:
    """The derived (not measured) figures of a setup."""

    achieved_bw: float  # bytes/s the one-token GEMMs reach on the setup's card
    bw_fraction: float  # of the card's peak
    decode_s_per_ctx_token: float
    prefill_attn_s_per_pair: float
    mem_floor_gemm_ms: float  # per layer: the one-token GEMM time on the setup's card


def derive(spec: Spec, prof: Profile) -> Derived:
    gemm1 = float(prof.gemm_ms[0])  # ms per layer at the smallest profiled count (1 token)
    profiled_bw = weight_bytes_per_layer(prof.shape, spec.tp) / (gemm1 * 1e-3)
    frac = profiled_bw / spec.profiled_bw
    bw = frac * spec.card_bw
    flops_per_pair = 4.0 * spec.layers * prof.shape["n_embd"] / spec.tp
    return Derived(
        achieved_bw=bw,
        bw_fraction=frac,
        decode_s_per_ctx_token=kv_bytes_per_token(spec, prof.shape) / bw,
        prefill_attn_s_per_pair=flops_per_pair / (PREFILL_ATTN_MFU * PEAK_FP16_FLOPS[spec.gpu]),
        mem_floor_gemm_ms=gemm1 * spec.profiled_bw / spec.card_bw,
    )


def reference_gemm_ms(spec: Spec, prof: Profile, der: Derived, tokens: float) -> float:
    """Reference time (ms, all layers) of the weight GEMMs alone at ``tokens`` tokens on
    ``spec``'s card: the profiled GEMMs, none faster than the card's one-token (memory-bound)
    floor (module doc: the 40 GB rule for a slower card)."""
    _, gemm = prof.at(tokens)
    return spec.layers * max(gemm, der.mem_floor_gemm_ms)


def reference_tokens_ms(spec: Spec, prof: Profile, der: Derived, tokens: float) -> float:
    """Reference per-token operator time (ms, all layers) of an iteration of ``tokens``
    tokens: the layers' other profiled operators plus :func:`reference_gemm_ms`."""
    layer, gemm = prof.at(tokens)
    return spec.layers * (layer - gemm) + reference_gemm_ms(spec, prof, der, tokens)


def cell_terms(kind: str, batch: int, prompt: int, context: int
               ) -> tuple[int, int, int, int, float]:
    """``(decode sequences, prefill tokens, prefill sequences, KV context tokens read by the
    decodes, causal prefill pairs)`` of a grid cell (:func:`grid`: ``decode``, ``prefill`` or
    ``mixed``)."""
    if kind == "decode":
        return batch, 0, 0, batch * context, 0.0
    if kind == "prefill":
        return 0, batch * prompt, batch, 0, batch * 0.5 * prompt * prompt
    if kind == "mixed":
        return batch - 1, prompt, 1, (batch - 1) * context, 0.5 * prompt * prompt
    raise ValueError(f"unknown cell kind {kind!r} (decode | prefill | mixed)")


def reference_cpu_ms(mode: str, seqs: int) -> tuple[float, bool]:
    """Vidur's CPU medians for ``seqs`` sequences (interpolated), and whether the value is
    the linear fit's extrapolation (outside the profiled batch sizes)."""
    bs = sorted(VIDUR_CPU_MS)
    parts = CPU_PARTS[mode]
    ys = [sum(VIDUR_CPU_MS[b][i] for i in parts) for b in bs]
    if bs[0] <= seqs <= bs[-1]:
        return float(np.interp(seqs, bs, ys)), False
    c0, c1 = fit_cpu(mode)
    return (c0 + c1 * seqs) * 1e3, True


def fit_cpu(mode: str) -> tuple[float, float]:
    """Least-squares ``(c0, c1)`` seconds: CPU per iteration and per sequence."""
    bs = sorted(VIDUR_CPU_MS)
    parts = CPU_PARTS[mode]
    ys = [sum(VIDUR_CPU_MS[b][i] for i in parts) for b in bs]
    c1, c0 = np.polyfit(np.array(bs, dtype=float), np.array(ys), 1)
    return float(c0) * 1e-3, float(c1) * 1e-3


def fit_knots(xs: np.ndarray, ys: np.ndarray, knots: tuple[int, ...]) -> np.ndarray:
    """Values at ``knots`` of the piecewise-linear function that minimises the squared
    relative error to ``(xs, ys)`` (hat-function basis, weighted least squares)."""
    k = np.asarray(knots, dtype=np.float64)
    basis = np.zeros((xs.size, k.size))
    for j in range(k.size):
        e = np.zeros(k.size)
        e[j] = 1.0
        basis[:, j] = np.interp(xs, k, e)
    w = 1.0 / ys
    sol, *_ = np.linalg.lstsq(basis * w[:, None], ys * w, rcond=None)
    out: np.ndarray = sol
    return out


def _sig(x: float, digits: int = 6) -> float:
    return float(f"{x:.{digits}g}")


def fit_setup(name: str, root: Path | None = None) -> dict[str, Any]:
    """The calibrated coefficients of setup ``name`` (one entry of the committed table)."""
    spec = SPECS[name]
    prof = load_profile(spec, root)
    der = derive(spec, prof)
    g = np.array([reference_tokens_ms(spec, prof, der, t) for t in prof.tokens])
    vals = fit_knots(prof.tokens, g, KNOTS) * 1e-3
    knots = [[k, _sig(v - vals[0])] for k, v in zip(KNOTS, vals, strict=True)]
    knots[0][1] = 0.0
    tail = (vals[-1] - vals[-2]) / (KNOTS[-1] - KNOTS[-2])
    modes: dict[str, Any] = {}
    for mode, (budget, chunked, seqs) in MODE_SCHED.items():
        c0, c1 = fit_cpu(mode)
        modes[mode] = {
            "base_s": _sig(c0 + vals[0]),
            "decode_s_per_seq": _sig(c1),
            "prefill_seq_s": _sig(c1),
            "prefill_s_per_token": _sig(tail),
            "decode_s_per_ctx_token": _sig(der.decode_s_per_ctx_token),
            "prefill_attn_s_per_pair": _sig(der.prefill_attn_s_per_pair),
            "token_knots": knots,
            "max_batched_tokens": budget,
            "chunked_prefill": chunked,
            "max_num_seqs": seqs,
        }
    return {
        "card": spec.card,
        "profile": f"vidur compute/{spec.gpu}/meta-llama/{spec.model}/mlp.csv.gz, TP {spec.tp}",
        "achieved_hbm_fraction": round(der.bw_fraction, 4),
        "achieved_hbm_gb_s": round(der.achieved_bw / 1e9, 1),
        "kv_capacity_tokens": spec.kv_capacity_tokens,
        "kv_bytes_per_token": kv_bytes_per_token(spec, prof.shape),
        "modes": modes,
    }


TABLE_HEADER = '''"""Calibrated engine cost coefficients: GENERATED, do not edit.

Regenerate with ``hermes bench calibrate --write`` (``hermes.bench.calibrate``: how each
figure is fitted and where it comes from). Read by :mod:`hermes.core.costmodel`; plain data,
so the core needs no file at run time.
"""

from __future__ import annotations

from typing import Any

'''


def render_table(table: dict[str, Any]) -> str:
    """The source text of :mod:`hermes.core.engine_calibration` for ``table``."""
    body = pprint.pformat(table, indent=1, width=96, sort_dicts=True)
    return f"{TABLE_HEADER}CALIBRATION: dict[str, Any] = {body}\n"


def table_path() -> Path:
    return Path(__file__).resolve().parents[1] / "core" / "engine_calibration.py"


def fit_all(root: Path | None = None) -> dict[str, Any]:
    return {name: fit_setup(name, root) for name in SPECS}


# ----------------------------------------------------------------------------- the grid
DECODE_BATCHES = (1, 8, 32, 64, 128, 256)
DECODE_CONTEXTS = (256, 1024, 4096)
PREFILL_CELLS = ((1, 128), (1, 512), (1, 1024), (1, 2048), (1, 4096), (4, 256), (4, 1024),
                 (16, 256))
MIXED_CELLS = ((8, 512, 1024), (32, 512, 1024), (64, 2048, 512), (128, 1024, 256))


def grid(spec: Spec, mode: str) -> list[tuple[str, int, int, int]]:
    """Cells ``(kind, batch, prompt_tokens, context_tokens)``:

    - ``decode``: ``batch`` sequences decoding, each with ``context_tokens`` of context;
    - ``prefill``: ``batch`` prompts of ``prompt_tokens`` prefilled together;
    - ``mixed`` (``vllm-v1`` only: the 0.4 scheduler never mixes): ``batch - 1`` decodes with
      ``context_tokens`` each and one ``prompt_tokens`` prefill chunk.

    Cells whose KV does not fit the setup, or whose tokens exceed the mode's budget or the
    profiled range (4,096), are left out."""
    budget = MODE_SCHED[mode][0]
    cells = [("decode", b, 0, c) for b in DECODE_BATCHES for c in DECODE_CONTEXTS
             if b * (c + 1) <= spec.kv_capacity_tokens]
    cells += [("prefill", b, p, 0) for b, p in PREFILL_CELLS if b * p <= min(budget, 4096)]
    if MODE_SCHED[mode][1]:
        cells += [("mixed", d + 1, p, c) for d, p, c in MIXED_CELLS
                  if d + p <= 4096 and d * (c + 1) + p <= spec.kv_capacity_tokens]
    return cells


def calibration_rows(
    setup: str, mode: str = "vllm-v1", root: Path | None = None
) -> list[dict[str, Any]]:
    """Model vs reference per-iteration time over :func:`grid` (module doc). An uncalibrated
    setup of :data:`REFERENCE_OF` is priced against its calibrated twin's reference."""
    from hermes.core.costmodel import get_cost_model

    base = setup.partition("@")[0]
    ref = REFERENCE_OF.get(base, base)
    if ref not in SPECS:
        raise ValueError(f"no reference for {base!r}; setups: {', '.join([*SPECS, *REFERENCE_OF])}")
    spec = SPECS[ref]
    cost = get_cost_model(setup, mode=None if "@" in setup else mode)
    mode = cost.mode
    prof = load_profile(spec, root)
    der = derive(spec, prof)
    rows = []
    for kind, b, p, c in grid(spec, mode):
        dec, pre_tok, pre_seqs, ctx, pairs = cell_terms(kind, b, p, c)
        tokens = pre_tok + dec
        cpu_ms, extrapolated = reference_cpu_ms(mode, b)
        measured = (reference_tokens_ms(spec, prof, der, tokens) + cpu_ms
                    + 1e3 * (der.decode_s_per_ctx_token * ctx
                             + der.prefill_attn_s_per_pair * pairs))
        model = 1e3 * cost.iteration_s(pre_tok, dec, ctx, prefill_seqs=pre_seqs,
                                       prefill_pairs=pairs)
        rows.append({
            "setup": cost.name, "mode": mode, "kind": kind, "batch": b, "prompt_tokens": p,
            "context_tokens": c, "tokens": tokens, "model_ms": round(model, 3),
            "measured_ms": round(measured, 3), "rel_error": round((model - measured) / measured, 4),
            "cpu_ms": round(cpu_ms, 3), "cpu_extrapolated": extrapolated,
        })
    return rows


def print_rows(rows: list[dict[str, Any]], title: str) -> None:
    print(title)
    head = f"{'kind':<8}{'batch':>6}{'prompt':>8}{'context':>9}{'tokens':>8}" \
           f"{'model ms':>10}{'meas. ms':>10}{'error':>8}  cpu"
    print(head)
    print("-" * len(head))
    for r in rows:
        cpu = f"{r['cpu_ms']:.2f}{'*' if r['cpu_extrapolated'] else ''}"
        print(f"{r['kind']:<8}{r['batch']:>6}{r['prompt_tokens']:>8}{r['context_tokens']:>9}"
              f"{r['tokens']:>8}{r['model_ms']:>10.2f}{r['measured_ms']:>10.2f}"
              f"{100 * r['rel_error']:>7.1f}%  {cpu}")
    worst = max(abs(r["rel_error"]) for r in rows)
    print(f"cells: {len(rows)}, worst |error| {100 * worst:.1f}% "
          f"(* CPU from the linear fit outside Vidur's batch 8..64)")


def cmd_calibrate(args: argparse.Namespace) -> int:
    root = Path(args.vidur) if args.vidur else None
    if not (root or vidur_dir()).is_dir():
        print(f"no Vidur profiles at {root or vidur_dir()} (set --vidur or $HERMES_VIDUR)",
              file=sys.stderr)
        return 2
    if args.write:
        path = table_path()
        text = render_table(fit_all(root))
        changed = not path.is_file() or path.read_text() != text
        if changed:
            path.write_text(text)
        print(f"{path}: {'rewritten' if changed else 'unchanged'}", file=sys.stderr)
        if changed:
            print("the new coefficients take effect in a fresh process", file=sys.stderr)
    rows = calibration_rows(args.setup, args.mode, root)
    print_rows(rows, f"calibrate ({rows[0]['setup']}, {rows[0]['mode']}): per-iteration time")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    worst = max(abs(r["rel_error"]) for r in rows)
    return 0 if worst <= args.tolerance or math.isnan(worst) else 1


def add_calibrate_parser(bsub: argparse._SubParsersAction[Any]) -> None:
    """Add ``calibrate`` to ``hermes bench``."""
    s = bsub.add_parser("calibrate", help="engine cost model vs measured GPU operator times")
    s.add_argument("--setup", default="llama2-7b-a100-cal",
                   help=", ".join([*SPECS, *REFERENCE_OF]) + " (NAME@MODE too)")
    s.add_argument("--mode", default="vllm-v1", help="vllm-v1 | vllm-0.4 (CPU overhead, budget)")
    s.add_argument("--vidur", default=None,
                   help="Vidur profile directory (default: $HERMES_VIDUR, else the profiles shipped with Hermes)")
    s.add_argument("--json", default=None, help="write the rows as a JSON list to FILE")
    s.add_argument("--tolerance", type=float, default=0.10,
                   help="exit status 1 when a cell's |relative error| exceeds it (default 0.10)")
    s.add_argument("--write", action="store_true",
                   help="refit and rewrite hermes/core/engine_calibration.py first")
    s.set_defaults(func=cmd_calibrate)
