"""OpenEnv's own environments (its echo, an `MCPEnvironment` with fastmcp tools, and its Connect Four, a plain
`Environment`), served natively by `openenv serve module:Class` (no shim: `server.create_app` bridges them, see
`upstream`), pass OpenEnv's own client tests: `TestEchoEnvironment` and `TestConnect4Environment` of its
`tests/envs/test_websockets.py`, run unchanged in the upstream venv, whose `run_server` is pointed at our
`openenv serve` of the environment class instead of uvicorn on OpenEnv's app.

The environments and the test file are read from the OpenEnv checkout named by `$OPENENV_UPSTREAM_SRC` (as
`test_upstream_suite.py` reads it: PyPI's `openenv` has neither); elsewhere this skips (or fails where
OPENENV_REQUIRE names `upstream-src`)."""
import os
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, need

pytestmark = pytest.mark.upstream

FILES = ["envs/echo_env/server/echo_environment.py", "envs/connect4_env/server/connect4_environment.py",
         "tests/envs/test_websockets.py"]
TESTS = ["tests/envs/test_websockets.py::TestEchoEnvironment", "tests/envs/test_websockets.py::TestConnect4Environment"]

PLUGIN = r'''
import contextlib, os, subprocess, sys, time
import requests

TARGETS = {"envs.echo_env.server.app": "envs.echo_env.server.echo_environment:EchoEnvironment",
           "envs.connect4_env.server.app": "envs.connect4_env.server.connect4_environment:Connect4Environment"}
SERVED = []


@contextlib.contextmanager
def run_server(module_path, port=8000, startup_timeout=10.0, env_vars=None):
    "OpenEnv's `run_server`, serving the environment class of `module_path`'s app with `openenv serve`."
    env = {**os.environ, **(env_vars or {})}
    p = subprocess.Popen([sys.executable, "-m", "openenv_nb.cli", "serve", TARGETS[module_path], "--host",
                          "127.0.0.1", "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200: break
            except requests.exceptions.ConnectionError: pass
            if p.poll() is not None or time.monotonic() > deadline:
                p.kill(); raise RuntimeError(f"openenv serve {TARGETS[module_path]} did not start: {p.stderr.read().decode()[-3000:]}")
            time.sleep(0.2)
        SERVED.append(TARGETS[module_path])
        yield p
    finally:
        p.terminate()
        try: p.wait(10)
        except subprocess.TimeoutExpired: p.kill(); p.wait()


def pytest_collection_finish(session):
    for item in session.items:
        if hasattr(item.module, "run_server"): item.module.run_server = run_server


def pytest_sessionfinish(session):
    print("SERVED", sorted(set(SERVED)))
'''


@pytest.fixture(scope="module")
def upstream_src() -> Path:
    src = Path(os.environ.get("OPENENV_UPSTREAM_SRC", "/nonexistent"))
    need("upstream-src", all((src / f).exists() for f in FILES),
         f"$OPENENV_UPSTREAM_SRC names no OpenEnv checkout with {', '.join(FILES)}")
    return src


def test_upstream_echo_and_connect4_pass_their_client_tests_on_openenv_serve(upstream_py, upstream_src, tmp_path):
    (tmp_path / "ours_serve.py").write_text(PLUGIN)
    env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), str(upstream_src)])}
    for k in ("OPENENV_SHIM", "OPENENV_MODE", "MAX_CONCURRENT_ENVS", "OPENENV_TOKEN", "PYTEST_ADDOPTS"): env.pop(k, None)
    r = subprocess.run([upstream_py, "-m", "pytest", "-p", "ours_serve", "-p", "no:cacheprovider", "-o", "addopts=",
                        "-q", "-s", *TESTS], cwd=upstream_src, env=env, capture_output=True, text=True, timeout=400)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "4 passed" in out, out[-5000:]
    assert "SERVED ['envs.connect4_env.server.connect4_environment:Connect4Environment', " \
           "'envs.echo_env.server.echo_environment:EchoEnvironment']" in out, out[-3000:]
