"""Compatibility with Meta's OpenEnv (`openenv-core` 0.2.3), both ways.

1. OpenEnv's own clients (a typed `EnvClient` subclass written the way OpenEnv's echo_env and `openenv init` template
   write it, `GenericEnvClient`, async and `.sync()`), its HTTP response models and its `openenv validate --url` logic,
   all run in a venv with openenv-core, against OUR echo server.
2. OUR clients against an openenv-core echo server (started with that venv's python): they must speak the plain
   compatible core there, since that server announces no extension and rejects unknown fields such as `id`.
3. Parity: the same raw WebSocket frames (and HTTP requests) sent to both servers get the same replies, apart from
   random values and message text; every case where ours differs on purpose is listed in `KNOWN_WS_DIFFERENCES`
   or `KNOWN_HTTP_DIFFERENCES`, and any other difference fails.

Everything here needs openenv-core: without it the tests skip, or fail where OPENENV_REQUIRE names `core`.
"""
import asyncio
import json
import os
import re
import signal
import subprocess
import time

import pytest
import requests
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from conftest import need
from core_venv import core_python_why
from openenv_nb.client import GenericEnvClient, HTTPEnvClient, ws_url
from openenv_nb.envs.echo import EchoAction, EchoEnv, EchoHTTPEnv, EchoObservation
from openenv_nb.types import EnvConnectionError, EnvServerError, EnvTimeoutError, State

pytestmark = pytest.mark.core

NO_PROXY_ENV = {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}


@pytest.fixture(scope="session")
def core_py():
    """The python of a venv with openenv-core 0.2.3 (see `core_venv.py`)."""
    py, why = core_python_why()
    need("core", py is not None, why)
    return py


# --------------------------------------------------------------------------------------------------------------------
# An openenv-core echo server, written on openenv-core's API exactly as its users write one (`create_app`, uvicorn).
# It binds port 0 itself and prints the port, so there is no race for a free port. The message "sleep N" sleeps N
# seconds in `step` (in the server's thread pool), which lets a test provoke a slow reply.
CORE_SERVER = r'''
import socket, sys, time
from typing import Any, Optional
from uuid import uuid4

import uvicorn
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class EchoAction(Action):
    message: str


class EchoObservation(Observation):
    echoed_message: str
    message_length: int = 0


class EchoEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State(episode_id=str(uuid4()), step_count=0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> EchoObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return EchoObservation(echoed_message="Echo environment ready!", message_length=0, done=False, reward=0.0)

    def step(self, action: EchoAction, timeout_s: Optional[float] = None, **kwargs: Any) -> EchoObservation:
        if action.message.startswith("sleep "): time.sleep(float(action.message.split()[1]))
        self._state.step_count += 1
        n = len(action.message)
        return EchoObservation(echoed_message=action.message, message_length=n, done=False, reward=n * 0.1,
                               metadata={"original_message": action.message, "step": self._state.step_count})

    @property
    def state(self) -> State:
        return self._state


app = create_app(EchoEnvironment, EchoAction, EchoObservation, env_name="echo", max_concurrent_envs=64)
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
print(f"core echo listening on {sock.getsockname()[1]}", flush=True)
sock.listen(128)
uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
'''


@pytest.fixture(scope="module")
def core_url(core_py, tmp_path_factory):
    """Base URL of an openenv-core echo server in a subprocess; killed (with its process group) afterwards."""
    d = tmp_path_factory.mktemp("core_server")
    (d / "core_echo.py").write_text(CORE_SERVER)
    log = d / "log.txt"
    with open(log, "wb") as out:
        proc = subprocess.Popen([core_py, str(d / "core_echo.py")], stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **NO_PROXY_ENV, "PYTHONUNBUFFERED": "1"})
    try:
        url, deadline = None, time.monotonic() + 90  # importing openenv.core pulls in gradio: ~5-10 s
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"the openenv-core server exited ({proc.returncode}):\n{log.read_text()[-3000:]}"
            if url is None and (m := re.search(r"listening on (\d+)", log.read_text())):
                url = f"http://127.0.0.1:{m.group(1)}"
            if url is not None:
                try:
                    if requests.get(url + "/health", timeout=1, proxies={}).status_code == 200: break
                except requests.RequestException: pass
            time.sleep(0.1)
        else: pytest.fail(f"the openenv-core server was not healthy within 90 s:\n{log.read_text()[-3000:]}")
        yield url
    finally:
        for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
            try: os.killpg(proc.pid, sig)
            except ProcessLookupError: break
            try: proc.wait(wait); break
            except subprocess.TimeoutExpired: continue


