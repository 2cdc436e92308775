"""Environments on Meta's `openenv` 0.10.0 (PyPI), served the way its users serve them.

Runs in the upstream venv (`venv-upstream` in the tests' cache folder, see `tests/upstream_venv.py`), never in the main interpreter. Every app is
built with upstream's `create_app` and served by uvicorn with its defaults, so with uvloop and httptools when they are
installed, as users get them. The environments mirror openenv-nb's:

- `echo`: `EchoAction(message)` -> `EchoObservation(echoed_message, message_length)`, reward 0.1 per character, step
  metadata `{"original_message", "step"}`; the message "sleep N" sleeps N seconds in `step` (to provoke a slow reply).
  Its capacity is `--max-sessions`, else `$MAX_CONCURRENT_ENVS`, else 8, as upstream's own `echo_env` app reads it.
- `echo1`: the same with room for one session; `production`: the same in `mode="production"`;
  `private`: the same behind a bearer token (`--token`), refused without it the way a private Space refuses.
- `probe`: an environment with a `State` subclass (`ProbeState`: `counter`, `history`, `reset_kwargs`), a reset
  observation of its own class (`ProbeReady`), the reset keyword arguments kept in its state, and the task methods
  (`list_splits`, `list_tasks`, `num_tasks`, `get_task`, `get_task_range`); served with `state_cls=ProbeState` and
  `reset_observation_cls=ProbeReady`. `probe_plain`: the same environment served without them.
- `mcp`: an `MCPEnvironment` with FastMCP tools `echo_message` and `echo_with_length`, as upstream's echo_env has;
  `private_mcp`: the same behind the bearer token.

Usage:
    python bench/upstream_echo_server.py --port 8000 [--max-sessions 2048]          # one echo app (the benchmarks)
    python bench/upstream_echo_server.py --apps echo1,probe,mcp [--token T]        # several, each on a free port

It prints one line once every app listens: `upstream listening {"echo1": PORT, ...}`.
"""

import argparse
import asyncio
import json
import os
import socket
import time
from typing import Any, Dict, List, Optional
from uuid import uuid4

from pydantic import Field

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class EchoAction(Action):
    """A message to echo."""

    message: str


class EchoObservation(Observation):
    """The message, echoed, and its length."""

    echoed_message: str = ""
    message_length: int = 0


class EchoEnvironment(Environment):
    """Echoes each message back; the reward is 0.1 per character."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        """Start with a fresh episode."""
        super().__init__()
        self._state = State(episode_id=str(uuid4()), step_count=0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> EchoObservation:
        """Begin a new episode and say so."""
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return EchoObservation(echoed_message="Echo environment ready!", message_length=0, done=False, reward=0.0)

    def step(self, action: EchoAction, timeout_s: Optional[float] = None, **kwargs: Any) -> EchoObservation:
        """Echo `action.message`; "sleep N" first sleeps N seconds."""
        if action.message.startswith("sleep "):
            time.sleep(float(action.message.split()[1]))
        self._state.step_count += 1
        n = len(action.message)
        return EchoObservation(echoed_message=action.message, message_length=n, done=False, reward=n * 0.1,
                               metadata={"original_message": action.message, "step": self._state.step_count})

    @property
    def state(self) -> State:
        """Episode id and step count."""
        return self._state


class ProbeAction(Action):
    """A message; "finish" ends the episode."""

    message: str


class ProbeObservation(Observation):
    """What a step returns."""

    echoed_message: str = ""
    message_length: int = 0


class ProbeReady(Observation):
    """What a reset returns: a class of its own."""

    ready: bool = True
    task_name: Optional[str] = None


class ProbeState(State):
    """A `State` subclass with fields of its own."""

    counter: int = 0
    history: List[str] = Field(default_factory=list)
    reset_kwargs: Dict[str, Any] = Field(default_factory=dict)


PROBE_TASKS = {"train": ["alpha", "beta", "gamma"], "holdout": ["delta"]}


class ProbeEnvironment(Environment):
    """Keeps its reset arguments in its state, counts steps in `counter`, and lists tasks."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        """A fresh instance reports a recognisable state."""
        super().__init__()
        self._state = ProbeState(episode_id="fresh", step_count=0, counter=0, history=[], reset_kwargs={})

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> ProbeReady:
        """Keep `kwargs` (as sent) in the state; the reset observation names `task_name` when given."""
        self._state = ProbeState(episode_id=episode_id or str(uuid4()), step_count=0, reset_kwargs=dict(kwargs))
        return ProbeReady(ready=True, task_name=kwargs.get("task_name"), reward=0.0,
                          metadata={"reset_kwargs": dict(kwargs)} if kwargs else {})

    def step(self, action: ProbeAction, timeout_s: Optional[float] = None, **kwargs: Any) -> ProbeObservation:
        """Count the step and keep the message."""
        self._state.step_count += 1
        self._state.counter += 1
        self._state.history = [*self._state.history, action.message]
        n = len(action.message)
        return ProbeObservation(echoed_message=action.message, message_length=n, reward=n * 0.1,
                                done=action.message == "finish", metadata={"counter": self._state.counter})

    @property
    def state(self) -> ProbeState:
        """The state, subclass fields included."""
        return self._state

    def list_splits(self) -> List[str]:
        """The task splits."""
        return list(PROBE_TASKS)

    def list_tasks(self, split: str) -> List[Dict[str, Any]]:
        """Every task of `split`."""
        return [{"id": f"{split}-{i}", "word": w} for i, w in enumerate(PROBE_TASKS[split])]

    def num_tasks(self, split: str) -> int:
        """How many tasks `split` has."""
        return len(PROBE_TASKS[split])

    def get_task(self, split: str, index: int) -> Dict[str, Any]:
        """One task; an `IndexError` past the end."""
        if not 0 <= index < len(PROBE_TASKS[split]):
            raise IndexError(index)
        return self.list_tasks(split)[index]

    def get_task_range(self, split: str, start: Optional[int] = None, stop: Optional[int] = None) -> List[Dict[str, Any]]:
        """Tasks `start` to `stop` of `split`."""
        return self.list_tasks(split)[slice(start, stop)]


def mcp_echo_environment():
    """The class of an MCP echo environment on upstream's `MCPEnvironment` (imported only when served)."""
    from fastmcp import FastMCP
    from openenv.core.env_server.mcp_environment import MCPEnvironment

    class MCPEchoEnvironment(MCPEnvironment):
        """Two tools, `echo_message` and `echo_with_length`."""

        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self):
            """Register the tools."""
            server = FastMCP("echo_env")

            @server.tool
            def echo_message(message: str) -> str:
                """Echo back the provided message."""
                return message

            @server.tool
            def echo_with_length(message: str) -> dict:
                """Echo back the message with its length."""
                return {"message": message, "length": len(message)}

            super().__init__(server)
            self._state = State(episode_id=str(uuid4()), step_count=0)

        def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> Observation:
            """Begin a new episode."""
            self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
            return Observation(done=False, reward=0.0, metadata={"status": "ready"})

        def _step_impl(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
            """Only tool actions are known."""
            return Observation(done=False, reward=0.0, metadata={"error": f"Unknown action type: {type(action).__name__}"})

        @property
        def state(self) -> State:
            """Episode id and step count."""
            return self._state

    return MCPEchoEnvironment


def require_token(app, token: str):
    """`app` behind a bearer token: an HTTP request without it gets 401, a WebSocket upgrade is closed (1008)."""
    wanted = ("authorization", f"Bearer {token}")

    async def guarded(scope, receive, send):
        headers = {(k.decode().lower(), v.decode()) for k, v in scope.get("headers", [])}
        if scope["type"] == "lifespan" or wanted in headers:
            return await app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"detail":"missing or wrong bearer token"}'})

    return guarded


