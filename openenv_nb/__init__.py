"""Agentic RL execution environments over HTTP and WebSocket: OpenEnv-compatible, faster, written in notebooks

Modules:

- `openenv_nb.portable`: Snapshots that restore on another server of the same pool: a signed blob of the episode's way there, checked before use, never unpickled."""

__version__ = "0.1.0"
