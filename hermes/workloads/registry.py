"""The ten benchmark apps by name, and the paper's workload mix.

``MIX`` is the paper's default mix: 72% small apps (EV, FEV, CC, ALFWI, KBQAV), 26% medium
(CG, PE) and 2% large (DM, MRS), equal shares within a class. LLMR is registered but not in
the mix (the paper's mix lists it in no class).
"""

from __future__ import annotations

import numpy as np

from hermes.workloads.apps.codegen import CodeGeneration
from hermes.workloads.apps.factool import FactoolCode, FactoolKBQA, FactoolMath
from hermes.workloads.apps.got_docmerge import GotDocMerge
from hermes.workloads.apps.mapreduce import LangchainMapReduce
from hermes.workloads.apps.plan_execute import PlanExecute
from hermes.workloads.apps.react import ReactAlfworld, ReactFever
from hermes.workloads.apps.reasoning import LLMReasoning
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
    try:
        return APPS[name]()
    except KeyError:
        raise ValueError(f"unknown app {name!r}; known: {', '.join(sorted(APPS))}") from None


def sample_mix(rng: np.random.Generator, n: int, mix: dict[str, float] | None = None) -> list[str]:
    """``n`` app names drawn independently from ``mix`` (default: the paper's ``MIX``)."""
    mix = MIX if mix is None else mix
    names = list(mix)
    p = np.array([mix[a] for a in names], dtype=np.float64)
    idx = rng.choice(len(names), size=n, p=p / p.sum())
    return [names[i] for i in idx]
