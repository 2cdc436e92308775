"""Bad input in every field of every message (issue 24): lone surrogates, `NaN`, infinities, huge and deeply nested
numbers, over WebSocket (`/ws`, plain and `batch`), HTTP (`/reset`, `/step`, the Task API) and `/mcp`.

No input may give a 500, a logged traceback, a dead session or a hang: after each bad frame the same socket answers a
good reset. The generator is seeded and its loops bounded, so a failure replays exactly.
"""
import asyncio
import json
import logging
import random

import pytest
import requests
from websockets.asyncio.client import connect

from openenv_nb.envs.echo import EchoEnvironment
from openenv_nb.server import create_app, serve_in_thread

WAIT_S = 20.0  # the longest one reply may take on a busy machine
SEED, MUTANTS = 24, 150  # the random frames: the generator's seed, how many per socket

STRINGS = ['"\\ud800"', '"a\\udfffb"', '"\\udc00\\ud800"', '"\\ud83d"']  # lone surrogates, escaped
NUMBERS = ["NaN", "Infinity", "-Infinity", "1e308", "-1e308", "1e400", "-1e400", "1" + "0" * 400,
           "-" + "9" * 400, "4.9e-324", "18446744073709551616"]
NESTED = ["[" * 300 + "]" * 300, '{"a":' * 300 + "1" + "}" * 300, "[" * 5000 + "]" * 5000]
OTHER = ["null", "true", "[]", "{}", "-1", "0", '""', '"x"', '["\\ud800", NaN, {"\\udfff": Infinity}]']
VALUES = STRINGS + NUMBERS + NESTED + OTHER
KEYS = STRINGS + ['"type"', '"id"', '"data"']

def filled(template: str) -> list[str]:
    "Every text `template` makes with each bad value in `$` (and each bad key in `$K`)."
    out = []
    if "$K" in template: out += [template.replace("$K", k) for k in KEYS]
    if "$V" in template: out += [template.replace("$V", v) for v in VALUES]
    return out

WS = [  # plain sessions: every field of reset, step, state and mcp messages, and the frame's own
    '{"type":"reset","data":{"seed":$V,"episode_id":"e"}}', '{"type":"reset","data":{"episode_id":$V}}',
    '{"type":"reset","data":{$K:1}}', '{"type":"reset","data":$V}', '{"type":$V}', '{"type":"reset","id":$V}',
    '{$K:"reset"}', '{"type":"reset",$K:1}', '$V',
    '{"type":"step","data":{"message":$V}}', '{"type":"step","data":{"message":"x","metadata":$V}}',
    '{"type":"step","data":{"message":"x","metadata":{$K:$V}}}', '{"type":"step","data":{$K:"x"}}',
    '{"type":"step","data":{"message":"x"},"kwargs":{"timeout_s":$V}}', ('{"type":"step","data":{"message":"x"},'
    '"kwargs":$V}'), '{"type":"step","data":{"message":"x"},"kwargs":{$K:1}}', '{"type":"step","data":$V,"id":$V}',
    '{"type":"state","id":$V}', '{"type":"state","data":$V}', '{"type":"close","data":$V}',
    '{"type":"mcp","data":{"jsonrpc":"2.0","id":$V,"method":"tools/list"}}',
    '{"type":"mcp","data":{"jsonrpc":"2.0","id":1,"method":$V}}', '{"type":"mcp","data":{"jsonrpc":$V,"id":1}}',
    '{"type":"mcp","data":{"jsonrpc":"2.0","id":1,"method":"tools/call","params":$V}}',
    '{"type":"mcp","data":{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":$V,"arguments":{}}}}',
    ('{"type":"mcp","data":{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo_message",'
    '"arguments":{"message":$V}}}}'), ('{"type":"mcp","data":{"jsonrpc":"2.0","id":1,"method":"tools/call",'
    '"params":{"name":"echo_message","arguments":{$K:1}}}}'), '{"type":"mcp","data":$V}',
    '{"type":"mcp","data":{"jsonrpc":"2.0","id":1,"method":"openenv/session/close","params":{"session_id":$V}}}',
]
BATCH = [  # batch connections: every field of the batch messages
    '{"type":"batch.open","data":{"count":$V}}', '{"type":"batch.open","data":$V}',
    '{"type":"batch","data":{"ops":[{"env":$V,"type":"step","data":{"message":"x"}}]}}',
    '{"type":"batch","data":{"ops":[{"env":0,"type":$V,"data":{}}]}}',
    '{"type":"batch","data":{"ops":[{"env":0,"type":"step","data":{"message":$V}}]}}',
    '{"type":"batch","data":{"ops":[{"env":0,"type":"reset","data":{"seed":$V}}]}}',
    '{"type":"batch","data":{"ops":$V}}', '{"type":"batch","data":{"ops":[$V]}}',
    '{"type":"batch.step","data":{"envs":[0],"actions":[{"message":$V}]}}',
    '{"type":"batch.step","data":{"envs":[$V],"actions":[{"message":"x"}]}}',
    '{"type":"batch.step","data":{"envs":[0],"actions":[$V]}}',
    '{"type":"batch.step","data":{"envs":[0],"actions":[{"message":"x"}],"resets":[$V]}}',
    '{"type":"batch.step","data":{"envs":[0],"actions":[{$K:1}]}}',
    '{"type":"batch.reset","data":{"envs":[0],"seeds":[$V]}}', ('{"type":"batch.reset","data":{"envs":[0],'
    '"kwargs":{"episode_id":$V}}}'), '{"type":"batch.reset","data":{"envs":[0],"kwargs":{$K:$V}}}',
    '{"type":"batch.close","data":{"envs":[$V]}}', '{"type":"batch.close","data":{"envs":$V}}',
    '{"type":"batch.reset","data":{"envs":[0]},"id":$V}',
]

