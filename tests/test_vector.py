"""The batch extension and the vector client against real servers."""
import asyncio
import json
import os
import signal

import pytest

from openenv_nb.resume import Resume
from websockets.asyncio.client import connect

from openenv_nb.client import EpisodeLost, ws_url
from openenv_nb.providers import LocalProcessProvider
from openenv_nb.envs.echo import EchoAction, EchoEnv, EchoObservation
from openenv_nb.types import EnvConnectionError, EnvServerError, State
from openenv_nb.vector import VectorEnv
from conftest import start_server


class EchoVector(VectorEnv[EchoAction, EchoObservation, State]):
    default_target = "echo"


def test_batch_results_equal_steps_one_by_one(server):
    url = server("echo", max_sessions=32)
    messages = [[f"e{i}-s{k}" * (i % 4) for i in range(8)] for k in range(4)]
    with EchoVector(url, num_envs=8).sync() as venv:
        first = venv.reset(seed=5)
        batched = [venv.step([EchoAction(message=m) for m in row]) for row in messages]
        states = venv.states()
    singles = []
    for i in range(8):
        with EchoEnv(url).sync() as env:
            r0 = env.reset(seed=5 + i)
            singles.append((r0, [env.step(EchoAction(message=row[i])) for row in messages], env.state()))
    for i, (r0, steps, st) in enumerate(singles):
        assert (first.observations[i], first.rewards[i], first.dones[i]) == (r0.observation, r0.reward, r0.done)
        for b, s in zip(batched, steps):
            assert (b.observations[i], b.rewards[i], b.dones[i]) == (s.observation, s.reward, s.done)
        assert states[i].step_count == st.step_count == 4


def test_a_failing_environment_does_not_fail_the_batch(server):
    url = server("helpers:Flaky", max_sessions=8)
    with EchoVector(url, num_envs=4).sync() as venv:
        venv.reset()
        r = venv.step([EchoAction(message=m) for m in ["a", "boom", "ccc", "boom"]])
        assert [o and o.echoed_message for o in r.observations] == ["a", None, "ccc", None]
        assert [e and e.code for e in r.errors] == [None, "EXECUTION_ERROR", None, "EXECUTION_ERROR"]
        assert "the environment blew up" in str(r.errors[1]) and "environment 1" in str(r.errors[1])
        assert not r.ok
        assert venv.step([EchoAction(message="fine")] * 4).ok  # the failed ones go on too


def test_mixed_done_with_auto_reset(server):
    url = server("helpers:Countdown", max_sessions=8)
    with VectorEnv[EchoAction, EchoObservation, State](url, num_envs=3, auto_reset=True).sync() as venv:
        venv.reset(seed=0)  # episodes of 3, 4 and 5 steps
        history = [venv.step([EchoAction(message="x")] * 3) for _ in range(7)]
    dones = [[r.dones[i] for r in history] for i in range(3)]
    resets = [[r.resets[i] for r in history] for i in range(3)]
    assert dones[0] == [False, False, True, False, False, False, True]
    assert resets[0] == [False, False, False, True, False, False, False]
    assert dones[1] == [False, False, False, True, False, False, False] and resets[1][4]
    assert dones[2][:5] == [False] * 4 + [True] and resets[2][5]
    reset_obs = history[3].observations[0]
    assert reset_obs.echoed_message == "Echo environment ready!" and history[3].rewards[0] == 0.0


def test_a_dead_server_fails_only_its_environments():
    a, b = start_server("echo"), start_server("echo")
    try:
        with EchoVector([a.base_url, b.base_url], num_envs=4, connect_timeout_s=2,
                        resume=Resume(attempts=2, first_delay_s=0.1)).sync() as venv:
            venv.reset()
            os.killpg(b.proc.pid, signal.SIGKILL)
            r = venv.step([EchoAction(message="hi")] * 4)
            assert [e is None for e in r.errors] == [True, True, False, False]
            assert isinstance(r.errors[2], EpisodeLost) and b.base_url.replace("http", "ws") in str(r.errors[2])
            r = venv.step([EchoAction(message="again")] * 4)
            assert "reset() starts a new one" in str(r.errors[3]) and r.errors[0] is None
            r = venv.reset()  # the dead server cannot be reached again: said per environment
            assert r.errors[0] is None and "Could not connect" in str(r.errors[2])
    finally:
        a.stop(); b.stop()


def test_capacity_counts_environments(server):
    url = server("echo", max_sessions=4)
    with pytest.raises(EnvServerError, match="CAPACITY_REACHED"):
        EchoVector(url, num_envs=5).sync().connect()
    async def go():
        async with EchoVector(url, num_envs=3) as venv:
            await venv.reset()
            async with EchoEnv(url) as one:
                await one.reset()  # the fourth slot
                async with connect(ws_url(url)) as fifth:
                    return json.loads(await fifth.recv())
    assert asyncio.run(go())["data"]["code"] == "CAPACITY_REACHED"


