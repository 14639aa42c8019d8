"""What the gateway's prewarm side remembers per (tenant, app, unit) stays bounded however
many inferred apps and units go by."""

from __future__ import annotations

from types import SimpleNamespace

import hermes.gateway.prewarm as gp


def test_unit_prefixes_are_a_bounded_lru(monkeypatch) -> None:
    monkeypatch.setattr(gp, "MAX_PREFIXES", 3)
    pw = gp.GatewayPrewarmer(SimpleNamespace(), None, None, SimpleNamespace())  # type: ignore[arg-type]
    body = {"messages": [{"role": "system", "content": "be brief"},
                         {"role": "user", "content": "hi"}]}
    for i in range(5):
        pw.note_request(f"app{i}", "u", body)
    pw.note_request("app2", "u", body)  # used again: kept over older ones
    pw.note_request("app5", "u", body)
    assert list(pw.prefixes) == [("default", "app4", "u"), ("default", "app2", "u"),
                                 ("default", "app5", "u")]


def _reference_resources(pw, run, app: str, unit: str, backend: str,  # noqa: ANN001
                         kv: dict) -> list[str]:
    """GatewayPrewarmer.resources as first written (every name built per ask)."""
    from hermes.core.backend import BackendSpec
    from hermes.core.prewarm import default_resources, resource_kind, resource_model

    tenant = run.tenant if run is not None else "default"
    spec = BackendSpec.parse(backend)
    adapter = spec.lora
    if spec.kind == "llm" and not spec.lora:
        base = pw.nodes.base_model(spec.name)
        if base is not None:
            backend, adapter = f"llm:{base}@{spec.name}", spec.name
    out = []
    for r in default_resources(run, app, unit, backend):
        if resource_kind(r) == "kv":
            key = (tenant, app, unit)
            if key not in pw.prefixes:
                continue
            r = f"kv:{resource_model(r)}/{tenant}/{app}/{unit}"
            kv[r] = (*key, adapter)
        out.append(r)
    return out


def test_resource_names_built_once_are_the_names_built_per_ask(monkeypatch) -> None:
    """The names of a unit's resources are built once per (tenant, app, unit, backend, base
    model of an adapter); what may change between asks is read each time: whether the
    tenant's prefix of the unit is known yet, and which engine serves a model as an
    adapter. Same lists, same KV resources remembered, as building them per ask."""
    import random

    from hermes.core.state import RunState

    adapters: dict[str, str] = {}
    nodes = SimpleNamespace(base_model=adapters.get)
    pw = gp.GatewayPrewarmer(SimpleNamespace(), nodes, None, SimpleNamespace())  # type: ignore[arg-type]
    body = {"messages": [{"role": "system", "content": "be brief"},
                         {"role": "user", "content": "hi"}]}
    rnd = random.Random(5)
    backends = ["llm:m0", "llm:m0@lora1", "llm:ad1", "docker:python:3.11", "dnn:resnet50",
                "api:search"]
    kv: dict = {}
    for step in range(600):
        tenant, app, unit = (rnd.choice(["default", "t1"]), rnd.choice(["a", "b"]),
                             rnd.choice(["u1", "u2"]))
        run = None if step % 7 == 0 else RunState(run_id="r", app=app, submitted=0.0,
                                                  tenant=tenant)
        if rnd.random() < 0.05:  # a prefix becomes known
            pw.note_request(app, unit, body, tenant)
        if rnd.random() < 0.03:  # an engine starts or stops serving ad1 as an adapter
            if adapters:
                adapters.clear()
            else:
                adapters["ad1"] = "base7b"
        backend = rnd.choice(backends)
        want = _reference_resources(pw, run, app, unit, backend, kv)
        assert pw.resources(run, app, unit, backend) == want, (step, backend)
    assert dict(pw._kv) == kv and kv  # KV resources remembered alike (and some were)
    assert any(k[3] == "ad1" for k in kv.values())  # the adapter case was exercised


def test_resource_name_memos_are_bounded(monkeypatch) -> None:
    monkeypatch.setattr(gp, "MAX_PREFIXES", 3)
    pw = gp.GatewayPrewarmer(SimpleNamespace(), SimpleNamespace(base_model=lambda m: None),
                             None, SimpleNamespace())  # type: ignore[arg-type]
    for i in range(10):
        assert pw.resources(None, f"app{i}", "u", f"docker:img{i}") == [f"docker:img{i}"]
    assert len(pw._named) <= 3 and len(pw._spec) <= 3
