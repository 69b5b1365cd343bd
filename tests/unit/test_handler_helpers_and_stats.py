"""crc64 / base64 helpers as Couchbase provides them, and Couchbase's statistic names in `stats --json`."""

from __future__ import annotations

import json

import pytest

from eventing.cli.app import main
from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.handler import base64_decode, base64_encode, crc64, crc_64_go_iso
from eventing.storage.bucket import LocalBucket
from eventing.testing import deploy_function
from eventing.workers.executor import InProcessExecutor


def test_crc64_is_the_go_iso_crc_of_the_json_text():
    assert crc_64_go_iso("123456789") == "b90956c775a41001"  # the CRC-64/GO-ISO check value
    assert crc64("123456789") == crc_64_go_iso('"123456789"')  # crc64 keeps a string's quotes
    assert crc64({"a": 1}) == crc_64_go_iso('{"a":1}')
    with pytest.raises(ValueError, match="not JSON"):
        crc64({1, 2})


def test_base64_round_trips_text_and_json_values():
    assert base64_encode("héllo") == "aMOpbGxv" and base64_decode("aMOpbGxv") == "héllo"
    assert base64_decode(base64_encode({"a": [1, 2]})) == '{"a":[1,2]}'
    with pytest.raises(ValueError, match="is not base64"):
        base64_decode("not base64!")


HANDLER = """
import time

def on_update(doc, meta):
    dst[meta.id] = {"crc": crc64(doc), "b64": base64_encode(meta.id)}
    create_timer(fire, time.time(), meta.id, {"id": meta.id})
    if doc.get("bad"):
        raise ValueError("bad document")

def on_delete(meta, options):
    pass

def fire(context):
    dst["t|" + context["id"]] = {}
"""


def test_stats_json_reports_couchbase_statistic_names(data_dir, capsys):
    source = LocalBucket.create(data_dir, "src")
    d = FunctionDefinition.from_dict(
        {
            "name": "fn_s",
            "source_bucket": "src",
            "bindings": [{"alias": "dst", "bucket": "dst", "access": "rw"}],
        }
    )
    deploy_function(data_dir, d, HANDLER)
    for i in range(5):
        source.upsert(f"k{i}", {"n": i})
    source.upsert("x", {"bad": True})
    source.delete("k0")
    EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    assert LocalBucket.open(data_dir, "dst").get("k1")["crc"] == crc64({"n": 1})
    assert main(["stats", "fn_s", "--json", "--data-dir", data_dir]) == 0
    stats = json.loads(capsys.readouterr().out)
    cb = stats["couchbase"]
    assert (cb["on_update_success"], cb["on_update_failure"], cb["on_delete_success"]) == (5, 1, 1)
    assert (cb["dcp_mutation"], cb["dcp_deletion"], cb["timeout_count"]) == (6, 1, 0)
    assert cb["timer_create_counter"] == 5  # the failed call's timer was discarded with its writes
    assert stats["timers"]["created"] == 5 and stats["timers"]["pending"] + stats["timers"]["fired"] == 5
