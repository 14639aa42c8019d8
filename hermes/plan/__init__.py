"""``hermes plan``: GPU planning commands (SamuLLM's batch planner, the cluster model's
calibration). The decisions live in :mod:`hermes.core.batchplan` and
:mod:`hermes.core.cluster`; this package reads data, runs the search in processes and prints."""
