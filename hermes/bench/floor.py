"""The floor of ``hermes bench gateway --floor``: the gateway's HTTP stack with nothing of
Hermes in it.

A FastAPI app served by uvicorn (httptools, on uvloop: :mod:`hermes.evloop`), as the gateway
is, that forwards each completion to the engine server with aiohttp, as the gateway's
``openai`` engine adapter does, decoding and encoding the bodies with msgspec, as both do. No
authentication, no run, no ranking, no node, no record: its CPU per request is what any
Python proxy on these parts pays for a request and its engine call, and the gateway's CPU
above it is Hermes' own work (the ``path`` ``floor`` rows beside the gateway rows, one run).

``python -m hermes.bench.floor --port P --upstream URL`` (loopback only).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgspec
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

#: the endpoints the benchmark sends (the engine's paths, forwarded as they are)
PATHS = ("/v1/chat/completions", "/v1/completions")


def floor_app(upstream: str) -> Any:
    """The proxy: ``POST`` of :data:`PATHS` forwarded to ``upstream``, the engine's answer
    returned with its status; ``GET /health``."""
    state: dict[str, aiohttp.ClientSession] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        s = state.pop("http", None)
        if s is not None:
            await s.close()

    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None, lifespan=lifespan)

    def session() -> aiohttp.ClientSession:
        s = state.get("http")
        if s is None:  # created on the serving loop, keep-alive to the engine
            s = state["http"] = aiohttp.ClientSession(upstream, connector=aiohttp.TCPConnector(
                limit=0, force_close=False))
        return s

    async def forward(request: Request) -> Response:
        try:
            body = msgspec.json.decode(await request.body())
        except msgspec.DecodeError as e:
            return JSONResponse({"error": {"message": f"the body is not JSON: {e}",
                                           "type": "invalid_request_error"}}, status_code=400)
        async with session().post(request.url.path, data=msgspec.json.encode(body),
                                  headers={"Content-Type": "application/json"}) as r:
            raw = await r.read()
            return Response(raw, status_code=r.status, media_type="application/json")

    for path in PATHS:
        app.add_api_route(path, forward, methods=["POST"])

    @app.get("/health")
    async def health() -> dict[str, bool]:
        return {"ok": True}

    return app


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    from hermes import evloop

    p = argparse.ArgumentParser(prog="python -m hermes.bench.floor", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True, help="the engine server's base URL")
    args = p.parse_args(argv)
    cfg = uvicorn.Config(floor_app(args.upstream), host="127.0.0.1", port=args.port,
                         http="httptools", log_level="warning", access_log=False,
                         timeout_keep_alive=30)
    evloop.run(uvicorn.Server(cfg).serve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
