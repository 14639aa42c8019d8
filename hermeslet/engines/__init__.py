"""Engine adapters: how a HermesLet talks to an LLM engine.

- :class:`~hermeslet.engines.base.EngineAdapter`: the interface;
- :class:`~hermeslet.engines.openai_http.OpenAIHTTPEngine`: any OpenAI-compatible server;
- :class:`~hermeslet.engines.vllm.VLLMEngine`: a supervised vLLM server (or one attached by URL);
- :class:`~hermeslet.engines.sim_engine.SimEngine`: the built-in simulated engine, in process.

:func:`make_engine` builds one from its CLI spelling (``sim``, ``openai:URL``, ``vllm[:URL]``).
"""

from __future__ import annotations

from typing import Any

from hermeslet.engines.base import EngineAdapter, EngineError, GenChunk, GenResult

__all__ = ["EngineAdapter", "EngineError", "GenChunk", "GenResult", "make_engine"]


def make_engine(spec: str, *, name: str | None = None, model: str | None = None,
                max_inflight: int = 8, time_scale: float = 1.0, **kw: Any) -> EngineAdapter:
    """An engine adapter from ``sim`` | ``openai:URL`` | ``vllm`` | ``vllm:URL``."""
    kind, _, rest = spec.partition(":")
    if kind == "sim":
        from hermeslet.engines.sim_engine import SimEngine

        return SimEngine(name=name or "sim", model=model or "llama-2-7b",
                         max_inflight=max_inflight, time_scale=time_scale, **kw)
    if kind == "openai":
        if not rest:
            raise ValueError("openai engine needs a URL: openai:http://HOST:PORT")
        from hermeslet.engines.openai_http import OpenAIHTTPEngine

        return OpenAIHTTPEngine(rest, name=name or "openai", model=model,
                                max_inflight=max_inflight, **kw)
    if kind == "vllm":
        from hermeslet.engines.vllm import VLLMEngine

        return VLLMEngine(url=rest or None, name=name or "vllm", model=model,
                          max_inflight=max_inflight, **kw)
    raise ValueError(f"unknown engine {spec!r}: expected sim, openai:URL, vllm or vllm:URL")
