"""Shared fixtures: real servers in subprocesses, and skips that CI turns into failures."""
import os
import sys
from pathlib import Path

import pytest

from openenv_nb.providers import LocalProcessProvider

HERE = Path(__file__).parent
ROOT = HERE.parent


def need(what: str, ok: bool, reason: str):
    """Skip unless `ok`; fail instead when `what` is listed in OPENENV_REQUIRE (as `.ci/run` sets it)."""
    if ok: return
    required = {w.strip() for w in os.environ.get("OPENENV_REQUIRE", "").split(",") if w.strip()}
    if what in required or "all" in required:
        pytest.fail(f"{reason} (required here: OPENENV_REQUIRE={os.environ['OPENENV_REQUIRE']})")
    pytest.skip(reason)


def start_server(target: str, *args: str, max_sessions: int = 64) -> LocalProcessProvider:
    """A started server for `target`; `tests/` is importable by it, so `helpers:Thing` works."""
    path = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH", "")]))
    p = LocalProcessProvider(target, max_sessions=max_sessions, env_vars={"PYTHONPATH": path}, args=list(args))
    p.start()
    return p


@pytest.fixture(scope="session")
def echo_url():
    """Base URL of an echo server shared by the whole session (room for 300 sessions)."""
    p = start_server("echo", max_sessions=300)
    yield p.base_url
    p.stop()


@pytest.fixture
def server():
    """Factory: `server(target, *serve_args, max_sessions=N)` gives a base URL; stopped after the test."""
    started = []
    def make(target, *args, max_sessions=64):
        p = start_server(target, *args, max_sessions=max_sessions)
        started.append(p)
        return p.base_url
    yield make
    for p in started: p.stop()
