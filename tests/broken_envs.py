"""Environments for `openenv validate --level static|semantic`: `Guess`, which passes every check, and one environment
per check that breaks that check alone. `BROKEN` maps each check to the environment that fails it; every one is a
target `broken_envs:NAME` (with `tests/` importable), a class for `validate_env`, or a project's `app`."""
import random

from fastapi import FastAPI
from pydantic import ConfigDict, Field

from openenv_nb.environment import Environment
from openenv_nb.server import create_app
from openenv_nb.types import Action, Observation, State

WORDS = ["apple", "pear", "plum", "fig", "kiwi", "lime", "mango", "peach"]


class GuessAction(Action):
    "A guess at the secret fruit."
    word: str = Field(max_length=20, description="The guess")


class GuessObservation(Observation):
    "What the last guess showed."
    hint: str = Field(default="", description="How close the guess was")
    letters: int = Field(default=0, description="How many letters the secret has")
    tries_left: int = Field(default=0, description="Guesses left in this episode")


class Guess(Environment[GuessAction, GuessObservation, State]):
    "Guess the secret fruit, chosen by the seed, in 4 tries; a wrong guess says how many letters are in place."
    SUPPORTS_CONCURRENT_SESSIONS = True
    TRIES = 4
    reward_range, max_return = (0.0, 1.0), 1.0

    def __init__(self):
        super().__init__()
        self.secret, self._state = WORDS[0], State()

    def reset(self, seed=None, episode_id=None, **kwargs):
        self.secret, self._state = random.Random(seed).choice(WORDS), State(episode_id=episode_id)
        return self.observe("guess a fruit")

    def step(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        won = action.word == self.secret
        placed = sum(a == b for a, b in zip(action.word, self.secret))
        return self.observe(f"{placed} letters in place", 1.0 if won else 0.0, won or self._state.step_count >= self.TRIES)

    def observe(self, hint: str, reward: float = 0.0, done: bool = False) -> GuessObservation:
        return GuessObservation(hint=hint, letters=len(self.secret), tries_left=self.TRIES - self._state.step_count,
                                reward=reward, done=done)

    @property
    def state(self): return self._state

    def reference_solution(self): return [GuessAction(word=self.secret)]

    def answer(self): return self.secret


class Nondeterministic(Guess):
    "Its hints carry a number drawn afresh each time: the same seed and actions never replay."
    def observe(self, hint, reward=0.0, done=False):
        return super().observe(f"{hint} ({random.randrange(10**6)} players online)", reward, done)


class OutOfRange(Guess):
    "Punishes a wrong guess with -0.5, below the reward_range it declares."
    def step(self, action, timeout_s=None, **kwargs):
        obs = super().step(action)
        return obs if obs.reward else obs.model_copy(update={"reward": -0.5})


class TriviallySolvable(Guess):
    "Pays any guess in full, the empty one included."
    def step(self, action, timeout_s=None, **kwargs):
        return super().step(action).model_copy(update={"reward": 1.0, "done": True})


class WrongReference(Guess):
    "Declares a reference solution that never finds the secret."
    def reference_solution(self): return [GuessAction(word="durian")]


class Leaky(Guess):
    "Shows the secret in the first observation."
    def reset(self, seed=None, episode_id=None, **kwargs):
        obs = super().reset(seed, episode_id)
        return obs.model_copy(update={"hint": f"guess a fruit (it is {self.secret})"})


class SharedState(Guess):
    "Counts tries on the class, so that each session's count moves with every other session's guesses."
    tries = 0

    def reset(self, seed=None, episode_id=None, **kwargs):
        SharedState.tries = 0
        return super().reset(seed, episode_id)

    def step(self, action, timeout_s=None, **kwargs):
        SharedState.tries += 1
        return super().step(action).model_copy(update={"tries_left": self.TRIES - SharedState.tries})


class BadSchemaAction(GuessAction):
    "A guess, whose hand-edited JSON schema misspells a type."
    model_config = ConfigDict(json_schema_extra={"properties": {"word": {"type": "strnig"}}})


class BadSchema(Guess):
    "Publishes an action schema that JSON Schema's meta-schema rejects."
    action_type = BadSchemaAction


def with_tool(name: str) -> FastAPI:
    "A `Guess` server whose `/mcp` lists one tool, called `name`."
    app = FastAPI()

    @app.post("/mcp")
    def mcp(): return {"jsonrpc": "2.0", "id": 1, "result": {"tools": [{"name": name, "inputSchema": {"type": "object"}}]}}

    app.mount("/", create_app(Guess, max_concurrent_envs=16))
    return app


ReservedToolName = with_tool("step")
PlainToolName = with_tool("guess")

BROKEN = {"json_schemas": "BadSchema", "reserved_tool_names": "ReservedToolName",
          "episode_determinism": "Nondeterministic", "reward_range": "OutOfRange", "floor_gap": "TriviallySolvable",
          "oracle_max": "WrongReference", "no_solution_leakage": "Leaky", "episode_isolation": "SharedState"}
