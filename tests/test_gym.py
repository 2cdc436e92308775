"""Gymnasium environments served: space types, bad actions, seeded determinism, terminated/truncated, frames, and
`VectorEnv` against Gymnasium's own `SyncVectorEnv`."""
import base64
import json
import io
import re
from typing import Annotated

import numpy as np
import pytest
from pydantic import TypeAdapter, ValidationError

from conftest import need, start_server
from openenv_nb.server import create_app, serve_in_thread
from openenv_nb.types import EnvServerError
from openenv_nb.validate import validate
from openenv_nb.vector import VectorEnv

try:
    import gymnasium as gym
    from gymnasium import spaces
    from openenv_nb.envs.gym import (GymAction, GymEnv, GymEnvironment, GymState, gym_env, gym_types, in_space, jsonable,
                                     make_gym_target, space_type, to_native)
except ImportError as e:
    gym, MISSING = None, e


pytestmark = pytest.mark.gym


@pytest.fixture(autouse=True)
def _needs_gymnasium():
    need("gym", gym is not None, f"needs Gymnasium: pip install 'openenv-nb[gym]' ({'' if gym else MISSING})")


def taxi() -> str:
    "Taxi's newest registered version: gymnasium 1.3 replaced Taxi-v3 by Taxi-v4."
    return max(k for k in gym.registry if k.startswith("Taxi-v"))


SPACES = {
    "Discrete": lambda: spaces.Discrete(5, start=-2),
    "Box float": lambda: spaces.Box(np.array([-1, 0, -np.inf], np.float32), np.array([1, 5, np.inf], np.float32)),
    "Box int 2d": lambda: spaces.Box(0, 255, (3, 2), np.uint8),
    "Box bool": lambda: spaces.Box(0, 1, (2,), np.bool_),
    "MultiBinary": lambda: spaces.MultiBinary([2, 3]),
    "MultiDiscrete": lambda: spaces.MultiDiscrete([3, 4], start=[1, -1]),
    "Text": lambda: spaces.Text(6, min_length=2, charset="abc"),
    "Tuple": lambda: spaces.Tuple((spaces.Discrete(32), spaces.Discrete(11), spaces.Discrete(2))),
    "Dict": lambda: spaces.Dict({"pos": spaces.Box(-1, 1, (2,)), "key-held": spaces.MultiBinary(1), "n": spaces.Discrete(3)}),
    "Sequence": lambda: spaces.Sequence(spaces.Discrete(4)),
    "nested": lambda: spaces.Dict({"a": spaces.Tuple((spaces.Box(-2, 2, (2, 2)), spaces.Text(3)))}),
}
OUTSIDE = {  # a JSON value of the right shape that is not in the space, for each kind
    "Discrete": 3, "Box float": [0.0, 6.0, 1.0], "Box int 2d": [[0, 0], [0, 256], [0, 0]], "Box bool": [True, 2],
    "MultiBinary": [[0, 1], [1, 1, 2]], "MultiDiscrete": [0, 0], "Text": "abd", "Tuple": [31, 11, 0],
    "Dict": {"pos": [0.0, 0.0], "key-held": [1], "n": 3}, "Sequence": [0, 4], "nested": {"a": [[[0, 0], [0, 3]], "x"]},
}


@pytest.mark.parametrize("kind", list(SPACES))
def test_space_type_round_trips_samples_and_names_the_space(kind):
    space = SPACES[kind]()
    space.seed(0)
    ta = TypeAdapter(Annotated[space_type(space), in_space(space)])
    for _ in range(20):
        x = space.sample()
        wire = ta.validate_json(TypeAdapter(object).dump_json(jsonable(x)))  # through JSON text and back
        back = to_native(space, wire)
        assert space.contains(back), (kind, x, wire)
        assert np.array_equal(np.asarray(jsonable(back), dtype=object), np.asarray(jsonable(x), dtype=object)) if kind != "Dict" and kind != "nested" \
            else jsonable(back) == jsonable(x)
    with pytest.raises(ValidationError) as e: ta.validate_python(OUTSIDE[kind])
    assert f"is not in {space}" in str(e.value)  # `Input is not in Discrete(5): ...` for a Discrete, `VALUE is not in SPACE: ...` for the others


