"""TextArena games served: Wordle played to the end over the wire (won, lost, refused moves), other games that run
offline, seeds that hold while sessions interleave, bad input, the NLTK data that is never downloaded, `VectorEnv`,
and upstream OpenEnv's clients run from a separate venv against our server.

Upstream's `openenv` 0.10.0 wheel does not ship the `textarena_env` client (it lives in OpenEnv's repository, which
TRL's Wordle example puts on `sys.path`). So the `upstream` tests run, in the venv of `upstream_venv.py`: openenv's
`GenericEnvClient` with dict actions, and a typed client written on openenv's `EnvClient` with upstream's field
names, both reading every reply strictly into upstream's models; and, when `$OPENENV_TEXTARENA_SRC` names a folder
holding upstream's `textarena_env` package (`<OpenEnv checkout>/envs`), upstream's own `TextArenaEnv` client and
reward helpers, in the loop TRL's Wordle example runs.
"""
import json
import os
import re
import socket
import subprocess
import sys

import pytest
import requests
from conftest import HERE, need
from websockets.sync.client import connect

from openenv_nb.providers import LocalProcessProvider
from openenv_nb.server import create_app, serve_in_thread
from openenv_nb.types import EnvServerError
from openenv_nb.vector import VectorEnv

try:
    import nltk
    import textarena

    from openenv_nb.envs.textarena import (
        MissingDataError,
        TextArenaAction,
        TextArenaEnv,
        TextArenaEnvironment,
        TextArenaObservation,
        TextArenaState,
        make_game,
        make_textarena_target,
        nltk_missing,
        textarena_env,
    )
except ImportError as e:
    textarena, MISSING = None, e

WORDS = ["crane", "slate", "pious", "lemon", "robin", "grape", "flint", "mirth"]
NO_PROXY = {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}


@pytest.fixture(autouse=True)
def _needs_textarena():
    need("textarena", textarena is not None, f"needs TextArena: pip install 'openenv-nb[textarena]' ({'' if textarena else MISSING})")


@pytest.fixture(scope="module")
def wordle_url():
    "A server of Wordle over `WORDS`, shaped as upstream's (the default), in this process, room for 8 sessions."
    with serve_in_thread(create_app(textarena_env("Wordle-v0", words=WORDS), max_concurrent_envs=8)) as url: yield url


@pytest.fixture(scope="module")
def typed_url():
    "The same, with TextArena's typed messages (`messages=typed`)."
    with serve_in_thread(create_app(textarena_env("Wordle-v0", words=WORDS, messages="typed"), max_concurrent_envs=8)) as url:
        yield url


@pytest.fixture(scope="module")
def guess_url():
    "GuessTheNumber-v0, shaped as upstream's."
    with serve_in_thread(create_app(textarena_env("GuessTheNumber-v0"), max_concurrent_envs=4)) as url: yield url


def secret_of(client) -> str:
    return client.state().raw_state["game_state"]["secret_word"]


# --------------------------------------------------------------------------------------------------------------------
# Wordle over the wire

def test_wordle_won_over_websocket(typed_url):
    with TextArenaEnv(typed_url).sync() as env:
        r = env.reset(seed=11)
        assert r.observation.prompt.startswith("You are Playing Wordle.") and (r.reward, r.done) == (0.0, False)
        secret = secret_of(env)
        other = next(w for w in WORDS if w != secret)
        r = env.step(TextArenaAction(message=f"I guess [{other}]"))
        assert not r.done and r.reward == 0.0 and "Feedback:" in r.observation.messages[-1].content
        signals = r.observation.info["reward_signals"]
        assert set(signals) == {"wordle.greens", "wordle.yellows", "wordle.repetitions", "wordle.correct"}
        assert 0 <= signals["wordle.greens"] < 1 and signals["wordle.repetitions"] == 1.0
        r = env.step(TextArenaAction(message=secret))
        assert (r.done, r.reward, r.observation.info["reason"]) == (True, 1.0, "Congratulations! You guessed the word correctly!")
        assert [m.category for m in r.observation.messages] == ["PROMPT", "PLAYER_ACTION", "GAME_MESSAGE", "PLAYER_ACTION"]
        st = env.state()
        assert isinstance(st, TextArenaState)
        assert (st.env_id, st.step_count, st.turn, st.last_reward, st.raw_state["done"]) == ("Wordle-v0", 2, 2, 1.0, True)


