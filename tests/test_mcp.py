"""Tool environments across processes: the official MCP SDK's client (2.x here, 1.x from the upstream venv) over
Streamable HTTP; upstream-style environment code (`fastmcp`, the `mcp` SDK) running on our `MCPEnvironment`; our
`MCPToolClient` against a real `openenv` 0.10 server; and, once the server takes `mcp` messages, OpenEnv's own
`MCPToolClient` against ours."""
import asyncio
import importlib.metadata
import json
import os
import subprocess
import time
from pathlib import Path

import fastcore
import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from conftest import need
from openenv_nb import actions
from openenv_nb.mcp import PROTOCOL_VERSIONS, CallToolAction, CallToolObservation, ListToolsAction, MCPEchoEnvironment, rpc, tool
from openenv_nb.mcp_client import MCPError, MCPToolClient
from openenv_nb.server import bind, create_app, serve_in_thread

ROOT = Path(__file__).resolve().parent.parent
LOCAL = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}

try:
    import mcp as mcp_sdk
    from mcp import ClientSession
    from mcp.client import streamable_http
except ImportError as e:
    mcp_sdk, NO_SDK = None, e


class Tools(MCPEchoEnvironment):
    "The echo tools, and two that fail."
    @tool
    def fail(self, why: str) -> str:
        "Always raises."
        raise ValueError(why)

    @tool
    async def add(self, a: int, b: int = 2) -> int:
        "Add two integers."
        return a + b


def mcp_app(env) -> FastAPI:
    "`POST /mcp` answered by `rpc`, as `server` is to answer it: a JSON body, or 202 for a notification."
    app = FastAPI()
    @app.post("/mcp")
    async def endpoint(request: Request):
        reply = await rpc(env, await request.body(), protocol=request.headers.get("mcp-protocol-version"))
        return Response(status_code=202) if reply is None else JSONResponse(reply)
    return app


@pytest.fixture(scope="module")
def mcp_url():
    with serve_in_thread(mcp_app(Tools())) as base: yield base + "/mcp"


def run_py(python: str, code: str, timeout: float = 240, **env) -> dict:
    "What `code`, run with `python`, prints last, as JSON; an `AssertionError` with its stderr when it fails."
    r = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=timeout, env={**LOCAL, **env})
    assert r.returncode == 0, f"{python} failed:\n{r.stderr[-4000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------------------------------
# The official MCP SDK's client, over Streamable HTTP.

async def sdk_session(url: str) -> dict:
    "List and call tools with the SDK's `ClientSession` over its Streamable HTTP transport; what came back."
    transport = getattr(streamable_http, "streamable_http_client", None) or streamable_http.streamablehttp_client
    out = {}
    async with transport(url) as streams, ClientSession(streams[0], streams[1]) as s:
        init = await s.initialize()
        out["version"] = getattr(init, "protocol_version", None) or init.protocolVersion
        out["tools"] = [t.name for t in (await s.list_tools()).tools]
        hi = await s.call_tool("echo_message", {"message": "hi"})
        out["hi"] = (hi.content[0].text, getattr(hi, "is_error", getattr(hi, "isError", None)))
        out["added"] = (await s.call_tool("add", {"a": 40})).content[0].text
        failed = await s.call_tool("fail", {"why": "no"})
        out["failed"] = (getattr(failed, "is_error", getattr(failed, "isError", None)), failed.content[0].text)
        try: await s.call_tool("echo_message", {"message": 3}); out["invalid"] = None
        except Exception as e: out["invalid"] = str(e)
    return out


@pytest.fixture
def sdk(monkeypatch):
    "The official MCP SDK, talking to 127.0.0.1 directly whatever proxy the environment names."
    need("mcp", mcp_sdk is not None, f"the official MCP SDK is not installed: pip install mcp ({'' if mcp_sdk else NO_SDK})")
    for k in ("NO_PROXY", "no_proxy"): monkeypatch.setenv(k, "127.0.0.1,localhost")
    return mcp_sdk


