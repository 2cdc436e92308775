"""The Python of a virtual environment with Meta's `openenv` 0.10.0 (PyPI), for the tests that run upstream's clients.

`upstream_python_why()` looks, in order, at:
1. `$OPENENV_UPSTREAM_PYTHON`, if set (used as given; it is an error if it cannot import openenv 0.10.0's client);
2. `venv-upstream` in the tests' cache folder (`tests/cache.py`: `~/.cache/openenv-nb`), if it imports openenv 0.10.0.

It installs nothing: without either it returns `(None, why)`, and the tests marked `upstream` skip with that reason
(or fail, where OPENENV_REQUIRE names `upstream`). `python tests/upstream_venv.py --create` makes
it (about 300 MB; `python -m venv`, then `pip install openenv==0.10.0`, plus `SHIM_DEPS`: what openenv_nb needs
there beyond openenv's own dependencies, and pytest, for `tests/test_upstream_suite.py`, which runs upstream's test files
in this venv with our server swapped in); without `--create` it prints what it found.
"""
import os
import subprocess
import sys
from pathlib import Path

from cache import cache_dir

VERSION = "0.10.0"
ENV_VAR = "OPENENV_UPSTREAM_PYTHON"
SHIM_DEPS = ["fastcore>=1.8", "pathspec>=0.12", "pytest>=8", "pytest-asyncio>=0.23"]  # small: no torch, nothing compiled

_PROBE = ("import importlib.metadata as m, openenv.core.generic_client, openenv.core.env_server.types; "
          "print(m.version('openenv'))")
_cache: dict[str, tuple[str | None, str]] = {}


