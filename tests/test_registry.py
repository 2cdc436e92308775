"""Environments by name and from the Hub, driven as a user drives them: `openenv serve` of each family, `openenv list`
with a package's entry point, `AutoEnv.from_name` on the local default and in a container, and `AutoEnv.from_hub`
against the stand-in Hub (`hub_standin.py`, reached with HF_ENDPOINT) holding a project that `openenv push` put there.
Hub clients run in processes of their own with an empty HF_HOME, so no real credentials or cache are read."""
import importlib.util
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from conftest import need, start_server
from hub_standin import TOKEN
from openenv_nb.client import GenericEnvClient
from openenv_nb.providers import LocalProcessProvider
from openenv_nb.registry import AutoEnv
from openenv_nb.scaffold import init_project
from openenv_nb.targets import FAMILIES, TargetError
from openenv_nb.types import EnvConnectionError

OPENENV = [sys.executable, "-m", "openenv_nb.cli"]
PACKAGES = {"gym": "gymnasium", "openspiel": "pyspiel", "textarena": "textarena", "chess": "chess",
            "reasoning_gym": "reasoning_gym"}  # family -> its package
EPISODES = {  # family -> a target, and an action it takes (Wordle given its words: NLTK's are a download)
    "gym": ("gym:CartPole-v1", {"action": 0}, "obs"),
    "openspiel": ("openspiel:catch", {"action_id": 1}, "legal_actions"),
    "textarena": ('textarena:Wordle-v0?words=["crane","slate"]', {"message": "[crane]"}, "prompt"),
    "chess": ("chess", {"move": "e2e4"}, "fen"),
    "reasoning_gym": ("reasoning_gym:leg_counting", {"answer": "4"}, "question"),
}
HF_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", "HF_HOME", "HF_ENDPOINT", "HF_HUB_OFFLINE", "OPENENV_TOKEN")


def run(args, env=None, timeout=180):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env or os.environ, stdin=subprocess.DEVNULL)


def need_family(family: str):
    """Skip, naming the extra, where `family`'s package is not installed (fail where OPENENV_REQUIRE names it)."""
    need(family, importlib.util.find_spec(PACKAGES[family]) is not None,
         f'the {family} family needs {PACKAGES[family]}: pip install "openenv-nb[{family}]"')


# -- families --------------------------------------------------------------------------------------------------------

def test_no_family_package_is_imported_until_asked():
    code = ("import sys, openenv_nb.cli, openenv_nb.registry, openenv_nb.targets\n"
            f"print(sorted(m for m in {(*PACKAGES.values(), 'huggingface_hub')!r} if m in sys.modules))")
    r = run([sys.executable, "-c", code])
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_missing_extra_names_the_pip_command(family):
    """The package hidden (`None` in `sys.modules` makes importing it fail as if it were not installed)."""
    code = (f"import sys; sys.modules[{PACKAGES[family]!r}] = None\n"
            f"from openenv_nb.cli import main; sys.exit(main(['serve', {EPISODES[family][0]!r}, '--port', '0']))")
    r = run([sys.executable, "-c", code])
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert f'openenv serve: {family} environments need {PACKAGES[family]}, which is not installed: pip install "openenv-nb[{family}]"' in r.stderr


@pytest.mark.parametrize("family", list(FAMILIES))
def test_openenv_serve_takes_each_family(family):
    need_family(family)
    target, action, field = EPISODES[family]
    p = start_server(target, max_sessions=2)
    try:
        with GenericEnvClient(p.base_url).sync() as env:
            assert field in env.reset(seed=0).observation
            r = env.step(action)
            assert field in r.observation and r.reward is not None, r
    finally: p.stop()


def test_a_family_target_that_names_nothing():
    need_family("gym")
    for target, why in [("gym", "gym needs a name after a colon, e.g. gym:NAME"), ("gym:NoSuchEnv-v0", "gym:NoSuchEnv-v0: ")]:
        r = run([*OPENENV, "serve", target, "--port", "0"])
        assert r.returncode == 1 and why in r.stderr and "Traceback" not in r.stderr, (target, r.stderr)


# -- the list, and names ---------------------------------------------------------------------------------------------

