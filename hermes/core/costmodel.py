"""Engine cost model: tokens to seconds, batch-size aware.

One linear per-iteration latency model of a continuous-batching engine (vLLM style)::

    t_iter = base_s + prefill_s_per_token * prefill_tokens
                    + decode_s_per_seq * decode_seqs
                    + decode_s_per_ctx_token * decode_context_tokens

The same coefficients drive the estimator (isolated service of a unit, below), the simulator's
engine model and the built-in engine, so the three agree by construction.

Calibration (roofline from the vendors' published figures, cross-checked against published
serving measurements):

- ``llama2-7b-a100``: LLaMA-2-7B fp16 (13.5 GB weights) on one A100-40GB (1,555 GB/s HBM2,
  312 TFLOPS bf16). A decode step streams the weights: 13.5 GB / 1.555 TB/s = 8.7 ms, plus
  kernel and scheduling overhead gives ~11.5 ms at batch 1 (vLLM and Sarathi-Serve report
  12–15 ms TBT for 7B on A100). Prefill is compute-bound: 2 x 6.7 GFLOP per token at ~50% MFU
  = ~0.085 ms/token. KV cache: 2 x 32 layers x 4096 x 2 B = 0.5 MB/token, read at every
  decode step (0.34 us per context token); 0.9 x 40 GB - 13.5 GB weights - ~2.5 GB activations
  leaves ~20 GB = ~40k tokens of KV.
- ``llama3-70b-h800-tp4``: LLaMA-3-70B bf16 with tensor parallelism 4 on H800-80GB
  (3.35 TB/s HBM3, 989 TFLOPS bf16). 35 GB of weights per GPU: 10.5 ms per decode step, plus
  ~6 ms of all-reduce over NVLink per step = ~17 ms. Prefill 2 x 70 GFLOP / (4 x 989 TFLOPS x
  0.5) = ~0.071 ms/token. GQA (8 KV heads): 320 KB/token in all, 80 KB per GPU, ~34 GB free
  per GPU = ~400k tokens.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class CostModel:
    """Per-iteration latency coefficients and capacity of one engine (one model on its GPUs)."""

    name: str
    base_s: float
    prefill_s_per_token: float
    decode_s_per_seq: float
    decode_s_per_ctx_token: float
    kv_capacity_tokens: int
    max_num_seqs: int = 256
    max_batched_tokens: int = 8192
    kv_bytes_per_token: int = 512 * 1024  # KV cache bytes per token (all layers, K and V)

    def iteration_s(self, prefill_tokens: int, decode_seqs: int, decode_ctx_tokens: int) -> float:
        """Latency of one engine iteration (a continuous-batching step)."""
        return (
            self.base_s
            + self.prefill_s_per_token * prefill_tokens
            + self.decode_s_per_seq * decode_seqs
            + self.decode_s_per_ctx_token * decode_ctx_tokens
        )

    def unit_service_s(self, input_tokens: np.ndarray, output_tokens: np.ndarray) -> np.ndarray:
        """Isolated latency of a unit invocation whose requests run together as one batch.

        ``input_tokens`` and ``output_tokens`` have shape ``(..., P)`` (one column per
        parallel request; pad unused columns with 0). Prefill is chunked (all prompts in one
        pass); decode runs ``max(O)`` iterations whose batch shrinks as requests finish. With
        the linear model the sum over iterations has the closed form below. Returns shape
        ``(...)``.
        """
        i = np.asarray(input_tokens, dtype=np.float64)
        o = np.asarray(output_tokens, dtype=np.float64)
        prefill = self.base_s * (i.sum(axis=-1) > 0) + self.prefill_s_per_token * i.sum(axis=-1)
        decode = (
            self.base_s * o.max(axis=-1, initial=0.0)
            + self.decode_s_per_seq * o.sum(axis=-1)
            + self.decode_s_per_ctx_token * (o * i + 0.5 * o * o).sum(axis=-1)
        )
        out: np.ndarray = prefill + decode
        return out

    def request_service_s(self, input_tokens: float, output_tokens: float) -> float:
        """:meth:`unit_service_s` of one request alone, in plain floats (the live gateway
        prices every finished request; numpy's per-call overhead dominated for one value)."""
        i, o = float(input_tokens), float(output_tokens)
        prefill = self.base_s * (i > 0) + self.prefill_s_per_token * i
        decode = (self.base_s * max(o, 0.0) + self.decode_s_per_seq * o
                  + self.decode_s_per_ctx_token * (o * i + 0.5 * o * o))
        return prefill + decode

    def with_overrides(self, **kw: Any) -> CostModel:
        """A copy with some coefficients replaced (``hermes.toml`` / CLI overrides)."""
        return replace(self, **kw)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


SETUPS: dict[str, CostModel] = {
    "llama2-7b-a100": CostModel(
        name="llama2-7b-a100",
        base_s=0.0115,
        prefill_s_per_token=0.085e-3,
        decode_s_per_seq=0.06e-3,
        decode_s_per_ctx_token=0.34e-6,
        kv_capacity_tokens=40_000,
        max_num_seqs=256,
    ),
    "llama3-70b-h800-tp4": CostModel(
        name="llama3-70b-h800-tp4",
        base_s=0.017,
        prefill_s_per_token=0.071e-3,
        decode_s_per_seq=0.10e-3,
        decode_s_per_ctx_token=0.024e-6,
        kv_capacity_tokens=400_000,
        max_num_seqs=256,
        kv_bytes_per_token=320 * 1024,
    ),
}
DEFAULT_SETUP = "llama2-7b-a100"


def get_cost_model(name: str = DEFAULT_SETUP) -> CostModel:
    try:
        return SETUPS[name]
    except KeyError:
        raise ValueError(f"unknown cost model {name!r}; known: {', '.join(SETUPS)}") from None