def test_wordle_lost_over_websocket(typed_url):
    with TextArenaEnv(typed_url).sync() as env:
        env.reset(seed=2)
        secret = secret_of(env)
        for w in [w for w in WORDS if w != secret][:6]: r = env.step(TextArenaAction(message=f"[{w}]"))
        assert r.done and 0 <= r.reward < 1 and r.observation.info["rewards"] == {"0": r.reward}
        assert f"The secret word was: **{secret}**" in r.observation.info["reason"]
        assert sum(m.category == "GAME_MESSAGE" for m in r.observation.messages) == 6


def test_stateless_http_routes(typed_url):
    "Each HTTP call plays on a fresh environment, as upstream's: a step there is the first move of a new game."
    wordle_url = typed_url
    with requests.Session() as http:
        http.trust_env = False
        r = http.post(f"{wordle_url}/reset", json={"seed": 2}).json()
        assert (r["observation"]["messages"][0]["category"], r["reward"], r["done"]) == ("PROMPT", 0.0, False)
        r = http.post(f"{wordle_url}/step", json={"action": {"message": "[crane]"}}).json()
        assert [m["category"] for m in r["observation"]["messages"]][:2] == ["PROMPT", "PLAYER_ACTION"]
        assert http.post(f"{wordle_url}/step", json={"action": {"message": ["crane"]}}).status_code == 422
        assert http.get(f"{wordle_url}/state").json() == {"episode_id": None, "step_count": 0}  # 0.10: the base State without state_cls


def test_refused_moves_and_bad_input_keep_the_session(typed_url):
    with connect(typed_url.replace("http", "ws") + "/ws") as ws:
        def send(kind, data=None):
            ws.send(json.dumps({"type": kind, "data": data or {}}))
            return json.loads(ws.recv())["data"]
        send("reset", {"seed": 4})
        for bad in ({"message": 5}, {"guess": "crane"}, {"message": "[crane]", "extra": 1}, {}):
            assert send("step", bad)["code"] == "VALIDATION_ERROR"
        r = send("step", {"message": "[xyzzy]"})  # the game refuses it, with a reason, and the turn is played again
        assert (r["done"], r["observation"]["messages"][-1]["category"]) == (False, "GAME_ADMIN")
        assert "'xyzzy' is not an English word" in r["observation"]["messages"][-1]["content"]
        r = send("step", {"message": "[no]"})  # a second refused move in a row ends the game, as TextArena rules
        assert r["done"] is True and r["observation"]["info"]["reason"].startswith("Invalid Move")
        err = send("step", {"message": "[crane]"})
        assert err["code"] == "EXECUTION_ERROR" and "is over: reset to play again" in err["message"]
        assert send("reset", {"seed": 4})["done"] is False  # the session goes on


def test_step_before_reset_plays_as_upstream():
    "Upstream's environment is reset when made, so a first step needs no reset; ours resets on that step."
    env = TextArenaEnvironment("Wordle-v0", words=WORDS, messages="typed")
    obs = env.step(TextArenaAction(message="[crane]"))
    assert [m.category for m in obs.messages][:2] == ["PROMPT", "PLAYER_ACTION"] and env.state.step_count == 1


def test_max_turns_cuts_the_episode():
    env = textarena_env("Wordle-v0", words=WORDS, max_turns=2)()
    env.reset(seed=0)
    secret = env.state.raw_state["game_state"]["secret_word"]
    wrong = [w for w in WORDS if w != secret]
    assert not env.step(TextArenaAction(message=wrong[0])).done
    obs = env.step(TextArenaAction(message=wrong[1]))
    assert obs.done and obs.info["truncated"] is True and env.state.max_turns == 2


def test_history_off_gives_only_new_messages():
    env = TextArenaEnvironment("Wordle-v0", words=WORDS, history=False, messages="typed")
    assert [m.category for m in env.reset(seed=0).messages] == ["PROMPT"]
    obs = env.step(TextArenaAction(message="[xyzzy]"))
    assert [m.category for m in obs.messages] == ["PLAYER_ACTION", "GAME_ADMIN"] and obs.prompt.startswith("You are Playing Wordle.")


