"""The Task API on a real server: every route and error status on echo's tasks, a reset by task over `/ws` and HTTP,
and (marker `upstream`) the same requests answered by upstream openenv 0.10's own server, and its clients against ours."""
import asyncio
import json
import os
import subprocess
import sys
import time

import pytest
import requests
from fastapi.testclient import TestClient
from websockets.asyncio.client import connect

from openenv_nb.client import ws_url
from openenv_nb.envs.echo import ECHO_TASKS, EchoEnv, EchoEnvironment
from openenv_nb.server import create_app, serve_in_thread
from openenv_nb.tasks import add_task_routes

from conftest import need
from helpers import Sleepy
from upstream_venv import upstream_python_why

LOCAL = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}


def task_app(env, name: str, **kw):
    "`create_app(env)` serving the Task API as `name` (added here until `create_app` adds it itself)."
    app = create_app(env, env_name=name, **kw)
    if not any(getattr(r, "path", None) == "/list_environments" for r in app.routes): add_task_routes(app, app.state.hub, name)
    return app


def task(split, i): return {"id": f"{split}-{i}", "index": i, "message": ECHO_TASKS[split][i]}


@pytest.fixture(scope="module")
def echo():
    with TestClient(task_app(EchoEnvironment, "echo_env", max_concurrent_envs=4)) as c: yield c


def test_routes(echo):
    assert echo.get("/list_environments").json() == ["echo_env"]
    assert echo.get("/echo_env/splits").json() == [{"name": "train", "type": "train"}, {"name": "test", "type": "test"}]
    assert echo.get("/Echo_Env/splits").status_code == 200  # names match in any case, as upstream's do
    assert echo.post("/echo_env/tasks", json={"split": "test"}).json() == {"tasks": [task("test", 0), task("test", 1)], "env_name": "echo_env"}
    assert echo.post("/echo_env/num_tasks", json={"split": "train"}).json() == {"num_tasks": 3}
    assert echo.post("/echo_env/task", json={"split": "train", "index": 2}).json() == {"task": task("train", 2)}
    assert echo.post("/echo_env/task_range", json={"split": "train", "start": 1}).json() == {"tasks": [task("train", 1), task("train", 2)]}
    assert echo.post("/echo_env/task_range", json={"split": "train", "start": 0, "stop": 1}).json() == {"tasks": [task("train", 0)]}
    assert echo.post("/echo_env/task_range", json={"split": "test"}).json() == {"tasks": [task("test", 0), task("test", 1)]}


def test_error_statuses(echo):
    r = echo.get("/chess/splits")
    assert (r.status_code, r.json()) == (404, {"detail": "unknown environment 'chess'"})
    for path in ["tasks", "num_tasks", "task_range"]: assert echo.post(f"/chess/{path}", json={"split": "train"}).status_code == 404
    for i in [3, -1, 10**6]:
        r = echo.post("/echo_env/task", json={"split": "train", "index": i})
        assert (r.status_code, r.json()) == (400, {"detail": "Invalid task index"}), i
    for body in [{}, {"split": "train", "index": 0, "extra": 1}, {"split": "train", "index": "first"}, {"split": 3, "index": 0}]:
        assert echo.post("/echo_env/task", json=body).status_code == 422, body
    assert echo.post("/echo_env/tasks", content="{", headers={"content-type": "application/json"}).status_code == 422
    r = echo.post("/echo_env/num_tasks", json={"split": "dev"})
    assert r.status_code == 400 and "unknown split 'dev'" in r.json()["detail"]
    with TestClient(task_app(Sleepy, "plain_env")) as plain:
        for method, path, body in [("get", "splits", None), ("post", "tasks", {"split": "train"}), ("post", "num_tasks", {"split": "train"}),
                                   ("post", "task", {"split": "train", "index": 0}), ("post", "task_range", {"split": "train"})]:
            r = getattr(plain, method)(f"/plain_env/{path}", **({"json": body} if body else {}))
            assert r.status_code == 501 and r.json()["detail"].endswith("is not supported for this environment"), (path, r.text)


