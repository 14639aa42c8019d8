"""``hermes bench seallm`` end to end on a tiny load: rows, JSON fields, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hermes.bench.seallm import main


def test_bench_seallm_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rows.json"
    rows = main([0], systems=["vllm", "alpaserve"], rate=0.5, duration_s=30.0, n_gpus=8,
                json_path=str(out), workers=1)
    assert [r["system"] for r in rows] == ["vllm", "alpaserve"]
    saved = json.loads(out.read_text())
    for r in saved:
        assert {"system", "seed", "l_n", "p99_s", "slo_attainment"} <= set(r)
        assert r["l_n"] >= 0.9 and 0.0 <= r["slo_attainment"] <= 1.0
    assert "paper L_N" in capsys.readouterr().out


def test_bench_seallm_cli_rejects_unknown_system() -> None:
    from hermes.cli import main as cli_main

    with pytest.raises(SystemExit, match="unknown systems"):
        cli_main(["bench", "seallm", "--systems", "vllm,nope"])
