"""Benchmarks behind ``hermes bench ...`` (simulator scheduling studies, estimator speed)."""