@pytest.fixture(scope="module")
def echo_url():
    with serve_in_thread(task_app(EchoEnvironment, "echo_env", max_concurrent_envs=8)) as url: yield url


def test_reset_by_task_over_ws(echo_url):
    async def go():
        async with EchoEnv(echo_url) as env:
            picked = await env.reset(split="test", index=1)
            step = await env.step({"message": picked.observation.echoed_message})
            plain = await env.reset()
            wrong = None
            try: await env.reset(split="train", index=3)
            except Exception as e: wrong = e
            return picked, step, plain, wrong
    picked, step, plain, wrong = asyncio.run(go())
    assert (picked.observation.echoed_message, picked.observation.message_length, picked.reward) == ("one last message", 16, 0.0)
    assert step.observation.echoed_message == "one last message"
    assert plain.observation.echoed_message == "Echo environment ready!"
    assert wrong is not None and "no task 3" in str(wrong)


def test_reset_by_task_frames(echo_url):
    "The frames themselves: a task over `/ws`, and a task that is not there failing only that reset."
    async def go():
        async with connect(ws_url(echo_url)) as ws:
            out = []
            for data in [{"split": "train", "index": 0}, {"split": "dev"}, {"index": 1}]:
                await ws.send(json.dumps({"type": "reset", "data": data}))
                out.append(json.loads(await ws.recv()))
            return out
    first, bad, second = asyncio.run(go())
    assert first["type"] == "observation" and first["data"]["observation"]["echoed_message"] == "hello"
    assert bad["type"] == "error" and bad["data"]["code"] == "EXECUTION_ERROR" and "unknown split 'dev'" in bad["data"]["message"]
    assert second["data"]["observation"]["echoed_message"] == "openenv"  # the split defaults to train; the socket stayed open


def test_reset_by_task_over_http(echo_url):
    r = requests.post(echo_url + "/reset", json={"split": "test", "index": 0})
    assert r.status_code == 200 and r.json()["observation"]["echoed_message"] == "goodbye"
    assert requests.post(echo_url + "/echo_env/num_tasks", json={"split": "test"}).json() == {"num_tasks": 2}



def test_task_routes_take_a_slot():
    """A task route builds an environment, so it needs a free slot as an HTTP step does: a full server answers 503."""
    with serve_in_thread(task_app(EchoEnvironment, "echo_env", max_concurrent_envs=1)) as url:
        async def go():
            async with connect(ws_url(url)) as ws:  # the one session holds the one slot
                await ws.send(json.dumps({"type": "reset", "data": {}}))
                await ws.recv()
                full = [requests.post(f"{url}/echo_env/{route}", json=body, timeout=10) for route, body in
                        [("num_tasks", {"split": "train"}), ("task", {"split": "train", "index": 0})]]
                return full + [requests.get(f"{url}/echo_env/splits", timeout=10), requests.post(f"{url}/step", json={"action": {"message": "x"}}, timeout=10)]
        *tasks, splits, step = asyncio.run(go())
        assert [r.status_code for r in (*tasks, splits, step)] == [503] * 4, [r.text for r in (*tasks, splits, step)]
        assert tasks[0].json()["detail"]["code"] == step.json()["detail"]["code"] == "CAPACITY_REACHED", tasks[0].text
        deadline = time.monotonic() + 30  # the session's slot is freed once its socket has closed
        while (r := requests.post(f"{url}/echo_env/num_tasks", json={"split": "train"}, timeout=10)).status_code == 503 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert r.json() == {"num_tasks": 3} and requests.get(f"{url}/health", timeout=10).json()["active_sessions"] == 0

# --------------------------------------------------------------------------------------------------------------------
# Upstream openenv 0.10, from its own venv. It has no generic Task API client: its `HarborEnv` reads the routes of an
# environment named `harbor_env`, so that is the name served to it. Its `GenericEnvClient` plays a task over `/ws`.
# And its own server answers the same requests as ours, for an environment with echo's tasks.

