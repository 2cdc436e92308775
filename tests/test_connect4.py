"""Connect Four served as upstream OpenEnv's `connect4_env`: the rules over the wire, and upstream's client shapes run
from the upstream venv against `openenv serve connect4`.

Upstream's `Connect4Env` client lives in OpenEnv's repository, not in the `openenv` wheel. So the `upstream` test runs,
in the venv of `upstream_venv.py`, a client written as upstream's (openenv's `EnvClient`, upstream's models, every reply
read strictly) through the loop of upstream's `examples/connect4.py`; and, when `$OPENENV_TEXTARENA_SRC` names the
`envs` folder of an OpenEnv checkout, upstream's own `Connect4Env` too.
"""
import json
import os
import subprocess

import pytest
from conftest import start_server
from fastapi.testclient import TestClient

from openenv_nb.envs.connect4 import Connect4Action, Connect4Env, Connect4Environment
from openenv_nb.server import create_app

NO_PROXY = {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}


@pytest.fixture(scope="module")
def url():
    p = start_server("connect4", max_sessions=4)
    yield p.base_url
    p.stop()


def test_a_game_to_its_end_over_websocket(url):
    with Connect4Env(url).sync() as env:
        r = env.reset()
        assert (r.reward, r.done, r.observation.legal_actions, r.observation.metadata) == (0.0, False, list(range(7)), {"next_player": 1})
        for col in (0, 1, 0, 1, 0, 1): r = env.step(Connect4Action(column=col))
        r = env.step(Connect4Action(column=0))
        assert (r.reward, r.done) == (1.0, True) and [row[0] for row in r.observation.board] == [0, 0, 1, 1, 1, 1]
        st = env.state()
        assert (st.step_count, st.next_player, st.board) == (7, -1, r.observation.board)


def test_refused_columns_end_the_game_with_minus_one(url):
    with Connect4Env(url).sync() as env:
        env.reset()
        r = env.step(Connect4Action(column=9))
        assert (r.reward, r.done, env.state().next_player) == (-1.0, True, -1)
        env.reset()
        for _ in range(6): env.step(Connect4Action(column=2))
        r = env.step(Connect4Action(column=2))
        assert (r.reward, r.done) == (-1.0, True) and sum(abs(v) for row in r.observation.board for v in row) == 6


def test_bad_input_is_a_422_and_a_step_first_plays():
    with TestClient(create_app(Connect4Environment, max_concurrent_envs=2)) as c:
        assert c.post("/step", json={"action": {"column": "left"}}).status_code == 422
        assert c.post("/step", json={"action": {}}).status_code == 422
        body = c.post("/step", json={"action": {"column": 3}}).json()  # a fresh environment, reset when made, as upstream's
        assert body["observation"]["board"][5][3] == 1 and body["reward"] == 0.0
    assert Connect4Environment().step(Connect4Action(column=3)).board[5][3] == 1


UPSTREAM_CONNECT4 = r'''
import json, sys
from typing import Any, Dict, List
import numpy as np
from pydantic import Field
from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server.types import Action, Observation, State

plan = json.load(sys.stdin)
if plan.get("src"):  # upstream's own client, from its repository
    sys.path.insert(0, plan["src"])
    from connect4_env import Connect4Action, Connect4Env
else:  # the fields of upstream's models, on openenv's own base classes; replies read strictly
    class Connect4Action(Action):
        column: int
    class Seen(Observation):
        board: List[List[int]] = Field(default_factory=list)
        legal_actions: List[int] = Field(default_factory=list)
    class Game(State):
        board: List[List[int]] = Field(default_factory=lambda: [[0] * 7 for _ in range(6)])
        next_player: int = 1
    class Connect4Env(EnvClient):
        def _step_payload(self, action): return {"column": action.column}
        def _parse_result(self, payload):
            obs = Seen.model_validate({**payload["observation"], "reward": payload.get("reward"), "done": payload.get("done", False)}, strict=True)
            return StepResult(observation=obs, reward=payload.get("reward", 0.0), done=payload.get("done", False))
        def _parse_state(self, payload): return Game.model_validate(payload, strict=True)

# the loop of upstream's examples/connect4.py, without its picture
np.random.seed(plan["seed"])
env = Connect4Env(base_url=plan["url"]).sync()
with env:
    result = env.reset()
    boards = [np.array(result.observation.board).reshape(6, 7).tolist()]
    for step in range(100):
        if result.done: break
        action_id = int(np.random.choice(result.observation.legal_actions))
        result = env.step(Connect4Action(column=action_id))
        boards.append(np.array(result.observation.board).reshape(6, 7).tolist())
    state = env.state()
print(json.dumps({"boards": boards, "reward": result.reward, "done": result.done, "step_count": state.step_count,
                  "next_player": state.next_player, "metadata": result.observation.metadata}))
'''


def run_upstream(python, plan):
    r = subprocess.run([python, "-c", UPSTREAM_CONNECT4], input=json.dumps(plan), capture_output=True, text=True,
                       timeout=180, env={**os.environ, **NO_PROXY})
    assert r.returncode == 0, f"the upstream client failed:\n{r.stderr[-4000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def check_game(out):
    assert out["done"] and out["reward"] in (0.0, 1.0) and out["step_count"] == len(out["boards"]) - 1
    assert out["metadata"] == {"next_player": out["next_player"]}
    pieces = [sum(v != 0 for row in b for v in row) for b in out["boards"]]
    assert pieces == list(range(len(pieces)))  # one piece a move, none refused: the moves were legal


@pytest.mark.upstream
def test_upstreams_example_loop_runs_against_our_server(url, upstream_py):
    check_game(run_upstream(upstream_py, {"url": url, "seed": 0}))


@pytest.mark.upstream
def test_upstreams_own_client(url, upstream_py):
    src = os.environ.get("OPENENV_TEXTARENA_SRC")
    if not src: pytest.skip("upstream's connect4_env client is not in the openenv wheel: set $OPENENV_TEXTARENA_SRC to the "
                            "`envs` folder of an OpenEnv checkout to run it")
    check_game(run_upstream(upstream_py, {"url": url, "seed": 1, "src": src}))
