"""The README is the index notebook, its code runs, and its two commands are the ones CI uses."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()
TEST_CMD = 'pip install -e ".[dev]" && python -m pytest'
RUN_CMD = "pip install -e . && openenv demo"
# run the README's blocks as one session, top-level `await` allowed (as in a notebook)
RUNNER = "import ast, asyncio, sys\ncode = compile(sys.stdin.read(), '<README>', 'exec', flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)\n" \
         "r = eval(code, {'__name__': '__main__'})\nif asyncio.iscoroutine(r): asyncio.run(r)\n"


def test_readme_is_the_index_notebook():
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "make_readme.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    code = "\n".join(b for b in blocks if "RayProvider" not in b)  # a Ray cluster is not here
    r = subprocess.run([sys.executable, "-c", RUNNER], input=code, capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert r.returncode == 0, f"README code failed:\n{r.stderr[-3000:]}"
    assert "Echo environment ready!" in r.stdout and "world 0.5 False" in r.stdout, r.stdout


def test_the_two_commands_agree_everywhere():
    assert TEST_CMD in README and RUN_CMD in README
    assert TEST_CMD in (ROOT / ".ci/run").read_text()


def test_the_main_command_prints_an_episode():
    r = subprocess.run(["openenv", "demo", "hi", "there"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "'Echo environment ready!'" in lines[1] and "'there' -> 'there'  reward=0.5" in lines[3], r.stdout