# --------------------------------------------------------------------------------------------------------------------
# 1. OpenEnv's clients against our server: a script run by the openenv-core venv's python prints a JSON summary.
CORE_CLIENT = r'''
import asyncio, json, sys, types
from typing import Dict

import requests
from pydantic import Field, ValidationError

from openenv.core import EnvClient, GenericEnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server.types import (Action, EnvironmentMetadata, HealthResponse, Observation, ResetResponse,
                                           SchemaResponse, State, StepResponse)

URL = sys.argv[1]


# The client as OpenEnv's echo_env (and the `openenv init` template) writes it.
class EchoAction(Action):
    message: str = Field(..., description="Message to echo back")


class EchoObservation(Observation):
    echoed_message: str = Field(default="", description="The echoed message")
    message_length: int = Field(default=0, description="Length of the echoed message")


class EchoEnv(EnvClient[EchoAction, EchoObservation, State]):
    def _step_payload(self, action: EchoAction) -> Dict:
        return {"message": action.message}

    def _parse_result(self, payload: Dict) -> StepResult[EchoObservation]:
        obs_data = payload.get("observation", {})
        observation = EchoObservation(
            echoed_message=obs_data.get("echoed_message", ""),
            message_length=obs_data.get("message_length", 0),
            done=payload.get("done", False),
            reward=payload.get("reward"),
            metadata=obs_data.get("metadata", {}),
        )
        return StepResult(observation=observation, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: Dict) -> State:
        return State(episode_id=payload.get("episode_id"), step_count=payload.get("step_count", 0))


def res(r):
    "A StepResult as JSON."
    o = r.observation
    obs = o if isinstance(o, dict) else {"type": type(o).__name__, **o.model_dump()}
    return {"observation": obs, "reward": r.reward, "done": r.done}


def st(s): return s if isinstance(s, dict) else {"type": type(s).__name__, **s.model_dump()}


def bad_typed(): return types.SimpleNamespace(message=123)  # `_step_payload` sends {"message": 123}: not a string


async def typed_async():
    out = {}
    async with EchoEnv(base_url=URL) as env:
        out["reset"] = res(await env.reset(seed=7, episode_id="core-typed-async"))
        out["step"] = res(await env.step(EchoAction(message="hello")))
        out["state"] = st(await env.state())
        try: await env.step(bad_typed()); out["bad"] = None
        except RuntimeError as e: out["bad"] = str(e)
        out["after_bad"] = res(await env.step(EchoAction(message="again")))
        out["state2"] = st(await env.state())
    return out


def typed_sync():
    out = {}
    with EchoEnv(base_url=URL).sync() as env:
        out["reset"] = res(env.reset(seed=7, episode_id="core-typed-sync"))
        out["step"] = res(env.step(EchoAction(message="hello")))
        out["state"] = st(env.state())
        try: env.step(bad_typed()); out["bad"] = None
        except RuntimeError as e: out["bad"] = str(e)
        out["after_bad"] = res(env.step(EchoAction(message="again")))
        out["state2"] = st(env.state())
    return out


async def generic_async():
    out = {}
    async with GenericEnvClient(base_url=URL) as env:
        out["reset"] = res(await env.reset(episode_id="core-generic-async"))
        out["step"] = res(await env.step({"message": "hello"}))
        out["state"] = st(await env.state())
        try: await env.step({"msg": "x"}); out["bad"] = None
        except RuntimeError as e: out["bad"] = str(e)
        out["after_bad"] = res(await env.step({"message": "again"}))
        out["state2"] = st(await env.state())
    return out


def generic_sync():
    out = {}
    with GenericEnvClient(base_url=URL).sync() as env:
        out["reset"] = res(env.reset(episode_id="core-generic-sync"))
        out["step"] = res(env.step(EchoAction(message="hello")))  # GenericEnvClient takes models too (model_dump)
        out["state"] = st(env.state())
        try: env.step({"msg": "x"}); out["bad"] = None
        except RuntimeError as e: out["bad"] = str(e)
        out["after_bad"] = res(env.step({"message": "again"}))
        out["state2"] = st(env.state())
    return out


def strict(model, data):
    "'ok' when openenv-core's response model accepts `data` as is, else the first error."
    try: model.model_validate(data); return "ok"
    except ValidationError as e: return str(e.errors()[0]["type"]) + " at " + ".".join(map(str, e.errors()[0]["loc"]))


def http():
    s = requests.Session()
    s.trust_env = False
    out = {}
    def call(name, method, path, model=None, **kw):
        r = s.request(method, URL + path, timeout=10, **kw)
        try: body = r.json()
        except ValueError: body = r.text
        out[name] = {"status": r.status_code, "body": body}
        if model is not None: out[name]["strict"] = strict(model, body)
    call("health", "GET", "/health", HealthResponse)
    call("metadata", "GET", "/metadata", EnvironmentMetadata)
    call("schema", "GET", "/schema", SchemaResponse)
    call("reset", "POST", "/reset", ResetResponse, json={"seed": 3, "episode_id": "http-1"})
    call("reset_nobody", "POST", "/reset", ResetResponse)
    call("step", "POST", "/step", StepResponse, json={"action": {"message": "hey"}})
    call("step_bad", "POST", "/step", json={"action": {"msg": "x"}})
    call("state", "GET", "/state", State)
    call("mcp", "POST", "/mcp", json={})
    call("openapi", "GET", "/openapi.json")
    out["openapi"]["body"] = {"info": out["openapi"]["body"].get("info"), "paths": sorted(out["openapi"]["body"].get("paths", {}))}
    return out


def validate():
    try: from openenv.cli._validation import validate_running_environment
    except ImportError as e: return {"error": f"no runtime validator: {e}"}
    return validate_running_environment(URL, timeout_s=10)


def guard(fn):
    try: return asyncio.run(fn()) if asyncio.iscoroutinefunction(fn) else fn()
    except Exception as e: return {"crashed": f"{type(e).__name__}: {e}"}


summary = {name: guard(fn) for name, fn in [("typed_async", typed_async), ("typed_sync", typed_sync),
           ("generic_async", generic_async), ("generic_sync", generic_sync), ("http", http), ("validate", validate)]}
print("SUMMARY " + json.dumps(summary, default=str))
'''


