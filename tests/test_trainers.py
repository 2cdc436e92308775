"""The trainer adapters against real servers: SkyRL-Gym's own registry and `BaseTextEnv` contract (`init`, then `step`
until `done`) over echo, CartPole and chess; verl's `BaseTool` and OpenRLHF's `AgentInstance` contracts, as their
released packages define them (neither installs on a CPU machine without their CUDA stack; see nbs/17b_trainers)."""
import asyncio
import json

import pytest
from conftest import need

from openenv_nb.envs.echo import EchoEnvironment
from openenv_nb.server import create_app, serve_in_thread
from openenv_nb.trainers import (
    VerlTool,
    openrlhf_agent,
    play_openrlhf,
    skyrl_env,
    verl_tools_config,
)


def call(name: str, **arguments) -> str:
    "A model's turn that calls tool `name`."
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@pytest.fixture(scope="module")
def skyrl():
    "SkyRL-Gym (the skyrl extra)."
    try: import skyrl_gym
    except ImportError: skyrl_gym = None
    need("skyrl", skyrl_gym is not None, "needs the skyrl extra: pip install 'openenv-nb[skyrl]'")
    return skyrl_gym


def episode(skyrl, env_id: str, turns, extras=None, max_turns=50) -> tuple[list, list[dict]]:
    "SkyRL's episode loop: `make`, `init`, `step` with each turn until `done`; the conversation and the outputs."
    env = skyrl.make(env_id, env_config={"max_turns": max_turns}, extras=extras or {})
    assert isinstance(env, skyrl.envs.base_text_env.BaseTextEnv)
    try:
        chat, _ = env.init([{"role": "user", "content": "Play."}])
        outs = []
        for turn in turns:
            out = env.step(turn)
            assert set(out) >= {"observations", "reward", "done", "metadata"}
            chat += [{"role": "assistant", "content": turn}, *out["observations"]]
            outs.append(out)
            if out["done"]: break
    finally: env.close()
    return chat, outs


def test_skyrl_plays_echo(skyrl):
    "A task picked by the row's extras, tool calls answered as user messages, the reward of each step."
    with serve_in_thread(create_app(EchoEnvironment, max_concurrent_envs=4)) as url:
        skyrl.register(id="openenv-test-echo", entry_point=skyrl_env(url))
        chat, outs = episode(skyrl, "openenv-test-echo", [call("echo_with_length", message="hi"), "no call"],
                             extras={"split": "test", "index": 0}, max_turns=2)
    assert '"echoed_message": "goodbye"' in chat[0]["content"]
    assert chat[2] == {"role": "user", "content": '{"message": "hi", "length": 2}'}
    assert [o["done"] for o in outs] == [False, True] and outs[0]["metadata"] == {"tool_calls": 1}


def test_skyrl_plays_cartpole_to_the_end(skyrl):
    "Pushing right every turn: CartPole falls, the episode ends by itself, and each surviving step paid 1."
    need("gym", __import__("importlib").util.find_spec("gymnasium") is not None, "needs the gym extra")
    from openenv_nb.envs.gym import make_gym_target
    with serve_in_thread(create_app(make_gym_target("CartPole-v1"), max_concurrent_envs=4)) as url:
        skyrl.register(id="openenv-test-cartpole", entry_point=skyrl_env(url))
        _, outs = episode(skyrl, "openenv-test-cartpole", [call("cart_pole_v1", action=1)] * 50,
                             extras={"seed": 0})
    assert outs[-1]["done"] and outs[-1]["observations"] == [] and 5 < len(outs) < 50
    assert sum(o["reward"] for o in outs) == len(outs)


def test_skyrl_plays_chess_in_plain_text(skyrl):
    "Moves as plain text (`plain=\"move\"`): the fool's mate ends the game; an illegal move is answered with the reason."
    need("chess", __import__("importlib").util.find_spec("chess") is not None, "needs the chess extra")
    from openenv_nb.envs.chess import chess_env
    with serve_in_thread(create_app(chess_env(opponent="none", svg=False), max_concurrent_envs=4)) as url:
        skyrl.register(id="openenv-test-chess", entry_point=skyrl_env(url, plain="move"))
        _, outs = episode(skyrl, "openenv-test-chess", ["f3", "e5", "Ke3", "g4", "Qh4#"])
    assert "move in this position" in outs[2]["observations"][0]["content"]  # Ke3 is not legal
    assert [o["done"] for o in outs] == [False, False, False, False, True]
    assert outs[-1]["metadata"]["tool_calls"] == 1


def test_verl_tools_keep_one_session_per_trajectory():
    "verl's per-trajectory contract: create, execute (several tools, one session), calc_reward, release."
    with serve_in_thread(create_app(EchoEnvironment, max_concurrent_envs=4)) as url:
        tools = [VerlTool(t["config"]) for t in verl_tools_config(url)["tools"]]
        async def trajectory():
            iid, first = await tools[0].create(create_kwargs={"split": "train", "index": 1})
            await tools[1].create(iid)
            said = [await tools[0].execute(iid, {"message": "a"}), await tools[1].execute(iid, {"message": "bc"})]
            bad = await tools[0].execute(iid, {"nope": 1})
            steps = VerlTool._episodes[iid].env.client.state()["step_count"]
            reward = await tools[1].calc_reward(iid)
            await tools[1].release(iid)
            return first.text, [s[0].text for s in said], bad[0].text, steps, reward, iid in VerlTool._episodes
        first, said, bad, steps, reward, kept = asyncio.run(trajectory())
    assert '"openenv"' in first and said == ["a", '{"message": "bc", "length": 2}'] and steps == 2
    assert bad.startswith("Error:") and reward == 0.0 and not kept


def test_openrlhf_agent_plays_as_its_executor_does():
    "OpenRLHF's loop: reset with the label, a step a turn, `.item()` of the rewards, the feedback appended."
    with serve_in_thread(create_app(EchoEnvironment, max_concurrent_envs=4)) as url:
        Agent = openrlhf_agent(url, max_turns=3)
        got = asyncio.run(play_openrlhf(Agent, "Go.", {"split": "test", "index": 1},
                                        [call("echo_message", message="x"), call("echo_message", message="y"), "z"]))
    assert got["text"].startswith('Go.{"echoed_message": "one last message"')
    assert got["text"].count("<|im_start|>user\n") == 2 and got["text"].endswith("z")
