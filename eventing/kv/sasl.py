"""SASL for the KV port: PLAIN, and the SCRAM-SHA mechanisms (RFC 5802) Couchbase's SDKs use without TLS.

SCRAM needs, for each user, a salt, an iteration count and two keys derived from the password (StoredKey,
ServerKey); `eventing user add` keeps them beside the scrypt hash in the user's stored hash
(eventing.security.users: `scram_secrets`, `stored_scram_keys`, `derive_keys`). A user whose password was
set before that has none: it signs in over PLAIN (or by HTTP), and over SCRAM once its password is set
again. The tokens (--admin-token, --read-token) sign in with any user name, their keys derived once per
process.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets

from eventing.security.users import ScramKeys

SCRAM_MECHANISMS = {"SCRAM-SHA512": "sha512", "SCRAM-SHA256": "sha256", "SCRAM-SHA1": "sha1"}
MECHANISMS = ("SCRAM-SHA512", "SCRAM-SHA256", "SCRAM-SHA1", "PLAIN")


def parse_plain(data: bytes) -> tuple[str, str] | None:
    """(user, password) of a PLAIN message `[authzid] NUL user NUL password`."""
    parts = data.split(b"\0")
    if len(parts) != 3:
        return None
    try:
        return parts[1].decode("utf-8"), parts[2].decode("utf-8")
    except UnicodeDecodeError:
        return None


def _attributes(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in text.split(","):
        if len(item) < 2 or item[1] != "=":
            raise ValueError(f"malformed SCRAM attribute {item[:20]!r}")
        out.setdefault(item[0], item[2:])
    return out


def _user_name(encoded: str) -> str:
    return encoded.replace("=2C", ",").replace("=3D", "=")


class ScramExchange:
    """One SCRAM exchange, the server's side: `first` answers the client-first message, `final` checks the
    client's proof against each candidate's keys (a user's; or each token's, for a name that is no user)."""

    def __init__(self, mechanism: str):
        self.digest = SCRAM_MECHANISMS[mechanism]
        self.user = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""

    def start(self, client_first: bytes, salt: bytes, iterations: int) -> tuple[str, bytes]:
        """(user name, server-first message) for a client-first message; ValueError if malformed."""
        text = client_first.decode("utf-8")
        gs2, _, rest = text.partition(",")
        authzid, _, bare = rest.partition(",")
        if gs2 not in ("n", "y") or not bare:
            raise ValueError("channel binding is not supported; use the SCRAM mechanisms without -PLUS")
        attrs = _attributes(bare)
        if "n" not in attrs or "r" not in attrs:
            raise ValueError("the client-first message has no user name or nonce")
        self.user = _user_name(attrs["n"])
        self._client_first_bare = bare
        self._nonce = attrs["r"] + secrets.token_hex(12)
        self._server_first = f"r={self._nonce},s={base64.b64encode(salt).decode()},i={iterations}"
        return self.user, self._server_first.encode()

    def final(self, client_final: bytes, candidates: list[ScramKeys]) -> tuple[int, bytes] | None:
        """(index of the candidate whose key made the proof, server-final message), or None."""
        text = client_final.decode("utf-8", "replace")
        without_proof, _, proof_part = text.rpartition(",p=")
        try:
            attrs = _attributes(without_proof)
            proof = base64.b64decode(proof_part, validate=True)
        except (ValueError, binascii.Error):
            return None
        if attrs.get("r") != self._nonce:
            return None
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        for index, keys in enumerate(candidates):
            signature = hmac.new(keys.stored_key, auth_message, self.digest).digest()
            if len(signature) != len(proof):
                continue
            client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
            if hmac.compare_digest(hashlib.new(self.digest, client_key).digest(), keys.stored_key):
                server_signature = hmac.new(keys.server_key, auth_message, self.digest).digest()
                return index, b"v=" + base64.b64encode(server_signature)
        return None

    def unverified_final(self) -> bytes:
        """The server-final message of a server that trusts every local caller (no credentials to check)."""
        return b"v=" + base64.b64encode(hashlib.new(self.digest, self._nonce.encode()).digest())