@pytest.fixture(scope="module")
def core_client_summary(core_py, echo_url, tmp_path_factory):
    """What OpenEnv's clients saw of our echo server (the JSON summary of `CORE_CLIENT`)."""
    script = tmp_path_factory.mktemp("core_client") / "core_client.py"
    script.write_text(CORE_CLIENT)
    r = subprocess.run([core_py, str(script), echo_url], capture_output=True, text=True, timeout=180,
                       env={**os.environ, **NO_PROXY_ENV}, stdin=subprocess.DEVNULL)
    lines = [l for l in r.stdout.splitlines() if l.startswith("SUMMARY ")]
    assert r.returncode == 0 and lines, f"the openenv-core client script failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return json.loads(lines[-1][len("SUMMARY "):])


@pytest.mark.parametrize("flavour", ["typed_async", "typed_sync", "generic_async", "generic_sync"])
def test_openenv_clients_run_episodes_on_our_server(core_client_summary, flavour):
    s = core_client_summary[flavour]
    assert "crashed" not in s, s
    typed = flavour.startswith("typed")
    obs = lambda r: {k: v for k, v in r["observation"].items() if k in ("echoed_message", "message_length")}
    assert obs(s["reset"]) == {"echoed_message": "Echo environment ready!", "message_length": 0}
    assert (s["reset"]["reward"], s["reset"]["done"]) == (0.0, False)
    assert obs(s["step"]) == {"echoed_message": "hello", "message_length": 5}
    assert s["step"]["reward"] == pytest.approx(0.5) and s["step"]["done"] is False
    if typed:  # OpenEnv's typed client builds its own observation from the envelope
        assert s["step"]["observation"]["type"] == "EchoObservation"
        assert s["step"]["observation"]["reward"] == pytest.approx(0.5) and s["step"]["observation"]["done"] is False
        assert s["state"]["type"] == "State"
    else:  # a GenericEnvClient sees the wire dict: the observation's own fields and, as openenv 0.10 sends it, its metadata
        assert s["step"]["observation"] == {"echoed_message": "hello", "message_length": 5,
                                            "metadata": {"original_message": "hello", "step": 1}}
    episode = f"core-{flavour.replace('_', '-')}"
    assert (s["state"]["episode_id"], s["state"]["step_count"]) == (episode, 1)
    # an invalid action: OpenEnv's client raises its RuntimeError with the code; the session goes on
    assert s["bad"] is not None and s["bad"].startswith("Server error: ") and "(code: VALIDATION_ERROR)" in s["bad"], s["bad"]
    assert obs(s["after_bad"]) == {"echoed_message": "again", "message_length": 5}
    assert (s["state2"]["episode_id"], s["state2"]["step_count"]) == (episode, 2)  # the failed step did not count