def test_sdk_client_lists_and_calls_tools(mcp_url, sdk):
    got = asyncio.run(sdk_session(mcp_url))
    assert got["version"] in PROTOCOL_VERSIONS
    assert got["tools"] == ["echo_message", "echo_with_length", "fail", "add"]
    assert got["hi"] == ("hi", False) and got["added"] == "42"
    assert got["failed"] == (True, "Error calling tool 'fail': no")  # an MCP client reads a tool's failure as a result
    assert "Invalid arguments for tool 'echo_message'" in got["invalid"]


def test_sdk_high_level_client(mcp_url, sdk):
    "mcp 2's `Client` probes `server/discover` first; our -32601 sends it to the `initialize` handshake."
    try: from mcp.client.client import Client
    except ImportError: pytest.skip(f"mcp {importlib.metadata.version('mcp')} has no high-level `Client` (it came in mcp 2)")
    async def go():
        async with Client(mcp_url) as c:
            return [t.name for t in (await c.list_tools()).tools], (await c.call_tool("echo_with_length", {"message": "abc"})).structured_content
    names, structured = asyncio.run(go())
    assert names[:2] == ["echo_message", "echo_with_length"] and structured == {"message": "abc", "length": 3}


SDK1 = r'''
import asyncio, json, sys
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client

async def main(url):
    async with streamablehttp_client(url) as (read, write, _), ClientSession(read, write) as s:
        init = await s.initialize()
        tools = [t.name for t in (await s.list_tools()).tools]
        r = await s.call_tool("echo_with_length", {"message": "sdk1"})
        bad = await s.call_tool("fail", {"why": "x"})
        return {"version": init.protocolVersion, "tools": tools, "structured": r.structuredContent, "error": bad.isError}

print(json.dumps(asyncio.run(main(sys.argv[1]))))
'''


