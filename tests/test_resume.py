"""Episodes that survive: a chaos proxy cuts connections at seeded random points and the server is killed and
replaced; every episode must give exactly the trace of an undisturbed run, or end in a typed `EpisodeLost`."""
import asyncio
import contextlib
import importlib.util
import random

import pytest

from chaos import Chaos
from conftest import need
from openenv_nb.client import GenericEnvClient
from openenv_nb.envs.echo import EchoEnvironment
from openenv_nb.resume import Diverged, EpisodeLost, Resume
from openenv_nb.runner import serve_in_thread
from openenv_nb.server import create_app
from openenv_nb.targets import make_app

FAST = Resume(attempts=40, total_s=60, first_delay_s=0.01, max_delay_s=0.2)


def port_of(url: str) -> int: return int(url.rsplit(":", 1)[1])


@contextlib.contextmanager
def served(app):
    "A server for `app` in a thread: its URL and its hub."
    with serve_in_thread(app) as url: yield url, app.state.hub


async def until(cond) -> bool:
    "Whether `cond()` comes true within a bounded wait (the server notices a cut in its own time)."
    for _ in range(200):
        if cond(): return True
        await asyncio.sleep(0.05)
    return cond()


def actions_for(family: str, n: int, rng: random.Random) -> list[dict]:
    if family == "echo": return [{"message": "".join(rng.choices("abc", k=rng.randint(0, 5)))} for _ in range(n)]
    if family == "cartpole": return [{"action": rng.randint(0, 1)} for _ in range(n)]
    if family == "chess": return [{"move": m} for m in ("e2e4", "g1f3", "f1c4", "b1c3", "d2d3", "c1g5")[:n]]
    if family == "coding": return [{"code": f"x = {i}\nprint(x * {rng.randint(1, 9)})"} for i in range(n)]
    raise ValueError(family)


async def play(url: str, seed: int, actions: list[dict], resume=FAST) -> tuple[list, int, int]:
    "An episode's trace (each reply's observation, reward and done), the step count the server saw, and resumes."
    async with GenericEnvClient(url, resume=resume, connect_timeout_s=30) as env:
        trace = [(await env.reset(seed=seed)).observation]
        for a in actions:
            r = await env.step(a)
            trace.append((r.observation, r.reward, r.done))
            if r.done: break
        return trace, (await env.state())["step_count"], env.resumes


def without_metadata(trace):
    return [(({k: v for k, v in t[0].items() if k != "metadata"}, *t[1:]) if isinstance(t, tuple)
             else {k: v for k, v in t.items() if k != "metadata"}) for t in trace]


FAMILIES = {"echo": (EchoEnvironment, 904, 8),  # with the others: 1,000 episodes
            "cartpole": ("gym:CartPole-v1", 60, 20), "chess": ("chess", 30, 6),
            "coding": ("coding", 6, 4)}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_cuts_anywhere_change_nothing(family):
    "Seeded episodes through a proxy that cuts connections at random: the same traces as without it."
    target, episodes, steps = FAMILIES[family]
    extra = {"cartpole": ("gym", "gymnasium"), "chess": ("chess", "chess")}.get(family)
    if extra: need(extra[0], importlib.util.find_spec(extra[1]) is not None, f"needs the {extra[0]} extra")
    app = create_app(target, max_concurrent_envs=64) if not isinstance(target, str) else make_app(target, max_sessions=64)
    rng = random.Random(family)
    plans = [(rng.randrange(10**6), actions_for(family, steps, rng)) for _ in range(episodes)]
    async def main(url, hub):
        calm = [await play(url, s, a) for s, a in plans]
        async with Chaos(port_of(url), p=0.08, seed=1) as proxy:
            sem = asyncio.Semaphore(16)
            async def one(s, a):
                async with sem: return await play(proxy.url, s, a)
            rough = await asyncio.gather(*[one(s, a) for s, a in plans])
        return calm, rough, proxy.cuts
    with served(app) as (url, hub):
        calm, rough, cuts = asyncio.run(main(url, hub))
        assert cuts > episodes // 4, f"the proxy cut only {cuts} connections: the test tests little"
        for (t0, n0, _), (t1, n1, _) in zip(calm, rough):
            assert without_metadata(t1) == without_metadata(t0)
            assert n1 == n0  # the server applied every step once: none twice, none lost
        assert sum(r for *_, r in rough) > 0
        assert hub.answered_again > 0, "no reply was sent again: the cuts never fell between a step and its reply"


