"""Couchbase Eventing's function JSON to this project's definition and back (eventing.core.couchbase_format):
every field's fate (mapped, refused by name, or warned about by name), unknown fields named, and an export
imported again giving the same definition."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from eventing.core.couchbase_format import (
    from_couchbase,
    is_couchbase_function,
    settings_from_couchbase,
    to_couchbase,
)
from eventing.core.definition import FunctionDefinition
from eventing.errors import ConfigError

FIXTURE = Path(__file__).parent / "fixtures" / "couchbase_export.json"


def exported() -> dict:
    return json.loads(FIXTURE.read_text())[0]


def test_a_couchbase_export_becomes_a_javascript_definition():
    got = from_couchbase(exported())
    d = got.definition
    assert (d.name, d.language, d.source_keyspace.to_meta()) == (
        "shop.sales.audit_orders",
        "javascript",  # in the namespace of its function_scope
        {"bucket_name": "shop", "scope_name": "sales", "collection_name": "orders"},
    )
    assert got.source == exported()["appcode"]
    assert [(b.alias, b.bucket, b.scope, b.collection, b.access) for b in d.bindings] == [
        ("customers", "crm", "_default", "_default", "r"),
        ("audit", "shop", "sales", "audit", "rw"),
    ]
    assert list(d.url_bindings) == [
        {"alias": "hook", "url": "https://hooks.example.com/orders", "auth": "bearer", "token": "t0ps3cret"}
    ]
    assert d.constants == {"LIMIT": 500, "REGION": "eu-west"}
    assert (
        d.boundary,
        d.worker_count,
        d.execution_timeout.total_seconds(),
        d.checkpoint_interval.total_seconds(),
        d.timer_context_size,
        d.curl_max_response_bytes,
        d.description,
    ) == ("from_now", 3, 30, 60, 2048, 10 * 1024 * 1024, "Audit trail of orders")
    assert got.state == "paused"  # deployment_status true, processing_status false


def test_every_setting_without_an_equivalent_is_named_and_unknown_fields_too():
    warnings = "\n".join(from_couchbase(exported()).warnings)
    assert "metadata_bucket/scope/collection (eventing._default._default) is not used" in warnings
    assert 'log_level="DEBUG" has no effect here' in warnings
    assert "num_timer_partitions=128 has no effect here" in warnings
    assert "setting future_setting is unknown here" in warnings
    assert "field(s) future_field are unknown here" in warnings
    # at Couchbase's defaults, tunables of machinery this system lacks change nothing and are not noise
    assert "n1ql_consistency" not in warnings and "language_compatibility" not in warnings
    assert (
        "handleruuid" not in warnings and "function_instance_id" not in warnings
    )  # the exporter's identifiers


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda f: f["depcfg"]["curl"][0].update(auth_type="ntlm"),
            "auth_type 'ntlm'; use no-auth, basic, bearer or digest",
        ),
        (
            lambda f: f["settings"].update(dcp_stream_boundary="from_prior"),
            "dcp_stream_boundary .* 'from_prior'",
        ),
        (
            lambda f: f["depcfg"]["constants"].append({"value": "NOW", "literal": "Date.now()"}),
            "constant 'NOW' .* literal 'Date.now\\(\\)'",
        ),
        (lambda f: f.update(appname="9lives"), "function name '9lives' is not valid"),
        (lambda f: f["depcfg"]["buckets"][0].update(alias="$src"), "binding alias '\\$src'"),
        (lambda f: f["settings"].update(execution_timeout=0), "execution_timeout .* in seconds"),
        (lambda f: f.pop("appcode"), "has no 'appcode'"),
    ],
)
def test_what_cannot_be_kept_is_refused_by_name(change, message):
    item = exported()
    change(item)
    with pytest.raises(ConfigError, match=message):
        from_couchbase(item)


def test_statuses_headers_and_couchbase_defaults():
    item = exported()
    item["settings"].update(
        deployment_status=False, handler_headers=["'use strict';"], handler_footers=["// end"]
    )
    del item["depcfg"]["buckets"][1]["access"]  # Couchbase's default access is read-write
    item["depcfg"]["curl"][0] = {
        "hostname": "http://h/x",
        "value": "hook",
        "auth_type": "digest",
        "username": "u",
        "password": "p",
        "validate_ssl_certificate": False,
    }
    got = from_couchbase(item)
    assert got.state == "undeployed"
    assert got.source == "'use strict';\n" + item["appcode"] + "\n// end"
    assert got.definition.bindings[1].access == "rw"
    assert list(got.definition.url_bindings) == [
        {
            "alias": "hook",
            "url": "http://h/x",
            "auth": "digest",
            "username": "u",
            "password": "p",
            "verify_tls": False,
            "allow_cookies": True,
        }
    ]
    assert is_couchbase_function(item) and not is_couchbase_function({"name": "x", "handler_source": ""})


def test_export_then_import_gives_the_same_definition():
    original = from_couchbase(exported())
    definition = original.definition.to_dict()
    out, warnings = to_couchbase(definition, original.source, "paused")
    assert out["settings"]["deployment_status"] is True and out["settings"]["processing_status"] is False
    assert out["depcfg"]["curl"][0]["bearer_key"] == "t0ps3cret"
    assert out["depcfg"]["constants"] == [
        {"value": "LIMIT", "literal": "500"},
        {"value": "REGION", "literal": '"eu-west"'},
    ]
    # the metadata keyspace it was imported with goes back to Couchbase, without a warning
    assert [out["depcfg"][f"metadata_{k}"] for k in ("bucket", "scope", "collection")] == [
        "eventing",
        "_default",
        "_default",
    ]
    assert not any("metadata" in w for w in warnings)
    again = from_couchbase(copy.deepcopy(out))
    assert again.definition.to_dict() == definition
    assert (again.source, again.state) == (original.source, "paused")
    # the mapped settings come back as Couchbase wrote them
    for key in (
        "dcp_stream_boundary",
        "worker_count",
        "execution_timeout",
        "checkpoint_interval",
        "timer_context_size",
        "curl_max_allowed_resp_size",
        "description",
        "deployment_status",
        "processing_status",
    ):
        assert out["settings"][key] == exported()["settings"][key], key
    assert out["depcfg"]["buckets"] == exported()["depcfg"]["buckets"]


def test_export_names_what_couchbase_cannot_carry_and_refuses_python():
    defn = FunctionDefinition.from_dict(
        {
            "name": "f",
            "source_bucket": "b",
            "language": "javascript",
            "retries": 2,
            "execution_timeout": "1500ms",
        }
    )
    out, warnings = to_couchbase(defn.to_dict(), "function OnUpdate(doc, meta) {}")
    text = "\n".join(warnings)
    assert "retries=2 has no field in Couchbase's format" in text
    filtered = FunctionDefinition.from_dict(
        {
            "name": "g",
            "source_bucket": "b",
            "language": "javascript",
            "filter": {"field": "type", "eq": "order"},
            "isolation": "sandbox",
        }
    )
    _, named = to_couchbase(filtered.to_dict(), "function OnUpdate(doc, meta) {}")
    assert any(w.startswith("function 'g': filter=") and "was left out" in w for w in named), named
    assert any(w.startswith("function 'g': isolation=\"sandbox\" has no field") for w in named), named
    assert "execution_timeout=1.5s is rounded up to 2s" in text and out["settings"]["execution_timeout"] == 2
    python = FunctionDefinition.from_dict({"name": "p", "source_bucket": "b"})
    with pytest.raises(
        ConfigError, match="function 'p' has a Python handler; Couchbase runs JavaScript handlers only"
    ):
        to_couchbase(python.to_dict(), "def on_update(doc, meta): pass")


def test_a_settings_body_in_couchbase_words():
    fields, state, warnings = settings_from_couchbase(
        "f",
        {"deployment_status": True, "processing_status": True, "execution_timeout": 5, "lcb_retry_count": 3},
    )
    assert fields == {"execution_timeout": "5s"} and state == "deployed"
    assert warnings == [
        "function 'f': setting lcb_retry_count=3 has no effect here; there is no libcouchbase; "
        "bucket operations are local"
    ]
    assert (
        settings_from_couchbase("f", {"worker_count": 2})[1] is None
    )  # no status flags: no lifecycle change


def test_an_export_never_names_its_source_as_its_metadata_keyspace():
    """Couchbase refuses a function whose metadata keyspace is its source (ERR_SRC_MB_SAME)."""
    for scope, collection, metadata in (
        ("_default", "_default", ["shop", "_default", "eventing"]),
        ("sales", "orders", ["shop", "_default", "_default"]),
    ):
        defn = FunctionDefinition.from_dict(
            {
                "name": "f",
                "source_bucket": "shop",
                "source_scope": scope,
                "source_collection": collection,
                "language": "javascript",
            }
        )
        out, warnings = to_couchbase(defn.to_dict(), "function OnUpdate(doc, meta) {}", "undeployed")
        assert [out["depcfg"][f"metadata_{k}"] for k in ("bucket", "scope", "collection")] == metadata
        assert metadata != ["shop", scope, collection]
        assert any("Couchbase needs a metadata keyspace other than the source" in w for w in warnings)


def test_couchbase_defaults_and_5x_milliseconds_on_import():
    item = {
        "appname": "old",
        "appcode": "function OnUpdate(doc, meta) {}",
        "version": "evt-5.5.0-0000-ee",
        "depcfg": {"source_bucket": "src", "metadata_bucket": "meta"},
        "settings": {"checkpoint_interval": 20000},
    }
    got = from_couchbase(item).definition
    assert got.checkpoint_interval.total_seconds() == 20  # 5.x: milliseconds
    assert got.curl_max_response_bytes == 100 * 1024 * 1024  # never set: Couchbase's default, 100 MB
    newer = from_couchbase({**item, "version": "evt-7.6.0-0000-ee"}).definition
    assert newer.checkpoint_interval.total_seconds() == 20000
