"""Security helpers shared by the gateway and the HermesLet: ZeroMQ CURVE keys, key commands."""
