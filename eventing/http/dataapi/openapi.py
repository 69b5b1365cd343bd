"""The OpenAPI description of the Data API this server answers (eventing.http.dataapi), served at
`GET /v1/openapi.json`.

It has the paths, parameters, request bodies, status codes and response schemas of Couchbase's Data API v1
description, in this project's words, for the operations served here: callerIdentity, documents (GET,
POST, PUT, DELETE), append, prepend, increment, decrement and touch. Not described: the alpha paths
(locking, sub-document), which answer 404 here. Two additions say what this server also answers: 401 when
a server with credentials gets none, and 405 (with `Allow`) for a method a path does not take. A JSON
document read back is described as any JSON value: a document stored with the JSON format flag need not be
an object (a JSON array or number written as application/json comes back as such).
"""

from __future__ import annotations

from typing import Any

ERROR_CODES = [
    "InvalidArgument",
    "Unauthorized",
    "NoReadAccess",
    "NoWriteAccess",
    "InvalidAuth",
    "Internal",
    "UnderlyingServiceUnavailable",
    "RequestCanceled",
    "DeadlineExceeded",
    "BucketNotFound",
    "ScopeNotFound",
    "CollectionNotFound",
    "DocumentNotFound",
    "DocumentExists",
    "CasMismatch",
    "DocumentLocked",
    "DocumentNotLocked",
    "ValueTooLarge",
    "DocumentTooDeep",
    "DocumentNotJson",
    "PathMismatch",
    "DocumentNotNumeric",
    "PathNotFound",
    "PathExists",
    "PathInvalid",
    "PathTooBig",
    "UnknownVattr",
    "DurabilityImpossible",
]
DOCUMENT_PATH = (
    "/v1/buckets/{bucketName}/scopes/{scopeName}/collections/{collectionName}/documents/{documentKey}"
)
ERRORS = {  # status -> (component name, description)
    "400": ("BadRequest", "The request is not valid: the message says which part and how to fix it"),
    "401": ("Unauthorized", "No credentials were sent to a server that needs them"),
    "403": ("Forbidden", "The credentials were not accepted, or do not allow this on this keyspace"),
    "404": ("NotFound", "The bucket, scope, collection or document does not exist (the code says which)"),
    "405": ("MethodNotAllowed", "This path does not take that method; the Allow header lists those it takes"),
    "409": ("Conflict", "The document exists already, or its cas is not the one in If-Match"),
    "413": ("ContentTooLarge", "The body is over the 20 MiB document limit"),
    "500": ("InternalServerError", "A fault of the server"),
    "503": ("ServiceUnavailable", "The bucket's file stayed locked by another process"),
    "504": ("GatewayTimeout", "The request took too long"),
}
WRITE_ERRORS = ("400", "401", "403", "404", "409", "500", "503", "504")


def _ref(kind: str, name: str) -> dict[str, str]:
    return {"$ref": f"#/components/{kind}/{name}"}


def _errors(*statuses: str) -> dict[str, Any]:
    return {status: _ref("responses", ERRORS[status][0]) for status in statuses}


