"""Secrets of a function definition: the password and token of its URL bindings.

Every place a definition leaves the metadata store (REST answers, `eventing export`, the console) shows
them as Couchbase does, `*****`, unless an admin asks for them explicitly. A definition saved back with
the mask (export, edit, import) keeps the stored secret of the URL binding with the same alias, so the
round trip loses nothing; a mask with no stored secret behind it is refused rather than stored as the
password, and so is a non-admin's mask on a binding whose url, auth or verify_tls changed (the stored
secret would go to the new address).
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


# What a kept secret is kept for: a non-admin's edit that changes one of these drops it (see restore_secrets).
BOUND_FIELDS = ("url", "auth", "verify_tls")


def restore_secrets(
    definition: dict[str, Any], stored: dict[str, Any] | None, *, trusted: bool = True
) -> dict[str, Any]:
    """`definition` with each secret equal to MASK replaced by the stored secret of the URL binding with
    the same alias. ConfigError, naming the binding and the fix, when there is no stored secret to keep.

    A secret belongs to where it is sent: when the saver is not `trusted` (an admin or the local CLI), a
    secret is kept only while the binding's url, auth and verify_tls are the stored ones; a binding pointed
    elsewhere with the mask is refused, so the stored password or token never goes to a new address."""
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
            before = kept.get(binding.get("alias"), {})
            secret = before.get(key)
            if not secret:
                raise ConfigError(
                    f"url binding '{binding.get('alias')}' of function '{name}' has {key} {MASK!r}, the mask "
                    f"an export writes, and no stored {key} to keep; put the real {key} in the definition "
                    "(or export it with --with-secrets)"
                )
            changed = [f for f in BOUND_FIELDS if _field(binding, f) != _field(before, f)]
            if changed and not trusted:
                raise ConfigError(
                    f"url binding '{binding.get('alias')}' of function '{name}' changes its "
                    f"{' and '.join(changed)} and keeps the stored {key} ({MASK!r}); a stored secret is kept "
                    f"only for the address it was given for; put the {key} for the new {changed[0]} in the "
                    "definition (or ask an admin to save it)"
                )
            binding[key] = secret
        restored.append(binding)
    return {**definition, "url_bindings": restored}


def _field(binding: dict[str, Any], name: str) -> Any:
    """A URL binding's field with its default (a binding written without `auth` has auth none)."""
    return binding.get(name, {"auth": "none", "verify_tls": True}.get(name))