@pytest.mark.upstream
def test_sdk_1x_client_from_the_upstream_venv(mcp_url, upstream_py):
    "The upstream venv carries mcp 1.x (openenv 0.10 needs it): its client speaks the 2025 handshake to the same route."
    r = subprocess.run([upstream_py, "-c", SDK1, mcp_url], capture_output=True, text=True, timeout=240, env=LOCAL)
    assert r.returncode == 0, r.stderr[-4000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["tools"] == ["echo_message", "echo_with_length", "fail", "add"]
    assert got["structured"] == {"message": "sdk1", "length": 4} and got["error"] is True
    assert got["version"] in PROTOCOL_VERSIONS


# ---------------------------------------------------------------------------------------------------------------------
# Upstream-style environment code on our MCPEnvironment, in the upstream venv (which has fastmcp and mcp 1.x).
# Written here as upstream's echo environment is written: a FastMCP server built in `__init__`, handed to the base
# class, `_step_impl` for other actions, its own `State` counted in `step`. Only the imports name openenv_nb.

PORTED = r'''
import asyncio, json
from uuid import uuid4
from fastmcp import FastMCP
from mcp.server.fastmcp import FastMCP as SdkFastMCP
from openenv_nb.mcp import MCPEnvironment, CallToolAction, ListToolsAction
from openenv_nb.types import Observation, State


class Echo(MCPEnvironment):
    def __init__(self):
        server = FastMCP("echo_env")

        @server.tool
        def echo_message(message: str) -> str:
            """
            Send the message back.

            Args:
                message: what to send back
            """
            return message

        @server.tool
        def echo_with_length(message: str) -> dict:
            """Send the message back with its length."""
            return {"message": message, "length": len(message)}

        super().__init__(server)
        self._state = State(episode_id=str(uuid4()), step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs):
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return Observation(done=False, reward=0.0, metadata={"status": "ready"})

    def _step_impl(self, action, timeout_s=None, **kwargs):
        return Observation(metadata={"error": f"Unknown action type: {type(action).__name__}"})

    def step(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        return super().step(action, timeout_s=timeout_s, **kwargs)

    async def step_async(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        return await super().step_async(action, timeout_s=timeout_s, **kwargs)

    @property
    def state(self):
        return self._state


class Sdk(MCPEnvironment):
    def __init__(self):
        server = SdkFastMCP("sdk")

        @server.tool()
        def add(a: int, b: int = 2) -> int:
            "Add two integers."
            return a + b

        super().__init__(server)

    def reset(self, **kwargs): return Observation()
    @property
    def state(self): return State()


env, out = Echo(), {}
out["tools"] = [t.model_dump() for t in env.step(ListToolsAction()).tools]
out["sync"] = env.step(CallToolAction(tool_name="echo_with_length", arguments={"message": "hi"})).result.data
out["async"] = asyncio.run(env.step_async(CallToolAction(tool_name="echo_message", arguments={"message": "yo"}))).result.data
out["bad"] = env.step(CallToolAction(tool_name="echo_message", arguments={})).error.error_type
out["count"] = env.state.step_count
out["sdk"] = [Sdk().list_tools()[0].model_dump(), Sdk().call_tool("add", {"a": 1}).data]
try:
    reserved = FastMCP("r")
    @reserved.tool
    def step(x: int) -> int: return x
    class Reserved(MCPEnvironment):
        def __init__(self): super().__init__(reserved)
    Reserved(); out["reserved"] = None
except ValueError as e: out["reserved"] = str(e)
print(json.dumps(out))
'''


@pytest.mark.upstream
def test_upstream_environment_code_runs_on_ours(upstream_py, tmp_path):
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "fastcore").symlink_to(Path(fastcore.__file__).parent)  # the upstream venv has pydantic, not fastcore
    got = run_py(upstream_py, PORTED, PYTHONPATH=f"{shim}{os.pathsep}{ROOT}")
    message = {"type": "string", "description": "what to send back"}
    assert got["tools"][0] == {"name": "echo_message", "description": "Send the message back.", "input_schema":
                               {"additionalProperties": False, "properties": {"message": message}, "required": ["message"], "type": "object"}}
    assert got["tools"][1]["name"] == "echo_with_length"
    assert (got["sync"], got["async"], got["bad"], got["count"]) == ({"message": "hi", "length": 2}, "yo", "invalid_args", 4)
    assert got["sdk"] == [{"name": "add", "description": "Add two integers.", "input_schema":
                           {"properties": {"a": {"type": "integer"}, "b": {"default": 2, "type": "integer"}}, "required": ["a"], "type": "object"}}, 3]
    assert "cannot be named 'step'" in got["reserved"]


# ---------------------------------------------------------------------------------------------------------------------
# Our MCPToolClient against a real openenv 0.10 server (upstream's MCPEnvironment, fastmcp tools), in a subprocess.

UPSTREAM_SERVER = r'''
import sys, uvicorn
from fastmcp import FastMCP
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Observation, State


class Tiny(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        server = FastMCP("tiny")

        @server.tool
        def echo_message(message: str) -> str:
            "Send the message back."
            return message

        @server.tool
        def echo_with_length(message: str) -> dict:
            "Send the message back with its length."
            return {"message": message, "length": len(message)}

        @server.tool
        def fail(why: str) -> str:
            "Always raises."
            raise ValueError(why)

        super().__init__(server)
        self._state = State(episode_id="first", step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs):
        self._state = State(episode_id=episode_id or "ep", step_count=0)
        return Observation(reward=0.0, metadata={"ready": True})

    def step(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        return super().step(action, timeout_s=timeout_s, **kwargs)

    async def step_async(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        return await super().step_async(action, timeout_s=timeout_s, **kwargs)

    def _step_impl(self, action, timeout_s=None, **kwargs): return Observation(metadata={"other": True})

    @property
    def state(self): return self._state


app = create_app(Tiny, CallToolAction, CallToolObservation, env_name="tiny", max_concurrent_envs=4)
uvicorn.run(app, fd=int(sys.argv[1]), log_level="warning")
'''


