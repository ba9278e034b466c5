"""Bad input, from plain mistakes to hostile bodies: always a JSON 4xx naming the field,
never a 500, a hang, or a bag accepted that can never run."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.client import ClientError

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
def client(tmp_path_factory):
    from tests.conftest import FAST_CONFIG, Daemon

    state = tmp_path_factory.mktemp("bad-input")
    (state / "spotbag.toml").write_text(
        FAST_CONFIG.format(token="t", model="none", mttf_h=24, time_scale=1, max_vms=1)
    )
    daemon = Daemon(state, state / "spotbag.toml", "t")
    yield daemon.start()
    daemon.stop()


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
        client.cancel(answer["id"])
