"""Chess served: UCI and SAN, illegal moves as a penalty that never ends the session, results and rewards for either
colour, positions from FEN, seeded determinism, SVG frames, `openenv validate`, `VectorEnv` against a local loop, and
OpenEnv 0.10's clients against our server."""
import base64
import random

import pytest

from conftest import need, start_server
from openenv_nb.client import GenericEnvClient
from openenv_nb.server import create_app, serve_in_thread
from openenv_nb.types import EnvServerError
from openenv_nb.validate import validate_url
from openenv_nb.vector import VectorEnv
from upstream_venv import run_upstream

try:
    import chess
    from openenv_nb.envs.chess import (ChessAction, ChessEnv, ChessEnvironment, ChessObservation, ChessState, chess_env,
                                       make_chess_target, search_move)
except ImportError as e:
    chess, MISSING = None, e


@pytest.fixture(autouse=True)
def _needs_chess():
    need("chess", chess is not None, f"needs python-chess: pip install 'openenv-nb[chess]' ({'' if chess else MISSING})")


@pytest.fixture(scope="module")
def served():
    "Base URLs of in-process chess servers: `random` (with SVG frames), `search`, and `none` (the agent plays both sides)."
    with serve_in_thread(create_app(chess_env(), max_concurrent_envs=16)) as a, \
         serve_in_thread(create_app(chess_env(opponent="search", svg=False), max_concurrent_envs=16)) as b, \
         serve_in_thread(create_app(chess_env(opponent="none", svg=False), max_concurrent_envs=16)) as c:
        yield {"random": a, "search": b, "none": c}


MATE_IN_ONE = "6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1"  # Ra8#


def test_moves_in_uci_and_san_alike(served):
    with ChessEnv(served["none"]).sync() as env:
        env.reset(seed=0)
        for move in ("e2e4", "e5", "Nf3", "b8c6", "Bc4", "g8f6", "O-O"):
            r = env.step(ChessAction(move=move))
            assert r.observation.error is None, (move, r.observation.error)
        assert env.state().move_history == ["e2e4", "e7e5", "g1f3", "b8c6", "f1c4", "g8f6", "e1g1"]
        env.reset(fen="8/4P1k1/8/8/8/8/8/K7 w - - 0 1")
        assert env.step(ChessAction(move="e8=Q")).observation.fen.startswith("4Q3/6k1")
        env.reset(fen="8/4P1k1/8/8/8/8/8/K7 w - - 0 1")
        assert env.step(ChessAction(move="e7e8n")).observation.fen.startswith("4N3/6k1")


@pytest.mark.parametrize("bad", ["e2e5", "e7e5", "Ke2", "O-O", "0000", "--", "", "   ", "E4", "e2e4e4", "pawn to e4", "x" * 5000])
def test_an_illegal_or_unreadable_move_costs_a_penalty_and_changes_nothing(served, bad):
    with ChessEnv(served["random"]).sync() as env:
        start = env.reset(seed=0).observation
        r = env.step(ChessAction(move=bad))
        assert (r.reward, r.done) == (-0.1, False)
        assert (r.observation.fen, r.observation.legal_moves, r.observation.opponent_move) == (start.fen, start.legal_moves, None)
        assert "is not a legal move in this position" in r.observation.error
        assert env.state().move_history == [] and env.state().step_count == 1
        r = env.step(ChessAction(move="e4"))
        assert r.observation.error is None and env.state().move_history[0] == "e2e4" and len(env.state().move_history) == 2


def test_a_move_that_is_not_text_is_a_validation_error_for_that_request_alone(served):
    with GenericEnvClient(served["random"]).sync() as env:
        env.reset(seed=0)
        for bad in (42, None, ["e2e4"], {"from": "e2"}):
            with pytest.raises(EnvServerError) as e: env.step({"move": bad})
            assert e.value.code == "VALIDATION_ERROR", bad
        with pytest.raises(EnvServerError) as e: env.step({"move": "e2e4", "promotion": "q"})
        assert e.value.code == "VALIDATION_ERROR"
        assert env.step({"move": "e2e4"}).observation["error"] is None


@pytest.mark.parametrize("color, reward, result", [("white", 1.0, "1-0"), ("black", -1.0, "1-0")])
def test_mate_ends_the_game_with_the_result_and_the_agents_reward(served, color, reward, result):
    with ChessEnv(served["none"]).sync() as env:
        env.reset(fen=MATE_IN_ONE, agent_color=color)
        r = env.step(ChessAction(move="Ra8#"))
        assert (r.reward, r.done, r.observation.result, r.observation.is_check, r.observation.legal_moves) == (reward, True, result, True, [])
        again = env.step(ChessAction(move="Kh8"))
        assert (again.reward, again.done, again.observation.error) == (0.0, True, "The game is over: reset to play again")