@pytest.fixture(scope="module")
def upstream_server(upstream_py):
    "Base URL of an openenv 0.10 server of a tool environment, on a socket this test bound (no port race)."
    sock = bind()
    p = subprocess.Popen([upstream_py, "-c", UPSTREAM_SERVER, str(sock.fileno())], pass_fds=[sock.fileno()],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=LOCAL)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()  # the server holds its own copy
    try:
        deadline = time.monotonic() + 240  # openenv takes long to import on a busy machine
        while True:
            assert p.poll() is None, f"the upstream server exited:\n{p.stderr.read()[-4000:]}"
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200: break
            except httpx.HTTPError: pass
            assert time.monotonic() < deadline, "the upstream server did not answer /health within 240 s"
            time.sleep(0.25)
        yield url
    finally:
        p.terminate()
        try: p.wait(timeout=30)
        except subprocess.TimeoutExpired: p.kill()


@pytest.mark.upstream
def test_our_client_against_upstream_server(upstream_server):
    async def go():
        async with MCPToolClient(upstream_server) as env:
            first = await env.reset(episode_id="e1")
            tools = await env.list_tools()
            got = dict(reset=(first.reward, first.observation.metadata), tools=[t.name for t in tools],
                       schema=tools[0].input_schema["properties"]["message"], hi=await env.call_tool("echo_message", message="hi"),
                       length=await env.call_tool("echo_with_length", message="four"), has=(await env.has_tool("fail"), await env.has_tool("x")))
            errors = []
            for name, args in (("fail", {"why": "no"}), ("nope", {}), ("echo_message", {})):
                with pytest.raises(MCPError) as e: await env.call_tool(name, **args)
                errors.append(str(e.value))
            got["errors"] = errors
            step = await env.step(CallToolAction(tool_name="echo_with_length", arguments={"message": "abc"}))
            got["step"] = (step.observation.tool_name, step.observation.result.data)
            got["failed_step"] = (await env.step(CallToolAction(tool_name="fail", arguments={"why": "x"}))).observation.error.error_type
            got["listed"] = len((await env.step(ListToolsAction())).observation.tools)
            got["state"] = (await env.state()).model_dump()
            return got
    got = asyncio.run(go())
    assert got["reset"] == (0.0, {"ready": True})
    assert got["tools"] == ["echo_message", "echo_with_length", "fail"] and got["schema"] == {"type": "string"}
    assert (got["hi"], got["length"], got["has"]) == ("hi", {"message": "four", "length": 4}, (True, False))
    assert "Tool 'fail' failed: Error calling tool 'fail': no" in got["errors"][0]
    assert "Unknown tool: 'nope'" in got["errors"][1] and "message" in got["errors"][2]
    assert got["step"] == ("echo_with_length", {"message": "abc", "length": 3}) and got["failed_step"] == "execution_error"
    assert got["listed"] == 3
    assert got["state"] == {"episode_id": "e1", "step_count": 3}  # tools/call is not a step; the three steps are


@pytest.mark.upstream
def test_our_sync_client_against_upstream_server(upstream_server):
    with MCPToolClient(upstream_server).sync() as env:
        assert [t.name for t in env.list_tools()][:2] == ["echo_message", "echo_with_length"]
        assert env.call_tool("echo_message", message="sync") == "sync"
        assert env.get_tool("fail").description == "Always raises." and env.get_tool("nope") is None
        with pytest.raises(RuntimeError, match="Tool 'fail' failed"): env.call_tool("fail", why="no")


# ---------------------------------------------------------------------------------------------------------------------
# Against our own server: these wait for `server` to take `mcp` messages (issue 14's plug-in of `rpc`).

def served_tools() -> bool: return "mcp" in getattr(actions, "KINDS", {})


