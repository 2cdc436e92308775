"""Seeds that mean something and rewards you can trust, across the catalog: every environment we serve passes
`openenv validate --level all` with a small budget (the same seed and actions replay; where it is random, different
seeds differ; a seed it cannot honour is warned of; no adversarial policy cheats its reward). Small, offline
configurations of each family."""
import warnings

import pytest

from openenv_nb.conformance import format_report
from openenv_nb.validate import validate

FAMILY = {"gym": "gymnasium", "openspiel": "pyspiel", "textarena": "textarena", "chess": "chess", "coding": "smolagents"}
# (target, whether its episodes differ from seed to seed under the same actions)
CATALOG = [("echo", False), ("coding", False),
           ("gym:CartPole-v1", True), ("gym:FrozenLake-v1", True), ("gym:Blackjack-v1", True), ("gym:Taxi-v4", True),
           ("openspiel:catch", True), ("openspiel:blackjack", True), ("openspiel:tic_tac_toe", True),
           ("openspiel:2048", True), ("openspiel:kuhn_poker", True),
           ("textarena:GuessTheNumber-v0", None), ("textarena:Mastermind-v0", None),
           ("textarena:TicTacToe-v0?num_players=2", None), ("chess", None)]  # None: random actions cannot tell


@pytest.mark.parametrize("target,random_", CATALOG, ids=[t for t, _ in CATALOG])
def test_the_catalog_passes_every_level(target, random_):
    pytest.importorskip(FAMILY.get(target.split(":")[0], "openenv_nb"), reason=f"{target} needs its extra")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = validate(target, level="all", timeout=30, budget=100)
    assert report["passed"], format_report(report)
    by = {c["id"]: c for c in report["criteria"]}
    assert by["episode_determinism"]["passed"] and not by["episode_determinism"].get("skipped"), by["episode_determinism"]
    if random_ is not None:
        assert ("different episodes" in by["seeds_differ"]["details"]) == random_, by["seeds_differ"]
