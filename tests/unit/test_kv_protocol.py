"""The KV port's pieces on their own: SCRAM-SHA against a client written from RFC 5802, the keys kept with a
user's password, sub-document paths and operations, collection ids as LEB128, memcached's expiry rule."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from eventing.kv import protocol as p
from eventing.kv import sasl
from eventing.kv import subdoc as sd
from eventing.security.users import hash_password, stored_scram_keys, verify_password


def client_final(
    password: str, digest: str, client_first_bare: str, server_first: str
) -> tuple[bytes, bytes]:
    """A SCRAM client's final message and the server signature it expects (RFC 5802, section 3)."""
    attrs = dict(item.split("=", 1) for item in server_first.split(","))
    salted = hashlib.pbkdf2_hmac(digest, password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"]))
    client_key = hmac.new(salted, b"Client Key", digest).digest()
    without_proof = f"c=biws,r={attrs['r']}"
    auth = f"{client_first_bare},{server_first},{without_proof}".encode()
    signature = hmac.new(hashlib.new(digest, client_key).digest(), auth, digest).digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    server_key = hmac.new(salted, b"Server Key", digest).digest()
    expected = b"v=" + base64.b64encode(hmac.new(server_key, auth, digest).digest())
    return f"{without_proof},p={base64.b64encode(proof).decode()}".encode(), expected


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA512", "SCRAM-SHA256", "SCRAM-SHA1"])
def test_scram_accepts_the_password_kept_with_the_user_and_refuses_another(mechanism):
    stored = hash_password("s3cret-pass")
    assert verify_password("s3cret-pass", stored) and not verify_password("other-pass", stored)
    digest = sasl.SCRAM_MECHANISMS[mechanism]
    keys = stored_scram_keys(stored, digest)
    assert keys is not None
    for password, accepted in (("s3cret-pass", True), ("other-pass", False)):
        exchange = sasl.ScramExchange(mechanism)
        user, server_first = exchange.start(b"n,,n=app,r=abc123", keys.salt, keys.iterations)
        assert user == "app"
        final, expected = client_final(password, digest, "n=app,r=abc123", server_first.decode())
        found = exchange.final(final, [keys])
        assert (found is not None) is accepted
        if accepted:
            assert found == (0, expected)


def test_a_password_hash_from_before_scram_keys_still_verifies_and_has_none():
    old = hash_password("s3cret-pass").split(";")[0]
    assert verify_password("s3cret-pass", old)
    assert stored_scram_keys(old, "sha512") is None


def test_plain_messages():
    assert sasl.parse_plain(b"\0app\0pw") == ("app", "pw")
    assert sasl.parse_plain(b"app:pw") is None


def test_subdoc_paths_and_operations():
    assert sd.parse_path("a.b[2].c") == ["a", "b", 2, "c"]
    assert sd.parse_path("`a.b`.c[-1]") == ["a.b", "c", -1]
    with pytest.raises(sd.SubdocError) as bad:
        sd.parse_path("a..b")
    assert bad.value.status == p.SUBDOC_PATH_EINVAL
    doc = {"tags": ["x"], "n": 1}
    sd.mutate(doc, sd.ARRAY_PUSH_FIRST, ["tags"], 0, b'"w"')
    sd.mutate(doc, sd.ARRAY_INSERT, ["tags", 1], 0, b'"y"')
    assert sd.mutate(doc, sd.COUNTER, ["n"], 0, b"-3") == -2
    sd.mutate(doc, sd.DICT_UPSERT, ["deep", "er"], sd.PATH_MKDIR_P, b"true")
    assert doc == {"tags": ["w", "y", "x"], "n": -2, "deep": {"er": True}}
    for opcode, path, raw, status in (
        (sd.DICT_ADD, ["n"], b"1", p.SUBDOC_PATH_EEXISTS),
        (sd.REPLACE, ["zz"], b"1", p.SUBDOC_PATH_ENOENT),
        (sd.ARRAY_ADD_UNIQUE, ["tags"], b'"x"', p.SUBDOC_PATH_EEXISTS),
        (sd.ARRAY_PUSH_LAST, ["n"], b"1", p.SUBDOC_PATH_MISMATCH),
        (sd.DICT_UPSERT, ["a", "b"], b"1", p.SUBDOC_PATH_ENOENT),
    ):
        with pytest.raises(sd.SubdocError) as failed:
            sd.mutate(doc, opcode, path, 0, raw)
        assert failed.value.status == status, (opcode, path)


def test_collection_ids_and_expiries():
    assert p.split_collection(b"\x08key", True) == (8, b"key")
    assert p.split_collection(b"\x80\x01key", True) == (128, b"key")
    assert p.split_collection(b"key", False) == (0, b"key")
    assert p.absolute_expiry(0, 1000.0) == 0
    assert p.absolute_expiry(60, 1000.0) == 1060
    assert p.absolute_expiry(2_000_000_000, 1000.0) == 2_000_000_000


@pytest.mark.parametrize("frames", [b"\x0f", b"\xf0", b"\x13ab"])
def test_malformed_flexible_frames_are_a_protocol_error_not_a_crash(frames):
    from eventing.kv import protocol as p

    with pytest.raises(p.ProtocolError):
        p.parse_frames(frames)