UPSTREAM_CLIENT = r'''
import json, sys
from openenv.core.mcp_client import MCPToolClient

with MCPToolClient(base_url=sys.argv[1]).sync() as env:
    env.reset()
    out = {"tools": [t.name for t in env.list_tools()], "hi": env.call_tool("echo_message", message="hi"),
           "length": env.call_tool("echo_with_length", message="Test")}
    try: env.call_tool("nope"); out["error"] = None
    except RuntimeError as e: out["error"] = str(e)
print(json.dumps(out))
'''


def test_our_client_against_our_server():
    if not served_tools(): pytest.skip("the server does not take `mcp` messages yet (issue 14: plug `mcp.rpc` into `actions.KINDS`)")
    with serve_in_thread(create_app(Tools, max_concurrent_envs=4)) as url, MCPToolClient(url).sync() as env:
        env.reset()
        assert [t.name for t in env.list_tools()] == ["echo_message", "echo_with_length", "fail", "add"]
        assert env.call_tool("add", a=1) == 3 and env.call_tool("echo_message", message="x") == "x"
        with pytest.raises(MCPError) as e: env.call_tool("add", a="x")
        assert e.value.code == -32602
        assert env.step(CallToolAction(tool_name="echo_message", arguments={"message": "s"})).observation.result.data == "s"


def has_http_sessions(url: str) -> bool:
    "Whether the server at `url` makes HTTP MCP sessions (upstream's `openenv/session/create`); closes the one it made."
    made = httpx.post(url + "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create"}).json()
    if "result" not in made: return False
    closed = httpx.post(url + "/mcp", json={"jsonrpc": "2.0", "id": 2, "method": "openenv/session/close", "params": made["result"]}).json()
    assert closed["result"] == {**made["result"], "closed": True}
    return True


@pytest.mark.upstream
def test_upstream_client_against_our_server(upstream_py, monkeypatch):
    "OpenEnv's `MCPToolClient` makes an HTTP session, attaches its WebSocket to it, and calls tools over `POST /mcp`."
    for k in ("NO_PROXY", "no_proxy"): monkeypatch.setenv(k, "127.0.0.1,localhost")
    with serve_in_thread(create_app(MCPEchoEnvironment, max_concurrent_envs=4)) as url:
        if not has_http_sessions(url): pytest.skip("the server has no HTTP MCP sessions yet (issue 14: `openenv/session/create` and `/ws?session_id=`)")
        r = subprocess.run([upstream_py, "-c", UPSTREAM_CLIENT, url], capture_output=True, text=True, timeout=240, env=LOCAL)
    assert r.returncode == 0, r.stderr[-4000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["tools"] == ["echo_message", "echo_with_length"]
    assert (got["hi"], got["length"]) == ("hi", {"message": "Test", "length": 4})
    assert "Tool 'nope' failed" in got["error"]


# ---------------------------------------------------------------------------------------------------------------------
# Idle HTTP sessions, tool time limits, and a private server.

def rpc_body(method: str, rid: int = 1, **params) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})


def test_idle_http_session_is_reaped_and_frees_its_slot():
    "An HTTP MCP session unused for `session_timeout` is closed by the reaper (awaited here: no sleep), and its slot is free."
    from openenv_nb.actions import Hub
    from openenv_nb.mcp_sessions import reap_idle, rpc_once, serve_tools

    async def run():
        hub = Hub(MCPEchoEnvironment, CallToolAction, CallToolObservation, max_sessions=1, session_timeout=0.05)
        serve_tools(hub, MCPEchoEnvironment)
        sid = (await rpc_once(hub, rpc_body("openenv/session/create")))["result"]["session_id"]
        assert (await rpc_once(hub, rpc_body("openenv/session/create", 2)))["error"]["code"] == -32000  # full
        await asyncio.wait_for(hub.reaper, 10)  # the reaper ends with the last session
        assert (hub.sessions, hub.active) == ({}, 0)
        gone = await rpc_once(hub, rpc_body("tools/call", 3, name="echo_message", arguments={"message": "x"}, session_id=sid))
        assert gone["error"]["message"] == f"Unknown session_id: {sid}"
        again = (await rpc_once(hub, rpc_body("openenv/session/create", 4)))["result"]["session_id"]
        # a call on the session counts as use: judged by an injected clock, it is idle only `session_timeout` after it
        hub.reaper.cancel()
        hub.session_timeout = 60
        before = time.monotonic()
        assert (await rpc_once(hub, rpc_body("tools/call", 5, name="echo_message", arguments={"message": "y"}, session_id=again)))["result"]["data"] == "y"
        assert await reap_idle(hub, now=before + 59) == []
        assert await reap_idle(hub, now=time.monotonic() + 60) == [again]
        assert hub.active == 0
    asyncio.run(run())