def test_schemas_carry_bounds_shape_and_types():
    schema = lambda s: TypeAdapter(space_type(s)).json_schema()
    assert schema(spaces.Discrete(4, start=1)) == {"type": "integer", "minimum": 1, "maximum": 4}
    box = schema(spaces.Box(-2.0, 2.0, (3, 2), np.float32))
    assert (box["minItems"], box["items"]["minItems"], box["items"]["items"]) == (3, 2, {"type": "number", "minimum": -2.0, "maximum": 2.0})
    assert schema(spaces.Box(0, 10, (2,), np.int32))["items"] == {"type": "integer", "minimum": 0, "maximum": 10}
    assert schema(spaces.MultiBinary(3))["items"] == {"type": "integer", "minimum": 0, "maximum": 1}
    assert schema(spaces.Text(4))["maxLength"] == 4
    assert [p["maximum"] for p in schema(SPACES["Tuple"]())["prefixItems"]] == [31, 10, 1]
    d = schema(SPACES["Dict"]())
    assert set(d["required"]) == {"pos", "key-held", "n"} and d["additionalProperties"] is False


@pytest.fixture(scope="module")
def served():
    "Base URLs of in-process servers for CartPole, FrozenLake, Blackjack and Taxi."
    ids = ["CartPole-v1", "FrozenLake-v1", "Blackjack-v1", taxi()]
    with serve_in_thread(create_app(gym_env(ids[0]), max_concurrent_envs=64)) as a, \
         serve_in_thread(create_app(gym_env(ids[1]), max_concurrent_envs=64)) as b, \
         serve_in_thread(create_app(gym_env(ids[2]), max_concurrent_envs=64)) as c, \
         serve_in_thread(create_app(gym_env(ids[3]), max_concurrent_envs=64)) as d:
        yield dict(zip(ids, [a, b, c, d]))


def play(url: str, env_id: str, seed: int, actions: list) -> list:
    "One served episode (on until done or out of actions): (obs, reward, terminated, truncated) per step, reset first."
    with GymEnv(url, env_id=env_id).sync() as env:
        r = env.reset(seed=seed)
        out = [(r.observation.obs, r.reward, r.observation.terminated, r.observation.truncated)]
        for a in actions:
            if r.done: break
            r = env.step(GymAction(action=a))
            out.append((r.observation.obs, r.reward, r.observation.terminated, r.observation.truncated))
    return out


def local(env_id: str, seed: int, actions: list) -> list:
    "The same episode with Gymnasium directly."
    env = gym.make(env_id)
    obs, _ = env.reset(seed=seed)
    out, done = [(jsonable(obs), 0.0, False, False)], False
    for a in actions:
        if done: break
        obs, r, te, tr, _ = env.step(a)
        out.append((jsonable(obs), float(r), te, tr))
        done = te or tr
    return out


@pytest.mark.parametrize("env_id", ["CartPole-v1", "FrozenLake-v1", "Blackjack-v1", "Taxi"])
def test_seeded_episodes_repeat_and_match_gymnasium(served, env_id):
    env_id = taxi() if env_id == "Taxi" else env_id
    space = gym.make(env_id).action_space
    space.seed(1)
    actions = [int(space.sample()) for _ in range(60)]
    first = play(served[env_id], env_id, 42, actions)
    assert first == play(served[env_id], env_id, 42, actions)  # a new session, the same seed and actions
    mine = [(np.float32(o).tolist() if env_id.startswith("CartPole") else o, *rest) for o, *rest in first]
    assert mine == [(np.float32(o).tolist() if env_id.startswith("CartPole") else o, *rest) for o, *rest in local(env_id, 42, actions)]
    assert len(first) > 1


def test_bad_actions_name_the_space_and_the_session_goes_on(served):
    import requests
    url = served["FrozenLake-v1"]
    r = requests.post(f"{url}/step", json={"action": {"action": 4}}, timeout=10)
    assert r.status_code == 422 and "is not in Discrete(4)" in r.json()["detail"][0]["msg"] and r.json()["detail"][0]["input"] == 4
    env = GymEnv(url).sync()  # untyped: the action goes out unchecked, and the server refuses it
    with env:
        env.reset(seed=0)
        for bad in (-1, 4, "up", [1], 1.5, None):
            with pytest.raises(EnvServerError) as e: env.step({"action": bad})
            assert e.value.code == "VALIDATION_ERROR" and "is not in Discrete(4)" in e.value.data["errors"][0]["msg"], bad
        assert env.step({"action": 2}).observation.obs in range(16)
        assert env.state().step_count == 1


