"""The HTTP routes against a real server, and a fuzzer against its OpenAPI document."""
import re
import subprocess
import sys

import pytest
import requests
from fastapi.testclient import TestClient

from openenv_nb.client import HTTPEnvClient
from openenv_nb.envs.echo import EchoAction, EchoEnvironment, EchoHTTPEnv
from openenv_nb.server import create_app
from openenv_nb.types import EnvServerError


def test_http_routes(echo_url):
    s = requests.Session()
    assert s.get(echo_url + "/health").json()["status"] == "healthy"
    meta = s.get(echo_url + "/metadata").json()
    assert meta["name"] == "EchoEnvironment" and isinstance(meta["description"], str)
    schema = s.get(echo_url + "/schema").json()
    assert schema["action"]["properties"]["message"]["type"] == "string" and set(schema) == {"action", "observation", "state", "reset_observation"}
    assert s.post(echo_url + "/reset", json={"seed": 3}).json() == {
        "observation": {"metadata": {}, "echoed_message": "Echo environment ready!", "message_length": 0}, "reward": 0.0, "done": False,
        "metadata": None}
    assert s.post(echo_url + "/reset").status_code == 200  # the body is optional
    assert s.post(echo_url + "/step", json={"action": {"message": "hey"}, "timeout_s": 5}).json() == {
        "observation": {"metadata": {"original_message": "hey", "step": 1}, "echoed_message": "hey", "message_length": 3},
        "reward": 0.30000000000000004, "done": False, "metadata": {"original_message": "hey", "step": 1}}
    st = s.get(echo_url + "/state").json()
    assert st["step_count"] == 0 and isinstance(st["episode_id"], str)  # stateless: a fresh environment
    assert s.post(echo_url + "/mcp", json={}).json()["error"]["code"] == -32600
    assert s.post(echo_url + "/mcp", data="{").json()["error"]["code"] == -32700
    assert s.post(echo_url + "/mcp", data="[" * 100_000).json()["error"]["code"] == -32700
    assert isinstance(s.get(echo_url + "/openapi.json").json()["info"]["version"], str)


def test_422_shapes(echo_url):
    s = requests.Session()
    for body, loc in [({"action": {"message": 1}}, ["message"]), ({"action": {"message": "a", "x": 1}}, ["x"]),
                      ({"action": {}}, ["message"])]:
        r = s.post(echo_url + "/step", json=body)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == loc, r.text
    for bad in ["", "{", "[]", '{"actio": {}}', '{"action": 5}']:
        r = s.post(echo_url + "/step", data=bad, headers={"content-type": "application/json"})
        assert r.status_code == 422 and isinstance(r.json()["detail"], list), (bad, r.text)
    r = s.post(echo_url + "/step", data="[" * 100_000 + "]" * 100_000, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "parsing the body" in r.json()["detail"]
    for body in [{"seed": -1}, {"seed": "x"}, {"episode_id": "e" * 256}]:
        r = s.post(echo_url + "/reset", json=body)
        assert r.status_code == 422 and r.json()["detail"], r.text


def test_http_client(echo_url):
    with EchoHTTPEnv(echo_url) as env:
        r = env.step(EchoAction(message="hello"))
        assert (r.observation.echoed_message, r.observation.metadata) == ("hello", {"original_message": "hello", "step": 1})
        with pytest.raises(ValueError, match="loud"): env.step({"message": "a", "loud": True})  # typed: checked before sending
        try: HTTPEnvClient(echo_url).step({"message": "a", "loud": True})
        except EnvServerError as e: assert e.code == "VALIDATION_ERROR" and "loud" in str(e.data)
        else: raise AssertionError("no error for an unknown field")


def test_environment_error_over_http_is_named(server):
    url = server("helpers:Flaky")
    r = requests.post(url + "/step", json={"action": {"message": "boom"}})
    assert r.status_code == 500 and r.json()["detail"] == {"code": "EXECUTION_ERROR", "message": "RuntimeError: the environment blew up"}
    assert requests.post(url + "/step", json={"action": {"message": "fine"}}).status_code == 200


def test_schemathesis_finds_no_server_error(echo_url, tmp_path):
    cmd = [sys.executable, "-m", "schemathesis.cli", "run", echo_url + "/openapi.json", "-c", "not_a_server_error",
           "-n", "60", "--seed", "7", "--no-color", "--generation-database", "none", "--report-dir", str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)  # its caches stay out of the clone
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-3000:]
    assert " passed" in r.stdout and "failed" not in r.stdout.split("SUMMARY")[-1]


