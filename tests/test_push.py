"""`openenv push` through the real `huggingface_hub` code path, against a stand-in for the Hub on this machine
(`hub_standin.py`, reached with HF_ENDPOINT), which records the calls and keeps the files committed. No real
credentials are read: every run gets an empty HF_HOME, and a token only where a test gives one. Options the command
line does not have yet are driven through the library's `push`, in a process of its own all the same."""
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from conftest import start_server
from hub_standin import TOKEN
from openenv_nb.push import front_matter
from openenv_nb.scaffold import init_project

HF_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", "HF_HOME", "HF_ENDPOINT", "HF_HUB_OFFLINE", "OPENENV_TOKEN")


@pytest.fixture(scope="module")
def hub():
    """Base URL of the stand-in Hub."""
    p = start_server("hub_standin:app")
    yield p.base_url
    p.stop()


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return init_project("space_env", tmp_path_factory.mktemp("proj"), log=None)


def _env(hub, token, home, more=None) -> dict:
    """This environment without Hugging Face settings, but for those given here."""
    env = {k: v for k, v in os.environ.items() if k not in HF_VARS}
    env.update(HF_HOME=str(home), HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1", NO_PROXY="127.0.0.1,localhost")
    if hub: env["HF_ENDPOINT"] = hub
    if token: env["HF_TOKEN"] = token
    return {**env, **(more or {})}


def push(*args, hub=None, token=None, home, cwd=None):
    """`openenv push ARGS` with only the Hugging Face settings given here."""
    return subprocess.run([sys.executable, "-m", "openenv_nb.cli", "push", *args], capture_output=True, text=True,
                          timeout=180, env=_env(hub, token, home), cwd=cwd)


def push_lib(path, hub=None, token=None, home=None, env=None, **kwargs):
    """`openenv_nb.push.push(path, **kwargs)` in a process of its own, with only the settings given here."""
    code = "import json, sys; from openenv_nb.push import push; push(sys.argv[1], **json.loads(sys.argv[2]))"
    return subprocess.run([sys.executable, "-c", code, str(path), json.dumps(kwargs)], capture_output=True, text=True,
                          timeout=180, env=_env(hub, token, home, env))


@pytest.fixture
def leaky(tmp_path):
    """A project holding every kind of file that must not leave the machine, and links to the author's home."""
    proj, home = init_project("leaky_env", tmp_path / "work", log=None), tmp_path / "home"
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "credentials").write_text("aws_secret_access_key = HOME-SECRET")
    for f in (".aws/credentials", ".ssh/id_rsa", ".ssh/id_ed25519", ".git-credentials", ".npmrc", "prod.env", ".env.local",
              "secrets.json", "certs/client.p12", "wandb/settings", "deploy.pem", "tls.key", ".netrc", ".pypirc"):
        (proj / f).parent.mkdir(parents=True, exist_ok=True)
        (proj / f).write_text("PROJECT-SECRET")
    (proj / ".gitignore").write_text("secrets.json\n")  # ignore files older than those `openenv init` writes now, which list
    (proj / ".dockerignore").write_text(".git\n")       # most of these: the .gitignore lists one, as in the report
    (proj / "creds").symlink_to(home / ".aws" / "credentials")
    (proj / "home_aws").symlink_to(home / ".aws")
    return proj


def recorded(hub) -> dict:
    with urllib.request.urlopen(f"{hub}/_calls", timeout=10) as r: return json.load(r)


