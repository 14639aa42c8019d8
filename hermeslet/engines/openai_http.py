"""Adapter for any OpenAI-compatible server (vLLM, the built-in sim server, ...) over aiohttp.

Requests go to ``/v1/completions`` or ``/v1/chat/completions``, streamed (server-sent events,
with ``stream_options.include_usage`` so that the last chunk carries token counts) or not.
With ``use_priority`` the request carries vLLM's ``priority`` field (``--scheduling-policy
priority``: lower values are served first). Aborting a request closes its HTTP connection,
which vLLM (and the sim server) treat as an abort.

The client is aiohttp rather than httpx: every gateway request crosses this adapter, and on
``hermes bench gateway`` httpx's AsyncClient (httpcore's pool bookkeeping and anyio stream
layers) cost about 5 ms of CPU per request against aiohttp's 0.3 ms, the single largest item
of the gateway's per-request CPU (vLLM's own serving benchmarks use aiohttp for the same
reason). The session is created on first use, inside the event loop that uses it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator
from typing import Any, ClassVar, Literal

import aiohttp
import msgspec

from hermeslet.engines.base import (
    TRACEPARENT,
    EngineAdapter,
    EngineError,
    EngineKind,
    EngineMetrics,
    GenChunk,
    GenResult,
    Task,
)

log = logging.getLogger("hermeslet.engines")

#: what a failed exchange with the engine raises (connection refused/reset, timeouts)
HTTP_ERRORS: tuple[type[BaseException], ...] = (aiohttp.ClientError, asyncio.TimeoutError)
#: the same, or an answer that is not the JSON (or text) expected
_HTTP_OR_BODY_ERRORS: tuple[type[BaseException], ...] = (*HTTP_ERRORS, ValueError)
_SHORT = aiohttp.ClientTimeout(total=2.0)

_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions",
          "embeddings": "/v1/embeddings", "messages": "/v1/messages"}
#: the Anthropic protocol version asked of a server's ``/v1/messages`` (what every SDK sends)
ANTHROPIC_VERSION = "2023-06-01"


def _choice_text(choice: dict[str, Any], chat: bool) -> str:
    if chat:
        part = choice.get("delta") or choice.get("message") or {}
        return part.get("content") or ""
    return choice.get("text") or ""


def _delta_tokens(choice: dict[str, Any], chat: bool) -> int:
    """Generated tokens in one streamed choice: 1 when it carries output (text, a tool-call
    delta, a refusal or reasoning), else 0 (the role chunk, the finish chunk). Servers such as
    vLLM send one token a chunk; the exact count comes from the final usage."""
    if not chat:
        return 1 if choice.get("text") else 0
    d = choice.get("delta") or {}
    return 1 if (d.get("content") or d.get("tool_calls") or d.get("refusal")
                 or d.get("reasoning_content") or d.get("reasoning")) else 0


def parse_prometheus_load(text: str) -> EngineMetrics:
    """Engine load from a vLLM-style ``/metrics`` page (summed over label sets)."""
    from prometheus_client.parser import text_string_to_metric_families

    vals: dict[str, float] = {}
    capacity: int | None = None
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "vllm:cache_config_info" and capacity is None:
                capacity = _kv_capacity(s.labels)
            elif s.name.startswith("vllm:"):
                vals[s.name] = vals.get(s.name, 0.0) + s.value
    kv = vals.get("vllm:kv_cache_usage_perc", vals.get("vllm:gpu_cache_usage_perc"))
    running = vals.get("vllm:num_requests_running")
    waiting = vals.get("vllm:num_requests_waiting")
    return EngineMetrics(
        running=int(running) if running is not None else None,
        waiting=int(waiting) if waiting is not None else None,
        kv_usage=kv,
        kv_capacity_tokens=capacity,
        extra=vals,
    )


def _kv_capacity(labels: dict[str, str]) -> int | None:
    """KV tokens from ``vllm:cache_config_info``'s labels (its CacheConfig): GPU blocks times
    tokens a block; ``None`` when either is missing or not a positive number."""
    try:
        blocks, size = int(labels["num_gpu_blocks"]), int(labels["block_size"])
    except (KeyError, ValueError):
        return None
    return blocks * size if blocks > 0 and size > 0 else None


class OpenAIHTTPEngine(EngineAdapter):
    kind: ClassVar[EngineKind] = "openai"
    reports_kv_capacity: ClassVar[bool] = True  # vLLM's /metrics (cache_config_info)

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
        session: aiohttp.ClientSession | None = None,
        task: Task = "generate",
        messages_api: Literal["translate", "native"] = "translate",
    ) -> None:
        super().__init__(name=name, model=model, max_inflight=max_inflight,
                         use_priority=use_priority, task=task)
        if messages_api not in ("translate", "native"):
            raise ValueError(f"messages_api must be 'translate' or 'native', not {messages_api!r}")
        if messages_api == "native":  # the server answers /v1/messages itself (vLLM does)
            self.native_endpoints = frozenset(("messages",))
        self.url = url.rstrip("/")
        if self.url.endswith("/v1"):
            self.url = self.url[:-3]
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._pool_size = max(16, 2 * max_inflight)
        self._kv_capacity: int | None = None  # learned from /metrics
        # no total limit (a long generation streams for minutes); each read waits timeout_s
        self._timeout = aiohttp.ClientTimeout(total=None, connect=5.0, sock_read=timeout_s)
        self._session = session

    def _http(self) -> aiohttp.ClientSession:
        """The keep-alive session (created on first use, in the running loop)."""
        if self._session is None or self._session.closed:
            conn = aiohttp.TCPConnector(limit=self._pool_size, keepalive_timeout=30.0)
            self._session = aiohttp.ClientSession(
                self.url, connector=conn, headers=self._headers, timeout=self._timeout,
                json_serialize=json.dumps, raise_for_status=False)
        return self._session

    async def start(self) -> None:
        """Learn the served model (and loaded LoRA adapters) from ``/v1/models``."""
        await self.refresh_models()
        await self.learn_kv_capacity()

    def kv_capacity_tokens(self) -> int | None:
        return self._kv_capacity

    async def learn_kv_capacity(self) -> None:
        """With a KV gate waiting for its budget: read ``/metrics`` now (later reads, every
        heartbeat, also start it); say so when the server does not publish its capacity."""
        if not self.kv_gate_pending:
            return
        await self.metrics()
        if self.kv_gate_pending:
            log.warning("engine %s: --kv-gate: %s/metrics has no vllm:cache_config_info with "
                        "num_gpu_blocks; the gate stays off until it has (or give "
                        "kv_gate_tokens)", self.name, self.url)

    async def refresh_models(self) -> None:
        try:
            async with self._http().get("/v1/models") as r:
                text = await r.read()
                if r.status != 200:
                    raise EngineError(f"{self.url}/v1/models: HTTP {r.status}", retryable=True)
            data = json.loads(text).get("data", [])
        except _HTTP_OR_BODY_ERRORS as e:
            raise EngineError(f"{self.url}/v1/models: {type(e).__name__}: {e}",
                              retryable=True) from e
        ids = [m.get("id") for m in data if m.get("id")]
        bases = [m["id"] for m in data if m.get("id") and not m.get("parent")]
        if not self.model and bases:
            self.model = bases[0]
        self.loras = [i for i in ids if i != self.model]

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()

    async def health(self) -> bool:
        try:
            async with self._http().get("/health", timeout=_SHORT) as r:
                await r.read()
                return r.status == 200
        except HTTP_ERRORS:
            return False

    async def metrics(self) -> EngineMetrics:
        try:
            async with self._http().get("/metrics", timeout=_SHORT) as r:
                if r.status == 200:
                    text = (await r.read()).decode(errors="replace")
                    self.last_metrics = parse_prometheus_load(text)
        except _HTTP_OR_BODY_ERRORS:
            pass
        if self.last_metrics.kv_capacity_tokens:
            self._kv_capacity = self.last_metrics.kv_capacity_tokens
            self._kv_capacity_learned()
        return self.last_metrics

    async def _post_lora(self, path: str, payload: dict[str, Any], what: str) -> None:
        try:
            async with self._http().post(path, json=payload) as r:
                text = (await r.read()).decode(errors="replace")
        except HTTP_ERRORS as e:
            raise EngineError(f"{what}: {type(e).__name__}: {e}", retryable=True) from e
        if r.status != 200:
            raise EngineError(f"{what}: {r.status} {text}", status=r.status)

    async def load_lora(self, name: str, path: str) -> None:
        """Runtime LoRA load (vLLM: needs ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``)."""
        await self._post_lora("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path},
                              f"load_lora_adapter {name}")
        if name not in self.loras:
            self.loras.append(name)

    async def unload_lora(self, name: str) -> None:
        await self._post_lora("/v1/unload_lora_adapter", {"lora_name": name},
                              f"unload_lora_adapter {name}")
        if name in self.loras:
            self.loras.remove(name)

    def _body(self, body: dict[str, Any], stream: bool, priority: int | None) -> dict[str, Any]:
        out = dict(body)
        out.setdefault("model", self.model)
        if "input" in out and "messages" not in out and "prompt" not in out:
            return out  # embeddings: no stream, no priority field (vLLM's pooling API)
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
    def _stream_error(err: Any) -> EngineError:
        """An error event inside a stream (vLLM sends ``data: {"error": {...}}``)."""
        msg = err.get("message") if isinstance(err, dict) else str(err)
        code = err.get("code") if isinstance(err, dict) else None
        status = code if isinstance(code, int) and 400 <= code < 600 else 500
        return EngineError(f"engine error mid-stream: {msg}", retryable=False, status=status)

    @staticmethod
    def _error(status: int, text: str) -> EngineError:
        try:
            j = json.loads(text)
            msg = (j.get("error") or {}).get("message") if isinstance(j.get("error"), dict) \
                else j.get("message")
        except (ValueError, AttributeError):
            msg = None
        return EngineError(
            f"engine HTTP {status}: {msg or text[:500]}",
            retryable=status >= 500 or status == 429,
            status=status,
        )

    async def generate(
        self,
        endpoint: str,
        body: dict[str, Any],
        stream: bool,
        *,
        request_id: str,
        priority: int | None = None,
    ) -> AsyncGenerator[GenChunk | GenResult, None]:
        chat = endpoint == "chat"
        try:
            path = _PATHS[endpoint]
        except KeyError:
            raise EngineError(f"unknown endpoint {endpoint!r}") from None
        if endpoint == "messages":
            async for item in self._messages(body, stream, request_id, priority):
                yield item
            return
        # msgspec: the request and answer bodies of every call pass here (several times
        # faster than json on an answer of a few KB; a malformed answer is a ValueError too)
        payload = msgspec.json.encode(self._body(body, stream, priority))
        headers = {"X-Request-Id": request_id, "Content-Type": "application/json"}
        traceparent = TRACEPARENT.get()
        if traceparent is not None:  # the run's trace goes on into the engine
            headers["traceparent"] = traceparent
        try:
            # leaving the ``async with`` early (abort: the generator is closed or its task
            # cancelled) closes a connection whose response was not read to the end
            async with self._http().post(path, data=payload, headers=headers) as r:
                if not stream:
                    raw = await r.read()
                    if r.status != 200:
                        raise self._error(r.status, raw.decode(errors="replace"))
                    j = msgspec.json.decode(raw)
                    if not isinstance(j, dict):
                        raise ValueError(f"the answer is not a JSON object: {raw[:200]!r}")
                    usage = j.get("usage") or {}
                    if endpoint == "embeddings":
                        yield GenResult(input_tokens=int(usage.get("prompt_tokens", 0)),
                                        output_tokens=0, text="", finish_reason=None,
                                        response=j)
                        return
                    choices = j.get("choices") or [{}]
                    yield GenResult(
                        input_tokens=int(usage.get("prompt_tokens", 0)),
                        output_tokens=int(usage.get("completion_tokens", 0)),
                        text=_choice_text(choices[0], chat),
                        finish_reason=choices[0].get("finish_reason"),
                        response=j,
                    )
                    return
                if r.status != 200:
                    raise self._error(r.status, (await r.read()).decode(errors="replace"))
                parts: list[str] = []
                n_chunks = 0
                usage = {}
                finish: str | None = None
                async for raw_line in r.content:
                    line = raw_line.decode().strip()
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    j = msgspec.json.decode(data)
                    if not isinstance(j, dict):
                        raise ValueError(f"a stream chunk is not a JSON object: {data[:200]}")
                    if j.get("error") and not j.get("choices"):
                        raise self._stream_error(j["error"])
                    if j.get("usage"):
                        usage = j["usage"]
                    choices = j.get("choices") or []
                    if not choices:  # the usage-only chunk: counted, not forwarded
                        continue
                    text = ""
                    produced = 0
                    for c in choices:
                        if c.get("index", 0) == 0:
                            text = _choice_text(c, chat)
                            if c.get("finish_reason"):
                                finish = c["finish_reason"]
                        produced = max(produced, _delta_tokens(c, chat))
                    if text:
                        parts.append(text)
                    n_chunks += produced
                    yield GenChunk(text=text, n_tokens=produced, chunk=j)
                yield GenResult(
                    input_tokens=int(usage.get("prompt_tokens", 0)),
                    output_tokens=int(usage.get("completion_tokens", n_chunks)),
                    text="".join(parts),
                    finish_reason=finish,
                )
        except HTTP_ERRORS as e:
            raise EngineError(f"engine {self.url}: {type(e).__name__}: {e}",
                              retryable=True) from e
        except ValueError as e:  # a body that is not JSON
            raise EngineError(f"engine {self.url}: bad response: {e}", retryable=True) from e

    async def _messages(self, body: dict[str, Any], stream: bool, request_id: str,
                        priority: int | None) -> AsyncGenerator[GenChunk | GenResult, None]:
        """Anthropic's ``/v1/messages`` as the server answers it: each event of a stream is a
        :class:`GenChunk` (``chunk``: the event; ``text``: a ``text_delta``'s text), the
        ``message`` (or the stream's usage and ``stop_reason``) the :class:`GenResult`; an
        ``error`` (HTTP or event) an :class:`EngineError` with the server's message."""
        out = {**body, "model": body.get("model") or self.model, "stream": stream}
        if self.use_priority and priority is not None:
            out["priority"] = priority
        headers = {"X-Request-Id": request_id, "Content-Type": "application/json",
                   "anthropic-version": ANTHROPIC_VERSION}
        try:
            async with self._http().post("/v1/messages", data=json.dumps(out).encode(),
                                         headers=headers) as r:
                if r.status != 200:
                    raise self._error(r.status, (await r.read()).decode(errors="replace"))
                if not stream:
                    j = json.loads(await r.read())
                    used = j.get("usage") or {}
                    yield GenResult(
                        input_tokens=int(used.get("input_tokens") or 0),
                        output_tokens=int(used.get("output_tokens") or 0),
                        text="".join(b.get("text", "") for b in j.get("content") or ()
                                     if isinstance(b, dict) and b.get("type") == "text"),
                        finish_reason=j.get("stop_reason"), response=j)
                    return
                usage: dict[str, Any] = {}
                finish: str | None = None
                parts: list[str] = []
                n_out = 0
                async for raw_line in r.content:
                    line = raw_line.decode().strip()
                    if not line.startswith("data:"):
                        continue  # the ``event:`` line repeats the data's type
                    ev = json.loads(line[5:].strip())
                    if not isinstance(ev, dict):
                        raise ValueError(f"a stream event is not a JSON object: {line[:200]}")
                    kind = ev.get("type")
                    if kind == "error":
                        err = ev.get("error") or {}
                        raise EngineError(f"engine error mid-stream: {err.get('message')}",
                                          retryable=False, status=500)
                    if kind == "message_start":
                        usage.update((ev.get("message") or {}).get("usage") or {})
                    elif kind == "message_delta":
                        usage.update({k: v for k, v in (ev.get("usage") or {}).items()
                                      if v is not None})
                        finish = (ev.get("delta") or {}).get("stop_reason") or finish
                    text = ""
                    produced = 0
                    if kind == "content_block_delta":
                        delta = ev.get("delta") or {}
                        text = delta.get("text", "") if delta.get("type") == "text_delta" else ""
                        produced = 1
                    parts.append(text)
                    n_out += produced
                    yield GenChunk(text=text, n_tokens=produced, chunk=ev)
                    if kind == "message_stop":
                        break
                yield GenResult(input_tokens=int(usage.get("input_tokens") or 0),
                                output_tokens=int(usage.get("output_tokens") or n_out),
                                text="".join(parts), finish_reason=finish)
        except HTTP_ERRORS as e:
            raise EngineError(f"engine {self.url}: {type(e).__name__}: {e}",
                              retryable=True) from e
        except ValueError as e:
            raise EngineError(f"engine {self.url}: bad response: {e}", retryable=True) from e
