"""The benchmark app models, one module per family (FacTool, ReAct, GoT, LangChain, ...).

Use :mod:`hermes.workloads.registry` to look an app up by name.
"""
