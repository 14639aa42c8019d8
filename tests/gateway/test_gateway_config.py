from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from hermes.gateway.config import ConfigError, GatewayConfig, load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "hermes" / "data" / "hermes.example.toml"


def test_example_documents_every_key_with_its_default() -> None:
    data = tomllib.loads(EXAMPLE.read_text())
    defaults = GatewayConfig().model_dump()
    for section, values in defaults.items():
        if section == "engines":
            assert data["engines"] == values
            continue
        assert set(data[section]) == set(values), section
        assert data[section] == values, section
    assert load_config(EXAMPLE, environ={}) == GatewayConfig()


def test_precedence_file_env_overrides(tmp_path: Path) -> None:
    p = tmp_path / "hermes.toml"
    p.write_text('[scheduler]\npolicy = "vllm"\nk = 0.2\n[server]\nport = 9100\n'
                 '[[engines]]\nname = "a"\nmodel = "m1"\nmax_inflight = 4\n')
    env = {"HERMES_SCHEDULER__K": "0.3", "HERMES_PORT": "9200", "HERMES_TIME_SCALE": "20",
           "OTHER": "x"}
    cfg = load_config(p, environ=env, port=9300, policy=None, apps=["my.apps"])
    assert cfg.apps.modules == ["my.apps"]
    assert cfg.scheduler.policy == "vllm"  # file (the None override is ignored)
    assert cfg.scheduler.k == 0.3  # env beats file
    assert cfg.scheduler.time_scale == 20.0
    assert cfg.server.port == 9300  # override beats env
    assert [(e.name, e.model, e.max_inflight) for e in cfg.engines] == [("a", "m1", 4)]


def test_errors_name_the_source_and_key(tmp_path: Path) -> None:
    p = tmp_path / "bad.toml"
    p.write_text("[scheduler]\ntime_scale = -1\n")
    with pytest.raises(ConfigError, match=r"bad.toml: key scheduler.time_scale"):
        load_config(p, environ={})
    p.write_text("[nope]\nx = 1\n")
    with pytest.raises(ConfigError, match="unknown section"):
        load_config(p, environ={})
    with pytest.raises(ConfigError, match="unknown or ambiguous key 'colour'"):
        load_config(None, environ={}, colour="red")
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "missing.toml", environ={})


def test_default_state_dir_is_the_user_data_dir(monkeypatch, tmp_path) -> None:  # noqa: ANN001
    from hermes.gateway.config import resolve_state_dir

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert load_config(None, environ={}).stores.state_dir == ""
    assert resolve_state_dir("") == tmp_path / "hermes"
    assert resolve_state_dir("~/x") == Path("~/x").expanduser()


def test_a_taken_node_address_is_a_clear_error(tmp_path) -> None:  # noqa: ANN001
    import asyncio
    import socket

    from hermes.gateway.scheduler import LiveScheduler, SchedulerError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def main() -> None:
        def cfg(n: int) -> GatewayConfig:
            return load_config(None, environ={}, bind=f"tcp://127.0.0.1:{port}",
                               state_dir=str(tmp_path / f"s{n}"), kb=str(tmp_path / f"kb{n}"))

        first = LiveScheduler(cfg(0))
        await first.start()
        try:
            with pytest.raises(SchedulerError, match=r"scheduler.bind.*another gateway"):
                await LiveScheduler(cfg(1)).start()
        finally:
            await first.stop()

    asyncio.run(main())


def test_prewarm_timing_reaches_the_live_planner(tmp_path: Path) -> None:
    from hermes.gateway.scheduler import LiveScheduler

    for env, want in (({}, "late"), ({"HERMES_PREWARM_TIMING": "ready"}, "ready")):
        cfg = load_config(None, environ=env, bind="", kb=str(tmp_path / "kb"),
                          state_dir=str(tmp_path / "state"))
        assert LiveScheduler(cfg).prewarm.strategy.timing == want
    with pytest.raises(ConfigError, match="prewarm_timing"):
        load_config(None, environ={"HERMES_PREWARM_TIMING": "soon"})


def test_embedded_sim_engine_kv_pool_from_config() -> None:
    """``[[engines]] kv_cache_gb`` (here from HERMES_ENGINES) gives the embedded built-in
    engine its KV block pool and host tier; the default keeps the LRU of prefixes; a negative
    size is refused naming the key."""
    from hermes.core.warm_models import BlockPoolPrefixCache, LRUPrefixCache
    from hermes.gateway.app import make_engine_adapter

    env = {"HERMES_ENGINES": '[{"name": "s", "kv_cache_gb": 8, "cpu_cache_gb": 4}]'}
    (e,) = load_config(None, environ=env).engines
    eng = make_engine_adapter(e, 1.0)
    assert isinstance(eng.prefix_cache, BlockPoolPrefixCache)
    assert eng.core.kv_capacity == 16384 and eng.prefix_cache.cpu_capacity == 8192
    d, embed = load_config(None, environ={}).engines  # the default: a chat and an embed model
    assert isinstance(make_engine_adapter(d, 1.0).prefix_cache, LRUPrefixCache)
    assert (d.task, embed.task, embed.model) == ("generate", "embed", "sim-embed")
    with pytest.raises(ConfigError, match="kv_cache_gb"):
        load_config(None, environ={"HERMES_ENGINES": '[{"kv_cache_gb": -1}]'})


