"""Header-less agent traffic: what builds a gateway's learned history of inferred apps.

Plain OpenAI chat requests, as agents send them with no Hermes header, for the run resolver
and the learner to work on (``hermes bench gateway --warm-history N``, ``hermes bench soak
--agents``). ``apps`` programs, each with its own fixed system prompt (made of words, not
digits, so the resolver's templates keep them apart); each conversation is one run of one
program: a first turn, then with probability ``continue_p`` another turn that sends the whole
conversation so far (the reply the gateway returned included) and a new user turn, up to
``max_turns`` turns. Conversations are independent of each other; ``concurrency`` of them
are in flight, each waiting for its previous reply (an agent's step waits for the last).

Deterministic given ``seed`` (the programs, the order of apps and turn counts; replies are
the engine's).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

_ROLES = ("research", "billing", "travel", "legal", "recipe", "fitness", "support", "coding",
          "weather", "music", "garden", "finance", "history", "medical", "shopping", "school",
          "insurance", "housing", "energy", "logistics")
_TASKS = ("summarise", "classify", "translate", "plan", "review", "explain", "compare",
          "extract", "answer", "rewrite")
_TOPICS = ("invoices", "flights", "contracts", "meals", "workouts", "tickets", "programs",
           "storms", "albums", "plants", "budgets", "wars", "symptoms", "orders", "lessons")


@dataclass(frozen=True, slots=True)
class AgentMix:
    """The shape of the traffic (see the module doc)."""

    apps: int = 20
    max_turns: int = 4
    continue_p: float = 0.6
    max_tokens: int = 8
    model: str = "sim-bench"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.apps < 1 or self.apps > len(_ROLES) * len(_TASKS):
            raise ValueError(f"agent apps must be in [1, {len(_ROLES) * len(_TASKS)}], "
                             f"got {self.apps}")
        if self.max_turns < 1:
            raise ValueError(f"agent max_turns must be >= 1, got {self.max_turns}")
        if not 0.0 <= self.continue_p <= 1.0:
            raise ValueError(f"agent continue_p must be in [0, 1], got {self.continue_p}")


def system_prompt(app: int) -> str:
    """Program ``app``'s fixed instructions (distinct words per program: one app each)."""
    role = _ROLES[app % len(_ROLES)]
    task = _TASKS[(app // len(_ROLES)) % len(_TASKS)]
    return (f"You are the {role} agent of the {task} team. You {task} what the user sends "
            f"about {role} matters, briefly, in plain words.")


def user_turn(rng: random.Random, turn: int) -> str:
    """A user turn: a fixed label and variable text (the unit template stays the same)."""
    topic = rng.choice(_TOPICS)
    return (f"Question: what about the {topic} number {rng.randrange(10**6)}?" if turn == 0
            else f"Follow-up: and the {topic} of case {rng.randrange(10**6)}?")


class Conversations:
    """An endless source of conversation plans: ``(app, turns)``, seeded."""

    def __init__(self, mix: AgentMix) -> None:
        self.mix = mix
        self.rng = random.Random(mix.seed)

    def next(self) -> tuple[int, int]:
        turns = 1
        while turns < self.mix.max_turns and self.rng.random() < self.mix.continue_p:
            turns += 1
        return self.rng.randrange(self.mix.apps), turns


async def drive_agents(url: str, n: int, concurrency: int, mix: AgentMix, *,
                       source: Conversations | None = None, progress: Any = None,
                       timeout_s: float = 60.0) -> tuple[np.ndarray, float, int]:
    """Send ``n`` header-less chat requests as ``concurrency`` agents: (latencies s, wall s,
    errors). ``source`` carries the conversation plans over calls (a later call continues
    the same seeded stream)."""
    import aiohttp

    src = source or Conversations(mix)
    left = n
    lat: list[float] = []
    errors = 0
    hdrs = {"Content-Type": "application/json"}
    conn = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    async with aiohttp.ClientSession(url, connector=conn, headers=hdrs,
                                     timeout=aiohttp.ClientTimeout(total=timeout_s)) as http:

        async def agent() -> None:
            nonlocal left, errors
            while left > 0:
                app, turns = src.next()
                rng = random.Random(src.rng.random())
                msgs: list[dict[str, Any]] = [{"role": "system", "content": system_prompt(app)}]
                for t in range(turns):
                    if left <= 0:
                        return
                    left -= 1
                    msgs.append({"role": "user", "content": user_turn(rng, t)})
                    body = json.dumps({"model": mix.model, "messages": msgs,
                                       "max_tokens": mix.max_tokens}).encode()
                    t0 = time.perf_counter()
                    try:
                        async with http.post("/v1/chat/completions", data=body) as r:
                            got = await r.read()
                            ok = r.status == 200
                    except (TimeoutError, aiohttp.ClientError):
                        ok = False
                    if not ok:
                        errors += 1
                        break  # the conversation is lost: a new one
                    lat.append(time.perf_counter() - t0)
                    if progress is not None:
                        progress.update(1)
                    reply = json.loads(got)["choices"][0]["message"]
                    msgs.append({"role": "assistant", "content": reply.get("content") or ""})

        t0 = time.perf_counter()
        await asyncio.gather(*(agent() for _ in range(concurrency)))
        return np.array(lat), time.perf_counter() - t0, errors
