"""The OpenAPI 3.1 document, built from the API's route table and its models.

Paths, methods, parameters and responses come from `controller.api.app.ROUTES`
(the same table that builds the router). Every schema is pydantic's JSON schema of a
model the routes name (controller/api/schemas.py; a bag's spec is bagspec.BagSpec,
a Slurm hook's event callbacks.SlurmEvent): request schemas are exactly what the
validators accept, response schemas what the handlers answer. Integer query
parameters carry the bounds the handlers enforce (the same `Param` objects), and
every status a route can answer is listed, so a schema-driven fuzzer (`make fuzz`)
can hold the server to it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from controller.api.base import ERR, Route

_REF = "#/components/schemas/{model}"


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def _untitled(schema: Any) -> Any:
    """pydantic's schema without the titles it makes up from names ("Job Count")."""
    if isinstance(schema, dict):
        return {
            key: _untitled(value)
            for key, value in schema.items()
            if not (key == "title" and isinstance(value, str))
        }
    if isinstance(schema, list):
        return [_untitled(item) for item in schema]
    return schema


@functools.cache
def _schemas(models: tuple[type[BaseModel], ...]) -> dict[str, Any]:
    """The component schemas of `models` and of every model they contain."""
    _, document = models_json_schema([(m, "validation") for m in models], ref_template=_REF)
    defs = document.get("$defs", {})
    names = {m.__name__ for m in models}
    assert names <= set(defs), f"model names must be unique: {sorted(names - set(defs))}"
    return _untitled(defs)


def _models(routes: Sequence[Route]) -> tuple[type[BaseModel], ...]:
    found: dict[type[BaseModel], None] = {ERR: None}
    for route in routes:
        if route.body is not None:
            found[route.body] = None
        for _, model in route.responses.values():
            if model is not None:
                found[model] = None
    return tuple(found)


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": _ref(ERR)}},
    }


def build_openapi(routes: Sequence[Route]) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        operation: dict[str, Any] = {
            "summary": route.summary,
            "operationId": route.handler.__name__,
            "parameters": [
                {
                    "name": p.name,
                    "in": p.where,
                    "required": p.required or p.where == "path",
                    "description": p.description,
                    "schema": p.schema,
                }
                for p in route.params
            ],
            "responses": {
                str(status): {"description": text}
                | ({"content": {"application/json": {"schema": _ref(model)}}} if model else {})
                for status, (text, model) in route.responses.items()
            },
        }
        responses = operation["responses"]
        if any(p.where == "query" for p in route.params):
            responses.setdefault("400", _error("A query parameter is malformed (invalid_query)."))
        if route.auth:
            operation["security"] = [{"bearer": []}]
            responses.setdefault("401", _error("Missing or wrong bearer token."))
        if route.admin_only:
            responses.setdefault(
                "403", _error("Needs the admin token; an account token may not do this.")
            )
        elif route.auth and any(p.name == "account" for p in route.params):
            responses.setdefault("403", _error("An account token may not use another account."))
        if route.body:
            operation["requestBody"] = {
                "required": route.body_required,
                "content": {"application/json": {"schema": _ref(route.body)}},
            }
            responses.setdefault("400", _error("The body is malformed; the message names why."))
            responses.setdefault("413", _error("The request body is too large."))
        paths.setdefault(route.path, {})[route.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "spotbag",
            "version": "1",
            "description": "Bags of jobs on preemptible (spot) VMs.",
        },
        "paths": paths,
        "components": {
            "schemas": _schemas(_models(routes)),
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "Authorization: Bearer <token> (the scheme in any letter "
                    "case): the admin's token or an account token (sbt_...).",
                }
            },
        },
    }
