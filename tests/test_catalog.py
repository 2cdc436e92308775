"""The catalog of environments: each one's image (its Dockerfile follows the rules and serves by default what the image
can serve; a family's image built, started with DockerProvider and played), the screenshots of its web page (committed,
small, named by the catalog; tools/screenshots.py still makes them), and the README's table listing them."""
import importlib.util
import json
import re
import subprocess
import sys

import pytest

from conftest import ROOT, need, need_browser
from openenv_nb.images import CLIENT_SIDE, IMAGES, build, builtin_dockerfile, check_dockerfile
from openenv_nb.providers import DockerProvider
from openenv_nb.targets import BUILTINS, FAMILIES, TargetError, resolve

CATALOG = ROOT / "nbs" / "catalog.ipynb"
spec = importlib.util.spec_from_file_location("screenshots", ROOT / "tools" / "screenshots.py")
screenshots = importlib.util.module_from_spec(spec)
spec.loader.exec_module(screenshots)


def default_target(name: str) -> str:
    "What the image `name` serves when not told otherwise."
    m = re.search(r"^ENV OPENENV_TARGET=(\S+)", builtin_dockerfile(name), re.M)
    return m[1] if m else name


def quiet(line): pass


# ---------------------------------------------------------------- the recipes

def test_an_image_for_every_environment():
    assert set(IMAGES) == set(BUILTINS) | set(FAMILIES)
    for name in IMAGES: assert check_dockerfile(builtin_dockerfile(name)) == [], name


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_family_image_serves_by_default_what_it_can(family):
    "The default OPENENV_TARGET of a family's image loads with the family's extra alone (no data to download)."
    target = default_target(family)
    assert target.partition(":")[0] == family
    try: env, _ = resolve(target)
    except TargetError as e:
        need(family, "is not installed" not in str(e), f"needs the {family} extra: {e}")
        raise
    assert env().reset() is not None


# ---------------------------------------------------------------- the screenshots

def test_every_screenshot_is_committed_small_and_shown():
    text = CATALOG.read_text()
    for name in screenshots.SHOTS:
        png = ROOT / "nbs" / "images" / "catalog" / f"{name}.png"
        assert png.is_file(), f"{png} is missing: python tools/screenshots.py {name}"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
        assert png.stat().st_size < screenshots.MAX_BYTES, (png, png.stat().st_size)
        assert f"(images/catalog/{name}.png)" in text, f"the catalog does not show {name}.png"


def test_the_catalog_covers_every_environment():
    heads = [l for c in json.loads(CATALOG.read_text())["cells"] if c["cell_type"] == "markdown"
             for l in "".join(c["source"]).splitlines() if l.startswith("## ")]
    assert heads == ["## Report card", "## echo", "## coding", "## connect4", "## gym:ID", "## openspiel:GAME",
                     "## textarena:ID", "## chess", "## reasoning_gym:NAME"], heads
    assert {t.partition(":")[0] for t, _ in screenshots.SHOTS.values()} == set(IMAGES)


def test_the_report_card_rates_every_family_and_every_one_passes():
    "The report card's table, as the page shows it (the notebook's test runs the checks that make it)."
    cell = next(c for c in json.loads(CATALOG.read_text())["cells"] if "card = [card_row" in "".join(c["source"]))
    rows = "".join(cell["outputs"][0]["data"]["text/markdown"]).splitlines()[2:]
    rated = {r.split("|")[1].strip().strip("`").partition(":")[0] for r in rows}
    assert rated == set(IMAGES), rated
    assert all("honoured" in r and "| yes |" in r and "passes" in r for r in rows), rows


@pytest.mark.browser
def test_the_screenshot_script_runs(tmp_path):
    need_browser()
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "screenshots.py"), "echo", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    png = tmp_path / "echo.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size < screenshots.MAX_BYTES
    assert "over the limit" not in r.stdout, r.stdout
    from PIL import Image
    assert Image.open(png).size[0] == 1280


# ---------------------------------------------------------------- the README

def test_the_readme_lists_every_environment():
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Environments"):]
    table = table[:table.index("\n## ")]
    served = re.findall(r"^\| [^|]+ \| (.+?) \|", table, re.M)[1:]  # the `openenv serve` column, below the header
    names = {m.partition(":")[0] for cell in served for m in re.findall(r"`([^`]+)`", cell)}
    assert names == set(IMAGES), names


# ---------------------------------------------------------------- the images, built and played

@pytest.fixture(scope="module")
def engine(docker_engine): return docker_engine


@pytest.mark.docker
def test_chess_image_end_to_end(engine):
    pytest.importorskip("chess", reason="the chess client's types need python-chess")
    from openenv_nb.envs.chess import ChessAction, ChessEnv
    tag = build("chess", log=quiet)
    probe = "import importlib.util as u; print([m for m in %r if u.find_spec(m)])" % list(CLIENT_SIDE)
    out = engine.containers.run(tag, ["python", "-c", probe], remove=True, network_mode="none").decode().strip()
    assert out == "[]", f"the chess image carries client-side packages: {out}"
    with DockerProvider(tag) as server, ChessEnv(server.base_url).sync() as env:
        first = env.reset(seed=0)
        assert first.observation.fen.startswith("rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w")
        r = env.step(ChessAction(move="e4"))
        assert r.observation.opponent_move and r.observation.frame.startswith("data:image/svg+xml")  # a reply, and the board
        assert (r.reward, r.done, r.observation.error) == (0.0, False, None)
        bad = env.step(ChessAction(move="e4"))  # the pawn is on e4 now
        assert (bad.reward, bad.done) == (-0.1, False) and bad.observation.error


@pytest.mark.docker
def test_gym_image_serves_what_it_is_told(engine):
    pytest.importorskip("gymnasium", reason="the gym client's types need Gymnasium")
    from openenv_nb.envs.gym import GymEnv, gym_types
    tag = build("gym", log=quiet)
    Act, _ = gym_types("FrozenLake-v1", is_slippery=False)
    target = {"OPENENV_TARGET": "gym:FrozenLake-v1?is_slippery=false"}
    with DockerProvider(tag, env_vars=target) as server, \
         GymEnv(server.base_url, env_id="FrozenLake-v1", make_kwargs={"is_slippery": False}).sync() as env:
        assert env.reset(seed=0).observation.obs == 0
        rewards = [env.step(Act(action=a)).reward for a in (1, 1, 2, 2, 1)]  # down, down, right, right, down
        r = env.step(Act(action=2))  # right: onto the goal
        assert (rewards, r.reward, r.done, r.observation.obs) == ([0.0] * 5, 1.0, True, 15)