def test_openenv_http_view_of_our_server(core_client_summary):
    h = core_client_summary["http"]
    assert "crashed" not in h, h
    assert h["health"]["status"] == 200 and h["health"]["body"]["status"] == "healthy"
    for name in ("metadata", "state"):  # openenv-core's own models accept them
        assert h[name]["status"] == 200 and h[name]["strict"] == "ok", (name, h[name])
    # openenv 0.10's HTTP reset/step replies always carry a top-level `metadata`, which core 0.2.3's models forbid (only that)
    for name in ("reset", "reset_nobody", "step"):
        assert h[name]["status"] == 200 and h[name]["strict"] == "extra_forbidden at metadata", (name, h[name])
    # openenv 0.10's /schema also publishes `reset_observation`, which openenv-core 0.2.3's SchemaResponse forbids (only that)
    assert h["schema"]["status"] == 200 and h["schema"]["strict"] == "extra_forbidden at reset_observation", h["schema"]
    assert h["schema"]["body"]["reset_observation"] == h["schema"]["body"]["observation"]  # echo sets no reset_observation_cls
    assert set(h["metadata"]["body"]) == {"name", "description", "readme_content", "version", "author", "documentation_url"}
    assert h["schema"]["body"]["action"]["properties"]["message"]["type"] == "string"
    assert "message" in h["schema"]["body"]["action"].get("required", [])
    # openenv 0.10's HTTP replies: metadata inside `observation`, and always a top-level `metadata` (null when empty)
    assert h["reset"]["body"] == {"observation": {"echoed_message": "Echo environment ready!", "message_length": 0, "metadata": {}},
                                  "reward": 0.0, "done": False, "metadata": None}
    assert h["step"]["body"]["observation"] == {"echoed_message": "hey", "message_length": 3,
                                                "metadata": {"original_message": "hey", "step": 1}}
    assert h["step"]["body"]["metadata"] == {"original_message": "hey", "step": 1}
    assert h["step"]["body"]["reward"] == pytest.approx(0.3) and h["step"]["body"]["done"] is False
    assert h["step_bad"]["status"] == 422 and isinstance(h["step_bad"]["body"]["detail"], list)
    assert {tuple(e["loc"]) for e in h["step_bad"]["body"]["detail"]} == {("message",), ("msg",)}
    assert set(h["state"]["body"]) >= {"episode_id", "step_count"} and h["state"]["body"]["step_count"] == 0
    assert h["mcp"]["status"] == 200 and h["mcp"]["body"]["jsonrpc"] == "2.0" and h["mcp"]["body"]["error"]["code"] == -32600
    assert isinstance(h["openapi"]["body"]["info"]["version"], str)
    assert {"/health", "/metadata", "/schema", "/reset", "/step", "/state", "/mcp"} <= set(h["openapi"]["body"]["paths"])


def test_openenv_validate_url_passes_on_our_server(core_client_summary):
    v = core_client_summary["validate"]
    assert "crashed" not in v and "error" not in v, v
    failed = [c for c in v["criteria"] if not c["passed"]]
    assert v["passed"] is True and not failed, failed
    assert v["mode"] == "simulation" and v["standard_profile"] == "openenv-http/1.x"
    assert {c["id"] for c in v["criteria"]} == {"openapi_version_available", "health_endpoint", "metadata_endpoint",
                                                "schema_endpoint", "mcp_endpoint", "mode_endpoint_consistency"}


# --------------------------------------------------------------------------------------------------------------------
# 2. Our clients against an openenv-core server.
def test_our_typed_client_on_core_server(core_url):
    with EchoEnv(core_url).sync() as env:
        assert env.extensions == frozenset()  # their server announces nothing: we must send plain frames (no "id")
        r = env.reset(seed=5, episode_id="ours-on-core")
        assert isinstance(r.observation, EchoObservation)
        assert (r.observation.echoed_message, r.reward, r.done) == ("Echo environment ready!", 0.0, False)
        r = env.step(EchoAction(message="hi"))
        assert (r.observation.echoed_message, r.observation.message_length, r.done) == ("hi", 2, False)
        assert r.reward == pytest.approx(0.2) and r.observation.reward == pytest.approx(0.2)
        assert r.observation.metadata == {}  # openenv-core drops an observation's metadata from the envelope
        r = env.step({"message": "as a dict"})
        assert r.observation.echoed_message == "as a dict"
        s = env.state()
        assert isinstance(s, State) and (s.episode_id, s.step_count) == ("ours-on-core", 2)


