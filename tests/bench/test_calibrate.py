"""``hermes bench calibrate``: the calibrated engine model against Vidur's measured operator
times (skipped where ../shared/reference/vidur is absent), and the committed coefficients are
what the fit produces."""

from __future__ import annotations

import json

import pytest

from hermes.bench import calibrate as C
from hermes.core.costmodel import get_cost_model
from hermes.core.engine_calibration import CALIBRATION

HAVE_VIDUR = (C.vidur_dir() / "compute" / "a100").is_dir()
needs_vidur = pytest.mark.skipif(
    not HAVE_VIDUR, reason=f"Vidur profiles not found at {C.vidur_dir()} (set $HERMES_VIDUR)"
)


@needs_vidur
@pytest.mark.parametrize("mode", ["vllm-v1", "vllm-0.4"])
@pytest.mark.parametrize("setup", ["llama2-7b-a100-cal", "llama2-7b-a100-80g-cal"])
def test_calibrated_model_is_within_ten_percent_of_the_measurements(setup: str, mode: str):
    rows = C.calibration_rows(setup, mode)
    kinds = {r["kind"] for r in rows}
    assert {"decode", "prefill"} <= kinds and (mode == "vllm-0.4") == ("mixed" not in kinds)
    for r in rows:
        assert abs(r["rel_error"]) <= 0.10, r
        assert r["rel_error"] == pytest.approx(
            (r["model_ms"] - r["measured_ms"]) / r["measured_ms"], abs=2e-4)


@needs_vidur
def test_a_few_cells_by_hand_against_the_measured_table() -> None:
    """The GPU part of the model (base minus the CPU fit, plus the per-token operators) at a
    few token counts against 32 x the measured layer operators; 9.28 ms at one token on the
    profiled card (the issue's ~9.3 ms), and the 128 -> 136 step of the staircase."""
    spec = C.SPECS["llama2-7b-a100-80g-cal"]
    prof = C.load_profile(spec)
    assert 32 * prof.at(1)[0] == pytest.approx(9.28, abs=0.01)
    cost = get_cost_model("llama2-7b-a100-80g-cal")
    c0, _ = C.fit_cpu("vllm-v1")
    for tokens in (1, 64, 128, 136, 512, 2048, 4096):
        gpu = cost.base_s - c0 + cost.excess_s(tokens)
        assert gpu == pytest.approx(32e-3 * prof.at(tokens)[0], rel=0.05), tokens
    assert cost.excess_s(136) - cost.excess_s(128) > 0.004  # +5 ms: a GEMM tile step


@needs_vidur
def test_the_committed_coefficients_are_the_fit() -> None:
    """``hermes bench calibrate --write`` would not change the committed table."""
    assert C.fit_all() == CALIBRATION
    assert C.render_table(C.fit_all()) == C.table_path().read_text()


@needs_vidur
def test_the_idealised_model_is_outside_the_tolerance() -> None:
    """Why the calibration exists: the former figures miss prefill by up to ~70%."""
    rows = C.calibration_rows("llama2-7b-a100-ideal", "vllm-v1")
    assert max(abs(r["rel_error"]) for r in rows) > 0.3


@needs_vidur
def test_cli_writes_the_rows(tmp_path, capsys) -> None:
    import argparse

    p = argparse.ArgumentParser()
    sub = p.add_subparsers()
    C.add_calibrate_parser(sub)
    out = tmp_path / "cal.json"
    args = p.parse_args(["calibrate", "--setup", "llama2-7b-a100-cal@vllm-0.4",
                         "--json", str(out)])
    assert args.func(args) == 0
    rows = json.loads(out.read_text())
    assert rows and {"batch", "prompt_tokens", "context_tokens", "model_ms", "measured_ms",
                     "rel_error"} <= set(rows[0])
    assert {r["mode"] for r in rows} == {"vllm-0.4"}
    assert "worst |error|" in capsys.readouterr().out


def test_committed_coefficients_work_without_the_profiles() -> None:
    """The core reads the committed table only: no file is needed at run time."""
    for name in CALIBRATION:
        for mode in ("vllm-v1", "vllm-0.4"):
            cost = get_cost_model(name, mode=mode)
            assert cost.calibrated and cost.mode == mode
            # one decode step: ~10-13 ms on an A100, ~6-7 ms on an H100 (Vidur's H100 profile;
            # the H200 setup prices its GEMMs as the H100's)
            lo, hi = (0.008, 0.02) if "a100" in name else (0.005, 0.009)
            assert lo < cost.iteration_s(0, 1, 100) < hi
