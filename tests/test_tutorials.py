"""Every tutorial runs as Jupyter's "Run all" runs it: every cell, in a fresh kernel of this interpreter, nbdev's
directives ignored (a tutorial has no cell that nbdev would skip, so this covers what `nbdev-test` would run)."""
import importlib.util
import json
import subprocess
import sys
import tomllib
from pathlib import Path
from unittest import mock

import pytest

from conftest import need, need_trl

ROOT = Path(__file__).parent.parent
TUTORIALS = sorted((ROOT / "nbs" / "tutorials").glob("[0-9]*.ipynb"))
NEEDS_TRL = {"04_train_with_trl.ipynb"}
REPO = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]


def cells(nb: Path) -> list[dict]:
    return json.loads(nb.read_text())["cells"]


def source(cell: dict) -> str:
    return "".join(cell["source"])


def run_all(nb: Path, tmp_path: Path, cell_timeout: int = 600):
    "Execute `nb` top to bottom in a fresh kernel, from its own folder; the executed copy goes to `tmp_path`."
    import nbformat
    from nbconvert.preprocessors import CellExecutionError, ExecutePreprocessor
    book = nbformat.read(nb, as_version=4)
    # kernel `python3` with argv `python`: jupyter_client starts it with `sys.executable`, this venv's python
    ep = ExecutePreprocessor(timeout=cell_timeout, kernel_name="python3")
    try: ep.preprocess(book, {"metadata": {"path": str(nb.parent)}})
    except CellExecutionError as e: pytest.fail(f"{nb.name}, Run all in a fresh kernel:\n{str(e)[-6000:]}")
    finally: nbformat.write(book, tmp_path / nb.name)
    return book


def test_there_are_tutorials():
    assert len(TUTORIALS) >= 4, TUTORIALS


@pytest.mark.parametrize("nb", TUTORIALS, ids=[p.name for p in TUTORIALS])
def test_no_cell_that_jupyter_runs_and_nbdev_skips(nb):
    "A skip directive would make Jupyter's 'Run all' differ from the tested run: tutorials have none."
    skips = [source(c) for c in cells(nb) if c["cell_type"] == "code"
             if any(f in source(c) for f in ("eval: false", "eval:false", "notest"))]
    assert not skips, f"{nb.name} has cells that nbdev skips and Jupyter runs:\n" + "\n---\n".join(skips)


@pytest.mark.parametrize("nb", TUTORIALS, ids=[p.name for p in TUTORIALS])
def test_first_cell_installs_only_what_is_missing(nb):
    """The install cell: no pip where the modules import (CI, a clone); else PyPI first, then the repository's URL
    from pyproject.toml; and an error, not silence, when both fail."""
    code = source(cells(nb)[2])
    assert REPO.removeprefix("https://") in code, f"{nb.name}: the install cell does not name {REPO}"

    def run(missing: set, pip_ok):
        calls = []
        def fake_run(cmd, *a, **k):
            calls.append(cmd[cmd.index("-q") + 1:])
            return subprocess.CompletedProcess(cmd, 0 if pip_ok(calls[-1]) else 1)
        fake_find = lambda name, *a: None if name in missing else object()  # all else installed, here or not
        with mock.patch("subprocess.run", fake_run), mock.patch("importlib.util.find_spec", fake_find):
            exec(compile(code, nb.name, "exec"), {})
        return calls

    assert run(set(), lambda spec: True) == []
    on_pypi = run({"openenv_nb"}, lambda spec: True)
    assert len(on_pypi) == 1 and on_pypi[0][0].startswith("openenv-nb") and "@" not in on_pypi[0][0], on_pypi
    not_yet = run({"openenv_nb"}, lambda spec: "@" in spec[0])
    assert len(not_yet) == 2 and not_yet[1][0].endswith(f"@ git+{REPO}"), not_yet
    with pytest.raises(RuntimeError, match="could not install"): run({"openenv_nb"}, lambda spec: False)


@pytest.mark.parametrize("nb", [p for p in TUTORIALS if p.name not in NEEDS_TRL],
                         ids=[p.name for p in TUTORIALS if p.name not in NEEDS_TRL])
@pytest.mark.timeout(1200)
def test_run_all(nb, tmp_path):
    run_all(nb, tmp_path)


@pytest.mark.trl
@pytest.mark.parametrize("nb", [p for p in TUTORIALS if p.name in NEEDS_TRL],
                         ids=[p.name for p in TUTORIALS if p.name in NEEDS_TRL])
@pytest.mark.timeout(1200)
def test_run_all_trl(nb, tmp_path):
    "Tutorial 04 trains a tiny model on the CPU: its cells assert that the reward curve rises."
    need_trl()
    has_plots = importlib.util.find_spec("matplotlib") is not None
    need("trl", has_plots, "tutorial 04 plots its rewards: pip install matplotlib")
    book = run_all(nb, tmp_path)
    printed = "".join(o.get("text", "") for c in book.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "mean reward: first 5 steps" in printed, printed[-2000:]
    warned = [o["text"] for c in book.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("name") == "stderr" and ("FutureWarning" in o["text"] or "DeprecationWarning" in o["text"])]
    assert not warned, warned
