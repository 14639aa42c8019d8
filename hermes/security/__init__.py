"""Security helpers shared by the gateway and the HermesLet: ZeroMQ CURVE keys (the ``hermes keys``
commands are in :mod:`hermes.cli.keys`)."""