def test_idle_http_session_reaped_on_a_real_server():
    "Over HTTP: a session made and left alone is reaped, after which a new one fits in the only slot."
    with serve_in_thread(create_app(MCPEchoEnvironment, max_concurrent_envs=1, session_timeout=0.2)) as url:
        post = lambda body: httpx.post(url + "/mcp", content=body, headers={"content-type": "application/json"}, timeout=10).json()
        sid = post(rpc_body("openenv/session/create"))["result"]["session_id"]
        assert "error" in post(rpc_body("openenv/session/create", 2))
        deadline = time.monotonic() + 20  # wait for the condition (the reaper acts after 0.2 s), never a fixed sleep
        while httpx.get(url + "/health").json()["active_sessions"] and time.monotonic() < deadline: time.sleep(0.02)
        assert httpx.get(url + "/health").json()["active_sessions"] == 0
        assert "error" in post(rpc_body("tools/call", 3, name="echo_message", arguments={"message": "x"}, session_id=sid))
        assert "result" in post(rpc_body("openenv/session/create", 4))


def test_closing_an_attached_session_waits_for_its_socket():
    "A session closed while `/ws?session_id=` holds it answers `closing`, keeps serving the socket, and goes when the socket does."
    from websockets.sync.client import connect
    with serve_in_thread(create_app(MCPEchoEnvironment, max_concurrent_envs=1)) as url:
        post = lambda body: httpx.post(url + "/mcp", content=body, headers={"content-type": "application/json"}, timeout=10).json()
        sid = post(rpc_body("openenv/session/create"))["result"]["session_id"]
        with connect(url.replace("http", "ws") + f"/ws?session_id={sid}", open_timeout=10) as ws:
            ask = lambda frame: (ws.send(json.dumps(frame)), json.loads(ws.recv(timeout=20)))[1]
            mine = ask({"type": "mcp", "data": json.loads(rpc_body("openenv/session/create"))})["data"]
            assert mine["result"]["session_id"] == sid  # the socket's own session, as upstream answers
            own = ask({"type": "mcp", "data": json.loads(rpc_body("openenv/session/close", session_id=sid))})["data"]
            assert own["error"]["code"] == -32600
            assert post(rpc_body("openenv/session/close", 2, session_id=sid))["result"] == {"session_id": sid, "closed": False, "closing": True}
            step = ask({"type": "step", "data": {"type": "call_tool", "tool_name": "echo_message", "arguments": {"message": "on"}}})
            assert step["data"]["observation"]["result"]["data"] == "on"
        deadline = time.monotonic() + 20  # wait for the condition (the socket's end reaching the server), never a fixed sleep
        while httpx.get(url + "/health").json()["active_sessions"] and time.monotonic() < deadline: time.sleep(0.02)
        assert httpx.get(url + "/health").json()["active_sessions"] == 0
        assert post(rpc_body("openenv/session/close", 3, session_id=sid))["error"]["message"] == f"Unknown session_id: {sid}"


class Hangs(MCPEchoEnvironment):
    "The echo tools, and an async tool that never answers."
    tool_timeout_s = 0.2

    @tool
    async def hang(self) -> str:
        "Waits forever."
        await asyncio.Event().wait()
        return "never"


