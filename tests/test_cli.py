"""The `openenv` command driven as a user drives it, in a temporary folder: init -> serve -> validate -> validate --url
-> push --dry-run (and build, under the docker flag), then every bad input on the way."""
import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest



OPENENV = [shutil.which("openenv")] if shutil.which("openenv") else [sys.executable, "-m", "openenv_nb.cli"]
NO_HF = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE"))}


def openenv(*args, cwd=None, timeout=120, env=None):
    return subprocess.run([*OPENENV, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=env or os.environ, stdin=subprocess.DEVNULL)


@contextlib.contextmanager
def serving(*args, cwd=None, timeout=30, env=None):
    """`openenv serve ARGS` in the background; yields its URL once `/health` answers, stops it after."""
    p = subprocess.Popen([*OPENENV, "serve", *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         stdin=subprocess.DEVNULL, process_group=0, env=env)
    try:
        deadline, url, seen = time.monotonic() + timeout, None, ""
        while url is None:
            line = p.stdout.readline()
            seen += line
            if not line or time.monotonic() > deadline: raise AssertionError(f"the server did not start:\n{seen}")
            if m := re.search(r"serving on (http://\S+)", line): url = m.group(1)
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1): break
            except OSError:
                if time.monotonic() > deadline: raise
                time.sleep(0.05)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError): os.killpg(p.pid, signal.SIGTERM)
        try: p.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL); p.wait()
        p.stdout.close()


def test_help_reads_well():
    r = openenv("--help")
    assert r.returncode == 0
    for cmd in ("init", "serve", "list", "validate", "replay", "build", "push", "demo"): assert re.search(rf"^\s+{cmd}\s+\w", r.stdout, re.M), cmd
    assert "the environment author's path:" in r.stdout and "openenv init my_env" in r.stdout
    for cmd in ("init", "serve", "list", "validate", "replay", "build", "push", "demo"):
        r = openenv(cmd, "--help")
        assert r.returncode == 0 and r.stdout.startswith(f"usage: openenv {cmd}"), r.stdout
        assert len(r.stdout.splitlines()[2]) > 20  # a description, not just the usage line
    assert re.match(r"openenv-nb \d", openenv("--version").stdout)


