"""instructor as a client of the gateway, run by its own venv's python (it pins openai 2).

``python instructor_client.py BASE_URL MODE``; MODE ``tools`` (TOOLS mode: the model is
forced to call a tool whose schema is the response model), ``retry`` (TOOLS mode whose
validator rejects the first answer: instructor sends the error back for a second try),
``stream`` (TOOLS mode, ``create_partial``: the object built from streamed argument pieces)
or ``json_schema`` (JSON_SCHEMA mode: ``response_format``). Prints one JSON object: the
``X-Hermes-Run`` of every model call (``runs``, one agent run), whether each asked for a
stream (``streamed``) and the object (``report``)."""

from __future__ import annotations

import json
import sys
from typing import Any

import instructor
import openai
from pydantic import BaseModel, field_validator

try:  # openai 3.0-3.x speaks httpx2 (httpx's successor), later ones either
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx  # type: ignore[no-redef]

MODEL = "llama-2-7b"


class CityReport(BaseModel):
    city: str
    temperature_c: int
    sunny: bool


class CheckedReport(CityReport):
    """Rejects the first answer it sees (as a validator checking facts would)."""

    @field_validator("city")
    @classmethod
    def _once(cls, v: str) -> str:
        if not REJECTED:
            REJECTED.append(v)
            raise ValueError("name the city exactly as the user did")
        return v


REJECTED: list[str] = []


def main(base_url: str, mode: str) -> dict[str, Any]:
    runs: list[str] = []

    def hook(r: httpx.Response) -> None:
        if "x-hermes-run" in r.headers:
            runs.append(r.headers["x-hermes-run"])

    streamed: list[bool] = []

    def sent(r: httpx.Request) -> None:
        streamed.append(bool(json.loads(r.content).get("stream")))

    raw = openai.OpenAI(base_url=base_url, api_key="any", max_retries=0,
                        http_client=httpx.Client(event_hooks={"request": [sent],
                                                              "response": [hook]}))
    imode = instructor.Mode.JSON_SCHEMA if mode == "json_schema" else instructor.Mode.TOOLS
    client = instructor.from_openai(raw, mode=imode)
    messages = [{"role": "user", "content": "Report on the weather in Paris."}]
    kw: dict[str, Any] = {"model": MODEL, "messages": messages, "max_tokens": 256}
    out: dict[str, Any] = {"runs": [runs], "streamed": streamed}
    if mode == "stream":
        partials = list(client.chat.completions.create_partial(response_model=CityReport,
                                                               **kw))
        out["partials"] = len(partials)
        report = CityReport.model_validate(partials[-1].model_dump())
    elif mode == "retry":
        report = client.chat.completions.create(response_model=CheckedReport, max_retries=2,
                                                **kw)
        out["rejected"] = REJECTED
    else:
        report = client.chat.completions.create(response_model=CityReport, max_retries=0, **kw)
    out["report"] = report.model_dump()
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
