"""Optional dependencies, installed with an extra of ``hermes-gateway``.

The core install serves (gateway, HermesLet, built-in engine, simulator, benchmarks' tables);
what only an optional part uses comes with an extra, and :func:`require` turns its absence into
one clear error naming the extra:

- ``plot`` (matplotlib): the ``--plot`` figures of ``hermes bench sched|knob|soak``;
- ``docker`` (the Docker SDK): ``hermeslet run --docker`` / ``--container-pool`` (the tool
  runner's Docker sandbox and its pre-started containers);
- ``load`` (the OpenAI SDK): ``hermes load``, whose clients are OpenAI-SDK agents;
- ``tracing`` (the OpenTelemetry SDK with its OTLP exporter): traces of runs
  (:mod:`hermes.gateway.tracing`, ``[tracing]``);
- ``ha-etcd`` (etcd3gw): the etcd election store of elected schedulers
  (``[ha] election = "etcd://HOST:PORT"``, :mod:`hermes.gateway.ha.etcd_store`);
- ``baselines`` (pgmpy): the Bayesian networks of the faithful ``llmsched`` baseline
  (``hermes.core.policies.llmsched_bn``, which checks for it itself: the core imports nothing
  above it).

``pip install 'hermes-gateway[plot,docker,load,baselines,tracing,ha-etcd]'`` (or ``[all]``) installs every one of them.
"""

from __future__ import annotations

import importlib
from types import ModuleType

#: extra -> (distribution it installs, import name, what needs it)
EXTRAS: dict[str, tuple[str, str, str]] = {
    "plot": ("matplotlib", "matplotlib", "plotting (--plot)"),
    "docker": ("docker", "docker", "the Docker tool sandbox and container pool"),
    "load": ("openai", "openai", "hermes load (OpenAI-SDK clients)"),
    "baselines": ("pgmpy", "pgmpy", "the llmsched baseline (Bayesian networks)"),
    "tracing": ("opentelemetry-exporter-otlp-proto-http", "opentelemetry.sdk.trace",
                "tracing of runs (OpenTelemetry SDK and OTLP exporter)"),
    "ha-etcd": ("etcd3gw", "etcd3gw", "the etcd election store ([ha] election = etcd://...)"),
}


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message names the extra to install."""


def require(extra: str) -> ModuleType:
    """Import the module of ``extra``, or raise :class:`MissingExtraError` naming the extra."""
    dist, module, what = EXTRAS[extra]
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"{what} needs {dist}, which is not installed: "
            f"pip install 'hermes-gateway[{extra}]'") from exc
