"""Per-iteration cost and memory of a model under a parallel placement.

A :class:`Placement` is one replica of a model: pipeline stages in order, each a GPU group
(tensor parallel over its GPUs) holding a number of layers. Uniform plans (:class:`Plan`:
``dp`` replicas of ``tp`` x ``pp``) build placements with :func:`uniform_placement`; HexGen's
asymmetric pipelines give each stage its own GPUs, TP degree and layer count directly.

One iteration (a :class:`BatchShape`: prefill tokens, decoding sequences and their context) on
one stage of ``l`` layers, TP ``t`` on device ``d``:

- linear operators per layer: ``overhead + smoothmax(W/t / BW, 2 W/t T / F) + elementwise``,
  ``W`` the layer's active weights (parameters), ``T`` the iteration's tokens, ``BW`` / ``F``
  the achieved HBM bandwidth and tensor throughput (:class:`~hermes.core.cluster.devices.
  Efficiency`), ``smoothmax(a, b) = (a^p + b^p)^(1/p)``, elementwise operators (norms, rope,
  activation, residual add) streaming ``T x (hidden x 14 + ffn/t x 6 + hidden/t x 4)`` bytes;
- decode attention: the KV bytes of the context at the achieved bandwidth; prefill attention:
  ``4 x hidden / t`` FLOPs per (new token, attended token) pair at 50% of peak (FlashAttention-2
  reaches 50-73% on A100; Vidur's published snapshot has no attention profiles);
- TP: two all-reduces per layer of ``T x hidden x 2`` bytes over the stage's slowest link;
- the last stage adds the LM head (``2 x hidden x vocab`` FLOPs per sequence) and the first
  the embedding lookup (negligible);
- PP: one send/recv of ``T x hidden x 2`` bytes between consecutive stages;
- CPU per iteration (vLLM v1: schedule, sampler, prepare inputs): ``1.04 ms + 0.0376 ms`` per
  sequence (the fit of Vidur's ``cpu_overheads.csv`` in :mod:`hermes.bench.calibrate`).

Latency of an iteration is the sum over stages (a token crosses every stage). Memory per GPU:
weights of its stage, activations of the profiling pass (``max_batched_tokens`` tokens), a
fixed CUDA context, and the KV cache in what is left of ``gpu_memory_utilization``; a
placement is feasible when every stage holds at least one full-length sequence of KV (vLLM
refuses to start otherwise; SamuLLM's validity rule: weights + one sequence's KV).

:func:`to_cost_model` turns a (model, device, tp, pp) into the engine model's
:class:`~hermes.core.costmodel.CostModel` (calibrated form: per-token operator knots), so the
simulator and the planner price iterations with the same figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hermes.core.cluster.devices import GIB, DeviceType, Efficiency
from hermes.core.cluster.models import BYTES_FP16, ModelSpec
from hermes.core.cluster.topology import Cluster, GpuId
from hermes.core.costmodel import SETUPS, CostModel

#: vLLM v1 CPU per iteration and per sequence (module doc)
CPU_ITER_S = 1.0447e-3
CPU_SEQ_S = 3.7563e-5
PREFILL_ATTN_MFU = 0.5
#: CUDA context, NCCL buffers and CUDA graphs per GPU (not in the weights or KV)
CONTEXT_BYTES = int(1.0 * GIB)
#: vLLM's defaults the memory budget assumes
GPU_MEMORY_UTILIZATION = 0.9
MAX_BATCHED_TOKENS = 8192
MAX_NUM_SEQS = 256


@dataclass(frozen=True, slots=True)
class BatchShape:
    """The work of one iteration: ``prefill_tokens`` over ``prefill_seqs`` prompts (their
    ``prefill_pairs`` attention pairs; default: one fresh prompt), ``decode_seqs`` decoding
    sequences with ``decode_ctx_tokens`` tokens of context in all."""

    prefill_tokens: int = 0
    decode_seqs: int = 0
    decode_ctx_tokens: int = 0
    prefill_seqs: int | None = None
    prefill_pairs: float | None = None

    @property
    def tokens(self) -> int:
        return self.prefill_tokens + self.decode_seqs

    @property
    def seqs(self) -> int:
        p = self.prefill_seqs if self.prefill_seqs is not None else int(self.prefill_tokens > 0)
        return p + self.decode_seqs

    @property
    def pairs(self) -> float:
        if self.prefill_pairs is not None:
            return self.prefill_pairs
        return 0.5 * self.prefill_tokens * self.prefill_tokens


@dataclass(frozen=True, slots=True)
class StageSpec:
    """One pipeline stage: a tensor-parallel GPU group and how many layers it holds."""

    gpus: tuple[GpuId, ...]
    layers: int

    @property
    def tp(self) -> int:
        return len(self.gpus)


@dataclass(frozen=True, slots=True)
class Placement:
    """One replica of ``model``: its pipeline stages, first to last."""

    model: ModelSpec
    stages: tuple[StageSpec, ...]

    def __post_init__(self) -> None:
        if not self.stages:
            raise ValueError(f"{self.model.name}: a placement needs at least one stage")
        if sum(s.layers for s in self.stages) != self.model.layers:
            raise ValueError(f"{self.model.name}: stages hold "
                             f"{sum(s.layers for s in self.stages)} layers, the model has "
                             f"{self.model.layers}")
        for s in self.stages:
            if s.layers < 1 or not s.gpus:
                raise ValueError(f"{self.model.name}: empty pipeline stage {s}")
            if not self.model.valid_tp(s.tp):
                raise ValueError(f"{self.model.name}: tensor parallelism {s.tp} does not divide "
                                 f"its {self.model.heads} attention heads")

    @property
    def gpus(self) -> tuple[GpuId, ...]:
        return tuple(g for s in self.stages for g in s.gpus)


@dataclass(frozen=True, slots=True, order=True)
class Plan:
    """A uniform plan: ``dp`` replicas, each ``tp``-way tensor parallel over ``pp`` stages."""

    dp: int = 1
    tp: int = 1
    pp: int = 1

    @property
    def n_gpus(self) -> int:
        return self.dp * self.tp * self.pp

    def __str__(self) -> str:
        return f"dp{self.dp}-tp{self.tp}" + (f"-pp{self.pp}" if self.pp > 1 else "")


def uniform_placement(model: ModelSpec, gpus: Sequence[GpuId], tp: int, pp: int = 1) -> Placement:
    """One replica over ``gpus`` (``tp * pp`` of them, in stage order), layers split as evenly
    as possible (the first stages take the remainder)."""
    if len(gpus) != tp * pp:
        raise ValueError(f"{model.name}: tp={tp} x pp={pp} needs {tp * pp} GPUs, got {len(gpus)}")
    if pp > model.layers:
        raise ValueError(f"{model.name}: pp={pp} exceeds its {model.layers} layers")
    base, extra = divmod(model.layers, pp)
    stages = tuple(
        StageSpec(tuple(gpus[i * tp:(i + 1) * tp]), base + (1 if i < extra else 0))
        for i in range(pp)
    )
    return Placement(model, stages)


# ----------------------------------------------------------------------------- compute
def linear_layer_s(device: DeviceType, model: ModelSpec, tp: int, tokens: float,
                   eff: Efficiency | None = None) -> float:
    """Seconds of one layer's per-token operators (projections, MLP, norms, rope, activation,
    add) for ``tokens`` tokens on one GPU of a ``tp``-way group (module doc); ``eff``
    overrides the device's efficiencies (fitting)."""
    eff = eff or device.eff
    t = max(tokens, 1.0)
    w_read = (model.attn_params_per_layer + model.mlp_weight_params_touched(t)) / tp
    w_math = model.active_params_per_layer / tp
    bw = device.hbm_bytes_s * eff.hbm
    mem = BYTES_FP16 * w_read / bw
    comp = 2.0 * w_math * t / (device.flops * eff.flops)
    p = eff.knee
    gemm = float((mem**p + comp**p) ** (1.0 / p))
    elem_bytes = t * (model.hidden * 14 + model.ffn / tp * 6 * model.experts_per_token
                      + model.hidden / tp * 4)
    return eff.layer_overhead_s + gemm + elem_bytes / bw


