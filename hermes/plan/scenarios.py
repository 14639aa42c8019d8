"""The applications of ``hermes plan batch``: SamuLLM's three scenarios and ``--dag`` files.

The paper's datasets (MixInstruct, RouterBench, BooookScore/BookSum, No Robots eCDFs) are not
available offline; the request lengths come from measured data shipped with Hermes
(``hermes/data/reference`` and ``hermes/data/traces``; ``$HERMES_SHARED`` for other copies):

- **Lengths of prompts and outputs**: ``reference/app-profiles.json`` (LLaMA-2-7B, 100
  profiled runs of 7 applications; Hermes paper artifact). Prompts: the stages whose prompts
  are short instructions (FacTool's query / claim / verification stages, map-reduce's
  per-chunk summary, ReAct-FEVER's thoughts: mean ~560 tokens). Outputs: one eCDF of every
  stage's completion tokens (the paper also uses one eCDF per model from one dataset; here one
  measured model stands for all).
- **ensembling** (paper 5.1): the 9 LLM-Blender models on 1,000 requests, output limit 256.
- **routing** (paper 5.2): RouterBench's 5 open models with the paper's Table 1 request counts
  (408 / 1,267 / 2,068 / 456 / 2,657), output limit 4,096 (``scale`` shrinks the counts).
- **chain** (paper 5.3): vicuna-13b summarises 100 documents chunk by chunk (2,048-token
  chunks, each chunk's request waits for the previous chunk's summary), Llama-2-70b-chat
  evaluates each final summary twice. Document lengths: the input lengths of 100 requests drawn
  from Mooncake's conversation trace (``traces/mooncake_conversation_trace.jsonl``: median 4
  chunks, max 62; the paper's 100 documents: median 3, max 60). Summary lengths: the eCDF of
  map-reduce's ``generate_summary`` completions; evaluation lengths: GoT's ``score`` stages
  (limit 900).

Output lengths are sampled once per run (seeded) from the eCDFs and every planner is priced on
that same workload.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from hermes.core.batchplan.workload import ECDF, App, ModelNode, Request
from hermes.core.cluster.models import get_model

SCENARIOS = ("ensembling", "routing", "chain")
ENSEMBLE_MODELS = ("vicuna-13b", "oasst-pythia-12b", "alpaca-13b", "baize-v2-13b", "koala-13b",
                   "dolly-v2-12b", "mpt-7b-chat", "chatglm3-6b", "stablelm-alpha-7b")
ROUTING = (("llama-2-70b", 408), ("mixtral-8x7b", 1267), ("wizardlm-13b", 2068),
           ("codellama-34b", 456), ("mistral-7b", 2657))
SHORT_PROMPT_STAGES = (("factool_code", "generate_queries"), ("factool_kbqa", "extract_claims"),
                       ("factool_kbqa", "verifies"), ("factool_math", "extract_claims"),
                       ("langchain_mapreduce", "generate_summary"), ("react_fever", "thought"))
CHUNK = 2048
CHAIN_PROMPT = 256  # instruction + running-summary template tokens around a chunk


def shared_dir() -> Path | None:
    """``$HERMES_SHARED`` (a directory with ``reference/app-profiles.json``), else None: the
    profiles shipped with Hermes."""
    env = os.environ.get("HERMES_SHARED")
    return Path(env) if env else None


def _profiles(root: Path | None) -> dict[str, Any]:
    """The measured app profiles: ``root/reference/app-profiles.json``, or (``root`` None)
    the copy shipped with Hermes (package data, gzipped), found from any directory."""
    if root is None:
        from importlib import resources

        shipped = resources.files("hermes") / "data" / "reference" / "app-profiles.json.gz"
        data: dict[str, Any] = json.loads(gzip.decompress(shipped.read_bytes()))
        return data
    path = root / "reference" / "app-profiles.json"
    if not path.exists():
        raise ValueError(f"missing {path} ($HERMES_SHARED); unset it for the shipped profiles")
    data = json.loads(path.read_text())
    return data


def _stage(prof: dict[str, Any], app: str, stage: str, key: str) -> list[int]:
    return [int(x) for x in prof[app]["stages"][stage][key]]


def _lengths(root: Path | None) -> tuple[list[int], ECDF]:
    prof = _profiles(root)
    prompts = [x for a, s in SHORT_PROMPT_STAGES for x in _stage(prof, a, s, "prompt_tokens")]
    outs = [x for a in prof for s in prof[a]["stages"]
            for x in _stage(prof, a, s, "completion_tokens")]
    return prompts, ECDF.of(outs)


def _sampled(rng: np.random.Generator, name: str, n: int, prompts: list[int], out: ECDF,
             limit: int) -> ModelNode:
    spec = get_model(name)
    ins = [min(int(x), spec.max_seq_len - 16) for x in rng.choice(prompts, size=n)]
    outs = out.output_lengths(rng, ins, limit=limit, max_seq_len=spec.max_seq_len)
    return ModelNode(name, spec, [Request(i, a, b) for i, (a, b) in enumerate(zip(ins, outs, strict=True))])


def build(scenario: str, *, seed: int = 0, n_requests: int | None = None, scale: float = 1.0,
          root: Path | None = None) -> tuple[App, str]:
    """The application of ``scenario`` and a line saying what data it used."""
    root = root or shared_dir()
    rng = np.random.default_rng(seed)
    prompts, out = _lengths(root)
    if scenario == "ensembling":
        n = n_requests or 1000
        ins = [int(x) for x in rng.choice(prompts, size=n)]
        models = {}
        for name in ENSEMBLE_MODELS:
            spec = get_model(name)
            o = out.output_lengths(rng, ins, limit=256, max_seq_len=spec.max_seq_len)
            models[name] = ModelNode(name, spec, [Request(i, min(a, spec.max_seq_len - 1 - b), b)
                                                  for i, (a, b) in enumerate(zip(ins, o, strict=True))])
        return App(models), (f"{n} requests, prompts from app-profiles short stages, outputs "
                             "eCDF of app-profiles completions, limit 256")
    if scenario == "routing":
        models = {name: _sampled(rng, name, max(1, round(k * scale)), prompts, out, 4096)
                  for name, k in ROUTING}
        return App(models), (f"RouterBench Table 1 counts x {scale:g}, prompts/outputs from "
                             "app-profiles, limit 4096")
    if scenario == "chain":
        return _chain(rng, root, n_docs=n_requests or 100)
    raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")


def _conversation_lengths(root: Path | None) -> list[int]:
    """Input lengths of Mooncake's conversation trace: ``root/traces/...`` or (``root`` None)
    the copy shipped with Hermes (package data: the same requests, gzipped)."""
    if root is None:
        from importlib import resources

        shipped = (resources.files("hermes") / "data" / "traces"
                   / "mooncake_conversation_requests.jsonl.gz")
        text = gzip.decompress(shipped.read_bytes()).decode()
    else:
        trace = root / "traces" / "mooncake_conversation_trace.jsonl"
        if not trace.exists():
            raise ValueError(f"missing {trace} ($HERMES_SHARED); unset it for the shipped trace")
        text = trace.read_text()
    return [int(json.loads(line)["input_length"]) for line in text.splitlines() if line]


def _chain(rng: np.random.Generator, root: Path | None, n_docs: int,
           evals: int = 2) -> tuple[App, str]:
    lengths = _conversation_lengths(root)
    docs = [int(x) for x in rng.choice(lengths, size=n_docs, replace=False)]
    prof = _profiles(root)
    summ = ECDF.of(_stage(prof, "langchain_mapreduce", "generate_summary", "completion_tokens"))
    score = ECDF.of([x for s in ("score1", "score2", "score3")
                     for x in _stage(prof, "got_docmerge", s, "completion_tokens")])
    s_spec, e_spec = get_model("vicuna-13b"), get_model("llama-2-70b")
    s_reqs: list[Request] = []
    e_reqs: list[Request] = []
    for length in docs:
        chunks = max(1, -(-length // CHUNK))
        prev_out = 0
        prev_id = -1
        for c in range(chunks):
            size = min(CHUNK, length - c * CHUNK) if c < chunks - 1 else length - c * CHUNK
            inp = max(1, size) + CHAIN_PROMPT + prev_out
            o = summ.output_lengths(rng, [inp], limit=900, max_seq_len=s_spec.max_seq_len)[0]
            rid = len(s_reqs)
            after = (("summarizer", prev_id),) if prev_id >= 0 else ()
            s_reqs.append(Request(rid, min(inp, s_spec.max_seq_len - o), o, after))
            prev_out, prev_id = o, rid
        for _ in range(evals):
            inp = prev_out + CHAIN_PROMPT
            o = score.output_lengths(rng, [inp], limit=900, max_seq_len=e_spec.max_seq_len)[0]
            e_reqs.append(Request(len(e_reqs), inp, o, (("summarizer", prev_id),)))
    app = App({"summarizer": ModelNode("summarizer", s_spec, s_reqs),
               "evaluator": ModelNode("evaluator", e_spec, e_reqs)})
    return app, (f"{n_docs} documents (lengths: Mooncake conversation inputs, {len(s_reqs)} "
                 f"chunks of {CHUNK}), summaries: map-reduce summary eCDF, {evals} evaluations "
                 "each: GoT score eCDF, limit 900")


def load_dag(path: str, *, seed: int = 0) -> App:
    """A ``--dag`` file: ``{"models": [{"name", "model", "requests": [{"input", "output"?,
    "after": [[MODEL, ID], ...]?}, ...], "output_ecdf": [...]?, "limit": N?}]}``; a request
    without ``output`` samples it from the model's ``output_ecdf``. Request ids are positions."""
    try:
        doc = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"--dag {path}: not JSON ({exc})") from None
    rng = np.random.default_rng(seed)
    models: dict[str, ModelNode] = {}
    for m in doc.get("models", []):
        try:
            name, spec = m["name"], get_model(m["model"])
        except KeyError as exc:
            raise ValueError(f"--dag {path}: a model entry lacks {exc}") from None
        ecdf = ECDF.of(m["output_ecdf"]) if m.get("output_ecdf") else None
        reqs = []
        for i, r in enumerate(m.get("requests", [])):
            out = r.get("output")
            if out is None:
                if ecdf is None:
                    raise ValueError(f"--dag {path}: model {name!r} request {i} has no output "
                                     "and the model no output_ecdf")
                out = ecdf.output_lengths(rng, [r["input"]], limit=m.get("limit"),
                                          max_seq_len=spec.max_seq_len)[0]
            reqs.append(Request(i, int(r["input"]), int(out),
                                tuple((str(a), int(b)) for a, b in r.get("after", []))))
        models[name] = ModelNode(name, spec, reqs)
    if not models:
        raise ValueError(f"--dag {path}: no models")
    return App(models)
