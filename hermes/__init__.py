"""Hermes: a serving gateway for LLM applications.

Hermes learns a Probabilistic Demand Graph (PDGraph) per application, estimates how much
work a running application still has, orders applications by Gittins rank (or least slack
with deadlines) and prewarms the backends the next unit will need.
"""

__version__ = "0.1.0"
