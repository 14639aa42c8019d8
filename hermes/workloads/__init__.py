"""The ten benchmark applications of the Hermes paper's Fig. 1, as stochastic app models.

Each app is a generator of :class:`~hermes.workloads.base.Step` s (one per unit invocation); drivers
(isolated profiling, the simulator, hosted apps in the gateway, the HTTP load driver) execute
the steps. See :mod:`hermes.workloads.base`.
"""
