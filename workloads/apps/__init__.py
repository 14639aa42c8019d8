"""The benchmark app models, one module per family (FacTool, ReAct, GoT, LangChain, ...).

Use :mod:`workloads.registry` to look an app up by name.
"""
