"""OpenSpiel games served: whole games over the wire, seeded determinism, the same tensors as OpenSpiel's own
`rl_environment` (which OpenEnv's server wraps), illegal actions that never crash, opponents and seats chosen at reset,
`openenv validate`, `VectorEnv` against a local loop, and OpenEnv 0.10's clients against our server."""
import math
import random
from contextlib import ExitStack

import pytest

from conftest import need, start_server
from openenv_nb.client import GenericEnvClient
from openenv_nb.server import create_app, serve_in_thread
from openenv_nb.types import EnvServerError
from openenv_nb.validate import validate, validate_url
from openenv_nb.vector import VectorEnv
from upstream_venv import run_upstream

try:
    import pyspiel
    from open_spiel.python import rl_environment
    from openenv_nb.envs.openspiel import (OpenSpielAction, OpenSpielEnv, OpenSpielEnvironment, OpenSpielObservation,
                                           OpenSpielState, make_openspiel_target, openspiel_env)
except ImportError as e:
    pyspiel, MISSING = None, e


@pytest.fixture(autouse=True)
def _needs_openspiel():
    need("openspiel", pyspiel is not None, f"needs OpenSpiel: pip install 'openenv-nb[openspiel]' ({'' if pyspiel else MISSING})")


GAMES = ["catch", "blackjack", "tic_tac_toe", "2048", "kuhn_poker", "leduc_poker", "matrix_rps", "goofspiel", "cliff_walking"]


@pytest.fixture(scope="module")
def served():
    "Base URL of an in-process server for each of GAMES (random opponents), and for tic-tac-toe against `first`."
    with ExitStack() as stack:
        urls = {g: stack.enter_context(serve_in_thread(create_app(openspiel_env(g), max_concurrent_envs=16))) for g in GAMES}
        urls["tic_tac_toe/first"] = stack.enter_context(serve_in_thread(create_app(openspiel_env("tic_tac_toe", opponent="first"), max_concurrent_envs=16)))
        yield urls


def play(url: str, seed: int, picks: int = 1000, pick_seed: int = 0, **reset) -> list:
    "One game over a WebSocket with a seed, the agent picking legal actions with its own seeded generator."
    rng = random.Random(pick_seed)
    with OpenSpielEnv(url).sync() as env:
        out = [env.reset(seed=seed, **reset)]
        while not out[-1].done and len(out) <= picks:
            out.append(env.step(OpenSpielAction(action_id=rng.choice(out[-1].observation.legal_actions))))
    return out


@pytest.mark.parametrize("game", GAMES)
def test_every_game_plays_to_the_end_and_rewards_add_up_to_the_return(served, game):
    out = play(served[game], seed=1)
    last = out[-1].observation
    assert out[-1].done and last.game_phase == "terminal" and last.legal_actions == [] and last.current_player_id == -4
    assert out[0].reward is None and out[0].observation.legal_actions
    total = sum(r.reward for r in out[1:])
    g = pyspiel.load_game(game)
    assert g.min_utility() <= total <= g.max_utility(), (game, total)
    assert all(r.observation.error is None for r in out)
    assert all(len(r.observation.action_names) == len(r.observation.legal_actions) for r in out)
    assert len({len(r.observation.info_state) for r in out}) == 1 and out[0].observation.info_state  # a fixed-size tensor


@pytest.mark.parametrize("game", ["blackjack", "2048", "kuhn_poker", "goofspiel"])
def test_a_seed_replays_the_game_in_any_session(served, game):
    one, two = play(served[game], seed=5), play(served[game], seed=5)
    assert [r.observation for r in one] == [r.observation for r in two]
    assert any([r.observation for r in play(served[game], seed=s)] != [r.observation for r in one] for s in (6, 7, 8))


def test_unseeded_resets_go_on_from_the_seeded_generator():
    env = openspiel_env("blackjack")()
    def games():
        env.reset(seed=3)
        return [env.reset().observation_string for _ in range(6)]
    assert games() == games()


