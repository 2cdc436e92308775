"""The package as users install it: build the wheel and sdist, install the wheel alone in a fresh venv, use it."""
import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """The sdist built from this tree, and the wheel built from the sdist (as pip does; no `build/` left in the tree)."""
    out = tmp_path_factory.mktemp("dist")
    r = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    wheel, sdist = next(out.glob("openenv_nb-*.whl")), next(out.glob("openenv_nb-*.tar.gz"))
    return wheel, sdist


def test_one_version_everywhere(dist):
    wheel, sdist = dist
    import openenv_nb
    assert f"openenv_nb-{openenv_nb.__version__}-" in wheel.name and f"openenv_nb-{openenv_nb.__version__}.tar.gz" == sdist.name


def test_package_data_is_shipped(dist):
    wheel, sdist = dist
    names = zipfile.ZipFile(wheel).namelist()
    assert "openenv_nb/web_static/index.html" in names and "openenv_nb/envs/echo.py" in names
    data = [n for n in names if n.startswith("openenv_nb/") and not n.endswith(".py")]
    with tarfile.open(sdist) as t:
        in_sdist = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert all(n in in_sdist for n in data), set(data) - in_sdist


@pytest.fixture(scope="module")
def venv(dist, tmp_path_factory):
    """A fresh venv (no system site-packages) with only the wheel and its dependencies installed."""
    d = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(d)], check=True, timeout=120)
    r = subprocess.run([str(d / "bin/pip"), "install", "-q", str(dist[0])], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return d


def run(venv, *cmd, **kw):
    return subprocess.run([str(venv / "bin" / cmd[0]), *cmd[1:]], capture_output=True, text=True, timeout=180, cwd="/", **kw)


def test_installed_wheel_works(venv):
    r = run(venv, "python", "-c", "import openenv_nb, json; print(json.dumps(openenv_nb.__file__))")
    assert r.returncode == 0 and "site-packages" in json.loads(r.stdout), r.stdout + r.stderr  # not this checkout
    r = run(venv, "openenv", "--help")
    assert r.returncode == 0 and "serve" in r.stdout
    r = run(venv, "openenv", "demo", "installed")
    assert r.returncode == 0 and "'installed' -> 'installed'" in r.stdout, r.stdout + r.stderr


def test_installed_web_page_is_served(venv):
    code = ("from fastapi.testclient import TestClient; from openenv_nb.targets import make_app; "
            "c = TestClient(make_app('echo', web=True)); r = c.get('/web'); print(r.status_code, 'message' in r.text)")
    r = run(venv, "python", "-c", code)
    assert r.stdout.split() == ["200", "True"], r.stdout + r.stderr


def test_installed_init_templates_work(venv, tmp_path):
    r = run(venv, "openenv", "init", "tidy_game", "-o", str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    project = tmp_path / "tidy_game"
    assert (project / "openenv.yaml").exists() and (project / "Dockerfile").exists() and list(project.glob("nbs/*.ipynb"))
    r = run(venv, "openenv", "validate", str(project))
    assert r.returncode == 0, r.stdout + r.stderr
