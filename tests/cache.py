"""Where the tests keep what they build once and reuse (the helper venvs): a folder of the user's, outside the clone.

`$OPENENV_TEST_CACHE` if set, else `$XDG_CACHE_HOME/openenv-nb`, else `~/.cache/openenv-nb`; where that cannot be
written (a user with no home), a folder of this user's in the temporary directory. Delete it to reclaim the space."""
import os
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    "The cache folder, created if need be."
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    for d in filter(None, [os.environ.get("OPENENV_TEST_CACHE"), os.path.join(base, "openenv-nb"),
                           os.path.join(tempfile.gettempdir(), f"openenv-nb-cache-{os.getuid()}")]):
        try: os.makedirs(d, exist_ok=True)
        except OSError: continue
        if os.access(d, os.W_OK): return Path(d)
    raise OSError("no writable cache folder: set OPENENV_TEST_CACHE to one")


if __name__ == "__main__": print(cache_dir())