def echo_capacity(max_sessions: Optional[int]) -> int:
    """`--max-sessions` when given, else `$MAX_CONCURRENT_ENVS`, else 8 (upstream echo_env's default)."""
    return max_sessions if max_sessions is not None else int(os.getenv("MAX_CONCURRENT_ENVS", "8"))


def build_app(name: str, max_sessions: Optional[int] = None, token: str = "secret-token"):
    """The app called `name` (see the module's docstring)."""
    echo = (EchoEnvironment, EchoAction, EchoObservation)
    if name == "echo":
        return create_app(*echo, env_name="echo", max_concurrent_envs=echo_capacity(max_sessions))
    if name == "echo1":
        return create_app(*echo, env_name="echo", max_concurrent_envs=1)
    if name == "production":
        return create_app(*echo, env_name="echo", max_concurrent_envs=8, mode="production")
    if name == "private":
        return require_token(create_app(*echo, env_name="echo", max_concurrent_envs=8), token)
    if name == "probe":
        return create_app(ProbeEnvironment, ProbeAction, ProbeObservation, env_name="probe", max_concurrent_envs=8,
                          state_cls=ProbeState, reset_observation_cls=ProbeReady)
    if name == "probe_plain":
        return create_app(ProbeEnvironment, ProbeAction, ProbeObservation, env_name="probe", max_concurrent_envs=8)
    if name in ("mcp", "private_mcp"):
        from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
        app = create_app(mcp_echo_environment(), CallToolAction, CallToolObservation, env_name="echo_env",
                         max_concurrent_envs=8)
        return app if name == "mcp" else require_token(app, token)
    raise SystemExit(f"unknown app {name!r}")


def listen(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: a free one), made here so the port is known before uvicorn starts."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


def main():
    """Build the apps, print their ports, serve them all in one process until killed."""
    import uvicorn

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="the port of the first app (0: a free one)")
    ap.add_argument("--apps", default="echo", help="comma-separated app names")
    ap.add_argument("--max-sessions", type=int, default=None, help="capacity of `echo` (default: $MAX_CONCURRENT_ENVS or 8)")
    ap.add_argument("--token", default="secret-token", help="the bearer token of `private`")
    ap.add_argument("--log-level", default="warning")
    a = ap.parse_args()
    names = [n.strip() for n in a.apps.split(",") if n.strip()]
    servers, ports = [], {}
    for i, name in enumerate(names):
        sock = listen(a.host, a.port if i == 0 else 0)
        ports[name] = sock.getsockname()[1]
        config = uvicorn.Config(build_app(name, a.max_sessions, a.token), log_level=a.log_level)
        servers.append((uvicorn.Server(config), sock))
    print("upstream listening " + json.dumps(ports), flush=True)

    async def serve_all():
        await asyncio.gather(*(server.serve(sockets=[sock]) for server, sock in servers))

    try:
        import uvloop  # what uvicorn's loop="auto" picks, as `uvicorn.run` would
    except ImportError:
        asyncio.run(serve_all())
    else:
        uvloop.run(serve_all())


if __name__ == "__main__":
    main()
