"""Environments that misbehave on purpose, served by the tests' servers as `helpers:Name`."""
import time

from openenv_nb.environment import Environment
from openenv_nb.envs.echo import EchoAction, EchoEnvironment, EchoObservation
from openenv_nb.types import State


class Flaky(EchoEnvironment):
    """Echo, except that the message 'boom' raises in `step`."""
    def step(self, action, timeout_s=None, **kwargs):
        if action.message == "boom": raise RuntimeError("the environment blew up")
        return super().step(action, timeout_s, **kwargs)
    step_async = Environment.step_async  # blocking methods: run in the thread pool


class Sleepy(Environment[EchoAction, EchoObservation, State]):
    """A blocking environment: 'sleep N' sleeps N seconds in `step`, in the server's thread pool."""
    SUPPORTS_CONCURRENT_SESSIONS = True
    def __init__(self): super().__init__(); self._state = State()
    def reset(self, seed=None, episode_id=None, **kwargs):
        self._state = State(episode_id=episode_id, step_count=0)
        return EchoObservation(echoed_message="ready", reward=0.0)
    def step(self, action, timeout_s=None, **kwargs):
        if action.message.startswith("sleep "): time.sleep(float(action.message.split()[1]))
        self._state.step_count += 1
        return EchoObservation(echoed_message=action.message, message_length=len(action.message), reward=0.0)
    @property
    def state(self): return self._state


def broken_factory():
    """A factory that fails: every session gets FACTORY_ERROR."""
    raise OSError("no such resource")
broken_factory.__annotations__["return"] = EchoEnvironment


class Countdown(EchoEnvironment):
    """Echo whose episodes end after `3 + seed % 3` steps (seed 0 when not given)."""
    def reset(self, seed=None, episode_id=None, **kwargs):
        self.left = 3 + (seed or 0) % 3
        return super().reset(seed, episode_id, **kwargs)
    def step(self, action, timeout_s=None, **kwargs):
        self.left -= 1
        obs = super().step(action, timeout_s, **kwargs)
        obs.done = self.left <= 0
        return obs