@pytest.fixture
def site(tmp_path):
    """A folder holding an installed package's metadata, as pip leaves it: two entry points, one of them broken."""
    info = tmp_path / "demo_envs-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: demo-envs\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[openenv_nb.envs]\ntiny = tiny_env:TinyEnvironment\nbroken = demo_envs_gone:Env\n")
    (tmp_path / "tiny_env.py").write_text(
        "from openenv_nb.envs.echo import EchoEnvironment\n\n"
        "class TinyEnvironment(EchoEnvironment):\n    'A tiny echo, declared by an entry point.'\n")
    return tmp_path


def test_openenv_list_shows_builtins_families_and_packages(site):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    r = run([*OPENENV, "list", "--json"], env=env)
    assert r.returncode == 0, r.stderr
    listed = {e["name"]: e for e in json.loads(r.stdout)}
    assert {"echo", "coding", "gym:ID", "openspiel:GAME", "textarena:ID", "chess", "wordle", "tiny", "broken"} <= set(listed)
    assert listed["tiny"] == {"name": "tiny", "target": "tiny_env:TinyEnvironment", "source": "demo-envs 0.1",
                              "description": "A tiny echo, declared by an entry point.", "action": {"message": "string"}, "problem": None}
    assert listed["broken"]["problem"].startswith("Cannot import 'demo_envs_gone'")
    assert (listed["echo"]["source"], listed["gym:ID"]["source"]) == ("built-in", "openenv-nb[gym]")
    for family in FAMILIES:  # each family's row loads its example, which needs no download, where its package is
        row = next(e for e in listed.values() if e["source"] == f"openenv-nb[{family}]")
        assert bool(row["action"]) == (importlib.util.find_spec(PACKAGES[family]) is not None), row
    assert listed["wordle"]["action"] or "NLTK" in listed["wordle"]["problem"], listed["wordle"]  # Wordle reads NLTK's words
    table = run([*OPENENV, "list"], env=env).stdout.splitlines()
    assert table[0].split() == ["NAME", "FROM", "ACTION", "DESCRIPTION"]
    assert any(l.split()[:3] == ["tiny", "demo-envs", "0.1"] for l in table), table
    assert any(l.startswith("broken") and "unavailable: Cannot import 'demo_envs_gone'" in l for l in table), table


@pytest.mark.parametrize("name,action,seen", [("echo", {"message": "hi"}, lambda o: o["echoed_message"] == "hi"),
                                              ("tiny", {"message": "hi"}, lambda o: o["echoed_message"] == "hi"),
                                              ("cartpole", {"action": 1}, lambda o: len(o["obs"]) == 4)])
def test_from_name_on_the_local_default(site, monkeypatch, name, action, seen):
    if name == "cartpole": need_family("gym")
    monkeypatch.syspath_prepend(str(site))  # the package is installed, here and for the server it starts
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    with AutoEnv.from_name(name).sync() as env:
        env.reset(seed=1)
        r = env.step(action)
        assert seen(r.observation), r


def test_from_name_of_nothing():
    with pytest.raises(TargetError, match="no environment is called 'nope' here: `openenv list` shows those there are"):
        AutoEnv.from_name("nope")


@pytest.mark.docker
def test_from_name_in_a_container(docker_engine):
    from openenv_nb.images import build
    build("echo", log=lambda line: None)  # the image `openenv build echo` makes; its layers are cached
    with AutoEnv.from_name("echo", provider="docker").sync() as env:
        assert env._provider.image == "openenv-echo:latest"
        env.reset()
        assert env.step({"message": "boxed"}).observation["echoed_message"] == "boxed"


@pytest.mark.docker
def test_from_name_serves_a_family_member_from_the_family_image(docker_engine):
    "`openenv build chess` makes one image for the family; `OPENENV_TARGET` tells the container which member to serve."
    from openenv_nb.images import build
    build("chess", log=lambda line: None)
    target = "chess:opponent=none&svg=false"
    with AutoEnv.from_name(target, provider="docker").sync() as env:
        assert (env._provider.image, env._provider.env_vars["OPENENV_TARGET"]) == ("openenv-chess:latest", target)
        env.reset(seed=0)
        r = env.step({"move": "e2e4"})
        assert r.observation["opponent_move"] is None and r.observation["frame"] is None, r  # the options reached the server
        assert r.observation["fen"].split()[1] == "b"  # no opponent replied: Black to move