# --------------------------------------------------------------------------------------------------------------------
# Shaped as upstream's server (the default)

def test_guess_the_number_after_one_move_is_upstreams(guess_url):
    "Upstream's server, after `[10]`: one message, the transcript, whose new text is the move and the game's answer."
    with TextArenaEnv(guess_url).sync() as env:
        r = env.reset(seed=1)  # the target is 5
        (first,) = r.observation.messages
        assert (first.sender_id, first.category) == (-1, "MESSAGE") and first.content.startswith("\n[GAME] You are Player 0.")
        assert r.observation.prompt == first.content.strip() and r.observation.metadata["turn"] == 0
        r = env.step(TextArenaAction(message="[10]"))
        assert len(r.observation.messages) == 1
        assert r.observation.messages[0].content[len(first.content):] == "\n[Player] [10]\n[GAME] The target number is lower."
        assert r.observation.prompt == "GuessTheNumber-v0"
        assert r.observation.metadata["raw_messages"] == [m.model_dump() for m in r.observation.messages]
        assert (r.observation.metadata["env_id"], r.observation.metadata["turn"]) == ("GuessTheNumber-v0", 1)


def test_tutorial_wordle_env_gets_feedback(wordle_url):
    "The Wordle GRPO tutorial's `WordleEnv` slices the new text off `messages[0].content`: each guess has its feedback."
    with TextArenaEnv(wordle_url).sync() as client:
        last = client.reset(seed=3).observation.messages[0].content
        secret = secret_of(client)
        out = []
        for guess in [next(w for w in WORDS if w != secret), "xyzzy", secret]:
            r = client.step(TextArenaAction(message=f"[{guess}]"))
            full = r.observation.messages[0].content
            out.append(full[len(last):])
            last = full
    assert out[0].startswith("\n[GAME] [") and "Feedback:" in out[0] and "guesses left" in out[0]
    assert "You attempted an invalid move" in out[1] and "'xyzzy' is not an English word" in out[1]
    assert out[2].strip() and r.done and r.reward == 1.0


@pytest.mark.parametrize("env_id,players,move", [("Sudoku-v0-easy", 1, "[1 1 1]"), ("TicTacToe-v0", 2, "[4]"),
                                                 ("Mastermind-v0", 1, "[1 2 3 4]"), ("Wordle-v0", 1, "[crane]")])
def test_upstream_shape_over_games(env_id, players, move):
    "Whatever the game: one message from the game, its content the transcript; prompt and metadata as upstream's."
    env = TextArenaEnvironment(env_id, num_players=players)
    obs = env.reset(seed=5)
    assert [(m.sender_id, m.category) for m in obs.messages] == [(-1, "MESSAGE")] and obs.prompt == obs.messages[0].content.strip()
    before = obs.messages[0].content
    obs = env.step(TextArenaAction(message=move))
    assert len(obs.messages) == 1 and obs.metadata["raw_messages"] == [obs.messages[0].model_dump()]
    if players == 1: assert obs.messages[0].content.startswith(before) and len(obs.messages[0].content) > len(before)
    assert obs.prompt == (env_id if env.state.turn else obs.messages[0].content.strip())
    env.reset(seed=5)  # the transcript starts again
    assert env.reset(seed=5).messages[0].content == before


def test_seeds_give_the_same_secret():
    "huggingface/OpenEnv#1102: `reset(seed=1234)` draws the same secret every time; other seeds, others."
    env = TextArenaEnvironment("Wordle-v0")  # TextArena's own words, shipped
    words = {(env.reset(seed=1234), env.answer())[1] for _ in range(4)}
    assert words == {"slope"}  # what TextArena with NLTK's data draws for 1234
    assert len({(env.reset(seed=s), env.answer())[1] for s in range(10)}) > 5
    g = TextArenaEnvironment("GuessTheNumber-v0")
    targets = [(g.reset(seed=s), g.state.raw_state["game_state"]["game_number"])[1] for s in (7, 7, 8, 9, 7)]
    assert targets[0] == targets[1] == targets[4] and len(set(targets)) > 1


def test_messages_option_is_checked():
    with pytest.raises(ValueError, match="give 'upstream'"): textarena_env("Sudoku-v0", messages="tuples")
    assert make_textarena_target("Wordle-v0?messages=typed")().reset(seed=0).messages[0].category == "PROMPT"


