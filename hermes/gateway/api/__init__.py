"""The gateway's HTTP edge: it parses, authorizes, calls the scheduler's services and answers.

- :mod:`~hermes.gateway.api.openai_api`: ``/v1/chat/completions``, ``/v1/completions``,
  ``/v1/embeddings``, ``/v1/models`` (bodies: :mod:`~hermes.gateway.api.openai_bodies`);
- :mod:`~hermes.gateway.api.responses_api`: ``/v1/responses`` (the translation is
  :mod:`hermes.gateway.responses`);
- :mod:`~hermes.gateway.api.anthropic_api`: Anthropic's ``/v1/messages`` (and
  ``/count_tokens``), translated to chat (bodies: :mod:`~hermes.gateway.api.anthropic_bodies`);
- :mod:`~hermes.gateway.api.binding`: which run and unit an OpenAI request belongs to;
- :mod:`~hermes.gateway.api.runs_api`, :mod:`~hermes.gateway.api.apps_api`: runs, their tool
  calls and unit events, apps and their PDGraphs, ``/healthz``;
- :mod:`~hermes.gateway.api.admin_api`: ``/admin/...`` and ``/metrics``;
- :mod:`~hermes.gateway.api.errors`: OpenAI's error shape for every error (Anthropic's on
  the Messages API's routes);
- :mod:`~hermes.gateway.api.fastpath`, :mod:`~hermes.gateway.api.httpproto`: the completion
  endpoints past FastAPI's router, and coalesced response writes.

The edge holds no scheduling state: runs, requests and nodes are the services'
(:class:`hermes.gateway.scheduler.LiveScheduler`). Importing this package imports none of
its modules.
"""
