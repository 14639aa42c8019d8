"""The app models against the measured reference profiles, and the paper's size classes."""

from __future__ import annotations

import numpy as np
import pytest

from hermes.core.costmodel import get_cost_model
from hermes.workloads.calibration import compare, load_reference
from hermes.workloads.isolated import profile_app
from hermes.workloads.registry import APPS, MIX, get_app, sample_mix

COST = get_cost_model("llama2-7b-a100")
REFERENCE = load_reference()
MEASURED = sorted(REFERENCE) if REFERENCE else []


@pytest.mark.skipif(REFERENCE is None, reason="reference app-profiles.json not found")
@pytest.mark.parametrize("name", MEASURED)
def test_per_stage_token_means_match_the_reference(name: str) -> None:
    recs = profile_app(name, 500 if name != "got_docmerge" else 80, 2024, COST)
    result = compare(recs, REFERENCE[name], ("prompt_tokens", "completion_tokens", "parallelism"))
    for stage, metrics in result.items():
        for metric, (model, measured) in metrics.items():
            # parallelism is a count with few reference runs: a looser bound
            rel = 0.2 if metric == "parallelism" else 0.15
            assert model == pytest.approx(measured, rel=rel), (stage, metric)


# MRS: the measured runs take ~25 s alone under the cost model (20 chunks, 1-2 collapse rounds);
# reaching the paper's > 10 min would need a document ~20x longer than any profiled one.
# DM: the measured profile is one GoT pass, ~3 min alone; kept faithful (see got_docmerge.py).
KNOWN_CLASS_GAPS = {"langchain_mapreduce", "got_docmerge"}
BOUNDS = {"small": (0.0, 60.0), "medium": (60.0, 600.0), "large": (600.0, float("inf"))}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.xfail(strict=True, reason="see KNOWN_CLASS_GAPS"))
        if n in KNOWN_CLASS_GAPS
        else n
        for n in sorted(APPS)
    ],
)
def test_isolated_mean_act_matches_size_class(name: str) -> None:
    runs = 150
    act = np.mean([r.act_s for r in profile_app(name, runs, 77, COST)])
    lo, hi = BOUNDS[get_app(name).size_class]
    assert lo < act < hi, act


def test_mix_is_the_papers() -> None:
    assert sum(MIX.values()) == pytest.approx(1.0)
    share = {c: sum(p for a, p in MIX.items() if APPS[a].size_class == c) for c in BOUNDS}
    assert share == pytest.approx({"small": 0.72, "medium": 0.26, "large": 0.02})
    assert "llm_reasoning" not in MIX
    names = sample_mix(np.random.default_rng(1), 20000)
    assert set(names) == set(MIX)
    freq = names.count("factool_kbqa") / len(names)
    assert freq == pytest.approx(0.144, abs=0.01)


def test_unknown_app_lists_known_names() -> None:
    with pytest.raises(ValueError, match="factool_kbqa"):
        get_app("no_such_app")