def test_step_before_reset_is_an_error_for_that_session_only(served):
    with GymEnv(served["CartPole-v1"], env_id="CartPole-v1").sync() as env:
        with pytest.raises(EnvServerError) as e: env.step(GymAction(action=0))
        assert e.value.code == "EXECUTION_ERROR" and "reset" in e.value.message
        assert env.reset(seed=0).observation.terminated is False


def test_terminated_and_truncated_both_reach_the_client():
    with serve_in_thread(create_app(make_gym_target("CartPole-v1?max_episode_steps=5"), max_concurrent_envs=2)) as url:
        with GymEnv(url, env_id="CartPole-v1", make_kwargs={"max_episode_steps": 5}).sync() as env:
            env.reset(seed=0)
            rs = [env.step(GymAction(action=i % 2)) for i in range(5)]
    assert [(r.observation.terminated, r.observation.truncated, r.done) for r in rs] == [(False, False, False)] * 4 + [(False, True, True)]
    with serve_in_thread(create_app(gym_env("CartPole-v1"), max_concurrent_envs=2)) as url:
        with GymEnv(url, env_id="CartPole-v1").sync() as env:
            r = env.reset(seed=0)
            while not r.done: r = env.step(GymAction(action=1))  # always right: the pole falls
    assert (r.observation.terminated, r.observation.truncated) == (True, False)


def test_info_reaches_metadata_and_reset_options_reach_the_environment(served):
    with GymEnv(served[taxi()], env_id=taxi()).sync() as env:
        r = env.reset(seed=3)
        assert r.observation.metadata["action_mask"] == jsonable(gym.make(taxi()).reset(seed=3)[1]["action_mask"])
    with GymEnv(served["CartPole-v1"], env_id="CartPole-v1").sync() as env:
        obs = env.reset(seed=0, options={"low": -0.001, "high": 0.001}).observation.obs
        assert all(abs(x) <= 0.001 for x in obs)


def test_frames_are_png_data_urls():
    PIL = pytest.importorskip("PIL.Image", reason="decoding the frame needs Pillow (matplotlib's dependency, in the dev extra)")
    try: import pygame  # noqa: F401
    except ImportError: need("gym", False, "rendering classic control needs pygame: pip install 'gymnasium[classic-control]'")
    with serve_in_thread(create_app(gym_env("CartPole-v1", render_mode="rgb_array"), max_concurrent_envs=2)) as url:
        with GymEnv(url).sync() as env:
            a = env.reset(seed=0).observation.frame
            for _ in range(8): b = env.step({"action": 0}).observation.frame  # the cart moves a few pixels
    assert a.startswith("data:image/png;base64,") and a != b
    img = PIL.open(io.BytesIO(base64.b64decode(a.split(",", 1)[1])))
    assert (img.format, img.size, img.mode) == ("PNG", (600, 400), "RGB")