def test_our_async_client_on_core_server(core_url):
    async def episode():
        async with EchoEnv(core_url) as env:
            assert env.extensions == frozenset()
            await env.reset(episode_id="async-on-core")
            results = await asyncio.gather(*(env.step(EchoAction(message=m)) for m in ("a", "bb", "ccc")))
            return [r.observation.echoed_message for r in results], await env.state()
    echoed, s = asyncio.run(episode())
    assert echoed == ["a", "bb", "ccc"]  # concurrent calls on one client are serialised, each gets its own reply
    assert (s.episode_id, s.step_count) == ("async-on-core", 3)


def test_our_generic_client_on_core_server(core_url):
    with GenericEnvClient(core_url).sync() as env:
        assert env.extensions == frozenset()
        r = env.reset(episode_id="generic-on-core")
        assert r.observation == {"echoed_message": "Echo environment ready!", "message_length": 0}
        r = env.step({"message": "hey"})
        assert r.observation == {"echoed_message": "hey", "message_length": 3} and r.reward == pytest.approx(0.3)
        with pytest.raises(EnvServerError) as e:
            env.step({"msg": "x"})
        assert e.value.code == "VALIDATION_ERROR"
        assert {tuple(x["loc"]) for x in e.value.data["errors"]} == {("message",), ("msg",)}
        r = env.step({"message": "still here"})  # the session goes on
        assert r.observation["echoed_message"] == "still here"
        assert env.state() == {"episode_id": "generic-on-core", "step_count": 2}


def test_our_http_clients_on_core_server(core_url):
    with EchoHTTPEnv(core_url) as env:
        assert env.health() == {"status": "healthy"}
        assert env.metadata()["name"] == "EchoEnvironment" and set(env.schema()) == {"action", "observation", "state"}
        r = env.reset(seed=1, episode_id="http-on-core")
        assert isinstance(r.observation, EchoObservation) and r.observation.echoed_message == "Echo environment ready!"
        r = env.step(EchoAction(message="hey"))
        assert (r.observation.echoed_message, r.observation.message_length) == ("hey", 3)
        assert r.reward == pytest.approx(0.3) and r.done is False
        s = env.state()
        assert isinstance(s, State) and s.step_count == 0  # HTTP is stateless in OpenEnv: a fresh environment
    with HTTPEnvClient(core_url) as raw:  # untyped: the invalid action reaches the server
        with pytest.raises(EnvServerError) as e:
            raw.step({"msg": "x"})
        assert e.value.code == "VALIDATION_ERROR"
        assert raw.step({"message": "ok"}).observation == {"echoed_message": "ok", "message_length": 2}


def test_our_client_timeout_on_core_server_drops_the_connection(core_url):
    env = EchoEnv(core_url, message_timeout_s=0.5).sync()
    try:
        env.reset(episode_id="slow")
        with pytest.raises(EnvTimeoutError) as e:  # the timeout, not the late reply, ends the call
            env.step(EchoAction(message="sleep 1.5"))
        assert "connection was closed" in str(e.value)  # no request ids there: a late reply could not be told apart
        assert env.async_client._ws is None
        with pytest.raises(EnvConnectionError, match="reset\\(\\) starts a new one"):  # the episode is gone: said, not hidden
            env.step(EchoAction(message="next"))
        env.reset(episode_id="fresh")  # a new connection, so a new session; not the late "sleep" reply
        r = env.step(EchoAction(message="next"))
        assert r.observation.echoed_message == "next"
        assert (env.state().step_count, env.state().episode_id) == (1, "fresh")
    finally: env.close()


