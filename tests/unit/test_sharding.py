"""Keys to vBuckets and the first-deployment plans for nodes and workers (docs/architecture.md, 'Rooms and
layers')."""

from __future__ import annotations

import zlib

import pytest

from sharding import (
    NUM_VBUCKETS,
    InvalidKeyError,
    VBucketPlan,
    format_ranges,
    split_even,
    validate_key,
    vbucket_of,
    vbucket_spans,
    worker_plan,
)


def test_hello_maps_to_vbucket_528_of_1024() -> None:
    assert vbucket_of("hello") == 528
    assert vbucket_of(b"hello") == 528
    assert vbucket_of("hello", NUM_VBUCKETS) == 528


@pytest.mark.parametrize(
    ("key", "vb"),
    [
        ("hello", 0),
        ("doctor", 0),
        ("name", 3),
        ("continue", 3),
        ("yesterday", 0),
        ("tomorrow", 1),
        ("another key", 2),
    ],
)
def test_vbucket_vectors_with_four_vbuckets_match_couchbase_clients(key: str, vb: int) -> None:
    assert vbucket_of(key, 4) == vb


def test_vbucket_is_the_crc32_high_bits_not_python_hash() -> None:
    for key in ["a", "user::42", "ключ", "🙂" * 10]:
        expected = ((zlib.crc32(key.encode("utf-8")) >> 16) & 0x7FFF) % 1024
        assert vbucket_of(key) == expected
        assert vbucket_of(key) == vbucket_of(key.encode("utf-8"))


def test_empty_key_is_refused_with_a_clear_message() -> None:
    with pytest.raises(InvalidKeyError, match="empty"):
        validate_key("")
    with pytest.raises(InvalidKeyError, match="empty"):
        validate_key(b"")


def test_key_of_250_bytes_is_accepted() -> None:
    assert validate_key("k" * 250) == b"k" * 250
    # 125 two-byte characters are 250 bytes: the limit is on bytes, not characters.
    assert len(validate_key("é" * 125)) == 250


def test_key_of_251_bytes_is_refused_naming_the_limit() -> None:
    with pytest.raises(InvalidKeyError, match="251 bytes.*limit is 250"):
        validate_key("k" * 251)
    with pytest.raises(InvalidKeyError, match="limit is 250"):
        validate_key("é" * 125 + "k")


def test_non_utf8_key_bytes_are_refused() -> None:
    with pytest.raises(InvalidKeyError, match="UTF-8"):
        validate_key(b"\xff\xfekey")


def test_key_that_is_not_text_is_refused() -> None:
    with pytest.raises(InvalidKeyError, match="int"):
        validate_key(42)  # type: ignore[arg-type]


def test_invalid_key_error_is_a_value_error() -> None:
    assert issubclass(InvalidKeyError, ValueError)


def test_three_nodes_get_342_341_341_contiguous_vbuckets() -> None:
    plan = VBucketPlan.initial(["n1", "n2", "n3"])
    assert plan.counts() == {"n1": 342, "n2": 341, "n3": 341}
    assert format_ranges(plan.vbuckets_of("n1")) == "0-341"
    assert format_ranges(plan.vbuckets_of("n2")) == "342-682"
    assert format_ranges(plan.vbuckets_of("n3")) == "683-1023"
    assert len(plan.owners) == NUM_VBUCKETS


def test_one_node_owns_every_vbucket() -> None:
    plan = VBucketPlan.initial(["n1"])
    assert plan.counts() == {"n1": 1024}
    assert plan.nodes() == ["n1"]


def test_four_workers_on_one_node_get_256_each() -> None:
    workers = worker_plan(range(NUM_VBUCKETS), 4)
    assert [len(w) for w in workers] == [256, 256, 256, 256]
    assert [format_ranges(w) for w in workers] == ["0-255", "256-511", "512-767", "768-1023"]


def test_three_workers_get_342_341_341_with_extras_first() -> None:
    workers = worker_plan(range(NUM_VBUCKETS), 3)
    assert [len(w) for w in workers] == [342, 341, 341]
    assert [format_ranges(w) for w in workers] == ["0-341", "342-682", "683-1023"]


def test_worker_plan_splits_the_sorted_vbuckets_of_a_node() -> None:
    assert worker_plan([9, 1, 5, 3, 7], 2) == [[1, 3, 5], [7, 9]]


def test_split_even_refuses_zero_parts() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        split_even([1, 2, 3], 0)


def test_format_ranges_collapses_runs() -> None:
    assert format_ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert format_ranges([]) == "-"
    assert vbucket_spans([8, 0, 1, 2, 5, 7]) == ((0, 2), (5, 5), (7, 8)) and vbucket_spans([]) == ()
