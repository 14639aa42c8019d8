"""Adapter for any OpenAI-compatible server (vLLM, the built-in sim server, ...) over httpx.

Requests go to ``/v1/completions`` or ``/v1/chat/completions``, streamed (server-sent events,
with ``stream_options.include_usage`` so that the last chunk carries token counts) or not.
With ``use_priority`` the request carries vLLM's ``priority`` field (``--scheduling-policy
priority``: lower values are served first). Aborting a request closes its HTTP connection,
which vLLM (and the sim server) treat as an abort.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from hermeslet.engines.base import EngineAdapter, EngineError, EngineMetrics, GenChunk, GenResult

_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


def _choice_text(choice: dict[str, Any], chat: bool) -> str:
    if chat:
        part = choice.get("delta") or choice.get("message") or {}
        return part.get("content") or ""
    return choice.get("text") or ""


def parse_prometheus_load(text: str) -> EngineMetrics:
    """Engine load from a vLLM-style ``/metrics`` page (summed over label sets)."""
    from prometheus_client.parser import text_string_to_metric_families

    vals: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("vllm:"):
                vals[s.name] = vals.get(s.name, 0.0) + s.value
    kv = vals.get("vllm:kv_cache_usage_perc", vals.get("vllm:gpu_cache_usage_perc"))
    running = vals.get("vllm:num_requests_running")
    waiting = vals.get("vllm:num_requests_waiting")
    return EngineMetrics(
        running=int(running) if running is not None else None,
        waiting=int(waiting) if waiting is not None else None,
        kv_usage=kv,
        extra=vals,
    )


class OpenAIHTTPEngine(EngineAdapter):
    kind = "openai"

    def __init__(
        self,
        url: str,
        *,
        name: str = "openai",
        model: str | None = None,
        max_inflight: int = 8,
        use_priority: bool = False,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        super().__init__(name=name, model=model, max_inflight=max_inflight,
                         use_priority=use_priority)
        self.url = url.rstrip("/")
        if self.url.endswith("/v1"):
            self.url = self.url[:-3]
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(max_connections=max(16, 2 * max_inflight),
                              max_keepalive_connections=max(16, 2 * max_inflight))
        self._client = client or httpx.AsyncClient(
            base_url=self.url, headers=headers, limits=limits,
            timeout=httpx.Timeout(timeout_s, connect=5.0),
        )

    async def start(self) -> None:
        """Learn the served model (and loaded LoRA adapters) from ``/v1/models``."""
        await self.refresh_models()

    async def refresh_models(self) -> None:
        try:
            r = await self._client.get("/v1/models")
            r.raise_for_status()
            data = r.json().get("data", [])
        except (httpx.HTTPError, ValueError) as e:
            raise EngineError(f"{self.url}/v1/models: {e}", retryable=True) from e
        ids = [m.get("id") for m in data if m.get("id")]
        bases = [m["id"] for m in data if m.get("id") and not m.get("parent")]
        if not self.model and bases:
            self.model = bases[0]
        self.loras = [i for i in ids if i != self.model]

    async def close(self) -> None:
        await self._client.aclose()

    async def health(self) -> bool:
        try:
            r = await self._client.get("/health", timeout=2.0)
            return r.status_code == 200
        except httpx.HTTPError:
            return False

    async def metrics(self) -> EngineMetrics:
        try:
            r = await self._client.get("/metrics", timeout=2.0)
            if r.status_code == 200:
                self.last_metrics = parse_prometheus_load(r.text)
        except (httpx.HTTPError, ValueError):
            pass
        return self.last_metrics

    async def load_lora(self, name: str, path: str) -> None:
        """Runtime LoRA load (vLLM: needs ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``)."""
        r = await self._client.post("/v1/load_lora_adapter",
                                    json={"lora_name": name, "lora_path": path})
        if r.status_code != 200:
            raise EngineError(f"load_lora_adapter {name}: {r.status_code} {r.text}",
                              status=r.status_code)
        if name not in self.loras:
            self.loras.append(name)

    async def unload_lora(self, name: str) -> None:
        r = await self._client.post("/v1/unload_lora_adapter", json={"lora_name": name})
        if r.status_code != 200:
            raise EngineError(f"unload_lora_adapter {name}: {r.status_code} {r.text}",
                              status=r.status_code)
        if name in self.loras:
            self.loras.remove(name)

    def _body(self, body: dict[str, Any], stream: bool, priority: int | None) -> dict[str, Any]:
        out = dict(body)
        out.setdefault("model", self.model)
        out["stream"] = stream
        if stream:
            opts = dict(out.get("stream_options") or {})
            opts["include_usage"] = True
            out["stream_options"] = opts
        else:
            out.pop("stream_options", None)
        if self.use_priority and priority is not None:
            out["priority"] = priority
        return out

    @staticmethod
    def _error(r: httpx.Response, text: str) -> EngineError:
        try:
            j = json.loads(text)
            msg = (j.get("error") or {}).get("message") if isinstance(j.get("error"), dict) \
                else j.get("message")
        except ValueError:
            msg = None
        return EngineError(
            f"engine HTTP {r.status_code}: {msg or text[:500]}",
            retryable=r.status_code >= 500 or r.status_code == 429,
            status=r.status_code,
        )

    async def generate(
        self,
        endpoint: str,
        body: dict[str, Any],
        stream: bool,
        *,
        request_id: str,
        priority: int | None = None,
    ) -> AsyncIterator[GenChunk | GenResult]:
        chat = endpoint == "chat"
        try:
            path = _PATHS[endpoint]
        except KeyError:
            raise EngineError(f"unknown endpoint {endpoint!r}") from None
        payload = self._body(body, stream, priority)
        headers = {"X-Request-Id": request_id}
        try:
            if not stream:
                r = await self._client.post(path, json=payload, headers=headers)
                if r.status_code != 200:
                    raise self._error(r, r.text)
                j = r.json()
                usage = j.get("usage") or {}
                choices = j.get("choices") or [{}]
                yield GenResult(
                    input_tokens=int(usage.get("prompt_tokens", 0)),
                    output_tokens=int(usage.get("completion_tokens", 0)),
                    text=_choice_text(choices[0], chat),
                    finish_reason=choices[0].get("finish_reason"),
                    response=j,
                )
                return
            async with self._client.stream("POST", path, json=payload, headers=headers) as r:
                if r.status_code != 200:
                    raise self._error(r, (await r.aread()).decode(errors="replace"))
                parts: list[str] = []
                n_chunks = 0
                usage: dict[str, Any] = {}
                finish: str | None = None
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    j = json.loads(data)
                    if j.get("usage"):
                        usage = j["usage"]
                    for c in j.get("choices") or []:
                        if c.get("index", 0) != 0:
                            continue
                        text = _choice_text(c, chat)
                        if c.get("finish_reason"):
                            finish = c["finish_reason"]
                        if text:
                            parts.append(text)
                            n_chunks += 1
                            yield GenChunk(text=text, n_tokens=1)
                yield GenResult(
                    input_tokens=int(usage.get("prompt_tokens", 0)),
                    output_tokens=int(usage.get("completion_tokens", n_chunks)),
                    text="".join(parts),
                    finish_reason=finish,
                )
        except httpx.HTTPError as e:
            raise EngineError(f"engine {self.url}: {type(e).__name__}: {e}",
                              retryable=True) from e
