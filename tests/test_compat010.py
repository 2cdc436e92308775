"""Compatibility with Meta's `openenv` 0.10.0 (PyPI), both ways, over HTTP and WebSocket.

1. Upstream's clients against OUR servers: `GenericEnvClient` (plain sync calls, as 0.10 allows), typed `EnvClient`
   subclasses written the way users write them on openenv's base classes, `MCPToolClient`, and upstream's response
   models, all run in the upstream venv (`tests/upstream_venv.py`). Every scenario runs twice, against our servers and
   against upstream's own (`bench/upstream_echo_server.py`), so upstream's answer is the reference next to ours.
2. OUR clients (`EnvClient`, `GenericEnvClient`, `HTTPEnvClient`, `MCPToolClient`) against upstream's `create_app`
   servers.
3. Parity: the same raw frames and requests to both servers get the same replies, apart from random ids; where ours
   differs on purpose it is listed in `KNOWN_DIFFERENCES`, and any other difference fails.
4. Upstream's own over-the-wire tests (task API, `state_cls` / `reset_observation_cls` schemas, production mode, MCP
   over HTTP and WS, capacity, headers, the WebSocket flow), their assertions restated here against our server.

Servers are shared per module. Without the upstream venv, the tests that need it skip (or fail where OPENENV_REQUIRE
names `upstream`); the tests of our server alone still run.
"""
import asyncio
import json
import os
import re
import signal
import subprocess
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests
from pydantic import Field
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from conftest import ROOT, need
from openenv_nb.client import EnvClient, GenericEnvClient, HTTPEnvClient, ws_url
from openenv_nb.environment import Environment
from openenv_nb.envs.echo import EchoAction, EchoEnv, EchoEnvironment, EchoHTTPEnv, EchoObservation
from openenv_nb.mcp import MCPEchoEnvironment
from openenv_nb.mcp_client import MCPToolClient
from openenv_nb.providers import LocalProcessProvider
from openenv_nb.server import create_app, serve_in_thread
from openenv_nb.types import Action, EnvConnectionError, EnvServerError, Observation, State, StepResult

pytestmark = pytest.mark.upstream