def lm_head_s(device: DeviceType, model: ModelSpec, tp: int, seqs: int) -> float:
    """The LM head on the sequences that sample a token (streamed weights or FLOPs)."""
    w = model.vocab * model.hidden / tp
    return max(BYTES_FP16 * w / device.achieved_hbm,
               2.0 * w * max(seqs, 1) / device.achieved_flops)


def decode_attn_s_per_ctx_token(device: DeviceType, model: ModelSpec, tp: int, layers: int) -> float:
    return model.kv_bytes_per_token(tp, layers) / device.achieved_hbm


def prefill_attn_s_per_pair(device: DeviceType, model: ModelSpec, tp: int, layers: int) -> float:
    return 4.0 * model.hidden * layers / tp / (PREFILL_ATTN_MFU * device.flops)


@dataclass(frozen=True, slots=True)
class IterationCost:
    """Seconds of one iteration, by part: per stage compute (incl. its TP all-reduces), the
    all-reduce share of each stage, the pipeline hand-offs and the CPU."""

    stage_s: tuple[float, ...]
    tp_comm_s: tuple[float, ...]
    pp_comm_s: float
    cpu_s: float

    @property
    def total_s(self) -> float:
        """Latency of the iteration (a token crosses every stage)."""
        return sum(self.stage_s) + self.pp_comm_s + self.cpu_s

    @property
    def bottleneck_s(self) -> float:
        """Time between iterations with the pipeline full (``pp`` batches in flight)."""
        hand_off = self.pp_comm_s / max(len(self.stage_s) - 1, 1)
        return max(self.stage_s) + hand_off + self.cpu_s


