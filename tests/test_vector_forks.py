"""Forks of live episodes through `VectorEnv` (`batch` ops): every branch of a fork, continued with the
same actions, gives the trace of a from-scratch replay (seed, prefix, suffix); bad inputs fail only their
own environment; a restored environment is rebuilt after a lost connection; a pool of two servers shares
portable snapshots."""
import asyncio
import importlib.util
import json
import random

import pytest
from chaos import Chaos
from conftest import need
from test_forks import BRANCHES, POOL_KEY, ReplayedEcho, actions_for, workers_for
from websockets.asyncio.client import connect

import openenv_nb.vector_forks  # noqa: F401  (adds snapshot, restore, fork to VectorEnv; forks to EnvClient)
from openenv_nb.client import GenericEnvClient, ws_url
from openenv_nb.envs.echo import EchoEnvironment
from openenv_nb.forks import Snapshot
from openenv_nb.resume import EpisodeLost, Resume
from openenv_nb.runner import serve_in_thread
from openenv_nb.server import create_app
from openenv_nb.snapshots import Store
from openenv_nb.targets import make_app
from openenv_nb.types import EnvServerError
from openenv_nb.vector import VectorEnv

FAMILIES = {"echo-replay": (ReplayedEcho, 3, 5), "cartpole": ("gym:CartPole-v1", 4, 6),
            "chess": ("chess", 3, 3), "coding": ("coding", 3, 2)}
EXTRA = {"cartpole": ("gym", "gymnasium"), "chess": ("chess", "chess")}
FAST = Resume(attempts=40, total_s=60, first_delay_s=0.01, max_delay_s=0.2)


def plan(family, salt=""):
    "The family's target, and a seed, a prefix and a suffix of actions."
    target, k, rest = FAMILIES[family]
    if extra := EXTRA.get(family): need(extra[0], importlib.util.find_spec(extra[1]) is not None,
                                        f"needs the {extra[0]} extra")
    rng = random.Random(family + salt)
    seed, prefix, suffix = rng.randrange(10**6), actions_for(family, k, rng), actions_for(family, rest, rng)
    if family == "chess": prefix, suffix = prefix[:k], actions_for(family, k + rest, rng)[k:]
    return target, seed, prefix, suffix


def app_for(target, n=80, **kw):
    return (create_app(target, max_concurrent_envs=n, **kw) if not isinstance(target, str)
            else make_app(target, max_sessions=n, **kw))


async def traces(v, envs, actions):
    "Each environment's trace of `actions` (observation without metadata, reward, done), side by side."
    out, running = {i: [] for i in envs}, list(envs)
    for a in actions:
        if not running: break
        r = await v.step([a] * len(running), envs=running)
        r.raise_errors()
        for i, o, rw, d in zip(running, r.observations, r.rewards, r.dones):
            out[i].append(({k: x for k, x in o.items() if k != "metadata"}, rw, d))
        running = [i for i, d in zip(running, r.dones) if not d]
    return [out[i] for i in envs]


async def played(v, envs, seed, prefix):
    "Reset `envs` with `seed` and play `prefix` on them."
    (await v.reset(seed=[seed] * len(envs), envs=envs)).raise_errors()
    await traces(v, envs, prefix)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_branches_match_replay(family, monkeypatch):
    "Fork env 0 at step k into 64 envs of the vector; each goes on as seed + prefix + suffix."
    n = BRANCHES
    workers_for(family, monkeypatch)
    target, seed, prefix, suffix = plan(family)
    async def main(url):
        async with VectorEnv(url, num_envs=1) as fresh:
            await played(fresh, [0], seed, prefix)
            want, = await traces(fresh, [0], suffix)
        async with VectorEnv(url, num_envs=n + 1) as v:
            await played(v, [0], seed, prefix)
            kids = list(range(1, n + 1))
            r = await v.fork(0, kids)
            r.raise_errors()
            steps = [s.step_count for s in await v.states(kids)]
            got = await traces(v, [0, *kids], suffix)  # the original goes on beside its copies
        return want, steps, got
    with serve_in_thread(app_for(target)) as url: want, steps, got = asyncio.run(main(url))
    assert want and steps == [len(prefix)] * n
    assert all(g == want for g in got)


