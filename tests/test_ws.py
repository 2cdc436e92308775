"""The WebSocket session protocol against a real server in a subprocess."""
import asyncio
import json
import threading

import pytest
import requests
from websockets.asyncio.client import connect

from openenv_nb.client import ws_url
from openenv_nb.environment import Environment
from openenv_nb.envs.echo import EchoAction, EchoEnv, EchoEnvironment
from openenv_nb.server import create_app, serve_in_thread
from websockets.exceptions import ConnectionClosedError


class Gate(EchoEnvironment):
    """Echo whose step 'wait' blocks, in the server's thread pool, until another session steps 'open' (served as
    `test_ws:Gate`): a server that let one session stall the others would never answer the 'open'."""
    SUPPORTS_CONCURRENT_SESSIONS = True
    opened = threading.Event()
    def step(self, action, timeout_s=None, **kwargs):
        if action.message == "open": Gate.opened.set()
        if action.message == "wait" and not Gate.opened.wait(60): raise TimeoutError("no session stepped 'open'")
        return super().step(action, timeout_s, **kwargs)
    step_async = Environment.step_async  # blocking methods: run in the thread pool


async def raw(url, *frames, extensions=None):
    """Send each frame on one raw connection and collect the replies (a `close` frame gets none)."""
    headers = {"x-openenv-extensions": extensions} if extensions else None
    async with connect(ws_url(url), compression=None, max_size=None, additional_headers=headers) as ws:
        replies = []
        for f in frames:
            await ws.send(f if isinstance(f, (str, bytes)) else json.dumps(f))
            replies.append(json.loads(await ws.recv()))
        return replies


def health(url): return requests.get(url + "/health", timeout=5).json()


def test_episode_matches_protocol_example(echo_url):
    r = asyncio.run(raw(echo_url, {"type": "reset", "data": {"seed": 1, "episode_id": "e1"}}, {"type": "step", "data": {"message": "hi"}},
                        {"type": "state"}, {"type": "bogus"}))
    meta = {"original_message": "hi", "step": 1}  # kept in `observation` and copied beside it, as OpenEnv 0.10 does
    assert r == [
        {"type": "observation", "data": {"observation": {"metadata": {}, "echoed_message": "Echo environment ready!", "message_length": 0}, "reward": 0.0, "done": False}},
        {"type": "observation", "data": {"observation": {"metadata": meta, "echoed_message": "hi", "message_length": 2}, "reward": 0.2, "done": False, "metadata": meta}},
        {"type": "state", "data": {"episode_id": "e1", "step_count": 1}},
        {"type": "error", "data": {"message": "Unknown message type: bogus", "code": "UNKNOWN_TYPE"}},
    ]


def test_extensions_are_negotiated(echo_url):
    async def go():
        async with connect(ws_url(echo_url), additional_headers={"x-openenv-extensions": "metadata"}) as ws:  # an old client
            offered = set(ws.response.headers["x-openenv-extensions"].split(", "))
            assert offered >= {"request-id", "step-kwargs"} and "metadata" not in offered  # metadata is no extension: always sent
            await ws.send(json.dumps({"type": "reset", "id": "a"}))
            await ws.send(json.dumps({"type": "step", "data": {"message": "yo"}, "id": 42}))
            return [json.loads(await ws.recv()) for _ in range(2)]
    reset, step = asyncio.run(go())
    assert reset["id"] == "a" and step["id"] == 42
    assert step["data"]["metadata"] == {"original_message": "yo", "step": 1}
    plain = asyncio.run(raw(echo_url, {"type": "step", "data": {"message": "yo"}}))[0]
    assert "id" not in plain  # an OpenEnv client sees the plain core, metadata included (as OpenEnv 0.10 sends it)
    assert plain["data"]["metadata"] == plain["data"]["observation"]["metadata"] == {"original_message": "yo", "step": 1}


MALFORMED = [
    ("not json", "{nope", "INVALID_JSON"),
    ("a JSON list", "[1, 2]", "INVALID_JSON"),
    ("JSON nested too deeply", "[" * 100_000 + "]" * 100_000, "INVALID_JSON"),
    ("a binary frame", b'{"type": "state"}', "INVALID_JSON"),
    ("a type that is not a string", {"type": 5}, "UNKNOWN_TYPE"),
    ("an unknown type", {"type": "jump"}, "UNKNOWN_TYPE"),
    ("step without data", {"type": "step"}, "VALIDATION_ERROR"),
    ("data of the wrong type", {"type": "step", "data": "hi"}, "VALIDATION_ERROR"),
    ("an action field of the wrong type", {"type": "step", "data": {"message": 3}}, "VALIDATION_ERROR"),
    ("an action with an unknown field", {"type": "step", "data": {"message": "a", "volume": 11}}, "VALIDATION_ERROR"),
    ("a missing action field", {"type": "step", "data": {}}, "VALIDATION_ERROR"),
    ("a negative seed", {"type": "reset", "data": {"seed": -1}}, "VALIDATION_ERROR"),
    ("an episode id too long", {"type": "reset", "data": {"episode_id": "x" * 256}}, "VALIDATION_ERROR"),
    ("an unknown top-level key", {"type": "state", "extra": 1}, "VALIDATION_ERROR"),
    ("a bad request id", {"type": "state", "id": [1]}, "VALIDATION_ERROR"),
    ("a 10 MB frame", {"type": "step", "data": {"message": "x" * 10_000_000}}, "VALIDATION_ERROR"),
]


