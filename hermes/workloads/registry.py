"""The ten benchmark apps by name, and the paper's workload mix.

``MIX`` is the paper's default mix: 72% small apps (EV, FEV, CC, ALFWI, KBQAV), 26% medium
(CG, PE) and 2% large (DM, MRS), equal shares within a class. LLMR is registered but not in
the mix (the paper's mix lists it in no class). :func:`sample_mix` draws each run's app
independently (so class counts vary from draw to draw); :func:`stratified_mix` gives exact class
counts (the benchmarks' ``--mix stratified``).

The agent family (issue 18 item 5: SWE, RES; heavy-tailed tool-using loops) is registered
apart in ``AGENT_APPS`` so that ``APPS`` stays the paper's ten (what the gateway hosts and
``hermes/data/pdgraphs`` ships); their PDGraphs ship in ``hermes/data/pdgraphs_agents``
(:func:`agent_pdgraphs_dir`). :func:`draw_workload` draws the runs of a benchmark workload
(``--workload paper|agents|mixed``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hermes.workloads.apps.codegen import CodeGeneration
from hermes.workloads.apps.coding_agent import CodingAgent
from hermes.workloads.apps.factool import FactoolCode, FactoolKBQA, FactoolMath
from hermes.workloads.apps.got_docmerge import GotDocMerge
from hermes.workloads.apps.mapreduce import LangchainMapReduce
from hermes.workloads.apps.plan_execute import PlanExecute
from hermes.workloads.apps.react import ReactAlfworld, ReactFever
from hermes.workloads.apps.reasoning import LLMReasoning
from hermes.workloads.apps.research_agent import ResearchAgent
from hermes.workloads.base import AppModel

APPS: dict[str, type[AppModel]] = {
    cls.name: cls
    for cls in (
        FactoolCode,
        FactoolKBQA,
        FactoolMath,
        GotDocMerge,
        LangchainMapReduce,
        ReactAlfworld,
        ReactFever,
        LLMReasoning,
        CodeGeneration,
        PlanExecute,
    )
}

#: tool-using agent loops (not in the paper's mix): ``--workload agents|mixed``
AGENT_APPS: dict[str, type[AppModel]] = {cls.name: cls for cls in (CodingAgent, ResearchAgent)}

_CLASS_SHARES = {
    "small": (0.72, ("factool_math", "react_fever", "factool_code", "react_alfw", "factool_kbqa")),
    "medium": (0.26, ("code_generation", "plan_execute")),
    "large": (0.02, ("got_docmerge", "langchain_mapreduce")),
}

MIX: dict[str, float] = {
    app: share / len(apps) for share, apps in _CLASS_SHARES.values() for app in apps
}


def get_app(name: str) -> AppModel:
    """An instance of the app model called ``name``."""
    cls = APPS.get(name) or AGENT_APPS.get(name)
    if cls is None:
        known = ", ".join(sorted({**APPS, **AGENT_APPS}))
        raise ValueError(f"unknown app {name!r}; known: {known}")
    return cls()


def agent_pdgraphs_dir() -> Path:
    """The shipped PDGraphs of the agent apps (package data, apart from the paper's ten)."""
    from importlib import resources

    return Path(str(resources.files("hermes") / "data" / "pdgraphs_agents"))


def sample_mix(rng: np.random.Generator, n: int, mix: dict[str, float] | None = None) -> list[str]:
    """``n`` app names drawn independently from ``mix`` (default: the paper's ``MIX``)."""
    mix = MIX if mix is None else mix
    names = list(mix)
    p = np.array([mix[a] for a in names], dtype=np.float64)
    idx = rng.choice(len(names), size=n, p=p / p.sum())
    return [names[i] for i in idx]


def _apportion(rng: np.random.Generator, n: int, shares: list[float]) -> list[int]:
    """``n`` split by ``shares`` exactly (largest remainders; ties drawn at random)."""
    p = np.asarray(shares, dtype=np.float64)
    exact = n * p / p.sum()
    counts = np.floor(exact).astype(np.int64)
    left = n - int(counts.sum())
    if left:
        tie = rng.random(len(p))  # random among equal remainders
        order = sorted(range(len(p)), key=lambda i: (-(exact[i] - counts[i]), tie[i]))
        for i in order[:left]:
            counts[i] += 1
    return [int(c) for c in counts]


def stratified_mix(rng: np.random.Generator, n: int) -> list[str]:
    """``n`` app names with the paper's class counts exactly, in random order.

    The classes (small / medium / large: 72 / 26 / 2%) get ``n`` by largest remainders (300
    runs: 216 / 78 / 6); each class is split evenly among its apps, the runs left over going to
    apps drawn at random (the large class: DM and MRS evenly, e.g. 3 and 3). A per-app draw
    (:func:`sample_mix`) makes the number of DM runs Binomial(n, 0.01), which alone moves
    the total GPU work by half from seed to seed."""
    names: list[str] = []
    classes = list(_CLASS_SHARES.values())
    for (_, apps), k in zip(classes, _apportion(rng, n, [c[0] for c in classes]), strict=True):
        for app, m in zip(apps, _apportion(rng, k, [1.0] * len(apps)), strict=True):
            names += [app] * m
    return [names[i] for i in rng.permutation(len(names))]


#: the ways a benchmark draws the apps of its runs (``--mix``)
MIXES = ("stratified", "random")


def draw_mix(rng: np.random.Generator, n: int, how: str = "random") -> list[str]:
    """``n`` app names of the paper's mix: ``stratified`` (:func:`stratified_mix`) or
    ``random`` (:func:`sample_mix`, each run's app drawn independently)."""
    if how == "stratified":
        return stratified_mix(rng, n)
    if how == "random":
        return sample_mix(rng, n)
    raise ValueError(f"unknown mix {how!r}; known: {', '.join(MIXES)}")


#: the benchmark workloads (``--workload``): the paper's apps, the agent family, or both
WORKLOADS = ("paper", "agents", "mixed")
#: ``mixed``: this share of the runs are agent runs, the rest the paper's mix
MIXED_AGENT_SHARE = 0.5


def _agent_runs(rng: np.random.Generator, n: int, how: str) -> list[str]:
    names = sorted(AGENT_APPS)
    if how == "stratified":  # equal counts (largest remainders), random order
        counts = _apportion(rng, n, [1.0] * len(names))
        out = [a for a, m in zip(names, counts, strict=True) for _ in range(m)]
        return [out[i] for i in rng.permutation(len(out))]
    if how == "random":
        return [names[i] for i in rng.integers(0, len(names), size=n)]
    raise ValueError(f"unknown mix {how!r}; known: {', '.join(MIXES)}")


def draw_workload(rng: np.random.Generator, n: int, how: str = "random",
                  workload: str = "paper") -> list[str]:
    """``n`` app names of a benchmark ``workload``: ``paper`` (:func:`draw_mix`), ``agents``
    (SWE and RES, half each under ``stratified``) or ``mixed`` (``MIXED_AGENT_SHARE`` of the
    runs agents, the rest the paper's mix, shuffled together). ``how`` is the ``--mix``."""
    if workload == "paper":
        return draw_mix(rng, n, how)
    if workload == "agents":
        return _agent_runs(rng, n, how)
    if workload == "mixed":
        k = int(round(n * MIXED_AGENT_SHARE))
        names = draw_mix(rng, n - k, how) + _agent_runs(rng, k, how)
        return [names[i] for i in rng.permutation(len(names))]
    raise ValueError(f"unknown workload {workload!r}; known: {', '.join(WORKLOADS)}")