def test_bad_inputs_fail_only_their_environment():
    "No episode, a forged or expired id, a wrong kind or count, an unknown env: refused; the vector goes on."
    now = [0.0]
    app = create_app(EchoEnvironment, max_concurrent_envs=8)
    app.state.hub.snapshots = Store(ttl_s=60, clock=lambda: now[0])
    async def main(url):
        async with VectorEnv(url, num_envs=4) as v:
            with pytest.raises(EnvServerError, match="no episode to snapshot"): await v.snapshot([0])
            with pytest.raises(EnvServerError, match="no episode to snapshot"): await v.fork(0, [1])
            await v.reset(seed=1)
            await v.step([{"message": m} for m in "abcd"])
            snap, = await v.snapshot([0])
            forged = [Snapshot(sid, None, 1, True, snap.log) for sid in (snap.id[::-1], "x" * 500, "")]
            r = await v.restore([*forged, snap], envs=[1, 2, 3, 0])
            assert [e is None for e in r.errors] == [False, False, False, True]
            assert all(e.code == "VALIDATION_ERROR" for e in r.errors[:3])
            assert "environment 1" in str(r.errors[0])
            with pytest.raises(TypeError, match="takes Snapshots"): await v.restore([snap.id], envs=[1])
            with pytest.raises(ValueError, match="Got 1 snapshots for 2"):
                await v.restore([snap], envs=[1, 2])
            with pytest.raises(IndexError, match="No environments .4."): await v.restore(snap, envs=[4])
            with pytest.raises(IndexError, match="No environments .9."): await v.fork(9, [1])
            now[0] = 61.0
            r = await v.restore(snap, envs=[1])
            assert "Unknown or expired" in str(r.errors[0])
            # every environment is still usable, each in its own state
            r = await v.step([{"message": "z"}] * 4)
            assert r.ok and [o["metadata"]["step"] for o in r.observations] == [2, 2, 2, 2]
            assert [o["echoed_message"] for o in r.observations] == ["z"] * 4
    with serve_in_thread(app) as url: asyncio.run(main(url))


def test_ops_on_the_wire():
    "Raw batch ops: an unknown env, bad data, no `snapshot` in the handshake: that op's error only."
    async def main(url):
        async def session(ext):
            ws = await connect(ws_url(url), additional_headers={"x-openenv-extensions": ext})
            async def send(kind, data):
                await ws.send(json.dumps({"type": kind, "data": data}))
                return json.loads(await ws.recv())
            return ws, send
        ws, send = await session("batch, snapshot")
        async with ws:
            await send("batch.open", {"count": 2})
            await send("batch.reset", {"envs": [0], "seeds": [4]})
            await send("batch.step", {"envs": [0], "actions": [{"message": "col"}]})
            r = (await send("batch", {"ops": [{"env": 0, "type": "snapshot"},
                                              {"env": 5, "type": "snapshot"},
                                              {"env": 1, "type": "snapshot", "data": {"portable": "maybe"}},
                                              {"env": 5, "type": "restore", "data": {"snapshot_id": "x"}},
                                              {"env": 1, "type": "restore", "data": {"snapshot_id": None}}]}))
            res = r["data"]["results"]
            assert res[0]["type"] == "snapshot" and res[0]["data"]["step_count"] == 1
            assert [x["data"]["errors"][0]["type"] for x in res[1:]] == ["unknown_env", "bool_parsing",
                                                                         "unknown_env", "value_error"]
            sid = res[0]["data"]["snapshot_id"]
            r = await send("batch", {"ops": [{"env": 1, "type": "restore", "data": {"snapshot_id": sid}},
                                             {"env": 1, "type": "step", "data": {"message": "on"}}]})
            first, then = r["data"]["results"]
            assert first["data"]["observation"]["echoed_message"] == "col"
            assert then["data"]["observation"]["metadata"]["step"] == 2
            closed = await send("batch.close", {"envs": [0]})
            assert closed["data"]["envs"] == [0]
            r = await send("batch", {"ops": [{"env": 1, "type": "restore", "data": {"snapshot_id": sid}}]})
            assert "Unknown or expired" in r["data"]["results"][0]["data"]["message"]  # went with env 0
        ws, send = await session("batch")
        async with ws:
            await send("batch.open", {"count": 1})
            r = await send("batch", {"ops": [{"env": 0, "type": "reset"}, {"env": 0, "type": "snapshot"}]})
            ok, no = r["data"]["results"]
            assert ok["type"] == "observation" and no["data"]["errors"][0]["type"] == "not_negotiated"
        hub = app.state.hub
        for _ in range(200):  # the server notices the closed sockets in its own time
            if hub.active == 0: break
            await asyncio.sleep(0.05)
        return hub.active, len(hub.snapshots.snaps)
    app = create_app(EchoEnvironment, max_concurrent_envs=8)
    with serve_in_thread(app) as url:
        assert asyncio.run(main(url)) == (0, 0)  # every environment and snapshot let go with its session


@pytest.mark.parametrize("cls", [EchoEnvironment, ReplayedEcho])
def test_a_restored_environment_is_rebuilt_after_a_lost_connection(cls):
    "The proxy cuts the vector's connection after a fork: the copies are replayed as the snapshot's episode."
    rng = random.Random(cls.__name__)
    seed, prefix, suffix = rng.randrange(10**6), actions_for("echo", 3, rng), actions_for("echo", 4, rng)
    async def main(url):
        async with VectorEnv(url, num_envs=1) as fresh:
            await played(fresh, [0], seed, prefix)
            want, = await traces(fresh, [0], suffix)
        async with Chaos(int(url.rsplit(":", 1)[1])) as proxy, \
                VectorEnv(proxy.url, num_envs=4, resume=FAST) as v:
            await played(v, [0], seed, prefix)
            (await v.fork(0, [1, 2, 3])).raise_errors()
            got = await traces(v, [0, 1, 2, 3], suffix[:2])
            proxy.cut_all()
            rest = await traces(v, [0, 1, 2, 3], suffix[2:])
            steps = [s.step_count for s in await v.states()]
            return want, [g + r for g, r in zip(got, rest)], steps, v.resumes
    with serve_in_thread(create_app(cls, max_concurrent_envs=16)) as url:
        want, got, steps, resumes = asyncio.run(main(url))
    assert got == [want] * 4 and steps == [len(prefix) + len(suffix)] * 4 and resumes == 4


