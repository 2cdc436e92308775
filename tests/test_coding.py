"""The coding environment against real servers: hostile code, limits, isolation, concurrency, OpenEnv's shapes.

Two servers serve this module's factories: `quick_coding` (the default interpreter, short limits) and `raw_coding`
(no interpreter layer, as if smolagents had been escaped: only the operating-system layers stand). A test that needs
a kernel feature the machine may lack calls `need("sandbox", ...)`; CI makes that skip a failure.
"""
import asyncio
import json
import os
import random
import signal
import time

import pytest
import requests
from websockets.asyncio.client import connect

from conftest import need, start_server
from openenv_nb.client import ws_url
from openenv_nb.envs.coding import CodeAction, CodeObservation, CodingEnv, CodingEnvironment, CodingHTTPEnv, CodeState
from openenv_nb.sandbox import Layer, Layers, Status

LIMITS = dict(timeout_s=3.0, cpu_s=3.0, memory_mb=512, max_output=10_000)
DEADLINE_S = 30.0  # how long a condition that must come true may take, on a busy machine, before the test fails


def quick_coding() -> CodingEnvironment:
    """The coding environment with short limits (served as `test_coding:quick_coding`)."""
    return CodingEnvironment(**LIMITS)


def raw_coding() -> CodingEnvironment:
    """No interpreter layer: the OS layers alone (served as `test_coding:raw_coding`)."""
    return CodingEnvironment(executor="exec", **LIMITS)


@pytest.fixture(scope="module")
def quick():
    p = start_server("test_coding:quick_coding", max_sessions=32)
    yield p
    p.stop()


@pytest.fixture(scope="module")
def url(quick): return quick.base_url


@pytest.fixture(scope="module")
def raw_url():
    p = start_server("test_coding:raw_coding", max_sessions=8)
    yield p.base_url
    p.stop()


async def episode(url, *steps, seed=None, metadata=True):
    """Reset, then one step per code, on one connection; the reply frames. A step may be a raw dict of action data."""
    headers = {"x-openenv-extensions": "metadata"} if metadata else None
    async with connect(ws_url(url), additional_headers=headers, max_size=None, compression=None) as ws:
        frames = [{"type": "reset", "data": {} if seed is None else {"seed": seed}}]
        frames += [{"type": "step", "data": s if isinstance(s, dict) else {"code": s}} for s in steps]
        out = []
        for f in frames:
            await ws.send(json.dumps(f))
            out.append(json.loads(await ws.recv()))
        return out


def run(url, *steps, **kw):
    """`episode` from sync code: the envelopes of the steps (the reset's dropped)."""
    frames = asyncio.run(episode(url, *steps, **kw))
    assert all(f["type"] == "observation" for f in frames[:1]), frames[0]
    return [f["data"] if f["type"] == "observation" else f for f in frames[1:]]


def health(url):
    r = requests.get(url + "/health", timeout=5)
    assert r.status_code == 200 and r.json()["status"] == "healthy"
    return r.json()


def layers_of(url) -> Layers:
    """What each sandbox layer is on this machine, as a reset reports it."""
    return Layers.from_json(asyncio.run(episode(url))[0]["data"]["metadata"]["sandbox"])


