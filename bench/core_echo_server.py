"""Echo environment on Meta's openenv-core 0.2.3, served the way its users do.

Runs in the openenv-core venv (not the main interpreter). The environment
mirrors openenv-nb's echo env: ``EchoAction(message)`` -> ``EchoObservation(
echoed_message, message_length)`` with ``reward = len(message) * 0.1``.

The app is built with ``create_app`` and served with ``uvicorn.run`` and its
defaults, exactly like openenv-core's own ``envs/echo_env/server/app.py``.
Note that importing ``openenv.core.env_server`` pulls in gradio and fastmcp
even with the web interface off (``ENABLE_WEB_INTERFACE`` unset): that is
the default user experience, so it is left as is.

Usage: python bench/core_echo_server.py --port 8000 [--max-sessions 2048]
"""

import argparse
from typing import Any, Optional
from uuid import uuid4

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class EchoAction(Action):
    """Message to echo back."""

    message: str


class EchoObservation(Observation):
    """The echoed message and its length."""

    echoed_message: str
    message_length: int = 0


class EchoEnvironment(Environment):
    """Echoes each message back; reward is 0.1 per character."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        """Start with a fresh episode."""
        super().__init__()
        self._state = State(episode_id=str(uuid4()), step_count=0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None,
              **kwargs: Any) -> EchoObservation:
        """Begin a new episode and return the ready message."""
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return EchoObservation(echoed_message="Echo environment ready!",
                               message_length=0, done=False, reward=0.0)

    def step(self, action: EchoAction, timeout_s: Optional[float] = None,
             **kwargs: Any) -> EchoObservation:
        """Echo ``action.message``."""
        self._state.step_count += 1
        n = len(action.message)
        return EchoObservation(echoed_message=action.message, message_length=n,
                               done=False, reward=n * 0.1)

    @property
    def state(self) -> State:
        """Episode id and step count."""
        return self._state


def build_app(max_sessions: int):
    """The FastAPI app, as ``create_app`` builds it by default."""
    return create_app(EchoEnvironment, EchoAction, EchoObservation,
                      env_name="echo", max_concurrent_envs=max_sessions)


def main():
    """Parse ``--host/--port/--max-sessions`` and serve until killed."""
    import uvicorn

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--max-sessions", type=int, default=2048)
    ap.add_argument("--log-level", default="warning")
    a = ap.parse_args()
    uvicorn.run(build_app(a.max_sessions), host=a.host, port=a.port, log_level=a.log_level)


if __name__ == "__main__":
    main()
