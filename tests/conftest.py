"""Shared fixtures: real servers in subprocesses, and skips that CI turns into failures."""
import os
import shutil
from pathlib import Path

import pytest

from openenv_nb.providers import LocalProcessProvider, docker_client
from upstream_venv import upstream_python_why

HERE = Path(__file__).parent
ROOT = HERE.parent


def need(what: str, ok: bool, reason: str):
    """Skip unless `ok`; fail instead when `what` is listed in OPENENV_REQUIRE (as `.ci/run` sets it)."""
    if ok: return
    required = {w.strip() for w in os.environ.get("OPENENV_REQUIRE", "").split(",") if w.strip()}
    if what in required or "all" in required:
        pytest.fail(f"{reason} (required here: OPENENV_REQUIRE={os.environ['OPENENV_REQUIRE']})")
    pytest.skip(reason)


TRL_INSTALL = ("pip install torch --index-url https://download.pytorch.org/whl/cpu && pip install -e '.[trl]' "
               "(the CPU build of torch first: a plain install takes a CUDA build of several GB)")


def need_trl():
    "Skip unless TRL, transformers and torch import (the `trl` extra), saying how to install them; fail where required."
    import importlib.util
    missing = [m for m in ("trl", "transformers", "torch") if importlib.util.find_spec(m) is None]
    need("trl", not missing, f"needs the trl extra ({', '.join(missing)} missing): {TRL_INSTALL}")


@pytest.fixture(scope="session")
def upstream_py() -> str:
    """The python of the venv with openenv 0.10.0, for the tests that run upstream's clients and servers."""
    py, why = upstream_python_why()
    need("upstream", py is not None, why)
    return py


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


LOCAL_BASE = "openenv-nb/base:py3.11"  # the local Python base image CI builds where no registry can be reached
CHROMIUM = os.environ.get("OPENENV_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


def need_browser():
    """Playwright's `sync_playwright` and Chromium at `CHROMIUM` (else skip with the command that installs what is
    missing, or fail where required); never a browser download."""
    try: from playwright.sync_api import sync_playwright
    except ImportError: sync_playwright = None
    why = ("needs Playwright for Python: pip install -e '.[dev]'" if sync_playwright is None else
           f"needs Chromium at {CHROMIUM}: sudo apt-get install chromium (or set OPENENV_CHROMIUM to its path)")
    need("browser", sync_playwright is not None and os.path.exists(CHROMIUM), why)
    return sync_playwright


@pytest.fixture(scope="session")
def docker_engine():
    """A Docker SDK client to a running engine (else skip, or fail where required); sets the local base image when
    OPENENV_BASE_IMAGE is unset and one was built, since no registry can be reached here."""
    try:
        client = docker_client(); client.ping()
    except Exception as e: client, why = None, f"no Docker engine: start one (e.g. sudo systemctl start docker) and run again ({e})"
    need("docker", client is not None, client is None and why)
    if not os.environ.get("OPENENV_BASE_IMAGE"):
        try:
            client.images.get(LOCAL_BASE)
            os.environ["OPENENV_BASE_IMAGE"] = LOCAL_BASE
        except Exception: pass
    return client
