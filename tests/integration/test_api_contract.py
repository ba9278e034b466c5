"""The API does what /openapi.json says (issue 14): documented bounds are the enforced
ones, enums are checked, 405s say what is allowed, the bearer scheme is matched as
RFC 7235 says, and a bag whose jobs could never start (an environment past what Linux
lets a process start with) is refused at admission."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from controller.cli.client import ClientError
from tests.conftest import FAST_CONFIG, Daemon, wait_for_bag

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    state = tmp_path_factory.mktemp("contract")
    (state / "spotbag.toml").write_text(
        FAST_CONFIG.format(token="t0ken", model="none", mttf_h=24, time_scale=1, max_vms=1)
    )
    daemon = Daemon(state, state / "spotbag.toml", "t0ken")
    yield daemon.start()
    daemon.stop()


def call(client, method: str, path: str, headers: dict | None = None, body: bytes | None = None):
    """(status, headers, decoded JSON or text) of one request, errors included."""
    request = urllib.request.Request(
        client.url + path, data=body, method=method, headers=headers or {}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, answer_headers, payload = response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        status, answer_headers, payload = exc.code, exc.headers, exc.read()
    try:
        return status, answer_headers, json.loads(payload)
    except ValueError:
        return status, answer_headers, payload.decode()


def test_the_bearer_scheme_matches_in_any_letter_case(client):
    for header in ("Bearer t0ken", "bearer t0ken", "BEARER t0ken", "bEaReR   t0ken"):
        status, _, answer = call(client, "GET", "/v1/bags", {"Authorization": header})
        assert status == 200, (header, answer)
    for header in ("Bearert0ken", "Basic t0ken", "Bearer", "Bearer ", "t0ken", "Bearer t0ke"):
        status, headers, _ = call(client, "GET", "/v1/bags", {"Authorization": header})
        assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer"), header
    client.create_account("case", cpu_hours=1)
    token = client.create_token("case")["token"]
    status, _, answer = call(
        client, "GET", "/v1/accounts/case", {"Authorization": f"BEARER {token}"}
    )
    assert status == 200 and answer["account"] == "case"


def test_a_405_says_which_methods_the_path_has(client):
    auth = {"Authorization": "Bearer t0ken"}
    status, headers, answer = call(client, "PUT", "/v1/bags", auth, b"{}")
    assert status == 405 and answer["error"]["code"] == "method_not_allowed"
    assert {"GET", "POST"} <= {m.strip() for m in headers["Allow"].split(",")}
    status, headers, _ = call(client, "DELETE", "/v1/bags/b0000000000", auth)
    assert status == 405 and "GET" in headers["Allow"]
    # An open path needs no token to be told the method is wrong...
    for path in ("/healthz", "/openapi.json", "/metrics"):
        status, headers, _ = call(client, "DELETE", path)
        assert status == 405 and "GET" in headers["Allow"], path
    # ...but a protected or unknown one still asks for the token first.
    assert call(client, "PUT", "/v1/bags")[0] == 401
    assert call(client, "GET", "/v1/nowhere")[0] == 401


def test_format_and_all_are_checked_and_documented(client):
    client.create_account("fmt", cpu_hours=1)
    with pytest.raises(ClientError) as caught:
        client.request("GET", "/v1/accounts/fmt/ledger", query={"format": "xml"})
    assert caught.value.status == 400 and caught.value.code == "invalid_query"
    assert "'xml' is not one of json, csv" in caught.value.message
    payload, headers = client.ledger("fmt", csv=True)
    assert payload.startswith(b"id,at,account") and headers["Content-Type"].startswith("text/csv")
    for query in ({"all": "perhaps"}, {"state": "running", "all": "perhaps"}):
        with pytest.raises(ClientError) as caught:
            client.request("GET", "/v1/vms", query=query)
        assert caught.value.status == 400 and "all" in caught.value.message, query
    for value in ("TRUE", "false", "1", "no"):
        client.request("GET", "/v1/vms", query={"all": value, "state": "running"})
    document = client.request("GET", "/openapi.json")
    ledger = {
        p["name"]: p
        for p in document["paths"]["/v1/accounts/{account}/ledger"]["get"]["parameters"]
    }
    assert ledger["format"]["schema"]["enum"] == ["json", "csv"]
    vms = {p["name"]: p for p in document["paths"]["/v1/vms"]["get"]["parameters"]}
    assert set(vms["all"]["schema"]["enum"]) >= {"true", "false"}


def concrete(path: str, bag_id: str) -> str:
    return (
        path.replace("{bag_id}", bag_id)
        .replace("{job_id}", f"{bag_id}-0")
        .replace("{account}", "bounds")
        .replace("{vm_id}", "vm-000000000000")  # no such VM: a bound is checked first
    )


def test_every_documented_integer_bound_is_the_enforced_one(client):
    """For every integer query parameter in /openapi.json: its minimum and maximum are
    taken, one past either is a 400 naming the parameter."""
    client.create_account("bounds", cpu_hours=10)
    bag = client.submit({"account": "bounds", "command": "echo hi", "max_runtime_s": 30})
    wait_for_bag(client, bag["id"], 30)
    document = client.request("GET", "/openapi.json")
    checked = 0
    for path, item in document["paths"].items():
        for method, operation in item.items():
            for param in operation["parameters"]:
                schema = param["schema"]
                if param["in"] != "query" or schema.get("type") != "integer":
                    continue
                assert {"minimum", "maximum"} <= set(schema), (path, param)
                where = concrete(path, bag["id"])
                low, high = schema["minimum"], schema["maximum"]
                for value in (low, high):  # accepted (a 404 for an attempt that is not)
                    try:
                        client.request(
                            method.upper(), where, query={param["name"]: value}, raw=True
                        )
                    except ClientError as exc:
                        assert exc.code != "invalid_query", (path, value, exc.message)
                for value in (low - 1, high + 1):
                    with pytest.raises(ClientError) as caught:
                        client.request(method.upper(), where, query={param["name"]: value})
                    error = caught.value
                    assert error.status == 400 and error.code == "invalid_query", (path, value)
                    assert param["name"] in error.message
                checked += 1
    assert checked >= 10


def test_the_document_lists_bodies_headers_and_statuses_the_server_has(client):
    document = client.request("GET", "/openapi.json")
    paths = document["paths"]
    submit = paths["/v1/bags"]["post"]
    assert submit["requestBody"]["required"] is True
    assert {"200", "201", "400", "402", "403", "404", "409", "413", "422"} <= set(
        submit["responses"]
    )
    (key,) = [p for p in submit["parameters"] if p["name"] == "Idempotency-Key"]
    assert key["in"] == "header" and key["schema"]["maxLength"] == 200
    for path, schema in (
        ("/v1/accounts", "AccountCreate"),
        ("/v1/accounts/{account}/credit", "Credit"),
    ):
        body = paths[path]["post"]["requestBody"]
        assert body["required"] is True, path
        assert body["content"]["application/json"]["schema"]["$ref"].endswith(schema)
        assert "400" in paths[path]["post"]["responses"]
    assert paths["/v1/accounts/{account}/tokens"]["post"]["requestBody"]["required"] is False
    events = paths["/v1/slurm/events"]["post"]
    assert events["requestBody"]["required"] is True
    assert {p["name"] for p in events["parameters"] if p["required"]} == {
        "X-Spotbag-Timestamp",
        "X-Spotbag-Signature",
    }
    assert document["components"]["schemas"]["BagSpec"]["properties"]["resources"]
    schemas = document["components"]["schemas"]
    assert schemas["Resources"]["properties"]["memory_gb"]["minimum"] > 0
    # What the validator checks beyond types (fuzzing found both refused as undocumented).
    assert schemas["BagSpec"]["properties"]["workdir"]["pattern"] == "^/"
    assert schemas["BagSpec"]["properties"]["env"]["propertyNames"]["pattern"]
    # What the document says of a required body holds: leaving it out is a 400.
    client.create_account("docs", cpu_hours=1)
    for path in ("/v1/accounts", "/v1/accounts/docs/credit", "/v1/bags"):
        status, _, answer = call(client, "POST", path, {"Authorization": "Bearer t0ken"})
        assert status == 400, (path, answer)


def test_an_unsigned_slurm_callback_is_401_whatever_the_executor(client):
    status, _, answer = call(
        client, "POST", "/v1/slurm/events", {"Content-Type": "application/json"}, b"{}"
    )
    assert status == 401 and "X-Spotbag-Signature" in answer["error"]["message"]


def test_an_environment_too_large_to_start_a_job_is_refused_at_admission(client):
    big = "x" * 100_000
    base = {"account": "env", "max_runtime_s": 60}
    refused = [
        ({**base, "command": "true", "env": {"A": big, "B": big}}, "env"),
        (
            {
                **base,
                "command": "true",
                "points": [{"p": big}, {"p": "y"}],
                "env": {"A": "x" * 40_000},
            },
            "points",
        ),
        ({**base, "command": "true", "env": {f"V{i}": "é" * 10_000 for i in range(7)}}, "env"),
    ]
    for spec, field in refused:
        with pytest.raises(ClientError) as caught:
            client.submit(spec)
        error = caught.value
        assert error.status == 400 and error.code == "invalid_bag", field
        assert error.detail["errors"][0]["field"] == field
        assert "at most 131,072 (128 KiB)" in error.message, error.message
    # Just under the limit: admitted, and the job does start (no E2BIG).
    bag = client.submit({**base, "command": 'test "${{#A}}" -eq 100000', "env": {"A": big}})
    assert wait_for_bag(client, bag["id"], 60)["state"] == "succeeded"


def bag_numbers(schemas: dict) -> list[tuple[str, dict]]:
    """(field, schema) of every number in a bag's body, as /openapi.json gives them."""
    found = []
    for model, prefix in (
        ("BagSpec", ""),
        ("Resources", "resources."),
        ("SimulationHints", "simulation."),
    ):
        for name, prop in schemas[model]["properties"].items():
            for option in prop.get("anyOf", [prop]):
                if option.get("type") in ("number", "integer"):
                    found.append((prefix + name, option))
                elif option.get("type") == "array" and option["items"].get("type") == "integer":
                    found.append((prefix + name + "[0]", option["items"]))
    return found


