"""``hermes bench forward``: the calibrated engine model against real forward passes on a GPU.

The calibrated cost model (:mod:`hermes.bench.calibrate`) is fitted to Vidur's published
operator profiles, and two of its terms are derived rather than measured: decode attention
(KV bytes at the achieved HBM bandwidth of the profiled GEMVs) and prefill attention (FLOPs at
50% of the fp16 peak). Issue 18 asks, where a GPU is lent, for a check against a real forward
pass (never in CI: CI has no GPU). This module is that check, in two halves that can run on
different machines:

- :func:`measure` (needs ``torch`` and ``transformers``; run it where the GPU is, e.g.
  ``python -m hermes.bench.forward_check --out F``): builds LLaMA-2-7B's architecture with
  random fp16 weights (the weights' values do not change a forward pass's time; no download),
  and times, per cell of :data:`CELLS`, one forward pass of the decoder stack (no LM head,
  which Vidur's per-layer figures leave out too): a prefill of ``batch`` prompts of
  ``prompt_tokens``, or one decode step of ``batch`` sequences over ``context_tokens`` of KV
  cache. The time is the sum of the GPU kernels' durations (``torch.profiler``), so the
  Python launch gaps of an eager HF model are not counted (vLLM replays decode steps as CUDA
  graphs), split by kernel name into GEMMs, attention, the HF cache's concatenation copies
  (``DynamicCache`` copies the whole KV each decode step; vLLM writes one slot: left out of
  the total) and the rest (norms, rotary, activation, residual adds; HF runs them unfused).
- :func:`compare` (pure; ``hermes bench forward --measured F``): prices the same cells with
  the setup's Vidur reference (GEMMs and per-layer operators as profiled), the derived
  attention terms and the committed compact model's GPU part (its iteration time minus its
  CPU term), and gives each term's relative error against the measurement.

What differs from a vLLM forward pass, and so is not the model's error: HF runs QKV and the
gate/up projections as separate GEMMs (vLLM merges them) and its norms, rotary and activation
as separate elementwise kernels (vLLM fuses them); its attention is PyTorch's
``scaled_dot_product_attention`` (FlashAttention-2 kernels for these shapes) over contiguous
KV, where vLLM's is paged. The GEMM and attention columns are the like-for-like ones.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

#: (kind, batch, prompt_tokens, context_tokens): decode cells at most 65,536 KV tokens in
#: all (an 80 GB card holds them beside the weights and one prefill's activations)
CELLS: tuple[tuple[str, int, int, int], ...] = (
    ("decode", 1, 0, 512), ("decode", 1, 0, 2048), ("decode", 8, 0, 512),
    ("decode", 8, 0, 2048), ("decode", 32, 0, 512), ("decode", 32, 0, 2048),
    ("decode", 64, 0, 1024), ("decode", 128, 0, 512),
    ("prefill", 1, 128, 0), ("prefill", 1, 512, 0), ("prefill", 1, 1024, 0),
    ("prefill", 1, 2048, 0), ("prefill", 1, 4096, 0), ("prefill", 4, 1024, 0),
    ("prefill", 16, 256, 0),
)
#: LLaMA-2-7B (meta-llama/Llama-2-7b-hf config.json)
LLAMA2_7B = {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000,
             "max_position_embeddings": 4096, "rms_norm_eps": 1e-5}
#: a model small enough for a CPU (tests)
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 128,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5}
#: kernel (or, on a CPU, operator) classes, tested in this order on the lower-cased name
_ATTENTION = ("flash", "fmha", "attention", "sdpa", "attn_fwd")
_CAT = ("catarray", "cat_batched", "aten::cat")
_CACHE_COPY = ("index_copy",)
_GEMM = ("gemm", "gemv", "nvjet", "cutlass", "xmma", "cublas", "matmul", "splitk",
         "aten::mm", "aten::addmm", "aten::bmm")
CLASSES = ("gemm", "attention", "other", "cache_copy")
#: kernel instances kept per cell in the measurement (for re-analysis without a GPU)
KEEP_KERNELS = 4000
#: the setup each measured device is compared with (first match of the device's name)
SETUP_OF_DEVICE = (("h200", "llama2-7b-h200-cal"), ("h100", "llama2-7b-h100-cal"),
                   ("a100-sxm4-80gb", "llama2-7b-a100-80g-cal"),
                   ("a100 80gb", "llama2-7b-a100-80g-cal"), ("a100", "llama2-7b-a100-cal"))


def classify(name: str) -> str:
    """``gemm``, ``attention``, ``cat``, ``cache_copy`` or ``other`` for a kernel or operator
    name (attention first: FlashAttention's kernel names mention cutlass too). ``cat`` is a
    concatenation: HF's rotary embedding (``rotate_half``) or its cache's append
    (:func:`split_passes` tells them apart)."""
    n = name.lower()
    if any(k in n for k in _ATTENTION):
        return "attention"
    if any(k in n for k in _CAT):
        return "cat"
    if any(k in n for k in _CACHE_COPY):
        return "cache_copy"
    if any(k in n for k in _GEMM):
        return "gemm"
    return "other"


def split_passes(events: Sequence[tuple[str, float]], kind: str, layers: int, passes: int
                 ) -> dict[str, float]:
    """Milliseconds per pass of each class of :data:`CLASSES` from ``events`` (name,
    microseconds) of ``passes`` forward passes. Concatenations are rotary work (``other``)
    except, in a decode step, HF ``DynamicCache``'s append of the new token to each layer's
    K and V, which copies the whole cache: the ``2 x layers`` longest concatenations of each
    pass (the rotary ones are over one token) are ``cache_copy``."""
    per = dict.fromkeys(CLASSES, 0.0)
    cats: list[float] = []
    for name, us in events:
        c = classify(name)
        if c == "cat":
            cats.append(us)
        else:
            per[c] += us
    cats.sort(reverse=True)
    k = 2 * layers * passes if kind == "decode" else 0
    per["cache_copy"] += sum(cats[:k])
    per["other"] += sum(cats[k:])
    return {c: v / 1e3 / passes for c, v in per.items()}


def cell_terms(kind: str, batch: int, prompt: int, context: int) -> tuple[int, int, int, float]:
    """``(tokens, decode sequences, KV context tokens read, causal prefill pairs)`` of a
    measured cell, as :func:`hermes.bench.calibrate.cell_terms` counts them (only ``decode``
    and ``prefill`` cells are measured: HF cannot batch the two)."""
    from hermes.bench.calibrate import cell_terms as terms

    if kind not in ("decode", "prefill"):
        raise ValueError(f"unknown cell kind {kind!r} (decode | prefill)")
    dec, pre_tok, _, ctx, pairs = terms(kind, batch, prompt, context)
    return dec + pre_tok, dec, ctx, pairs


# ----------------------------------------------------------------------------- measuring
def measure(cells: Iterable[tuple[str, int, int, int]] = CELLS, *, shape: dict[str, int] | None = None,
            device: str = "cuda", repeats: int = 5, warmup: int = 2,
            log: Any = None, on_row: Any = None) -> dict[str, Any]:
    """Time :data:`CELLS` on ``device`` (module doc). Returns ``{"device", "torch",
    "transformers", "dtype", "shape", "rows"}``; each row has the cell, ``<class>_ms`` per
    class of :data:`CLASSES` (kernel time per forward pass, mean over ``repeats``),
    ``total_ms`` (all classes but the cache copies), ``events_ms`` (CUDA events around the
    passes: launch gaps included) and ``top`` (the five longest kernels)."""
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaModel

    cuda = device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise RuntimeError("no CUDA device: measure on a GPU machine")
    dtype = torch.float16 if cuda else torch.float32
    cfg = LlamaConfig(**(shape or LLAMA2_7B))
    cfg._attn_implementation = "sdpa"
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaModel(cfg).eval()
    finally:
        torch.set_default_dtype(prev)
    name = torch.cuda.get_device_name() if cuda else "cpu"
    gen = torch.Generator(device=device).manual_seed(0)
    rows: list[dict[str, Any]] = []
    out: dict[str, Any] = {
        "device": name, "torch": torch.__version__, "transformers": transformers.__version__,
        "dtype": str(dtype).removeprefix("torch."), "shape": dict(shape or LLAMA2_7B),
        "repeats": repeats, "rows": rows}
    for kind, batch, prompt, context in cells:
        try:
            row = _cell(torch, model, cfg, gen, kind, batch, prompt, context, device=device,
                        cuda=cuda, repeats=repeats, warmup=warmup, log=log)
        except torch.OutOfMemoryError as e:  # one cell too large for this card: say so, go on
            row = {"kind": kind, "batch": batch, "prompt_tokens": prompt,
                   "context_tokens": context, "error": f"out of memory: {e}"[:300]}
            if log is not None:
                print(f"  {kind} batch {batch}: out of memory", file=log, flush=True)
        if cuda:
            torch.cuda.empty_cache()
        rows.append(row)
        if on_row is not None:
            on_row(out)
    return out


def _cell(torch: Any, model: Any, cfg: Any, gen: Any, kind: str, batch: int, prompt: int,
          context: int, *, device: str, cuda: bool, repeats: int, warmup: int,
          log: Any) -> dict[str, Any]:
    """One cell of :func:`measure`."""
    from torch.profiler import ProfilerActivity, profile

    t0 = time.perf_counter()
    with torch.inference_mode():
        if kind == "decode":
            ids = torch.randint(0, cfg.vocab_size, (batch, context), device=device, generator=gen)
            cache = model(input_ids=ids, use_cache=True).past_key_values
            step = torch.randint(0, cfg.vocab_size, (batch, 1), device=device, generator=gen)

            def once(cache: Any = cache, step: Any = step) -> None:
                model(input_ids=step, past_key_values=cache, use_cache=True)
        else:
            ids = torch.randint(0, cfg.vocab_size, (batch, prompt), device=device, generator=gen)

            def once(ids: Any = ids) -> None:
                model(input_ids=ids, use_cache=True)
        for _ in range(warmup):
            once()
        if cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        acts = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
        with profile(activities=acts) as prof:
            if cuda:
                start.record()
            for _ in range(repeats):
                once()
            if cuda:
                end.record()
                torch.cuda.synchronize()
        events_ms = start.elapsed_time(end) / repeats if cuda else float("nan")
        del ids, once
        if kind == "decode":
            del cache, step
    events = _timed_events(prof, cuda)
    per = split_passes(events, kind, cfg.num_hidden_layers, repeats)
    kernels: dict[str, float] = {}
    for kname, us in events:
        kernels[kname] = kernels.get(kname, 0.0) + us / 1e3 / repeats
    names = list(kernels)
    index = {n: i for i, n in enumerate(names)}
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:5]
    row = {"kind": kind, "batch": batch, "prompt_tokens": prompt, "context_tokens": context,
           **{f"{c}_ms": round(v, 4) for c, v in per.items()},
           "total_ms": round(sum(v for c, v in per.items() if c != "cache_copy"), 4),
           "events_ms": round(events_ms, 4),
           "top": [[k[:120], round(v, 4)] for k, v in top],
           # every kernel instance (name index, microseconds), for re-analysis
           "kernel_names": [n[:200] for n in names],
           "kernels": [[index[n], round(us, 2)] for n, us in events[:KEEP_KERNELS * repeats]]}
    if log is not None:
        print(f"  {kind} batch {batch} prompt {prompt} context {context}: "
              f"{row['total_ms']:.2f} ms ({time.perf_counter() - t0:.1f} s)", file=log, flush=True)
    return row


def _timed_events(prof: Any, cuda: bool) -> list[tuple[str, float]]:
    """``(name, microseconds)`` of every GPU kernel (CUDA), in launch order, or, on a CPU,
    every operator's self time (so that nested operators are not counted twice)."""
    from torch.autograd import DeviceType

    if cuda:
        evs = [(e.name, float(e.time_range.elapsed_us())) for e in prof.events()
               if e.device_type == DeviceType.CUDA]
        if not evs:  # a profiler that attaches kernels to their launching operators only
            evs = [(k.name, float(k.duration)) for e in prof.events()
                   for k in getattr(e, "kernels", ())]
        return evs
    return [(e.name, float(e.self_cpu_time_total)) for e in prof.events()
            if e.self_cpu_time_total > 0]


# ----------------------------------------------------------------------------- comparing
def setup_for_device(device: str) -> str:
    """The calibrated setup of a measured device's name (:data:`SETUP_OF_DEVICE`)."""
    n = device.lower()
    for key, setup in SETUP_OF_DEVICE:
        if key in n:
            return setup
    raise ValueError(f"no calibrated setup for device {device!r}; name one with --setup "
                     f"({', '.join(dict.fromkeys(s for _, s in SETUP_OF_DEVICE))})")


def _err(model: float, measured: float) -> float:
    return round((model - measured) / measured, 4) if measured > 0 else float("nan")


def compare(measured: dict[str, Any], setup: str, root: Path | None = None) -> list[dict[str, Any]]:
    """Each measured cell beside the setup's reference and model (module doc): ``vidur_gemm_ms``
    and ``vidur_ops_ms`` (the profiled GEMMs and all per-layer operators, x layers, at the
    cell's tokens), ``derived_attention_ms``, ``model_gpu_ms`` (the committed compact model
    without its CPU term) and the relative error of each against the measured figure."""
    from hermes.bench import calibrate as C
    from hermes.core.costmodel import get_cost_model

    shape = measured.get("shape")
    if shape != LLAMA2_7B:
        raise ValueError(f"the measurement is of {shape}, not LLaMA-2-7B: the setups price "
                         "LLaMA-2-7B only (a --tiny run checks the plumbing, not the model)")
    base = setup.partition("@")[0]
    spec = C.SPECS[base]
    cost = get_cost_model(setup)
    prof = C.load_profile(spec, root)
    der = C.derive(spec, prof)
    c0, c1 = C.fit_cpu(cost.mode)
    out = []
    for r in measured["rows"]:
        if "error" in r:  # a cell the card could not run (out of memory): nothing to compare
            continue
        tokens, seqs, ctx, pairs = cell_terms(r["kind"], r["batch"], r["prompt_tokens"],
                                             r["context_tokens"])
        vidur_gemm = C.reference_gemm_ms(spec, prof, der, tokens)
        vidur_ops = C.reference_tokens_ms(spec, prof, der, tokens)
        attn = 1e3 * (der.decode_s_per_ctx_token * ctx + der.prefill_attn_s_per_pair * pairs)
        pre_tok = tokens if r["kind"] == "prefill" else 0
        pre_seqs = r["batch"] if r["kind"] == "prefill" else 0
        model = cost.iteration_s(pre_tok, seqs, ctx, prefill_seqs=pre_seqs, prefill_pairs=pairs)
        model_gpu = 1e3 * (model - c0 - c1 * (seqs + pre_seqs))
        ops = r["gemm_ms"] + r["other_ms"]
        out.append({
            "setup": cost.name, "device": measured.get("device", ""), "kind": r["kind"],
            "batch": r["batch"], "prompt_tokens": r["prompt_tokens"],
            "context_tokens": r["context_tokens"], "tokens": tokens,
            "gemm_ms": r["gemm_ms"], "vidur_gemm_ms": round(vidur_gemm, 4),
            "gemm_error": _err(vidur_gemm, r["gemm_ms"]),
            "ops_ms": round(ops, 4), "vidur_ops_ms": round(vidur_ops, 4),
            "ops_error": _err(vidur_ops, ops),
            "attention_ms": r["attention_ms"], "derived_attention_ms": round(attn, 4),
            "attention_error": _err(attn, r["attention_ms"]),
            "total_ms": r["total_ms"], "model_gpu_ms": round(model_gpu, 4),
            "total_error": _err(model_gpu, r["total_ms"]),
            "cache_copy_ms": r["cache_copy_ms"],
        })
    return out


def print_compare(rows: Sequence[dict[str, Any]], out: Any = None) -> None:
    """The comparison as a table (``rich``), errors as model ÷ measured - 1."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"forward pass, {rows[0]['device']} vs {rows[0]['setup']}: GPU ms per "
                    "pass, measured / model (error)")
    for col in ("kind", "batch", "prompt", "context", "GEMMs", "all per-token ops",
                "attention", "total", "HF cache copy"):
        t.add_column(col, justify="left" if col == "kind" else "right")

    def cell(m: float, p: float, e: float) -> str:
        if m <= 0 and p <= 0:
            return "-"
        return f"{m:.2f} / {p:.2f} ({100 * e:+.0f}%)" if e == e else f"{m:.2f} / {p:.2f}"

    for r in rows:
        t.add_row(r["kind"], str(r["batch"]), str(r["prompt_tokens"]), str(r["context_tokens"]),
                  cell(r["gemm_ms"], r["vidur_gemm_ms"], r["gemm_error"]),
                  cell(r["ops_ms"], r["vidur_ops_ms"], r["ops_error"]),
                  cell(r["attention_ms"], r["derived_attention_ms"], r["attention_error"]),
                  cell(r["total_ms"], r["model_gpu_ms"], r["total_error"]),
                  f"{r['cache_copy_ms']:.2f}")
    Console(file=out or sys.stdout, width=160).print(t)


# ----------------------------------------------------------------------------- commands
def cmd_forward(args: argparse.Namespace) -> int:
    """``hermes bench forward``: measure here (needs torch, transformers and a GPU) or read
    ``--measured``, then compare with the setup."""
    if args.measured:
        try:
            measured = json.loads(Path(args.measured).read_text())
        except (OSError, ValueError) as e:
            print(f"--measured {args.measured}: {e}", file=sys.stderr)
            return 2
    else:
        try:
            measured = measure(device=args.device, log=sys.stderr)
        except (ImportError, RuntimeError) as e:
            print(f"hermes bench forward: cannot measure here ({e}); on a machine with a GPU, "
                  "torch and transformers run `python -m hermes.bench.forward_check --out F`, "
                  "then compare anywhere with `hermes bench forward --measured F`", file=sys.stderr)
            return 2
    try:
        setup = args.setup or setup_for_device(measured.get("device", ""))
        rows = compare(measured, setup, Path(args.vidur) if args.vidur else None)
    except (KeyError, ValueError) as e:
        print(f"hermes bench forward: {e}", file=sys.stderr)
        return 2
    for r in measured.get("rows", []):
        if "error" in r:  # compare() leaves these out: say so, the table would not
            print(f"hermes bench forward: {r['kind']} batch {r['batch']} prompt "
                  f"{r['prompt_tokens']} context {r['context_tokens']} was not measured "
                  f"({r['error']})", file=sys.stderr)
    if not rows:
        print("hermes bench forward: no measured cell to compare", file=sys.stderr)
        return 2
    print_compare(rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"measured": measured, "compare": rows}, indent=1) + "\n")
    return 0


def add_forward_parser(bsub: argparse._SubParsersAction[Any]) -> None:
    """Add ``forward`` to ``hermes bench``."""
    s = bsub.add_parser("forward", help="the calibrated engine model vs real forward passes on a GPU")
    s.add_argument("--measured", default=None,
                   help="a measurement written by `python -m hermes.bench.forward_check --out F` "
                        "(default: measure here)")
    s.add_argument("--setup", default=None,
                   help="calibrated setup to compare with (default: from the device's name)")
    s.add_argument("--device", default="cuda", help="torch device to measure on (default cuda)")
    s.add_argument("--vidur", default=None, help="Vidur profile directory (as bench calibrate)")
    s.add_argument("--json", default=None, help="write {measured, compare} to FILE")
    s.set_defaults(func=cmd_forward)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hermes.bench.forward_check --out F [--tiny] [--device D]``: measure only
    (needs nothing of Hermes' own dependencies: run it on the GPU machine)."""
    p = argparse.ArgumentParser(prog="python -m hermes.bench.forward_check")
    p.add_argument("--out", required=True, help="write the measurement (JSON) to FILE")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="a 2-layer toy model (a CPU smoke run)")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    cells = CELLS
    if args.tiny:
        cells = (("decode", 2, 0, 16), ("prefill", 1, 32, 0))
    out = Path(args.out)

    def save(m: dict[str, Any]) -> None:  # after every cell: a run cut short keeps its cells
        out.write_text(json.dumps(m) + "\n")

    m = measure(cells, shape=TINY if args.tiny else None, device=args.device,
                repeats=args.repeats, log=sys.stderr, on_row=save)
    save(m)
    print(f"wrote {args.out}: {len(m['rows'])} cells on {m['device']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