def test_forked_wordle_goes_on_as_the_original(wordle_url):
    "A fork of a live Wordle, taken natively, plays to the same end as the original and as a replay from the seed."
    import openenv_nb.forks  # noqa: F401  (adds snapshot, restore and fork to the clients)
    guesses = [f"[{w}]" for w in WORDS]
    with TextArenaEnv(wordle_url).sync() as env:
        env.reset(seed=11)
        secret = secret_of(env)
        plays = [g for g in guesses if g != f"[{secret}]"][:2] + [f"[{secret}]"]
        env.step(TextArenaAction(message=plays[0]))
        snap = env.snapshot()
        kids = env.fork(2)
        assert snap.native and [k.state().step_count for k in kids] == [1, 1]
        assert all(secret_of(k) == secret for k in kids)
        trace = lambda c: [(r.observation.messages, r.reward, r.done) for r in
                           (c.step(TextArenaAction(message=g)) for g in plays[1:])]
        got, mine = [trace(k) for k in kids], trace(env)
        env.restore(snap)  # the snapshot outlives its game's end, and goes on again
        again = trace(env)
        for k in kids: k.close()
    with TextArenaEnv(wordle_url).sync() as fresh:
        fresh.reset(seed=11)
        fresh.step(TextArenaAction(message=plays[0]))
        want = trace(fresh)
    assert want[-1][1:] == (1.0, True) and got == [want, want] and mine == want and again == want


# --------------------------------------------------------------------------------------------------------------------
# Other games, seeds

OFFLINE = [  # (id, players, a move): games that need nothing beyond the package
    ("Sudoku-v0-easy", 1, "[1 1 1]"), ("Sudoku-v0", 1, "[5 5 5]"), ("GuessTheNumber-v0", 1, "[10]"),
    ("Mastermind-v0", 1, "[1 2 3 4]"), ("Minesweeper-v0-small", 1, "[3 3]"), ("2048-v0", 1, "[up]"),
    ("TowerOfHanoi-v0", 1, "[A C]"), ("FrozenLake-v0", 1, "[right]"), ("LightsOut-v0", 1, "[2 2]"),
    ("Wordle-v0-long", 1, "[example]"), ("TicTacToe-v0", 2, "[4]"), ("ConnectFour-v0", 2, "[col 3]"),
    ("KuhnPoker-v0", 2, "[check]"),
]


@pytest.mark.parametrize("env_id,players,move", OFFLINE, ids=[g[0] for g in OFFLINE])
def test_offline_games_play_and_repeat_with_a_seed(env_id, players, move):
    kw = {"words": ["example", "imagine", "kitchen"]} if env_id.startswith("Wordle") else {}
    a, b = (TextArenaEnvironment(env_id, num_players=players, messages="typed", **kw) for _ in range(2))
    first = a.reset(seed=3)
    assert first.prompt and first.legal_players == list(range(players)) and first.current_player_id in first.legal_players
    assert b.reset(seed=3) == first
    moved = a.step(TextArenaAction(message=move))
    assert any(m.category == "PLAYER_ACTION" for m in moved.messages) or moved.current_player_id != first.current_player_id
    assert b.step(TextArenaAction(message=move)) == moved
    assert json.dumps(a.state.model_dump())  # TextArena's own state travels as JSON


def test_seeds_hold_while_sessions_interleave(wordle_url):
    "2048 draws a tile after every move: two sessions of one server, stepped in turn, play as each does alone."
    moves = ["[up]", "[left]", "[down]", "[right]"] * 4
    with serve_in_thread(create_app(textarena_env("2048-v0"), max_concurrent_envs=4)) as url:
        def boards(client, seed, other=None):
            client.reset(seed=seed)
            if other: other.reset(seed=seed + 1)
            out = []
            for m in moves:
                out.append(client.step(TextArenaAction(message=m)).observation.messages[-1].content)
                if other: other.step(TextArenaAction(message=m))
            return out
        with TextArenaEnv(url).sync() as a, TextArenaEnv(url).sync() as b:
            alone = boards(a, 7)
            assert boards(a, 7, other=b) == alone and boards(b, 8) != alone