def test_node_socket_is_bound_only_for_remote_nodes() -> None:
    """Issue 15, item 12: the embedded default binds no TCP node socket (port 5557 may be
    taken); a gateway without an embedded node gets the default address; --bind wins."""
    assert load_config(None, environ={}).scheduler.bind == ""
    remote = load_config(None, environ={"HERMES_EMBEDDED_NODE": "false"})
    assert remote.scheduler.bind == "tcp://127.0.0.1:5557"
    both = load_config(None, environ={}, bind="tcp://127.0.0.1:6001")
    assert both.scheduler.bind == "tcp://127.0.0.1:6001" and both.scheduler.embedded_node


def test_one_environment_variable_names_the_knowledge_base() -> None:
    """Issue 15, item 10: the default knowledge base is the shipped PDGraphs, HERMES_KB names
    another, and the former HERMES_PDGRAPHS is refused with an error naming HERMES_KB."""
    assert load_config(None, environ={}).stores.kb == "shipped"
    assert load_config(None, environ={"HERMES_KB": "/x"}).stores.kb == "/x"
    with pytest.raises(ConfigError, match="HERMES_PDGRAPHS is no longer read: set HERMES_KB"):
        load_config(None, environ={"HERMES_PDGRAPHS": "/x"})


def test_engine_kv_gate_from_config() -> None:
    """``[[engines]] kv_gate``: a sim engine's budget defaults to its KV capacity; an external
    engine's is the one given, else what its ``/metrics`` will report (pending until then)."""
    from hermes.gateway.app import make_engine_adapter
    from hermes.gateway.config import EngineConfig

    assert make_engine_adapter(EngineConfig(name="s"), 1.0).kv_gate_tokens is None
    sim = make_engine_adapter(EngineConfig(name="s", kv_gate=True), 1.0)
    assert sim.kv_gate_tokens == sim.kv_capacity_tokens() > 0
    sized = make_engine_adapter(EngineConfig(name="s", kv_gate=True, kv_gate_tokens=5_000), 1.0)
    assert sized.kv_gate_tokens == 5_000
    ext = EngineConfig(name="ext", kind="openai", url="http://127.0.0.1:9", kv_gate=True)
    pending = make_engine_adapter(ext, 1.0)
    assert pending.kv_gate_pending and pending.kv_gate_tokens is None
    ext = ext.model_copy(update={"kv_gate_tokens": 30_000})
    assert make_engine_adapter(ext, 1.0).kv_gate_tokens == 30_000


def test_placement_auto_never_swaps_a_real_engine_for_a_simulation() -> None:
    """With the embedded node, placement.auto re-places models with built-in simulated
    engines; a configured vLLM or OpenAI-compatible generation engine would silently become a
    simulation, so the configuration is refused naming it. Remote nodes, or only built-in
    engines, are fine."""
    real = [{"name": "v0", "kind": "vllm", "model": "llama-2-7b"},
            {"name": "embed0", "model": "sim-embed", "task": "embed"}]
    with pytest.raises(ConfigError, match=r"would replace v0 \(vllm\).*--accept-placement"):
        load_config(None, environ={}, placement={"auto": True}, engines=real)
    assert load_config(None, environ={}, placement={"auto": True}).placement.auto
    assert load_config(None, environ={}, placement={"auto": True}, engines=real,
                       embedded_node=False).placement.auto
    assert not load_config(None, environ={}, engines=real).placement.auto


def test_an_invalid_environment_value_names_its_variable() -> None:
    """It was reported as coming from "defaults"."""
    with pytest.raises(ConfigError, match=r"^environment variable HERMES_SCHEDULER__N_WALKS: "
                                          r"key scheduler.n_walks: .*integer"):
        load_config(None, environ={"HERMES_SCHEDULER__N_WALKS": "abc"})
    with pytest.raises(ConfigError, match=r"^environment variable HERMES_K: key scheduler.k"):
        load_config(None, environ={"HERMES_K": "2"})


def test_a_misspelled_section_variable_is_refused_naming_it() -> None:
    """HERMES_SCHEDULR__K was silently ignored: the gateway ran with the default K."""
    with pytest.raises(ConfigError, match=r"environment variable HERMES_SCHEDULR__K: no config "
                                          r"section 'schedulr'"):
        load_config(None, environ={"HERMES_SCHEDULR__K": "0.3"})
    # other HERMES_* variables (no section) are not configuration keys and stay allowed
    assert load_config(None, environ={"HERMES_URL": "http://x", "HERMES_ADMIN_TOKEN": "t"})


def test_an_unknown_policy_names_the_file_and_key(tmp_path: Path) -> None:
    p = tmp_path / "hermes.toml"
    p.write_text('[scheduler]\npolicy = "hermez"\n')
    with pytest.raises(ConfigError, match=r"hermes.toml: key scheduler.policy: unknown policy "
                                          r"'hermez'; known: .*hermes"):
        load_config(p, environ={})
    with pytest.raises(ConfigError, match=r"^command line: key scheduler.policy: unknown "
                                          r"policy 'nope'"):
        load_config(None, environ={}, policy="nope")
