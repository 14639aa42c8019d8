"""FastAPI's native OpenTelemetry is on only where OpenTelemetry is set up (hermes.gateway.app)."""

from __future__ import annotations

import inspect

import pytest
from fastapi import FastAPI

from hermes.gateway.app import _otel_configured, create_app

pytestmark = pytest.mark.skipif("telemetry" not in inspect.signature(FastAPI.__init__).parameters,
                                reason="this FastAPI has no native telemetry")

_VARS = ("OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER", "OTEL_LOGS_EXPORTER",
         "OTEL_EXPORTER_OTLP_ENDPOINT", "FASTAPI_OTEL_AUTO_CONFIGURE", "OTEL_SDK_DISABLED")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for k in _VARS:
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def test_off_without_opentelemetry_so_requests_skip_the_provider_checks(clean_env) -> None:  # noqa: ANN001
    assert not _otel_configured()
    app = create_app()
    assert not app._native_telemetry.enabled()
    cfg = app._telemetry
    assert (cfg["tracing"], cfg["metrics"], cfg["logs"]) == (False, False, False)


@pytest.mark.parametrize("var,value", [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
                                       ("OTEL_TRACES_EXPORTER", "otlp"),
                                       ("FASTAPI_OTEL_AUTO_CONFIGURE", "true")])
def test_on_with_fastapi_defaults_where_opentelemetry_is_set_up(clean_env, var: str,  # noqa: ANN001
                                                                value: str) -> None:
    clean_env.setenv(var, value)
    assert _otel_configured()
    cfg = create_app()._telemetry
    assert (cfg["tracing"], cfg["metrics"], cfg["logs"]) == (True, True, True)
    clean_env.setenv("OTEL_SDK_DISABLED", "true")
    assert not _otel_configured()