@pytest.mark.parametrize("game", ["tic_tac_toe", "kuhn_poker", "leduc_poker", "catch"])
def test_observations_match_openspiels_rl_environment(game):
    "The tensors, legal actions and rewards OpenEnv's server reads from `rl_environment`, for the same moves and chance."
    ours = OpenSpielEnvironment(game, opponent="first")
    ref = rl_environment.Environment(game, chance_event_sampler=lambda s: ours.gstate.history()[len(s.history())])
    obs, ts = ours.reset(seed=0), ref.reset()
    for t in range(30):
        hist = ours.gstate.history()
        while len(ref.get_state.history()) < len(hist): ts = ref.step([hist[len(ref.get_state.history())]])  # our moves and the opponent's
        assert obs.info_state == pytest.approx(list(ts.observations["info_state"][0]))
        assert obs.legal_actions == ts.observations["legal_actions"][0]
        assert obs.reward == (None if t == 0 else ts.rewards[0])
        if obs.done: break
        obs = ours.step(OpenSpielAction(action_id=obs.legal_actions[-1]))
    assert obs.done and ts.last()


def test_illegal_actions_are_refused_with_a_penalty_and_never_crash(served):
    "OpenEnv's server hands these to OpenSpiel as they are; 2048 then corrupts the process's memory."
    for game in ("2048", "tic_tac_toe/first", "catch", "blackjack"):
        with OpenSpielEnv(served[game]).sync() as env:
            first = env.reset(seed=0).observation
            for bad in (-1, 4, 99, 10**9, -(2**62)):
                if bad in first.legal_actions: continue
                r = env.step(OpenSpielAction(action_id=bad))
                assert (r.reward, r.done) == (-0.1, False), (game, bad)
                assert r.observation.error == f"Action {bad} is not legal here; the legal actions are {first.legal_actions}"
                assert (r.observation.info_state, r.observation.legal_actions) == (first.info_state, first.legal_actions)
            r = env.step(OpenSpielAction(action_id=first.legal_actions[0]))
            assert r.observation.error is None
            assert env.state().step_count == 1 + sum(b not in first.legal_actions for b in (-1, 4, 99, 10**9, -(2**62)))
    with GenericEnvClient(served["catch"]).sync() as env:
        env.reset(seed=0)
        for bad in ("left", 1.5, None, [1]):
            with pytest.raises(EnvServerError) as e: env.step({"action_id": bad})
            assert e.value.code == "VALIDATION_ERROR", bad
        assert env.step({"action_id": 1}).observation["error"] is None


def test_a_step_after_the_end_is_refused_and_a_step_before_reset_plays_a_new_game(served):
    with OpenSpielEnv(served["tic_tac_toe/first"]).sync() as env:
        env.reset(seed=0)
        for cell in (1, 4, 7): r = env.step(OpenSpielAction(action_id=cell))
        assert (r.reward, r.done) == (1.0, True)
        again = env.step(OpenSpielAction(action_id=2))
        assert (again.reward, again.done, again.observation.error) == (0.0, True, "The game is over: reset to play again")
        assert env.reset(seed=0).observation.legal_actions == list(range(9))
    env = openspiel_env("tic_tac_toe", opponent="first")()
    assert env.step(OpenSpielAction(action_id=4)).opponent_last_action == 0


def test_opponent_and_seat_are_chosen_at_reset_and_kept(served):
    with OpenSpielEnv(served["tic_tac_toe"]).sync() as env:
        r = env.reset(seed=0, opponent="first", agent_player=1)
        assert (r.observation.opponent_last_action, r.observation.current_player_id, r.observation.game_phase) == (0, 1, "playing")
        assert r.observation.legal_actions == list(range(1, 9)) and r.observation.action_names[0] == "o(0,1)"
        s = env.state()
        assert (s.agent_player, s.opponent_policy, s.num_players, s.step_count) == (1, "first", 2, 0)
        assert env.reset(seed=9).observation.opponent_last_action == 0  # kept: still seat 1 against `first`
        for bad in ({"opponent": "alphazero"}, {"agent_player": 2}, {"agent_player": -1}):
            with pytest.raises(EnvServerError) as e: env.reset(**bad)
            assert e.value.code == "EXECUTION_ERROR"
        assert env.reset(seed=1).observation.current_player_id == 1 and env.state().opponent_policy == "first"
        r = env.reset(seed=1, opponent="last", agent_player=0)
        assert (r.observation.opponent_last_action, r.observation.game_phase) == (None, "initial")
        assert env.step(OpenSpielAction(action_id=0)).observation.opponent_last_action == 8


