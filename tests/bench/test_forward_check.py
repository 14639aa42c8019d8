"""``hermes bench forward``: kernel classes, the decode cache split, the comparison with the
calibrated setups, the CLI's errors, and (where a Python with torch and transformers is at
hand: the vLLM tier's) the measurement itself on a toy model on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hermes.bench import calibrate as C
from hermes.bench import forward_check as F
from hermes.cli import main

ROOT = Path(__file__).resolve().parents[2]
needs_vidur = pytest.mark.skipif(not C.vidur_dir().is_dir(), reason="no ../shared/reference/vidur")

# kernel names as an H100 run printed them (torch 2.11, transformers 5.17)
GEMM = "nvjet_sm90_hsh_128x8_64x12_4x1_v_bz_splitK_TNT"
ATTN = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128"
CAT = "void at::native::(anonymous namespace)::CatArrayBatchedCopy_vectorized<OpaqueType<2u>>"
ELEM = "void at::native::elementwise_kernel<128, 4, gpu_kernel_impl_nocast<BinaryFunctor<c10::Half>>"


def test_classify_real_kernel_names():
    assert F.classify(GEMM) == "gemm"
    assert F.classify(ATTN) == "attention"  # mentions neither gemm nor cutlass first
    assert F.classify("flash_fwd_splitkv_kernel<cutlass::half_t>") == "attention"
    assert F.classify(CAT) == "cat"
    assert F.classify(ELEM) == "other"
    assert F.classify("aten::mm") == "gemm"
    assert F.classify("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"


def test_decode_cache_appends_are_the_longest_concatenations():
    # two passes of a 2-layer model: per pass 2 x 2 cache appends (long) and 4 rotary cats
    one = [(GEMM, 100.0), (ATTN, 50.0)] + [(CAT, 40.0)] * 4 + [(CAT, 2.0)] * 4 + [(ELEM, 10.0)]
    per = F.split_passes(one * 2, "decode", layers=2, passes=2)
    assert per["cache_copy"] == pytest.approx(0.160)  # ms per pass
    assert per["other"] == pytest.approx(0.018)  # rotary cats + the elementwise kernel
    assert per["gemm"] == pytest.approx(0.100) and per["attention"] == pytest.approx(0.050)
    # a prefill's concatenations are all rotary work (the cache's first update stores)
    pre = F.split_passes(one, "prefill", layers=2, passes=1)
    assert pre["cache_copy"] == 0.0 and pre["other"] == pytest.approx(0.178)


def test_cell_terms_match_the_calibration_grid():
    assert F.cell_terms("decode", 8, 0, 512) == (8, 8, 4096, 0.0)
    assert F.cell_terms("prefill", 4, 1024, 0) == (4096, 0, 0, 4 * 0.5 * 1024 * 1024)
    with pytest.raises(ValueError, match="unknown cell kind"):
        F.cell_terms("mixed", 1, 1, 1)


def test_setup_for_device():
    assert F.setup_for_device("NVIDIA H100 80GB HBM3") == "llama2-7b-h100-cal"
    assert F.setup_for_device("NVIDIA H200") == "llama2-7b-h200-cal"
    assert F.setup_for_device("NVIDIA A100-SXM4-80GB") == "llama2-7b-a100-80g-cal"
    assert F.setup_for_device("NVIDIA A100-PCIE-40GB") == "llama2-7b-a100-cal"
    with pytest.raises(ValueError, match="no calibrated setup for device 'cpu'"):
        F.setup_for_device("cpu")


def _measured(rows: list[dict], shape: dict | None = None) -> dict:
    return {"device": "NVIDIA H100 80GB HBM3", "shape": dict(shape or F.LLAMA2_7B), "rows": rows}


def _row(kind: str, batch: int, prompt: int, context: int, gemm: float, attn: float,
         other: float) -> dict:
    return {"kind": kind, "batch": batch, "prompt_tokens": prompt, "context_tokens": context,
            "gemm_ms": gemm, "attention_ms": attn, "other_ms": other, "cache_copy_ms": 0.0,
            "total_ms": gemm + attn + other}


@needs_vidur
def test_compare_prices_cells_as_the_calibration_does():
    rows = F.compare(_measured([_row("decode", 32, 0, 2048, 5.0, 10.0, 1.0),
                                _row("prefill", 1, 4096, 0, 70.0, 9.0, 12.0),
                                {"kind": "decode", "batch": 512, "prompt_tokens": 0,
                                 "context_tokens": 4096, "error": "out of memory"}]),
                     "llama2-7b-h100-cal")
    assert len(rows) == 2  # the cell that did not run is left out
    dec, pre = rows
    spec = C.SPECS["llama2-7b-h100-cal"]
    prof = C.load_profile(spec)
    der = C.derive(spec, prof)
    # the derived decode attention: KV bytes of 32 x 2048 tokens at the achieved bandwidth
    assert dec["derived_attention_ms"] == pytest.approx(1e3 * der.decode_s_per_ctx_token * 65536,
                                                        rel=1e-3)
    assert pre["derived_attention_ms"] == pytest.approx(
        1e3 * der.prefill_attn_s_per_pair * 0.5 * 4096 ** 2, rel=1e-3)
    assert dec["vidur_ops_ms"] == pytest.approx(C.reference_tokens_ms(spec, prof, der, 32), rel=1e-3)
    # errors are model / measured - 1, and the model's GPU part leaves out its CPU term
    assert dec["attention_error"] == pytest.approx(dec["derived_attention_ms"] / 10.0 - 1, abs=1e-3)
    c0, c1 = C.fit_cpu("vllm-v1")
    from hermes.core.costmodel import get_cost_model

    it = get_cost_model("llama2-7b-h100-cal").iteration_s(0, 32, 65536, prefill_seqs=0,
                                                           prefill_pairs=0.0)
    assert dec["model_gpu_ms"] == pytest.approx(1e3 * (it - c0 - 32 * c1), rel=1e-3)
    # on the profiled card the compact model is within a few percent of the reference
    assert abs(dec["model_gpu_ms"] / (dec["vidur_ops_ms"] + dec["derived_attention_ms"]) - 1) < 0.05


@needs_vidur
def test_compare_refuses_a_toy_measurement():
    with pytest.raises(ValueError, match="not LLaMA-2-7B"):
        F.compare(_measured([], shape=F.TINY), "llama2-7b-h100-cal")


@needs_vidur
def test_cli_compares_a_measurement_file(tmp_path, capsys):
    f = tmp_path / "m.json"
    f.write_text(json.dumps(_measured([_row("decode", 8, 0, 512, 5.3, 1.0, 2.1)])))
    out = tmp_path / "c.json"
    assert main(["bench", "forward", "--measured", str(f), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "llama2-7b-h100-cal" in text and "decode" in text
    doc = json.loads(out.read_text())
    assert doc["compare"][0]["setup"] == "llama2-7b-h100-cal"


@needs_vidur
def test_cli_says_which_cells_were_not_measured(tmp_path, capsys):
    f = tmp_path / "m.json"
    oom = {"kind": "decode", "batch": 512, "prompt_tokens": 0, "context_tokens": 4096,
           "error": "out of memory: CUDA"}
    f.write_text(json.dumps(_measured([_row("decode", 8, 0, 512, 5.3, 1.0, 2.1), oom])))
    assert main(["bench", "forward", "--measured", str(f)]) == 0
    assert "decode batch 512 prompt 0 context 4096 was not measured (out of memory" in \
        capsys.readouterr().err
    f.write_text(json.dumps(_measured([oom])))
    assert main(["bench", "forward", "--measured", str(f)]) == 2
    assert "no measured cell" in capsys.readouterr().err


def test_cli_errors(tmp_path, capsys):
    assert main(["bench", "forward", "--measured", str(tmp_path / "nope.json")]) == 2
    assert "nope.json" in capsys.readouterr().err
    f = tmp_path / "m.json"
    f.write_text(json.dumps({**_measured([]), "device": "Mystery GPU"}))
    assert main(["bench", "forward", "--measured", str(f)]) == 2
    assert "no calibrated setup for device 'Mystery GPU'" in capsys.readouterr().err


def test_cli_without_torch_says_where_to_measure(capsys):
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("torch is importable here")
    assert main(["bench", "forward"]) == 2
    assert "python -m hermes.bench.forward_check --out F" in capsys.readouterr().err


def _torch_python() -> str | None:
    """A Python with torch and transformers: this one, or the vLLM tier's."""
    for py in (sys.executable, os.environ.get("HERMES_VLLM_PYTHON")):
        if py and subprocess.run([py, "-c", "import torch, transformers"],
                                 capture_output=True).returncode == 0:
            return py
    return None


@pytest.mark.slow
def test_measure_a_toy_model_on_the_cpu(tmp_path):
    """In .ci/run's vLLM tier (its venv has torch and transformers): the measuring half runs
    end to end, on a toy model on the CPU (the real check needs a GPU: README)."""
    py = _torch_python()
    if py is None:
        pytest.skip("no Python with torch and transformers (the vLLM tier has one)")
    out = tmp_path / "tiny.json"
    r = subprocess.run([py, "-m", "hermes.bench.forward_check", "--out", str(out), "--tiny",
                        "--device", "cpu", "--repeats", "2"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    m = json.loads(out.read_text())
    assert m["device"] == "cpu" and m["shape"] == F.TINY
    dec, pre = m["rows"]
    assert (dec["kind"], dec["batch"], dec["context_tokens"]) == ("decode", 2, 16)
    for row in (dec, pre):
        assert row["gemm_ms"] > 0 and row["attention_ms"] > 0 and row["total_ms"] > 0
        assert row["total_ms"] == pytest.approx(row["gemm_ms"] + row["attention_ms"]
                                                + row["other_ms"], abs=1e-3)
        assert len(row["kernels"]) > 0
    assert dec["cache_copy_ms"] > 0 and pre["cache_copy_ms"] == 0
