"""Every notebook under nbs/ runs top to bottom, as `nbdev-test` runs it: one pytest item each."""
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
NBS = ROOT / "nbs"
NOTEBOOKS = sorted(p for p in NBS.rglob("*.ipynb") if not any(part.startswith((".", "_")) for part in p.relative_to(NBS).parts))
SKIP_FLAGS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["nbdev"].get("tst_flags", "").split()
RUN = "import sys, nbdev.test as nbt; ok, _ = nbt.test_nb(sys.argv[1], skip_flags=sys.argv[2:]); sys.exit(0 if ok else 1)"


def test_skip_flags_come_from_pyproject():
    "The runner skips what `nbdev-test` skips: the flags in `[tool.nbdev] tst_flags`, which always include `notest`."
    assert "notest" in SKIP_FLAGS, SKIP_FLAGS


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[str(p.relative_to(NBS)) for p in NOTEBOOKS])
def test_notebook(nb):
    r = subprocess.run([sys.executable, "-c", RUN, str(nb), *SKIP_FLAGS], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{nb.name} failed:\n{r.stdout[-4000:]}\n{r.stderr[-8000:]}"