def test_the_authors_path(tmp_path):
    r = openenv("init", "maze_env", cwd=tmp_path)
    assert r.returncode == 0 and "Created maze_env" in r.stdout and "MazeEnvironment" in r.stdout, r.stdout + r.stderr
    r = openenv("validate", "maze_env", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.splitlines()[-1].startswith("PASSED"), r.stdout
    assert r.stderr.startswith("openenv: importing the code of project maze_env from "), r.stderr  # said before it imports
    with serving("maze_env", "--port", "0", cwd=tmp_path) as url:
        r = openenv("validate", "--url", url)
        assert r.returncode == 0 and r.stdout.splitlines()[-1] == "PASSED: 10 of 10 required checks", r.stdout
        with urllib.request.urlopen(f"{url}/metadata") as m: meta = json.load(m)
        assert (meta["name"], meta["version"], meta["readme_content"][:10]) == ("maze_env", "0.1.0", "# Maze Env")
        play = ("from maze_env import MazeAction, MazeEnv\n"
                f"with MazeEnv({url!r}).sync() as env:\n"
                "    r, lo, hi = env.reset(seed=5), 1, 100\n"
                "    while not r.done:\n"
                "        g = (lo + hi) // 2; r = env.step(MazeAction(guess=g))\n"
                "        lo, hi = (g + 1, hi) if r.observation.hint == 'higher' else (lo, g - 1)\n"
                "    print(r.observation.hint, r.reward)\n")
        r = subprocess.run([sys.executable, "-c", play], cwd=tmp_path / "maze_env", capture_output=True, text=True, timeout=60)
        assert r.stdout.split() == ["correct", "1.0"], r.stdout + r.stderr
    r = openenv("push", "maze_env", "--dry-run", cwd=tmp_path, env=NO_HF)
    assert r.returncode == 0 and "Nothing was uploaded (--dry-run)" in r.stdout, r.stdout + r.stderr
    staged = Path(re.search(r" in (\S+) \(", r.stdout).group(1))
    assert "sdk: docker" in (staged / "README.md").read_text() and (staged / "Dockerfile").is_file()
    shutil.rmtree(staged)


def test_serve_takes_a_project_its_manifest_and_a_module(tmp_path):
    r = openenv("init", "port_env", cwd=tmp_path)
    manifest = tmp_path / "port_env" / "openenv.yaml"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    manifest.write_text(manifest.read_text().replace("port: 8000", f"port: {port}"))
    with serving(str(manifest), cwd="/") as url:  # the manifest file itself, and its port
        assert url.endswith(f":{port}") and json.load(urllib.request.urlopen(f"{url}/metadata"))["name"] == "port_env"
    with serving("port_env.core:PortEnvironment", "--port", "0", cwd=tmp_path / "port_env") as url:  # from the current folder
        assert json.load(urllib.request.urlopen(f"{url}/schema"))["action"]["title"] == "PortAction"


def test_serve_max_message_size_sets_the_frame_and_body_limits():
    """`--max-message-size` is create_app's `max_message_size` (and so the default `--max-body`), as OPENENV_MAX_MESSAGE_SIZE."""
    from websockets.sync.client import connect
    with serving("echo", "--port", "0", "--max-message-size", "200") as url:
        with connect(url.replace("http", "ws", 1) + "/ws") as ws:
            ws.send(json.dumps({"type": "step", "data": {"message": "x" * 300}}))
            err = json.loads(ws.recv())
            assert err["type"] == "error" and "200" in err["data"]["message"], err
            ws.send(json.dumps({"type": "reset", "data": {}}))
            assert json.loads(ws.recv())["type"] == "observation"
        big = urllib.request.Request(f"{url}/step", data=json.dumps({"action": {"message": "x" * 300}}).encode(),
                                     headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e: urllib.request.urlopen(big)
        assert e.value.code == 413
        ok = urllib.request.Request(f"{url}/step", data=b'{"action": {"message": "hi"}}', headers={"Content-Type": "application/json"})
        assert json.load(urllib.request.urlopen(ok))["observation"]["echoed_message"] == "hi"
    r = openenv("serve", "echo", "--port", "0", "--max-message-size", "0", timeout=60)
    assert r.returncode == 2 and "must be a whole number of at least 1" in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("name,why", [
    ("my-env", "is not a valid Python identifier"), ("9lives", "is not a valid Python identifier"),
    ("import", "is a Python keyword"), ("_hidden", "starts with an underscore"), ("json", "already has"), ("", "empty")])
def test_init_refuses_bad_names(tmp_path, name, why):
    r = openenv("init", name, cwd=tmp_path)
    assert r.returncode != 0 and why in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == []


def test_init_refuses_a_target_in_use_and_writes_nothing(tmp_path):
    (tmp_path / "taken").mkdir(); (tmp_path / "taken" / "notes.txt").write_text("mine")
    (tmp_path / "afile").write_text("x")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    for args, why in [(["taken"], "exists and is not empty"), (["afile"], "is a file"),
                      (["x_env", "-o", "afile"], "is a file, not a folder"), (["y_env", "-o", "afile/deeper"], "is a file, not a folder")]:
        r = openenv("init", *args, cwd=tmp_path)
        assert r.returncode == 1 and why in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"


def test_init_takes_an_empty_folder_and_makes_missing_parents(tmp_path):
    (tmp_path / "empty_env").mkdir()
    assert openenv("init", "empty_env", cwd=tmp_path).returncode == 0
    assert openenv("init", "deep_env", "-o", "a/b/c", cwd=tmp_path).returncode == 0
    assert (tmp_path / "empty_env" / "openenv.yaml").is_file() and (tmp_path / "a/b/c/deep_env/openenv.yaml").is_file()
    assert not [p for p in tmp_path.rglob(".*.partial")]


def test_serve_explains_bad_targets(tmp_path):
    (tmp_path / "no_manifest").mkdir()
    (tmp_path / "bad_yaml").mkdir(); (tmp_path / "bad_yaml" / "openenv.yaml").write_text("name: [oops\n")
    (tmp_path / "bad_app").mkdir(); (tmp_path / "bad_app" / "openenv.yaml").write_text("name: bad_app\napp: nowhere.mod:Env\n")
    for target, why in [("nonsense", "unknown target 'nonsense'"), ("no_manifest", "has no openenv.yaml"),
                        ("bad_yaml", "is not valid YAML"), ("bad_app", "Cannot import 'nowhere.mod'"),
                        ("openenv_nb.envs.echo:Nope", "has no attribute 'Nope'")]:
        r = openenv("serve", target, "--port", "0", cwd=tmp_path, timeout=60)
        assert r.returncode == 1 and why in r.stderr and "Traceback" not in r.stderr, (target, r.stderr)


def one_line(r, *parts):
    "`r` failed with one line on stderr that holds each of `parts`, and no traceback."
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and all(x in r.stderr for x in parts), r.stderr


def test_the_first_errors_are_one_line_with_a_hint():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); s.listen(); port = str(s.getsockname()[1])
        one_line(openenv("serve", "echo", "--port", port), f"127.0.0.1:{port} is in use", "--port")
    one_line(openenv("serve", "echo", "--port", "99999"), "--port 99999 is not a port", "1 to 65535")
    one_line(openenv("validate", "--url", f"http://127.0.0.1:{port}"), f"nothing answers at http://127.0.0.1:{port}",
             "is the server running?")


@pytest.mark.parametrize("target,near,listing", [
    ("gym:Cartpole-v1", "did you mean CartPole-v1", "openenv list gym"),
    ("openspiel:tictactoe", "did you mean tic_tac_toe", "openenv list openspiel"),
    ("textarena:Wordle-v9", "did you mean Wordle-v0", "openenv list textarena"),
    ("reasoning_gym:leg_countin", "did you mean leg_counting", "openenv list reasoning_gym")])
def test_unknown_names_in_a_family_say_the_nearest_and_how_to_list_them(target, near, listing):
    family = target.partition(":")[0]
    try: __import__({"gym": "gymnasium", "openspiel": "pyspiel"}.get(family, family))
    except ImportError: pytest.skip(f"needs the {family} extra: pip install -e '.[{family}]'")
    one_line(openenv("serve", target, "--port", "0", timeout=120), near, listing)
    r = openenv("list", family)
    assert r.returncode == 0 and f"{family}:{near.split()[-1]}" in r.stdout.split(), r.stdout[-500:]


def test_serve_and_validate_take_the_names_that_list_shows(tmp_path):
    """An installed package's entry point and a short name are targets, as `AutoEnv.from_name` takes them."""
    dist = tmp_path / "site" / "maze_envs-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: maze-envs\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[openenv_nb.envs]\nmaze = openenv_nb.envs.echo:EchoEnvironment\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(dist.parent), os.environ.get("PYTHONPATH")]))}
    assert "maze" in [e["name"] for e in json.loads(openenv("list", "--json", env=env).stdout)]
    with serving("maze", "--port", "0", cwd=tmp_path, env=env) as url:
        assert json.load(urllib.request.urlopen(f"{url}/schema"))["action"]["title"] == "EchoAction"
    r = openenv("validate", "maze", "--json", cwd=tmp_path, env=env)
    assert r.returncode == 0 and json.loads(r.stdout)["environment"] == "maze", r.stdout + r.stderr
    r = openenv("serve", "maze", "--port", "0", cwd=tmp_path)  # not installed in this environment: named nowhere
    assert r.returncode == 1 and "not a name that `openenv list` shows" in r.stderr, r.stderr
    if importlib.util.find_spec("gymnasium"):
        with serving("cartpole", "--port", "0", cwd=tmp_path) as url:
            assert json.load(urllib.request.urlopen(f"{url}/metadata"))["name"] == "gym:CartPole-v1", url
    else:
        assert 'pip install "openenv-nb[gym]"' in openenv("serve", "cartpole", "--port", "0").stderr

def test_a_builtin_name_that_is_also_a_project_here_is_refused(tmp_path):
    """`echo` with an ./echo project: neither is the obvious meaning, so both are named, and how to say each."""
    (tmp_path / "echo").mkdir(); (tmp_path / "echo" / "openenv.yaml").write_text("name: my_echo\napp: nowhere.mod:Env\n")
    r = openenv("serve", "echo", "--port", "0", cwd=tmp_path, timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "'echo' names both the built-in environment and the project here (echo/openenv.yaml)" in r.stderr, r.stderr
    assert "say ./echo for the project, or openenv_nb.envs.echo:EchoEnvironment for the environment" in r.stderr
    r = openenv("serve", "./echo", "--port", "0", cwd=tmp_path, timeout=60)  # the project, named as the message says
    assert r.returncode == 1 and "Cannot import 'nowhere.mod'" in r.stderr, r.stderr


def test_validate_says_it_will_import_the_project_before_it_does(tmp_path):
    """The project's code runs when imported, so the line comes first; a folder without a manifest imports nothing."""
    (tmp_path / "loud").mkdir()
    (tmp_path / "loud" / "openenv.yaml").write_text("name: loud\napp: loud_env:Env\n")
    (tmp_path / "loud" / "loud_env.py").write_text("import sys\nprint('loud_env imported', file=sys.stderr, flush=True)\n")
    r = openenv("validate", "loud", "--json", cwd=tmp_path)
    lines = r.stderr.splitlines()
    assert lines[0].startswith("openenv: importing the code of project loud from ") and "(loud_env:Env" in lines[0], r.stderr
    assert lines[1] == "loud_env imported", r.stderr
    assert json.loads(r.stdout)["summary"]["failed_criteria"][0] == "app_importable"  # stdout stays JSON
    r = openenv("validate", str(tmp_path))
    assert "importing" not in r.stderr and r.returncode == 1


def test_validate_a_broken_project(tmp_path):
    r = openenv("validate", str(tmp_path))
    assert r.returncode == 1 and re.search(r"FAIL\s+manifest", r.stdout) and "openenv init" in r.stdout, r.stdout
    report = json.loads(openenv("validate", str(tmp_path), "--json").stdout)
    assert (report["passed"], report["validation_type"], report["summary"]["failed_criteria"][0]) == (False, "local_environment", "manifest")
    r = openenv("validate", ".", "--url", "http://127.0.0.1:9")
    assert r.returncode == 1 and "not both" in r.stderr
    r = openenv("validate", "--url", "http://127.0.0.1:9", "--timeout", "0")
    assert r.returncode == 1 and "--timeout" in r.stderr


def test_build_and_push_explain_bad_inputs(tmp_path):
    (tmp_path / "openenv.yaml").write_text("name: x\n")
    r = openenv("build", str(tmp_path))
    assert r.returncode == 1 and "app: Field required" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = openenv("build", str(tmp_path), "--build-arg", "NOEQUALS")
    assert r.returncode == 1 and "KEY=VALUE" in r.stderr
    r = openenv("push", str(tmp_path), "--dry-run", env=NO_HF)
    assert r.returncode == 1 and "app: Field required" in r.stderr


@pytest.mark.docker
def test_build_runs_and_validates_a_new_project(tmp_path, docker_engine):
    from openenv_nb.providers import DockerProvider
    client, env = docker_engine, dict(os.environ)
    assert openenv("init", "boxed_env", cwd=tmp_path).returncode == 0
    tag = "openenv-boxed_env:test"
    r = openenv("build", "boxed_env", "-t", tag, cwd=tmp_path, env=env, timeout=900)
    assert r.returncode == 0 and f"built {tag}" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    try:
        from openenv_nb.validate import validate_url
        with DockerProvider(tag) as p:
            report = validate_url(p.base_url, timeout=10)
            assert report["passed"], report["summary"]
    finally:
        with contextlib.suppress(Exception): client.images.remove(tag, force=True)


from argparse import Namespace  # noqa: E402

from openenv_nb.envs.echo import EchoEnvironment  # noqa: E402


class Sized(EchoEnvironment):
    "A class that derives its own capacity, as the coding environment does from its memory cap."
    @classmethod
    def default_max_sessions(cls): return 5


class Lone(EchoEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = False


@pytest.mark.parametrize("cls, env, want", [(EchoEnvironment, None, 64), (Sized, None, 5), (Lone, None, 1),
                                            (EchoEnvironment, "7", 7), (Sized, "7", 7), (Lone, "7", 1)])
def test_capacity_is_decided_once(cls, env, want, monkeypatch):
    "`create_app`, `targets.app_for` and `openenv serve` serve the same capacity: `server.capacity`'s."
    from openenv_nb.cli import _app_and_port
    from openenv_nb.server import create_app
    from openenv_nb.targets import app_for
    if env is None: monkeypatch.delenv("MAX_CONCURRENT_ENVS", raising=False)
    else: monkeypatch.setenv("MAX_CONCURRENT_ENVS", env)
    cli = _app_and_port(Namespace(target=f"test_cli:{cls.__name__}", max_sessions=None, session_timeout=0, web=False, port=0))[0]
    got = [create_app(cls).state.hub.max_sessions, app_for(cls).state.hub.max_sessions, cli.state.hub.max_sessions]
    assert got == [want] * 3
    ask = [lambda: create_app(cls, max_sessions=3), lambda: app_for(cls, max_concurrent_envs=3),
           lambda: _app_and_port(Namespace(target=f"test_cli:{cls.__name__}", max_sessions=3, session_timeout=0, web=False, port=0))[0]]
    if cls is Lone:  # asked for more than it declares: refused alike
        from openenv_nb.server import ConcurrencyError
        for make in ask:
            with pytest.raises(ConcurrencyError): make()
    else: assert [make().state.hub.max_sessions for make in ask] == [3] * 3
