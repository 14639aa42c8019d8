# Hermes: the gateway (`hermes serve`) and the node agent (`hermeslet run`) in one image.
#
#   docker build -t hermes:latest .
#   docker run --rm -p 8000:8000 hermes:latest                        # gateway, built-in engine
#
# The gateway listens on all interfaces inside the container, so it needs authentication: on a
# start whose auth file (/var/lib/hermes/auth.json, in the state volume) holds no key, it creates
# an API key for tenant "default" and prints it once (docker logs). Keep the state with
# `-v hermes-state:/var/lib/hermes`; more keys: `docker exec CONTAINER hermes keys create
# --tenant T --auth-file /var/lib/hermes/auth.json`.
#   docker run --rm --entrypoint hermeslet hermes:latest run --help   # node agent
#
# Two stages: `build` installs the package into a virtual environment; `runtime` copies only
# that environment (with the shipped PDGraphs as package data) and the example config, and runs
# as a non-root user.
# PYTHON_IMAGE lets an air-gapped build start from a locally imported base image.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# optional: a private package index (air-gapped builds; the CI build test serves one on loopback)
ARG PIP_INDEX_URL
ARG PIP_TRUSTED_HOST
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY hermes ./hermes
COPY hermeslet ./hermeslet
RUN python -m venv /opt/hermes \
    && /opt/hermes/bin/pip install --no-cache-dir . \
    && find /opt/hermes -name '__pycache__' -type d -prune -exec rm -rf {} +

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="hermes" \
      org.opencontainers.image.description="Hermes gateway and HermesLet node agent" \
      org.opencontainers.image.licenses="Apache-2.0"
# bubblewrap: the sandbox of tool calls on the embedded node (hermeslet/tools.py); without it
# (or a HermesLet with --docker) tool calls are refused, never run unsandboxed. It needs user
# namespaces, which Docker's default seccomp profile forbids: in a container, send tool calls
# to a HermesLet with --docker, or run with a profile that allows unshare(CLONE_NEWUSER).
# Pinned (Debian bookworm); BUBBLEWRAP_VERSION overrides it when the mirror moves on.
ARG BUBBLEWRAP_VERSION=0.8.0-2+deb12u1
RUN apt-get update \
    && apt-get install -y --no-install-recommends "bubblewrap=${BUBBLEWRAP_VERSION}" \
    && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 hermes \
    && useradd --system --uid 10001 --gid hermes --home-dir /var/lib/hermes --create-home \
       --shell /usr/sbin/nologin hermes
COPY --from=build /opt/hermes /opt/hermes
COPY hermes/data/hermes.example.toml /etc/hermes/hermes.toml
# Container defaults (docs/configuration.md): listen on all interfaces inside the container,
# accept HermesLets on 5557, the shipped PDGraphs (package data, read-only: the default
# knowledge base), learned state and the API keys' hashes in /var/lib/hermes (a first key
# printed on the first start).
ENV PATH=/opt/hermes/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HERMES_HOST=0.0.0.0 \
    HERMES_BIND=tcp://0.0.0.0:5557 \
    HERMES_STATE_DIR=/var/lib/hermes \
    HERMES_SECURITY__AUTH_FILE=/var/lib/hermes/auth.json \
    HERMES_SECURITY__FIRST_KEY_TENANT=default
WORKDIR /var/lib/hermes
USER 10001:10001
# 8000: HTTP (API, /metrics, /admin); 5557: ZeroMQ for HermesLets; 9100: HermesLet metrics
EXPOSE 8000 5557 9100
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('HERMES_PORT', '8000'), timeout=2)"]
ENTRYPOINT ["hermes"]
CMD ["serve", "--config", "/etc/hermes/hermes.toml"]
