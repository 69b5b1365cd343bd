"""A mirror's collection is written by its mirror alone, through every face a client writes with: `eventing
serve` answers a Data API write into it 403 WriteRefused with one line, and a write through the KV port
no_access (0x24, as Couchbase answers a write without the right to it) with that line as the error's context,
which Couchbase's Python SDK (the real `couchbase` package) raises as its no_access exception; nothing of the
collection changes (its documents and the bucket's sequence numbers), and reads work as usual. Against a
throwaway PostgreSQL server the test starts; every process is ended by its pid."""

from __future__ import annotations

import base64
import http.client
import json
from datetime import timedelta

import pytest

pytest.importorskip("couchbase")  # a test dependency: CI always has it

import couchbase.subdocument as SD  # noqa: E402
from couchbase.auth import PasswordAuthenticator  # noqa: E402
from couchbase.cluster import Cluster  # noqa: E402
from couchbase.exceptions import AuthenticationException  # noqa: E402
from couchbase.options import ClusterOptions, ClusterTimeoutOptions  # noqa: E402

from eventing.kv.protocol import EACCESS  # noqa: E402
from eventing.ops import mirrors  # noqa: E402
from eventing.storage.state import open_state  # noqa: E402
from eventing.testing.commands import Commands, KvClient, data_api_path  # noqa: E402
from eventing.testing.postgres import ThrowawayPostgres, free_port  # noqa: E402
from tests.integration.mirror_support import (  # noqa: E402
    Service,
    collection_docs,
    make_table,
    new_data_dir,
    wait_until_mirrored,
)

pytestmark = pytest.mark.integration

KS = "shop.pg.orders"
USER = ("app", "app-s3cret-pw")
REFUSED = "its documents follow the table and cannot be written here; change the rows in PostgreSQL instead"


def _request(port: int, method: str, path: str, body: dict | None = None) -> tuple[int, str]:
    auth = "Basic " + base64.b64encode(":".join(USER).encode()).decode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(
            method,
            path,
            body=None if body is None else json.dumps(body),
            headers={"Authorization": auth, "Content-Type": "application/json"},
        )
        answer = conn.getresponse()
        return answer.status, answer.read().decode()
    finally:
        conn.close()


def _high_seqnos(data_dir: str) -> list[int]:
    state = open_state(data_dir)
    try:
        with state.open_bucket("shop") as bucket:
            return bucket.high_seqnos()
    finally:
        state.close()


def test_writes_into_a_mirror_through_the_data_api_and_the_kv_port_are_refused_and_change_nothing(tmp_path):
    server = ThrowawayPostgres()
    server.start()
    try:
        url = server.create_database("app")
        make_table(url, rows=5)
        data_dir = new_data_dir(tmp_path / "data", "shop")
        cid = mirrors.create_mirror(data_dir, KS, source=url, table="public.orders")["id"]
        service = Service(data_dir, tmp_path / "service.log")  # its follower takes the snapshot
        service.start()
        try:
            wait_until_mirrored(data_dir, url, "shop", cid)
        finally:
            service.stop()
        before, seqnos = collection_docs(data_dir, "shop", cid), _high_seqnos(data_dir)
        assert sorted(before) == ["1", "2", "3", "4", "5"]
        cmd = Commands(tmp_path, {"EVENTING_DATA_DIR": data_dir})
        cmd.ok("user", "add", USER[0], "--role", "admin", "--password-stdin", input=USER[1] + "\n")
        port, kv_port = free_port(), free_port()
        serve = cmd.start("serve", "--port", str(port), "--kv-port", str(kv_port), name="serve")
        try:
            serve.wait_port(port)
            serve.wait_port(kv_port)
            # The Data API: 403 WriteRefused naming the keyspace, the table and the fix; reads answer.
            for method, key, body in (
                ("PUT", "1", {"x": 1}),
                ("PUT", "new", {"x": 1}),
                ("DELETE", "2", None),
            ):
                status, text = _request(port, method, data_api_path(KS, key), body)
                assert status == 403, (method, key, status, text)
                assert "WriteRefused" in text and f"keyspace '{KS}' mirrors table public.orders" in text, text
                assert REFUSED in text and "\n" not in text.strip(), text
            status, text = _request(port, "GET", data_api_path(KS, "1"))
            assert status == 200 and json.loads(text)["id"] == 1, text
            # The KV port answers a write no_access (0x24), as Couchbase answers a write without the right to
            # it, with the line as the error's context (extended errors agreed).
            kv = KvClient(kv_port, *USER, "shop", collections=True)
            try:
                status, body = kv.set("1", {"x": 1}, collection_id=cid)
            finally:
                kv.close()
            assert status == EACCESS, (status, body)
            context = json.loads(body)["error"]["context"]
            assert f"keyspace '{KS}' mirrors table public.orders" in context and REFUSED in context, context
            # Couchbase's SDK: every write raises the SDK's exception for no_access (its KeyValueErrorContext
            # keeps the status, not the server's context); reads work as usual.
            timeouts = ClusterTimeoutOptions(
                kv_timeout=timedelta(seconds=10), connect_timeout=timedelta(seconds=10)
            )
            cluster = Cluster(
                f"couchbase://127.0.0.1:{kv_port}",
                ClusterOptions(PasswordAuthenticator(*USER), timeout_options=timeouts),
            )
            try:
                cluster.wait_until_ready(timedelta(seconds=20))
                orders = cluster.bucket("shop").scope("pg").collection("orders")
                assert orders.get("3").content_as[dict]["id"] == 3
                writes = {
                    "upsert": lambda: orders.upsert("3", {"x": 1}),
                    "insert": lambda: orders.insert("new", {"x": 1}),
                    "replace": lambda: orders.replace("4", {"x": 1}),
                    "remove": lambda: orders.remove("5"),
                    "mutate_in": lambda: orders.mutate_in("2", [SD.upsert("x", 1)]),
                }
                for what, write in writes.items():
                    with pytest.raises(AuthenticationException) as refused:
                        write()
                    assert "'status_code': 36" in str(refused.value), (what, str(refused.value))
            finally:
                cluster.close()
        finally:
            serve.stop()
        assert collection_docs(data_dir, "shop", cid) == before  # nothing changed
        assert _high_seqnos(data_dir) == seqnos
    finally:
        server.stop()
