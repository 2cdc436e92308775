"""A project made by `openenv init` is useful as it stands: its package is in step with its notebook, the notebook
passes `nbdev-test`, its own tests pass, and it installs as a package."""
import subprocess
import sys
from pathlib import Path

import pytest

from openenv_nb.scaffold import init_project


def run(*cmd, cwd, timeout=300):
    return subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return init_project("guess_env", tmp_path_factory.mktemp("scaffold"), log=None)


@pytest.mark.parametrize("name", ["a", "grid_world_env", "a_much_longer_name_for_an_environment_project"])
def test_the_package_is_exported_from_the_notebook(tmp_path, name):
    proj = init_project(name, tmp_path, log=None)
    before = snapshot(proj)
    for cmd in ("nbdev-clean", "nbdev-export"):
        r = run(cmd, cwd=proj)
        assert r.returncode == 0, r.stderr
    after = snapshot(proj)
    assert [f for f in before.keys() | after.keys() if before.get(f) != after.get(f)] == []


def test_its_notebook_passes_nbdev_test(project):
    r = run("nbdev-test", cwd=project)
    assert r.returncode == 0 and "Success." in r.stdout, r.stdout[-3000:] + r.stderr[-5000:]


def test_its_own_tests_pass(project):
    r = run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "not notebook", cwd=project)
    assert r.returncode == 0 and "3 passed" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]


def test_it_installs_as_a_package(project, tmp_path):
    r = run(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(tmp_path / "site"),
            str(project), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    code = "import sys; sys.path.insert(0, sys.argv[1]); import guess_env as g; print(g.__version__, g.GuessEnvironment.__module__, g.__file__)"
    r = run(sys.executable, "-c", code, str(tmp_path / "site"), cwd="/")
    version, module, where = r.stdout.split()
    assert (version, module) == ("0.1.0", "guess_env.core") and where.startswith(str(tmp_path / "site")), r.stdout + r.stderr
