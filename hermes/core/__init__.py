"""The decision core: logic shared by the live runtime and the simulator.

Decision code here (estimator, policies, ordering, engine model, prewarm planner) never reads
the clock and never performs I/O: every call takes ``now`` (seconds) and returns decisions.
The data formats (PDGraph, run records) also offer file helpers for convenience. See
DESIGN.md, "One core, two drivers".
"""