@pytest.mark.parametrize("env_id", ["CartPole-v1", "FrozenLake-v1", "Blackjack-v1"])
def test_vector_env_matches_gymnasium_sync_vector_env(env_id):
    n, steps = 8, 120
    space = gym.make(env_id).action_space
    plan = np.random.default_rng(5).integers(space.start, space.start + space.n, (steps, n))
    ref = gym.vector.SyncVectorEnv([lambda: gym.make(env_id) for _ in range(n)])
    obs, _ = ref.reset(seed=100)
    theirs = [(jsonable(obs), [0.0] * n, [False] * n, [False] * n)]
    for row in plan:
        obs, rew, te, tr, _ = ref.step(row)
        theirs.append((jsonable(obs), rew.tolist(), te.tolist(), tr.tolist()))
    act, ob = gym_types(env_id)
    with serve_in_thread(create_app(gym_env(env_id), max_concurrent_envs=n)) as url:
        with VectorEnv[act, ob, GymState](url, num_envs=n, auto_reset=True).sync() as venv:
            rs = [venv.reset(seed=100)] + [venv.step([act(action=int(a)) for a in row]) for row in plan]
    ours = []
    for r in rs:
        assert r.ok
        o = [x.obs for x in r.observations]
        o = np.float32(o).tolist() if env_id.startswith("CartPole") else [list(x) for x in zip(*o)] if isinstance(o[0], tuple) else o
        ours.append((o, r.rewards, [x.terminated for x in r.observations], [x.truncated for x in r.observations]))
    theirs = [(np.float32(t[0]).tolist() if env_id.startswith("CartPole") else [list(x) for x in t[0]] if isinstance(t[0], tuple) else t[0], *t[1:])
              for t in theirs]
    assert ours == theirs
    assert any(any(r.resets) for r in rs[1:])  # episodes ended and restarted along the way


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_unknown_and_deprecated_ids_fail_with_gymnasiums_reason():
    with pytest.raises(ValueError, match="gym has no environment 'Nope-v0'.*openenv list gym"): gym_env("Nope-v0")
    if "Taxi-v4" in gym.registry:
        with pytest.raises(gym.error.DeprecatedEnv, match="Taxi-v4"): make_gym_target("Taxi-v3")
    else: assert make_gym_target("Taxi-v3").env_id == "Taxi-v3"


def test_semantic_validation_holds_cartpole_to_its_declarations():
    "CartPole declares its rewards (0 or 1 a step) and its best return (the time limit): the floor gap is checked, not skipped."
    report = validate("gym:CartPole-v1", level="semantic")
    got = {c["id"]: c for c in report["criteria"]}
    assert report["passed"], [c for c in report["criteria"] if not c["passed"]]
    assert not got["floor_gap"].get("skipped") and "max_return 500" in got["floor_gap"]["details"], got["floor_gap"]
    assert "inside [0, 1]" in got["reward_range"]["details"], got["reward_range"]


def test_target_specs_are_read_by_the_shared_parser():
    Lake = make_gym_target('FrozenLake-v1?is_slippery=false&desc=["SF","HG"]')
    assert (Lake.env_id, Lake.make_kwargs) == ("FrozenLake-v1", {"is_slippery": False, "desc": ["SF", "HG"]})
    assert (Lake.reward_range, Lake.max_return) == ((0.0, 1.0), 1.0)
    for bad, why in [("?is_slippery=false", "must start with a name"), ("FrozenLake-v1?is_slippery", "not key=value")]:
        with pytest.raises(ValueError, match=re.escape(why)): make_gym_target(bad)


def test_from_local_serves_gym_targets_in_a_subprocess():
    with GymEnv.from_local("CartPole-v1").sync() as env:
        r = env.reset(seed=0)
        assert len(r.observation.obs) == 4 and env.step(GymAction(action=1)).observation.terminated is False
    p = start_server("gym:FrozenLake-v1?is_slippery=false", max_sessions=4)
    try:
        with GymEnv(p.base_url, env_id="FrozenLake-v1", make_kwargs={"is_slippery": False}).sync() as env:
            env.reset(seed=0)
            assert [env.step(GymAction(action=a)).observation.obs for a in (2, 2, 1)] == [1, 2, 6]
    finally: p.stop()


def columns_of(cls, env_id: str, n: int = 6, steps: int = 40) -> list[str]:
    "The raw `batch.results` frames of one served run of `cls`: seeded resets, steps with auto-reset, a bad action and an unknown id."
    from websockets.sync.client import connect
    space = gym.make(env_id).action_space
    plan = np.random.default_rng(3).integers(space.start, space.start + space.n, (steps, n)).tolist()
    out, resets = [], []
    with serve_in_thread(create_app(cls, max_concurrent_envs=n)) as url, \
         connect(url.replace("http", "ws") + "/ws", additional_headers={"x-openenv-extensions": "batch"}) as ws:
        ask = lambda frame: (ws.send(json.dumps(frame)), ws.recv())[1]
        ids = json.loads(ask({"type": "batch.open", "data": {"count": n}}))["data"]["envs"]
        out.append(ask({"type": "batch.reset", "data": {"envs": ids, "seeds": list(range(7, 7 + n))}}))
        for k, row in enumerate(plan):
            actions = [{"action": a} for a in row]
            if k == 5: actions[2] = {"action": int(space.start + space.n)}  # outside the space: that entry fails alone
            envs = ids + [99] if k == 9 else ids  # an id the connection does not hold
            out.append(ask({"type": "batch.step", "data": {"envs": envs, "actions": actions + [{"action": 0}] * (len(envs) - n), "resets": resets}}))
            resets = [i for i, d in zip(ids, json.loads(out[-1])["data"]["dones"]) if d]
    return out