def stage_s(cluster: Cluster, placement: Placement, index: int, batch: BatchShape) -> tuple[float, float]:
    """(seconds, of which TP all-reduce) of stage ``index`` on ``batch``."""
    model = placement.model
    st = placement.stages[index]
    dev = cluster.device(st.gpus[0])
    tp = st.tp
    t = linear_layer_s(dev, model, tp, batch.tokens) * st.layers
    t += decode_attn_s_per_ctx_token(dev, model, tp, st.layers) * batch.decode_ctx_tokens
    t += prefill_attn_s_per_pair(dev, model, tp, st.layers) * batch.pairs
    comm = 0.0
    link = cluster.group_link(st.gpus)
    if link is not None:
        comm = 2 * st.layers * link.all_reduce_s(batch.tokens * model.hidden * BYTES_FP16, tp)
    if index == len(placement.stages) - 1:
        t += lm_head_s(dev, model, tp, batch.seqs)
    return t + comm, comm


def iteration_cost(cluster: Cluster, placement: Placement, batch: BatchShape) -> IterationCost:
    """The cost of one iteration of ``batch`` on ``placement`` (module doc)."""
    parts = [stage_s(cluster, placement, i, batch) for i in range(len(placement.stages))]
    hand = 0.0
    nbytes = batch.tokens * placement.model.hidden * BYTES_FP16
    for a, b in zip(placement.stages, placement.stages[1:], strict=False):
        hand += cluster.between(a.gpus, b.gpus).send_recv_s(nbytes)
    return IterationCost(
        stage_s=tuple(p[0] for p in parts),
        tp_comm_s=tuple(p[1] for p in parts),
        pp_comm_s=hand,
        cpu_s=CPU_ITER_S + CPU_SEQ_S * batch.seqs,
    )


def iteration_flops(model: ModelSpec, batch: BatchShape) -> float:
    """Model FLOPs of one iteration (all replicas' GPUs together): linear layers, attention,
    LM head. SamuLLM's stage throughput is FLOPs over time."""
    lin = 2.0 * (model.active_params - model.embedding_params) * batch.tokens
    attn = 4.0 * model.hidden * model.layers * (batch.pairs + batch.decode_ctx_tokens)
    head = 2.0 * model.hidden * model.vocab * batch.seqs
    return lin + attn + head


