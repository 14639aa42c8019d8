"""High availability of the scheduler: one active scheduler among several, chosen by a lease.

- :mod:`hermes.gateway.ha.base`: what an election store offers (acquire with a new epoch,
  renew, release, the leader record, the node names the leader serves), as a protocol;
- :mod:`hermes.gateway.ha.store` (Redis) and :mod:`hermes.gateway.ha.etcd_store` (etcd): the
  two stores; :mod:`hermes.gateway.ha.backends` picks one by the URL's scheme;
- :mod:`hermes.gateway.ha.election`: the driver of :mod:`hermes.core.lease` (the decisions)
  on a thread of its own, so that a busy event loop does not starve the renewals;
- :mod:`hermes.gateway.ha.role`: what a gateway process does with it: stay a standby (HTTP
  answers 503, ``/readyz`` too), become the active scheduler when elected (start the node
  socket, restore the durable runs, adopt the nodes' work), and stop at once when the lease is
  lost (fail-stop: a supervisor restarts it as a standby).
"""