# -- the Hub ---------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hub():
    """Base URL of the stand-in Hub."""
    p = start_server("hub_standin:app")
    yield p.base_url
    p.stop()


def hf_env(hub, home, token=None) -> dict:
    """This environment without Hugging Face settings, but the stand-in, an empty HF_HOME, and `token` if given."""
    env = {k: v for k, v in os.environ.items() if k not in HF_VARS}
    env.update(HF_HOME=str(home), HF_ENDPOINT=hub, HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1",
               NO_PROXY="127.0.0.1,localhost")
    return {**env, "HF_TOKEN": token} if token else env


def hub_state(hub) -> dict:
    with urllib.request.urlopen(f"{hub}/_calls", timeout=10) as r: return json.load(r)


def set_space(hub, repo_id, **fields):
    """The tests' own route of the stand-in: where the Space's app answers, its stage, or its files."""
    req = urllib.request.Request(f"{hub}/_spaces/{repo_id}", data=json.dumps(fields).encode(), method="PUT",
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=10).close()


@pytest.fixture(scope="module")
def pushed(hub, tmp_path_factory):
    """A project pushed with `openenv push`: public as alice/space_env, private as my-org/private_env."""
    proj, home = init_project("space_env", tmp_path_factory.mktemp("proj"), log=None), tmp_path_factory.mktemp("home")
    for args in ([], ["--repo-id", "my-org/private_env", "--private"]):
        r = run([*OPENENV, "push", str(proj), *args], env=hf_env(hub, home, TOKEN))
        assert r.returncode == 0, r.stdout + r.stderr
    return proj


EPISODE = """import json, sys
from openenv_nb.registry import AutoEnv, SpaceError, download_space
kw = json.loads(sys.argv[1])
try:
    with AutoEnv.from_hub(**kw).sync() as env:
        env.reset(seed=3)
        r = env.step({"guess": 50})
        out = {"url": env.base_url, "observation": r.observation}
    if kw.get("local"):
        d = download_space(kw["repo_id"])
        out["files"] = sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())
except SpaceError as e: out = {"error": str(e)}
print(json.dumps(out))
"""


def from_hub(hub, home, token=None, **kwargs) -> dict:
    """`AutoEnv.from_hub(**kwargs)` in a process of its own, one guess played: what it saw, or its `SpaceError`."""
    r = run([sys.executable, "-c", EPISODE, json.dumps(kwargs)], env=hf_env(hub, home, token))
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.splitlines()[-1])


def test_a_pushed_project_comes_back_and_runs_here(hub, pushed, tmp_path):
    out = from_hub(hub, tmp_path, repo_id="alice/space_env", local=True, trust_remote_code=True)
    assert out["url"].startswith("http://127.0.0.1:") and out["observation"]["hint"] in ("higher", "lower", "correct"), out
    pushed_files = hub_state(hub)["repos"]["alice/space_env"]["files"]
    assert out["files"] == sorted(pushed_files)  # push and from_hub agree on what the Space holds


def test_running_its_code_here_needs_trust(hub, pushed, tmp_path):
    before = len(hub_state(hub)["calls"])
    out = from_hub(hub, tmp_path, repo_id="alice/space_env", local=True)
    assert out["error"] == ("Space alice/space_env would run its own code on this machine (openenv.yaml app: "
                            "space_env.core:SpaceEnvironment); if you trust it, pass trust_remote_code=True"), out
    fetched = [c["path"] for c in hub_state(hub)["calls"][before:] if "/resolve/" in c["path"] or "/tree/" in c["path"]]
    assert fetched and all(p.endswith("/resolve/main/openenv.yaml") for p in fetched), fetched  # only the manifest came
    assert not list(tmp_path.rglob("*.py"))