def test_push_creates_the_space_and_uploads_it(hub, project, tmp_path):
    r = push(str(project), hub=hub, token=TOKEN, home=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"Pushed space_env 0.1.0 to {hub}/spaces/alice/space_env" in r.stdout
    lines = r.stdout.splitlines()
    assert [l[:5] for l in lines if l.startswith("[")] == ["[1/4]", "[2/4]", "[3/4]", "[4/4]"], r.stdout
    listed = [l.split()[0] for l in lines[lines.index(next(l for l in lines if l.startswith("[2/4]"))) + 1:] if l.startswith("  ")]
    assert {"Dockerfile", "README.md", "space_env/core.py"} <= set(listed), r.stdout  # the list comes before the upload
    state = recorded(hub)
    paths = [c["path"] for c in state["calls"]]
    for p in ("/api/whoami-v2", "/api/repos/create", "/api/spaces/alice/space_env/preupload/main", "/api/spaces/alice/space_env/commit/main"):
        assert p in paths, paths
    assert not [c for c in state["calls"] if c.get("unknown") and "agent-harnesses" not in c["path"]]
    create = next(c for c in state["calls"] if c["path"] == "/api/repos/create")
    assert create["body"] == {"name": "space_env", "organization": "alice", "visibility": "public", "type": "space", "sdk": "docker"}
    files = state["repos"]["alice/space_env"]["files"]
    assert {"Dockerfile", "README.md", "openenv.yaml", "requirements.txt", "space_env/core.py", "nbs/00_core.ipynb",
            ".openenv/requirements.txt"} <= set(files), sorted(files)
    assert any(f.startswith(".openenv/openenv_nb-") and f.endswith(".whl") for f in files)
    assert set(listed) == set(files), sorted(set(listed) ^ set(files))
    meta, _ = front_matter(files["README.md"])
    assert (meta["sdk"], meta["app_port"]) == ("docker", 8000) and "openenv" in meta["tags"]
    assert "ENV PORT=8000 ENABLE_WEB_INTERFACE=" in files["Dockerfile"]
    assert not any(".env" == Path(f).name or "__pycache__" in f for f in files)
    assert not state["repos"]["alice/space_env"]["secrets"]


def test_private_to_an_org_without_the_web_page(hub, project, tmp_path):
    r = push(str(project), "--repo-id", "my-org/private_space", "--private", "--no-interface", hub=hub, token=TOKEN, home=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    state = recorded(hub)
    create = [c for c in state["calls"] if c["path"] == "/api/repos/create"][-1]
    assert (create["body"]["organization"], create["body"]["visibility"]) == ("my-org", "private")
    files = state["repos"]["my-org/private_space"]["files"]
    assert "ENABLE_WEB_INTERFACE=false" in files["Dockerfile"]
    assert "base_path" not in front_matter(files["README.md"])[0]


def test_pushing_again_updates_the_space(hub, project, tmp_path):
    for _ in range(2):
        r = push(str(project), "--repo-id", "alice/twice", hub=hub, token=TOKEN, home=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
    commits = [c for c in recorded(hub)["calls"] if c["path"] == "/api/spaces/alice/twice/commit/main"]
    assert len(commits) == 2


def test_without_a_token_it_says_how_to_log_in(hub, project, tmp_path):
    before = len(recorded(hub)["calls"])
    r = push(str(project), hub=hub, home=tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "Not logged in to Hugging Face" in r.stderr and "hf auth login" in r.stderr and "HF_TOKEN" in r.stderr
    assert not [c for c in recorded(hub)["calls"][before:] if c["path"] != "/api/agent-harnesses"]  # nothing asked of the Hub


def test_a_refused_token_says_so(hub, project, tmp_path):
    r = push(str(project), hub=hub, token="hf_wrong", home=tmp_path)
    assert r.returncode == 1 and "refused the token (401)" in r.stderr and "hf auth login" in r.stderr, r.stderr


def test_an_unreachable_hub_says_so(project, tmp_path):
    r = push(str(project), hub="http://127.0.0.1:9", token=TOKEN, home=tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr and "127.0.0.1:9" in r.stderr, r.stderr


def test_dry_run_stages_and_uploads_nothing(hub, project, tmp_path):
    before = len(recorded(hub)["calls"])
    r = push(str(project), "--dry-run", hub=hub, home=tmp_path)
    assert r.returncode == 0, r.stderr
    assert len(recorded(hub)["calls"]) == before
    staged = Path(r.stdout.split(" in ", 1)[1].split(" (", 1)[0])
    assert (staged / "Dockerfile").is_file() and "sdk: docker" in (staged / "README.md").read_text()
    assert "Would create the Space YOUR-USERNAME/space_env (public, sdk docker, port 8000, web interface " in r.stdout
    assert "warning: the Space is public and its server asks for no token" in r.stdout
    assert "Nothing was uploaded (--dry-run)" in r.stdout and "space_env/core.py" in r.stdout


def test_bad_inputs(project, tmp_path):
    r = push(str(tmp_path), "--dry-run", home=tmp_path)
    assert r.returncode == 1 and "No openenv.yaml" in r.stderr and "openenv init" in r.stderr
    r = push(str(project), "--dry-run", "--repo-id", "no_slash", home=tmp_path)
    assert r.returncode == 1 and "--repo-id takes ORG/NAME" in r.stderr
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "openenv.yaml").write_text(yaml.safe_dump({"name": "p", "app": "p:E"}))
    r = push(str(tmp_path / "p"), "--dry-run", home=tmp_path)
    assert r.returncode == 1 and "No Dockerfile" in r.stderr, r.stderr


def test_secrets_and_links_out_stay_home(hub, leaky, tmp_path):
    r = push(str(leaky), "--repo-id", "alice/leaky", hub=hub, token=TOKEN, home=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    files = recorded(hub)["repos"]["alice/leaky"]["files"]
    assert "leaky_env/core.py" in files and not [f for f, text in files.items() if "SECRET" in text], sorted(files)
    told = {l.split(":")[0].removeprefix("left out ") for l in r.stdout.splitlines() if l.startswith("left out ")}
    assert told == {".aws/credentials", ".ssh/id_rsa", ".ssh/id_ed25519", ".git-credentials", ".npmrc", "prod.env", ".env.local",
                    "certs/client.p12", "wandb/settings", "deploy.pem", "tls.key", ".netrc", ".pypirc", "creds", "home_aws"}, r.stdout
    assert "a link out of the project" in next(l for l in r.stdout.splitlines() if l.startswith("left out home_aws:"))
    assert "secrets.json" not in r.stdout.split("[2/4]")[0]  # its .gitignore leaves it out: nothing to tell


def test_include_takes_a_secret_back_never_a_link_out(hub, leaky, tmp_path):
    r = push_lib(leaky, hub=hub, token=TOKEN, home=tmp_path, repo_id="alice/leaky_incl", include=["wandb/settings", "creds"])
    assert r.returncode == 0, r.stdout + r.stderr
    files = recorded(hub)["repos"]["alice/leaky_incl"]["files"]
    assert files["wandb/settings"] == "PROJECT-SECRET" and "creds" not in files and "prod.env" not in files


def test_the_web_page_is_off_unless_asked_for(hub, project, tmp_path):
    for repo, web in (("alice/no_web", None), ("alice/with_web", True)):
        r = push_lib(project, hub=hub, token=TOKEN, home=tmp_path, repo_id=repo, **({"web": web} if web else {}))
        assert r.returncode == 0, r.stdout + r.stderr
    repos = recorded(hub)["repos"]
    assert "ENABLE_WEB_INTERFACE=false" in repos["alice/no_web"]["files"]["Dockerfile"]
    assert "base_path" not in front_matter(repos["alice/no_web"]["files"]["README.md"])[0]
    assert "ENABLE_WEB_INTERFACE=true" in repos["alice/with_web"]["files"]["Dockerfile"]
    assert front_matter(repos["alice/with_web"]["files"]["README.md"])[0]["base_path"] == "/web"


def test_token_secret_from_the_environment(hub, project, tmp_path):
    r = push_lib(project, hub=hub, token=TOKEN, home=tmp_path, env={"OPENENV_TOKEN": "tok-from-env-123"},
                 repo_id="alice/with_token", token_secret=True)
    assert r.returncode == 0, r.stdout + r.stderr
    state = recorded(hub)
    assert state["repos"]["alice/with_token"]["secrets"] == {"OPENENV_TOKEN": "tok-from-env-123"}
    paths = [c["path"] for c in state["calls"]]
    assert paths.index("/api/spaces/alice/with_token/secrets") < paths.index("/api/spaces/alice/with_token/commit/main")
    assert "tok-from-env-123" not in r.stdout + r.stderr and "warning: the Space is public" not in r.stdout
    assert "clients need its OPENENV_TOKEN" in r.stdout


def test_token_secret_made_new_and_shown_once(hub, project, tmp_path):
    r = push_lib(project, hub=hub, token=TOKEN, home=tmp_path, repo_id="alice/new_token", token_secret=True)
    assert r.returncode == 0, r.stdout + r.stderr
    value = recorded(hub)["repos"]["alice/new_token"]["secrets"]["OPENENV_TOKEN"]
    assert len(value) >= 40 and r.stdout.count(value) == 1 and value not in r.stderr