PLAN = [("GET", "/list_environments", None), ("GET", "/echo_env/splits", None), ("GET", "/ECHO_ENV/splits", None),
        ("GET", "/other/splits", None), ("POST", "/echo_env/tasks", {"split": "train"}), ("POST", "/echo_env/tasks", {"split": "test"}),
        ("POST", "/echo_env/num_tasks", {"split": "train"}), ("POST", "/echo_env/task", {"split": "test", "index": 1}),
        ("POST", "/echo_env/task", {"split": "test", "index": 2}), ("POST", "/echo_env/task", {"split": "test", "index": -1}),
        ("POST", "/echo_env/task_range", {"split": "train", "start": 1}), ("POST", "/echo_env/task_range", {"split": "train", "start": 0, "stop": 2}),
        ("POST", "/echo_env/task_range", {"split": "train"}), ("POST", "/echo_env/task_range", {"split": "train", "start": -2, "stop": None}),
        ("POST", "/other/num_tasks", {"split": "train"}), ("POST", "/other/task", {"split": "train"}),
        ("POST", "/echo_env/task", {"split": "train", "index": "x"}), ("POST", "/echo_env/tasks", {"split": "train", "extra": 1}),
        ("POST", "/echo_env/tasks", {}), ("POST", "/echo_env/tasks", "{"), ("POST", "/echo_env/tasks", {"split": "dev"}),
        ("GET", "/plain_env/splits", None), ("POST", "/plain_env/task", {"split": "train", "index": 0}),
        ("POST", "/plain_env/num_tasks", {"split": "train"})]

UPSTREAM = r'''
import json, sys
import httpx
from fastapi.testclient import TestClient
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from openenv.core.generic_client import GenericEnvClient
from openenv.harbor.client import HarborEnv

args = json.load(sys.stdin)
TASKS = args["tasks"]

class Msg(Action):
    message: str = ""

class Echoed(Observation):
    echoed_message: str = ""
    message_length: int = 0

def messages(split):
    if split not in TASKS: raise ValueError(f"unknown split {split!r}")
    return TASKS[split]

class Plain(Environment):
    def reset(self, **kwargs): return Echoed()
    def step(self, action, **kwargs): return Echoed()
    @property
    def state(self): return State()

class Tasks(Plain):
    "Echo's tasks, written against upstream's own `TaskProvider`."
    def list_splits(self): return list(TASKS)
    def list_tasks(self, split): return self.get_task_range(split)
    def num_tasks(self, split): return len(messages(split))
    def get_task(self, split, index):
        ms = messages(split)
        if not 0 <= index < len(ms): raise IndexError(index)
        return {"id": f"{split}-{index}", "index": index, "message": ms[index]}
    def get_task_range(self, split, start=None, stop=None):
        return [self.get_task(split, i) for i in range(len(messages(split)))[start:stop]]

def answer(c, method, path, body):
    if body is None: r = c.request(method, path)
    elif isinstance(body, str): r = c.request(method, path, content=body, headers={"content-type": "application/json"})
    else: r = c.request(method, path, json=body)
    try: data = r.json()
    except ValueError: data = r.text
    return [r.status_code, data]

apps = {"/echo_env": create_app(Tasks, Msg, Echoed, env_name="echo_env"), "/plain_env": create_app(Plain, Msg, Echoed, env_name="plain_env")}
out = {"plan": []}
for method, path, body in args["plan"]:
    app = apps["/plain_env"] if path.startswith("/plain_env") else apps["/echo_env"]
    with TestClient(app, raise_server_exceptions=False) as c: out["plan"].append(answer(c, method, path, body))

h = HarborEnv(base_url=args["harbor_url"])
try:
    out["harbor"] = {"splits": h.splits(), "num_tasks": h.num_tasks("test"), "task": h.get_task("train", 1).model_dump(),
                     "range": [t.index for t in h.get_task_range("train", 1, 3)]}
    try: h.get_task("test", 7); out["harbor"]["missing"] = None
    except httpx.HTTPStatusError as e: out["harbor"]["missing"] = [e.response.status_code, e.response.json()]
finally: h._http.close()

with GenericEnvClient(base_url=args["echo_url"]).sync() as env:
    r = env.reset(split="test", index=0)
    out["generic"] = {"reset": r.observation, "step": env.step({"message": "goodbye"}).observation}
print(json.dumps(out))
'''


