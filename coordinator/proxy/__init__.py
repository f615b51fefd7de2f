"""Proxy mode: the coordinator in front of a real Kafka cluster.

A Connect worker uses one `bootstrap.servers` for its group membership and for its
internal topics, so the coordinator can own a real worker's group only by standing in
front of the whole cluster. In proxy mode (`serve --upstream HOST:PORT[,...]`):

- the Kafka listener is a bootstrap address of the upstream cluster, and each upstream
  broker (node id N) gets a local listener of its own, on listen port + 1 + N when that
  port is free (else any free port; the mapping is logged and served at `GET /proxy`);
- every broker address a client could learn (Metadata, DescribeCluster, FindCoordinator)
  is rewritten to the matching local port on the way back, and ApiVersions is capped so
  that no response carries other addresses (Produce <= 9 and Fetch <= 15 have no node
  endpoints; APIs this proxy cannot read are left out of ApiVersions);
- the groups matching `proxy.groups` are this coordinator's: FindCoordinator answers the
  coordinator itself (node id `proxy.coordinator.node.id`) and their group APIs are
  answered locally; every other request is forwarded;
- responses go back in request order on each connection, local or forwarded.

Forwarded traffic is relayed as bytes: a request is only peeked at (API key, version,
correlation id; the `acks` of a Produce, whose acks=0 form has no response; the group ids
of group APIs) and goes upstream as a view of the bytes the client sent, and a response is
passed on as it arrives (the rest of a large one from socket to socket inside the kernel,
where there is `os.splice`) unless it is one of the few that carry addresses, which are
decoded, rewritten and encoded again. So a heavy Fetch stream costs the event loop a few
system calls per chunk, not a decode per record batch nor a copy of its bytes.

`wire` is the sans-IO part (classification, rewriting, ApiVersions); `server` the trio
listeners and connections.
"""