def with_value(field: str, value) -> dict:
    spec = {"account": "numbers", "command": "true", "max_runtime_s": 30 * 86_400}
    if field.endswith("[0]"):
        spec[field[:-3]] = [value]
    elif "." in field:
        part, name = field.split(".")
        spec[part] = {name: value}
    else:
        spec[field] = value
    return spec


def test_every_number_of_a_bag_is_bounded_as_documented(client):
    """Each number in a bag has a documented minimum and maximum (issue 23: a runtime of
    1e-320 passed `gt=0`); both are taken, and a little past either is a 400 naming the
    field. An integer's bounds are taken as integral floats (1699.0) too."""
    schemas = client.request("GET", "/openapi.json")["components"]["schemas"]
    numbers = bag_numbers(schemas)
    assert {field for field, _ in numbers} >= {
        "max_runtime_s",
        "estimated_runtime_s",
        "checkpoint_cost_s",
        "max_attempts",
        "retryable_exit_codes[0]",
        "resources.cpus",
        "resources.gpus",
        "resources.memory_gb",
        "simulation.runtime_s",
        "simulation.runtime_cv",
        "simulation.failure_probability",
        "simulation.failure_exit_code",
    }
    assert schemas["BagSpec"]["properties"]["max_runtime_s"]["minimum"] == 1
    for field, schema in numbers:
        assert {"minimum", "maximum"} <= set(schema), (field, schema)
        low, high = schema["minimum"], schema["maximum"]
        taken = [low, high]
        if schema["type"] == "integer":
            taken += [float(low), float(high)]
            beyond = [low - 1, high + 1, low + 0.5]
        else:
            beyond = [low - max(1e-9, abs(low) / 1000), high + max(1e-9, abs(high) / 1000)]
        for value in taken:
            status, _, answer = call(client, "POST", "/v1/bags", HEADERS, dump(field, value))
            assert status in (201, 422), (field, value, answer)  # 422: no VM that large
            if status == 201:  # admitted: stop it (unless its `true` has run already)
                status, _, ended = call(
                    client, "POST", f"/v1/bags/{answer['id']}/cancel", HEADERS, b""
                )
                assert status in (202, 409), ended
        for value in beyond:
            status, _, answer = call(client, "POST", "/v1/bags", HEADERS, dump(field, value))
            assert status == 400, (field, value, answer)
            assert answer["error"]["message"].startswith(f"{field}: "), (field, value, answer)


HEADERS = {"Authorization": "Bearer t0ken", "Content-Type": "application/json"}


def dump(field: str, value) -> bytes:
    return json.dumps(with_value(field, value)).encode()
