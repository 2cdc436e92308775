"""`openenv validate --url` against real servers: ours pass (echo, coding, with the web page, a scaffolded project);
hand-made servers that each break one criterion fail, naming it; a server that never answers fails on its timeouts."""
import json
import socket
import subprocess
import sys

import pytest

from broken_servers import BROKEN
from conftest import start_server
from openenv_nb.validate import validate_url

# what else fails, of necessity, when a criterion breaks
CONSEQUENCES = {"openapi_version_available": {"mode_endpoint_consistency"},  # no paths to tell the mode from
                "schema_endpoint": {"ws_step"}}                               # no schema to build an action from


def openenv(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "openenv_nb.cli", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def hand_made():
    """Base URL of the server holding the hand-made servers at /x/good and /x/CRITERION."""
    p = start_server("broken_servers:app")
    yield p.base_url
    p.stop()


def test_echo_passes_from_the_command_line(echo_url):
    r = openenv("validate", "--url", echo_url, "--json")
    report = json.loads(r.stdout)
    assert r.returncode == 0 and report["passed"], r.stdout
    assert [c["id"] for c in report["criteria"]] == ["openapi_version_available", "health_endpoint", "metadata_endpoint",
                                                    "schema_endpoint", "mcp_endpoint", "mode_endpoint_consistency",
                                                    "ws_reset", "ws_step", "ws_state", "envelope_shape"]
    assert (report["validation_type"], report["standard_profile"], report["mode"]) == ("running_environment", "openenv-http/1.x", "simulation")


def test_echo_with_the_web_page_passes(server):
    assert validate_url(server("echo", "--web"))["passed"]


def test_coding_passes(server):
    pytest.importorskip("openenv_nb.envs.coding")
    report = validate_url(server("coding", max_sessions=4), timeout=30)
    assert report["passed"], report["summary"]


def test_the_hand_made_server_passes(hand_made):
    report = validate_url(f"{hand_made}/x/good")
    assert report["passed"], report["summary"]


@pytest.mark.parametrize("criterion", BROKEN)
def test_each_broken_criterion_is_named(hand_made, criterion):
    report = validate_url(f"{hand_made}/x/{criterion}", timeout=5)
    failed = set(report["summary"]["failed_criteria"])
    assert not report["passed"] and criterion in failed, report["summary"]
    assert failed <= {criterion} | CONSEQUENCES.get(criterion, set()), failed


def test_the_report_says_what_broke(hand_made):
    r = openenv("validate", f"{hand_made}/x/health_endpoint")
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert any(l.split()[:2] == ["FAIL", "health_endpoint"] for l in lines), r.stdout
    assert "expected" in r.stdout and '"status": "sick"' in r.stdout
    assert lines[-1].startswith("FAILED: 1 of 10 required checks failed (health_endpoint)"), lines[-1]


def test_a_server_that_never_answers_fails_on_its_timeouts():
    """Every check gives up after `timeout` and says so (pytest's own timeout would catch a check that hangs)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); s.listen(16)  # accepts connections, never answers
        report = validate_url(f"http://127.0.0.1:{s.getsockname()[1]}", timeout=0.5)
    assert not report["passed"] and report["summary"]["passed_count"] == 0
    assert "timed out" in report["criteria"][1]["details"].lower()


def test_nothing_listening_fails_cleanly():
    r = openenv("validate", "--url", "http://127.0.0.1:9", "--timeout", "1")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "Request failed: ConnectionError" in r.stdout
