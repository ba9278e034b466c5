"""The OpenAPI 3.1 document, built from the API's route table.

Paths, methods, parameters and responses come from `controller.api.ROUTES`
(the same table that builds the router); the request schema of a bag is
pydantic's JSON schema of `BagSpec`, i.e. exactly what the validator accepts.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from controller.bagspec import BagSpec

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
        "properties": {"ok": {"type": "boolean"}, "driver": _STR, "schema_version": _INT},
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
    "VmList": {
        "type": "object",
        "properties": {
            "vms": {"type": "array", "items": {"type": "object"}},
            "usage": {"type": "object"},
        },
    },
}


@functools.cache
def _bag_spec_schema() -> dict[str, Any]:
    schema = BagSpec.model_json_schema(ref_template="#/components/schemas/{model}")
    definitions = schema.pop("$defs", {})
    return {"BagSpec": schema, **definitions}


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
        if any(p.where == "query" for p in route.params):
            operation["responses"].setdefault(
                "400",
                {
                    "description": "A query parameter is malformed (code invalid_query).",
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
                    },
                },
            )
        if route.auth:
            operation["security"] = [{"bearer": []}]
            operation["responses"].setdefault(
                "401",
                {
                    "description": "Missing or wrong bearer token.",
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
                    },
                },
            )
        if route.admin_only:
            operation["responses"].setdefault(
                "403",
                {
                    "description": "Needs the admin token; an account token may not do this.",
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
                    },
                },
            )
        if route.body:
            operation["requestBody"] = {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": f"#/components/schemas/{route.body}"}}
                },
            }
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
            "schemas": {**_SCHEMAS, **_bag_spec_schema()},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