def test_a_client_snapshot_in_a_vector_is_rebuilt_after_a_lost_connection():
    "An `EnvClient`'s snapshot restored into a vector's envs: its log is their trail, so a cut replays it."
    rng = random.Random("client")
    seed, prefix, suffix = rng.randrange(10**6), actions_for("echo", 3, rng), actions_for("echo", 4, rng)
    async def main(url):
        async with VectorEnv(url, num_envs=1) as fresh:
            await played(fresh, [0], seed, prefix)
            want, = await traces(fresh, [0], suffix)
        async with GenericEnvClient(url) as env, Chaos(int(url.rsplit(":", 1)[1])) as proxy, \
                VectorEnv(proxy.url, num_envs=2, resume=FAST) as v:
            await env.reset(seed=seed)
            for a in prefix: await env.step(a)
            (await v.restore(await env.snapshot())).raise_errors()
            got = await traces(v, [0, 1], suffix[:1])
            proxy.cut_all()
            rest = await traces(v, [0, 1], suffix[1:])
            return want, [g + r for g, r in zip(got, rest)], v.resumes
    with serve_in_thread(create_app(ReplayedEcho, max_concurrent_envs=8)) as url:
        want, got, resumes = asyncio.run(main(url))
    assert got == [want] * 2 and resumes == 2


def test_a_restore_after_a_lost_connection_rebuilds_the_other_environments():
    "Cut, then restore env 0: the first try says its episode is lost; the next rebuilds envs 1 and 2 first."
    async def main(url):
        async with GenericEnvClient(url) as env, Chaos(int(url.rsplit(":", 1)[1])) as proxy, \
                VectorEnv(proxy.url, num_envs=3, resume=FAST) as v:
            await env.reset(seed=1)
            await env.step({"message": "outside"})
            snap = await env.snapshot()
            await v.reset(seed=2)
            await v.step([{"message": m} for m in "abc"])
            proxy.cut_all()
            first = (await v.restore(snap, envs=[0])).errors[0]
            (await v.restore(snap, envs=[0])).raise_errors()
            r = await v.step([{"message": "z"}] * 3)
            r.raise_errors()
            return first, [o["metadata"]["step"] for o in r.observations], await v.states(), v.resumes
    with serve_in_thread(create_app(ReplayedEcho, max_concurrent_envs=8)) as url:
        first, steps, states, resumes = asyncio.run(main(url))
    assert isinstance(first, EpisodeLost) and steps == [2, 2, 2] and resumes == 2
    assert [s.step_count for s in states] == [2, 2, 2]


@pytest.mark.parametrize("family", ["echo-replay", "cartpole", "chess"])
def test_pool_of_two(family, monkeypatch):
    "A vector over two servers of a pool: `fork` copies env 0 to the other server by blob; same traces."
    target, seed, prefix, suffix = plan(family, "pool")
    async def main(a, b):
        async with VectorEnv(a, num_envs=1) as fresh:
            await played(fresh, [0], seed, prefix)
            want, = await traces(fresh, [0], suffix)
        async with VectorEnv([a, b], num_envs=8) as v:  # envs 0-3 on a, 4-7 on b
            await played(v, [0], seed, prefix)
            plain, = await v.snapshot([0])
            with pytest.raises(ValueError, match=r"snapshot\(portable=True\)"):
                await v.restore(plain, envs=[1, 5])
            (await v.fork(0, list(range(1, 8)))).raise_errors()
            steps = [s.step_count for s in await v.states()]
            return want, steps, await traces(v, list(range(8)), suffix)
    monkeypatch.setenv("OPENENV_SNAPSHOT_KEY", POOL_KEY)  # both servers read the key from their environment
    with serve_in_thread(app_for(target, 8)) as a, serve_in_thread(app_for(target, 8)) as b:
        want, steps, got = asyncio.run(main(a, b))
    assert want and steps == [len(prefix)] * 8 and got == [want] * 8


def test_no_key_across_servers(monkeypatch):
    "Servers without a key: a fork across them names the key; a fork on one server still works."
    monkeypatch.delenv("OPENENV_SNAPSHOT_KEY", raising=False)
    async def main(a, b):
        async with VectorEnv([a, b], num_envs=4) as v:
            await v.reset(seed=2)
            await v.step([{"message": "m"}] * 4)
            with pytest.raises(EnvServerError, match="OPENENV_SNAPSHOT_KEY"): await v.fork(0, [3])
            r = await v.fork(0, [1])
            return r.ok, (await v.step([{"message": "n"}] * 4)).ok
    with serve_in_thread(app_for(EchoEnvironment, 4)) as a, \
            serve_in_thread(app_for(EchoEnvironment, 4)) as b:
        assert asyncio.run(main(a, b)) == (True, True)
