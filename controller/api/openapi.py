"""The OpenAPI 3.1 document, built from the API's route table.

Paths, methods, parameters and responses come from `controller.api.app.ROUTES`
(the same table that builds the router); the request schema of a bag is
pydantic's JSON schema of `BagSpec`, i.e. exactly what the validator accepts
(likewise a Slurm hook's `SlurmEvent`). Integer query parameters carry the bounds
the handlers enforce (the same `Param` objects), and every status a route can
answer is listed, so a schema-driven fuzzer (`make fuzz`) can hold the server to it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from controller.bagspec import BagSpec
from controller.slurm.callbacks import SlurmEvent

_NUM = {"type": "number"}
_INT = {"type": "integer"}
_STR = {"type": "string"}
_NULLABLE_NUM = {"type": ["number", "null"]}

_COUNTS = {
    "type": "object",
    "description": "Jobs per state.",
    "additionalProperties": _INT,
}

_USAGE = {
    "type": "object",
    "properties": {
        "attempts": _INT,
        "interrupted_attempts": {**_INT, "description": "Attempts cut short by a VM preemption."},
        "attempt_hours": _NUM,
        "preempted_attempt_hours": {
            **_NUM,
            "description": "Running time of the attempts a preemption cut short.",
        },
        "lost_hours": {
            **_NUM,
            "description": "Work those preemptions lost: the time since each one's last checkpoint.",
        },
        "checkpoints": {**_INT, "description": "Checkpoints the bag's jobs wrote."},
        "checkpoint_hours": {**_NUM, "description": "Time spent writing them."},
        "vm_hours": {**_NUM, "description": "The bag's share of its VMs' time."},
        "spot_cost_usd": _NUM,
        "on_demand_cost_usd": {**_NUM, "description": "The same VM-hours at on-demand prices."},
        "savings_usd": _NUM,
    },
}

_SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {
                    "code": {**_STR, "description": "Machine-readable, e.g. invalid_bag."},
                    "message": {
                        **_STR,
                        "description": "What is wrong; names the field when one is.",
                    },
                    "detail": {"type": "object", "description": "e.g. errors: [{field, message}]."},
                },
            }
        },
    },
    "Health": {
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "driver": _STR,
            "schema_version": _INT,
            "problems": {"type": "array", "items": _STR},
        },
    },
    "Bag": {
        "type": "object",
        "properties": {
            "id": _STR,
            "name": _STR,
            "account": _STR,
            "state": {"enum": ["active", "succeeded", "failed", "cancelled"]},
            "cancel_requested": {"type": "boolean"},
            "created_at": _NUM,
            "finished_at": _NULLABLE_NUM,
            "elapsed_s": _NUM,
            "job_count": _INT,
            "counts": _COUNTS,
            "progress": {**_NUM, "description": "Finished jobs / all jobs."},
            "usage": _USAGE,
            "spec": {"$ref": "#/components/schemas/BagSpec"},
        },
    },
    "BagList": {
        "type": "object",
        "properties": {
            "bags": {"type": "array", "items": {"$ref": "#/components/schemas/Bag"}},
            "limit": _INT,
            "offset": _INT,
        },
    },
    "Attempt": {
        "type": "object",
        "properties": {
            "number": _INT,
            "vm_id": _STR,
            "vm_type": _STR,
            "state": _STR,
            "started_at": _NUM,
            "ended_at": _NULLABLE_NUM,
            "exit_code": {"type": ["integer", "null"]},
            "reason": _STR,
            "log_path": _STR,
            "executor_ref": {
                **_STR,
                "description": "The executor's id for it: the Slurm job id (slurm), else empty.",
            },
        },
    },
    "Job": {
        "type": "object",
        "properties": {
            "id": _STR,
            "bag_id": _STR,
            "index": _INT,
            "params": {"type": "object"},
            "state": {"enum": ["queued", "held", "running", "succeeded", "failed", "cancelled"]},
            "attempts": _INT,
            "exit_code": {"type": ["integer", "null"]},
            "reason": _STR,
            "vm_id": {"type": ["string", "null"]},
            "started_at": _NULLABLE_NUM,
            "ended_at": _NULLABLE_NUM,
            "runtime_s": {
                **_NULLABLE_NUM,
                "description": "Work it took: its last attempt plus what earlier ones checkpointed.",
            },
            "work_saved_s": {
                **_NUM,
                "description": "Runtime its last checkpoint holds; a retry resumes there.",
            },
            "checkpoints": _INT,
            "checkpoint_list": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "attempt": _INT,
                        "requested_at": {**_NUM, "description": "When the job was signalled."},
                        "at": {**_NUM, "description": "When the checkpoint was seen complete."},
                        "ok": {
                            **_INT,
                            "description": "1: written; 0: not within the time allowed.",
                        },
                        "work_s": {**_NUM, "description": "Work saved by it, seconds of runtime."},
                        "vm_age_h": {**_NUM, "description": "VM age when signalled, model hours."},
                        "detail": _STR,
                    },
                },
            },
            "log_path": {"type": ["string", "null"]},
            "attempt_list": {"type": "array", "items": {"$ref": "#/components/schemas/Attempt"}},
            "transitions": {"type": "array", "items": {"type": "object"}},
        },
    },
    "JobList": {
        "type": "object",
        "properties": {
            "jobs": {"type": "array", "items": {"$ref": "#/components/schemas/Job"}},
            "next_after": {"type": ["integer", "null"]},
        },
    },
    "Models": {
        "type": "object",
        "properties": {
            "configured": {"type": "object"},
            "learned": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "key": _STR,
                        "model": _STR,
                        "parameters": {"type": "object"},
                        "n": _INT,
                        "censored": _INT,
                        "stats": {"type": "object", "description": "r2, ks, aic, log_likelihood"},
                        "fitted_at": _NUM,
                        "reason": _STR,
                        "active": _INT,
                    },
                },
            },
            "in_use": {"type": "array", "items": {"type": "object"}},
        },
    },
    "Hopping": {
        "type": "object",
        "properties": {
            "configured": {"type": "object"},
            "market": {
                "type": "array",
                "description": "Per VM type: price now, window mean and deviation (USD/h), "
                "on-demand price, normalised price now.",
                "items": {"type": "object"},
            },
            "migrations": {
                "type": "array",
                "description": "The hopper's moves, newest first, with reason, prices and index.",
                "items": {"type": "object"},
            },
        },
    },
    "AccountCreate": {
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": {**_STR, "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"},
            "cpu_hours": {
                **_NUM,
                "minimum": 0,
                "exclusiveMaximum": 1e15,
                "default": 0,
                "description": "Its first credit, CPU-hours.",
            },
            "unlimited": {"type": "boolean", "default": False},
            "note": {**_STR, "maxLength": 1000},
        },
    },
    "Credit": {
        "type": "object",
        "required": ["cpu_hours"],
        "properties": {
            "cpu_hours": {**_NUM, "minimum": 0, "exclusiveMaximum": 1e15},
            "note": {**_STR, "maxLength": 1000},
        },
    },
    "TokenCreate": {
        "type": "object",
        "properties": {"note": {**_STR, "maxLength": 1000}},
    },
    "VmList": {
        "type": "object",
        "properties": {
            "vms": {"type": "array", "items": {"type": "object"}},
            "usage": {"type": "object"},
        },
    },
}


@functools.cache
def _model_schemas() -> dict[str, Any]:
    """The request schemas pydantic validates with: BagSpec and a Slurm hook's event."""
    schemas: dict[str, Any] = {}
    for model in (BagSpec, SlurmEvent):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    return schemas


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def build_openapi(routes: Sequence[Any]) -> dict[str, Any]:
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
                | (
                    {
                        "content": {
                            "application/json": {
                                "schema": {"$ref": f"#/components/schemas/{schema}"}
                            }
                        }
                    }
                    if schema
                    else {}
                )
                for status, (text, schema) in route.responses.items()
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
                "content": {
                    "application/json": {"schema": {"$ref": f"#/components/schemas/{route.body}"}}
                },
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
            "schemas": {**_SCHEMAS, **_model_schemas()},
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
