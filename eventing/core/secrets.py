"""Secrets of a function definition: the password and token of its URL bindings.

Every place a definition leaves the metadata store (REST answers, `eventing export`, the console) shows
them as Couchbase does, `*****`, unless an admin asks for them explicitly. A definition saved back with
the mask (export, edit, import) keeps the stored secret of the URL binding with the same alias, so the
round trip loses nothing; a mask with no stored secret behind it is refused rather than stored as the
password.
"""

from __future__ import annotations

from typing import Any

from eventing.errors import ConfigError

MASK = "*****"
SECRET_FIELDS = ("password", "token")  # of a URL binding (basic: username + password; bearer: token)


def mask_definition(definition: dict[str, Any]) -> dict[str, Any]:
    """A copy of a definition (as stored, or as exported with its handler) with every non-empty URL
    binding secret replaced by MASK; the stored definition itself is not changed."""
    bindings = definition.get("url_bindings")
    if not bindings:
        return dict(definition)
    return {**definition, "url_bindings": [_mask_binding(b) for b in bindings]}


def _mask_binding(binding: Any) -> Any:
    if not isinstance(binding, dict):
        return binding
    return {k: (MASK if k in SECRET_FIELDS and v not in (None, "") else v) for k, v in binding.items()}


def restore_secrets(definition: dict[str, Any], stored: dict[str, Any] | None) -> dict[str, Any]:
    """`definition` with each secret equal to MASK replaced by the stored secret of the URL binding with
    the same alias. ConfigError, naming the binding and the fix, when there is no stored secret to keep."""
    bindings = definition.get("url_bindings") or ()
    if not any(isinstance(b, dict) and MASK in (b.get(f) for f in SECRET_FIELDS) for b in bindings):
        return definition
    kept = {b.get("alias"): b for b in (stored or {}).get("url_bindings") or () if isinstance(b, dict)}
    name = definition.get("name", "?")
    restored = []
    for binding in bindings:
        binding = dict(binding)
        for key in SECRET_FIELDS:
            if binding.get(key) != MASK:
                continue
            secret = kept.get(binding.get("alias"), {}).get(key)
            if not secret:
                raise ConfigError(
                    f"url binding '{binding.get('alias')}' of function '{name}' has {key} {MASK!r}, the mask an "
                    f"export writes, and no stored {key} to keep; put the real {key} in the definition "
                    "(or export it with --with-secrets)"
                )
            binding[key] = secret
        restored.append(binding)
    return {**definition, "url_bindings": restored}
