"""The doors and caps of a server (issue 13): origins, tokens, step time limits, capacity, body size, connections, ages.

Each test stands for a finding of the review, against a real server (uvicorn in a thread, or `openenv serve` in a
subprocess), and fails on the code before the fix: finding 1 (cross-site WebSockets), 5 (the server's side of
`timeout_s`), 6 (HTTP calls outside capacity), 8 (no body limit), 9 (unbounded connections, idle pages, ageless
sessions) and 11 (no token).
"""
import asyncio
import base64
import json
import logging
import select
import socket
import threading

import pytest
import requests
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from openenv_nb.client import GenericEnvClient, HTTPEnvClient, ws_url
from openenv_nb.envs.echo import EchoAction, EchoEnv, EchoEnvironment, EchoHTTPEnv
from openenv_nb.environment import Environment
from openenv_nb.providers import LocalProcessProvider
from openenv_nb.server import create_app, serve_in_thread
from openenv_nb.types import EnvConnectionError, EnvServerError

EVIL = "http://evil.example"
DEADLINE_S = 30.0  # how long a condition that must come true may take on a busy machine before the test fails
TOKEN = "s3cret-t0ken"


def page_url(url): return ws_url(url)[: -len("/ws")] + "/ws/ui"


async def handshake(url, **kw):
    """Open a WebSocket to `url` and close it; the refusal's status (an int), or the first frame when accepted."""
    try:
        async with connect(url, compression=None, open_timeout=10, **kw) as ws:
            return json.loads(await asyncio.wait_for(ws.recv(), 10)) if url.endswith("/ws/ui") else ws.subprotocol or "open"
    except InvalidStatus as e: return e.response.status_code