def _written(description: str, *, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """A write's 200: the new cas and the mutation token (and a body for the counters)."""
    out: dict[str, Any] = {
        "description": description,
        "headers": {"ETag": _ref("headers", "ETag"), "X-CB-MutationToken": _ref("headers", "MutationToken")},
    }
    if body is not None:
        out["content"] = {"application/json": {"schema": body}}
    return out


def _document_content() -> dict[str, Any]:
    return {
        "application/json": {
            "schema": {
                "description": "The document, as JSON (an object, unless another JSON "
                "value was stored with the JSON format flag)"
            }
        },
        "text/plain": {"schema": {"type": "string", "description": "The document's text"}},
        "application/octet-stream": {
            "schema": {"type": "string", "format": "binary", "description": "The document's bytes"}
        },
        "*/*": {"schema": {"type": "string", "format": "binary", "description": "The document's bytes"}},
    }


def _counter(verb: str) -> dict[str, Any]:
    number = {"type": "integer", "format": "uint64"}
    return {
        "post": {
            "operationId": f"{verb}Document",
            "summary": f"{verb.capitalize()} a counter",
            "description": f"{verb.capitalize()}s the whole number a document holds by `delta` (default 1"
            + ("; a decrement stops at 0" if verb == "decrement" else ", wrapping at 2^64")
            + "), or creates it holding `initial` when it does not exist (without `initial`: 404).",
            "tags": ["Binary Operations"],
            "parameters": [_ref("parameters", "ExpiresHeader"), _ref("parameters", "DurabilityLevelHeader")],
            "requestBody": {
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "properties": {
                                "initial": {
                                    **number,
                                    "description": "The value of a counter this request creates",
                                },
                                "delta": {
                                    **number,
                                    "description": f"How much to {verb} an existing counter by",
                                },
                            },
                        }
                    },
                }
            },
            "responses": {
                "200": _written(
                    f"The counter was {verb}ed (or created)",
                    body={**number, "description": "The counter's value afterwards"},
                ),
                **_errors("400", "401", "403", "404", "500", "503", "504"),
            },
        }
    }


def _extend(where: str) -> dict[str, Any]:
    verb = "append" if where == "end" else "prepend"
    return {
        "post": {
            "operationId": f"{verb}ToDocument",
            "summary": f"{verb.capitalize()} bytes to a document",
            "description": f"Adds the body's bytes at the {where} of the document (under If-Match: of that "
            "version only).",
            "tags": ["Binary Operations"],
            "parameters": [_ref("parameters", "IfMatchHeader"), _ref("parameters", "DurabilityLevelHeader")],
            "requestBody": {"required": True, "content": {"*/*": {"schema": {}}}},
            "responses": {"200": _written(f"The bytes were added at the {where}"), **_errors(*WRITE_ERRORS)},
        }
    }


def _path_parameters() -> list[dict[str, str]]:
    return [
        _ref("parameters", name)
        for name in ("AuthorizationHeader", "BucketName", "ScopeName", "CollectionName", "DocumentKey")
    ]


