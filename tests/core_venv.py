"""The Python of a virtual environment with Meta's `openenv-core==0.2.3`, for the compatibility tests.

`core_python()` looks, in order, at:
1. `$OPENENV_CORE_PYTHON`, if set (used as given; it is an error if it cannot import `openenv`);
2. `venv-core` in the tests' cache folder (`tests/cache.py`: `~/.cache/openenv-nb`), if it imports `openenv-core` 0.2.3;
3. `/opt/oecore/bin/python` (where this project's machines preinstall it), if it does;
4. otherwise it creates that `venv-core` (`python -m venv`, then `pip install openenv-core==0.2.3`; about 250 MB), once:
   an exclusive `flock` on `venv-core/.lock` makes concurrent pytest processes wait for the first one's install.

It returns `None` when none of these works; `core_python_why()` gives the path or the reason.
"""
import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

from cache import cache_dir

VERSION = "0.2.3"
PRESET = Path("/opt/oecore/bin/python")
INSTALL_TIMEOUT_S = 600

_cache: dict[Path, tuple[str | None, str]] = {}

_PROBE = ("import importlib.metadata as m, openenv.core.env_client, openenv.core.env_server.http_server; "
          "print(m.version('openenv-core'))")


def _probe(python: Path, timeout: float = 120) -> str:
    "'' when `python` imports openenv-core at VERSION; otherwise why not."
    if not python.exists(): return f"{python} does not exist"
    try: r = subprocess.run([str(python), "-c", _PROBE], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e: return f"{python} could not be run: {e}"
    if r.returncode != 0: return f"{python} cannot import openenv: {(r.stderr.strip().splitlines() or ['?'])[-1]}"
    got = r.stdout.strip()
    return "" if got == VERSION else f"{python} has openenv-core {got}, not {VERSION}"


def _create(venv: Path) -> str:
    "Make `venv` with openenv-core; '' on success, else why it failed. Holds a lock while it works."
    venv.mkdir(parents=True, exist_ok=True)  # the lock lives inside it
    py = venv / "bin" / "python"
    with open(venv / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be installing: wait for it, then look again
        try:
            if not _probe(py): return ""
            deadline = time.monotonic() + INSTALL_TIMEOUT_S
            steps = ([sys.executable, "-m", "venv", str(venv)],
                     [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", f"openenv-core=={VERSION}"])
            for cmd in steps:
                left = deadline - time.monotonic()
                if left <= 0: return f"creating {venv} took over {INSTALL_TIMEOUT_S} s"
                try: r = subprocess.run(cmd, capture_output=True, text=True, timeout=left)
                except subprocess.TimeoutExpired: return f"`{' '.join(cmd[:4])} ...` took over {INSTALL_TIMEOUT_S} s"
                except OSError as e: return f"`{cmd[0]}` could not be run: {e}"
                if r.returncode != 0:
                    tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-5:])
                    return f"`{' '.join(cmd[:4])} ...` failed with code {r.returncode}:\n{tail}"
            return _probe(py)
        finally: fcntl.flock(lock, fcntl.LOCK_UN)


def core_python_why(root: Path | None = None) -> tuple[str | None, str]:
    "`(python, where it came from)`, or `(None, why there is none)`; computed once per process and cache folder."
    root = Path(root) if root else cache_dir()
    if root in _cache: return _cache[root]
    if env := os.environ.get("OPENENV_CORE_PYTHON"):
        why = _probe(Path(env))
        res = (None, f"$OPENENV_CORE_PYTHON: {why}") if why else (env, "$OPENENV_CORE_PYTHON")
    else:
        venv, res, whys = root / "venv-core", None, []
        for cand in (venv / "bin" / "python", PRESET):
            why = _probe(cand)
            if not why: res = (str(cand), str(cand)); break
            whys.append(why)
        if res is None:
            why = _create(venv)
            res = (str(venv / "bin" / "python"), f"created {venv}") if not why else \
                  (None, "no openenv-core venv: " + "; ".join(whys + [why]))
    _cache[root] = res
    return res


def core_python(root: Path | None = None) -> str | None:
    "The python of a venv with openenv-core 0.2.3, or `None` (see `core_python_why` for the reason)."
    return core_python_why(root)[0]


if __name__ == "__main__":
    print(core_python_why())