def protocols(token): return ["openenv", "openenv.bearer." + base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")]


def until(what, attempts=300, pause=0.05):
    """Wait (on the loop of the caller) until `what()` is true; the last value."""
    async def go():
        for _ in range(attempts):
            if v := what(): return v
            await asyncio.sleep(pause)
        return what()
    return asyncio.run(go())


# ------------------------------------------------------------------ finding 1: cross-site WebSocket hijacking

@pytest.fixture(scope="module")
def web_url():
    with serve_in_thread(create_app(EchoEnvironment, web=True, max_concurrent_envs=8)) as url: yield url


def test_a_page_from_another_site_cannot_open_a_socket(web_url):
    own = web_url  # the page's own origin is the address it was served from: http://127.0.0.1:PORT
    for path in (ws_url(web_url), page_url(web_url)):
        assert asyncio.run(handshake(path, origin=EVIL)) == 403, path
        assert asyncio.run(handshake(path, origin="null")) == 403, path  # a sandboxed frame or a file
        assert asyncio.run(handshake(path, origin=own.replace("127.0.0.1", "localhost"))) == 403, path  # another host
        assert asyncio.run(handshake(path, origin=own)) != 403, path
        assert asyncio.run(handshake(path)) != 403, path  # no Origin: a trainer, not a browser


def test_the_refusal_says_why(web_url):
    r = requests.post(web_url + "/web/step", json={"action": {"message": "hi"}}, headers={"Origin": EVIL}, timeout=10)
    assert r.status_code == 403
    assert r.json()["detail"]["code"] == "FORBIDDEN_ORIGIN" and "allow_origins" in r.json()["detail"]["message"]


@pytest.mark.parametrize("route,body", [("/reset", {}), ("/step", {"action": {"message": "x"}}), ("/web/reset", {}),
                                        ("/web/step", {"action": {"message": "x"}}),
                                        ("/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})])
def test_state_changing_routes_refuse_other_sites(web_url, route, body):
    before = requests.get(web_url + "/web/state", timeout=10).json()
    assert requests.post(web_url + route, json=body, headers={"Origin": EVIL}, timeout=10).status_code == 403
    assert requests.get(web_url + "/web/state", timeout=10).json() == before  # the page's episode was not touched
    assert requests.post(web_url + route, json=body, headers={"Origin": web_url}, timeout=10).status_code == 200
    assert requests.post(web_url + route, json=body, timeout=10).status_code == 200
    assert requests.get(web_url + "/health", headers={"Origin": EVIL}, timeout=10).status_code == 200  # reads stay open


def test_origins_can_be_allowed(monkeypatch):
    with serve_in_thread(create_app(EchoEnvironment, allow_origins=["http://lab.example:3000"])) as url:
        assert asyncio.run(handshake(ws_url(url), origin="http://lab.example:3000")) == "open"
        assert asyncio.run(handshake(ws_url(url), origin="http://lab.example")) == 403  # another port
    monkeypatch.setenv("OPENENV_ALLOW_ORIGINS", "http://lab.example:3000, https://nb.example")
    with serve_in_thread(create_app(EchoEnvironment)) as url:
        assert requests.post(url + "/reset", headers={"Origin": "https://nb.example"}, timeout=10).status_code == 200
        assert requests.post(url + "/reset", headers={"Origin": EVIL}, timeout=10).status_code == 403


def test_behind_a_proxy_the_forwarded_origin_is_the_servers_own(web_url):
    headers = {"Origin": "https://me-env.hf.space", "X-Forwarded-Proto": "https", "X-Forwarded-Host": "me-env.hf.space"}
    assert requests.post(web_url + "/reset", headers=headers, timeout=10).status_code == 200
    space = {"Origin": "https://me-env.hf.space", "Host": "me-env.hf.space"}  # a proxy that ends TLS and says nothing
    assert requests.post(web_url + "/reset", headers=space, timeout=10).status_code == 200
    assert requests.post(web_url + "/reset", headers=space | {"X-Forwarded-Proto": "http"}, timeout=10).status_code == 403


def test_openenv_serve_refuses_other_sites(server):
    url = server("echo", "--web", max_sessions=4)
    assert asyncio.run(handshake(page_url(url), origin=EVIL)) == 403
    assert asyncio.run(handshake(page_url(url), origin=url))["type"] == "snapshot"


# ------------------------------------------------------------------ finding 5: a step's timeout is the server's to bound

class Timed(EchoEnvironment):
    """Echo that reports the `timeout_s` its step was given, and declares a limit of its own."""
    max_timeout_s = 5.0
    def step(self, action, timeout_s=None, **kwargs):
        obs = super().step(action)
        obs.metadata["timeout_s"] = timeout_s
        return obs
    step_async = Environment.step_async


class Unbounded(Timed): max_timeout_s = None


def test_a_step_cannot_ask_for_more_time_than_allowed():
    meta = {"x-openenv-extensions": "metadata"}
    def asked(url, t, route="/step"):
        r = requests.post(url + route, json={"action": {"message": "x"}, "timeout_s": t}, headers=meta, timeout=10)
        return r.json()["metadata"]["timeout_s"]
    with serve_in_thread(create_app(Timed, web=True)) as url:
        assert (asked(url, 600), asked(url, 2), asked(url, 600, "/web/step")) == (5.0, 2, 5.0)  # the environment's own limit
    with serve_in_thread(create_app(Unbounded, max_timeout_s=1.5)) as url:
        assert (asked(url, 600), asked(url, 1)) == (1.5, 1)  # the server's
    with serve_in_thread(create_app(Timed, max_timeout_s=30)) as url:
        assert asked(url, 600) == 5.0  # the smaller of the two


def test_a_coding_step_cannot_outlast_its_wall_clock():
    "Finding 5 end to end: a client's `timeout_s` of 30 s does not lengthen a coding step past its sandbox's 1 s."
    p = LocalProcessProvider("coding", max_sessions=2, env_vars={"OPENENV_SANDBOX_TIMEOUT_S": "1"})
    url = p.start()
    try:
        r = requests.post(url + "/step", json={"action": {"code": "import time\ntime.sleep(8)"}, "timeout_s": 30}, timeout=60)
        assert r.status_code == 200 and r.json()["observation"]["exit_code"] == 124, r.text  # killed at its 1 s, not 30
    finally:
        p.stop()


# ------------------------------------------------------------------ finding 6: HTTP calls count against capacity

class Held(EchoEnvironment):
    """Echo whose step 'hold' waits until `Held.release` is set; `Held.inside` counts the steps waiting."""
    release, inside, lock = threading.Event(), [0], threading.Lock()
    def step(self, action, timeout_s=None, **kwargs):
        if action.message == "hold":
            with Held.lock: Held.inside[0] += 1
            Held.release.wait(DEADLINE_S)
        return super().step(action)
    step_async = Environment.step_async


def test_http_calls_hold_slots_and_are_refused_when_full():
    Held.release.clear(); Held.inside[0] = 0
    with serve_in_thread(create_app(Held, max_concurrent_envs=2)) as url:
        held = [threading.Thread(target=requests.post, args=(url + "/step",), kwargs={"json": {"action": {"message": "hold"}},
                                 "timeout": DEADLINE_S}) for _ in range(2)]
        try:
            for t in held: t.start()
            assert until(lambda: Held.inside[0] == 2)
            assert requests.get(url + "/health", timeout=10).json()["active_sessions"] == 2
            r = requests.post(url + "/step", json={"action": {"message": "one more"}}, timeout=10)
            assert r.status_code == 503, r.text
            assert r.json()["detail"]["message"].startswith("Server at capacity: 2/2 sessions active")
            assert (r.json()["detail"]["active_sessions"], r.json()["detail"]["max_sessions"]) == (2, 2)
            async def session():
                async with connect(ws_url(url)) as ws: return json.loads(await ws.recv())
            assert asyncio.run(session())["data"]["code"] == "CAPACITY_REACHED"  # the same error for a session
        finally:
            Held.release.set()
            for t in held: t.join(DEADLINE_S)
        assert until(lambda: requests.get(url + "/health", timeout=10).json()["active_sessions"] == 0)
        with EchoEnv(url).sync() as env: assert env.reset().observation.echoed_message  # room again


# ------------------------------------------------------------------ finding 8: HTTP bodies are bounded

def _raw_post(url, headers: dict, chunks=(), limit=256 << 20):
    """POST /step on a raw socket: send `chunks` (chunked encoding) until the server answers; (status line, body, bytes sent)."""
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=DEADLINE_S)
    head = "".join(f"{k}: {v}\r\n" for k, v in {"Host": f"{host}:{port}", "Content-Type": "application/json", **headers}.items())
    s.sendall(f"POST /step HTTP/1.1\r\n{head}\r\n".encode())
    sent = 0
    try:
        for c in chunks:
            if select.select([s], [], [], 0)[0] or sent > limit: break  # the server answered (or the test gives up)
            s.sendall(b"%x\r\n%s\r\n" % (len(c), c)); sent += len(c)
    except (BrokenPipeError, ConnectionResetError): pass  # the server answered and closed
    data = b""
    while b"\r\n\r\n" not in data or len(data) < data.index(b"\r\n\r\n") + 4 + _length(data):
        got = s.recv(65536)
        if not got: break
        data += got
    s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0].decode(), body, sent


def _length(data):
    head = data.split(b"\r\n\r\n")[0].lower()
    for line in head.split(b"\r\n"):
        if line.startswith(b"content-length:"): return int(line.split(b":")[1])
    return 0


@pytest.fixture(scope="module")
def echo_in_thread():
    with serve_in_thread(create_app(EchoEnvironment, max_concurrent_envs=8)) as url: yield url


def test_a_200_mib_body_is_refused_before_it_is_read(echo_in_thread):
    status, body, _ = _raw_post(echo_in_thread, {"Content-Length": str(200 << 20)})
    assert " 413 " in status, status
    assert json.loads(body)["detail"]["message"] == (f"Request body of {200 << 20} bytes is over this server's limit of "
                                                     f"{1 << 20} bytes (max_body)")


def test_a_streamed_body_is_cut_at_the_limit(echo_in_thread):
    chunk = b"x" * (1 << 20)
    status, body, sent = _raw_post(echo_in_thread, {"Transfer-Encoding": "chunked"}, [b'{"action": {"message": "'] + [chunk] * 200)
    assert " 413 " in status, status
    assert sent < 64 << 20  # answered long before the 200 MiB were sent (the rest sat in socket buffers)


def test_the_body_limit_follows_the_frame_limit_and_can_be_set():
    with serve_in_thread(create_app(EchoEnvironment, max_message_size=1000)) as url:
        assert requests.post(url + "/step", json={"action": {"message": "x" * 2000}}, timeout=10).status_code == 413
        assert requests.post(url + "/step", json={"action": {"message": "x" * 500}}, timeout=10).status_code == 200
    with serve_in_thread(create_app(EchoEnvironment, max_body=100)) as url:
        assert requests.post(url + "/step", json={"action": {"message": "x" * 200}}, timeout=10).status_code == 413


# ------------------------------------------------------------------ finding 9: connections are bounded

def test_idle_batch_connections_and_pages_count_and_are_capped():
    with serve_in_thread(create_app(EchoEnvironment, web=True, max_concurrent_envs=2, max_connections=4)) as url:
        async def go():
            batch = {"x-openenv-extensions": "batch"}
            held = [await connect(ws_url(url), additional_headers=batch) for _ in range(3)] + [await connect(page_url(url))]
            health = requests.get(url + "/health", timeout=10).json()
            try: refused = [await handshake(ws_url(url), additional_headers=batch), await handshake(page_url(url))]
            finally:
                for ws in held: await ws.close()
            return health, refused
        health, refused = asyncio.run(go())
        assert (health["connections"], health["max_connections"], health["active_sessions"]) == (4, 4, 1)  # the page's room
        assert refused == [503, 503]
        assert until(lambda: requests.get(url + "/health", timeout=10).json()["connections"] == 0)
        assert asyncio.run(handshake(page_url(url)))["type"] == "snapshot"


def test_an_idle_page_is_let_go_and_frees_its_place():
    with serve_in_thread(create_app(EchoEnvironment, web=True, session_timeout=0.5)) as url:
        async def go():
            async with connect(page_url(url), ping_interval=None) as ws:
                frames = []
                try:
                    while True: frames.append(json.loads(await asyncio.wait_for(ws.recv(), DEADLINE_S)))
                except ConnectionClosed as e: return frames, e.rcvd.code
        frames, code = asyncio.run(go())
        kinds = [f["type"] for f in frames]  # the page gets its snapshot (again once the environment is known), the page count, then the error
        assert kinds[0] == "snapshot" and kinds[-1] == "error" and set(kinds[1:-1]) <= {"snapshot", "pages"} and code == 4000
        assert frames[-1]["data"]["code"] == "SESSION_ERROR" and "without a message" in frames[-1]["data"]["message"]
        assert until(lambda: requests.get(url + "/health", timeout=10).json()["connections"] == 0)


def test_a_busy_session_cannot_outlive_max_session_age():
    with serve_in_thread(create_app(EchoEnvironment, max_session_age=1.0)) as url:
        async def go():
            async with connect(ws_url(url)) as ws:
                replies = []
                for _ in range(int(DEADLINE_S / 0.05)):  # one message every 50 ms: never idle
                    try: await ws.send(json.dumps({"type": "step", "data": {"message": "still here"}}))
                    except ConnectionClosed: pass  # closed while this one waited: its last frame is still to be read
                    try: replies.append(json.loads(await asyncio.wait_for(ws.recv(), DEADLINE_S)))
                    except ConnectionClosed: return replies
                    await asyncio.sleep(0.05)
        replies = asyncio.run(go())
        assert replies[-1]["data"]["code"] == "SESSION_ERROR" and "max_session_age" in replies[-1]["data"]["message"]
        assert replies[:-1] and all(r["type"] == "observation" for r in replies[:-1])  # every message before it answered
        assert until(lambda: requests.get(url + "/health", timeout=10).json()["active_sessions"] == 0)


# ------------------------------------------------------------------ finding 11: a token, when one is set

@pytest.fixture(scope="module")
def locked_url():
    with serve_in_thread(create_app(EchoEnvironment, web=True, max_concurrent_envs=8, token=TOKEN)) as url: yield url


@pytest.mark.parametrize("method,route", [("POST", "/reset"), ("POST", "/step"), ("GET", "/state"), ("GET", "/schema"),
                                          ("GET", "/metadata"), ("GET", "/web/state"), ("POST", "/web/reset"),
                                          ("POST", "/mcp"), ("GET", "/openapi.json")])
def test_a_token_closes_every_route(locked_url, method, route):
    body = {"action": {"message": "x"}} if route.endswith("step") else ({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
                                                                         if route == "/mcp" else None)
    r = requests.request(method, locked_url + route, json=body, timeout=10)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", (route, r.text)
    assert r.json()["detail"]["code"] == "UNAUTHORIZED"
    wrong = requests.request(method, locked_url + route, json=body, headers={"Authorization": "Bearer " + TOKEN[:-1]}, timeout=10)
    assert wrong.status_code == 401
    ok = requests.request(method, locked_url + route, json=body, headers={"Authorization": "Bearer " + TOKEN}, timeout=10)
    assert ok.status_code in ((200, 409) if route == "/web/state" else (200,)), (route, ok.text)  # past the door (/web/state is 409 until the page's first reset)


def test_probes_and_the_page_need_no_token(locked_url):
    assert requests.get(locked_url + "/health", timeout=10).json()["status"] == "healthy"
    page = requests.get(locked_url + "/web", timeout=10)
    assert page.status_code == 200 and 'data-auth="bearer"' in page.text and TOKEN not in page.text
    home = requests.get(locked_url + "/", timeout=10, allow_redirects=False)  # a browser at the root is sent to the page
    assert (home.status_code, home.headers["location"]) == (307, "/web/"), home.text


def test_sockets_want_the_token_in_a_header_or_a_subprotocol(locked_url):
    for url in (ws_url(locked_url), page_url(locked_url)):
        assert asyncio.run(handshake(url)) == 401
        assert asyncio.run(handshake(url, additional_headers={"Authorization": "Bearer nope"})) == 401
        assert asyncio.run(handshake(url, subprotocols=protocols("nope"))) == 401
        assert asyncio.run(handshake(url, additional_headers={"Authorization": "Bearer " + TOKEN})) not in (401, 403)
    assert asyncio.run(handshake(ws_url(locked_url), subprotocols=protocols(TOKEN))) == "openenv"  # accepted as `openenv`
    assert asyncio.run(handshake(page_url(locked_url), subprotocols=protocols(TOKEN)))["type"] == "snapshot"


HUB = {"Authorization": "Bearer hf_the_hubs_own_token"}  # what a private Space's gateway reads; the server never sees its token


@pytest.mark.parametrize("method,route", [("POST", "/reset"), ("POST", "/step"), ("GET", "/state"), ("POST", "/mcp")])
def test_the_token_beside_a_hub_authorization(locked_url, method, route):
    """`X-OpenEnv-Token` carries the server's token when `Authorization` belongs to the Hub: right, it opens; wrong, 401."""
    body = {"action": {"message": "x"}} if route == "/step" else ({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
                                                                   if route == "/mcp" else None)
    call = lambda **h: requests.request(method, locked_url + route, json=body, headers={**HUB, **h}, timeout=10)
    assert call().status_code == 401
    for wrong in (TOKEN[:-1], TOKEN + "x", "Bearer " + TOKEN):
        r = call(**{"X-OpenEnv-Token": wrong})
        assert r.status_code == 401 and "X-OpenEnv-Token" in r.json()["detail"]["message"], (route, wrong, r.text)
    assert call(**{"X-OpenEnv-Token": TOKEN}).status_code == 200
    assert asyncio.run(handshake(ws_url(locked_url), additional_headers={**HUB, "X-OpenEnv-Token": "nope"})) == 401
    assert asyncio.run(handshake(ws_url(locked_url), additional_headers={**HUB, "X-OpenEnv-Token": TOKEN})) not in (401, 403)


def test_openenv_token_turns_it_on_and_the_clients_read_it(monkeypatch):
    monkeypatch.delenv("OPENENV_TOKEN", raising=False)
    p = LocalProcessProvider("echo", max_sessions=4, env_vars={"OPENENV_TOKEN": TOKEN})  # `openenv serve echo`, no flag
    url = p.start()
    try:
        assert requests.post(url + "/reset", timeout=10).status_code == 401
        with pytest.raises(EnvConnectionError, match="HTTP 401 Unauthorized: This server requires a token"):
            EchoEnv(url).sync().reset()
        with pytest.raises(EnvServerError, match="UNAUTHORIZED"): EchoHTTPEnv(url).reset()
        with EchoEnv(url, token=TOKEN).sync() as env: assert env.step(EchoAction(message="hi")).observation.echoed_message == "hi"
        with EchoHTTPEnv(url, token=TOKEN) as env: assert env.step(EchoAction(message="hi")).observation.echoed_message == "hi"
        monkeypatch.setenv("OPENENV_TOKEN", TOKEN)
        with GenericEnvClient(url).sync() as env: assert env.step({"message": "read"}).observation["echoed_message"] == "read"
        async def typed():
            async with EchoEnv(url, headers={"X-Trace": "t1"}) as env: return (await env.reset()).observation.echoed_message
        assert asyncio.run(typed())
        assert HTTPEnvClient(url).state().step_count == 0
    finally:
        p.stop()


def test_the_token_is_never_logged_nor_echoed(caplog):
    caplog.set_level(logging.DEBUG)
    wrong = "wr0ng-" + TOKEN
    with serve_in_thread(create_app(EchoEnvironment, token=TOKEN), log_level="debug") as url:  # uvicorn logs every header
        replies = [requests.post(url + "/reset", headers={"Authorization": "Bearer " + t}, timeout=10).text for t in (TOKEN, wrong)]
        replies += [requests.post(url + "/reset", headers={**HUB, "X-OpenEnv-Token": t}, timeout=10).text for t in (TOKEN, wrong)]
        replies.append(str(asyncio.run(handshake(ws_url(url), additional_headers={**HUB, "X-OpenEnv-Token": wrong}))))
        replies.append(str(asyncio.run(handshake(ws_url(url), subprotocols=protocols(wrong)))))
        replies.append(str(asyncio.run(handshake(ws_url(url), subprotocols=protocols(TOKEN)))))
        with EchoEnv(url, token=TOKEN).sync() as env: replies.append(env.reset().observation.echoed_message)
        with pytest.raises(EnvConnectionError) as refused: EchoEnv(url, token=wrong).sync().reset()
        replies.append(str(refused.value))
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name != "websockets.client")  # this test's raw handshakes
    assert "Bearer [redacted]" in logged  # uvicorn's debug log of the handshakes, tokens blanked
    for secret in (TOKEN, wrong, protocols(TOKEN)[1], protocols(wrong)[1]):
        assert secret not in logged and not any(secret in r for r in replies), secret


# ------------------------------------------------------------------ bad input at the door is a 4xx, never a 500 or a hang

@pytest.mark.parametrize("headers", [
    {"Authorization": "Bearer"}, {"Authorization": "Bearer " + "x" * 4000}, {"Authorization": "Basic czNjcmV0"},
    {"Authorization": "Bearer \u00e9t\u00e9"}, {"Origin": "http://h:99999"}, {"Origin": "not an origin"}, {"Origin": ""},
    {"Origin": EVIL, "X-Forwarded-Proto": "gopher", "X-Forwarded-Host": "[::1"}, {"Sec-WebSocket-Protocol": "openenv.bearer.!!!"},
], ids=lambda h: ",".join(h)[:40])
def test_bad_input_at_the_door_is_a_4xx(locked_url, headers):
    r = requests.post(locked_url + "/reset", headers={k: v.encode("utf-8") for k, v in headers.items()}, timeout=10)
    assert 400 <= r.status_code < 500 and r.json()["detail"]["message"], r.text
    assert asyncio.run(handshake(ws_url(locked_url), additional_headers={k: v for k, v in headers.items() if v.isascii()})) in (400, 401, 403)
