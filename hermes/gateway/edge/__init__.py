"""Split roles: HTTP edges in front of one elected scheduler (``hermes serve --role``).

- :mod:`.wire`: the edge <-> scheduler messages (msgpack, one frame each);
- :mod:`.link`: the scheduler's side (a ZeroMQ ROUTER the edges connect to);
- :mod:`.front`: the edge process (HTTP, the leader it follows, the answers nodes send it).
"""
