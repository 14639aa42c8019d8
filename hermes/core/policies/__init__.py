"""Scheduling policies. Importing this package registers every built-in policy.

Contract names: ``hermes``, ``hermes-no-refine``, ``hermes-ddl``, ``vllm``, ``parrot``, ``vtc``,
``edf``, ``srpt``, ``sjf``, ``llmsched`` (the paper's Bayesian network and Algorithm 1),
``llmsched-lite`` (its approximation on the PDGraph estimator), ``seallm``,
``autellix-plas``, ``autellix-atlas``, ``oracle``. Build one with
:func:`~hermes.core.policies.base.make_policy`.
"""

from __future__ import annotations

from hermes.core.policies import (  # noqa: F401  (modules register their policies)
    autellix,
    deadline,
    fcfs,
    hermes_policy,
    llmsched,
    llmsched_bn,
    seallm,
    sjf,
    srpt,
    vtc,
)
from hermes.core.policies.base import (
    SchedulingPolicy,
    make_policy,
    policy_class,
    policy_names,
    register,
)

__all__ = ["SchedulingPolicy", "make_policy", "policy_class", "policy_names", "register"]