def wait_until(cond, what: str, timeout_s: float = DEADLINE_S):
    """Poll `cond()` until it is true; fail naming `what` if it is not after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline: raise AssertionError(f"not true after {timeout_s:g} s: {what}")
        time.sleep(0.02)


def _stat(pid: int) -> list[str] | None:
    """The fields of `/proc/PID/stat` after the command name (state first), or None when `pid` is gone."""
    try: return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError: return None


def _children(pid: int) -> list[int]:
    return [int(e) for e in os.listdir("/proc") if e.isdigit() and (st := _stat(int(e))) and int(st[1]) == pid]


def workers_cpu_s(server_pid: int) -> dict[int, float]:
    """CPU seconds used so far by each worker of a server (the children of its fork servers), by pid."""
    tick, out = os.sysconf("SC_CLK_TCK"), {}
    for fork_server in _children(server_pid):
        for w in _children(fork_server):
            if st := _stat(w): out[w] = (int(st[11]) + int(st[12])) / tick
    return out


# ---------------------------------------------------------------- OpenEnv's shapes

def test_episode_has_openenv_shapes(url):
    reset, step, state = asyncio.run(_plain_episode(url))
    assert reset == {"type": "observation", "data": {"observation": {"stdout": "", "stderr": "", "exit_code": 0}, "reward": 0.0, "done": False}}
    assert step == {"type": "observation", "data": {"observation": {"stdout": "hi\n", "stderr": "", "exit_code": 0}, "reward": 0.1, "done": False}}
    assert state == {"type": "state", "data": {"episode_id": "e1", "step_count": 1, "last_exit_code": 0}}


async def _plain_episode(url):
    async with connect(ws_url(url)) as ws:  # no extensions: what an OpenEnv client sees
        out = []
        for f in [{"type": "reset", "data": {"episode_id": "e1"}}, {"type": "step", "data": {"code": "print('hi')"}}, {"type": "state"}]:
            await ws.send(json.dumps(f))
            out.append(json.loads(await ws.recv()))
        return out


def test_metadata_reports_code_layers_and_rewards(url):
    [ok, bad] = run(url, "x = 1", "import os")
    assert ok["metadata"]["last_code"] == "x = 1" and ok["observation"]["stdout"] == "1"
    assert bad["reward"] == pytest.approx(-0.9) and bad["metadata"]["safety_violation"] == "import os"
    assert "Import of os is not allowed" in bad["observation"]["stderr"] and bad["observation"]["exit_code"] == 1
    layers = layers_of(url)
    assert list(layers) == list(Layer) and all(isinstance(s.status, Status) and s.detail for s in layers.values())
    assert layers[Layer.limits].facts["wall_clock_s"] == LIMITS["timeout_s"]
    assert layers.held(Layer.process, Layer.interpreter) and layers[Layer.interpreter].facts["executor"] == "smolagents"


def test_typed_clients(url):
    with CodingEnv(url).sync() as env:
        r = env.reset(seed=3)
        assert isinstance(r.observation, CodeObservation) and r.observation.metadata["status"] == "ready"
        r = env.step(CodeAction(code="import random\nrandom.randint(1, 10**9)"))
        assert int(r.observation.stdout) == random.Random(3).randint(1, 10**9)  # a seeded reset is reproducible
        s = env.state()
        assert isinstance(s, CodeState) and (s.step_count, s.last_exit_code) == (1, 0)
    http = CodingHTTPEnv(url)
    assert http.metadata()["name"] == "CodingEnvironment"
    assert "code" in http.schema()["action"]["properties"]


# ---------------------------------------------------------------- episodes and sessions

def test_state_persists_across_steps_and_reset_starts_clean(url):
    async def go():
        async with connect(ws_url(url)) as ws:
            async def send(f):
                await ws.send(json.dumps(f))
                return json.loads(await ws.recv())["data"]
            await send({"type": "reset"})
            await send({"type": "step", "data": {"code": "import math\ndef area(r): return math.pi * r * r\nk = 2"}})
            kept = await send({"type": "step", "data": {"code": "round(area(k), 3)"}})
            await send({"type": "reset"})
            gone = await send({"type": "step", "data": {"code": "area(k)"}})
            return kept, gone
    kept, gone = asyncio.run(go())
    assert kept["observation"]["stdout"] == "12.566"
    assert gone["observation"]["exit_code"] == 1 and "area" in gone["observation"]["stderr"]


def test_patches_die_with_their_episode(url):
    [patched] = run(url, "import math\nmath.pi = 3\nimport random\nrandom.seed(7)\nmath.pi")
    assert patched["observation"]["stdout"] == "3"
    [fresh] = run(url, "import math, random\n[math.pi, random.random()]")
    pi, r = json.loads(fresh["observation"]["stdout"])
    assert pi == 3.141592653589793 and r != random.Random(7).random()


def test_sixteen_sessions_at_once_keep_their_own_variables(url):
    async def one(i):
        frames = await episode(url, f"x = {i}", "import time\ntime.sleep(0.3)\ny = x * 1000", "[x, y]", metadata=False)
        return [f["data"]["observation"] for f in frames[1:]]
    async def all16():
        return await asyncio.gather(*(one(i) for i in range(16)))
    results = asyncio.run(all16())
    for i, obs in enumerate(results):
        assert [o["exit_code"] for o in obs] == [0, 0, 0], obs
        assert json.loads(obs[2]["stdout"]) == [i, i * 1000]


# ---------------------------------------------------------------- hostile code: each ends within its limit, clearly

HOSTILE = [  # name, code, exit code, limit, words in stderr (or stdout for the print)
    ("infinite loop", "while True: x = sum(range(10**4))", 124, "timeout", "wall-clock limit of 3 s"),
    ("spin in C", "sum(range(10**12))", 124, "timeout", "wall-clock limit of 3 s"),
    ("deep recursion", "def f(n): return f(n + 1)\nf(0)", 1, None, "RecursionError"),
    ("10 GB allocation", "x = 'x' * (10 * 2**30)", 1, "memory", "MemoryError"),
    ("a huge print", "for i in range(10**4): print('x' * 10**5)", 0, None, "characters cut"),
    ("fork", "import os\nos.fork()", 1, None, "Import of os is not allowed"),
    ("subprocess", "import subprocess\nsubprocess.run(['id'])", 1, None, "Import of subprocess is not allowed"),
    ("read /etc/passwd", "open('/etc/passwd').read()", 1, None, "Forbidden function evaluation: 'open'"),
    ("open a socket", "import socket\nsocket.socket().connect(('127.0.0.1', 80))", 1, None, "Import of socket is not allowed"),
    ("object internals", "().__class__.__bases__[0].__subclasses__()", 1, None, "Forbidden access to dunder attribute"),
    ("a function's globals", "getattr(print, '__glob' + 'als__')", 1, None, "Forbidden access to dunder attribute: __globals__"),
    ("a module's os", "import random\nrandom._os.system('id')", 1, None, "Forbidden access to module: os"),
    ("the import guard", "import builtins\nbuiltins.__import__('os')", 1, None, "Import of builtins is not allowed"),
    ("frames", "import statistics\nstatistics.sys._getframe()", 1, None, "Forbidden access to module: sys"),
    ("SystemExit", "print('bye')\nraise SystemExit(0)", 1, None, "SystemExit: 0"),
    ("KeyboardInterrupt", "raise KeyboardInterrupt", 1, None, "KeyboardInterrupt"),
    ("a syntax error", "def f(:\n  pass", 1, None, "SyntaxError"),
    ("NUL bytes", "x = 1\x00", 1, None, "null bytes"),
]


@pytest.mark.parametrize("name,code,exit_code,limit,says", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_code_ends_within_its_limit_with_a_clear_error(url, name, code, exit_code, limit, says):
    [r] = run(url, code)
    obs, meta = r["observation"], r["metadata"]
    assert obs["exit_code"] == exit_code, obs
    assert meta.get("limit") == limit and bool(meta.get("state_lost")) == (limit is not None), meta
    assert says in (obs["stdout"] if exit_code == 0 else obs["stderr"]), obs
    assert len(obs["stdout"]) < LIMITS["max_output"] + 200 and len(obs["stderr"]) < LIMITS["max_output"] + 1000
    health(url)


def test_a_tight_infinite_loop_ends_by_whichever_limit_comes_first(url):
    """`while True: pass` meets the interpreter's iteration cap or the wall clock first, by machine speed: both are clear."""
    [r] = run(url, "while True: pass")
    obs, meta = r["observation"], r["metadata"]
    if obs["exit_code"] == 124: assert meta.get("limit") == "timeout" and "wall-clock limit" in obs["stderr"], obs
    else: assert obs["exit_code"] == 1 and "iterations in While loop exceeded" in obs["stderr"] and not meta.get("state_lost"), obs
    health(url)