# --------------------------------------------------------------------------------------------------------------------
# 3. Parity of the envelopes: the same raw frames to both servers.
LONG_ID = "x" * 300
WS_CASES = {  # name: frames sent on one connection (only the last frame's reply is compared)
    "reset_given_id": [{"type": "reset", "data": {"seed": 1, "episode_id": "e1"}}],
    "step": [{"type": "reset", "data": {"episode_id": "e1"}}, {"type": "step", "data": {"message": "hi"}}],
    "state": [{"type": "reset", "data": {"episode_id": "e1"}}, {"type": "step", "data": {"message": "hi"}}, {"type": "state"}],
    "state_before_reset_step_count": [{"type": "state"}],
    "step_before_reset": [{"type": "step", "data": {"message": "early"}}],
    "reset_without_data": [{"type": "reset"}],
    "reset_extra_key": [{"type": "reset", "data": {"episode_id": "e2", "foo": "bar"}}, {"type": "state"}],
    "step_empty_message": [{"type": "step", "data": {"message": ""}}],
    "step_unicode": [{"type": "step", "data": {"message": "héllo ✓"}}],
    "unknown_type": [{"type": "bogus"}],
    "type_not_string": [{"type": 5}],
    "no_type": [{}],
    "invalid_json": ["{not json"],
    "step_missing_data": [{"type": "step"}],
    "state_extra_field": [{"type": "state", "extra": 1}],
    "reset_data_not_object": [{"type": "reset", "data": [1]}],
    "reset_data_null": [{"type": "reset", "data": None}],
    "reset_seed_string": [{"type": "reset", "data": {"seed": "1", "episode_id": "e4"}}, {"type": "state"}],
    "step_timeout_outside_data": [{"type": "step", "data": {"message": "hi"}, "timeout_s": 1}],
    "close_extra_field": [{"type": "close", "x": 1}],
    "server_type_from_client": [{"type": "observation", "data": {}}],
    "action_unknown_field": [{"type": "step", "data": {"msg": "x"}}],
    "action_wrong_type": [{"type": "step", "data": {"message": 5}}],
    "action_metadata": [{"type": "step", "data": {"message": "m", "metadata": {"k": 1}}}],
    "session_goes_on_after_errors": ["{not json", {"type": "bogus"}, {"type": "step", "data": {"msg": 1}},
                                     {"type": "reset", "data": {"episode_id": "e3"}}, {"type": "step", "data": {"message": "x"}},
                                     {"type": "state"}],
    "close": [{"type": "close"}],
    # known differences (see KNOWN_WS_DIFFERENCES)
    "request_id": [{"type": "step", "data": {"message": "hi"}, "id": 7}],
    "ws_mcp_message": [{"type": "mcp", "data": {"jsonrpc": "2.0", "method": "tools/list", "id": 1}}],
    "reset_negative_seed": [{"type": "reset", "data": {"seed": -1}}],
    "reset_long_episode_id": [{"type": "reset", "data": {"episode_id": LONG_ID}}],
    "reset_float_seed": [{"type": "reset", "data": {"seed": 1.5}}],
    "json_not_object": ["[1, 2]"],
    "json_null": ["null"],
    "binary_frame": [b'{"type": "state"}'],
}

# Where ours differs from openenv-core 0.2.3 on purpose: case -> why. Any other difference fails the parity test.
KNOWN_WS_DIFFERENCES = {
    "request_id": "extension: ours echoes the `id` in the reply; openenv-core answers VALIDATION_ERROR (extra field)",
    "ws_mcp_message": "our echo is also an MCP tool environment: its tools; core's echo has none: -32603 'does not support MCP'",
    "reset_negative_seed": "ours validates WS reset data like HTTP /reset (seed >= 0): VALIDATION_ERROR; core resets",
    "reset_long_episode_id": "ours validates WS reset data like HTTP /reset (episode_id <= 255): VALIDATION_ERROR; core resets",
    "reset_float_seed": "ours validates WS reset data like HTTP /reset (seed is an int): VALIDATION_ERROR; core resets",
    "json_not_object": "core hits an AttributeError: SESSION_ERROR and closes the socket; ours: INVALID_JSON, stays open",
    "json_null": "core hits an AttributeError: SESSION_ERROR and closes the socket; ours: INVALID_JSON, stays open",
    "binary_frame": "core's receive_text raises KeyError: SESSION_ERROR and closes; ours: INVALID_JSON, stays open",
}

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


async def _exchange(url, frames):
    """Send `frames` on one raw connection; the replies (one per frame, except `close`), then whether it closed."""
    replies = []
    async with connect(ws_url(url), compression=None, max_size=None, open_timeout=10) as ws:
        for f in frames:
            await ws.send(f if isinstance(f, (str, bytes)) else json.dumps(f))
            if f == {"type": "close"}: break  # no reply to a close
            try: replies.append(json.loads(await asyncio.wait_for(ws.recv(), 5)))
            except ConnectionClosed: replies.append({"closed_before_reply": True}); break
        try:
            await asyncio.wait_for(ws.recv(), 0.3)
            extra = "unexpected frame"
        except ConnectionClosed as e: extra = f"closed {e.rcvd.code if e.rcvd else None}"
        except TimeoutError: extra = "open"
    return replies, extra


