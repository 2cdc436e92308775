"""reasoning-gym served: `openenv serve reasoning_gym:leg_counting` scores answers with the package's own
`score_answer` (the dataset's answer earns 1), and every dataset the package registers plays one episode over a
WebSocket, in-process, with the question that reasoning-gym itself makes for the seed."""
import pytest

from conftest import need, start_server
from openenv_nb.client import GenericEnvClient

try:
    import reasoning_gym
    from openenv_nb.envs.reasoning_gym import draw, make_dataset, make_reasoning_gym_target, reasoning_gym_names
    NAMES = reasoning_gym_names()
except ImportError as e:
    reasoning_gym, MISSING, NAMES = None, e, ["leg_counting"]

pytestmark = pytest.mark.reasoning_gym
COMPOSITE = '?datasets=[{"name":"leg_counting"},{"name":"chain_sum","weight":2}]'


@pytest.fixture(autouse=True)
def _needs_reasoning_gym():
    need("reasoning_gym", reasoning_gym is not None,
         f"needs reasoning-gym: pip install 'openenv-nb[reasoning]' ({'' if reasoning_gym else MISSING})")


def test_openenv_serve_scores_with_the_package():
    p = start_server("reasoning_gym:leg_counting", max_sessions=2)
    try:
        with GenericEnvClient(p.base_url).sync() as env:
            for seed in (0, 1, 2):
                entry = reasoning_gym.create_dataset("leg_counting", seed=seed, size=1100)[0]
                r = env.reset(seed=seed)
                assert r.observation["question"] == entry["question"] and r.reward == 0.0 and not r.done
                r = env.step({"answer": entry["answer"]})
                assert (r.reward, r.done, r.observation["score"], r.observation["correct_answer"]) == \
                       (1.0, True, 1.0, entry["answer"])
            env.reset(seed=0)
            wrong = str(int(entry["answer"]) + 1) + " legs"
            r = env.step({"answer": wrong})
            ds = reasoning_gym.create_dataset("leg_counting", seed=0, size=1100)
            assert r.reward == ds.score_answer(wrong, ds[0]) == 0.0
            tools = env.step({"type": "list_tools"})
            assert [t["name"] for t in tools.observation["tools"]] == ["answer"]
    finally: p.stop()


@pytest.mark.parametrize("name", NAMES)
def test_every_dataset_plays_an_episode(name):
    from fastapi.testclient import TestClient
    from openenv_nb.server import create_app
    spec = name + (COMPOSITE if name == "composite" else "")
    cls = make_reasoning_gym_target(spec)
    ds = make_dataset(cls.dataset, cls.config, 0, cls.size + cls.test_size)
    entry = draw(ds, 0)  # ds[0], with Python's global generator seeded: list_functions draws from it
    with TestClient(create_app(cls, max_concurrent_envs=2)) as c, c.websocket_connect("/ws") as ws:
        ws.send_json({"type": "reset", "data": {"seed": 0}})
        reset = ws.receive_json()["data"]
        assert reset["observation"]["question"] == entry["question"], reset
        answer = entry["answer"] if entry["answer"] is not None else "no idea"
        ws.send_json({"type": "step", "data": {"answer": answer}})
        step = ws.receive_json()["data"]
    assert step["done"] is True and step["reward"] == ds.score_answer(answer, entry), step
    if entry["answer"] is not None: assert step["reward"] == 1.0, (name, step)  # the dataset's own answer earns 1
