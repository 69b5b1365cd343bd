"""The OpenAPI 3.1 description of the API, built from the endpoint table so it cannot drift."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from eventing.http.auth import needs_admin


def openapi_document(endpoints: Sequence[Any]) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for ep in endpoints:
        params = [
            {
                "name": p,
                "in": "path",
                "required": True,
                "schema": {"type": "string"},
                **(
                    {"description": "function name: a letter, then letters, digits, '_' or '-' (max 100)"}
                    if p == "name"
                    else {}
                ),
            }
            for p in re.findall(r"{(\w+)}", ep.path)
        ]
        op: dict[str, Any] = {
            "summary": ep.summary,
            "tags": [ep.group],
            "operationId": f"{ep.method.lower()}_{ep.handler.__name__}_{len(paths)}",
            "parameters": params,
            "responses": {
                str(ep.status): {"description": "success"},
                "400": {"$ref": "#/components/responses/Error"},
                "401": {"$ref": "#/components/responses/Error"},
                "403": {"$ref": "#/components/responses/Error"},
                "404": {"$ref": "#/components/responses/Error"},
                "409": {"$ref": "#/components/responses/Error"},
                "413": {"$ref": "#/components/responses/Error"},
            },
            "security": [{"bearer": []}, {"basic": []}],
            "x-role": "admin" if needs_admin(ep.method) else "read",
        }
        if ep.couchbase:
            op["x-couchbase-shaped"] = True
        paths.setdefault(ep.path, {})[ep.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "eventing REST API",
            "version": "1",
            "description": "Couchbase-Eventing-shaped function management, plus vBuckets, nodes, rebalance, "
            "dead letters, windows and verify. Writes need the admin token, reads the read-only (or admin) "
            "one.",
        },
        "paths": paths,
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "basic": {
                    "type": "http",
                    "scheme": "basic",
                    "description": "any user name; the token as password",
                },
            },
            "responses": {
                "Error": {
                    "description": "an error with the fix",
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "properties": {
                                    "error": {"type": "string"},
                                    "fix": {"type": ["string", "null"]},
                                },
                                "required": ["error"],
                            }
                        }
                    },
                },
            },
        },
    }