def dataapi_openapi() -> dict[str, Any]:
    binary_body = {
        "required": True,
        "content": {"*/*": {"schema": {"type": "string", "format": "binary", "description": "The document"}}},
    }
    store_parameters = [
        _ref("parameters", name)
        for name in ("ContentEncodingHeader", "ExpiresHeader", "DocumentFlagsHeader", "DurabilityLevelHeader")
    ]
    document: dict[str, Any] = {
        "parameters": _path_parameters(),
        "get": {
            "operationId": "getDocument",
            "summary": "Read a document",
            "description": "The document's body, with its cas (ETag), flags and expiry; `project` keeps only "
            "the named fields (dotted paths) of a JSON object.",
            "tags": ["Basic Document Operations"],
            "parameters": [
                _ref("parameters", "AcceptEncodingHeader"),
                {
                    "in": "query",
                    "name": "project",
                    "required": False,
                    "style": "form",
                    "explode": False,
                    "description": "Fields of a JSON document to return, others left out",
                    "schema": {"type": "array", "items": {"type": "string"}},
                },
            ],
            "responses": {
                "200": {
                    "description": "The document",
                    "headers": {
                        "Content-Encoding": _ref("headers", "ContentEncoding"),
                        "ETag": _ref("headers", "ETag"),
                        "Expires": _ref("headers", "Expires"),
                        "X-CB-Flags": _ref("headers", "DocumentFlags"),
                    },
                    "content": _document_content(),
                },
                **_errors("400", "401", "403", "404", "500", "503", "504"),
            },
        },
        "post": {
            "operationId": "createDocument",
            "summary": "Create a document",
            "description": "Stores the body under a key that has no document (409 DocumentExists otherwise).",
            "tags": ["Basic Document Operations"],
            "parameters": store_parameters,
            "requestBody": binary_body,
            "responses": {"200": _written("The document was created"), **_errors(*WRITE_ERRORS, "413")},
        },
        "put": {
            "operationId": "updateDocument",
            "summary": "Store a document",
            "description": "Stores the body: an upsert, or with If-Match a replace of that version only "
            "(`*`: of whatever version exists).",
            "tags": ["Basic Document Operations"],
            "parameters": [_ref("parameters", "IfMatchHeader"), *store_parameters],
            "requestBody": binary_body,
            "responses": {"200": _written("The document was stored"), **_errors(*WRITE_ERRORS, "413")},
        },
        "delete": {
            "operationId": "deleteDocument",
            "summary": "Delete a document",
            "description": "Removes the document (under If-Match: that version only); ETag is the cas of the "
            "delete.",
            "tags": ["Basic Document Operations"],
            "parameters": [_ref("parameters", "IfMatchHeader"), _ref("parameters", "DurabilityLevelHeader")],
            "responses": {"200": _written("The document was deleted"), **_errors(*WRITE_ERRORS)},
        },
    }
    touch: dict[str, Any] = {
        "parameters": _path_parameters(),
        "post": {
            "operationId": "touchDocument",
            "summary": "Change a document's expiry",
            "description": "Sets the document's expiry (an ISO 8601 or HTTP date, a duration such as 90s, or "
            "0 for none), returning the document when `returnContent` is true.",
            "tags": ["Basic Document Operations"],
            "parameters": [_ref("parameters", "AcceptEncodingHeader")],
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "properties": {
                                "expiry": {"type": "string", "description": "The new expiry"},
                                "returnContent": {
                                    "type": "boolean",
                                    "description": "Answer 200 with the document, not 204",
                                },
                            },
                        }
                    }
                },
            },
            "responses": {
                "200": {
                    "description": "The expiry was changed; the document follows",
                    "headers": {
                        "Content-Encoding": _ref("headers", "ContentEncoding"),
                        "ETag": _ref("headers", "ETag"),
                        "X-CB-Flags": _ref("headers", "DocumentFlags"),
                    },
                    "content": _document_content(),
                },
                "204": {
                    "description": "The expiry was changed",
                    "headers": {"ETag": _ref("headers", "ETag")},
                },
                **_errors("400", "401", "403", "404", "500", "503", "504"),
            },
        },
    }
    paths: dict[str, Any] = {
        "/v1/callerIdentity": {
            "parameters": [_ref("parameters", "AuthorizationHeader")],
            "get": {
                "operationId": "getCallerIdentity",
                "summary": "Who is calling",
                "description": "The user the request's credentials name.",
                "tags": ["Health Check"],
                "responses": {
                    "200": {
                        "description": "The caller",
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "properties": {
                                        "user": {"type": "string", "description": "The user name"}
                                    },
                                }
                            }
                        },
                    },
                    **_errors("401", "403", "500"),
                },
            },
        },
        DOCUMENT_PATH: document,
        f"{DOCUMENT_PATH}/append": {"parameters": _path_parameters(), **_extend("end")},
        f"{DOCUMENT_PATH}/prepend": {"parameters": _path_parameters(), **_extend("start")},
        f"{DOCUMENT_PATH}/increment": {"parameters": _path_parameters(), **_counter("increment")},
        f"{DOCUMENT_PATH}/decrement": {"parameters": _path_parameters(), **_counter("decrement")},
        f"{DOCUMENT_PATH}/touch": touch,
    }
    error_schema = {
        "type": "object",
        "description": "What went wrong",
        "properties": {
            "code": _ref("schemas", "ErrorCode"),
            "message": {"type": "string", "description": "What happened, and how to fix it"},
            "resource": {
                "type": "string",
                "description": "The bucket, scope, collection or document concerned",
            },
            "requestId": {"type": "string", "description": "The request's id"},
            "debug": {"type": "string", "description": "More detail"},
        },
        "required": ["code", "message"],
    }
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "eventing Data API",
            "version": "1.0.0",
            "description": "Couchbase's Data API v1 over this project's buckets: documents read and written "
            "over HTTP, every write a mutation that deployed functions handle. See docs/data-api.md.",
        },
        "tags": [
            {"name": "Health Check"},
            {"name": "Basic Document Operations"},
            {"name": "Binary Operations"},
        ],
        "security": [{"BasicAuth": []}, {"BearerAuth": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {
                "BasicAuth": {"type": "http", "scheme": "basic"},
                "BearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "the server's admin or read token",
                },
            },
            "responses": {
                name: {
                    "description": description,
                    "content": {"application/json": {"schema": _ref("schemas", "Error")}},
                    **(
                        {
                            "headers": {
                                "Allow": {
                                    "description": "The methods this path takes",
                                    "schema": {"type": "string"},
                                }
                            }
                        }
                        if status == "405"
                        else {}
                    ),
                }
                for status, (name, description) in ERRORS.items()
            },
            "schemas": {
                "ErrorCode": {"type": "string", "description": "Which error", "enum": ERROR_CODES},
                "Error": error_schema,
                "DocumentEncoding": {
                    "type": "string",
                    "description": "A document's compression",
                    "enum": ["identity", "snappy"],
                },
                "DurabilityLevel": {
                    "type": "string",
                    "description": "How many copies a write must reach first",
                    "enum": ["None", "Majority", "MajorityAndPersistOnMaster", "PersistToMajority"],
                },
            },
            "parameters": {
                "AuthorizationHeader": {
                    "in": "header",
                    "name": "Authorization",
                    "description": "The credentials",
                    "schema": {"type": "string"},
                },
                "AcceptEncodingHeader": {
                    "in": "header",
                    "name": "Accept-Encoding",
                    "description": "Compressions the client takes",
                    "schema": {"type": "string"},
                },
                "ContentEncodingHeader": {
                    "in": "header",
                    "name": "Content-Encoding",
                    "description": "The body's compression (identity only here)",
                    "schema": _ref("schemas", "DocumentEncoding"),
                },
                "IfMatchHeader": {
                    "in": "header",
                    "name": "If-Match",
                    "description": "The ETag (cas) of the version to change, or *",
                    "schema": {"type": "string"},
                },
                "ExpiresHeader": {
                    "in": "header",
                    "name": "Expires",
                    "description": "When the document expires: an HTTP date, a duration such as 90s, or 0",
                    "schema": {"type": "string"},
                },
                "DocumentFlagsHeader": {
                    "in": "header",
                    "name": "X-CB-Flags",
                    "description": "The document's flags, instead of those of its Content-Type",
                    "schema": {"type": "integer", "format": "uint32"},
                },
                "DurabilityLevelHeader": {
                    "in": "header",
                    "name": "X-CB-DurabilityLevel",
                    "description": "Durability wanted (checked; one copy is always committed)",
                    "schema": _ref("schemas", "DurabilityLevel"),
                },
                **{
                    name: {
                        "in": "path",
                        "name": param,
                        "required": True,
                        "description": description,
                        "schema": {"type": "string"},
                    }
                    for name, param, description in (
                        ("BucketName", "bucketName", "The bucket"),
                        ("ScopeName", "scopeName", "The scope in the bucket"),
                        ("CollectionName", "collectionName", "The collection in the scope"),
                        ("DocumentKey", "documentKey", "The document's key (1 to 250 bytes)"),
                    )
                },
            },
            "headers": {
                "ContentEncoding": {
                    "description": "The body's compression",
                    "schema": _ref("schemas", "DocumentEncoding"),
                },
                "ETag": {"description": "The document's cas, in hex", "schema": {"type": "string"}},
                "Expires": {
                    "description": "When the document expires, as an HTTP date",
                    "schema": {"type": "string"},
                },
                "DocumentFlags": {
                    "description": "The document's flags",
                    "schema": {"type": "integer", "format": "uint32"},
                },
                "MutationToken": {
                    "description": "Where the write was logged: BUCKET:VBUCKET:VBUUID:SEQNO",
                    "schema": {"type": "string"},
                },
            },
        },
    }