def test_simultaneous_games_ask_the_agent_and_the_opponent_at_once():
    env = openspiel_env("matrix_rps", opponent="first")()
    for mine, reward in ((0, 0.0), (1, 1.0), (2, -1.0)):  # rock, paper, scissors against rock
        assert env.reset(seed=0).current_player_id == -2
        obs = env.step(OpenSpielAction(action_id=mine))
        assert (obs.reward, obs.done, obs.opponent_last_action) == (reward, True, 0)


def test_game_parameters_and_unknown_games():
    Catch = openspiel_env("catch", rows=6, columns=3)
    obs = Catch().reset(seed=0)
    assert len(obs.info_state) == 18 and obs.observation_string.count("\n") == 6
    assert make_openspiel_target("catch?rows=6&columns=3") is Catch
    assert make_openspiel_target("tic_tac_toe?opponent=first&agent_player=1")().reset(seed=0).opponent_last_action == 0
    with pytest.raises(ValueError, match="openspiel has no game 'chekers'; did you mean checkers"): openspiel_env("chekers")
    with pytest.raises(pyspiel.SpielError, match="Unknown parameter"): openspiel_env("catch", rowz=3)
    with pytest.raises(ValueError, match="agent_player must be 0 to 1"): make_openspiel_target("tic_tac_toe?agent_player=2")


@pytest.mark.parametrize("game", ["catch", "tic_tac_toe", "2048"])
def test_openenv_validate_passes(served, game):
    report = validate_url(served[game])
    assert report["passed"], report["summary"]


@pytest.mark.parametrize("game", ["catch", "blackjack"])
def test_vector_env_gives_what_a_local_loop_gives(game):
    "Lockstep over the wire with auto-reset == each environment played alone in process, seeds `seed + i`."
    n, steps = 6, 80
    def policy(i, t, obs): return obs.legal_actions[(i * 7 + t) % len(obs.legal_actions)] if obs.legal_actions else 0
    local = []
    for i in range(n):
        env, rows = OpenSpielEnvironment(game), []
        obs = env.reset(seed=10 + i)
        for t in range(steps):
            obs = env.reset() if obs.done else env.step(OpenSpielAction(action_id=policy(i, t, obs)))
            rows.append((obs.info_state, obs.reward, obs.done))
        local.append(rows)
    with serve_in_thread(create_app(openspiel_env(game), max_concurrent_envs=n)) as url:
        with VectorEnv[OpenSpielAction, OpenSpielObservation, OpenSpielState](url, num_envs=n, auto_reset=True).sync() as venv:
            r, wire = venv.reset(seed=10), [[] for _ in range(n)]
            for t in range(steps):
                r = venv.step([OpenSpielAction(action_id=policy(i, t, o)) for i, o in enumerate(r.observations)])
                assert r.ok
                for i, o in enumerate(r.observations): wire[i].append((o.info_state, o.reward, o.done))
    assert wire == local
    assert sum(d for rows in local for _, _, d in rows) >= n  # games ended and restarted along the way


@pytest.mark.parametrize("game", ["catch", "tic_tac_toe", "blackjack"])
def test_semantic_validation_holds_games_that_pay_at_the_end_to_their_utilities(served, game):
    report = validate_url(served[game], level="semantic", env=openspiel_env(game))
    got = {c["id"]: c for c in report["criteria"]}
    assert report["passed"], [c for c in report["criteria"] if not c["passed"]]
    assert not got["floor_gap"].get("skipped") and "max_return 1" in got["floor_gap"]["details"], got["floor_gap"]


