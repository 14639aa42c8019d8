"""The Probabilistic Demand Graph (PDGraph) of one application, and its JSON format.

A PDGraph (the Hermes paper, Fig. 5) has, per unit:

- ``backend``: the backend spec (``llm:MODEL[@LORA]``, ``docker:IMAGE``, ``dnn:MODEL``,
  ``api:NAME``);
- ``consumption``: raw sample lists, FIFO-capped at :data:`MAX_SAMPLES`: ``input_tokens`` and
  ``output_tokens`` (one per LLM request), ``parallelism`` (requests per invocation),
  ``loops`` (invocations per run), ``duration_s`` (tool service time per invocation),
  ``gap_s`` (client/glue time before an invocation);
- ``next``: next-unit probabilities from observed frequencies (``""`` = the app ends), plus
  ``next_by_visit``: the same conditioned on the visit index (1st, 2nd, ... time the unit runs
  in a run), which captures capped loops such as ReAct's ``max_steps``.

Per edge ``"UNIT<-UPSTREAM"``: ``joined`` per-run tuples of both units' invocation features
(the paper joins dependent units' records run by run) and ``masks``: which feature of the unit
depends on which feature of its upstream (Pearson rho over 10 quantile buckets above a
threshold, default 0.5). Features are ``I`` (mean input tokens per request), ``O`` (mean output
tokens per request), ``P`` (parallelism), ``D`` (tool duration) and ``T`` (total output tokens
of the invocation, P x O: what a downstream map-reduce step has to read). The paper's five masks
M_I^Ĩ, M_I^Õ, M_O^Õ, M_O^P̃, M_P^P̃ are ``I<-I``, ``I<-O``, ``O<-O``, ``O<-P``, ``P<-P``; all
pairs are computed, because real apps have others (KBQAV: queries per claim, ``P<-O``).

Files are validated on load; a bad file is rejected with a :class:`PDGraphError` that names
the file, the unit and the field. A document a client uploads is held to more
(:meth:`PDGraph.from_upload`): strict JSON (UTF-8, finite numbers, valid Unicode, bounded
nesting: :mod:`hermes.core.strict_json`), unit names from :data:`UNIT_NAME_RE`, and a JSON
round trip, all before anything is stored.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    ValidationError,
    field_validator,
    model_validator,
)

from hermes.core.backend import BackendSpec

SCHEMA_VERSION = 1
MAX_SAMPLES = 1000
FEATURES: tuple[str, ...] = ("I", "O", "P", "D", "T")
NF = len(FEATURES)
PAPER_MASKS: tuple[str, ...] = ("I<-I", "I<-O", "O<-O", "O<-P", "P<-P")
END = ""  # next-unit key meaning "the app ends"
PROB_TOL = 1e-6
#: unit names an uploaded PDGraph may use (fullmatch): no spaces, no ``<-`` (edge names)
UNIT_NAME_RE = re.compile(r"[A-Za-z0-9_.:@/+-]{1,128}")
UNIT_NAME_RULE = "1-128 characters from [A-Za-z0-9_.:@/+-]"

Probability = Annotated[float, Field(ge=0.0, le=1.0)]


class PDGraphError(ValueError):
    """A PDGraph file or document is invalid. The message names file, unit and field."""


def _check_probs(probs: dict[str, float], what: str) -> dict[str, float]:
    total = sum(probs.values())
    if probs and abs(total - 1.0) > PROB_TOL:
        raise ValueError(f"{what} probabilities sum to {total:.6g}, not 1")
    return probs


class Consumption(BaseModel):
    """Raw demand samples of a unit (FIFO, at most MAX_SAMPLES each)."""

    model_config = ConfigDict(extra="forbid")
    input_tokens: list[NonNegativeInt] = Field(default_factory=list, max_length=MAX_SAMPLES)
    output_tokens: list[NonNegativeInt] = Field(default_factory=list, max_length=MAX_SAMPLES)
    parallelism: list[Annotated[int, Field(ge=1)]] = Field(default_factory=list, max_length=MAX_SAMPLES)
    loops: list[Annotated[int, Field(ge=1)]] = Field(default_factory=list, max_length=MAX_SAMPLES)
    duration_s: list[NonNegativeFloat] = Field(default_factory=list, max_length=MAX_SAMPLES)
    gap_s: list[NonNegativeFloat] = Field(default_factory=list, max_length=MAX_SAMPLES)


class UnitNode(BaseModel):
    """One functional unit of the app."""

    model_config = ConfigDict(extra="forbid")
    backend: str
    visits: NonNegativeInt = 0  # invocations observed (weight of ``next``)
    consumption: Consumption = Field(default_factory=Consumption)
    next: dict[str, Probability] = Field(default_factory=dict)
    next_by_visit: list[dict[str, Probability]] = Field(default_factory=list)
    visits_by_index: list[NonNegativeInt] = Field(default_factory=list)
    # each row: this invocation's features (FEATURES) and its visit index. Rows are tuples
    # (JSON arrays): a tuple of floats is not tracked by the garbage collector, a list is;
    # learned graphs hold up to MAX_SAMPLES rows per unit and edge, which as lists were most
    # of what a full collection of a warm gateway walked (~1.3 million floats, 65-73 ms)
    branch: list[Annotated[tuple[NonNegativeFloat, ...], Field(min_length=NF + 1, max_length=NF + 1)]] = Field(
        default_factory=list, max_length=MAX_SAMPLES
    )
    branch_next: list[str] = Field(default_factory=list, max_length=MAX_SAMPLES)
    branch_masks: list[str] = Field(default_factory=list)

    @field_validator("backend")
    @classmethod
    def _backend(cls, v: str) -> str:
        BackendSpec.parse(v)
        return v

    @field_validator("next")
    @classmethod
    def _next(cls, v: dict[str, float]) -> dict[str, float]:
        return _check_probs(v, "next-unit")

    @field_validator("next_by_visit")
    @classmethod
    def _next_by_visit(cls, v: list[dict[str, float]]) -> list[dict[str, float]]:
        for i, probs in enumerate(v):
            _check_probs(probs, f"visit {i + 1} next-unit")
        return v

    @model_validator(mode="after")
    def _lengths(self) -> UnitNode:
        if self.visits_by_index and len(self.visits_by_index) != len(self.next_by_visit):
            raise ValueError("visits_by_index and next_by_visit differ in length")
        if len(self.branch) != len(self.branch_next):
            raise ValueError("branch and branch_next differ in length")
        for f in self.branch_masks:
            if f not in FEATURES:
                raise ValueError(f"bad branch mask {f!r}; expected one of {FEATURES}")
        return self

    @property
    def is_llm(self) -> bool:
        return self.backend.startswith("llm:")


class Edge(BaseModel):
    """Joined per-run tuples of an (upstream -> unit) pair and the correlation masks found."""

    model_config = ConfigDict(extra="forbid")
    # each tuple: upstream (I, O, P, D, T) followed by unit (I, O, P, D, T)
    # rows as tuples, as UnitNode.branch (not walked by the garbage collector)
    joined: list[Annotated[tuple[NonNegativeFloat, ...], Field(min_length=2 * NF, max_length=2 * NF)]] = Field(
        default_factory=list, max_length=MAX_SAMPLES
    )
    masks: dict[str, bool] = Field(default_factory=dict)
    rho: dict[str, float] = Field(default_factory=dict)

    @field_validator("masks", "rho")
    @classmethod
    def _mask_names(cls, v: dict[str, Any]) -> dict[str, Any]:
        for name in v:
            f, sep, g = name.partition("<-")
            if not sep or f not in FEATURES or g not in FEATURES:
                raise ValueError(f"bad mask name {name!r}; expected F<-G with F, G in {FEATURES}")
        return v


class PDGraph(BaseModel):
    """The PDGraph of one application (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")
    version: int
    app: str = Field(min_length=1)
    runs: NonNegativeInt = 0
    entry: dict[str, Probability]
    units: dict[str, UnitNode]
    edges: dict[str, Edge] = Field(default_factory=dict)
    rho_threshold: float = Field(default=0.5, ge=0.0, le=1.0)
    buckets: int = Field(default=10, ge=2, le=1000)

    @field_validator("version")
    @classmethod
    def _version(cls, v: int) -> int:
        if v != SCHEMA_VERSION:
            raise ValueError(f"unsupported version {v}; this Hermes reads version {SCHEMA_VERSION}")
        return v

    @field_validator("entry")
    @classmethod
    def _entry(cls, v: dict[str, float]) -> dict[str, float]:
        if not v:
            raise ValueError("entry must name at least one first unit")
        return _check_probs(v, "entry")

    @model_validator(mode="after")
    def _references(self) -> PDGraph:
        for name in self.entry:
            if name not in self.units:
                raise _RefError(None, "entry", f"unknown unit {name!r}")
        for uname, node in self.units.items():
            for i, probs in enumerate([node.next, *node.next_by_visit]):
                for nxt in probs:
                    if nxt != END and nxt not in self.units:
                        where = "next" if i == 0 else f"next_by_visit.{i - 1}"
                        raise _RefError(uname, where, f"unknown next unit {nxt!r}")
            for i, nxt in enumerate(node.branch_next):
                if nxt != END and nxt not in self.units:
                    raise _RefError(uname, f"branch_next.{i}", f"unknown next unit {nxt!r}")
        for ename in self.edges:
            v, sep, u = ename.partition("<-")
            if not sep or v not in self.units or u not in self.units:
                raise _RefError(None, f"edges.{ename}", "edge must be UNIT<-UPSTREAM of known units")
        return self

    # ----------------------------------------------------------------------------- helpers
    def next_probs(self, unit: str, visit: int | None = None) -> dict[str, float]:
        """Next-unit probabilities after the ``visit``-th invocation of ``unit`` (1-based).

        Falls back to the unit's aggregate ``next`` beyond the observed visit indices.
        """
        node = self.units[unit]
        if visit is not None and 1 <= visit <= len(node.next_by_visit) and node.next_by_visit[visit - 1]:
            return node.next_by_visit[visit - 1]
        return node.next

    def llm_follow_p(self, unit: str, hops: int = 2) -> float:
        """Probability that an LLM unit is among the next ``hops`` units after ``unit``
        (through tool units; the run's end stops a walk). With ``hops = 2`` it is what a
        router and a KV keeper ask at an LLM unit: will this run prompt an engine again
        after its tool call? 0.0 for a unit the graph does not have."""
        if unit not in self.units:
            return 0.0
        frontier, p = {unit: 1.0}, 0.0
        for _ in range(max(0, hops)):
            nxt: dict[str, float] = {}
            for u, q in frontier.items():
                for v, r in self.next_probs(u).items():
                    node = self.units.get(v)
                    if node is None:  # END
                        continue
                    if node.is_llm:
                        p += q * r
                    else:
                        nxt[v] = nxt.get(v, 0.0) + q * r
            frontier = nxt
        return min(1.0, p)

    def summary(self) -> dict[str, Any]:
        """A compact description for APIs and the CLI."""
        return {
            "app": self.app,
            "version": self.version,
            "runs": self.runs,
            "entry": self.entry,
            "units": {
                name: {
                    "backend": n.backend,
                    "visits": n.visits,
                    "next": n.next,
                    "mean_parallelism": _mean(n.consumption.parallelism),
                    "mean_input_tokens": _mean(n.consumption.input_tokens),
                    "mean_output_tokens": _mean(n.consumption.output_tokens),
                    "mean_loops": _mean(n.consumption.loops),
                    "mean_duration_s": _mean(n.consumption.duration_s),
                }
                for name, n in self.units.items()
            },
            "masks": {e: sorted(k for k, on in edge.masks.items() if on) for e, edge in self.edges.items()},
        }

    # ----------------------------------------------------------------------------- JSON
    def to_json(self, indent: int | None = None) -> str:
        return self.model_dump_json(indent=indent)

    @classmethod
    def from_json(cls, text: str | bytes, source: str = "<pdgraph>") -> PDGraph:
        """Parse and validate a PDGraph document; errors name ``source``, the unit and field."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PDGraphError(f"{source}: not valid JSON (truncated?): {exc}") from None
        return cls.from_dict(data, source)

    @classmethod
    def from_dict(cls, data: object, source: str = "<pdgraph>") -> PDGraph:
        if not isinstance(data, dict):
            raise PDGraphError(f"{source}: a PDGraph must be a JSON object")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise PDGraphError(_describe(exc, source)) from None
        except _RefError as exc:  # raised from the model validator, outside pydantic's wrapping
            raise PDGraphError(exc.describe(source)) from None

    @classmethod
    def from_upload(cls, raw: str | bytes, source: str = "<upload>") -> PDGraph:
        """Parse and validate a PDGraph a client sent (see the module docstring): every
        problem is a :class:`PDGraphError` naming ``source`` and the field, raised before
        anything is stored; the message quotes no text that could not be encoded."""
        from hermes.core.strict_json import StrictJSONError, loads

        try:
            data = loads(raw)
        except StrictJSONError as exc:
            raise PDGraphError(f"{source}: field {exc}" if exc.path else f"{source}: {exc}") from None
        units = data.get("units") if isinstance(data, dict) else None
        if isinstance(units, dict):
            for name in units:
                if not UNIT_NAME_RE.fullmatch(name):
                    raise PDGraphError(f"{source}: field units: bad unit name {name!a}: "
                                       f"expected {UNIT_NAME_RULE}")
        graph = cls.from_dict(data, source)
        cls.from_json(graph.to_json(), source)  # what would be stored loads back
        return graph

    @classmethod
    def load(cls, path: str | Path) -> PDGraph:
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise PDGraphError(f"{path}: cannot read: {exc.strerror}") from None
        return cls.from_json(text, str(path))

    def save(self, path: str | Path) -> None:
        """Write atomically (temp file + rename): never a half-written file."""
        from hermes.fsutil import atomic_write_text

        atomic_write_text(Path(path), self.to_json(indent=None))


class _RefError(ValueError):
    def __init__(self, unit: str | None, field: str, msg: str) -> None:
        super().__init__(msg)
        self.unit, self.field, self.msg = unit, field, msg

    def describe(self, source: str) -> str:
        where = f"unit {self.unit!r}: " if self.unit else ""
        return f"{source}: {where}field {self.field}: {self.msg}"


def _describe(exc: ValidationError, source: str) -> str:
    parts = []
    for err in exc.errors()[:3]:
        loc = [str(p) for p in err["loc"]]
        ctx = err.get("ctx") or {}
        inner = ctx.get("error")
        if isinstance(inner, _RefError):
            parts.append(inner.describe(source))
            continue
        unit = ""
        if len(loc) >= 2 and loc[0] == "units":
            unit = f"unit {loc[1]!r}: "
            loc = loc[2:]
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{source}: {unit}field {'.'.join(loc) or '<root>'}: {msg}")
    more = len(exc.errors()) - 3
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def _mean(xs: Sequence[float]) -> float | None:
    return round(math.fsum(xs) / len(xs), 3) if xs else None


#: the chance that an LLM unit follows, for a run whose app has no PDGraph (or whose graph
#: lacks the unit): no evidence either way
UNKNOWN_NEXT_LLM_P = 0.5


def next_llm_p(graph: PDGraph | None, unit: str, hops: int = 2) -> float:
    """Will the run prompt an engine again within ``hops`` units after ``unit``?
    :meth:`PDGraph.llm_follow_p`, or :data:`UNKNOWN_NEXT_LLM_P` without a graph that has the
    unit. The router asks at an LLM unit (two hops: through its tool call), KV retention at a
    tool unit (one hop)."""
    if graph is None or unit not in graph.units:
        return UNKNOWN_NEXT_LLM_P
    return graph.llm_follow_p(unit, hops)
