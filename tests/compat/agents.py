"""What the compatibility matrix's agents share: two tools (their JSON schemas, in the chat and
Responses shapes, and Python implementations that validate what the model sent), a structured
output model, and the ``sim_agent`` body extension that makes the built-in engine answer right
after the first round of tool results.

The built-in engine (:mod:`hermeslet.engines.sim_output`) calls tools on the turn that follows
a user message, and after tool results calls again with probability ``tool_call_p`` while
fewer than ``max_tool_rounds`` rounds happened: every loop here is bounded by
:data:`MAX_TURNS`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

import jsonschema
from pydantic import BaseModel

from tests.compat.conftest import CHAT_MODEL, EMBED_MODEL

__all__ = ["CHAT_MODEL", "EMBED_MODEL"]

MAX_TOKENS = 256  # enough for any tool call's arguments here (a ~4-char piece is a token)
#: the engine's default ``max_tool_rounds`` is 4: a loop takes at most 5 model turns
MAX_TURNS = 6
#: exactly one tool round: after tool results the engine answers in text
ONE_ROUND: dict[str, Any] = {"sim_agent": {"tool_call_p": 0.0}}
PROMPT = "What is the weather in Paris in celsius, and what is 2 + 3?"

WEATHER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "a city name"},
                   "unit": {"type": "string", "enum": ["c", "f"]}},
    "required": ["city", "unit"], "additionalProperties": False}
ADD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"], "additionalProperties": False}
SCHEMAS = {"get_weather": WEATHER_SCHEMA, "add": ADD_SCHEMA}
DESCRIPTIONS = {"get_weather": "The current weather in a city.", "add": "Add two integers."}


def get_weather(city: str, unit: Literal["c", "f"]) -> str:
    """The current weather in a city."""
    return f"{city}: 21 degrees {unit.upper()}, sunny"


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


IMPLS = {"get_weather": get_weather, "add": add}


def chat_tools() -> list[dict[str, Any]]:
    """The tools in chat completions' shape."""
    return [{"type": "function", "function": {"name": n, "description": DESCRIPTIONS[n],
                                              "parameters": s}} for n, s in SCHEMAS.items()]


def responses_tools() -> list[dict[str, Any]]:
    """The tools in the Responses API's shape."""
    return [{"type": "function", "name": n, "description": DESCRIPTIONS[n], "parameters": s,
             "strict": True} for n, s in SCHEMAS.items()]


@dataclass
class ToolLog:
    """The tool calls an agent made: (name, arguments) in order."""

    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def execute(self, name: str, arguments: str) -> str:
        """Run a tool call as a model sent it: its arguments must be JSON and valid against
        the tool's schema (a ``jsonschema.ValidationError`` fails the test)."""
        return self.call(name, json.loads(arguments))

    def call(self, name: str, args: dict[str, Any]) -> str:
        """Run a tool call whose arguments a client library parsed (validated likewise)."""
        self.record(name, **args)
        return str(IMPLS[name](**args))

    def record(self, name: str, **args: Any) -> None:
        """A framework ran the tool itself (it validated the arguments): check them again."""
        jsonschema.validate(args, SCHEMAS[name])
        self.calls.append((name, args))

    @property
    def names(self) -> set[str]:
        return {n for n, _ in self.calls}


class CityReport(BaseModel):
    """A structured output: its JSON schema goes to the engine, which answers an instance."""

    city: str
    temperature_c: int
    sunny: bool
    tags: list[str]