def test_a_lost_worker_is_replaced_and_says_so(url):
    a, b, c = run(url, "x = 1", "sum(range(10**12))", "print(x)")
    assert b["observation"]["exit_code"] == 124 and "variables, functions and imports from earlier steps are gone" in b["observation"]["stderr"]
    assert c["observation"]["exit_code"] == 1 and "sandbox" in c["metadata"]  # a fresh worker, reported as such


def test_health_answers_while_user_code_spins_in_c(quick, url):
    def spin():  # over HTTP, for a longer wall-clock limit than the server's default
        return requests.post(url + "/step", json={"action": {"code": "sum(range(10**12))"}, "timeout_s": 8}, timeout=60).json()
    before = workers_cpu_s(quick.proc.pid)
    def spinning_now():  # a worker has used 0.3 CPU seconds more than it had: the spin is under way
        return any(s - before.get(pid, 0.0) > 0.3 for pid, s in workers_cpu_s(quick.proc.pid).items())
    async def go():
        spinning = asyncio.create_task(asyncio.to_thread(spin))
        await asyncio.to_thread(wait_until, spinning_now, "a worker spinning")
        h = await asyncio.to_thread(health, url)
        other = await episode(url, "print('meanwhile')")
        during = not spinning.done()
        return await spinning, h, other, during
    spun, h, other, during = asyncio.run(go())
    assert spun["observation"]["exit_code"] in (124, 152), spun  # the wall clock, or the CPU limit (3 s) first
    assert h["status"] == "healthy" and other[1]["data"]["observation"]["stdout"] == "meanwhile\n"
    assert during  # both answered while the spin was still going


def test_output_is_valid_json_whatever_the_code_prints(url):
    async def go():
        async with connect(ws_url(url)) as ws:
            await ws.send(json.dumps({"type": "step", "data": {"code": "print('\\ud800 ok \\udfff')"}}))
            return await ws.recv()
    text = asyncio.run(go())
    text.encode("utf-8")  # valid UTF-8 on the wire
    assert json.loads(text)["data"]["observation"]["stdout"] == "\ufffd ok \ufffd\n"


# ---------------------------------------------------------------- bad input loses nothing

