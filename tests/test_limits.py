"""Issue 24's server-side limits, against a real server: an HTTP call whose client leaves is stopped and its slot
freed; a batch reply stays under the server's reply cap, each entry that would pass it an error that says so."""
import asyncio
import json
import socket
import threading
import time

import pytest
from websockets.asyncio.client import connect

from openenv_nb.environment import Environment
from openenv_nb.envs.echo import EchoAction, EchoObservation
from openenv_nb.server import create_app, serve_in_thread
from openenv_nb.types import State

DEADLINE_S = 30.0  # how long a condition that must come true may take on a busy machine


class Blocker(Environment[EchoAction, EchoObservation, State]):
    "A step (or reset with `block`) that blocks its thread until the environment is closed, as a sandbox worker's would."
    SUPPORTS_CONCURRENT_SESSIONS = True
    started = threading.Event()
    def __init__(self): super().__init__(); self.stop = threading.Event()
    def reset(self, seed=None, episode_id=None, block: bool = False, **kw):
        if block: self._block()
        return EchoObservation(echoed_message="ready", reward=0.0)
    def step(self, action, timeout_s=None, **kw):
        if action.message == "block": self._block()
        return EchoObservation(echoed_message=action.message, reward=0.0)
    def _block(self):
        Blocker.started.set()
        if not self.stop.wait(120): raise TimeoutError("never closed")
        raise RuntimeError("closed while stepping")
    def close(self): self.stop.set()
    @property
    def state(self): return State()


class Waiter(Blocker):
    "The same, on the event loop: `step_async` waits forever."
    async def step_async(self, action, timeout_s=None, **kw):
        if action.message != "block": return self.step(action)
        Blocker.started.set(); await asyncio.Event().wait()


def wait_for(what, bound=DEADLINE_S):
    "Wait until `what()` is true, at most `bound` seconds; whether it came true."
    cv, end = threading.Condition(), time.monotonic() + bound
    with cv:
        return cv.wait_for(what, timeout=bound) if what() else _poll(cv, what, end)


def _poll(cv, what, end):
    while not what():
        if time.monotonic() >= end: return False
        cv.wait(0.02)
    return True


def post_and_drop(url: str, path: str, body: bytes):
    "Send a POST, wait until the environment is busy with it, then drop the socket unanswered."
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)))
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    assert Blocker.started.wait(DEADLINE_S), "the call never started"
    s.close()


@pytest.mark.parametrize("env,path,body", [
    (Blocker, "/step", b'{"action": {"message": "block"}}'),  # the fast path
    (Blocker, "/step", b'{"action": {"message": "block"}, "x": NaN}'),  # FastAPI's path (orjson refuses NaN)
    (Blocker, "/reset", b'{"block": true}'),
    (Waiter, "/step", b'{"action": {"message": "block"}}'),  # an async step: cancelled
])
def test_a_client_that_leaves_frees_its_slot(env, path, body):
    Blocker.started.clear()
    app = create_app(env, max_concurrent_envs=1)
    hub = app.state.hub
    with serve_in_thread(app) as url:
        post_and_drop(url, path, body)
        # freed long before the blocked call would end (120 s): by the disconnect
        assert wait_for(lambda: hub.active == 0), f"slot still held: {hub.health()}"
        # and the server serves the next client
        import requests
        assert requests.post(url + "/step", json={"action": {"message": "hi"}}, timeout=DEADLINE_S).status_code == 200


class Loud(Environment[EchoAction, EchoObservation, State]):
    "Every step returns 40 KB, as a coding step that prints its fill of stdout and stderr."
    SUPPORTS_CONCURRENT_SESSIONS = True
    def reset(self, seed=None, episode_id=None, **kw): return EchoObservation(echoed_message="", reward=0.0)
    def step(self, action, timeout_s=None, **kw):
        return EchoObservation(echoed_message="x" * 40_000, message_length=40_000, reward=1.0)
    @property
    def state(self): return State()


@pytest.fixture(scope="module")
def loud():
    import os
    os.environ["OPENENV_MAX_REPLY_SIZE"] = str(1 << 20)
    try: app = create_app(Loud, max_concurrent_envs=64)
    finally: del os.environ["OPENENV_MAX_REPLY_SIZE"]
    assert app.state.hub.max_reply == 1 << 20
    with serve_in_thread(app) as url: yield url


async def batch_reply(url, msg, opened=4):
    async with connect(url.replace("http", "ws", 1) + "/ws", max_size=None,
                       additional_headers={"x-openenv-extensions": "request-id, batch"}) as ws:
        await ws.send(json.dumps({"type": "batch.open", "data": {"count": opened}})); await ws.recv()
        await ws.send(json.dumps(msg))
        raw = await asyncio.wait_for(ws.recv(), DEADLINE_S)
        await ws.send('{"type": "batch.reset", "data": {"envs": [0]}, "id": "after"}')
        after = json.loads(await asyncio.wait_for(ws.recv(), DEADLINE_S))
        return len(raw.encode()), json.loads(raw), after


@pytest.mark.parametrize("msg", [
    {"type": "batch", "data": {"ops": [{"env": 0, "type": "step", "data": {"message": "a"}}] * 200}},
    {"type": "batch", "data": {"ops": [{"env": i % 4, "type": "step", "data": {"message": "a"}} for i in range(200)]}},
    {"type": "batch.step", "data": {"envs": list(range(64)), "actions": [{"message": "a"}] * 64}},
])
def test_a_batch_reply_stays_under_the_cap(loud, msg):
    n = 64 if msg["type"] == "batch.step" else 200
    size, out, after = asyncio.run(batch_reply(loud, msg, 64 if n == 64 else 4))
    assert size <= 1 << 20  # against 8 MB unbounded
    errs = (out["data"]["errors"] if out["type"] == "batch.results"
            else [r["data"] if r["type"] == "error" else None for r in out["data"]["results"]])
    kept = [e is None for e in errs]
    assert 0 < sum(kept) < n and kept == sorted(kept, reverse=True)  # the first ones, while they fit
    e = next(e for e in errs if e is not None)
    assert e["code"] == "EXECUTION_ERROR" and e["max_reply_size"] == 1 << 20
    assert "OPENENV_MAX_REPLY_SIZE" in e["message"] and "bytes" in e["message"]
    assert after["id"] == "after" and after["data"]["errors"] == [None]  # the session goes on


def test_a_single_reply_over_the_cap_is_an_error_and_the_session_goes_on():
    app = create_app(Loud)
    app.state.hub.max_reply = 10_000
    async def go(url):
        async with connect(url.replace("http", "ws", 1) + "/ws",
                           additional_headers={"x-openenv-extensions": "request-id"}) as ws:
            await ws.send('{"type": "step", "data": {"message": "a"}, "id": 1}')
            big = json.loads(await ws.recv())
            await ws.send('{"type": "reset", "id": 2}')
            return big, json.loads(await ws.recv())
    with serve_in_thread(app) as url: big, ok = asyncio.run(go(url))
    assert (big["id"], big["data"]["code"], big["data"]["max_reply_size"]) == (1, "EXECUTION_ERROR", 10_000)
    assert (ok["id"], ok["type"]) == (2, "observation")