def mutants(templates: list[str], n: int, seed: int) -> list[str]:
    "`n` frames made by a seeded generator: random templates, each `$` a random bad value."
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        t = rng.choice(templates)
        while "$V" in t: t = t.replace("$V", rng.choice(VALUES), 1)
        while "$K" in t: t = t.replace("$K", rng.choice(KEYS), 1)
        out.append(t)
    return out


@pytest.fixture(scope="module")
def url():
    with serve_in_thread(create_app(EchoEnvironment, max_concurrent_envs=16)) as u: yield u


@pytest.fixture
def no_tracebacks(caplog):
    caplog.set_level(logging.ERROR)
    yield
    bad = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not bad, bad[:3]


async def survive(url: str, frames: list[str], ext: str = "", setup: tuple = ()):
    "Send each frame on one socket; each gets a JSON reply that is no SESSION_ERROR, then a good reset is answered."
    heads = {"x-openenv-extensions": "request-id, " + ext}
    async with connect(url.replace("http", "ws", 1) + "/ws", additional_headers=heads, max_size=None,
                       open_timeout=WAIT_S) as ws:
        async def ask(text):
            await ws.send(text)
            return json.loads(await asyncio.wait_for(ws.recv(), WAIT_S))
        for text in setup: await ask(text)
        good = '{"type":"batch.reset","data":{"envs":[0]},"id":"ok"}' if "batch" in ext \
               else '{"type":"reset","id":"ok"}'
        for text in frames:  # none is a valid `close` (which ends a session on purpose, unanswered)
            out = await ask(text)
            assert isinstance(out, dict) and "type" in out, (text[:200], out)
            assert out.get("data", {}).get("code") != "SESSION_ERROR", (text[:200], out)
            again = await ask(good)
            assert again["type"] in ("observation", "batch.results") and again["id"] == "ok", (text[:200], again)


def test_websocket_session_survives_every_bad_field(url, no_tracebacks):
    frames = [f for t in WS for f in filled(t)]
    asyncio.run(survive(url, frames))
    asyncio.run(survive(url, mutants(WS, MUTANTS, SEED)))


def test_batch_connection_survives_every_bad_field(url, no_tracebacks):
    opened = ('{"type":"batch.open","data":{"count":2}}',)
    frames = [f for t in BATCH for f in filled(t)]
    asyncio.run(survive(url, frames, "batch", opened))
    asyncio.run(survive(url, mutants(BATCH, MUTANTS, SEED + 1), "batch", opened))


SNAPSHOTS = [  # sessions that asked for `snapshot`: every field of snapshot and restore, and odd blobs
    '{"type":"snapshot","data":$V}', '{"type":"snapshot","data":{"portable":$V}}', '{"type":"snapshot","data":{$K:1}}',
    '{"type":"snapshot","id":$V}', '{"type":"restore","data":{"snapshot_id":$V}}', '{"type":"restore","data":$V}',
    '{"type":"restore","data":{"blob":$V}}', '{"type":"restore","data":{"snapshot_id":"x","blob":$V}}',
    '{"type":"restore","data":{$K:"x"}}', '{"type":"restore","data":{"snapshot_id":"x",$K:$V}}',
]
BLOBS = ['"."', '"a.b"', '"..."', '"' + "A" * 5000 + '.' + "B" * 43 + '"', '"\\u0000.\\u0000"',
         '"e30.AAAA"', '"eyJ0YXJnZXQiOjF9.' + "A" * 43 + '"']