def test_vector_rollout_is_seeded(wordle_url):
    def policy(observations):
        out = []
        for o in observations:
            tried = {w for m in o.messages for w in re.findall(r"\[(\w+)\]", m.content)}
            out.append(TextArenaAction(message=f"[{next(w for w in WORDS if w not in tried)}]"))
        return out
    with VectorEnv[TextArenaAction, TextArenaObservation, TextArenaState](wordle_url, num_envs=4).sync() as venv:
        one, two = venv.rollout(policy, max_steps=8, seed=50), venv.rollout(policy, max_steps=8, seed=50)
        secrets = [s.raw_state["game_state"]["secret_word"] for s in venv.states()]
    assert one.total_rewards == two.total_rewards and all(t.error is None and t.dones[-1] for t in one.trajectories)
    for t, secret in zip(one.trajectories, secrets):  # the policy plays WORDS in order: it wins within 6 if the secret is among the first 6
        assert (t.rewards[-1] == 1.0) == (WORDS.index(secret) < 6)


def test_target_specs_are_read_by_the_shared_parser():
    Env = make_textarena_target("Wordle-v0?words=" + json.dumps(WORDS) + "&max_turns=4")
    assert Env is textarena_env("Wordle-v0", words=WORDS, max_turns=4)
    assert (Env.reward_range, Env.max_return) == ((0.0, 1.0), 1.0)
    with pytest.raises(ValueError, match="'words' is not key=value"): make_textarena_target("Wordle-v0?words")


def test_openenv_validate_semantic_passes_for_wordle(wordle_url):
    "Wordle declares its rewards, answer and reference solution: every semantic check of `openenv validate` runs."
    from openenv_nb.validate import validate_url
    report = validate_url(wordle_url, level="semantic", env=textarena_env("Wordle-v0", words=WORDS))
    assert all(c["passed"] for c in report["criteria"]), [c for c in report["criteria"] if not c["passed"]]
    assert {"episode_determinism", "reward_range", "floor_gap", "oracle_max", "no_solution_leakage", "episode_isolation"} <= {c["id"] for c in report["criteria"]}


# --------------------------------------------------------------------------------------------------------------------
# What cannot be played here says why; nothing is downloaded

def test_unknown_unloadable_and_mis_seated_games_say_why():
    with pytest.raises(ValueError, match="did you mean Wordle-v0"): textarena_env("Wordle-v1")
    with pytest.raises(ValueError, match="needs an env_id"): TextArenaEnvironment()
    if sys.version_info < (3, 12):  # TextArena 0.7.4's chess is written in 3.12's f-strings
        with pytest.raises(ImportError, match="TextArena's Chess-v0 cannot be loaded here"): textarena_env("Chess-v0")
    with pytest.raises(ValueError, match="TicTacToe-v0 cannot start with num_players=1"): TextArenaEnvironment("TicTacToe-v0").reset()
    with serve_in_thread(create_app(textarena_env("TicTacToe-v0"), max_concurrent_envs=2)) as url:
        with TextArenaEnv(url).sync() as env, pytest.raises(EnvServerError, match="cannot start with num_players=1"):
            env.reset()
    assert make_textarena_target("TicTacToe-v0?num_players=2")().reset().legal_players == [0, 1]


def test_word_games_never_download(monkeypatch):
    "With NLTK's data missing, the word games fail at once with what to install, and no connection is attempted."
    def no_network(*args, **kwargs): raise AssertionError(f"a connection was attempted: {args}")
    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(nltk, "download", no_network)
    if nltk_missing():
        for env_id in ("Hangman-v0", "SpellingBee-v0"):
            with pytest.raises(MissingDataError, match="python -m nltk.downloader"): make_game(env_id)
    for env_id in ("Wordle-v0", "Wordle-v0-hardcore", "Wordle-v0-long"):  # its data ships with openenv-nb
        env = TextArenaEnvironment(env_id)
        assert env.reset(seed=0).prompt and env.state.raw_state["game_state"]["secret_word"] in env.inner.word_list
        assert "Feedback:" in env.step(TextArenaAction(message="[crane]" if env_id != "Wordle-v0-long" else "[example]")).messages[0].content