class HarborShaped(EchoEnvironment):
    "Echo's tasks in the shape of upstream's `HarborTaskRef`, which its `HarborEnv` reads."
    def get_task(self, split, index):
        t = super().get_task(split, index)
        return {"index": t["index"], "task_id": t["id"], "task_name": t["message"], "dataset": split}


@pytest.fixture(scope="module")
def upstream(echo_url):
    py, why = upstream_python_why()
    need("upstream", py is not None, why)
    with serve_in_thread(task_app(HarborShaped, "harbor_env")) as harbor_url:
        args = {"tasks": {k: list(v) for k, v in ECHO_TASKS.items()}, "plan": PLAN, "harbor_url": harbor_url, "echo_url": echo_url}
        r = subprocess.run([py, "-c", UPSTREAM], input=json.dumps(args), capture_output=True, text=True, timeout=300, env=LOCAL)
    assert r.returncode == 0, f"the upstream script failed:\n{r.stderr[-4000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def ours(plan) -> list:
    "Our answers to `plan`: echo served as `echo_env`, an environment without tasks as `plain_env`."
    with TestClient(task_app(EchoEnvironment, "echo_env")) as echo, TestClient(task_app(Sleepy, "plain_env")) as plain:
        out = []
        for method, path, body in plan:
            c = plain if path.startswith("/plain_env") else echo
            kw = {} if body is None else {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, str) else {"json": body}
            r = c.request(method, path, **kw)
            out.append([r.status_code, r.json()])
        return out


def comparable(status: int, body):
    "What must match: everything, except pydantic's wording of a 422 (its version differs) and the body of a 500."
    if status == 422: return status, [(e["loc"], e["type"]) for e in body["detail"]]
    return (status, None) if status in (400, 500) and "Invalid task index" not in str(body) else (status, body)


@pytest.mark.upstream
def test_same_answers_as_upstream_server(upstream):
    theirs, mine = upstream["plan"], ours(PLAN)
    assert len(theirs) == len(PLAN)
    for (method, path, body), t, m in zip(PLAN, theirs, mine):
        if m[0] == 400 and t[0] == 500: continue  # an unknown split: see below
        assert comparable(*m) == comparable(*t), f"{method} {path} {body}: ours {m}, upstream {t}"
    assert {t[0] for t in theirs} == {200, 400, 404, 422, 500, 501}  # every status was exercised
    # the deliberate difference: an unknown split is bad input, a 400 that names it, where upstream answers a plain-text 500
    status, body = mine[PLAN.index(("POST", "/echo_env/tasks", {"split": "dev"}))]
    assert status == 400 and "unknown split 'dev'" in body["detail"]


@pytest.mark.upstream
def test_upstream_harbor_client_reads_our_routes(upstream):
    h = upstream["harbor"]
    assert h["splits"] == [{"name": "train", "type": "train"}, {"name": "test", "type": "test"}]
    assert h["num_tasks"] == 2 and h["range"] == [1, 2]
    assert h["task"] == {"index": 1, "task_id": "train-1", "task_name": "openenv", "dataset": "train", "instruction": ""}
    assert h["missing"] == [400, {"detail": "Invalid task index"}]


@pytest.mark.upstream
def test_upstream_generic_client_plays_a_task(upstream):
    g = upstream["generic"]
    assert g["reset"]["echoed_message"] == "goodbye" and g["step"]["echoed_message"] == "goodbye"