FAST_CASES = [("POST", "/step", b'{"action": {"message": "hi"}, "timeout_s": 5, "extra": 1}', "application/json"),
              ("POST", "/step", '{"action": {"message": "h\u00e9 \u2603"}}'.encode(), "application/json; charset=utf-8"),
              ("POST", "/step", b'{"action": {"message": "hi"}}', "text/plain"), ("POST", "/step", b'{"action": {"message": "hi"}}', None),
              ("POST", "/step", b"{", "application/json"), ("POST", "/step", b"", "application/json"),
              ("POST", "/step", b'{"action": 5}', "application/json"), ("POST", "/step", b'{"action": {"message": 1}}', "application/json"),
              ("POST", "/step", b'{"action": {}, "timeout_s": -1}', "application/json"), ("POST", "/step", b"[1]", "application/json"),
              ("POST", "/step", b'{"action": {"message": "hi"}, "n": 123456789012345678901234567890}', "application/json"),
              ("POST", "/step", b"[" * 5000 + b"]" * 5000, "application/json"),
              ("POST", "/step", b'{"action": {"message": "\\ud83d\\ude00"}}', "application/json"),
              ("POST", "/step", b'{"action": {"message": "a", "message": "b"}, "action": {"message": "c"}}', "application/json"),
              ("POST", "/step", b'{"action": {"message": "hi"}, "timeout_s": 1e-400}', "application/json"),
              ("POST", "/step", b'{"action": {"message": "hi"}, "timeout_s": 0.1000000000000000055511151231257827, "x": [1e300, -0.0, 5e-324]}', "application/json"),
              ("POST", "/step", b'\xef\xbb\xbf{"action": {"message": "hi"}}', "application/json"), ("POST", "/step", b' {"action": {"message": "hi"}} \n', "application/json"),
              ("POST", "/reset", b'{"seed": 12345678901234567890123}', "application/json"), ("POST", "/reset", b'{"seed": 1.0}', "application/json"),
              ("POST", "/reset", b'{"episode_id": "\\u00e9\\ud83d\\ude00", "seed": true}', "application/json"),
              ("POST", "/reset", b"", None), ("POST", "/reset", b"{}", "application/json"), ("POST", "/reset", b'{"seed": -1}', "application/json"),
              ("POST", "/reset", b'{"split": "train", "index": 1}', "application/json"), ("POST", "/reset", b'{"split": "nope"}', "application/json"),
              ("POST", "/reset", b"{}", "text/plain"), ("GET", "/state", b"", None),
              ("POST", "/mcp", b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}', "application/json"), ("POST", "/mcp", b"{", None),
              ("POST", "/mcp", b'{"jsonrpc": "2.0", "method": "notifications/initialized"}', "application/json"),
              ("POST", "/mcp", b'{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "echo_message", "arguments": {"message": "hi"}}}', "application/json")]


def test_the_fast_path_answers_as_fastapi_does():
    "`Guard` answers the hot routes itself; with it off, FastAPI answers: the same status, headers and body, byte for byte."
    answers = []
    for fast in (True, False):
        app = create_app(EchoEnvironment, max_concurrent_envs=4, token="")
        if not fast: app.guard.hot = {}
        with TestClient(app) as c:
            got = []
            for method, path, body, ctype in FAST_CASES:
                r = c.request(method, path, content=body, headers={"content-type": ctype} if ctype else {})
                got.append((r.status_code, r.headers.get("content-type"), r.headers.get("content-length"),
                            re.sub(rb"[0-9a-f-]{36}", b"UUID", r.content)))
            answers.append(got)
    for case, fast, slow in zip(FAST_CASES, *answers): assert fast == slow, (case, fast, slow)


class Stamp:
    "A user's own ASGI middleware: it stamps every HTTP answer."
    def __init__(self, app): self.app = app
    async def __call__(self, scope, receive, send):
        async def stamped(msg):
            if msg["type"] == "http.response.start": msg["headers"] = [*msg.get("headers", []), (b"x-stamped", b"1")]
            await send(msg)
        await self.app(scope, receive, stamped)


def test_added_middleware_sees_the_hot_routes():
    "The hot path skips FastAPI's stack only while it holds our door alone: a user's middleware sees /step, /reset and /state."
    app = create_app(EchoEnvironment)
    app.add_middleware(Stamp)
    with TestClient(app) as c:
        answers = [c.post("/reset", json={}), c.post("/step", json={"action": {"message": "hi"}}), c.get("/state")]
    assert [(r.status_code, r.headers.get("x-stamped")) for r in answers] == [(200, "1")] * 3
