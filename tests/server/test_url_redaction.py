"""A worker URL's credentials are never shown: not in the log, not in a describe answer
(KRPC or the admin API), for a connect member and a classic one, against a real `serve`."""

from __future__ import annotations

from pathlib import Path

from coordinator.connect_protocol import WorkerMetadata, encode_worker_metadata
from protocol.messages import ConnectGroupDescribeRequest, ConnectGroupHeartbeatRequest
from tests.integration.helpers import ServerProcess
from tests.server.test_classic_tcp import join

SECRET = "hunter2-secret"


async def test_worker_url_credentials_are_redacted_in_logs_and_describe(
        tmp_path: Path) -> None:
    process = ServerProcess(tmp_path / "data", tmp_path, [])
    await process.start()
    try:
        async with await process.client() as client:
            joined = await client.request(1000, ConnectGroupHeartbeatRequest(
                group_id="g", member_id="m1", member_epoch=0,
                worker_url=f"http://admin:{SECRET}@w1:8083", rebalance_timeout_ms=30_000))
            assert joined.error_code == 0
            metadata = encode_worker_metadata(
                WorkerMetadata(2, f"https://{SECRET}@w2:8443/", 0))
            answer = await join(client, group="c", protocols=(("sessioned", metadata),))
            assert answer.error_code in (0, 79)  # joined, or asked to join again with its id
            if answer.error_code == 79:
                answer = await join(client, answer.member_id, group="c",
                                    protocols=(("sessioned", metadata),))
            described = await client.request(1003, ConnectGroupDescribeRequest(
                group_ids=("g", "c")), api_version=1)
        urls = {group.group_id: [m.worker_url for m in group.members]
                for group in described.groups}
        assert urls["g"] == ["http://admin:***@w1:8083"]
        assert urls["c"] == ["https://***@w2:8443/"]
        view = await process.group("g")
        assert [m["worker_url"] for m in view["members"]] == ["http://admin:***@w1:8083"]
        view = await process.group("c")
        assert [m["worker_url"] for m in view["members"]] == ["https://***@w2:8443/"]
        assert any(e.get("event") == "member_joined" for e in process.events())
        assert SECRET not in process.output()
    finally:
        process.kill()