def test_hanging_async_tool_times_out_and_the_session_goes_on():
    "`tool_timeout_s` holds for async tools: as a step, as an `mcp` message and over `POST /mcp`; the session keeps serving."
    from websockets.sync.client import connect
    with serve_in_thread(create_app(Hangs, max_concurrent_envs=2)) as url, \
         connect(url.replace("http", "ws") + "/ws", open_timeout=10) as ws:
        ask = lambda frame: (ws.send(json.dumps(frame)), json.loads(ws.recv(timeout=20)))[1]
        step = lambda name, **args: ask({"type": "step", "data": {"type": "call_tool", "tool_name": name, "arguments": args}})
        call = lambda name, **args: ask({"type": "mcp", "data": json.loads(rpc_body("tools/call", name=name, arguments=args))})
        ask({"type": "reset", "data": {}})
        hung = step("hang")["data"]["observation"]["error"]
        assert hung == {"error_type": "timeout", "message": "Tool 'hang' timed out after 0.2 seconds"}
        assert step("echo_message", message="still here")["data"]["observation"]["result"]["data"] == "still here"
        err = call("hang")["data"]["error"]
        assert (err["code"], err["message"]) == (-32603, "Tool 'hang' timed out after 0.2 seconds")
        assert call("echo_message", message="and here")["data"]["result"]["data"] == "and here"
        assert ask({"type": "state"})["data"]["step_count"] == 2
        over_http = httpx.post(url + "/mcp", content=rpc_body("tools/call", name="hang", arguments={}), timeout=20).json()
        assert "timed out after 0.2 seconds" in over_http["error"]["message"]
        assert httpx.get(url + "/health").json()["active_sessions"] == 1  # the HTTP call gave its slot back


def test_mcp_tool_client_token_and_headers():
    "`MCPToolClient` takes `token=` and `headers=` as the other clients do: a private server lets it in, and only it."
    with serve_in_thread(create_app(MCPEchoEnvironment, max_concurrent_envs=2, token="s3cret")) as url:
        with MCPToolClient(url, token="s3cret", headers={"X-Trace": "t1"}).sync() as env:
            assert env.call_tool("echo_message", message="let in") == "let in"
        with pytest.raises(Exception), MCPToolClient(url, token="", connect_timeout_s=2).sync() as env:
            env.list_tools()


def test_mcp_style_step_on_an_environment_without_tools():
    "Upstream's test_mcp_style_step_handles_partial_step_async: `tools/list` and `tools/call` on POST /mcp and over /ws reach the step of a plain environment served with tool actions."
    from openenv_nb.environment import Environment
    from openenv_nb.mcp import ListToolsObservation, ToolResult
    from openenv_nb.types import Observation, State

    class ByStep(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True
        def __init__(self):
            async def step_async(action, **kwargs):  # set on the instance, as upstream's test does
                if isinstance(action, ListToolsAction): return ListToolsObservation(tools=[])
                return CallToolObservation(tool_name=action.tool_name, result=ToolResult(data=action.arguments))
            self.step_async = step_async
        def reset(self, **kwargs): return Observation()
        def step(self, action, **kwargs): return Observation()
        @property
        def state(self): return State()

    with serve_in_thread(create_app(ByStep, CallToolAction, CallToolObservation)) as url:
        post = lambda body: httpx.post(url + "/mcp", content=body, headers={"content-type": "application/json"}, timeout=10).json()
        assert post(rpc_body("tools/list"))["result"] == {"tools": []}
        called = post(rpc_body("tools/call", 2, name="submit", arguments={"answer": 4}))["result"]
        assert (called["tool_name"], called["result"]["data"]) == ("submit", {"answer": 4})
    from openenv_nb.envs.echo import EchoAction, EchoObservation
    with serve_in_thread(create_app(ByStep, EchoAction, EchoObservation)) as url:  # served with its own actions: no MCP, as upstream
        assert httpx.post(url + "/mcp", content=rpc_body("tools/list"), timeout=10).json()["error"]["message"] == "Environment does not support MCP"
