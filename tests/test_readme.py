"""The README's code runs, and its two commands are the ones CI and the index notebook use."""
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()
TEST_CMD = 'pip install -e ".[dev]" && python -m pytest'
RUN_CMD = "pip install -e . && openenv demo"


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    code = "\n".join(b for b in blocks if "RayProvider" not in b)  # they build on each other; a Ray cluster is not here
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, f"README code failed:\n{r.stderr[-3000:]}"
    assert "Echo environment ready!" in r.stdout and "world 0.5 False" in r.stdout, r.stdout


def test_the_two_commands_agree_everywhere():
    index = "".join("".join(c["source"]) for c in json.loads((ROOT / "nbs/index.ipynb").read_text())["cells"])
    for text in (README, index): assert TEST_CMD in text and RUN_CMD in text
    assert TEST_CMD in (ROOT / ".ci/run").read_text()


def test_the_main_command_prints_an_episode():
    r = subprocess.run(["openenv", "demo", "hi", "there"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "'Echo environment ready!'" in lines[1] and "'there' -> 'there'  reward=0.5" in lines[3], r.stdout