def test_rollout_collects_trajectories(server):
    url = server("helpers:Countdown", max_sessions=8)
    policy = lambda obs: [EchoAction(message="ab")] * len(obs)
    with VectorEnv[EchoAction, EchoObservation, State](url, num_envs=6).sync() as venv:
        ro = venv.rollout(policy, max_steps=10, seed=0)
    assert [len(t.actions) for t in ro.trajectories] == [3, 4, 5, 3, 4, 5]
    assert ro.steps == 24 and all(t.dones[-1] and not any(t.dones[:-1]) for t in ro.trajectories)
    assert ro.total_rewards == pytest.approx([0.6, 0.8, 1.0, 0.6, 0.8, 1.0])


def test_an_openenv_client_cannot_send_batches(echo_url):
    async def go():
        async with connect(ws_url(echo_url)) as ws:
            await ws.send(json.dumps({"type": "batch.open", "data": {"count": 2}}))
            return json.loads(await ws.recv())
    assert asyncio.run(go())["data"]["code"] == "UNKNOWN_TYPE"


def test_plain_calls_and_a_token():
    p = LocalProcessProvider("echo", env_vars={"OPENENV_TOKEN": "s3cret"}); url = p.start()
    try:
        venv = EchoVector(url, num_envs=2, token="s3cret")  # plain calls: no .sync(), no await
        assert venv.reset().ok
        assert [o.echoed_message for o in venv.step([EchoAction(message="t")] * 2).observations] == ["t", "t"]
        assert venv.step([EchoAction(message="m")] * 2).observations[0].metadata == {"original_message": "m", "step": 2}
        venv.close()
        with pytest.raises(EnvConnectionError, match="401"): EchoVector(url, num_envs=1, token="", connect_timeout_s=2).connect()
    finally:
        p.stop()


def test_columns_and_ops_give_the_same_results_on_the_wire(server):
    """`batch.step`/`batch.reset` columns say what the `batch` op frames say, entry by entry; a bad action fails its entry only."""
    url = server("echo", max_sessions=8)
    async def go():
        async with connect(ws_url(url), additional_headers={"x-openenv-extensions": "batch, request-id"}) as ws:
            async def ask(kind, data, rid):
                await ws.send(json.dumps({"type": kind, "data": data, "id": rid}))
                return json.loads(await ws.recv())
            a = (await ask("batch.open", {"count": 3}, 1))["data"]["envs"]
            b = (await ask("batch.open", {"count": 3}, 2))["data"]["envs"]
            cols = (await ask("batch.reset", {"envs": a, "seeds": [1, 2, 3]}, 3))["data"]
            ops = (await ask("batch", {"ops": [{"env": i, "type": "reset", "data": {"seed": s}} for i, s in zip(b, [1, 2, 3])]}, 4))["data"]["results"]
            assert cols["observations"] == [f["data"]["observation"] for f in ops] and cols["errors"] == [None] * 3
            acts = [{"message": "hi"}, {"message": 5}, {"message": "there"}]
            step = await ask("batch.step", {"envs": a, "actions": acts}, 5)
            ops = (await ask("batch", {"ops": [{"env": i, "type": "step", "data": d} for i, d in zip(b, acts)]}, 6))["data"]["results"]
            assert (step["type"], step["id"]) == ("batch.results", 5)
            cols = step["data"]
            assert cols["observations"][0] == ops[0]["data"]["observation"] and cols["rewards"][2] == ops[2]["data"]["reward"]
            assert cols["observations"][1] is None and cols["errors"][1] == ops[1]["data"]  # the bad action: its own error, as a step alone gets
            again = (await ask("batch.step", {"envs": a[:2], "actions": [None, {"message": "x"}], "resets": [a[0]]}, 7))["data"]
            assert again["observations"][0]["echoed_message"] == "Echo environment ready!" and again["errors"] == [None, None]
            bad = await ask("batch.step", {"envs": a, "actions": acts[:2]}, 8)
            assert (bad["type"], bad["data"]["code"]) == ("error", "VALIDATION_ERROR")  # columns that do not line up: the message's error
    asyncio.run(go())


def test_an_untyped_vector_sends_actions_as_given(server):
    url = server("echo", max_sessions=4)
    with VectorEnv(url, num_envs=3).sync() as venv:
        venv.reset()
        r = venv.step([{"message": "a"}, {"message": ["not", "text"]}, {"message": "ccc"}])
        assert [o and o["echoed_message"] for o in r.observations] == ["a", None, "ccc"]
        assert r.errors[1].code == "VALIDATION_ERROR" and "environment 1" in str(r.errors[1])
