"""HexGen (issue 21): asymmetric pipelines on heterogeneous GPUs.

- :mod:`.layout`: the per-pipeline dynamic programme (stages, TP degree, layers per stage over
  an ordered GPU group) on the cluster cost model.
- :mod:`.fitness`: SLO attainment of a set of pipelines by simulating request queueing and
  continuous batching per pipeline.
- :mod:`.search`: the genetic search over GPU groupings (clustering initialisation; merge,
  split and swap mutations, or random mutation as a baseline).
"""