def test_wordle_served_offline_from_the_command_line(tmp_path):
    "`openenv serve textarena:Wordle-v0` with no NLTK data to find: a game is played to its end."
    path = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH", "")]))
    p = LocalProcessProvider("textarena:Wordle-v0", max_sessions=2,
                             env_vars={"PYTHONPATH": path, "NLTK_DATA": str(tmp_path), **NO_PROXY})
    p.start()
    try:
        with TextArenaEnv(p.base_url).sync() as client:
            r = client.reset(seed=1234)
            for guess in ("crane", "slate", "pious", "lemon", "robin", "slope"):
                r = client.step(TextArenaAction(message=f"[{guess}]"))
                if r.done: break
        assert r.done and r.reward == 1.0  # the secret for seed 1234 is "slope"
    finally: p.stop()


# --------------------------------------------------------------------------------------------------------------------
# Upstream's clients, run in the upstream venv

UPSTREAM_TEXTARENA = r'''
import json, sys
from typing import Any, Dict, List, Optional

from pydantic import BaseModel, Field
from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server.types import Action, Observation, State
from openenv.core.generic_client import GenericEnvClient

# The fields of upstream's textarena_env models, on openenv's own base classes; every reply is read into them strictly.
class Msg(BaseModel):
    sender_id: int
    content: str
    category: str

class Move(Action):
    message: str

class Seen(Observation):
    prompt: str
    messages: List[Msg] = Field(default_factory=list)
    current_player_id: int = 0
    legal_players: List[int] = Field(default_factory=list)
    info: Dict[str, Any] = Field(default_factory=dict)

class Game(State):
    episode_id: Optional[str] = None
    step_count: int = 0
    env_id: str
    num_players: int
    max_turns: Optional[int] = None
    turn: int = 0
    last_reward: float = 0.0
    last_info: Dict[str, Any] = Field(default_factory=dict)
    raw_state: Dict[str, Any] = Field(default_factory=dict)


def seen(payload):
    return Seen.model_validate({**payload.get("observation", {}), "reward": payload.get("reward"), "done": payload.get("done", False)}, strict=True)


class Typed(EnvClient):
    def _step_payload(self, action): return {"message": action.message}
    def _parse_result(self, payload): return StepResult(observation=seen(payload), reward=payload.get("reward"), done=payload.get("done", False))
    def _parse_state(self, payload): return Game.model_validate(payload, strict=True)


def as_dict(x): return x if isinstance(x, dict) else x.model_dump()


def play(client, move, seed, words, win):
    "A game: a wrong guess, a refused one, then the secret (win) or wrong guesses to the end."
    out, news, last = [], [], None
    with client.sync() as env:
        r = env.reset(seed=seed)
        out.append(r)
        last = as_dict(r.observation)["messages"][0]["content"]
        secret = as_dict(env.state())["raw_state"]["game_state"]["secret_word"]
        wrong = [w for w in words if w != secret]
        plan = [wrong[0], "xyzzy"] + ([secret] if win else wrong[1:6])
        for w in plan:
            r = env.step(move(f"[{w}]"))
            out.append(r)
            full = as_dict(r.observation)["messages"][0]["content"]  # the Wordle tutorial's slicing
            news.append(full[len(last):])
            last = full
        state = env.state()
    if isinstance(state, dict): Game.model_validate(state, strict=True)
    steps = []
    for r in out:
        obs = as_dict(r.observation)
        if isinstance(r.observation, dict): seen({"observation": obs, "reward": r.reward, "done": r.done})
        steps.append({"reward": r.reward, "done": r.done, "last": obs["messages"][-1], "info": obs.get("info", {}), "prompt": obs["prompt"]})
    return {"steps": steps, "state": as_dict(state), "secret": secret, "news": news}


def tutorial(url, seed):
    "The Wordle tutorial's `WordleEnv` logic on a client written as upstream's: the text appended by one move."
    with Typed(base_url=url).sync() as env:
        first = env.reset(seed=seed).observation
        r = env.step(Move(message="[10]"))
        return {"count": len(r.observation.messages), "new": r.observation.messages[0].content[len(first.messages[0].content):],
                "prompt": r.observation.prompt, "metadata": r.observation.metadata}


def upstream_env(src, games):
    "Upstream's own `TextArenaEnvironment` (from its repository), played directly; the seed as upstream's PR #1148 forwards it."
    import random
    sys.path.insert(0, src)
    from textarena_env.models import TextArenaAction
    from textarena_env.server.environment import TextArenaEnvironment
    out = []
    for g in games:
        env = TextArenaEnvironment(g["env_id"], num_players=g["players"], download_nltk=False)
        random.seed(g["seed"])
        obs = [env.reset(seed=g["seed"]).model_dump()]
        for m in g["moves"]: obs.append(env.step(TextArenaAction(message=m)).model_dump())
        out.append(obs)
    return out


def trl_loop(url, src, seed, words):
    "The rollout of TRL's Wordle example, with upstream's own client and reward helpers; a scripted model."
    sys.path.insert(0, src)
    from textarena_env import TextArenaAction, TextArenaEnv
    from textarena_env.rewards import extract_feedback_counts, extract_guess, extract_wordle_feedback
    completions = iter([f"My guess: [{w}]" for w in words] + [w.upper() + " is my pick" for w in words])
    env = TextArenaEnv(base_url=url)
    turns = []
    with env.sync() as client:
        result = client.reset(seed=seed)
        for _ in range(6):
            if result.done: break
            assert result.observation.prompt.strip() and result.observation.messages
            guess = extract_guess(next(completions))
            result = client.step(TextArenaAction(message=guess))
            greens, yellows = extract_feedback_counts(extract_wordle_feedback(result.observation))
            turns.append({"guess": guess, "reward": result.reward, "done": result.done, "greens": greens, "yellows": yellows,
                          "feedback": extract_wordle_feedback(result.observation),
                          "categories": [m.category for m in result.observation.messages]})
        state = client.state()
    return {"turns": turns, "env_id": state.env_id, "step_count": state.step_count}


plan = json.load(sys.stdin)
if plan["mode"] == "trl": print(json.dumps(trl_loop(plan["url"], plan["src"], plan["seed"], plan["words"])))
elif plan["mode"] == "tutorial": print(json.dumps(tutorial(plan["url"], plan["seed"])))
elif plan["mode"] == "upstream_env": print(json.dumps(upstream_env(plan["src"], plan["games"])))
else:  # both clients, a game won and a game lost with each, in one process: openenv takes seconds to import
    results = {}
    for mode in ("generic", "typed"):
        for win in (True, False):
            client = GenericEnvClient(base_url=plan["url"]) if mode == "generic" else Typed(base_url=plan["url"])
            move = (lambda m: {"message": m}) if mode == "generic" else (lambda m: Move(message=m))
            results.setdefault(mode, []).append(play(client, move, plan["seed"], plan["words"], win))
    print(json.dumps(results))
'''


