"""A multi-LLM offline application: models, their requests, and the dependencies between them.

SamuLLM's computation graph (paper section 3): each node an LLM with a set of requests; an edge
a data flow. A request may wait for other requests (:attr:`Request.after`): of another model
(the chain summary's evaluator waits for a document's last chunk summary) or of its own
(the summariser's chunk ``k+1`` waits for chunk ``k``: the self-loop the paper fuses into one
node). The model-level graph (:meth:`App.upstream`) must be acyclic apart from such self-loops
(:meth:`App.validate`).

Output lengths are unknown before running: :class:`ECDF` samples them from an empirical
distribution (``l_out = min(X, limit, l_max - l_in)``, paper section 4.1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from hermes.core.cluster.models import ModelSpec

ReqKey = tuple[str, int]  # (model name, request id)


@dataclass(frozen=True, slots=True)
class ECDF:
    """An empirical distribution of output lengths (the sorted samples it was built from)."""

    values: tuple[int, ...]

    @classmethod
    def of(cls, samples: Sequence[float]) -> ECDF:
        vals = tuple(sorted(max(1, int(v)) for v in samples))
        if not vals:
            raise ValueError("an eCDF needs at least one sample")
        return cls(vals)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` draws (inverse transform on the empirical CDF)."""
        idx = rng.integers(0, len(self.values), size=n)
        out: np.ndarray = np.asarray(self.values, dtype=np.int64)[idx]
        return out

    def output_lengths(self, rng: np.random.Generator, inputs: Sequence[int], *, limit: int | None,
                       max_seq_len: int) -> list[int]:
        """SamuLLM's sampler: ``min(X, limit, max_seq_len - input)`` per request, at least 1."""
        x = self.sample(rng, len(inputs))
        out = []
        for xi, li in zip(x, inputs, strict=True):
            cap = max_seq_len - int(li)
            if limit is not None:
                cap = min(cap, limit)
            out.append(max(1, min(int(xi), cap)))
        return out


@dataclass(frozen=True, slots=True)
class Request:
    rid: int
    input_tokens: int
    output_tokens: int
    after: tuple[ReqKey, ...] = ()  # requests that must finish first


@dataclass(slots=True)
class ModelNode:
    """One LLM of the application and its requests (ids unique within the model)."""

    name: str
    spec: ModelSpec
    requests: list[Request] = field(default_factory=list)


@dataclass(slots=True)
class App:
    """The application: models by name (their order is the tie-break order of the search)."""

    models: dict[str, ModelNode]

    def upstream(self, name: str) -> set[str]:
        """Models whose outputs ``name`` consumes (self-loops excluded)."""
        return {m for r in self.models[name].requests for m, _ in r.after if m != name}

    def validate(self) -> list[str]:
        """Check the graph; returns the models in topological order. ``ValueError`` names an
        unknown model or request in a dependency, a request that depends on itself or on a
        later request of its own model, or a cycle between models."""
        for node in self.models.values():
            ids = {r.rid for r in node.requests}
            if len(ids) != len(node.requests):
                raise ValueError(f"model {node.name!r}: duplicate request ids")
            for r in node.requests:
                if r.input_tokens < 1 or r.output_tokens < 1:
                    raise ValueError(f"model {node.name!r} request {r.rid}: token counts must be >= 1")
                for m, rid in r.after:
                    if m not in self.models:
                        raise ValueError(f"model {node.name!r} request {r.rid} depends on unknown "
                                         f"model {m!r}")
                    if m == node.name and rid >= r.rid:
                        raise ValueError(f"model {node.name!r} request {r.rid} depends on its own "
                                         f"request {rid} that does not come before it")
                    if m != node.name and rid not in {q.rid for q in self.models[m].requests}:
                        raise ValueError(f"model {node.name!r} request {r.rid} depends on unknown "
                                         f"request {rid} of {m!r}")
        order: list[str] = []
        state: dict[str, int] = {}

        def visit(n: str, path: list[str]) -> None:
            if state.get(n) == 2:
                return
            if state.get(n) == 1:
                cyc = path[path.index(n):] + [n]
                raise ValueError("cyclic DAG: " + " -> ".join(cyc))
            state[n] = 1
            for u in sorted(self.upstream(n), key=list(self.models).index):
                visit(u, path + [n])
            state[n] = 2
            order.append(n)

        for n in self.models:
            visit(n, [])
        return order