def test_sessions_left_after_the_grace_period():
    "Sessions whose client never comes back are let go when the grace period ends: none is left, no slot held."
    app = create_app(EchoEnvironment, max_concurrent_envs=8, resume_grace_s=0.2)
    async def main(url, hub):
        async with Chaos(port_of(url)) as proxy:
            clients = [GenericEnvClient(proxy.url, resume=False) for _ in range(5)]
            for c in clients: await c.reset()
            proxy.cut_all()
            await until(lambda: not hub.kept and hub.active == 0)  # parked, then let go, all five
            for c in clients: c._abandon()
        return len(hub.kept), hub.active
    with served(app) as (url, hub): assert asyncio.run(main(url, hub)) == (0, 0)


def test_parked_sessions_never_keep_newcomers_out():
    "With every slot held by a parked session, a newcomer still gets one: the oldest parked session is let go."
    app = create_app(EchoEnvironment, max_concurrent_envs=2, resume_grace_s=600)
    async def main(url, hub):
        async with Chaos(port_of(url)) as proxy:
            gone = [GenericEnvClient(proxy.url, resume=False) for _ in range(2)]
            for c in gone: await c.reset()
            proxy.cut_all()
            await until(lambda: sum(k.timer is not None for k in hub.kept.values()) == 2)
            async with GenericEnvClient(url) as fresh:
                r = await fresh.step({"message": "hi"}) if (await fresh.reset()) else None
            for c in gone: c._abandon()
            return r.observation["echoed_message"], hub.evicted
    with served(app) as (url, hub): assert asyncio.run(main(url, hub)) == ("hi", 1)


class Unreplayable(EchoEnvironment):
    "An echo that does not say it can be replayed."
    REPLAYABLE = False


class Drifting(EchoEnvironment):
    "Says it can be replayed, but its replies drift from one server to the next."
    born = 0
    def __init__(self):
        super().__init__()
        Drifting.born += 1
        self.tag = Drifting.born
    def step(self, action, **kw):
        o = super().step(action, **kw)
        o.echoed_message += f"#{self.tag}"
        return o


async def restart_midway(make_app, steps=(("a", "b"), ("c",))):
    "Play steps, kill the server, put a new one behind the same URL, play on; the trace and the client."
    with served(make_app()) as (url, _):
        proxy = await Chaos(port_of(url)).__aenter__()
        env = GenericEnvClient(proxy.url, resume=FAST)
        trace = [(await env.reset(seed=3)).observation["echoed_message"]]
        for m in steps[0]: trace.append((await env.step({"message": m})).observation["echoed_message"])
        proxy.cut_all()
    with served(make_app()) as (url2, _):
        proxy.target = port_of(url2)
        try:
            for m in steps[1]: trace.append((await env.step({"message": m})).observation["echoed_message"])
            return trace, env
        finally:
            env._abandon()
            await proxy.__aexit__()


def test_a_restarted_server_gets_the_episode_by_replay():
    trace, env = asyncio.run(restart_midway(lambda: create_app(EchoEnvironment)))
    assert trace == ["Echo environment ready!", "a", "b", "c"] and env.resumes == 1
    assert [e.action for e in env.episode.steps] == [{"message": m} for m in "abc"]


def test_an_environment_that_cannot_be_replayed_is_lost_never_replayed():
    with pytest.raises(EpisodeLost, match="replayable"):
        asyncio.run(restart_midway(lambda: create_app(Unreplayable)))


def test_a_replay_that_goes_another_way_is_lost_at_its_step():
    Drifting.REPLAYABLE = True
    with pytest.raises(Diverged, match="differs at step 1: observation") as e:
        asyncio.run(restart_midway(lambda: create_app(Drifting)))
    assert e.value.step == 1


def test_resume_off_or_upstream_server_loses_the_episode_as_before():
    "`resume=False`: a dropped connection is an `EpisodeLost`, as before."
    async def main():
        with served(create_app(EchoEnvironment)) as (url, _):
            async with Chaos(port_of(url)) as proxy:
                env = GenericEnvClient(proxy.url, resume=False)
                await env.reset()
                proxy.cut_all()
                with pytest.raises(EpisodeLost, match="reset\\(\\) starts a new one"): await env.step({"message": "x"})
                env._abandon()
    asyncio.run(main())


