"""The cluster model: shapes, memory feasibility, iteration costs, the engine cost model."""

from __future__ import annotations

import pytest

from hermes.core.cluster.cost import (
    BatchShape,
    Plan,
    fits,
    iteration_cost,
    kv_capacity_tokens,
    register_setup,
    shared_fits,
    to_cost_model,
    uniform_placement,
)
from hermes.core.cluster.devices import DEVICES, get_device, parse_gpus
from hermes.core.cluster.models import get_model
from hermes.core.cluster.topology import LINKS, Cluster, GpuId, Node
from hermes.core.costmodel import SETUPS, get_cost_model


@pytest.mark.parametrize("name, published_b", [
    ("llama-2-7b", 6.74), ("llama-2-13b", 13.0), ("llama-2-70b", 69.0), ("llama-3-8b", 8.03),
    ("llama-3-70b", 70.6), ("mistral-7b", 7.24), ("mixtral-8x7b", 46.7), ("codellama-34b", 33.7),
])
def test_parameter_counts_match_published(name: str, published_b: float) -> None:
    assert get_model(name).params / 1e9 == pytest.approx(published_b, rel=0.02)


def test_mixtral_active_parameters() -> None:
    assert get_model("mixtral-8x7b").active_params / 1e9 == pytest.approx(12.9, rel=0.02)


def _one(device: str, n: int, model: str, tp: int, interconnect: str = "nvswitch") -> bool:
    cl = Cluster.single(get_device(device), n, interconnect)
    return fits(cl, uniform_placement(get_model(model), cl.gpus()[:tp], tp))


def test_memory_known_cases() -> None:
    assert not _one("A100-40", 1, "llama-2-70b", 1)  # 128 GiB of weights
    assert not _one("A100-80", 1, "llama-2-70b", 1)
    assert _one("A100-80", 2, "llama-2-70b", 2)  # 64 GiB per GPU, ~6 GiB of KV left
    assert not _one("A100-40", 2, "llama-2-70b", 2)
    assert _one("A100-40", 4, "llama-2-70b", 4)  # 32 GiB of weights of a 36 GiB budget: ~2 GiB KV
    assert _one("A100-40", 1, "llama-2-7b", 1)
    assert _one("A5000", 1, "llama-2-7b", 1)
    assert not _one("A5000", 1, "llama-2-13b", 1)  # 24 GiB card, 24 GiB of weights
    assert _one("H100", 2, "mixtral-8x7b", 2)


def test_kv_capacity_grows_with_tp() -> None:
    cl = Cluster.single(get_device("A100-80"), 8)
    m = get_model("llama-2-13b")
    caps = [kv_capacity_tokens(cl, uniform_placement(m, cl.gpus()[:tp], tp)) for tp in (1, 2, 4)]
    assert caps[0] < caps[1] < caps[2]


def test_tp_cuts_decode_time_and_adds_all_reduce() -> None:
    m = get_model("llama-2-70b")
    cl = Cluster.single(get_device("A100-80"), 8, "nvlink-pairs")
    b = BatchShape(decode_seqs=32, decode_ctx_tokens=32 * 1000)
    c2 = iteration_cost(cl, uniform_placement(m, cl.gpus()[:2], 2), b)
    c4 = iteration_cost(cl, uniform_placement(m, cl.gpus()[:4], 4), b)
    assert c4.total_s < c2.total_s
    # tp=4 crosses the PCIe hop between NVLink pairs: its all-reduce costs more than tp=2's
    assert c4.tp_comm_s[0] > c2.tp_comm_s[0]


def test_pipeline_hand_off_over_slow_link_costs_more() -> None:
    m = get_model("llama-2-13b")
    two = Cluster((Node(get_device("A100-80"), 1), Node(get_device("A100-80"), 1, region="r1")))
    near = Cluster((Node(get_device("A100-80"), 2),))
    b = BatchShape(prefill_tokens=1024)
    far_c = iteration_cost(two, uniform_placement(m, two.gpus(), 1, 2), b)
    near_c = iteration_cost(near, uniform_placement(m, near.gpus(), 1, 2), b)
    assert far_c.pp_comm_s > 100 * near_c.pp_comm_s  # inter-region: 30 ms latency


def test_asymmetric_placement_validates_layers() -> None:
    from hermes.core.cluster.cost import Placement, StageSpec

    m = get_model("llama-2-7b")
    g = [GpuId(0, i) for i in range(3)]
    Placement(m, (StageSpec((g[0], g[1]), 20), StageSpec((g[2],), 12)))
    with pytest.raises(ValueError, match="layers"):
        Placement(m, (StageSpec((g[0],), 20),))
    with pytest.raises(ValueError, match="tensor parallelism 3"):
        Placement(m, (StageSpec(tuple(g), 32),))


def test_shared_group_memory_fractions() -> None:
    cl = Cluster.single(get_device("A100-80"), 1)
    p7 = uniform_placement(get_model("llama-2-7b"), cl.gpus(), 1)
    assert shared_fits(cl, [(p7, 0.45), (p7, 0.45)])
    assert not shared_fits(cl, [(p7, 0.6), (p7, 0.6)])  # fractions above 1


def test_cost_model_matches_calibrated_setup() -> None:
    """The cluster model's engine cost model for LLaMA-2-7B on A100-80 agrees with the
    calibrated setup (fitted separately to the same Vidur profile) within 10%."""
    ours = to_cost_model(get_model("llama-2-7b"), get_device("A100-80"))
    ref = get_cost_model("llama2-7b-a100-80g-cal")
    for pf, ds, ctx in [(0, 1, 100), (0, 64, 64000), (0, 256, 150000), (2048, 0, 0), (512, 32, 20000)]:
        assert ours.iteration_s(pf, ds, ctx) == pytest.approx(ref.iteration_s(pf, ds, ctx), rel=0.10)


def test_register_setup_keeps_existing_setups() -> None:
    before = dict(SETUPS)
    name = register_setup(get_model("llama-2-13b"), get_device("H100"), tp=2)
    assert name == "cluster:llama-2-13b:H100:tp2"
    assert get_cost_model(name).kv_capacity_tokens > 0
    assert all(SETUPS[k] is v for k, v in before.items())
    with pytest.raises(ValueError, match="does not fit"):
        to_cost_model(get_model("llama-2-70b"), get_device("A100-40"))


def test_devices_and_gpus_parsing() -> None:
    for name in ("A100-40", "A100-80", "H100", "H800", "A40", "A6000", "A5000", "RTX3090Ti"):
        assert name in DEVICES
    assert parse_gpus("8xA100-80") == (8, DEVICES["A100-80"])
    with pytest.raises(ValueError, match="unknown device 'B300'"):
        parse_gpus("8xB300")
    with pytest.raises(ValueError, match="malformed --gpus"):
        parse_gpus("eight A100")


def test_links() -> None:
    nv = LINKS["nvlink3-pair"]
    assert nv.all_reduce_s(1 << 20, 1) == 0.0
    assert nv.all_reduce_s(64 << 20, 2) < LINKS["pcie4"].all_reduce_s(64 << 20, 2)
    assert Plan(2, 4).n_gpus == 8
