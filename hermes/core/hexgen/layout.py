"""The per-pipeline dynamic programme of HexGen (section 4) on the Hermes cluster model.

Given an ordered GPU group, choose consecutive stages (each a tensor-parallel chunk of the
order, TP in 1, 2, 4, 8 and dividing the attention heads) and a layer count per stage, that
minimise the latency of a reference request (its prefill plus ``decode_steps`` decode
iterations): per-stage computation and TP all-reduces, plus the pipeline hand-offs, subject to
every stage holding its weights, activations and one full-length sequence's KV cache.

Constants the paper leaves open: layers are assigned in units of ``layer_unit`` (default 4,
20 units for Llama-2-70B) to bound the search; every GPU of the group is used (the genetic
search decides the grouping).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hermes.core.cluster.cost import (
    CONTEXT_BYTES,
    GPU_MEMORY_UTILIZATION,
    MAX_BATCHED_TOKENS,
    MAX_NUM_SEQS,
    Placement,
    StageSpec,
    decode_attn_s_per_ctx_token,
    linear_layer_s,
    lm_head_s,
    prefill_attn_s_per_pair,
)
from hermes.core.cluster.models import BYTES_FP16, ModelSpec
from hermes.core.cluster.topology import Cluster, GpuId

TP_DEGREES = (1, 2, 4, 8)


@dataclass(frozen=True, slots=True)
class Reference:
    """The request the DP optimises for (HexGen's Fig. 1: 128 tokens in, 64 out)."""

    prompt: int = 128
    decode_steps: int = 64


def stage_fits(cluster: Cluster, model: ModelSpec, gpus: Sequence[GpuId], layers: int,
               first: bool, last: bool) -> bool:
    """Weights, activations and one ``max_seq_len`` sequence's KV fit on each GPU of the stage
    (the same terms as :func:`hermes.core.cluster.cost.stage_memory`)."""
    tp = len(gpus)
    w = (model.attn_params_per_layer + model.experts * model.mlp_params_per_expert) * layers
    if first:
        w += model.vocab * model.hidden
    if last and not model.tied_embeddings:
        w += model.vocab * model.hidden
    act = (BYTES_FP16 * MAX_BATCHED_TOKENS * (4 * model.hidden + 2 * model.ffn / tp)
           + 4 * MAX_NUM_SEQS * model.vocab / tp + CONTEXT_BYTES)
    budget = GPU_MEMORY_UTILIZATION * min(cluster.device(g).memory_bytes for g in gpus)
    kv = model.kv_bytes_per_token(tp, layers) * model.max_seq_len
    return BYTES_FP16 * w / tp + act + kv <= budget


def stage_latency_s(cluster: Cluster, model: ModelSpec, gpus: Sequence[GpuId], layers: int,
                    last: bool, ref: Reference) -> float:
    """Seconds the reference request spends in one stage (prefill + decode iterations); the
    slowest GPU of a mixed group sets the pace."""
    tp = len(gpus)
    dev = min((cluster.device(g) for g in gpus), key=lambda d: d.achieved_flops)
    link = cluster.group_link(gpus)
    t = 0.0
    for tokens, ctx, pairs in ((ref.prompt, 0, 0.5 * ref.prompt ** 2),
                               (1, ref.prompt + ref.decode_steps // 2, 0.0)):
        reps = 1 if ctx == 0 else ref.decode_steps
        s = linear_layer_s(dev, model, tp, tokens) * layers
        s += decode_attn_s_per_ctx_token(dev, model, tp, layers) * ctx
        s += prefill_attn_s_per_pair(dev, model, tp, layers) * pairs
        if link is not None:
            s += 2 * layers * link.all_reduce_s(tokens * model.hidden * BYTES_FP16, tp)
        if last:
            s += lm_head_s(dev, model, tp, 1)
        t += reps * s
    return t


def hand_off_s(cluster: Cluster, model: ModelSpec, a: Sequence[GpuId], b: Sequence[GpuId],
               ref: Reference) -> float:
    """Pipeline communication of the reference request between two consecutive stages."""
    link = cluster.between(a, b)
    return (link.send_recv_s(ref.prompt * model.hidden * BYTES_FP16)
            + ref.decode_steps * link.send_recv_s(model.hidden * BYTES_FP16))


def placement_latency_s(cluster: Cluster, p: Placement, ref: Reference = Reference()) -> float:
    """The DP's objective for a whole placement (used to order layouts and in tests)."""
    n = len(p.stages)
    t = sum(stage_latency_s(cluster, p.model, s.gpus, s.layers, i == n - 1, ref)
            for i, s in enumerate(p.stages))
    t += sum(hand_off_s(cluster, p.model, a.gpus, b.gpus, ref)
             for a, b in zip(p.stages, p.stages[1:], strict=False))
    return t


def placement_fits(cluster: Cluster, p: Placement) -> bool:
    n = len(p.stages)
    return all(stage_fits(cluster, p.model, s.gpus, s.layers, i == 0, i == n - 1)
               for i, s in enumerate(p.stages))


def best_pipeline(cluster: Cluster, model: ModelSpec, gpus: Sequence[GpuId], *,
                  layer_unit: int = 4, ref: Reference = Reference()) -> tuple[Placement, float] | None:
    """The fastest feasible placement over all of ``gpus`` in this order, or ``None``.

    State: (GPUs used i, layer units used l, start j of the last stage) -> best latency;
    a transition appends a stage of ``tp`` GPUs and ``k`` units, paying its hand-off from the
    previous stage."""
    gpus = tuple(gpus)
    n = len(gpus)
    if model.layers % layer_unit:
        layer_unit = 1
    units = model.layers // layer_unit
    inf = float("inf")
    # best[(i, l, j)] = (latency, back-pointer)
    best: dict[tuple[int, int, int], tuple[float, tuple[int, int, int] | None]] = {}
    tps = [t for t in TP_DEGREES if model.valid_tp(t)]
    for tp in tps:  # first stage
        if tp > n:
            continue
        for k in range(1, units + 1):
            g = gpus[:tp]
            last = tp == n and k == units
            if (tp == n) != (k == units) or not stage_fits(cluster, model, g, k * layer_unit, True, last):
                continue
            best[(tp, k, 0)] = (stage_latency_s(cluster, model, g, k * layer_unit, last, ref), None)
    for i in range(1, n):
        for l_ in range(1, units):
            for j in range(i):
                cur = best.get((i, l_, j))
                if cur is None:
                    continue
                prev = gpus[j:i]
                for tp in tps:
                    if i + tp > n:
                        continue
                    g = gpus[i:i + tp]
                    for k in range(1, units - l_ + 1):
                        last = i + tp == n and l_ + k == units
                        if (i + tp == n) != (l_ + k == units):
                            continue
                        if not stage_fits(cluster, model, g, k * layer_unit, False, last):
                            continue
                        t = (cur[0] + hand_off_s(cluster, model, prev, g, ref)
                             + stage_latency_s(cluster, model, g, k * layer_unit, last, ref))
                        key = (i + tp, l_ + k, i)
                        if t < best.get(key, (inf, None))[0]:
                            best[key] = (t, (i, l_, j))
    finals = [(v[0], key) for key, v in best.items() if key[0] == n and key[1] == units]
    if not finals:
        return None
    t, key = min(finals)
    stages: list[StageSpec] = []
    node: tuple[int, int, int] | None = key
    while node is not None:
        i, l_, j = node
        back = best[node][1]
        prev_l = back[1] if back is not None else 0
        stages.append(StageSpec(gpus[j:i], (l_ - prev_l) * layer_unit))
        node = back
    return Placement(model, tuple(reversed(stages))), t