def test_the_opponent_moves_first_when_the_agent_plays_the_side_not_to_move(served):
    with ChessEnv(served["search"]).sync() as env:
        r = env.reset(seed=0, agent_color="black")
        s = env.state()
        assert (s.agent_color, s.current_player, s.step_count, s.move_history) == ("black", "black", 0, [r.observation.opponent_move])
        r = env.reset(fen=MATE_IN_ONE, agent_color="black")  # White (the search) to move, and it mates at once
        assert (r.observation.opponent_move, r.reward, r.done, r.observation.result) == ("a1a8", -1.0, True, "1-0")
        assert env.state().agent_color == "black"


def test_a_bad_reset_fails_that_reset_alone(served):
    with ChessEnv(served["random"]).sync() as env:
        for bad in ({"fen": "not a fen"}, {"fen": "8/8/8/8/8/8/8/8 w - - 0 1"}, {"opponent": "stockfish"}, {"agent_color": "red"}):
            with pytest.raises(EnvServerError) as e: env.reset(**bad)
            assert e.value.code == "EXECUTION_ERROR", bad
        assert env.reset(seed=0).observation.fen == chess.STARTING_FEN
        assert env.state().opponent == "random"


def test_draws_by_rule_and_by_max_moves():
    env = chess_env(opponent="none", max_moves=6, svg=False)()
    env.reset(seed=0)
    for san in ("Nf3", "Nf6", "Ng1", "Ng8", "Nf3", "Nf6"): r = env.step(ChessAction(move=san))
    assert (r.done, r.result, r.reward) == (True, "1/2-1/2", 0.0)
    env = chess_env(opponent="none", svg=False)()
    env.reset(fen="7k/8/8/8/8/8/8/K6N w - - 0 1")
    assert env.step(ChessAction(move="Kb2")).result == "1/2-1/2"  # insufficient material: the game is drawn already
    assert env.reset(fen="7k/5Q2/6K1/8/8/8/8/8 b - - 0 1").result == "1/2-1/2"  # stalemate, at reset


def test_a_seed_replays_the_game_and_random_colours(served):
    def game(seed, **reset):
        rng = random.Random(1)
        with ChessEnv(served["random"]).sync() as env:
            out = [env.reset(seed=seed, **reset)]
            while not out[-1].done and len(out) < 40: out.append(env.step(ChessAction(move=rng.choice(out[-1].observation.legal_moves))))
            return [(r.observation.fen, r.reward) for r in out], env.state().agent_color
    assert game(7) == game(7) and game(7) != game(8)
    colours = {game(s, agent_color="random")[1] for s in range(8)}
    assert colours == {"white", "black"}
    assert game(3, agent_color="random") == game(3, agent_color="random")


def test_the_search_opponent_takes_what_hangs():
    board = chess.Board("4k3/8/8/3r4/8/8/8/3QK3 b - - 0 1")  # Black's rook can take the queen on d1
    assert search_move(board, random.Random(0)).uci() == "d5d1"
    board = chess.Board(MATE_IN_ONE)
    assert all(search_move(board, random.Random(s)).uci() == "a1a8" for s in range(5))


def test_frames_are_svg_data_urls_from_the_agents_side(served):
    with ChessEnv(served["random"]).sync() as env:
        white = env.reset(seed=0).observation.frame
        black = env.reset(seed=0, agent_color="black").observation.frame
    for frame in (white, black):
        assert frame.startswith("data:image/svg+xml;base64,")
        assert base64.b64decode(frame.split(",", 1)[1]).lstrip().startswith(b"<svg")
    assert white != black
    with ChessEnv(served["none"]).sync() as env:
        assert env.reset(seed=0).observation.frame is None


@pytest.mark.parametrize("opponent", ["random", "search"])
def test_openenv_validate_passes(served, opponent):
    report = validate_url(served[opponent])
    assert report["passed"], report["summary"]