BAD = [({"code": 5}, "VALIDATION_ERROR"), ({"code": "x", "lang": "py"}, "VALIDATION_ERROR"), ({}, "VALIDATION_ERROR"),
       ({"code": "x" * 2_000_000}, "VALIDATION_ERROR")]


@pytest.mark.parametrize("data,code", BAD, ids=["code not a string", "unknown field", "no code", "a 2 MB frame"])
def test_bad_actions_are_refused_and_the_episode_goes_on(url, data, code):
    frames = asyncio.run(episode(url, "kept = 'yes'", data, "kept"))
    err = frames[2]
    assert err["type"] == "error" and err["data"]["code"] == code, err
    assert frames[3]["data"]["observation"]["stdout"] == '"yes"'


def test_http_routes_are_stateless_and_take_a_timeout(url):
    r = requests.post(url + "/step", json={"action": {"code": "import time\ntime.sleep(10)"}, "timeout_s": 0.5}, timeout=30)
    assert r.status_code == 200 and r.json()["observation"]["exit_code"] == 124, r.text
    assert "0.5 s" in r.json()["observation"]["stderr"]
    r = requests.post(url + "/step", json={"action": {"code": "print(x)"}}, timeout=30)
    assert r.json()["observation"]["exit_code"] == 1  # every HTTP step gets a fresh worker
    assert requests.post(url + "/step", json={"action": {"code": 1}}, timeout=30).status_code == 422
    s = requests.get(url + "/state", timeout=30).json()
    assert s["episode_id"] and (s["step_count"], s["last_exit_code"]) == (0, 0)


# ---------------------------------------------------------------- the OS layers alone (no interpreter layer)

ESCAPED = {  # layer: what code that escaped the interpreter tries, and what stops it
    "filesystem": ("print(open('/etc/passwd').read())", "FileNotFoundError"),
    "seccomp": ("import os\nos.fork()", "PermissionError"),
    "network": ("import socket\nsocket.create_connection(('127.0.0.1', 80), timeout=2)", None),
    "user": ("import os\nos.kill(os.getppid(), 0)", "PermissionError"),
}


@pytest.mark.parametrize("layer", list(ESCAPED))
def test_os_layer_holds_when_the_interpreter_is_escaped(raw_url, layer):
    layers = layers_of(raw_url)
    assert layers[Layer.interpreter].status is Status.off  # `executor="exec"`: nothing but the OS layers
    state = layers[Layer(layer)]
    need("sandbox", state.status is Status.held, f"the {layer} layer is not held here: {state.status} ({state.detail})")
    code, says = ESCAPED[layer]
    if says is None:  # no socket at all with the syscall filter; no route without it
        says = "PermissionError" if layers.held(Layer.seccomp) else "Network is unreachable"
    [r] = run(raw_url, code)
    assert r["observation"]["exit_code"] == 1 and says in r["observation"]["stderr"], r


def test_worker_sees_none_of_the_servers_environment(raw_url):
    [r] = run(raw_url, "import os\nprint(sorted(os.environ))")
    assert r["observation"]["stdout"] == "['HOME', 'LANG', 'PATH', 'TMPDIR']\n"


def test_a_crashed_worker_is_reported_and_the_server_goes_on(raw_url):
    a, b, c = run(raw_url, "x = 1", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)", "print('alive')")
    assert (b["observation"]["exit_code"], b["metadata"]["limit"]) == (139, "crash")
    assert "SIGSEGV" in b["observation"]["stderr"] and b["metadata"]["state_lost"]
    assert c["observation"]["stdout"] == "alive\n"
    health(raw_url)


# ---------------------------------------------------------------- nothing outlives the server

def _gone(pid: int) -> bool:
    """Whether `pid` has ended (gone, or a zombie nobody reaped)."""
    st = _stat(pid)
    return st is None or st[0] == "Z"


def test_no_fork_server_or_worker_outlives_a_killed_server():
    p = start_server("test_coding:quick_coding", max_sessions=4)
    async def go():
        headers = {"x-openenv-extensions": "metadata"}
        async with connect(ws_url(p.base_url), additional_headers=headers, compression=None) as ws:  # open throughout
            await ws.send(json.dumps({"type": "reset"}))
            process = Layers.from_json(json.loads(await ws.recv())["data"]["metadata"]["sandbox"])[Layer.process].facts
            worker, fork_server = process["pid"], process["fork_server"]
            assert not _gone(worker) and not _gone(fork_server)
            os.kill(p.proc.pid, signal.SIGKILL)  # the server alone, with no chance to clean up
            await asyncio.to_thread(wait_until, lambda: _gone(worker) and _gone(fork_server), "fork server and worker gone")
    try: asyncio.run(go())
    finally: p.stop()