def _shape(reply: dict) -> dict:
    """What must match: everything but error text, pydantic's extras and random episode ids."""
    r = json.loads(json.dumps(reply))
    if r.get("type") == "error":
        d = r["data"]
        d["message"] = "<text>"
        if "errors" in d: d["errors"] = sorted((e["type"], tuple(e["loc"])) for e in d["errors"])
    if r.get("type") == "state" and UUID.match(str(r["data"].get("episode_id"))): r["data"]["episode_id"] = "<uuid>"
    return r


def _wire010(reply: dict, http: bool = False) -> dict:
    """Ours without the metadata that openenv 0.10's wire adds and core 0.2.3 drops, after checking it is placed as 0.10 places it:
    inside `observation` always, and copied to the top level when not empty (over HTTP always there, null when empty)."""
    d = reply.get("data", {}) if not http else reply
    if not isinstance(d, dict) or not isinstance(d.get("observation"), dict) or "done" not in d: return reply  # not an envelope
    obs = dict(d["observation"])
    assert "metadata" in obs, reply
    md = obs.pop("metadata")
    assert isinstance(md, dict) and d.get("metadata") == (md or None) and ("metadata" in d) == (http or bool(md)), reply
    d = {**{k: v for k, v in d.items() if k != "metadata"}, "observation": obs}
    return d if http else {**reply, "data": d}


def _run_cases(url):
    async def all_cases():  # one connection per case, all at once
        done = await asyncio.gather(*(_exchange(url, frames) for frames in WS_CASES.values()))
        return dict(zip(WS_CASES, done))
    return asyncio.run(all_cases())


def test_ws_envelope_parity(echo_url, core_url):
    ours, core = _run_cases(echo_url), _run_cases(core_url)
    # the protocol's example exchange, exactly (both servers)
    for side, md in ((ours, {"metadata": {}}), (core, {})):  # ours speaks openenv 0.10: metadata kept inside `observation`
        assert side["reset_given_id"][0] == [{"type": "observation", "data": {
            "observation": {"echoed_message": "Echo environment ready!", "message_length": 0, **md}, "reward": 0.0, "done": False}}]
        assert side["state"][0][-1] == {"type": "state", "data": {"episode_id": "e1", "step_count": 1}}
        assert side["unknown_type"][0] == [{"type": "error", "data": {"message": "Unknown message type: bogus", "code": "UNKNOWN_TYPE"}}]
        assert side["close"] == ([], "closed 1000")
    differ, texts = {}, {}
    for name in WS_CASES:
        (o, o_end), (c, c_end) = ours[name], core[name]
        if [_shape(_wire010(x)) for x in o] != [_shape(x) for x in c] or o_end != c_end:
            differ[name] = {"ours": (o[-1:], o_end), "core": (c[-1:], c_end)}
        for a, b in zip(o, c):
            if a.get("type") == b.get("type") == "error" and a["data"]["message"] != b["data"]["message"]:
                texts[name] = (a["data"]["message"], b["data"]["message"])
    print("\nerror texts that differ (ours, core):", json.dumps(texts, indent=1))
    print("known differences:", json.dumps({k: v for k, v in differ.items() if k in KNOWN_WS_DIFFERENCES}, indent=1, default=str))
    unexpected = {k: v for k, v in differ.items() if k not in KNOWN_WS_DIFFERENCES}
    assert not unexpected, json.dumps(unexpected, indent=1, default=str)
    stale = set(KNOWN_WS_DIFFERENCES) - set(differ)
    assert not stale, f"no longer different from openenv-core (remove from KNOWN_WS_DIFFERENCES): {sorted(stale)}"
    # the premise of our client's plain mode: openenv-core rejects an `id`, so we must never send one there
    assert core["request_id"][0][0]["data"]["code"] == "VALIDATION_ERROR"
    assert ours["request_id"][0][0] == {"type": "observation", "id": 7, "data": {
        "observation": {"echoed_message": "hi", "message_length": 2, "metadata": {"original_message": "hi", "step": 1}},
        "reward": pytest.approx(0.2), "done": False, "metadata": {"original_message": "hi", "step": 1}}}
    # codes agree wherever both answer with an error
    for name in WS_CASES:
        if name in KNOWN_WS_DIFFERENCES: continue
        for a, b in zip(ours[name][0], core[name][0]):
            assert a.get("type") == b.get("type") and a.get("data", {}).get("code") == b.get("data", {}).get("code"), name


