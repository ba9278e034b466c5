"""Bad input, from plain mistakes to hostile bodies: always a JSON 4xx naming the field,
never a 500, a hang, or a bag accepted that can never run."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.request

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.cli.client import ClientError
from tests.conftest import wait_until

pytestmark = pytest.mark.integration

BASE = {"account": "a", "command": "echo {x}", "parameters": {"x": [1]}, "max_runtime_s": 30}


def post_raw(client, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(
        client.url + "/v1/bags",
        data=body,
        method="POST",
        headers={
            "Authorization": f"Bearer {client.token}",
            "Content-Type": "application/json",
            **(headers or {}),
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    from tests.conftest import FAST_CONFIG, Daemon

    state = tmp_path_factory.mktemp("bad-input")
    (state / "spotbag.toml").write_text(
        FAST_CONFIG.format(token="t", model="none", mttf_h=24, time_scale=1, max_vms=1)
    )
    daemon = Daemon(state, state / "spotbag.toml", "t")
    daemon.start()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def client(daemon):
    return daemon.client()


def raw_request(url: str, head: bytes, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """Send bytes no HTTP client would (raw, non-UTF-8 header values) over a plain
    socket; (status, headers, body) of the answer."""
    host, port = url.removeprefix("http://").split(":")

    async def exchange() -> bytes:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(head + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode())
        writer.write(body)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 30)
        writer.close()
        return answer

    answer = asyncio.run(exchange())
    header_block, _, payload = answer.partition(b"\r\n\r\n")
    status_line, *lines = header_block.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    return int(status_line.split()[1]), headers, payload


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        (b"{nope", 400, "(body)"),
        (b'{"a": NaN}', 400, "(body)"),
        ('{"a": 1}'.encode("utf-16"), 400, "(body)"),
        (b'{"a": "\\xff"}'.replace(b"\\xff", b"\xff"), 400, "(body)"),
        (b"[" * 100_000 + b"]" * 100_000, 400, "(body)"),
        (b'{"max_runtime_s": ' + b"9" * 5000 + b"}", 400, "(body)"),
        (json.dumps({**BASE, "env": {"A": "x\u0000y"}}).encode(), 400, "env.A"),
        (json.dumps({**BASE, "command": "echo \ud800"}).encode(), 400, "command"),
        (json.dumps({**BASE, "parameters": {"x": ["a\u0000"]}}).encode(), 400, "parameters.x[0]"),
        (
            json.dumps({**BASE, "parameters": {"x": {"range": [0, 1, 5e-324]}}}).encode(),
            400,
            "parameters",
        ),
        (
            json.dumps({**BASE, "parameters": {"x": {"range": [1e308, -1e308, -1e307]}}}).encode(),
            400,
            "parameters",
        ),
        (json.dumps({**BASE, "command": "x {x:>10000000000}"}).encode(), 400, "command"),
        # A number a format spec overflows on (OverflowError in the size check: a 500).
        (
            json.dumps({**BASE, "command": "x {x:.2f}", "parameters": {"x": [10**400]}}).encode(),
            400,
            "command",
        ),
        (
            json.dumps({**BASE, "command": "x {x:c}", "parameters": {"x": [10**10]}}).encode(),
            400,
            "command",
        ),
        (
            json.dumps(
                {**BASE, "command": "x {x:e}", "parameters": None, "points": [{"x": -(10**400)}]}
            ).encode(),
            400,
            "command",
        ),
        (
            json.dumps({**BASE, "parameters": {"x": ["y" * 200_000]}}).encode(),
            400,
            "parameters.x[0]",
        ),
        (json.dumps({**BASE, "workdir": "relative/dir"}).encode(), 400, "workdir"),
        (json.dumps({**BASE, "workdir": "/no/such/dir"}).encode(), 400, "workdir"),
        (
            json.dumps({**BASE, "retryable_exit_codes": [3, "x"]}).encode(),
            400,
            "retryable_exit_codes[1]",
        ),
        # A divisor this small overflowed the packing (a 500, issue 14).
        (
            json.dumps({**BASE, "resources": {"memory_gb": 5e-324}}).encode(),
            400,
            "resources.memory_gb",
        ),
        (json.dumps({**BASE, "resources": {"memory_gb": 1e999}}).encode(), 400, "(body)"),
        (
            json.dumps({**BASE, "resources": {"memory_gb": 1.5}}).replace("1.5", "1e999").encode(),
            400,
            "resources.memory_gb",
        ),
        (
            json.dumps({**BASE, "simulation": {"runtime_s": 1e300}}).encode(),
            400,
            "simulation.runtime_s",
        ),
        # Ranges whose length does not fit a machine integer (len(range) overflowed: a 500).
        (
            json.dumps({**BASE, "parameters": {"x": {"range": [0, 10**30]}}}).encode(),
            400,
            "parameters.x.range",
        ),
        (
            json.dumps({**BASE, "parameters": {"x": {"range": [10**30, -(10**30), -1]}}}).encode(),
            400,
            "parameters.x.range",
        ),
        (
            json.dumps({**BASE, "parameters": {"x": {"range": [-(2**63), 2**63, 1]}}}).encode(),
            400,
            "parameters.x.range",
        ),
        (
            json.dumps({**BASE, "parameters": {"x": {"range": [0, 10**300, 10**200]}}}).encode(),
            400,
            "parameters.x.range",
        ),
        # An int bound too large for a float beside a float one (math.isfinite raised).
        (
            json.dumps({**BASE, "parameters": {"x": {"range": [0.5, 10**400, 1]}}}).encode(),
            400,
            "parameters.x.range",
        ),
    ],
)
def test_hostile_and_broken_bodies(client, body, status, field):
    code, answer = post_raw(client, body)
    assert code == status, answer
    assert answer["error"]["message"].startswith(field), answer["error"]["message"]


def test_a_huge_range_is_refused_before_it_is_expanded(client):
    started = time.monotonic()
    code, answer = post_raw(
        client,
        json.dumps(
            {
                **BASE,
                "command": "echo {a} {b}",
                "parameters": {"a": {"range": [0, 10**12]}, "b": {"range": [0.5, 1e9]}},
            }
        ).encode(),
    )
    assert code == 400 and "at most 1,000,000" in answer["error"]["message"]
    assert time.monotonic() - started < 2.0  # counted, not built


def test_resource_values_out_of_range_are_400_naming_the_field_and_the_range(client):
    for resources, field, words in (
        ({"memory_gb": 5e-324}, "resources.memory_gb", "greater than or equal to 0.001"),
        ({"memory_gb": 0.0}, "resources.memory_gb", "greater than or equal to 0.001"),
        ({"memory_gb": 70000}, "resources.memory_gb", "less than or equal to 65536"),
        ({"cpus": 10**30}, "resources.cpus", "less than or equal to 4096"),
    ):
        code, answer = post_raw(client, json.dumps({**BASE, "resources": resources}).encode())
        assert code == 400, answer
        assert answer["error"]["detail"]["errors"][0]["field"] == field
        assert words in answer["error"]["message"], answer["error"]["message"]


def post_json(client, path: str, body: bytes) -> tuple[int, dict]:
    """POST raw JSON text (1e999, 1699.0: forms json.dumps would not write) to `path`."""
    request = urllib.request.Request(
        client.url + path,
        data=body,
        method="POST",
        headers={"Authorization": f"Bearer {client.token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.parametrize("runtime", ["2.2250738585072014e-308", "1e-320", "0.5", "1e999"])
@pytest.mark.parametrize("when_short", ["hold", "reject"])
def test_a_runtime_under_a_second_is_400_on_a_finite_account(client, runtime, when_short):
    # Issue 23: with "hold" on a finite account a denormal runtime was a 500
    # (OverflowError in jobs_covered); with "reject" the bag was accepted and every
    # attempt killed at once.
    try:
        client.create_account("finite", cpu_hours=50)
    except ClientError as exc:
        assert exc.status == 409  # made by an earlier case
    spec = {**BASE, "account": "finite", "on_insufficient_balance": when_short}
    body = json.dumps({**spec, "max_runtime_s": 123.25}).replace("123.25", runtime)
    code, answer = post_raw(client, body.encode())
    assert code == 400, answer
    error = answer["error"]
    assert error["detail"]["errors"] == [
        {
            "field": "max_runtime_s",
            "message": "Input should be a finite number"
            if runtime == "1e999"
            else "Input should be greater than or equal to 1",
        }
    ]
    assert error["message"].startswith("max_runtime_s: ")
    assert client.account("finite")["reserved_cpu_h"] == 0  # nothing was admitted


def test_integers_may_come_as_integral_floats_and_other_floats_are_400(client):
    body = json.dumps({**BASE, "resources": {"cpus": 2.0}, "max_attempts": 3.0})
    assert "2.0" in body and "3.0" in body
    code, answer = post_raw(client, body.encode())
    assert code == 201, answer
    assert answer["spec"]["resources"]["cpus"] == 2 and answer["spec"]["max_attempts"] == 3
    client.cancel(answer["id"])
    # Accepted as the integer 1699, then refused for what it is: no VM type has 1699 CPUs.
    code, answer = post_raw(client, json.dumps({**BASE, "resources": {"cpus": 1699.0}}).encode())
    assert code == 422, answer
    code, answer = post_raw(client, json.dumps({**BASE, "resources": {"cpus": 1699.5}}).encode())
    assert code == 400, answer
    assert answer["error"]["message"] == "resources.cpus: must be an integer, not 1699.5"
    code, answer = post_raw(client, b'{"account": "a", "command": "x", "max_runtime_s": 1e400}')
    assert code == 400 and answer["error"]["message"].startswith("max_runtime_s: "), answer


def test_account_amounts_are_finite(client):
    client.create_account("amounts", cpu_hours=1)
    for path, body in (
        ("/v1/accounts", b'{"name": "inf-lab", "cpu_hours": 1e999}'),
        ("/v1/accounts", b'{"name": "inf-lab", "cpu_hours": -1e999}'),
        ("/v1/accounts/amounts/credit", b'{"cpu_hours": 1e999}'),
    ):
        code, answer = post_json(client, path, body)
        assert code == 400, (path, answer)
        assert answer["error"]["message"].startswith("cpu_hours: must be a number of CPU-hours")


def test_a_range_too_long_for_a_machine_integer_is_400_with_the_field_and_reason(client):
    started = time.monotonic()
    code, answer = post_raw(
        client,
        json.dumps({**BASE, "parameters": {"x": {"range": [0, 10**40, 3]}, "y": [1, 2]}}).encode(),
    )
    assert code == 400, answer
    error = answer["error"]
    assert error["detail"]["errors"][0]["field"] == "parameters.x.range"
    assert "values; a bag has at most 1,000,000 jobs" in error["message"], error["message"]
    # Axes each within the limit whose product is not: counted, never built.
    code, answer = post_raw(
        client,
        json.dumps(
            {
                **BASE,
                "command": "echo {a} {b} {c}",
                "parameters": {
                    "a": {"range": [0, 1000]},
                    "b": {"range": [0, 1000]},
                    "c": {"range": [0.0, 1000.0, 1.0]},
                },
            }
        ).encode(),
    )
    assert code == 400, answer
    assert answer["error"]["message"].startswith("parameters: the bag has 1,000,000,000 jobs")
    assert time.monotonic() - started < 2.0


def test_raw_non_utf8_authorization_is_401_without_a_traceback(daemon, client):
    before = daemon.log().count("Traceback")
    for value in (b"Bearer \xff\xfe", b"\xc3\x28", b"Bearer t\x80"):
        status, headers, body = raw_request(
            client.url, b"GET /v1/bags HTTP/1.1\r\nHost: x\r\nAuthorization: " + value + b"\r\n"
        )
        assert status == 401, (value, body)
        assert json.loads(body)["error"]["code"] == "unauthorized"
        assert headers["WWW-Authenticate"].startswith("Bearer")
    assert daemon.log().count("Traceback") == before


def test_raw_non_utf8_idempotency_key_is_400(daemon, client):
    before = daemon.log().count("Traceback")
    body = json.dumps(BASE).encode()
    for key in (b"\xff\xfe", b"key-\xc3\x28", "clé".encode("latin-1")):
        status, _, answer = raw_request(
            client.url,
            b"POST /v1/bags HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\n"
            b"Content-Type: application/json\r\nIdempotency-Key: " + key + b"\r\n",
            body,
        )
        assert status == 400, (key, answer)
        error = json.loads(answer)["error"]
        assert error["code"] == "invalid_header" and "Idempotency-Key" in error["message"]
    # Well-formed keys work the same over the raw socket.
    status, _, answer = raw_request(
        client.url,
        b"POST /v1/bags HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\n"
        b"Content-Type: application/json\r\nIdempotency-Key: raw-socket-1\r\n",
        body,
    )
    assert status == 201, answer
    # Its jobs may have run already (409: already finished).
    bag_id = json.loads(answer)["id"]
    client.request("POST", f"/v1/bags/{bag_id}/cancel", answers=(409,))
    assert daemon.log().count("Traceback") == before


def test_requests_the_http_parser_refuses_log_no_traceback(daemon, client):
    before = daemon.log().count("Traceback")
    for head in (
        b"GET /v1/bags HTTP/1.1\r\nHost: x\r\nX-Probe: a\x00b\r\n",
        b"GET /v1/bags HTTP/1.1\r\nHost: x\r\nX-Probe: a\x01b\r\n",
        b"GET /v1/bags HTTP/1.1\r\nHost: x\r\nBad Header: 1\r\n",
    ):
        status, _, _ = raw_request(client.url, head)
        assert status == 400, head
    client.health()
    assert daemon.log().count("Traceback") == before, daemon.log()[-2000:]


def test_odd_ids_and_queries_are_404_or_400_not_500(client):
    for path in (
        "/v1/jobs/b0000000000-99999999999999999999",
        "/v1/jobs/b0000000000-%C2%B2",
        "/v1/jobs/b0000000000-%D9%A3",
        "/v1/bags/b0000000000%0A",
        "/v1/jobs/b0000000000-0/log",
    ):
        with pytest.raises(ClientError) as caught:
            client.request("GET", path)
        assert caught.value.status == 404, path
    for query in ({"limit": "5_0"}, {"limit": "+5"}, {"limit": "１"}, {"state": "sleeping"}):
        with pytest.raises(ClientError) as caught:
            client.request("GET", "/v1/bags", query=query)
        assert caught.value.status == 400 and caught.value.code == "invalid_query"
    with pytest.raises(ClientError) as caught:
        client.request("GET", "/v1/vms", query={"all": "perhaps"})
    assert caught.value.status == 400
    request = urllib.request.Request(
        client.url + "/v1/bags", method="HEAD", headers={"Authorization": f"Bearer {client.token}"}
    )
    with urllib.request.urlopen(request) as response:
        assert response.status == 200


def test_an_idempotency_key_reused_for_another_bag_is_a_conflict(client):
    first = client.submit(BASE, idempotency_key="k-1")
    assert client.submit(BASE, idempotency_key="k-1")["id"] == first["id"]
    with pytest.raises(ClientError) as caught:
        client.submit({**BASE, "command": "echo other {x}"}, idempotency_key="k-1")
    assert caught.value.status == 409 and caught.value.code == "idempotency_key_reused"
    assert caught.value.detail["bag_id"] == first["id"]


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
fields = st.sampled_from(
    [
        "name",
        "account",
        "command",
        "parameters",
        "points",
        "resources",
        "max_runtime_s",
        "estimated_runtime_s",
        "checkpointable",
        "max_attempts",
        "retryable_exit_codes",
        "env",
        "workdir",
        "simulation",
        "extra",
    ]
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(field=fields, value=json_values)
def test_any_json_in_any_field_is_a_4xx_or_accepted(client, field, value):
    code, answer = post_raw(client, json.dumps({**BASE, field: value}).encode())
    assert code in (200, 201, 400, 422), answer
    if code >= 400:
        assert answer["error"]["message"], answer
    else:
        try:
            client.cancel(answer["id"])
        except ClientError as exc:  # an accepted bag may finish before the cancel
            assert exc.status == 409 and "already finished" in exc.message, exc


def test_names_with_a_trailing_newline_are_400_whole_names_only(client):
    # Python's `$` matches before a final newline: these passed re.match(r"...$").
    for spec, field in (
        ({**BASE, "env": {"OMP\n": "1"}}, "env.OMP\n"),
        ({**BASE, "command": "echo", "parameters": {"x\n": [1]}}, "parameters.x\n"),
        ({**BASE, "command": "echo", "parameters": None, "points": [{"x\n": 1}]}, "points[0].x\n"),
        ({**BASE, "account": "a\n"}, "account"),
    ):
        code, answer = post_raw(client, json.dumps(spec).encode())
        assert code == 400, answer
        assert [e["field"] for e in answer["error"]["detail"]["errors"]] == [field], answer
    code, answer = post_json(client, "/v1/accounts", b'{"name": "lab\\n", "cpu_hours": 1}')
    assert code == 400, answer
    assert answer["error"]["message"].startswith("name: must be 1-64 letters"), answer
    with pytest.raises(ClientError) as caught:
        client.account("a\n")
    assert caught.value.status == 404


def send_half_and_close(url: str, head: bytes, body: bytes, chunked: bool) -> None:
    """Start a POST whose body should be twice `body`, send `body` only, and close."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        if chunked:
            sock.sendall(head + b"Transfer-Encoding: chunked\r\n\r\n")
            sock.sendall(f"{2 * len(body):x}\r\n".encode() + body)
        else:
            sock.sendall(head + f"Content-Length: {2 * len(body)}\r\n\r\n".encode() + body)
        time.sleep(0.2)  # the server has begun to read the body