# ----------------------------------------------------------------------------- memory
@dataclass(frozen=True, slots=True)
class StageMemory:
    """Bytes on each GPU of one stage."""

    budget: int  # gpu_memory_utilization x the card's memory
    weights: int
    activations: int
    kv: int  # what is left for the KV cache (negative: does not fit)
    kv_bytes_per_token: int

    @property
    def kv_tokens(self) -> int:
        return max(self.kv, 0) // self.kv_bytes_per_token


def stage_memory(cluster: Cluster, placement: Placement, index: int, *,
                 gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
                 max_batched_tokens: int = MAX_BATCHED_TOKENS,
                 max_num_seqs: int = MAX_NUM_SEQS) -> StageMemory:
    """Memory per GPU of stage ``index`` (module doc)."""
    model = placement.model
    st = placement.stages[index]
    dev = cluster.device(st.gpus[0])
    tp = st.tp
    per_layer = model.attn_params_per_layer + model.experts * model.mlp_params_per_expert
    w = per_layer * st.layers
    if index == 0:
        w += model.vocab * model.hidden
    if index == len(placement.stages) - 1 and not model.tied_embeddings:
        w += model.vocab * model.hidden
    weights = int(BYTES_FP16 * w / tp)
    act = int(BYTES_FP16 * max_batched_tokens * (4 * model.hidden + 2 * model.ffn / tp)
              + 4 * max_num_seqs * model.vocab / tp) + CONTEXT_BYTES
    budget = int(gpu_memory_utilization * dev.memory_bytes)
    return StageMemory(budget, weights, act, budget - weights - act,
                       model.kv_bytes_per_token(tp, st.layers))


def kv_capacity_tokens(cluster: Cluster, placement: Placement, *,
                       gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION) -> int:
    """KV tokens one replica holds (its tightest stage)."""
    return min(stage_memory(cluster, placement, i,
                            gpu_memory_utilization=gpu_memory_utilization).kv_tokens
               for i in range(len(placement.stages)))


def fits(cluster: Cluster, placement: Placement, *,
         gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION) -> bool:
    """Weights, activations and one full-length sequence's KV fit on every stage."""
    return kv_capacity_tokens(cluster, placement,
                              gpu_memory_utilization=gpu_memory_utilization) >= placement.model.max_seq_len


def memory_report(cluster: Cluster, placement: Placement, *,
                  gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION) -> str:
    """One line per stage, in GiB (for error messages)."""
    out = []
    for i in range(len(placement.stages)):
        m = stage_memory(cluster, placement, i, gpu_memory_utilization=gpu_memory_utilization)
        out.append(f"stage {i}: budget {m.budget / GIB:.1f} GiB, weights {m.weights / GIB:.1f}, "
                   f"activations {m.activations / GIB:.1f}, KV {m.kv / GIB:.1f} GiB "
                   f"({m.kv_tokens} tokens)")
    return "; ".join(out)


def shared_fits(cluster: Cluster, members: Sequence[tuple[Placement, float]]) -> bool:
    """Several models on one GPU group (SeaLLM): each ``(placement, memory fraction)`` must fit
    in its fraction, and the fractions on any GPU must not exceed 1."""
    used: dict[GpuId, float] = {}
    for placement, frac in members:
        if not fits(cluster, placement, gpu_memory_utilization=frac):
            return False
        for g in placement.gpus:
            used[g] = used.get(g, 0.0) + frac
    return all(v <= 1.0 + 1e-9 for v in used.values())


# ----------------------------------------------------------------------------- loading
#: model loading (SamuLLM's cost table; measured 11-47 s in the paper): engine start-up plus
#: weights from host page cache at ~3 GB/s per GPU, plus NCCL set-up with TP/PP (assumed)
LOAD_BASE_S = 6.0
LOAD_BYTES_S = 3e9
LOAD_DIST_S = 5.0


