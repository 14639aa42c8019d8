"""Backend specs: what a unit runs on.

Spelled as strings everywhere (records, PDGraphs, API):

- ``llm:MODEL`` or ``llm:MODEL@LORA`` (an LLM, optionally with a LoRA adapter)
- ``docker:IMAGE`` (a tool call run in a container, e.g. ``docker:python:3.10-slim``)
- ``dnn:MODEL`` (a DNN tool model, e.g. ``dnn:resnet50``)
- ``api:NAME`` (an external API, e.g. ``api:search``)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

BackendKind = Literal["llm", "docker", "dnn", "api"]
KINDS: tuple[BackendKind, ...] = ("llm", "docker", "dnn", "api")


@dataclass(frozen=True, slots=True)
class BackendSpec:
    kind: BackendKind
    name: str  # model (llm, dnn), image (docker) or API name (api)
    lora: str | None = None

    @classmethod
    def parse(cls, text: str) -> BackendSpec:
        kind, sep, rest = text.partition(":")
        if not sep or kind not in KINDS or not rest:
            raise ValueError(
                f"bad backend {text!r}: expected one of llm:MODEL[@LORA], docker:IMAGE, dnn:MODEL, api:NAME"
            )
        lora = None
        if kind == "llm" and "@" in rest:
            rest, lora = rest.split("@", 1)
            if not rest or not lora:
                raise ValueError(f"bad backend {text!r}: expected llm:MODEL@LORA")
        return cls(kind, rest, lora)  # `kind in KINDS` narrowed it to a BackendKind

    def __str__(self) -> str:
        base = f"{self.kind}:{self.name}"
        return f"{base}@{self.lora}" if self.lora else base

    @property
    def is_llm(self) -> bool:
        return self.kind == "llm"