@pytest.mark.parametrize("env_id", ["CartPole-v1", "FrozenLake-v1", "Blackjack-v1", "Taxi"])
@pytest.mark.parametrize("inline", [True, False])
def test_batch_hooks_on_and_off_give_the_same_frames(env_id, inline):
    env_id = taxi() if env_id == "Taxi" else env_id
    hooked = gym_env(env_id, inline=inline)
    plain = type("OneByOne", (hooked,), dict.fromkeys(["step_batch", "step_batch_async", "reset_batch", "reset_batch_async"]))  # no hooks: one by one
    from openenv_nb.environment import batch_hook
    assert all(batch_hook(hooked, k) is not None and batch_hook(plain, k) is None for k in ("step", "reset"))
    a, b = columns_of(hooked, env_id), columns_of(plain, env_id)
    assert a == b  # byte for byte
    frames = [json.loads(f)["data"] for f in a]
    assert any(any(f["dones"]) for f in frames) or env_id.startswith("Taxi")  # episodes end (Taxi's run past 40 steps)
    assert frames[6]["errors"][2]["code"] == "VALIDATION_ERROR"
    assert frames[10]["errors"][-1]["code"] == "VALIDATION_ERROR" and all(e is None for e in frames[10]["errors"][:-1])


FORKED = ["CartPole-v1", "FrozenLake-v1", "MountainCar-v0", "Acrobot-v1", "Pendulum-v1", "Blackjack-v1",
          "CliffWalking", "Taxi"]


def newest(name: str) -> str:
    "The newest registered version of `name` (a full id is kept)."
    return name if "-v" in name else max((k for k in gym.registry if k.startswith(name + "-v")),
                                         key=lambda k: int(k.rpartition("-v")[2]))


def trace(env, actions):
    "Each step's observation envelope and one draw of the environment's generator after the steps."
    out = []
    for a in actions:
        r = env.step(a)
        out.append((r.obs, r.reward, r.terminated, r.truncated))
        if r.done: break
    return out, env.env.unwrapped.np_random.random()


@pytest.mark.parametrize("name", FORKED)
def test_native_forks_go_on_as_the_original(name):
    "A snapshot by fields (no deep copy), restored into a fresh and into a used environment, twice: the same trace."
    cls = gym_env(newest(name))
    a, used = cls(), cls()
    space = a.env.action_space
    space.seed(1)
    acts = [cls.action_type(action=jsonable(space.sample())) for _ in range(40)]
    k = 1 if name.startswith("Blackjack") else 3  # a hand of Blackjack is short
    for seed in range(20):  # the first seed whose episode outlives the prefix
        a.reset(seed=seed)
        if not any([a.step(x).done for x in acts[:k]]): break
    used.reset(seed=99); used.step(acts[5])
    snap = a.snapshot_state()
    assert "fields" in snap and snap["steps"] == k
    forks = [cls(), used, cls()]
    for i, b in enumerate(forks): b.restore_state(snap, f"fork{i}")
    want = trace(a, acts[k:])
    assert want[0]
    for b in forks: assert trace(b, acts[k:]) == want
    assert a.snapshot_state()["steps"] > k and snap["steps"] == k  # the snapshot is left as it was


def test_a_layer_holding_something_else_is_deep_copied():
    "An environment with an attribute no field copy takes (a `random.Random`) is copied whole, and still exact."
    import random
    cls = gym_env("CartPole-v1")
    a, b = cls(), cls()
    a.reset(seed=4)
    a.env.unwrapped.coin = random.Random(3)
    snap = a.snapshot_state()
    assert "env" in snap
    b.restore_state(snap, "deep")
    acts = [cls.action_type(action=i % 2) for i in range(8)]
    assert trace(b, acts) == trace(a, acts) and b.env.unwrapped.coin.random() == a.env.unwrapped.coin.random()
