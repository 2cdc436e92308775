"""Every notebook under nbs/ runs top to bottom, as `nbdev-test` runs it: one pytest item each."""
import subprocess
import sys
from pathlib import Path

import pytest

NBS = Path(__file__).parent.parent / "nbs"
NOTEBOOKS = sorted(p for p in NBS.rglob("*.ipynb") if not any(part.startswith((".", "_")) for part in p.relative_to(NBS).parts))
RUN = "import sys, nbdev.test as nbt; ok, _ = nbt.test_nb(sys.argv[1], skip_flags=['notest', 'slow', 'docker', 'browser', 'ray']); sys.exit(0 if ok else 1)"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[str(p.relative_to(NBS)) for p in NOTEBOOKS])
def test_notebook(nb):
    r = subprocess.run([sys.executable, "-c", RUN, str(nb)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{nb.name} failed:\n{r.stdout[-4000:]}\n{r.stderr[-8000:]}"