def run_upstream(python: str, plan: dict, timeout: float = 180):
    r = subprocess.run([python, "-c", UPSTREAM_TEXTARENA], input=json.dumps(plan), capture_output=True, text=True,
                       timeout=timeout, env={**os.environ, **NO_PROXY})
    assert r.returncode == 0, f"the upstream client failed:\n{r.stderr[-4000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.upstream
def test_upstream_clients_play_wordle_against_our_server(wordle_url, upstream_py):
    "openenv's `GenericEnvClient` and a typed client on openenv's `EnvClient`, each reading replies strictly into upstream's models."
    results = run_upstream(upstream_py, {"url": wordle_url, "mode": "games", "seed": 21, "words": WORDS})
    assert sorted(results) == ["generic", "typed"]
    for won, lost in results.values(): check_won_and_lost(won, lost)


def check_won_and_lost(won: dict, lost: dict):
    for game in (won, lost):
        first = game["steps"][0]
        assert (first["reward"], first["done"], first["last"]["category"]) == (0.0, False, "MESSAGE")
        assert first["prompt"].startswith("[GAME] You are Playing Wordle.") and game["steps"][1]["prompt"] == "Wordle-v0"
        assert "Feedback:" in game["news"][0] and "'xyzzy' is not an English word" in game["news"][1]
        assert all(game["news"][:-1])  # each move's feedback, sliced off the transcript
        assert game["state"]["env_id"] == "Wordle-v0" and game["state"]["num_players"] == 1
    assert (won["steps"][-1]["reward"], won["steps"][-1]["done"], won["state"]["step_count"]) == (1.0, True, 3)
    assert lost["steps"][-1]["done"] and lost["steps"][-1]["reward"] < 1 and lost["state"]["turn"] == 6
    assert f"**{lost['secret']}**" in lost["steps"][-1]["info"]["reason"]