def test_snapshot_messages_survive_every_bad_field(no_tracebacks):
    setup = ('{"type":"reset","data":{"seed":1}}', '{"type":"step","data":{"message":"x"}}')
    frames = [f for t in SNAPSHOTS for f in filled(t)]
    frames += [f'{{"type":"restore","data":{{"blob":{b}}}}}' for b in BLOBS]
    with serve_in_thread(create_app(EchoEnvironment, max_concurrent_envs=4, snapshot_key="k")) as keyed:
        asyncio.run(survive(keyed, frames, "snapshot", setup))
        asyncio.run(survive(keyed, mutants(SNAPSHOTS, MUTANTS, SEED + 2), "snapshot", setup))


HTTP = [  # (path, body template)
    ("/reset", '{"seed":$V}'), ("/reset", '{"episode_id":$V}'), ("/reset", '{$K:1}'), ("/reset", "$V"),
    ("/reset", '{"seed":1,"episode_id":"e",$K:$V}'),
    ("/step", '{"action":{"message":$V}}'), ("/step", '{"action":$V}'), ("/step", '{"action":{$K:"x"}}'),
    ("/step", '{"action":{"message":"x"},"timeout_s":$V}'), ("/step", '{"action":{"message":"x"},"request_id":$V}'),
    ("/step", '{"action":{"message":"x","metadata":{$K:$V}}}'), ("/step", '{"action":{"message":"x"},$K:$V}'),
    ("/step", "$V"),
    ("/EchoEnvironment/tasks", '{"split":$V}'), ("/EchoEnvironment/num_tasks", '{"split":$V}'),
    ("/EchoEnvironment/task", '{"split":$V,"index":0}'), ("/EchoEnvironment/task", '{"split":"train","index":$V}'),
    ("/EchoEnvironment/task_range", '{"split":"train","start":$V,"stop":$V}'),
    ("/EchoEnvironment/task", '{"split":"train","index":0,$K:1}'), ("/EchoEnvironment/task", "$V"),
    ("/mcp", '{"jsonrpc":"2.0","id":$V,"method":"tools/list"}'), ("/mcp", '{"jsonrpc":"2.0","id":1,"method":$V}'),
    ("/mcp", '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":$V}'),
    ("/mcp", '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":$V,"arguments":{}}}'),
    ("/mcp", ('{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo_message","arguments":'
             '{"message":$V}}}')), ("/mcp", ('{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":'
             '"echo_message","arguments":{$K:$V}}}')), ("/mcp", "$V"), ("/mcp", '[$V]'),
    ("/mcp", '{"jsonrpc":"2.0","id":1,"method":"openenv/session/close","params":{"session_id":$V}}'),
]


def test_http_routes_answer_every_bad_field_below_500(url, no_tracebacks):
    rng = random.Random(SEED)
    cases = [(p, b) for p, t in HTTP for b in filled(t)]
    for k in range(MUTANTS):  # a route's own templates, bad values drawn at random
        path = rng.choice(HTTP)[0]
        cases += [(path, b) for b in mutants([t for p, t in HTTP if p == path], 1, SEED + 2 + k)]
    with requests.Session() as s:
        for path, body in cases:
            for ctype in ("application/json", "text/plain"):
                r = s.post(url + path, data=body.encode(), headers={"content-type": ctype}, timeout=WAIT_S)
                assert r.status_code < 500, (path, body[:200], r.status_code, r.text[:300])
                r.json()  # an answer in JSON, never a bare error page
        for path in ("/%ED%A0%80/splits", "/EchoEnvironment%ED%A0%80/splits", "/%ED%A0%80/task"):
            assert s.get(url + path, timeout=WAIT_S).status_code < 500, path
        assert s.get(url + "/health", timeout=WAIT_S).json()["active_sessions"] == 0


def test_raw_surrogate_bytes_in_a_body_are_a_4xx(url, no_tracebacks):
    "A body that is not UTF-8 at all (a surrogate written raw, a stray byte) is refused, not a 500."
    for path in ("/reset", "/step", "/mcp", "/EchoEnvironment/task"):
        for raw in (b'{"seed": "\xed\xa0\x80"}', b'{"action": {"message": "\xff"}}', b"\xff\xfe"):
            r = requests.post(url + path, data=raw, headers={"content-type": "application/json"}, timeout=WAIT_S)
            assert r.status_code < 500, (path, raw, r.status_code, r.text[:200])


def test_mcp_socket_survives_bad_frames(url, no_tracebacks):
    async def go():
        async with connect(url.replace("http", "ws", 1) + "/mcp", open_timeout=WAIT_S) as ws:
            for text in [f for _, t in HTTP if _ == "/mcp" for f in filled(t)]:
                await ws.send(text)
                out = json.loads(await asyncio.wait_for(ws.recv(), WAIT_S))
                assert out.get("jsonrpc") == "2.0", (text[:200], out)
                await ws.send('{"jsonrpc":"2.0","id":"ok","method":"tools/list"}')
                assert json.loads(await asyncio.wait_for(ws.recv(), WAIT_S))["id"] == "ok", text[:200]
    asyncio.run(go())
