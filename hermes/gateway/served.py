"""Which model a request goes to, from the models the connected engines serve.

One rule, used where the engines are known (the scheduler's node table,
:meth:`hermes.gateway.nodes.NodeTable.resolve_model`) and where only their list is known (an
edge answering ``POST /v1/messages/count_tokens`` from the served-model set the active
scheduler gives it: :class:`hermes.gateway.edge.wire.Models`), so that both answer and refuse
alike, with the same errors and messages. No I/O: ``served(task)`` says what is served.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hermes.gateway.errors import ModelNotFound, NoCapacity, WrongTask


def resolve_served(model: str | None, *, strict: bool, task: str,
                   served: Callable[[str | None], Sequence[str]], default_model: str,
                   route_unknown: bool) -> str:
    """The model a request for ``task`` goes to: itself if served for ``task``, else the
    default (``default_model`` for generation, else the first served), unless ``strict``
    (an unknown model is refused with :class:`ModelNotFound`, 404, when ``route_unknown`` is
    off). A model served only for the other task is refused (:class:`WrongTask`, 400) rather
    than routed elsewhere; nothing to route to is :class:`NoCapacity` (503).
    ``served(task)``: the models served for ``task`` in their order (``None``: every task)."""
    models = served(task)
    if model and model in models:
        return model
    if model and strict and model in served(None):
        what = "embedding" if task == "embed" else "chat/text generation"
        raise WrongTask(f"the model {model!r} does not support {what}; models that do: "
                        f"{', '.join(models) or 'none'}")
    if strict and model and not route_unknown:
        raise ModelNotFound(f"the model {model!r} does not exist; served: "
                            f"{', '.join(models) or 'none'}")
    default = (default_model if task == "generate" else "") or (models[0] if models else "")
    if not default:
        raise NoCapacity(f"no connected engine serves {task} requests")
    return default