HTTP_CASES = {  # name: (method, path, json body or raw text)
    "health": ("GET", "/health", None),
    "reset_empty": ("POST", "/reset", {}),
    "reset_no_body": ("POST", "/reset", None),
    "reset_given": ("POST", "/reset", {"seed": 1, "episode_id": "h1", "extra": 1}),
    "reset_negative_seed": ("POST", "/reset", {"seed": -1}),
    "reset_long_id": ("POST", "/reset", {"episode_id": LONG_ID}),
    "reset_not_json": ("POST", "/reset", "{nope"),
    "step": ("POST", "/step", {"action": {"message": "hi"}}),
    "step_extra_keys": ("POST", "/step", {"action": {"message": "hi"}, "timeout_s": 5, "request_id": "r1", "other": 1}),
    "step_bad_action": ("POST", "/step", {"action": {"msg": "x"}}),
    "step_no_action": ("POST", "/step", {}),
    "step_no_body": ("POST", "/step", None),
    "step_bad_timeout": ("POST", "/step", {"action": {"message": "hi"}, "timeout_s": 0}),
    "state": ("GET", "/state", None),
    "metadata_keys": ("GET", "/metadata", None),
    "schema_keys": ("GET", "/schema", None),
    "mcp_empty": ("POST", "/mcp", {}),
    "mcp_not_json": ("POST", "/mcp", "{nope"),
    "mcp_tools_list": ("POST", "/mcp", {"jsonrpc": "2.0", "method": "tools/list", "id": 1}),
    "mcp_unknown_method": ("POST", "/mcp", {"jsonrpc": "2.0", "method": "nope", "id": 2}),
    "mcp_session_create": ("POST", "/mcp", {"jsonrpc": "2.0", "method": "openenv/session/create", "params": {}, "id": 3}),
}

KNOWN_HTTP_DIFFERENCES = {
    "health": "extension: ours adds active_sessions and max_sessions (openenv-core's HealthResponse forbids extras)",
    "mcp_tools_list": "our echo is also an MCP tool environment (echo_message, echo_with_length); core's echo has no tools: -32603",
    "schema_keys": "openenv 0.10's /schema also publishes `reset_observation`; core 0.2.3 has no such key",
}


def _http_shape(r: requests.Response, name: str, ours: bool = False):
    try: body = r.json()
    except ValueError: return r.status_code, "<not json>"
    if ours and r.status_code == 200: body = _wire010(body, http=True)  # checked as 0.10 places it, then as core sends it
    if r.status_code == 422: return r.status_code, sorted((e["type"], tuple(e["loc"])) for e in body["detail"])
    if name in ("metadata_keys", "schema_keys"): return r.status_code, sorted(body)
    if name == "state": return r.status_code, sorted(body), body["step_count"]
    if "jsonrpc" in body:
        return r.status_code, sorted(body), body.get("id"), (body.get("error") or {}).get("code"), sorted(body.get("result") or {})
    return r.status_code, body


def test_http_parity(echo_url, core_url):
    s = requests.Session()
    s.trust_env = False
    differ = {}
    for name, (method, path, body) in HTTP_CASES.items():
        kw = {"data": body, "headers": {"content-type": "application/json"}} if isinstance(body, str) else \
             {"json": body} if body is not None else {}
        o = _http_shape(s.request(method, echo_url + path, timeout=10, **kw), name, ours=True)
        c = _http_shape(s.request(method, core_url + path, timeout=10, **kw), name)
        if o != c: differ[name] = {"ours": o, "core": c}
    print("\nknown HTTP differences:", json.dumps({k: v for k, v in differ.items() if k in KNOWN_HTTP_DIFFERENCES}, indent=1, default=str))
    unexpected = {k: v for k, v in differ.items() if k not in KNOWN_HTTP_DIFFERENCES}
    assert not unexpected, json.dumps(unexpected, indent=1, default=str)
    stale = set(KNOWN_HTTP_DIFFERENCES) - set(differ)
    assert not stale, f"no longer different from openenv-core (remove from KNOWN_HTTP_DIFFERENCES): {sorted(stale)}"