def test_vector_env_gives_what_a_local_loop_gives():
    "Lockstep over the wire with auto-reset == each game played alone in process, seeds `seed + i`."
    n, steps = 4, 60
    def policy(i, t, obs): return obs.legal_moves[(i * 5 + t * 3) % len(obs.legal_moves)] if obs.legal_moves else "e2e4"
    Env = chess_env(svg=False, max_moves=30)
    local = []
    for i in range(n):
        env, rows = Env(), []
        obs = env.reset(seed=20 + i)
        for t in range(steps):
            obs = env.reset() if obs.done else env.step(ChessAction(move=policy(i, t, obs)))
            rows.append((obs.fen, obs.reward, obs.done))
        local.append(rows)
    with serve_in_thread(create_app(Env, max_concurrent_envs=n)) as url:
        with VectorEnv[ChessAction, ChessObservation, ChessState](url, num_envs=n, auto_reset=True).sync() as venv:
            r, wire = venv.reset(seed=20), [[] for _ in range(n)]
            for t in range(steps):
                r = venv.step([ChessAction(move=policy(i, t, o)) for i, o in enumerate(r.observations)])
                assert r.ok
                for i, o in enumerate(r.observations): wire[i].append((o.fen, o.reward, o.done))
    assert wire == local
    assert sum(d for rows in local for _, _, d in rows) >= n  # every game hit max_moves and started again


def test_targets():
    assert make_chess_target() is chess_env()
    Env = make_chess_target("opponent=search&depth=1&agent_color=black&svg=false")
    assert (Env.opponent, Env.depth, Env.agent_color, Env.svg) == ("search", 1, "black", False)
    with pytest.raises(ValueError, match="Unknown opponent"): make_chess_target("opponent=moonfish")
    with pytest.raises(TypeError): make_chess_target("colour=white")
    assert make_chess_target("?opponent=search&depth=1&agent_color=black&svg=false") is Env  # a leading ? is allowed
    with pytest.raises(ValueError, match="'search' is not key=value"): make_chess_target("search")


def test_semantic_validation_holds_chess_to_its_declarations(served):
    "A won game (+1) is the best return; refused moves cost `illegal_reward`, inside the declared range."
    report = validate_url(served["random"], level="semantic", env=chess_env())
    got = {c["id"]: c for c in report["criteria"]}
    assert report["passed"], [c for c in report["criteria"] if not c["passed"]]
    assert not got["floor_gap"].get("skipped") and "max_return 1" in got["floor_gap"]["details"], got["floor_gap"]
    assert "inside [-1, 1]" in got["reward_range"]["details"], got["reward_range"]


def test_from_local_serves_the_chess_target_in_a_subprocess():
    with ChessEnv.from_local().sync() as env:
        assert env.reset(seed=0).observation.fen == chess.STARTING_FEN
    p = start_server("chess:opponent=search&agent_color=black", max_sessions=4)
    try:
        with ChessEnv(p.base_url).sync() as env:
            assert env.reset(seed=0).observation.opponent_move is not None
    finally: p.stop()


# ---------------------------------------------------------------------------------------------------------------------
# OpenEnv 0.10's clients, in their own venv. Its wheel does not ship the `chess_env` client, so the venv runs
# `upstream_venv.UPSTREAM_CLIENT`: openenv's `GenericEnvClient`, and a typed `EnvClient` written as openenv's `ChessEnv`
# is, both reading every reply strictly into models with that environment's fields.

@pytest.mark.upstream
def test_openenv_clients_play_against_our_server(served, upstream_py):
    plan = dict(url=served["search"], kind="chess", reset={"seed": 0}, actions=[{"move": "e2e4"}, {"move": "e2e5"}, "legal", "legal"])
    mate = dict(url=served["none"], kind="chess", client="generic", reset={"fen": MATE_IN_ONE}, actions=[{"move": "a1a8"}])
    typed, generic, mated = run_upstream(upstream_py, [{**plan, "client": "typed"}, {**plan, "client": "generic"}, mate])
    mine = chess_env(opponent="search", svg=False)()  # the same game in process
    want = [mine.reset(seed=0), mine.step(ChessAction(move="e2e4")), mine.step(ChessAction(move="e2e5"))]
    for _ in range(2): want.append(mine.step(ChessAction(move=want[-1].legal_moves[0])))
    fields = ("fen", "legal_moves", "is_check", "result")
    for out in (typed, generic):
        steps = out["steps"]
        assert [{k: s["observation"][k] for k in fields} for s in steps] == [w.model_dump(include=set(fields)) for w in want]
        assert [(s["reward"], s["done"]) for s in steps] == [(w.reward, w.done) for w in want]
        assert steps[2]["reward"] == -0.1 and steps[2]["observation"]["fen"] == steps[1]["observation"]["fen"]
        st = out["state"]
        assert (st["fen"], st["current_player"], st["move_history"], st["step_count"]) == \
               (mine.state.fen, "white", mine.state.move_history, 4)
    end = mated["steps"][-1]
    assert (end["reward"], end["done"], end["observation"]["result"], end["observation"]["is_check"]) == (1.0, True, "1-0", True)
