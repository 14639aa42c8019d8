"""The runnable form of a batch plan: what HermesLets need to start each stage's engines.

``hermes plan batch ... --emit FILE`` writes this document; ``hermeslet run-plan FILE``
(:mod:`hermeslet.plan_runner`) carries it out stage by stage. Format ``hermes-batch-plan/1``
(JSON):

- ``gpus``, ``device``, ``n_gpus``: the node the plan is for; ``predicted_s``: the plan's
  predicted end-to-end time; ``adjustment_rule``: the running-phase rule, in words.
- ``models``: per application model (its name in the DAG) the model it runs (``model``: the
  cluster model's name; ``hf_model``: what vLLM loads, :data:`HF_MODELS` or the name itself)
  and its request set: ``[rid, input_tokens, output_tokens, [[model, rid], ...]]`` (the
  requests it waits for; output lengths as sampled for the plan).
- ``stages``: per stage its predicted ``start_s``/``duration_s`` and its ``pairs``: (model,
  dp, tp), ``load_s`` (predicted start-up), and one ``engines`` entry per data-parallel
  replica: ``gpu_ids``, ``env`` (``CUDA_VISIBLE_DEVICES``), ``vllm_args`` (the arguments of
  ``vllm serve``/the OpenAI server: ``--model``, ``--tensor-parallel-size``,
  ``--gpu-memory-utilization``, ``--served-model-name``) and ``builtin`` (the built-in engine
  equivalent: the cluster model, device and tp that give the simulated engine the planner's
  iteration costs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hermes.core.batchplan.search import Schedule
from hermes.core.batchplan.workload import App
from hermes.core.cluster.cost import GPU_MEMORY_UTILIZATION, load_s
from hermes.core.cluster.devices import parse_gpus

FORMAT = "hermes-batch-plan/1"

#: Hugging Face ids of the cluster models the scenarios use (others: the model's own name)
HF_MODELS: dict[str, str] = {
    "llama-2-7b": "meta-llama/Llama-2-7b-hf",
    "llama-2-13b": "meta-llama/Llama-2-13b-hf",
    "llama-2-70b": "meta-llama/Llama-2-70b-hf",
    "llama-3-8b": "meta-llama/Meta-Llama-3-8B",
    "llama-3-70b": "meta-llama/Meta-Llama-3-70B",
    "mistral-7b": "mistralai/Mistral-7B-v0.1",
    "vicuna-13b": "lmsys/vicuna-13b-v1.5",
    "wizardlm-13b": "WizardLMTeam/WizardLM-13B-V1.2",
    "chatglm3-6b": "THUDM/chatglm3-6b",
    "mpt-7b-chat": "mosaicml/mpt-7b-chat",
    "dolly-v2-12b": "databricks/dolly-v2-12b",
    "oasst-pythia-12b": "OpenAssistant/oasst-sft-4-pythia-12b-epoch-3.5",
    "koala-13b": "TheBloke/koala-13B-HF",
    "stablelm-alpha-7b": "stabilityai/stablelm-tuned-alpha-7b",
}


def vllm_args(hf_model: str, served_name: str, tp: int,
              gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION) -> list[str]:
    """The vLLM server arguments of one replica (the GPUs go in ``CUDA_VISIBLE_DEVICES``)."""
    return ["--model", hf_model, "--served-model-name", served_name,
            "--tensor-parallel-size", str(tp),
            "--gpu-memory-utilization", str(gpu_memory_utilization)]


def emit_plan(app: App, schedule: Schedule, gpus: str,
              gpu_ids: Sequence[Mapping[str, list[list[int]]]], *,
              adjustment_rule: str = "") -> dict[str, Any]:
    """The ``hermes-batch-plan/1`` document of ``schedule`` (module doc); ``gpu_ids``: per
    stage, each model's GPU ids per replica (``hermes.cli.plan.assign_gpus``)."""
    n, device = parse_gpus(gpus)
    ids = list(gpu_ids)
    if len(ids) != len(schedule.stages):
        raise ValueError(f"emit_plan: {len(ids)} GPU assignments for {len(schedule.stages)} stages")
    hf_of = {name: HF_MODELS.get(node.spec.name, node.spec.name)
             for name, node in app.models.items()}
    models: dict[str, dict[str, Any]] = {
        name: {
            "model": node.spec.name,
            "hf_model": hf_of[name],
            "requests": [[r.rid, r.input_tokens, r.output_tokens, [list(k) for k in r.after]]
                         for r in node.requests],
        } for name, node in app.models.items()}
    stages = []
    for i, (st, gid) in enumerate(zip(schedule.stages, ids, strict=True)):
        pairs = []
        for p in st.pairs:
            spec = app.models[p.model].spec
            hf = hf_of[p.model]
            pairs.append({
                "name": p.model, "model": spec.name, "dp": p.plan.dp, "tp": p.plan.tp,
                "load_s": round(load_s(spec, p.plan), 3), "reload": p.reload,
                "predicted_finish_s": round(p.remaining_s, 3),
                "engines": [{
                    "replica": r, "gpu_ids": g,
                    "env": {"CUDA_VISIBLE_DEVICES": ",".join(map(str, g))},
                    "vllm_args": vllm_args(hf, p.model, p.plan.tp),
                    "builtin": {"engine": "sim", "model": spec.name, "device": device.name,
                                "tp": p.plan.tp},
                } for r, g in enumerate(gid[p.model])],
            })
        stages.append({"index": i, "start_s": round(st.start_s, 3),
                       "duration_s": round(st.duration_s, 3), "pairs": pairs})
    return {"format": FORMAT, "gpus": gpus, "device": device.name, "n_gpus": n,
            "planner": schedule.planner, "predicted_s": round(schedule.total_s, 3),
            "adjustment_rule": adjustment_rule, "models": models, "stages": stages}