NO_PROXY_ENV = {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
TOKEN = "secret-token"
UPSTREAM_SERVER = ROOT / "bench" / "upstream_echo_server.py"
UPSTREAM_APPS = ("echo", "echo1", "production", "private", "private_mcp", "probe", "probe_plain", "mcp")
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


# --------------------------------------------------------------------------------------------------------------------
# The probe environment, on our base classes; `bench/upstream_echo_server.py` has its twin on upstream's. It keeps its
# reset keyword arguments in a `State` subclass, returns a reset observation of its own class and lists tasks.
class ProbeAction(Action):
    message: str


class ProbeObservation(Observation):
    echoed_message: str = ""
    message_length: int = 0


class ProbeReady(Observation):
    ready: bool = True
    task_name: str | None = None


class ProbeState(State):
    counter: int = 0
    history: list[str] = Field(default_factory=list)
    reset_kwargs: dict = Field(default_factory=dict)


PROBE_TASKS = {"train": ["alpha", "beta", "gamma"], "holdout": ["delta"]}


class ProbeEnvironment(Environment[ProbeAction, ProbeObservation, ProbeState]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = ProbeState(episode_id="fresh", step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs):
        self._state = ProbeState(episode_id=episode_id or "probe-episode", step_count=0, reset_kwargs=dict(kwargs))
        return ProbeReady(task_name=kwargs.get("task_name"), reward=0.0, metadata={"reset_kwargs": dict(kwargs)} if kwargs else {})

    def step(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        self._state.counter += 1
        self._state.history = [*self._state.history, action.message]
        return ProbeObservation(echoed_message=action.message, message_length=len(action.message), reward=len(action.message) * 0.1,
                                done=action.message == "finish", metadata={"counter": self._state.counter})

    @property
    def state(self): return self._state

    def list_splits(self): return list(PROBE_TASKS)
    def list_tasks(self, split): return [{"id": f"{split}-{i}", "word": w} for i, w in enumerate(PROBE_TASKS[split])]
    def num_tasks(self, split): return len(PROBE_TASKS[split])

    def get_task(self, split, index):
        if not 0 <= index < len(PROBE_TASKS[split]): raise IndexError(index)
        return self.list_tasks(split)[index]

    def get_task_range(self, split, start=None, stop=None): return self.list_tasks(split)[slice(start, stop)]


class PlainEnvironment(Environment[ProbeAction, ProbeObservation, State]):
    """No task methods at all."""
    def __init__(self): super().__init__(); self._state = State(episode_id="plain")
    def reset(self, seed=None, episode_id=None, **kwargs): return ProbeObservation()
    def step(self, action, timeout_s=None, **kwargs): return ProbeObservation(echoed_message=action.message)
    @property
    def state(self): return self._state


# --------------------------------------------------------------------------------------------------------------------
# Servers.
class Servers(dict):
    """Base URLs by name; `url(name)` fails the test with the reason when that server could not be made."""
    def __init__(self):
        super().__init__()
        self.errors = {}

    def url(self, name):
        if name not in self: pytest.fail(f"no {name!r} server: {self.errors.get(name, 'not started')}")
        return self[name]


def our_apps():
    """What each of our servers serves, built on demand (a `create_app` argument not built yet fails only its server)."""
    return {
        "echo1": lambda: create_app(EchoEnvironment, max_concurrent_envs=1),
        "private": lambda: create_app(EchoEnvironment, max_concurrent_envs=8, token=TOKEN),
        "private_mcp": lambda: create_app(MCPEchoEnvironment, max_concurrent_envs=8, token=TOKEN),
        "probe": lambda: create_app(ProbeEnvironment, ProbeAction, ProbeObservation, env_name="probe", max_concurrent_envs=8,
                                    state_cls=ProbeState, reset_observation_cls=ProbeReady),
        "probe_plain": lambda: create_app(ProbeEnvironment, ProbeAction, ProbeObservation, env_name="probe", max_concurrent_envs=8),
        "mcp": lambda: create_app(MCPEchoEnvironment, env_name="echo_env", max_concurrent_envs=8),
        "production": lambda: create_app(EchoEnvironment, max_concurrent_envs=8, mode="production"),
        "plain": lambda: create_app(PlainEnvironment, env_name="plain"),
    }


@pytest.fixture(scope="module")
def ours(echo_url):
    """Our servers: `echo` is `openenv serve echo` (conftest); the others are in-process apps."""
    servers = Servers()
    servers["echo"] = echo_url
    with ExitStack() as stack:
        for name, build in our_apps().items():
            try: servers[name] = stack.enter_context(serve_in_thread(build()))
            except Exception as e: servers.errors[name] = f"{type(e).__name__}: {e}"
        yield servers


class UpstreamServer:
    """`bench/upstream_echo_server.py` in a subprocess of the upstream venv (its own process group); `urls` by app."""
    def __init__(self, py, apps, port=0, log=None, env=None):
        self.py, self.apps, self.port, self.env = py, apps, port, env or {}
        self.log = Path(log) if log else Path(os.environ.get("TMPDIR", "/tmp")) / f"upstream-{os.getpid()}-{id(self)}.log"
        self.proc, self.urls = None, {}

    def start(self, timeout=120):
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([self.py, str(UPSTREAM_SERVER), "--apps", ",".join(self.apps), "--port", str(self.port)],
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                         env={**os.environ, **NO_PROXY_ENV, **self.env, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + timeout  # importing openenv pulls in gradio and fastmcp: 5-15 s here
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"the upstream server exited ({self.proc.returncode}):\n{self.log.read_text()[-3000:]}"
            if m := re.search(r"upstream listening (\{.*\})", self.log.read_text()):
                self.urls = {k: f"http://127.0.0.1:{v}" for k, v in json.loads(m.group(1)).items()}
                if all(healthy(u) for n, u in self.urls.items() if not n.startswith("private")): return self
            time.sleep(0.1)
        self.stop()
        pytest.fail(f"the upstream server was not healthy within {timeout} s:\n{self.log.read_text()[-3000:]}")

    def stop(self):
        proc, self.proc = self.proc, None
        if proc is None: return
        for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
            try: os.killpg(proc.pid, sig)
            except ProcessLookupError: break
            try: proc.wait(wait); break
            except subprocess.TimeoutExpired: continue


def healthy(url):
    try: return requests.get(url + "/health", timeout=1, proxies={"http": None}).status_code == 200
    except requests.RequestException: return False


@pytest.fixture(scope="module")
def upstream(upstream_py, tmp_path_factory):
    """Upstream's servers, one process, one port per app (see `bench/upstream_echo_server.py`)."""
    server = UpstreamServer(upstream_py, UPSTREAM_APPS, log=tmp_path_factory.mktemp("upstream") / "server.log",
                            env={"MAX_CONCURRENT_ENVS": "64"})  # the parity cases open many sessions at once
    server.start()
    try: yield server.urls
    finally: server.stop()


class CuttableProxy:
    """A TCP relay, in a thread, that can drop every connection it carries at once, as a proxy or a tunnel does."""
    def __init__(self, target):
        t = urlsplit(target)
        self.target, self.links = (t.hostname, t.port), set()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="cuttable-proxy")
        self.thread.start()
        self.server = self._call(self._listen())
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    def _call(self, coro): return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    async def _listen(self): return await asyncio.start_server(self._link, "127.0.0.1", 0)

    async def _link(self, client_r, client_w):
        server_r, server_w = await asyncio.open_connection(*self.target)
        pair = (client_w, server_w)
        self.links.add(pair)
        async def pipe(r, w):
            try:
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            except (ConnectionError, OSError): pass
            finally: w.close()
        try: await asyncio.gather(pipe(client_r, server_w), pipe(server_r, client_w))
        finally: self.links.discard(pair)

    def cut(self) -> int:
        """Abort every open connection, both ends, with no close frame; how many there were."""
        async def cut():
            pairs = list(self.links)
            for client_w, server_w in pairs:
                client_w.transport.abort()
                server_w.transport.abort()
            return len(pairs)
        return self._call(cut())

    def close(self):
        self.cut()
        async def shut():
            self.server.close()
            await self.server.wait_closed()
        self._call(shut())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


# --------------------------------------------------------------------------------------------------------------------
# 1. Upstream's clients. The script runs in the upstream venv; it reads its plan as JSON on stdin and prints
# `RESULT {json}` at the end. An interactive scenario prints `PAUSE name` and waits for a line on stdin, while the
# test drops the connection or restarts the server.
UPSTREAM_CLIENT = r'''
import asyncio, json, sys
from typing import Any, Dict, List, Optional

import requests
from pydantic import Field, ValidationError

from openenv.core import EnvClient, GenericEnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.env_server.types import (Action, EnvironmentMetadata, HealthResponse, Observation, ResetResponse,
                                           SchemaResponse, State, StepResponse)
from openenv.core.mcp_client import MCPToolClient

HEADERS = {"Authorization": "Bearer secret-token"}


# A typed client as users write one for the echo environment.
class EchoAction(Action):
    message: str = Field(..., description="Message to echo back")


class EchoObservation(Observation):
    echoed_message: str = ""
    message_length: int = 0


class EchoEnv(EnvClient[EchoAction, EchoObservation, State]):
    def _step_payload(self, action: EchoAction) -> Dict:
        return {"message": action.message}

    def _parse_result(self, payload: Dict) -> StepResult[EchoObservation]:
        obs = payload.get("observation", {})
        observation = EchoObservation(echoed_message=obs.get("echoed_message", ""), message_length=obs.get("message_length", 0),
                                      done=payload.get("done", False), reward=payload.get("reward"),
                                      metadata=obs.get("metadata", {}))
        return StepResult(observation=observation, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: Dict) -> State:
        return State(**payload)


# A typed client for an environment with a State subclass and a reset observation of its own; its models are the
# ones upstream's probe server uses (`bench/upstream_echo_server.py`, put on the path by the test).
from upstream_echo_server import ProbeAction, ProbeObservation, ProbeReady, ProbeState


class ProbeEnv(EnvClient[ProbeAction, ProbeObservation, ProbeState]):
    def _step_payload(self, action):
        return action.model_dump(exclude={"metadata"})

    def _parse_result(self, payload):
        obs = dict(payload.get("observation", {}))
        cls = ProbeReady if "ready" in obs else ProbeObservation
        observation = cls.model_validate({**obs, "reward": payload.get("reward"), "done": payload.get("done", False)})
        return StepResult(observation=observation, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload):
        return ProbeState.model_validate(payload)


def res(r):
    o = r.observation
    return {"observation": o if isinstance(o, dict) else {"type": type(o).__name__, **o.model_dump()}, "reward": r.reward, "done": r.done}


def st(s): return s if isinstance(s, dict) else {"type": type(s).__name__, **s.model_dump()}
def err(e): return f"{type(e).__name__}: {e}"


def attempt(out, key, fn):
    try: out[key] = fn()
    except Exception as e: out[key] = {"raised": err(e)}


def generic_plain_sync(u):
    out = {}
    env = GenericEnvClient(base_url=u["echo"])  # 0.10: called from sync code, no .sync() and no await
    try:
        out["reset"] = res(env.reset(seed=3, episode_id="up-generic", task_name="t1"))
        out["step"] = res(env.step({"message": "hi"}))
        out["state"] = st(env.state())
        attempt(out, "bad", lambda: res(env.step({"msg": "x"})))
        out["after_bad"] = res(env.step({"message": "again"}))
        out["state2"] = st(env.state())
    finally: env.close()
    return out


async def typed_async(u):
    out = {}
    async with EchoEnv(base_url=u["echo"]) as env:
        out["reset"] = res(await env.reset(seed=7, episode_id="up-typed-async"))
        out["step"] = res(await env.step(EchoAction(message="hello")))
        out["state"] = st(await env.state())
    return out


def typed_sync(u):
    out = {}
    with EchoEnv(base_url=u["echo"]).sync() as env:
        out["reset"] = res(env.reset(seed=7, episode_id="up-typed-sync"))
        out["step"] = res(env.step(EchoAction(message="hello")))
        out["state"] = st(env.state())
    return out


def probe_typed(u):
    out = {}
    with ProbeEnv(base_url=u["probe"]).sync() as env:
        out["reset"] = res(env.reset(episode_id="p1", task_name="t1", split="train", index=1))
        out["step"] = res(env.step(ProbeAction(message="hi")))
        out["state"] = st(env.state())
    return out


def strict(model, data):
    try: model.model_validate(data); return "ok"
    except ValidationError as e: return f"{e.errors()[0]['type']} at {'.'.join(map(str, e.errors()[0]['loc']))}"


def http_models(u):
    s = requests.Session()
    s.trust_env = False
    out = {}
    def call(name, url, method, path, model=None, **kw):
        r = s.request(method, url + path, timeout=10, **kw)
        try: body = r.json()
        except ValueError: body = r.text
        out[name] = {"status": r.status_code, "body": body}
        if model is not None: out[name]["strict"] = strict(model, body)
    call("health", u["echo"], "GET", "/health", HealthResponse)
    call("metadata", u["echo"], "GET", "/metadata", EnvironmentMetadata)
    call("schema", u["echo"], "GET", "/schema", SchemaResponse)
    call("reset", u["echo"], "POST", "/reset", ResetResponse, json={"seed": 3, "episode_id": "http-1", "task_name": "t"})
    call("reset_nobody", u["echo"], "POST", "/reset", ResetResponse)
    call("step", u["echo"], "POST", "/step", StepResponse, json={"action": {"message": "hey"}})
    call("state", u["echo"], "GET", "/state", State)
    if "probe" in u:
        call("probe_schema", u["probe"], "GET", "/schema", SchemaResponse)
        call("probe_state", u["probe"], "GET", "/state", ProbeState)
        call("probe_reset", u["probe"], "POST", "/reset", ResetResponse, json={"task_name": "t2", "episode_id": "hp"})
    call("plain_schema", u["probe_plain"], "GET", "/schema", SchemaResponse)
    call("plain_state", u["probe_plain"], "GET", "/state", State)
    return out


async def capacity(u):
    out = {}
    async with GenericEnvClient(base_url=u["echo1"]) as holder:
        await holder.reset()
        refused = GenericEnvClient(base_url=u["echo1"])
        try:
            await refused.reset()
            out["refused"] = None
        except Exception as e: out["refused"] = err(e)
        finally: await refused.close()
    return out


async def headers(u):
    out = {}
    try:
        async with GenericEnvClient(base_url=u["private"]) as env: await env.reset()
        out["without"] = "connected"
    except Exception as e: out["without"] = err(e)
    async with GenericEnvClient(base_url=u["private"], headers=HEADERS) as env:
        out["reset"] = res(await env.reset(episode_id="parent"))
        await env.step({"message": "p"})
        child = await env.new_session()
        out["child_reset"] = res(await child.reset(episode_id="child"))
        out["child_state"] = st(await child.state())
        out["parent_state"] = st(await env.state())
    with GenericEnvClient(base_url=u["private"], headers=HEADERS).sync() as env:
        out["sync_reset"] = res(env.reset())
    try:
        async with MCPToolClient(base_url=u["private_mcp"], headers=HEADERS) as env:
            await env.reset()
            out["mcp_tools"] = sorted(t.name for t in await env.list_tools())
    except Exception as e: out["mcp_tools"] = {"raised": err(e)}
    return out


async def mcp_tools(u):
    out = {}
    async with MCPToolClient(base_url=u["mcp"]) as env:
        out["reset"] = res(await env.reset())
        out["tools"] = sorted(t.name for t in await env.list_tools())
        out["echo"] = await env.call_tool("echo_message", message="Hello")
        out["length"] = await env.call_tool("echo_with_length", message="abc")
        try: await env.call_tool("no_such_tool"); out["missing"] = None
        except Exception as e: out["missing"] = err(e)
        out["state"] = st(await env.state())
    return out


def websocket_flow(u):
    """Upstream's tests/envs/test_websockets.py flow: episodes of tool calls through `step` (a generic client)."""
    out = {}
    call = lambda m: {"type": "call_tool", "tool_name": "echo_message", "arguments": {"message": m}}
    with GenericEnvClient(base_url=u["mcp"]).sync() as env:
        env.reset()
        out["call"] = res(env.step(call("E1S1")))
        env.step(call("E1S2"))
        out["state1"] = st(env.state())
        env.reset()
        out["state2"] = st(env.state())
        env.step(call("E2S1"))
        out["state3"] = st(env.state())
        attempt(out, "list", lambda: res(env.step({"type": "list_tools"})))
    return out


def pause(name):
    print("PAUSE " + name, flush=True)
    sys.stdin.readline()


def lost_and_found(url, name):
    out = {}
    env = GenericEnvClient(base_url=url)
    try:
        out["reset"] = res(env.reset(episode_id="before"))
        out["step"] = res(env.step({"message": "one"}))
        pause(name)
        attempt(out, "step_after", lambda: res(env.step({"message": "two"})))
        attempt(out, "reset_after", lambda: res(env.reset(episode_id="after")))
        attempt(out, "step_after_reset", lambda: res(env.step({"message": "three"})))
        attempt(out, "state_final", lambda: st(env.state()))
    finally:
        try: env.close()
        except Exception: pass
    return out


SCENARIOS = {"generic_plain_sync": generic_plain_sync, "typed_async": typed_async, "typed_sync": typed_sync,
             "probe_typed": probe_typed, "http_models": http_models, "capacity": capacity, "headers": headers,
             "mcp_tools": mcp_tools, "websocket_flow": websocket_flow}


def run(fn, urls):
    try: return asyncio.run(fn(urls)) if asyncio.iscoroutinefunction(fn) else fn(urls)
    except Exception as e: return {"crashed": err(e)}


plan = json.loads(sys.stdin.readline())
result = {}
for side, urls in plan["sides"].items():
    result[side] = {name: ({"crashed": "no such server here"} if any(k not in urls for k in needs) else run(SCENARIOS[name], urls))
                    for name, needs in plan["scenarios"].items()}
for name, url in plan["interactive"]:
    result.setdefault("interactive", {})[name] = lost_and_found(url, name)
print("RESULT " + json.dumps(result, default=str), flush=True)
'''

SCENARIO_NEEDS = {"generic_plain_sync": ["echo"], "typed_async": ["echo"], "typed_sync": ["echo"], "probe_typed": ["probe"],
                  "http_models": ["echo", "probe_plain"], "capacity": ["echo1"], "headers": ["private", "private_mcp"],
                  "mcp_tools": ["mcp"], "websocket_flow": ["mcp"]}


@pytest.fixture(scope="module")
def upstream_runs(upstream_py, ours, upstream, tmp_path_factory):
    """What upstream's clients saw: `{"ours": {scenario: ...}, "upstream": {...}, "interactive": {...}}`.

    The interactive scenarios lose their connection mid-episode: `drop_ours` and `drop_upstream` through a proxy that
    drops every socket; `restart_ours` when our server is killed and started again on the same port."""
    d = tmp_path_factory.mktemp("upstream_client")
    (d / "client.py").write_text(UPSTREAM_CLIENT)
    restartable = LocalProcessProvider("echo", max_sessions=8)
    restartable.start()
    proxies = {"drop_ours": CuttableProxy(ours["echo"]), "drop_upstream": CuttableProxy(upstream["echo"])}
    interactive = [["drop_ours", proxies["drop_ours"].url], ["drop_upstream", proxies["drop_upstream"].url],
                   ["restart_ours", restartable.base_url]]
    plan = {"sides": {"ours": dict(ours), "upstream": upstream}, "scenarios": SCENARIO_NEEDS, "interactive": interactive}
    events = {}
    with open(d / "stderr.txt", "wb") as err:
        proc = subprocess.Popen([upstream_py, str(d / "client.py")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                text=True, env={**os.environ, **NO_PROXY_ENV, "PYTHONPATH": str(UPSTREAM_SERVER.parent)},
                                start_new_session=True)
    killer = threading.Timer(300, lambda: os.killpg(proc.pid, signal.SIGKILL))
    killer.start()
    try:
        proc.stdin.write(json.dumps(plan) + "\n")
        proc.stdin.flush()
        result = None
        for line in proc.stdout:
            if line.startswith("PAUSE "):
                name = line.split()[1]
                if name.startswith("drop_"): events[name] = {"connections_dropped": proxies[name].cut()}
                else:  # kill our server and start it again where it was
                    port = urlsplit(restartable.base_url).port
                    restartable.stop()
                    restartable.port = port
                    restartable.start()
                    events[name] = {"restarted_on": restartable.base_url}
                proc.stdin.write("go\n")
                proc.stdin.flush()
            elif line.startswith("RESULT "): result = json.loads(line[len("RESULT "):])
        proc.wait(30)
    finally:
        killer.cancel()
        for p in proxies.values(): p.close()
        restartable.stop()
    assert result is not None, f"the upstream client script failed ({proc.returncode}):\n{(d / 'stderr.txt').read_text()[-5000:]}"
    result["events"] = events
    return result


def _no_crash(r):
    assert "crashed" not in r, r["crashed"]
    return r


def _fields(obs, *names): return {k: obs.get(k) for k in names}


def test_upstream_generic_client_plain_sync_on_our_server(upstream_runs):
    ref, s = _no_crash(upstream_runs["upstream"]["generic_plain_sync"]), _no_crash(upstream_runs["ours"]["generic_plain_sync"])
    for side in (ref, s):  # the wire dict as is: the observation's fields and its metadata, nested
        assert side["reset"]["observation"] == {"metadata": {}, "echoed_message": "Echo environment ready!", "message_length": 0}
        assert (side["reset"]["reward"], side["reset"]["done"]) == (0.0, False)
        assert side["step"]["observation"] == {"metadata": {"original_message": "hi", "step": 1}, "echoed_message": "hi", "message_length": 2}
        assert side["step"]["reward"] == pytest.approx(0.2)
        assert (side["state"]["episode_id"], side["state"]["step_count"]) == ("up-generic", 1)
        # an invalid action: upstream's client raises its RuntimeError with the code; the session goes on
        assert "(code: VALIDATION_ERROR)" in side["bad"]["raised"] and side["bad"]["raised"].startswith("RuntimeError: Server error: ")
        assert side["after_bad"]["observation"]["echoed_message"] == "again"
        assert side["state2"]["step_count"] == 2


@pytest.mark.parametrize("flavour", ["typed_async", "typed_sync"])
def test_upstream_typed_client_on_our_server(upstream_runs, flavour):
    ref, s = _no_crash(upstream_runs["upstream"][flavour]), _no_crash(upstream_runs["ours"][flavour])
    assert s == ref  # same episode, same replies, read by the same typed client
    assert s["step"]["observation"]["type"] == "EchoObservation"
    assert s["step"]["observation"]["metadata"] == {"original_message": "hello", "step": 1}  # read from inside `observation`
    assert s["state"]["episode_id"] == f"up-{flavour.replace('_', '-')}"


def test_upstream_typed_client_reads_state_subclass_and_reset_kwargs(upstream_runs):
    ref, s = _no_crash(upstream_runs["upstream"]["probe_typed"]), _no_crash(upstream_runs["ours"]["probe_typed"])
    assert s == ref
    kw = {"task_name": "t1", "split": "train", "index": 1}
    assert s["reset"]["observation"] == {"type": "ProbeReady", "ready": True, "task_name": "t1", "reward": 0.0, "done": False,
                                         "metadata": {"reset_kwargs": kw}}
    assert s["state"] == {"type": "ProbeState", "episode_id": "p1", "step_count": 1, "counter": 1, "history": ["hi"], "reset_kwargs": kw}


def test_upstream_response_models_accept_our_http_replies(upstream_runs):
    ref, h = _no_crash(upstream_runs["upstream"]["http_models"]), _no_crash(upstream_runs["ours"]["http_models"])
    for name in ("metadata", "schema", "reset", "reset_nobody", "step", "state", "probe_schema", "probe_reset", "plain_schema", "plain_state"):
        assert name in h, f"no reply for {name}: is our server for it up?"
        assert h[name]["status"] == 200 and h[name].get("strict", "ok") == "ok", (name, h[name])
    assert ref["health"]["strict"] == "ok"
    # the envelopes, as upstream sends them: metadata inside `observation`, and copied to the top when not empty
    assert h["reset"]["body"] == ref["reset"]["body"]
    assert h["step"]["body"] == ref["step"]["body"]
    assert h["probe_reset"]["body"] == ref["probe_reset"]["body"]
    assert h["plain_state"]["body"] == {"episode_id": "fresh", "step_count": 0}  # no state_cls: the base State fields only
    assert h["probe_state"]["body"] == ref["probe_state"]["body"]
    assert set(h["schema"]["body"]) == set(ref["schema"]["body"]) == {"action", "observation", "reset_observation", "state"}


def test_upstream_client_sees_capacity_error(upstream_runs):
    ref, s = _no_crash(upstream_runs["upstream"]["capacity"]), _no_crash(upstream_runs["ours"]["capacity"])
    for side in (ref, s):
        assert "CAPACITY_REACHED" in side["refused"] and "1/1 sessions active" in side["refused"], side["refused"]
    assert s["refused"] == ref["refused"]  # upstream's text, word for word


def test_upstream_clients_send_headers(upstream_runs):
    ref, s = _no_crash(upstream_runs["upstream"]["headers"]), _no_crash(upstream_runs["ours"]["headers"])
    for side in (ref, s):
        assert side["without"].startswith("ConnectionError: Failed to connect"), side["without"]
        assert side["child_state"]["episode_id"] == "child" and side["child_state"]["step_count"] == 0
        assert side["parent_state"]["episode_id"] == "parent" and side["parent_state"]["step_count"] == 1  # its own session
        assert side["sync_reset"]["done"] is False
        assert side["mcp_tools"] == ["echo_message", "echo_with_length"]


def test_upstream_mcp_tool_client_on_our_server(upstream_runs):
    ref, s = _no_crash(upstream_runs["upstream"]["mcp_tools"]), _no_crash(upstream_runs["ours"]["mcp_tools"])
    for side in (ref, s):
        assert side["tools"] == ["echo_message", "echo_with_length"]
        assert side["echo"] == "Hello"
        assert side["length"] == {"message": "abc", "length": 3}
        assert side["missing"].startswith("RuntimeError: Tool 'no_such_tool' failed")
        assert (side["reset"]["reward"], side["reset"]["done"]) == (0.0, False)


def test_upstream_websocket_flow_on_our_server(upstream_runs):
    ref, s = _no_crash(upstream_runs["upstream"]["websocket_flow"]), _no_crash(upstream_runs["ours"]["websocket_flow"])
    for side in (ref, s):
        assert side["call"]["observation"]["tool_name"] == "echo_message"
        assert side["call"]["observation"]["result"]["data"] == "E1S1"
        assert side["state2"]["episode_id"] != side["state1"]["episode_id"]  # a reset starts a new episode
        assert side["state3"]["episode_id"] == side["state2"]["episode_id"] and side["state2"]["step_count"] == 0
        assert sorted(t["name"] for t in side["list"]["observation"]["tools"]) == ["echo_message", "echo_with_length"]
    # upstream's test counts tool steps (2, then 0 after reset, then 1), as our MCPEnvironment does; upstream 0.10's
    # own MCPEnvironment leaves step_count to the environment, and its twin here does not count: not a wire matter
    assert (s["state1"]["step_count"], s["state2"]["step_count"], s["state3"]["step_count"]) == (2, 0, 1)


def test_upstream_client_after_dropped_socket(upstream_runs):
    """The proxy drops the socket mid-episode: upstream's client then starts over on a new connection; reset works."""
    assert upstream_runs["events"]["drop_ours"]["connections_dropped"] >= 1
    s, ref = upstream_runs["interactive"]["drop_ours"], upstream_runs["interactive"]["drop_upstream"]
    for side in (s, ref):
        assert side["reset_after"]["observation"]["echoed_message"] == "Echo environment ready!", side
        assert side["step_after_reset"]["observation"]["echoed_message"] == "three"
        assert (side["state_final"]["episode_id"], side["state_final"]["step_count"]) == ("after", 1)
    print("\nupstream client, step after the drop: ours", s["step_after"], "| upstream", ref["step_after"])


def test_upstream_client_after_our_server_restarts(upstream_runs):
    s = upstream_runs["interactive"]["restart_ours"]
    assert upstream_runs["events"]["restart_ours"]["restarted_on"]
    assert s["reset_after"]["observation"]["echoed_message"] == "Echo environment ready!", s
    assert (s["state_final"]["episode_id"], s["state_final"]["step_count"]) == ("after", 1)
    print("\nupstream client, step after our server restarted:", s["step_after"])


# --------------------------------------------------------------------------------------------------------------------
# 2. Our clients against upstream's servers.
def test_our_typed_client_on_upstream(upstream):
    with EchoEnv(upstream["echo"]).sync() as env:
        assert env.extensions == frozenset()  # upstream announces no extension: plain frames only
        r = env.reset(seed=5, episode_id="ours-on-up", task_name="ignored by echo")
        assert isinstance(r.observation, EchoObservation) and r.observation.echoed_message == "Echo environment ready!"
        assert r.observation.metadata == {}
        r = env.step(EchoAction(message="hi"))
        assert (r.observation.echoed_message, r.observation.message_length, r.done) == ("hi", 2, False)
        assert r.reward == pytest.approx(0.2) and r.observation.reward == pytest.approx(0.2)
        assert r.observation.metadata == {"original_message": "hi", "step": 1}  # upstream keeps metadata: so do we
        s = env.state()
        assert isinstance(s, State) and (s.episode_id, s.step_count) == ("ours-on-up", 1)


def test_our_generic_client_on_upstream(upstream):
    with GenericEnvClient(upstream["echo"]).sync() as env:
        r = env.reset(episode_id="generic-on-up")
        assert r.observation == {"metadata": {}, "echoed_message": "Echo environment ready!", "message_length": 0}
        r = env.step({"message": "hey"})  # the dict as upstream sent it, metadata included
        assert r.observation == {"metadata": {"original_message": "hey", "step": 1}, "echoed_message": "hey", "message_length": 3}
        with pytest.raises(EnvServerError) as e:
            env.step({"msg": "x"})
        assert e.value.code == "VALIDATION_ERROR"
        assert env.step({"message": "still here"}).observation["echoed_message"] == "still here"
        assert env.state() == {"episode_id": "generic-on-up", "step_count": 2}


def test_our_http_client_on_upstream(upstream):
    with EchoHTTPEnv(upstream["echo"]) as env:
        assert env.health() == {"status": "healthy"}
        assert set(env.schema()) == {"action", "observation", "reset_observation", "state"}
        r = env.reset(seed=1, episode_id="http-on-up", task_name="t")
        assert isinstance(r.observation, EchoObservation) and r.observation.metadata == {}
        r = env.step(EchoAction(message="hey"))
        assert (r.observation.echoed_message, r.reward) == ("hey", pytest.approx(0.3))
        assert r.observation.metadata == {"original_message": "hey", "step": 1}
        assert env.state().step_count == 0  # HTTP is stateless upstream: a fresh environment


class ProbeClient(EnvClient[ProbeAction, ProbeObservation, ProbeState]):
    """A typed client whose reset observation has a class of its own, as a user writes it."""
    def _parse_result(self, payload):
        obs = payload.get("observation") or {}
        cls = ProbeReady if "ready" in obs else ProbeObservation
        o = cls.model_validate({**obs, "reward": payload.get("reward"), "done": payload.get("done", False)})
        return StepResult(observation=o, reward=payload.get("reward"), done=bool(payload.get("done")))


@pytest.mark.parametrize("side", ["ours", "upstream"])
def test_our_client_reset_kwargs_and_state_subclass(side, ours, request):
    url = ours.url("probe") if side == "ours" else request.getfixturevalue("upstream")["probe"]
    with ProbeClient(url).sync() as env:
        r = env.reset(episode_id="kw", task_name="t9", split="holdout", index=0)
        assert r.observation == ProbeReady(task_name="t9", reward=0.0, metadata={"reset_kwargs": {"task_name": "t9", "split": "holdout", "index": 0}})
        r = env.step(ProbeAction(message="finish"))
        assert r.done is True and r.observation.metadata == {"counter": 1}
        s = env.state()
        assert isinstance(s, ProbeState)
        assert (s.counter, s.history, s.reset_kwargs) == (1, ["finish"], {"task_name": "t9", "split": "holdout", "index": 0})


@pytest.mark.parametrize("side", ["ours", "upstream"])
def test_our_client_sees_capacity_error(side, ours, request):
    """The refused socket is closed before the client's first send (as under load): the queued error frame still
    reaches the caller as CAPACITY_REACHED, not as a lost connection (upstream's test_env_client_capacity.py)."""
    url = ours.url("echo1") if side == "ours" else request.getfixturevalue("upstream")["echo1"]

    async def refused():
        async with EchoEnv(url) as holder:
            await holder.reset()
            other = EchoEnv(url)
            await other.connect()  # the server accepts, sends CAPACITY_REACHED and closes
            await other._ws.wait_closed()  # the close lands before the first send
            try:
                with pytest.raises(EnvServerError) as e:
                    await other.reset()
                return e
            finally: await other.close()
    e = asyncio.run(refused())
    assert e.value.code == "CAPACITY_REACHED"
    assert "Server at capacity: 1/1 sessions active" in str(e.value)
    assert (e.value.data["active_sessions"], e.value.data["max_sessions"]) == (1, 1)


def test_our_clients_send_headers_to_upstream(upstream):
    with pytest.raises(EnvConnectionError):
        with GenericEnvClient(upstream["private"]).sync() as env: env.reset()
    with GenericEnvClient(upstream["private"], headers={"Authorization": f"Bearer {TOKEN}"}).sync() as env:
        assert env.reset().done is False
    with HTTPEnvClient(upstream["private"], headers={"Authorization": f"Bearer {TOKEN}"}) as env:
        assert env.health()["status"] == "healthy"
    with pytest.raises(EnvServerError):
        with HTTPEnvClient(upstream["private"]) as env: env.health()


def test_our_mcp_client_on_upstream(upstream):
    with MCPToolClient(upstream["mcp"]).sync() as env:
        env.reset()
        assert sorted(t.name for t in env.list_tools()) == ["echo_message", "echo_with_length"]
        assert env.call_tool("echo_message", message="hi") == "hi"
        assert env.call_tool("echo_with_length", message="abc") == {"message": "abc", "length": 3}


def test_our_client_plain_sync_like_upstream(upstream):
    """0.10's clients work from plain sync code without `.sync()`; ours must too (and stay awaitable in a loop)."""
    env = EchoEnv(upstream["echo"])
    try:
        r = env.reset(episode_id="plain-sync")
        assert r.observation.echoed_message == "Echo environment ready!"
        assert env.step(EchoAction(message="x")).observation.message_length == 1
        assert env.state().step_count == 1
    finally:
        closing = env.close()
        if asyncio.iscoroutine(closing): asyncio.run(closing)

    async def in_a_loop():
        async with EchoEnv(upstream["echo"]) as aenv:
            return (await aenv.reset()).observation.echoed_message
    assert asyncio.run(in_a_loop()) == "Echo environment ready!"


def test_our_client_new_session_like_upstream(upstream):
    async def two_sessions():
        async with GenericEnvClient(upstream["echo"]) as env:
            await env.reset(episode_id="parent")
            child = await env.new_session()
            await child.reset(episode_id="child")
            await child.step({"message": "only the child"})
            return await env.state(), await child.state()
    parent, child = asyncio.run(two_sessions())
    assert (parent["episode_id"], parent["step_count"]) == ("parent", 0)
    assert (child["episode_id"], child["step_count"]) == ("child", 1)


@pytest.mark.parametrize("side", ["ours", "upstream"])
def test_our_client_after_dropped_socket(side, ours, request):
    """A proxy drops the socket mid-episode: our server resumes the episode; upstream's (no `resume`, nothing
    `replayable`) loses it, and the next step says so; `reset()` then works."""
    target = ours["echo"] if side == "ours" else request.getfixturevalue("upstream")["echo"]
    proxy = CuttableProxy(target)
    try:
        with EchoEnv(proxy.url).sync() as env:
            env.reset(episode_id="before")
            env.step(EchoAction(message="one"))
            assert proxy.cut() == 1
            if side == "ours":
                assert env.step(EchoAction(message="two")).observation.metadata["step"] == 2
                assert (env.state().episode_id, env.resumes) == ("before", 1)
            else:
                with pytest.raises(EnvConnectionError) as e:  # never silently continued in a new episode
                    env.step(EchoAction(message="two"))
                assert "step" in str(e.value)
            r = env.reset(episode_id="after")
            assert r.observation.echoed_message == "Echo environment ready!"
            env.step(EchoAction(message="three"))
            assert (env.state().episode_id, env.state().step_count) == ("after", 1)
    finally: proxy.close()


def test_our_client_after_upstream_server_restarts(upstream_py, tmp_path):
    server = UpstreamServer(upstream_py, ("echo",), log=tmp_path / "restart.log").start()
    try:
        with EchoEnv(server.urls["echo"]).sync() as env:
            env.reset(episode_id="before")
            env.step(EchoAction(message="one"))
            server.stop()
            server.port = urlsplit(server.urls["echo"]).port
            server.start()
            with pytest.raises(EnvConnectionError):  # the episode died with the server
                env.step(EchoAction(message="two"))
            env.reset(episode_id="after")
            assert (env.state().episode_id, env.state().step_count) == ("after", 0)
    finally: server.stop()


def test_our_client_after_our_server_restarts():
    p = LocalProcessProvider("echo", max_sessions=4)
    url = p.start()
    try:
        with EchoEnv(url).sync() as env:
            env.reset(episode_id="before")
            p.stop()
            p.port = urlsplit(url).port
            p.start()
            env.step(EchoAction(message="replayed"))  # a new session: the episode rebuilt by replay
            assert (env.state().episode_id, env.state().step_count, env.resumes) == ("before", 1, 1)
            p.stop(); p.start()
            with pytest.raises(EnvConnectionError):  # without resume: lost, as before
                env.async_client.resume = None
                env.step(EchoAction(message="lost"))
            env.reset(episode_id="after")
            env.step(EchoAction(message="found"))
            assert (env.state().episode_id, env.state().step_count) == ("after", 1)
    finally: p.stop()


# --------------------------------------------------------------------------------------------------------------------
# 3. Parity: the same frames and requests to both servers.
KNOWN_DIFFERENCES = {  # case -> why ours differs from upstream 0.10 on purpose; any other difference fails
    "http:health": "extension: ours adds active_sessions and max_sessions",
    "ws:reset_negative_seed": "ours validates WS reset data as HTTP /reset does (seed >= 0): VALIDATION_ERROR; upstream resets",
    "ws:mcp_frame_without_tools": "our echo is also an MCP tool environment (echo_message, echo_with_length); upstream's plain echo has no tools: -32603",
    "ws:mcp_over_ws": "our tools' input schemas carry their docments' parameter descriptions, and an unknown tool is -32602 (invalid params); upstream -32603",
    "http:production_health": "extension: ours adds active_sessions, max_sessions, connections and max_connections, as on http:health",
    "http:mcp_tools_list": "our tools' input schemas carry their docments' parameter descriptions; upstream's echo tools have none",
    "http:mcp_unknown_tool": "ours answers an unknown tool with -32602 (invalid params, as MCP's spec does); upstream -32603 (internal error)",
    "http:mcp_no_version": "ours echoes the request's readable `id` in its -32600 reply; upstream answers with id null",
}

# upstream's MCP echo answers reset with this frame, and so does ours (`test_mcp_echo_reset_says_ready`)
MCP_READY = {"type": "observation", "data": {"observation": {"metadata": {"status": "ready"}}, "reward": 0.0, "done": False,
                                             "metadata": {"status": "ready"}}}


def _norm(x):
    """Random episode ids out; error texts reduced to what a client reads (code, pydantic error types and places)."""
    x = json.loads(UUID.sub("<uuid>", json.dumps(x)))
    if isinstance(x, dict) and x.get("type") == "error":
        d = x["data"]
        if d.get("code") not in ("UNKNOWN_TYPE", "CAPACITY_REACHED"): d["message"] = "<text>"
        if "errors" in d: d["errors"] = sorted((e["type"], tuple(e["loc"])) for e in d["errors"])
    if isinstance(x, dict) and x.get("type") == "mcp": x["data"] = _rpc(x["data"])
    return x


def _rpc(d):
    """A JSON-RPC reply as far as both sides must agree: tool names and input schemas, a call's value, error codes."""
    out = {k: d.get(k) for k in ("jsonrpc", "id")}
    if "error" in d and d["error"] is not None: out["error"] = d["error"].get("code")
    r = d.get("result")
    if isinstance(r, dict) and "tools" in r:
        out["tools"] = sorted((t["name"], json.dumps(t.get("inputSchema", {}).get("properties"), sort_keys=True)) for t in r["tools"])
    elif isinstance(r, dict) and "content" in r: out["value"] = r.get("data", r.get("structured_content"))
    elif r is not None: out["result"] = sorted(r) if isinstance(r, dict) else r
    return out


async def _exchange(url, frames, path="/ws"):
    """Send `frames` on one raw connection; the replies, then whether it is still open."""
    replies = []
    async with connect(ws_url(url).rsplit("/ws", 1)[0] + path, compression=None, open_timeout=10) as ws:
        for f in frames:
            await ws.send(f if isinstance(f, str) else json.dumps(f))
            if f == {"type": "close"}: break
            try: replies.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
            except ConnectionClosed: replies.append({"closed_before_reply": True}); break
        try:
            await asyncio.wait_for(ws.recv(), 0.3)
            end = "unexpected frame"
        except ConnectionClosed as e: end = f"closed {e.rcvd.code if e.rcvd else None}"
        except TimeoutError: end = "open"
    return [_norm(r) for r in replies], end


STEP = lambda m: {"type": "step", "data": {"message": m}}
RESET = lambda **kw: {"type": "reset", "data": kw}
RPC = lambda method, i, **params: {"type": "mcp", "data": {"jsonrpc": "2.0", "method": method, "id": i, **({"params": params} if params else {})}}
WS_CASES = {  # name: (server, frames on one connection)
    "reset_empty": ("echo", [RESET()]),
    "reset_seeded": ("echo", [RESET(seed=1, episode_id="e1")]),
    "step_metadata": ("echo", [RESET(episode_id="e1"), STEP("hi")]),
    "state": ("echo", [RESET(episode_id="e1"), STEP("hi"), {"type": "state"}]),
    "reset_kwargs_ignored_by_echo": ("echo", [RESET(episode_id="e2", task_name="x"), {"type": "state"}]),
    "action_unknown_field": ("echo", [{"type": "step", "data": {"msg": "x"}}]),
    "unknown_type": ("echo", [{"type": "bogus"}]),
    "invalid_json": ("echo", ["{not json"]),
    "close": ("echo", [{"type": "close"}]),
    "mcp_frame_without_tools": ("echo", [RPC("tools/list", 1)]),
    "reset_negative_seed": ("echo", [RESET(seed=-1)]),
    "probe_reset_kwargs": ("probe", [RESET(episode_id="p", task_name="t", split="train", index=1), {"type": "state"}]),
    "probe_state_before_reset": ("probe", [{"type": "state"}]),
    "probe_done": ("probe", [RESET(episode_id="p"), STEP("finish")]),
    "plain_state_keeps_subclass_fields": ("probe_plain", [{"type": "state"}]),
    "production_ws_still_steps": ("production", [RESET(episode_id="prod"), STEP("hi"), {"type": "state"}]),
    "mcp_over_ws": ("mcp", [RESET(episode_id="m"), RPC("tools/list", 1), RPC("tools/call", 2, name="echo_message", arguments={"message": "yo"}),
                            RPC("tools/call", 3, name="nope", arguments={}), RPC("nope", 4), {"type": "state"}]),
    "mcp_step_actions": ("mcp", [RESET(episode_id="m"), {"type": "step", "data": {"type": "list_tools"}},
                                 {"type": "step", "data": {"type": "call_tool", "tool_name": "echo_with_length", "arguments": {"message": "abc"}}}]),
    "capacity": ("echo1", None),  # see `_capacity_frames`
}


async def _refusal(url, path="/ws"):
    """The frames a connection that the server refuses gets, sending nothing, and how its socket ends."""
    frames = []
    async with connect(ws_url(url).rsplit("/ws", 1)[0] + path, compression=None) as refused:
        try:
            while True: frames.append(json.loads(await asyncio.wait_for(refused.recv(), 10)))
        except ConnectionClosed as e: return frames, f"closed {e.rcvd.code if e.rcvd else None}"


async def _capacity_frames(url):
    """The frames a second session gets while the only slot is held, and how its socket ends."""
    async with connect(ws_url(url), compression=None) as holder:
        await holder.send(json.dumps(RESET()))
        await holder.recv()
        return await _refusal(url)


def _ws_side(servers):
    async def all_cases():
        async def one(server, frames):
            if server not in servers: return [{"no server": server}], None
            if frames is None:
                refused, end = await _capacity_frames(servers[server])
                return [_norm(f) for f in refused], end
            return await _exchange(servers[server], frames)
        done = await asyncio.gather(*(one(s, f) for s, f in WS_CASES.values()))
        return dict(zip(WS_CASES, done))
    return asyncio.run(all_cases())


def _mcp_tool_step(reply):
    """A tool step's observation as both sides must agree on it (FastMCP's result objects differ in detail)."""
    if reply.get("type") != "observation": return reply
    obs = reply["data"]["observation"]
    if "tools" in obs: obs = {**obs, "tools": sorted(t["name"] for t in obs["tools"])}
    if isinstance(obs.get("result"), dict): obs = {**obs, "result": obs["result"].get("data")}
    return {**reply, "data": {**reply.get("data", {}), "observation": obs}}


def test_ws_parity(ours, upstream):
    o, u = _ws_side(ours), _ws_side(upstream)
    for name in ("mcp_step_actions",):
        for side in (o, u): side[name] = ([_mcp_tool_step(r) for r in side[name][0]], side[name][1])
    for name in ("mcp_over_ws", "mcp_step_actions"): assert u[name][0][0] == MCP_READY  # compared with ours below, as every frame
    # the exact frames of the envelope, as upstream sends them
    assert u["step_metadata"][0][-1] == {"type": "observation", "data": {
        "observation": {"metadata": {"original_message": "hi", "step": 1}, "echoed_message": "hi", "message_length": 2},
        "reward": 0.2, "done": False, "metadata": {"original_message": "hi", "step": 1}}}
    assert u["capacity"][0] == [{"type": "error", "data": {"message": "Server at capacity: 1/1 sessions active. Cannot accept new connections.",
                                                           "code": "CAPACITY_REACHED", "active_sessions": 1, "max_sessions": 1}}]
    differ = {name: {"ours": o[name], "upstream": u[name]} for name in WS_CASES if o[name] != u[name]}
    print("\nknown WS differences:", json.dumps({k: v for k, v in differ.items() if f"ws:{k}" in KNOWN_DIFFERENCES}, indent=1, default=str))
    unexpected = {k: v for k, v in differ.items() if f"ws:{k}" not in KNOWN_DIFFERENCES}
    assert not unexpected, json.dumps(unexpected, indent=1, default=str)
    stale = {k for k in KNOWN_DIFFERENCES if k.startswith("ws:") and k[3:] not in differ}
    assert not stale, f"no longer different from upstream (remove from KNOWN_DIFFERENCES): {sorted(stale)}"


HTTP_CASES = {  # name: (server, method, path, json body or raw text)
    "health": ("echo", "GET", "/health", None),
    "metadata_keys": ("echo", "GET", "/metadata", None),
    "schema": ("echo", "GET", "/schema", None),
    "reset_empty": ("echo", "POST", "/reset", {}),
    "reset_no_body": ("echo", "POST", "/reset", None),
    "reset_kwargs": ("echo", "POST", "/reset", {"seed": 1, "episode_id": "h1", "task_name": "t"}),
    "reset_negative_seed": ("echo", "POST", "/reset", {"seed": -1}),
    "step": ("echo", "POST", "/step", {"action": {"message": "hi"}}),
    "step_extra_keys": ("echo", "POST", "/step", {"action": {"message": "hi"}, "timeout_s": 5, "request_id": "r1", "other": 1}),
    "step_bad_action": ("echo", "POST", "/step", {"action": {"msg": "x"}}),
    "step_no_action": ("echo", "POST", "/step", {}),
    "state": ("echo", "GET", "/state", None),
    "mcp_empty": ("echo", "POST", "/mcp", {}),
    "mcp_not_json": ("echo", "POST", "/mcp", "{nope"),
    "probe_schema": ("probe", "GET", "/schema", None),
    "probe_state": ("probe", "GET", "/state", None),
    "probe_reset_kwargs": ("probe", "POST", "/reset", {"episode_id": "hp", "task_name": "t", "split": "train", "index": 2}),
    "probe_step": ("probe", "POST", "/step", {"action": {"message": "finish"}}),
    "plain_schema": ("probe_plain", "GET", "/schema", None),
    "plain_state": ("probe_plain", "GET", "/state", None),
    # the Task API (upstream's tests/core/test_task_api.py)
    "list_environments": ("probe", "GET", "/list_environments", None),
    "splits": ("probe", "GET", "/probe/splits", None),
    "splits_any_case": ("probe", "GET", "/PROBE/splits", None),
    "tasks": ("probe", "POST", "/probe/tasks", {"split": "train"}),
    "num_tasks": ("probe", "POST", "/probe/num_tasks", {"split": "train"}),
    "task": ("probe", "POST", "/probe/task", {"split": "train", "index": 1}),
    "task_out_of_range": ("probe", "POST", "/probe/task", {"split": "train", "index": 9}),
    "task_range": ("probe", "POST", "/probe/task_range", {"split": "train", "start": 1}),
    "task_range_bounds": ("probe", "POST", "/probe/task_range", {"split": "train", "start": 0, "stop": 2}),
    "tasks_no_split": ("probe", "POST", "/probe/tasks", {}),
    "unknown_env_name": ("probe", "GET", "/other_env/splits", None),
    "no_task_support": ("mcp", "GET", "/echo_env/splits", None),
    # production mode (upstream's tests/core/test_production_mode_routes.py)
    "production_reset": ("production", "POST", "/reset", {}),
    "production_step": ("production", "POST", "/step", {"action": {"message": "hi"}}),
    "production_state": ("production", "GET", "/state", None),
    "production_health": ("production", "GET", "/health", None),
    "production_schema": ("production", "GET", "/schema", None),
    "production_metadata_keys": ("production", "GET", "/metadata", None),
    "production_mcp_empty": ("production", "POST", "/mcp", {}),
    # MCP over HTTP (upstream's TestHTTPMCPEndpoint, TestMCPErrorResponses)
    "mcp_tools_list": ("mcp", "POST", "/mcp", {"jsonrpc": "2.0", "method": "tools/list", "id": 1}),
    "mcp_tools_call": ("mcp", "POST", "/mcp", {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "echo_message", "arguments": {"message": "hi"}}, "id": 2}),
    "mcp_unknown_tool": ("mcp", "POST", "/mcp", {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "nope", "arguments": {}}, "id": 3}),
    "mcp_unknown_method": ("mcp", "POST", "/mcp", {"jsonrpc": "2.0", "method": "nope", "id": 4}),
    "mcp_missing_params": ("mcp", "POST", "/mcp", {"jsonrpc": "2.0", "method": "tools/call", "id": 5}),
    "mcp_no_version": ("mcp", "POST", "/mcp", {"method": "tools/list", "id": 6}),
    "mcp_tools_not_json": ("mcp", "POST", "/mcp", "{nope"),
    "mcp_session_close_unknown": ("mcp", "POST", "/mcp", {"jsonrpc": "2.0", "method": "openenv/session/close", "params": {"session_id": "nope"}, "id": 7}),
    "mcp_session_close_no_id": ("mcp", "POST", "/mcp", {"jsonrpc": "2.0", "method": "openenv/session/close", "params": {}, "id": 8}),
}


def _schema_shape(s):
    """A JSON schema as both sides must agree on it: its properties and required fields."""
    return {"properties": sorted(s.get("properties", {})), "required": sorted(s.get("required", []))}


def _http_shape(r, name):
    try: body = r.json()
    except ValueError: return r.status_code, "<not json>"
    body = json.loads(UUID.sub("<uuid>", json.dumps(body)))
    if r.status_code == 422: return r.status_code, sorted((e["type"], tuple(e["loc"])) for e in body["detail"])
    if name.endswith("_keys"): return r.status_code, sorted(body)
    if name.endswith("schema") and isinstance(body, dict) and "action" in body:
        return r.status_code, {k: _schema_shape(v) for k, v in body.items()}
    if isinstance(body, dict) and "jsonrpc" in body: return r.status_code, _rpc(body)
    return r.status_code, body


def _http_side(servers):
    s = requests.Session()
    s.trust_env = False
    out = {}
    for name, (server, method, path, body) in HTTP_CASES.items():
        if server not in servers: out[name] = ("no server", server); continue
        kw = {"data": body, "headers": {"content-type": "application/json"}} if isinstance(body, str) else \
             {"json": body} if body is not None else {}
        out[name] = _http_shape(s.request(method, servers[server] + path, timeout=10, **kw), name)
    return out


def test_http_parity(ours, upstream):
    o, u = _http_side(ours), _http_side(upstream)
    # upstream's replies, spelled out where the issue names them
    assert u["step"] == (200, {"observation": {"metadata": {"original_message": "hi", "step": 1}, "echoed_message": "hi", "message_length": 2},
                               "reward": 0.2, "done": False, "metadata": {"original_message": "hi", "step": 1}})
    assert u["plain_state"] == (200, {"episode_id": "fresh", "step_count": 0})
    assert u["probe_schema"][1]["state"]["properties"] == ["counter", "episode_id", "history", "reset_kwargs", "step_count"]
    assert u["probe_schema"][1]["reset_observation"]["properties"] == ["done", "metadata", "ready", "reward", "task_name"]
    assert u["task_out_of_range"][0] == 400 and u["unknown_env_name"][0] == 404 and u["no_task_support"][0] == 501
    assert [u[f"production_{r}"][0] for r in ("reset", "step", "state", "health", "schema", "metadata_keys", "mcp_empty")] == [404, 404, 404, 200, 200, 200, 200]
    differ = {name: {"ours": o[name], "upstream": u[name]} for name in HTTP_CASES if o[name] != u[name]}
    print("\nknown HTTP differences:", json.dumps({k: v for k, v in differ.items() if f"http:{k}" in KNOWN_DIFFERENCES}, indent=1, default=str))
    unexpected = {k: v for k, v in differ.items() if f"http:{k}" not in KNOWN_DIFFERENCES}
    assert not unexpected, json.dumps(unexpected, indent=1, default=str)
    stale = {k for k in KNOWN_DIFFERENCES if k.startswith("http:") and k[5:] not in differ}
    assert not stale, f"no longer different from upstream (remove from KNOWN_DIFFERENCES): {sorted(stale)}"


def test_mcp_echo_reset_says_ready(ours):
    "Upstream's MCP echo resets with metadata {'status': 'ready'}, inside `observation` and at the top level; so does ours."
    replies, end = asyncio.run(_exchange(ours.url("mcp"), [RESET(episode_id="m")]))
    assert (replies, end) == ([MCP_READY], "open")


def _rpc_call(url, method, rid, **params):
    return requests.post(url + "/mcp", json={"jsonrpc": "2.0", "method": method, "id": rid, "params": params}, timeout=10,
                         proxies={"http": None}).json()


@pytest.mark.parametrize("side", ["ours", "upstream"])
def test_mcp_http_sessions(side, ours, request):
    """Upstream's TestHTTPMCPSessionLifecycle: create, call within, attach a socket, close, close again."""
    url = ours.url("mcp") if side == "ours" else request.getfixturevalue("upstream")["mcp"]
    sid = _rpc_call(url, "openenv/session/create", 1)["result"]["session_id"]
    assert isinstance(sid, str) and sid
    r = _rpc_call(url, "tools/call", 2, name="echo_message", arguments={"message": "in session"}, session_id=sid)
    assert r["result"]["data"] == "in session"

    async def attached():  # a socket attached to the session sees the same environment; a second one is refused
        replies, _ = await _exchange(url, [RESET(episode_id="attached"), {"type": "state"}], path=f"/ws?session_id={sid}")
        async with connect(ws_url(url) + f"?session_id={sid}", compression=None) as first:
            second, end = await _refusal(url, path=f"/ws?session_id={sid}")
            await first.send(json.dumps({"type": "state"}))
            still = json.loads(await first.recv())
        return replies, second, end, still
    replies, second, end, still = asyncio.run(attached())
    assert replies[-1]["data"]["episode_id"] == "attached" and still["data"]["episode_id"] == "attached"
    assert len(second) == 1 and second[0]["data"]["code"] == "SESSION_ERROR" and end == "closed 1000"
    assert "already has an attached WebSocket" in second[0]["data"]["message"]
    assert _rpc_call(url, "openenv/session/close", 3, session_id=sid)["result"] == {"session_id": sid, "closed": True}
    assert "error" in _rpc_call(url, "openenv/session/close", 4, session_id=sid)  # closed twice
    assert "error" in _rpc_call(url, "tools/call", 5, name="echo_message", arguments={"message": "x"}, session_id=sid)



FASTMCP_CONTEXT = r"""
import json
from fastmcp import Context, FastMCP
from starlette.testclient import TestClient
from openenv_nb.mcp import MCPEnvironment
from openenv_nb.server import create_app

mcp = FastMCP("stateful")

@mcp.tool
async def inc_counter(ctx: Context) -> str:
    "Count the calls of this session."
    count = (await ctx.get_state("counter")) or 0
    await ctx.set_state("counter", count + 1)
    return str(count + 1)

@mcp.tool
async def chatty(ctx: Context) -> str:
    "Log, then ask the client's model (which needs a client)."
    await ctx.info("thinking")
    await ctx.sample("hi")
    return "never"

class Stateful(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True
    def __init__(self): super().__init__(mcp)

def call(client, sid=None):
    params = {"name": "inc_counter", "arguments": {}} | ({"session_id": sid} if sid else {})
    return client.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}).json()["result"]["data"]

with TestClient(create_app(Stateful)) as client:
    new = lambda: client.post("/mcp", json={"jsonrpc": "2.0", "id": 0, "method": "openenv/session/create"}).json()["result"]["session_id"]
    a, b = new(), new()
    out = {"http_a": [call(client, a), call(client, a)], "http_b": [call(client, b)], "stateless": [call(client), call(client)]}
    with client.websocket_connect("/ws") as ws:
        for _ in range(2): ws.send_json({"type": "mcp", "data": {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "inc_counter"}}})
        out["ws"] = [ws.receive_json()["data"]["result"]["data"] for _ in range(2)]
    out["schema"] = client.post("/mcp", json={"jsonrpc": "2.0", "id": 3, "method": "tools/list"}).json()["result"]["tools"][0]["inputSchema"]
    chat = {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "chatty", "arguments": {}}}
    out["chatty"] = client.post("/mcp", json=chat).json()["error"]["message"]
print(json.dumps(out))
"""


def test_fastmcp_context_state_lasts_a_session(upstream_py):
    """Upstream's TestMCPSessionTransportPersistence: a fastmcp tool keeps `ctx.set_state` for its session (HTTP and WS), not for others."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
    r = subprocess.run([upstream_py, "-c", FASTMCP_CONTEXT], capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert "No MCP client session behind this tool call" in out.pop("chatty")  # it logged, then could not sample
    assert out == {"http_a": ["1", "2"], "http_b": ["1"], "stateless": ["1", "1"], "ws": ["1", "2"],
                   "schema": {"additionalProperties": False, "properties": {}, "type": "object"}}

# --------------------------------------------------------------------------------------------------------------------
# 4. Upstream's tests of the server, restated against ours (no upstream venv needed).
def test_state_cls_is_served(ours):
    """tests/core/test_state_schema_subclass.py: a declared State subclass reaches /schema and /state."""
    url = ours.url("probe")
    schema = requests.get(url + "/schema", proxies={"http": None}).json()
    assert set(schema["state"]["properties"]) == {"episode_id", "step_count", "counter", "history", "reset_kwargs"}
    assert "message" in schema["action"]["properties"] and "echoed_message" in schema["observation"]["properties"]
    body = requests.get(url + "/state", proxies={"http": None}).json()
    assert body == {"episode_id": "fresh", "step_count": 0, "counter": 0, "history": [], "reset_kwargs": {}}


def test_without_state_cls_state_is_the_base_state(ours):
    """The same file: no `state_cls`, the base State only, even for an environment whose state has more fields."""
    url = ours.url("probe_plain")
    assert set(requests.get(url + "/schema", proxies={"http": None}).json()["state"]["properties"]) == {"episode_id", "step_count"}
    assert requests.get(url + "/state", proxies={"http": None}).json() == {"episode_id": "fresh", "step_count": 0}


@pytest.mark.parametrize("web", [False, True])
def test_state_cls_served_with_and_without_the_web_page(web):
    app = create_app(ProbeEnvironment, ProbeAction, ProbeObservation, state_cls=ProbeState, web=web)
    with serve_in_thread(app) as url:
        assert requests.get(url + "/state", proxies={"http": None}).json()["counter"] == 0
        assert "counter" in requests.get(url + "/schema", proxies={"http": None}).json()["state"]["properties"]


def test_reset_observation_cls_is_published_and_matches_reset(ours):
    """tests/core/test_reset_observation_schema.py: the declared reset model is in /schema; reset replies fit it."""
    url = ours.url("probe")
    schema = requests.get(url + "/schema", proxies={"http": None}).json()
    assert schema["reset_observation"] == ProbeReady.model_json_schema()
    assert schema["observation"] == ProbeObservation.model_json_schema()
    replies, _ = asyncio.run(_exchange(url, [RESET()]))
    assert replies[0]["data"]["observation"]["ready"] is True and "echoed_message" not in replies[0]["data"]["observation"]


def test_default_reset_schema_is_the_observation_and_needs_no_environment():
    """The same file: without `reset_observation_cls`, /schema repeats the observation; it creates no environment."""
    def factory():
        raise AssertionError("schema discovery must not create an environment")
    with serve_in_thread(create_app(factory, ProbeAction, ProbeObservation)) as url:
        schema = requests.get(url + "/schema", proxies={"http": None}).json()
    assert schema["reset_observation"] == schema["observation"] == ProbeObservation.model_json_schema()


def test_production_mode_routes(ours):
    """tests/core/test_production_mode_routes.py: no /reset, /step, /state; /health, /schema, /metadata, /ws, /mcp stay."""
    url, s = ours.url("production"), requests.Session()
    s.trust_env = False
    assert s.post(url + "/reset", json={"seed": 42}).status_code in (404, 405)
    assert s.post(url + "/step", json={"action": {"message": "test"}}).status_code in (404, 405)
    assert s.get(url + "/state").status_code in (404, 405)
    assert s.get(url + "/health").json()["status"] == "healthy"
    assert {"action", "observation", "state"} <= set(s.get(url + "/schema").json())
    assert s.get(url + "/metadata").status_code == 200
    assert s.post(url + "/mcp", json={}).json()["jsonrpc"] == "2.0"
    replies, end = asyncio.run(_exchange(url, [{"type": "close"}]))
    assert (replies, end) == ([], "closed 1000")


def test_openenv_mode_variable_selects_production(monkeypatch):
    """`mode=None` reads OPENENV_MODE, as upstream's create_app does; an invalid mode names both valid ones."""
    monkeypatch.setenv("OPENENV_MODE", "production")
    with serve_in_thread(create_app(EchoEnvironment)) as url:
        assert requests.post(url + "/reset", json={}, proxies={"http": None}).status_code in (404, 405)
        assert requests.get(url + "/health", proxies={"http": None}).status_code == 200
    monkeypatch.setenv("OPENENV_MODE", "simulation")
    with serve_in_thread(create_app(EchoEnvironment)) as url:
        assert requests.post(url + "/reset", json={}, proxies={"http": None}).status_code == 200
    with pytest.raises(ValueError) as e:
        create_app(EchoEnvironment, mode="invalid_mode")
    assert all(w in str(e.value).lower() for w in ("mode", "production", "simulation"))


def test_task_api(ours):
    """tests/core/test_task_api.py: the task routes' shapes, 404 for another name, 501 without task methods."""
    url, s = ours.url("probe_plain"), requests.Session()
    s.trust_env = False
    assert s.get(url + "/list_environments").json() == ["probe"]
    assert s.get(url + "/probe/splits").json() == [{"name": "train", "type": "train"}, {"name": "holdout", "type": "validation"}]
    assert s.post(url + "/probe/tasks", json={"split": "holdout"}).json() == {"tasks": [{"id": "holdout-0", "word": "delta"}], "env_name": "probe"}
    assert s.post(url + "/probe/num_tasks", json={"split": "train"}).json() == {"num_tasks": 3}
    assert s.post(url + "/probe/task", json={"split": "train", "index": 1}).json() == {"task": {"id": "train-1", "word": "beta"}}
    assert s.post(url + "/probe/task", json={"split": "train", "index": 3}).status_code == 400
    assert s.post(url + "/probe/task_range", json={"split": "train", "start": 0, "stop": 2}).json() == \
        {"tasks": [{"id": "train-0", "word": "alpha"}, {"id": "train-1", "word": "beta"}]}
    assert s.get(url + "/other_env/splits").status_code == 404
    plain = ours.url("plain")
    assert s.get(plain + "/list_environments").json() == ["plain"]
    assert s.get(plain + "/plain/splits").status_code == 501


NoCapacityFlag = LocalProcessProvider  # without `max_sessions`, `openenv serve` gets no `--max-sessions`: MAX_CONCURRENT_ENVS decides


async def _open_sessions(url, n):
    """Open `n` sessions at once and reset each; the replies (an error frame where one was refused)."""
    async def one():
        ws = await connect(ws_url(url), compression=None)
        try: await ws.send(json.dumps(RESET()))
        except ConnectionClosed: pass  # a refused session's error frame and close (1000) may come before our reset goes out
        try: return ws, json.loads(await ws.recv())
        except ConnectionClosed: return ws, {"closed": True}
    opened = await asyncio.gather(*(one() for _ in range(n)))
    for ws, _ in opened: await ws.close()
    return [r for _, r in opened]


@pytest.mark.parametrize("env, sessions, refused", [({"MAX_CONCURRENT_ENVS": "2"}, 3, 1), ({}, 8, 0)])
def test_max_concurrent_envs(env, sessions, refused, monkeypatch):
    """MAX_CONCURRENT_ENVS sets `openenv serve`'s capacity, as upstream's environment apps read it (64 without it)."""
    monkeypatch.delenv("MAX_CONCURRENT_ENVS", raising=False)
    p = NoCapacityFlag("echo", env_vars=env)
    url = p.start()
    try: replies = asyncio.run(_open_sessions(url, sessions))
    finally: p.stop()
    errors = [r["data"] for r in replies if r.get("type") == "error"]
    assert len(errors) == refused, replies
    for e in errors:
        assert e["code"] == "CAPACITY_REACHED" and e["message"].startswith("Server at capacity: 2/2 sessions active")


def test_capacity_text_is_upstreams(ours):
    (reply,), end = asyncio.run(_capacity_frames(ours.url("echo1")))
    assert reply["data"]["message"] == "Server at capacity: 1/1 sessions active. Cannot accept new connections."
    assert (reply["data"]["active_sessions"], reply["data"]["max_sessions"], end) == (1, 1, "closed 1000")
