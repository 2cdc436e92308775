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
    reward_range, max_return, max_steps = (0.0, 1.0), 1.0, 4

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


# --- broken for the determinism and adversarial levels: each pays for something other than solving -----------------

class MessageLength(Guess):
    "Pays a wrong guess for its length: a policy that never guesses right learns to write long guesses."
    def step(self, action, timeout_s=None, **kwargs):
        obs = super().step(action)
        return obs if obs.reward else obs.model_copy(update={"reward": len(action.word) / 100})


class PartialCredit(Guess):
    "Gives partial credit for an invalid guess (one that is not letters only), as TextArena once did."
    invalid_action = {"word": "?!"}

    def step(self, action, timeout_s=None, **kwargs):
        obs = super().step(action)
        invalid = any(not c.isalpha() for c in action.word)
        return obs.model_copy(update={"reward": 0.2, "hint": "invalid guess: letters only"}) if invalid else obs


class Repeater(Guess):
    "Pays for guessing the same word again."
    def reset(self, seed=None, episode_id=None, **kwargs):
        self.last = None
        return super().reset(seed, episode_id)

    def step(self, action, timeout_s=None, **kwargs):
        obs, again = super().step(action), action.word == self.last
        self.last = action.word
        return obs.model_copy(update={"reward": 0.25}) if again and not obs.reward else obs


class SeedIgnoring(Guess):
    "Draws its puzzle (the secret, and the number it shows) from the global random generator: the seed is ignored."
    def reset(self, seed=None, episode_id=None, **kwargs):
        super().reset(seed, episode_id)
        self.secret = random.choice(WORDS)
        return self.observe(f"puzzle #{random.randrange(10**6)}: guess a fruit")


class Overpaying(Guess):
    "Punishes the longest guess with -1, below the declared reward_range: only extreme values find it."
    def step(self, action, timeout_s=None, **kwargs):
        obs = super().step(action)
        return obs.model_copy(update={"reward": -1.0}) if len(action.word) >= 20 else obs


class Endless(Guess):
    "Declares at most 4 steps, but never ends an episode without a right guess."
    def step(self, action, timeout_s=None, **kwargs):
        obs = super().step(action)
        return obs if obs.reward else obs.model_copy(update={"done": False})


class Fragile(Guess):
    "Raises on a guess that is not ASCII, instead of refusing it in its schema."
    def step(self, action, timeout_s=None, **kwargs):
        action.word.encode("ascii")
        return super().step(action)


class DeclaredUnseeded(SeedIgnoring):
    "Ignores the seed, and says so: seeded = False."
    seeded = False


ReservedToolName = with_tool("step")
PlainToolName = with_tool("guess")

BROKEN = {"json_schemas": "BadSchema", "reserved_tool_names": "ReservedToolName",
          "episode_determinism": "Nondeterministic", "reward_range": "OutOfRange", "floor_gap": "TriviallySolvable",
          "oracle_max": "WrongReference", "no_solution_leakage": "Leaky", "episode_isolation": "SharedState"}
# what each planted reward bug is caught by: (the environment, the level, the check that fails)
CHEATS = {"message length": ("MessageLength", "adversarial", "no_unsolved_reward"),
          "partial credit for invalid moves": ("PartialCredit", "adversarial", "invalid_earns_nothing"),
          "repeating one action": ("Repeater", "adversarial", "no_unsolved_reward"),
          "a seed ignored": ("SeedIgnoring", "determinism", "episode_determinism"),
          "a reward outside its range": ("Overpaying", "adversarial", "rewards_in_range"),
          "an episode past max_steps": ("Endless", "adversarial", "episodes_end"),
          "a crash on odd input": ("Fragile", "adversarial", "no_crash")}
