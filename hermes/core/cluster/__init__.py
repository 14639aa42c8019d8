"""The cluster model: GPUs, links, models and what a parallel plan costs (pure: no I/O, no clock).

Interface (for the planners built on it: SamuLLM here, HexGen and SeaLLM next):

- :mod:`~hermes.core.cluster.devices`: ``DeviceType`` (memory, HBM bandwidth, dense FLOPs,
  fitted ``Efficiency``), ``DEVICES`` (A100-40/80, H100, H800, A40, A6000, A5000, RTX3090Ti),
  ``get_device(name)``, ``parse_gpus("8xA100-80") -> (8, DeviceType)``.
- :mod:`~hermes.core.cluster.topology`: ``Link`` (``send_recv_s(bytes)``,
  ``all_reduce_s(bytes, workers)``), ``LINKS``; ``Node(device, n_gpus, interconnect, region)``
  with interconnect ``nvswitch`` | ``nvlink-pairs`` | ``pcie``; ``Cluster(nodes)`` addressing
  GPUs as ``GpuId(node, local)``: ``link(a, b)``, ``group_link(gpus)`` (slowest pair),
  ``between(group_a, group_b)`` (pipeline hand-off), ``Cluster.single(device, n)``.
- :mod:`~hermes.core.cluster.models`: ``ModelSpec`` (layers, hidden, heads, KV heads, ffn,
  vocab, context, MoE experts; ``params``, ``active_params``, ``kv_bytes_per_token(tp,
  layers)``, ``valid_tp``), ``MODELS``, ``get_model(name)``.
- :mod:`~hermes.core.cluster.cost`:
  ``Placement(model, stages)`` of ``StageSpec(gpus, layers)``: one replica, each pipeline
  stage its own GPU group (TP = its size) and layer count (HexGen's asymmetric pipelines);
  ``uniform_placement(model, gpus, tp, pp)``; ``Plan(dp, tp, pp)``.
  ``iteration_cost(cluster, placement, BatchShape(...)) -> IterationCost`` (per-stage compute
  incl. TP all-reduce, PP send/recv, CPU; ``total_s`` latency, ``bottleneck_s`` pipelined);
  ``linear_layer_s``, ``iteration_flops``.
  Memory: ``stage_memory`` (weights, activations, KV left), ``kv_capacity_tokens``, ``fits``
  (weights + activations + one full-length sequence of KV), ``shared_fits(cluster,
  [(placement, memory_fraction), ...])`` for several models on one GPU group (SeaLLM).
  ``load_s(model, plan)``: model start-up time (assumed figures).
  Engine model: ``to_cost_model(model, device, tp, pp) -> CostModel`` (the simulator's class)
  and ``register_setup(...)`` (adds ``cluster:MODEL:DEVICE:tpN`` to the engine setups).
- :mod:`~hermes.core.cluster.calibration`: ``compute_cells`` / ``network_cells`` /
  ``exceptions``: the model vs measured rows (``hermes plan calibrate`` reads Vidur's data).
"""
