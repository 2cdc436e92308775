"""Every notebook under nbs/ runs top to bottom, as `nbdev-test` runs it: one pytest item each (the tutorials in
`test_tutorials.py`, in a fresh Jupyter kernel)."""
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from conftest import need_trl

ROOT = Path(__file__).parent.parent
NBS = ROOT / "nbs"
NOTEBOOKS = sorted(p for p in NBS.rglob("*.ipynb") if not any(part.startswith((".", "_")) for part in p.relative_to(NBS).parts)
                   and p.parent.name != "tutorials")  # `test_tutorials.py` runs those as Jupyter's "Run all" does
SKIP_FLAGS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["nbdev"].get("tst_flags", "").split()
TRL = re.compile(r"^\s*(?:from|import)\s+(?:trl|transformers|torch)\b", re.M)  # what needs the trl extra
RUN = "import sys, nbdev.test as nbt; ok, _ = nbt.test_nb(sys.argv[1], skip_flags=sys.argv[2:]); sys.exit(0 if ok else 1)"


def test_skip_flags_come_from_pyproject():
    "The runner skips what `nbdev-test` skips: the flags in `[tool.nbdev] tst_flags`, which always include `notest`."
    assert "notest" in SKIP_FLAGS, SKIP_FLAGS


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[str(p.relative_to(NBS)) for p in NOTEBOOKS])
def test_notebook(nb):
    code = "\n".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code")
    if TRL.search(code): need_trl()
    r = subprocess.run([sys.executable, "-c", RUN, str(nb), *SKIP_FLAGS], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{nb.name} failed:\n{r.stdout[-4000:]}\n{r.stderr[-8000:]}"