@pytest.mark.upstream
def test_upstream_textarena_client_runs_trls_wordle_loop(wordle_url, upstream_py):
    src = os.environ.get("OPENENV_TEXTARENA_SRC")
    if not src: pytest.skip("upstream's textarena_env client is not in the openenv wheel: set $OPENENV_TEXTARENA_SRC to the "
                            "`envs` folder of an OpenEnv checkout to run it (never required: CI has no checkout)")
    out = run_upstream(upstream_py, {"url": wordle_url, "mode": "trl", "src": src, "seed": 8, "words": WORDS})
    turns = out["turns"]
    assert out["env_id"] == "Wordle-v0" and out["step_count"] == len(turns) and turns[-1]["done"]
    assert [t["guess"] for t in turns] == [f"[{w}]" for w in WORDS[:len(turns)]]
    assert all(0 <= t["greens"] <= 5 and 0 <= t["yellows"] <= 5 for t in turns)
    assert all(t["categories"] == ["MESSAGE"] and not t["done"] for t in turns[:-1])  # one message: the transcript
    assert all(t["greens"] + t["yellows"] or t["feedback"] for t in turns[:-1])  # each wrong guess: its feedback
    assert turns[-1]["reward"] == 1.0 or len(turns) == 6  # won (TextArena gives no feedback for the winning guess) or lost


@pytest.mark.upstream
def test_upstream_style_client_gets_guess_the_numbers_answer(guess_url, upstream_py):
    "A client written as upstream's `TextArenaEnv`, with the tutorial's slicing: after `[10]`, one message and the answer."
    out = run_upstream(upstream_py, {"url": guess_url, "mode": "tutorial", "seed": 1})
    assert out["count"] == 1 and out["new"] == "\n[Player] [10]\n[GAME] The target number is lower."
    assert out["prompt"] == "GuessTheNumber-v0" and out["metadata"]["raw_messages"][0]["category"] == "MESSAGE"


SIDE_BY_SIDE = [  # games that need no NLTK data, and moves: good, refused, for two players
    {"env_id": "GuessTheNumber-v0", "players": 1, "seed": 1, "moves": ["[10]", "[oops]", "[3]", "[5]"]},
    {"env_id": "Sudoku-v0-easy", "players": 1, "seed": 2, "moves": ["[1 1 1]", "[9 9 9]"]},
    {"env_id": "Mastermind-v0", "players": 1, "seed": 3, "moves": ["[1 2 3 4]", "[hello]", "[4 3 2 1]"]},
    {"env_id": "TicTacToe-v0", "players": 2, "seed": 4, "moves": ["[4]", "[0]", "[4]", "[8]"]},
]


@pytest.mark.upstream
def test_same_messages_as_upstreams_own_environment(upstream_py):
    "Upstream's `TextArenaEnvironment`, run from its repository, and ours, over the same games, seeds and moves."
    src = os.environ.get("OPENENV_TEXTARENA_SRC")
    if not src: pytest.skip("needs upstream's textarena_env: set $OPENENV_TEXTARENA_SRC to the `envs` folder of an OpenEnv "
                            "checkout, and install textarena in the upstream venv")
    theirs = run_upstream(upstream_py, {"mode": "upstream_env", "src": src, "games": SIDE_BY_SIDE})
    keys = ("prompt", "messages", "current_player_id", "legal_players", "done")
    for g, their in zip(SIDE_BY_SIDE, theirs):
        env = TextArenaEnvironment(g["env_id"], num_players=g["players"])
        ours = [env.reset(seed=g["seed"])] + [env.step(TextArenaAction(message=m)) for m in g["moves"]]
        for i, (o, t) in enumerate(zip(ours, their)):
            o = o.model_dump()
            assert {k: o[k] for k in keys} == {k: t[k] for k in keys}, (g["env_id"], i)
            assert o["metadata"] == t["metadata"], (g["env_id"], i)
            if g["players"] == 1: assert o["reward"] == t["reward"], (g["env_id"], i)