def test_a_game_that_pays_along_the_way_declares_nothing():
    Env = openspiel_env("2048")
    assert (Env.reward_range, Env.max_return) == ((-math.inf, math.inf), None)
    got = {c["id"]: c for c in validate("openspiel:2048", level="semantic")["criteria"]}
    assert got["floor_gap"]["skipped"] and "declares no max_return" in got["floor_gap"]["details"]


def test_target_specs_are_read_by_the_shared_parser():
    Env = make_openspiel_target("catch?rows=6&opponent=first&illegal_reward=-2")
    assert (Env.game_params, Env.opponent, Env.illegal_reward, Env.reward_range) == ({"rows": 6}, "first", -2.0, (-2.0, 1.0))
    for bad, why in [("opponent=first", "must start with a name"), ("catch?rows=6&rows=7", "sets 'rows' twice")]:
        with pytest.raises(ValueError, match=why): make_openspiel_target(bad)


def test_from_local_serves_openspiel_targets_in_a_subprocess():
    with OpenSpielEnv.from_local("openspiel:catch").sync() as env:
        assert env.reset(seed=0).observation.legal_actions == [0, 1, 2]
    p = start_server("openspiel:tic_tac_toe?opponent=first", max_sessions=4)
    try:
        with OpenSpielEnv(p.base_url).sync() as env:
            env.reset(seed=0)
            assert env.step(OpenSpielAction(action_id=4)).observation.opponent_last_action == 0
    finally: p.stop()


# ---------------------------------------------------------------------------------------------------------------------
# OpenEnv 0.10's clients, in their own venv. Its wheel does not ship the `openspiel_env` client, so the venv runs
# `upstream_venv.UPSTREAM_CLIENT`: openenv's `GenericEnvClient`, and a typed `EnvClient` written as openenv's
# `OpenSpielEnv` is, both reading every reply strictly into models with that environment's fields.

@pytest.mark.upstream
def test_openenv_clients_play_against_our_server(served, upstream_py):
    move = lambda a: {"action_id": a, "game_name": "catch", "game_params": {}}  # as openenv's OpenSpielEnv sends it
    plan = dict(url=served["tic_tac_toe/first"], kind="openspiel", reset={"seed": 0}, actions=[move(4), move(0), "legal", "legal"])
    chance = dict(url=served["blackjack"], kind="openspiel", client="typed", reset={"seed": 2}, actions=["legal"] * 3)
    typed, generic, dealt = run_upstream(upstream_py, [{**plan, "client": "typed"}, {**plan, "client": "generic"}, chance])
    mine = OpenSpielEnvironment("tic_tac_toe", opponent="first")  # the same game in process
    want = [mine.reset(seed=0), mine.step(OpenSpielAction(action_id=4)), mine.step(OpenSpielAction(action_id=0))]
    for _ in range(2): want.append(mine.step(OpenSpielAction(action_id=want[-1].legal_actions[0])))
    fields = ("info_state", "legal_actions", "game_phase", "current_player_id", "opponent_last_action")
    for out in (typed, generic):
        steps = out["steps"]
        assert [{k: s["observation"][k] for k in fields} for s in steps] == [w.model_dump(include=set(fields)) for w in want]
        assert [(s["reward"], s["done"]) for s in steps] == [(w.reward, w.done) for w in want]
        assert (steps[2]["reward"], steps[2]["done"], steps[1]["observation"]["opponent_last_action"]) == (-0.1, False, 0)
        st = out["state"]
        assert {k: st[k] for k in ("step_count", "game_name", "agent_player", "opponent_policy", "game_params", "num_players")} == \
               {"step_count": 4, "game_name": "tic_tac_toe", "agent_player": 0, "opponent_policy": "first", "game_params": {}, "num_players": 2}
    assert all(len(s["observation"]["info_state"]) == 189 for s in dealt["steps"])  # blackjack, chance dealt between turns
    ends = [s for s in dealt["steps"] if s["done"]]
    assert ends and ends[0]["reward"] in (-1.0, 0.0, 1.0)