@pytest.mark.parametrize("what,frame,code", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_input_gets_its_code_and_the_session_goes_on(echo_url, what, frame, code):
    reset, err, step = asyncio.run(raw(echo_url, {"type": "reset", "data": {"episode_id": "m"}}, frame, {"type": "step", "data": {"message": "ok"}}))
    assert err["type"] == "error" and err["data"]["code"] == code, err
    assert err["data"]["message"]
    if code == "VALIDATION_ERROR": assert isinstance(err["data"]["errors"], list) and err["data"]["errors"]
    assert step["data"]["observation"]["echoed_message"] == "ok"
    assert health(echo_url)["status"] == "healthy"


def test_64_concurrent_sessions_keep_their_own_state(echo_url):
    async def session(i):
        async with EchoEnv(echo_url) as env:
            await env.reset(episode_id=f"ep-{i}")
            for k in range(i % 5 + 1):
                r = await env.step(EchoAction(message=f"{i}:{k}"))
                assert r.observation.echoed_message == f"{i}:{k}"
            return (await env.state())
    async def all_of_them(): return await asyncio.gather(*[session(i) for i in range(64)])
    states = asyncio.run(all_of_them())
    assert [(s.episode_id, s.step_count) for s in states] == [(f"ep-{i}", i % 5 + 1) for i in range(64)]


def test_capacity_refusal_and_recovery(server):
    url = server("echo", max_sessions=2)
    async def go():
        a = await connect(ws_url(url)); b = await connect(ws_url(url))
        for ws in (a, b): await ws.send('{"type":"reset"}'); await ws.recv()
        assert health(url)["active_sessions"] == 2
        refused = await connect(ws_url(url))
        err = json.loads(await refused.recv())
        await refused.wait_closed()
        await a.close()
        for _ in range(100):
            if health(url)["active_sessions"] < 2: break
            await asyncio.sleep(0.02)
        again = await raw(url, {"type": "reset"})
        await b.close()
        return err, again
    err, again = asyncio.run(go())
    assert err["data"]["code"] == "CAPACITY_REACHED" and (err["data"]["active_sessions"], err["data"]["max_sessions"]) == (2, 2)
    assert again[0]["type"] == "observation"


def test_an_environment_that_raises_fails_only_its_own_session(server):
    url = server("helpers:Flaky")
    async def go():
        async with EchoEnv(url) as calm, connect(ws_url(url)) as ws:
            await calm.reset()
            await ws.send('{"type":"reset"}'); await ws.recv()
            await ws.send(json.dumps({"type": "step", "data": {"message": "boom"}}))
            err = json.loads(await ws.recv())
            calm_step = await calm.step(EchoAction(message="still here"))
            await ws.send(json.dumps({"type": "step", "data": {"message": "after"}}))
            return err, calm_step, json.loads(await ws.recv())
    err, calm_step, after = asyncio.run(go())
    assert err["data"] == {"message": "RuntimeError: the environment blew up", "code": "EXECUTION_ERROR"}
    assert calm_step.observation.echoed_message == "still here"
    assert after["data"]["observation"]["echoed_message"] == "after"


def test_a_factory_that_fails_gives_factory_error(server):
    url = server("helpers:broken_factory", max_sessions=1)
    async def first_frame():  # sent unasked, then the server closes: read it without sending first
        async with connect(ws_url(url)) as ws: return json.loads(await ws.recv())
    err = asyncio.run(first_frame())
    assert err["data"]["code"] == "FACTORY_ERROR" and "no such resource" in err["data"]["message"]
    assert health(url)["active_sessions"] == 0
    r = requests.post(url + "/reset")
    assert r.status_code == 500 and r.json()["detail"] == {
        "code": "FACTORY_ERROR", "message": "Could not create the environment: OSError: no such resource"}


def test_a_slow_session_does_not_stall_the_others(server):
    url = server("test_ws:Gate", max_sessions=8)
    async def go():
        async with EchoEnv(url) as slow, EchoEnv(url) as quick:
            await slow.reset(); await quick.reset()
            waiting = asyncio.create_task(slow.step(EchoAction(message="wait")))  # blocks a pool thread until "open"
            for _ in range(20): await quick.step(EchoAction(message="fast"))  # would never be answered if it stalled
            await quick.step(EchoAction(message="open"))
            return await waiting
    assert asyncio.run(go()).observation.echoed_message == "wait"


def test_an_abandoned_connection_is_reaped(server):
    url = server("echo", "--session-timeout", "1", max_sessions=1)
    async def go():
        ws = await connect(ws_url(url), ping_interval=None)  # opens a session, then goes silent
        await ws.send('{"type":"reset"}'); await ws.recv()
        assert health(url)["active_sessions"] == 1
        reaped = json.loads(await asyncio.wait_for(ws.recv(), 5))
        for _ in range(100):
            if health(url)["active_sessions"] == 0: break
            await asyncio.sleep(0.02)
        return reaped, health(url)["active_sessions"], await raw(url, {"type": "reset"})
    reaped, active, again = asyncio.run(go())
    assert reaped["data"]["code"] == "SESSION_ERROR" and "without a message" in reaped["data"]["message"]
    assert active == 0 and again[0]["type"] == "observation"


def test_close_message_ends_the_session(server):
    url = server("echo", max_sessions=1)
    async def go():
        async with connect(ws_url(url)) as ws:
            await ws.send('{"type":"close"}')
            await ws.wait_closed()
        for _ in range(100):
            if health(url)["active_sessions"] == 0: return True
            await asyncio.sleep(0.02)
    assert asyncio.run(go())


BIG = json.dumps({"type": "step", "data": {"message": "x" * (20 << 20)}})  # a 20 MB frame


def test_a_20_mb_frame_passes_when_configured():
    with serve_in_thread(create_app(EchoEnvironment, max_message_size=100 << 20)) as url:
        (reply,) = asyncio.run(raw(url, BIG))
    assert reply["data"]["observation"]["message_length"] == 20 << 20


def test_a_20_mb_frame_is_refused_by_default():
    async def send_big(url):
        async with connect(ws_url(url), compression=None, max_size=None) as ws:
            await ws.send(BIG)
            await ws.recv()
    with serve_in_thread(create_app(EchoEnvironment)) as url, pytest.raises(ConnectionClosedError) as e:
        asyncio.run(send_big(url))
    assert e.value.rcvd.code == 1009 and "exceeds limit of 16777216 bytes" in e.value.rcvd.reason  # from the transport


def test_pipelined_frames_are_all_answered_in_order(echo_url):
    "A client that sends 200 steps without waiting gets 200 answers, in order: reads pause and resume as the server keeps up."
    async def run():
        async with connect(ws_url(echo_url), compression=None) as ws:
            await ws.send(json.dumps({"type": "reset", "data": {}})); await ws.recv()
            for k in range(200): await ws.send(json.dumps({"type": "step", "data": {"message": f"m{k}"}}))
            return [json.loads(await ws.recv())["data"]["observation"]["echoed_message"] for _ in range(200)]
    assert asyncio.run(run()) == [f"m{k}" for k in range(200)]


class Timed(EchoEnvironment):
    """Echo that says, in its metadata, the `timeout_s` its step was given."""
    SUPPORTS_CONCURRENT_SESSIONS = True
    def step(self, action, timeout_s=None, **kwargs):
        obs = super().step(action)
        obs.metadata["timeout_s"] = timeout_s
        return obs


def test_ws_step_sends_its_keyword_arguments():
    "`EnvClient.step(action, timeout_s=...)` over WebSocket reaches the environment (`step-kwargs`), cut to the server's cap."
    with serve_in_thread(create_app(Timed, max_timeout_s=10)) as url:
        async def run():
            async with EchoEnv(url) as env:
                assert "step-kwargs" in env.extensions
                await env.reset()
                given = (await env.step(EchoAction(message="hi"), timeout_s=2.5)).observation.metadata["timeout_s"]
                capped = (await env.step(EchoAction(message="hi"), timeout_s=600)).observation.metadata["timeout_s"]
                plain = (await env.step(EchoAction(message="hi"))).observation.metadata["timeout_s"]
                return given, capped, plain
        assert asyncio.run(run()) == (2.5, 10, None)


def test_ws_step_refuses_keyword_arguments_a_server_does_not_take():
    "Against a server that does not offer `step-kwargs` (an OpenEnv one), they are refused, never dropped."
    with serve_in_thread(create_app(Timed)) as url:
        async def run():
            class OldEcho(EchoEnv): wanted = ("request-id",)  # as a client that does not know the extension
            async with OldEcho(url) as env:
                await env.reset()
                with pytest.raises(TypeError, match="step-kwargs"): await env.step(EchoAction(message="hi"), timeout_s=2)
        asyncio.run(run())