def test_a_client_that_drops_a_post_mid_body_is_one_debug_line(daemon, client):
    client.create_account("half-body", cpu_hours=1)
    before = daemon.log()
    drops = 0
    for path, body in (
        ("/v1/bags", json.dumps(BASE).encode()),
        ("/v1/accounts", b'{"name": "half", "cpu_hours": 1}'),
        ("/v1/accounts/half-body/credit", b'{"cpu_hours": 1, "note": "x"}'),
    ):
        head = (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\n"
            "Content-Type: application/json\r\n"
        ).encode()
        for chunked in (False, True):
            send_half_and_close(client.url, head, body, chunked)
            drops += 1

    def new_lines() -> list[str]:
        return daemon.log()[len(before) :].splitlines()

    said = "the client closed the connection before the end of its request"
    wait_until(lambda: sum(said in line for line in new_lines()) >= drops, 20, 0.1, "the lines")
    client.health()  # and it goes on answering
    lines = [line for line in new_lines() if " spotbag.api:" in line or " aiohttp." in line]
    assert len(lines) == drops, lines  # one line each, nothing else from the API or aiohttp
    assert all(" DEBUG spotbag.api: POST /v1/" in line and said in line for line in lines), lines
    assert "Traceback" not in "\n".join(new_lines())
    # Nothing was made from the halves.
    assert [a["account"] for a in client.accounts()["accounts"]].count("half") == 0
    assert client.account("half-body")["allocation_cpu_h"] == 1