def probe(python: str | Path, timeout: float = 120) -> str:
    "'' when `python` imports openenv's client at VERSION; otherwise why not."
    python = Path(python)
    if not python.exists(): return f"{python} does not exist"
    try: r = subprocess.run([str(python), "-c", _PROBE], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e: return f"{python} could not be run: {e}"
    if r.returncode != 0: return f"{python} cannot import openenv: {(r.stderr.strip().splitlines() or ['?'])[-1]}"
    got = r.stdout.strip()
    return "" if got == VERSION else f"{python} has openenv {got}, not {VERSION}"


def upstream_python_why() -> tuple[str | None, str]:
    "`(python, where it came from)`, or `(None, why there is none)`; computed once per process."
    key = os.environ.get(ENV_VAR, "")
    if key in _cache: return _cache[key]
    if key:
        why = probe(key)
        res = (key, f"${ENV_VAR}") if not why else (None, f"${ENV_VAR}: {why}")
    else:
        venv = cache_dir() / "venv-upstream"
        why = probe(venv / "bin" / "python")
        res = (str(venv / "bin" / "python"), str(venv)) if not why else \
              (None, f"no venv with openenv=={VERSION}: set ${ENV_VAR} to its python, or run `python tests/upstream_venv.py --create` ({why})")
    _cache[key] = res
    return res


def create() -> str:
    "Make `venv-upstream` in the cache folder with openenv 0.10.0 (unless it works already); '' on success, else why."
    venv = cache_dir() / "venv-upstream"
    py = venv / "bin" / "python"
    if not probe(py): return ""
    for cmd in ([sys.executable, "-m", "venv", str(venv)],
                [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", f"openenv=={VERSION}", *SHIM_DEPS]):
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0: return f"`{' '.join(cmd[:4])} ...` failed: {(r.stderr or r.stdout).strip()[-500:]}"
    return probe(py)


if __name__ == "__main__":
    if "--create" in sys.argv[1:]: print(create() or f"ready: {cache_dir() / 'venv-upstream'}")
    else: print(upstream_python_why())


# --------------------------------------------------------------------------------------------------------------------
# A client for the upstream venv. It speaks to a server with openenv 0.10's own `EnvClient` machinery in two ways:
# `GenericEnvClient` (dicts in, dicts out), and a typed client written the way openenv's own `openspiel_env` and
# `chess_env` clients are (an `EnvClient` subclass with `_step_payload`, `_parse_result`, `_parse_state`), its models
# carrying the fields of those environments on openenv's own base classes. Every reply is read into those models,
# strictly: a field missing, renamed or of another type fails the run. The plan comes as JSON on stdin:
# a list of plans {"url", "kind": "openspiel" | "chess", "client": "typed" | "generic", "reset": {...}, "actions": [...]},
# where an action is a dict of the action's fields or "legal" (the first legal action of the last observation), played
# in one process (openenv takes seconds to import). It prints, for each plan in order,
# {"steps": [{"observation", "reward", "done"}, ...], "state": {...}}.
UPSTREAM_CLIENT = r'''
import json, sys
from typing import Any, Dict, List, Optional

from pydantic import Field
from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server.types import Action, Observation, State
from openenv.core.generic_client import GenericEnvClient


class OpenSpielAction(Action):
    action_id: int
    game_name: str = "catch"
    game_params: Dict[str, Any] = Field(default_factory=dict)

class OpenSpielObservation(Observation):
    info_state: List[float]
    legal_actions: List[int]
    game_phase: str = "playing"
    current_player_id: int = 0
    opponent_last_action: Optional[int] = None

class OpenSpielState(State):
    game_name: str = "catch"
    agent_player: int = 0
    opponent_policy: str = "random"
    game_params: Dict[str, Any] = Field(default_factory=dict)
    num_players: int = 1

class ChessAction(Action):
    move: str

class ChessObservation(Observation):
    fen: str = ""
    legal_moves: List[str] = Field(default_factory=list)
    is_check: bool = False
    result: Optional[str] = None

class ChessState(State):
    fen: str = ""
    current_player: str = "white"
    move_history: List[str] = Field(default_factory=list)

MODELS = {"openspiel": (OpenSpielAction, OpenSpielObservation, OpenSpielState), "chess": (ChessAction, ChessObservation, ChessState)}


def strict(cls, data: dict):
    "`cls` read from the fields of `data` it knows, strictly; every field without a default must be there."
    return cls.model_validate({k: v for k, v in data.items() if k in cls.model_fields}, strict=True)


class TypedClient(EnvClient):
    def _step_payload(self, action): return action.model_dump(exclude={"metadata"})
    def _parse_result(self, payload):
        obs = strict(self.obs_cls, {**payload.get("observation", {}), "reward": payload.get("reward"), "done": payload.get("done", False)})
        return StepResult(observation=obs, reward=payload.get("reward"), done=payload.get("done", False))
    def _parse_state(self, payload): return strict(self.state_cls, payload)


def record(r):
    obs = r.observation if isinstance(r.observation, dict) else r.observation.model_dump(exclude={"metadata"})
    return {"observation": obs, "reward": r.reward, "done": r.done}


def legal(kind, obs):
    if kind == "openspiel": return {"action_id": obs["legal_actions"][0], "game_name": "catch", "game_params": {}}
    return {"move": obs["legal_moves"][0]}


def main(plan):
    kind = plan["kind"]
    act_cls, obs_cls, state_cls = MODELS[kind]
    if plan["client"] == "typed":
        client = TypedClient(base_url=plan["url"])
        client.obs_cls, client.state_cls = obs_cls, state_cls
    else: client = GenericEnvClient(base_url=plan["url"])
    steps = []
    with client.sync() as env:
        steps.append(record(env.reset(**plan["reset"])))
        for a in plan["actions"]:
            if a == "legal" and steps[-1]["done"]: break  # the game is over: no legal action to take
            data = legal(kind, steps[-1]["observation"]) if a == "legal" else a
            steps.append(record(env.step(strict(act_cls, data) if plan["client"] == "typed" else data)))
        state = env.state()
    state = state if isinstance(state, dict) else state.model_dump()
    if plan["client"] == "generic": strict(state_cls, state)
    for s in steps:
        if plan["client"] == "generic": strict(obs_cls, {**s["observation"], "reward": s["reward"], "done": s["done"]})
    return {"steps": steps, "state": state}


print(json.dumps([main(plan) for plan in json.load(sys.stdin)]))
'''


def run_upstream(python: str, # the upstream venv's python
                 plans: list[dict], # see UPSTREAM_CLIENT
                 timeout: float = 180) -> list[dict]:
    "What `UPSTREAM_CLIENT` prints for `plans`, run with `python`; an `AssertionError` with its stderr if it fails."
    import json
    env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    r = subprocess.run([python, "-c", UPSTREAM_CLIENT], input=json.dumps(plans), capture_output=True, text=True, timeout=timeout, env=env)
    assert r.returncode == 0, f"the upstream client failed:\n{r.stderr[-4000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])