def test_grace_zero_offers_no_resume():
    async def main():
        with served(create_app(EchoEnvironment, resume_grace_s=0)) as (url, hub):
            async with GenericEnvClient(url) as env:
                await env.reset()
                return env.extensions, hub.kept
    ext, kept = asyncio.run(main())
    assert "resume" not in ext and kept == {}


# ---------------------------------------------------------------- VectorEnv: each environment resumes on its own
from openenv_nb.vector import VectorEnv


async def vector_run(urls, steps, cut=None, n=8):
    "Rewards and echoed messages of `steps` batch steps; `cut(k)` runs before step k (a lost server)."
    rng, out = random.Random(5), []
    async with VectorEnv(urls, num_envs=n, resume=FAST) as v:
        await v.reset(seed=1)
        for k in range(steps):
            if cut: await cut(k)
            r = await v.step([{"message": "".join(rng.choices("xyz", k=rng.randint(0, 4)))} for _ in range(n)])
            out.append([(o and o["echoed_message"], rw, repr(e) if e else None)
                        for o, rw, e in zip(r.observations, r.rewards, r.errors)])
        return out, v.resumes, [s.step_count if not isinstance(s, Exception) else s for s in await v.states()]


def test_a_vector_rebuilds_the_episodes_of_a_lost_server_and_leaves_the_others_alone():
    async def main(u1, u2, make_app):
        calm = await vector_run([u1, u2], 6)
        async with Chaos(port_of(u1)) as p1, Chaos(port_of(u2)) as p2:
            async def cut(k):
                if k == 2: p1.cut_all()  # a blip
                if k == 4:  # a restart: another server behind the same URL
                    nonlocal spare
                    spare = served(make_app()); url, _ = spare.__enter__()
                    p2.target = port_of(url); p2.cut_all()
            spare = None
            try: rough = await vector_run([p1.url, p2.url], 6, cut)
            finally:
                if spare: spare.__exit__(None, None, None)
        return calm, rough
    make_app = lambda: create_app(EchoEnvironment, max_concurrent_envs=16)
    with served(make_app()) as (u1, _), served(make_app()) as (u2, _):
        (calm, _, n0), (rough, resumes, n1) = asyncio.run(main(u1, u2, make_app))
    assert rough == calm and n1 == n0 == [6] * 8  # the same results; every step applied once
    assert resumes == 8  # four environments on each server, each rebuilt once


def test_a_vector_over_an_unreplayable_server_loses_only_its_episodes():
    async def main(u1, u2):
        async with Chaos(port_of(u1)) as p1:
            async with VectorEnv([p1.url, u2], num_envs=4, resume=FAST) as v:
                await v.reset(seed=1)
                p1.cut_all()
                r = await v.step([{"message": "m"}] * 4)
                return [type(e).__name__ if e else None for e in r.errors]
    with served(create_app(Unreplayable, max_concurrent_envs=4)) as (u1, _), \
         served(create_app(EchoEnvironment, max_concurrent_envs=4)) as (u2, _):
        assert asyncio.run(main(u1, u2)) == ["EpisodeLost", "EpisodeLost", None, None]


def test_a_reset_of_some_environments_after_a_cut_rebuilds_the_others():
    "Cut, then reset env 0 alone: it starts over at once; envs 1 and 2 go on with their episodes."
    async def main(url):
        async with Chaos(port_of(url)) as proxy, VectorEnv(proxy.url, num_envs=3, resume=FAST) as v:
            await v.reset(seed=1)
            await v.step([{"message": m} for m in "abc"])
            proxy.cut_all()
            (await v.reset(seed=7, envs=[0])).raise_errors()  # the cut found, the reset sent again
            r = await v.step([{"message": "z"}] * 3)
            r.raise_errors()
            return [o["metadata"]["step"] for o in r.observations], v.resumes
    with served(create_app(EchoEnvironment, max_concurrent_envs=8)) as (url, _):
        steps, resumes = asyncio.run(main(url))
    assert steps == [1, 2, 2] and resumes == 2  # env 0 is not replayed: it starts over