def test_connecting_to_the_running_space(hub, pushed, tmp_path):
    app = start_server(str(pushed))  # the Space's app, as the Hub would run it
    try:
        set_space(hub, "alice/space_env", host=app.base_url)
        out = from_hub(hub, tmp_path, repo_id="alice/space_env")
        assert out["url"] == app.base_url and out["observation"]["hint"] in ("higher", "lower", "correct"), out
        set_space(hub, "alice/space_env", stage="RUNTIME_ERROR")
        out = from_hub(hub, tmp_path, repo_id="alice/space_env")
        assert out["error"].startswith("Space alice/space_env is not running (RUNTIME_ERROR)") and "local=True" in out["error"], out
    finally:
        set_space(hub, "alice/space_env", host=None, stage="RUNNING")
        app.stop()


HEADERS = """import json
from openenv_nb.registry import AutoEnv
print(json.dumps({r: AutoEnv.from_hub(r).headers for r in ("my-org/private_env", "alice/space_env")}))
"""


def test_a_private_space_needs_its_token_and_gets_it(hub, pushed, tmp_path, monkeypatch):
    out = from_hub(hub, tmp_path, repo_id="my-org/private_env")  # no token
    assert out["error"].startswith("no Space my-org/private_env on the Hub, or it is private and no token"), out
    r = run([sys.executable, "-c", HEADERS], env=hf_env(hub, tmp_path, TOKEN))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1]) == {"my-org/private_env": {"Authorization": f"Bearer {TOKEN}"},
                                                     "alice/space_env": {}}  # a public Space's app is never sent the token
    monkeypatch.delenv("OPENENV_TOKEN", raising=False)
    app = LocalProcessProvider(str(pushed), env_vars={"OPENENV_TOKEN": TOKEN})  # lets in only the token's holders, as the Hub does
    app.start()
    try:
        with pytest.raises(EnvConnectionError): GenericEnvClient(app.base_url).sync().connect()
        set_space(hub, "my-org/private_env", host=app.base_url)
        out = from_hub(hub, tmp_path, TOKEN, repo_id="my-org/private_env")
        assert out["url"] == app.base_url and out["observation"]["hint"] in ("higher", "lower", "correct"), out
    finally:
        set_space(hub, "my-org/private_env", host=None)
        app.stop()


BOTH_TOKENS = """import json
from openenv_nb.registry import AutoEnv
print(json.dumps([AutoEnv.from_hub("my-org/private_env", server_token="srv").headers, AutoEnv.from_hub("my-org/private_env").headers,
                  AutoEnv.from_hub("alice/space_env", server_token="srv").headers]))
"""


def test_a_private_space_whose_server_has_a_token_too(hub, pushed, tmp_path, monkeypatch):
    """The Hub's token opens the Space (`Authorization`), the server's own goes beside it (`X-OpenEnv-Token`)."""
    r = run([sys.executable, "-c", BOTH_TOKENS], env={**hf_env(hub, tmp_path, TOKEN), "OPENENV_TOKEN": "from-env"})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1]) == [{"Authorization": f"Bearer {TOKEN}", "X-OpenEnv-Token": "srv"},
                                                     {"Authorization": f"Bearer {TOKEN}", "X-OpenEnv-Token": "from-env"},
                                                     {"Authorization": "Bearer srv"}]  # a public Space: the server's token alone
    monkeypatch.delenv("OPENENV_TOKEN", raising=False)
    app = LocalProcessProvider(str(pushed), env_vars={"OPENENV_TOKEN": "srv"})  # the Space's secret; the Hub's door is not modelled
    app.start()
    try:
        set_space(hub, "my-org/private_env", host=app.base_url)
        out = from_hub(hub, tmp_path, TOKEN, repo_id="my-org/private_env", server_token="srv")
        assert out["url"] == app.base_url and out["observation"]["hint"] in ("higher", "lower", "correct"), out
    finally:
        set_space(hub, "my-org/private_env", host=None)
        app.stop()

def test_spaces_that_are_not_environments(hub, tmp_path):
    set_space(hub, "alice/plain", files={"README.md": "# just a page\n"})
    assert from_hub(hub, tmp_path, repo_id="alice/plain")["error"] == \
        "Space alice/plain holds no openenv.yaml, so it is not an OpenEnv environment (`openenv push` puts one there)"
    assert from_hub(hub, tmp_path, repo_id="alice/nothing")["error"].startswith("no Space alice/nothing on the Hub")