def load_s(model: ModelSpec, plan: Plan) -> float:
    """Seconds to start ``model`` under ``plan`` (replicas load in parallel)."""
    per_gpu = BYTES_FP16 * model.params / (plan.tp * plan.pp)
    return LOAD_BASE_S + per_gpu / LOAD_BYTES_S + (LOAD_DIST_S if plan.tp * plan.pp > 1 else 0.0)


# ----------------------------------------------------------------------------- engine model
#: iteration token counts of the per-token operator knots of :func:`to_cost_model`
COST_KNOTS = (1, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096,
              6144, 8192)


def to_cost_model(model: ModelSpec, device: DeviceType, tp: int = 1, pp: int = 1, *,
                  interconnect: str = "nvswitch", name: str | None = None,
                  gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION) -> CostModel:
    """The engine cost model (calibrated form) of one replica of ``model`` on ``tp * pp`` GPUs
    of ``device``. With ``pp > 1`` the coefficients are the pipeline's bottleneck stage plus
    its hand-off (an engine keeps ``pp`` batches in flight: throughput, not one token's
    latency). Raises ``ValueError`` when the model does not fit."""
    cluster = Cluster.single(device, tp * pp, interconnect)
    placement = uniform_placement(model, cluster.gpus(), tp, pp)
    kv = kv_capacity_tokens(cluster, placement, gpu_memory_utilization=gpu_memory_utilization)
    if kv < model.max_seq_len:
        raise ValueError(f"{model.name} does not fit {tp * pp} x {device.name} at tp={tp} pp={pp}: "
                         + memory_report(cluster, placement,
                                         gpu_memory_utilization=gpu_memory_utilization))

    def per_token(tokens: int) -> float:
        c = iteration_cost(cluster, placement, BatchShape(decode_seqs=tokens))
        head = lm_head_s(device, model, tp, tokens)  # only sampled sequences: removed here
        per = (c.bottleneck_s if pp > 1 else c.total_s) - c.cpu_s - head
        return per + lm_head_s(device, model, tp, 1)

    base = per_token(1)
    knots = tuple((float(k), per_token(k) - base) for k in COST_KNOTS)
    layers = max(s.layers for s in placement.stages) if pp > 1 else model.layers
    tail = (knots[-1][1] - knots[-2][1]) / (knots[-1][0] - knots[-2][0])
    kv_total = model.kv_bytes_per_token(1)
    return CostModel(
        name=name or f"{model.name}-{device.name.lower()}-tp{tp}" + (f"-pp{pp}" if pp > 1 else ""),
        base_s=CPU_ITER_S + base,
        prefill_s_per_token=tail,
        decode_s_per_seq=CPU_SEQ_S + 2.0 * model.hidden * model.vocab / tp / device.achieved_flops,
        decode_s_per_ctx_token=decode_attn_s_per_ctx_token(device, model, tp, layers),
        kv_capacity_tokens=int(kv),
        max_num_seqs=MAX_NUM_SEQS,
        max_batched_tokens=MAX_BATCHED_TOKENS,
        kv_bytes_per_token=kv_total,
        token_knots=knots,
        prefill_seq_s=CPU_SEQ_S,
        prefill_attn_s_per_pair=prefill_attn_s_per_pair(device, model, tp, layers),
    )


def register_setup(model: ModelSpec, device: DeviceType, tp: int = 1, pp: int = 1, *,
                   interconnect: str = "nvswitch") -> str:
    """Build :func:`to_cost_model` and register it in the engine model's setups
    (:data:`hermes.core.costmodel.SETUPS`) under ``cluster:MODEL:DEVICE:tpN[:ppM]`` (no ``@``: that suffix names a
    scheduler mode), so a
    simulator or benchmark can name it. Existing setups are never replaced. Returns the name."""
    name = f"cluster:{model.name}:{device.name}:tp{tp}" + (f":pp{pp}" if pp > 1 else "")
    if name not in SETUPS:
        SETUPS[name] = to_cost_model(model, device, tp, pp, interconnect=interconnect, name=name)
    return name

