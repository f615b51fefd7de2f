"""`bench bounce`'s reading of a worker's log: the rounds it counts are the worker's own."""

from __future__ import annotations

from bench.bounce import joins_in_log
from coordinator.realkafka import log_time

# A Connect worker's log around a bounce: its group client's JoinGroup and its sink
# task's consumer's, both logging "Successfully joined group".
WORKER_LOG = """\
[2026-11-28 09:45:33,468] INFO [Worker clientId=connect-127.0.0.1:35013, groupId=owned-g] \
Rebalance started (org.apache.kafka.connect.runtime.distributed.WorkerCoordinator)
[2026-11-28 09:45:34,648] INFO [Worker clientId=connect-127.0.0.1:35013, groupId=owned-g] \
Successfully joined group with generation Generation{generationId=17, \
memberId='connect-127.0.0.1:35013-f118', protocol='default'} \
(org.apache.kafka.connect.runtime.distributed.WorkerCoordinator)
[2026-11-28 09:45:52,806] INFO [Consumer clientId=connector-consumer-sink-1, \
groupId=connect-sink] Successfully joined group with generation \
Generation{generationId=11, memberId='connector-consumer-sink-1-83cc', protocol='range'} \
(org.apache.kafka.clients.consumer.internals.ConsumerCoordinator)
[2026-11-28 09:45:53,001] INFO [Worker clientId=connect-127.0.0.1:35013, groupId=owned-g] \
Successfully joined group with generation Generation{generationId=18, \
memberId='connect-127.0.0.1:35013-f118', protocol='default'} \
(org.apache.kafka.connect.runtime.distributed.WorkerCoordinator)
"""


def test_only_the_worker_group_clients_joins_count_not_its_sink_tasks_consumers() -> None:
    since = log_time("2026-11-28 09:45:30,000")
    until = log_time("2026-11-28 09:46:00,000")
    assert joins_in_log(WORKER_LOG, since, until) == 2


def test_joins_outside_the_window_do_not_count() -> None:
    since = log_time("2026-11-28 09:45:35,000")
    until = log_time("2026-11-28 09:45:52,900")
    assert joins_in_log(WORKER_LOG, since, until) == 0
