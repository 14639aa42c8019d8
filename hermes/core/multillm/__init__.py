"""Several LLM services on shared GPUs (SeaLLM, Zhao et al. 2025): decision logic, no I/O, no clock.

- :mod:`.service`: ``Service`` (model, length samples, reference execution times) and
  ``ServiceCost`` (per-model iteration cost under a TP size, from the cluster model).
- :mod:`.budget`: the doubling-budget (DB) priority with a fresh ``2^k·Q`` budget per reset.
- :mod:`.replacement`: the adaptive replacement interval (``I ← (1∓β)I``).
- :mod:`.placement`: GPU groups (TP a power of two, at most two services each, replicas) and
  SeaLLM's two-stage placement (largest unsatisfaction index → lowest-rate group with memory).
- :mod:`.ordering`: request orderings inside one group (``fcfs``, ``db``, ``mlfq``, ``rr``).
- :mod:`.forecast`: Hermes' per-service demand forecast from app runs in flight (their
  current unit, next-unit probabilities, step times, tokens) plus new-run rates; tables learned
  from observed runs (issue 22 item 3).
"""
