"""HermesLet: the node agent of Hermes.

It connects to the scheduler over ZeroMQ (:mod:`hermes.protocol`), keeps one priority queue per
engine released through a bounded in-flight window, drives engines (vLLM, any OpenAI-compatible
server, the built-in simulated engine) and runs tool calls in a sandbox.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hermeslet.agent import HermesLet

__all__ = ["HermesLet"]


def __getattr__(name: str) -> type[HermesLet]:  # lazy: importing the package must not import zmq/httpx
    if name == "HermesLet":
        from hermeslet.agent import HermesLet

        return HermesLet
    raise AttributeError(name)
