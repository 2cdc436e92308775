"""`openenv validate --url` against real servers: ours pass (echo, coding, with the web page, a scaffolded project);
hand-made servers that each break one criterion fail, naming it; a server that never answers fails on its timeouts.
The static and semantic levels: every builtin passes; environments broken on purpose (`broken_envs`) each fail the
one check they break, whether named, given as a class, served by a project folder, or reached by URL. Tool
environments: `tools/list` answers (in process at the static level, on `POST /mcp` at the runtime level), its input
schemas are valid JSON Schema, and no tool takes a reserved name; each broken tool environment fails its check."""
import json
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

import broken_envs
from broken_servers import BROKEN
from conftest import start_server
from openenv_nb.mcp import MCPEchoEnvironment, MCPEnvironment, rpc
from openenv_nb.scaffold import init_project
from openenv_nb.server import create_app, serve_in_thread
from openenv_nb.conformance import LEVELS, SEMANTIC, format_report, schema_problems, validate_url
from openenv_nb.validate import validate, validate_env, validate_project

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
                                                    "ws_reset", "ws_step", "ws_state", "envelope_shape", "mcp_tools_list"]  # echo is a tool environment too
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
    assert r.returncode == 1 and "Traceback" not in r.stderr and not r.stdout
    assert r.stderr.strip() == "openenv validate: nothing answers at http://127.0.0.1:9: is the server running? " \
                               "(start one with `openenv serve NAME --port 9`)", r.stderr


# --- levels: static and semantic ------------------------------------------------------------------------------------

STATIC = {"json_schemas", "reserved_tool_names"}


def level_of(check): return "static" if check in STATIC else "semantic"


def test_guess_passes_every_check_at_every_level():
    """The well-made environment runs every check, none skipped, at each level; each level adds to the one below."""
    ids = []
    for level in LEVELS:
        report = validate_env(broken_envs.Guess, level=level)
        assert report["passed"] and not report["summary"]["skipped_criteria"], format_report(report)
        assert [c["id"] for c in report["criteria"]][:len(ids)] == ids
        ids = [c["id"] for c in report["criteria"]]
    assert ids[-6:] == list(SEMANTIC) and len(ids) == 3 + 10 + 6


@pytest.mark.parametrize("check", list(broken_envs.BROKEN))
def test_each_broken_environment_fails_its_check_alone(check):
    if check == "json_schemas": pytest.importorskip("jsonschema", reason="the misspelt type is caught by the meta-schema")
    report = validate(f"broken_envs:{broken_envs.BROKEN[check]}", level=level_of(check))
    assert not report["passed"] and report["summary"]["failed_criteria"] == [check], format_report(report)
    failed = next(c for c in report["criteria"] if c["id"] == check)
    assert failed["details"], failed  # says why


def test_a_failed_determinism_skips_isolation_with_its_reason():
    report = validate_env(broken_envs.Nondeterministic, level="semantic")
    iso = report["criteria"][-1]
    assert (iso["id"], iso["skipped"], report["summary"]["skipped_criteria"]) == ("episode_isolation", True, ["episode_isolation"])
    assert "episode_determinism" in iso["details"]


def test_an_environment_of_one_session_skips_isolation_with_its_reason():
    class Lonely(broken_envs.Guess): SUPPORTS_CONCURRENT_SESSIONS = False
    report = validate_env(Lonely, level="semantic")
    assert report["passed"] and report["summary"]["skipped_criteria"] == ["episode_isolation"], format_report(report)
    assert "fewer than 8 sessions at once" in report["criteria"][-1]["details"]


def test_a_tool_with_a_plain_name_passes():
    report = validate_env(broken_envs.PlainToolName)
    assert report["passed"] and report["criteria"][2]["details"] == "none reserved among the 1 listed", report["criteria"]


@pytest.mark.parametrize("target", ["echo", "coding", "gym:CartPole-v1"])
def test_builtins_pass_the_semantic_level(target):
    if target == "coding": pytest.importorskip("smolagents", reason="the coding environment needs smolagents")
    if target.startswith("gym:"): pytest.importorskip("gymnasium", reason="gym environments need the gym extra")
    report = validate(target, level="semantic", timeout=30)
    assert report["passed"], format_report(report)
    played = {c["id"] for c in report["criteria"] if c["id"] in SEMANTIC and not c.get("skipped")}
    # these need no declaration; the others play where the environment declares what they need (gym: max_return)
    assert {"episode_determinism", "reward_range", "episode_isolation"} <= played, format_report(report)


def test_the_report_is_json_and_says_each_reason():
    report = validate_env(broken_envs.Leaky, level="semantic")
    assert json.loads(json.dumps(report, allow_nan=False)) == report
    text = format_report(report).splitlines()
    assert text[0].startswith("openenv validate Leaky --level semantic")
    at = next(i for i, l in enumerate(text) if l.split()[:2] == ["FAIL", "no_solution_leakage"])
    assert "the answer is shown at seed 1, the reset" in text[at + 1], text[at + 1]
    assert all(l.split()[0] in ("PASS", "FAIL", "SKIP") for l in text[1:-1] if not l.startswith(" " * 10)), text
    assert text[-1] == "FAILED: 1 of 19 required checks failed (no_solution_leakage)"


def test_a_project_folder_is_served_in_process_for_the_semantic_level(tmp_path):
    """A project whose app is a broken environment fails its check; one made by `openenv init` passes."""
    good = init_project("guess_env", tmp_path, log=None)
    report = validate(str(good), level="semantic")
    assert report["passed"] and report["level"] == "semantic", format_report(report)
    leaky = tmp_path / "leaky"
    leaky.mkdir()
    (leaky / "leaky_env.py").write_text(Path(broken_envs.__file__).read_text())
    (leaky / "openenv.yaml").write_text("name: leaky\napp: leaky_env:Leaky\n")
    report = validate_project(leaky, level="semantic")
    failed = [c["id"] for c in report["criteria"] if c["required"] and not c["passed"]]
    assert failed == ["no_solution_leakage"], format_report(report)  # (and warnings: no Dockerfile, README, pyproject)


def test_by_url_the_checks_that_need_the_code_say_so(server):
    """A server known by its URL cannot show its answer: the check says so; given the class, the check runs."""
    url = server("broken_envs:Leaky")
    report = validate_url(url, level="semantic")
    leak = next(c for c in report["criteria"] if c["id"] == "no_solution_leakage")
    assert report["passed"] and leak["skipped"] and "known by its URL only" in leak["details"], format_report(report)
    floor = next(c for c in report["criteria"] if c["id"] == "floor_gap")
    assert floor["skipped"]
    report = validate_url(url, level="semantic", max_return=1.0)  # declared by the caller
    assert next(c for c in report["criteria"] if c["id"] == "floor_gap")["passed"] is True
    report = validate_url(url, level="semantic", env=broken_envs.Leaky)
    assert report["summary"]["failed_criteria"] == ["no_solution_leakage"], format_report(report)


def test_a_url_has_no_static_level(echo_url):
    with pytest.raises(ValueError, match="runtime or semantic"): validate(echo_url, level="static")
    with pytest.raises(ValueError, match="level must be one of"): validate(".", level="deep")


# --- tool environments: tools/list, their schemas, reserved names -----------------------------------------------------

class Unlisted(MCPEchoEnvironment):
    "A tool environment whose `tools/list` fails."
    def list_tools(self): raise RuntimeError("the tool registry is down")


class Misspelt(MCPEchoEnvironment):
    "A tool whose hand-written input schema misspells a type."
    def __init__(self):
        super().__init__()
        t = self.toolset.tools["echo_message"]
        self.toolset.add(replace(t, input_schema={**t.input_schema, "properties": {"message": {"type": "strnig"}}}))


class Stepping(MCPEchoEnvironment):
    "Lists a tool named `step`, slipped past the check that `@tool` makes when a class is defined."
    def __init__(self):
        super().__init__()
        self.toolset.add(replace(self.toolset.tools["echo_message"], name="step"))


class Toolless(MCPEnvironment):
    "A tool environment that declares no tools."


TOOL_BROKEN = {"tools_list": Unlisted, "json_schemas": Misspelt, "reserved_tool_names": Stepping}
TOOLS_LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}


def serves_tools() -> bool:
    """Whether the server serves a tool environment's tools on `POST /mcp`."""
    with TestClient(create_app(MCPEchoEnvironment)) as c: reply = c.post("/mcp", json=TOOLS_LIST).json()
    return bool((reply.get("result") or {}).get("tools"))


def needs_served_tools():
    if not serves_tools():
        pytest.skip("the server does not serve tools on POST /mcp yet (tools/list lists none for MCPEchoEnvironment): "
                    "the runtime check of a tool environment served by openenv-nb waits for it")


def rpc_app(cls, listed=None) -> FastAPI:
    """`create_app(cls)` behind a `POST /mcp` answered by `mcp.rpc` on a fresh `cls()` (or with `listed` as the tools):
    a tool server over the wire, whatever our own server serves."""
    app = FastAPI(openapi_url=None)

    @app.post("/mcp")
    async def answer(request: Request):
        if listed is not None: return {"jsonrpc": "2.0", "id": 1, "result": {"tools": listed}}
        return await rpc(cls(), await request.body())

    app.mount("/", create_app(cls, max_concurrent_envs=16))
    return app


def test_a_tool_environment_passes_the_static_level():
    report = validate_env(MCPEchoEnvironment)
    assert report["passed"], format_report(report)
    assert [c["id"] for c in report["criteria"]] == ["app_builds", "json_schemas", "reserved_tool_names", "tools_list"]
    assert report["criteria"][-1]["details"] == "listed: echo_message, echo_with_length"


@pytest.mark.parametrize("check", list(TOOL_BROKEN))
def test_each_broken_tool_environment_fails_its_check_alone(check):
    report = validate_env(TOOL_BROKEN[check])
    assert not report["passed"] and report["summary"]["failed_criteria"] == [check], format_report(report)
    assert next(c for c in report["criteria"] if c["id"] == check)["details"], report["criteria"]


def test_the_static_level_says_why():
    details = {c["id"]: c.get("details") for cls in TOOL_BROKEN.values() for c in validate_env(cls)["criteria"] if not c["passed"]}
    assert details == {"tools_list": "tools/list answered error -32603: RuntimeError: the tool registry is down",
                       "json_schemas": "tool 'echo_message': properties/message/type: 'strnig' is not valid under any of the given schemas",
                       "reserved_tool_names": "reserved: step"}
    assert validate_env(Toolless)["summary"]["failed_criteria"] == ["tools_list"]  # nothing for an agent to call


def test_the_schema_check_is_jsonschemas_own():
    """A tool schema fails `json_schemas` exactly when jsonschema's `check_schema` refuses it."""
    for s in ({"type": "object", "properties": {"m": {"type": "strnig"}}}, {"type": "object", "required": "m"},
              {"type": "object", "properties": {"m": {"type": "string", "minLength": 1}}}, {"type": "object"}):
        try: jsonschema.Draft202012Validator.check_schema(s); ok = True
        except jsonschema.SchemaError: ok = False
        assert (schema_problems(s) == []) == ok, s


@pytest.mark.parametrize("cls, failed", [(MCPEchoEnvironment, []), (Unlisted, ["mcp_tools_list"]), (Misspelt, ["mcp_tools_list"]),
                                         (Stepping, ["mcp_tools_list"])])
def test_the_runtime_level_asks_tools_list_over_the_wire(cls, failed):
    """By URL alone: the server is taken for a tool environment from its `/schema`, and what `POST /mcp` lists is checked."""
    with serve_in_thread(rpc_app(cls)) as url: report = validate_url(url)
    assert report["summary"]["failed_criteria"] == failed, format_report(report)
    assert report["criteria"][-1]["id"] == "mcp_tools_list" and report["criteria"][-1]["details"]


def test_a_tool_server_that_lists_nothing_fails_over_the_wire():
    with serve_in_thread(rpc_app(MCPEchoEnvironment, listed=[])) as url: report = validate_url(url)
    assert report["summary"]["failed_criteria"] == ["mcp_tools_list"], format_report(report)
    assert report["criteria"][-1]["details"] == "no tools listed: an agent has nothing to call"
    bad = [{"name": "close", "inputSchema": {"type": "string"}}]
    with serve_in_thread(rpc_app(MCPEchoEnvironment, listed=bad)) as url: details = validate_url(url)["criteria"][-1]["details"]
    assert details == ("tool 'close': inputSchema is not an object schema: {\"type\": \"string\"}; tool 'close' takes a reserved name"), details


def test_a_classic_server_has_no_tool_check():
    with serve_in_thread(create_app(broken_envs.Guess)) as url:  # echo is a tool environment now; Guess lists no tools
        assert "mcp_tools_list" not in [c["id"] for c in validate_url(url)["criteria"]]


def test_our_server_of_a_tool_environment_passes_the_runtime_level():
    needs_served_tools()
    report = validate_env(MCPEchoEnvironment, level="runtime")
    assert report["passed"] and report["criteria"][-1]["id"] == "mcp_tools_list", format_report(report)


@pytest.mark.parametrize("check", list(TOOL_BROKEN))
def test_our_server_of_a_broken_tool_environment_fails_over_the_wire_too(check):
    needs_served_tools()
    report = validate_env(TOOL_BROKEN[check], level="runtime")
    assert report["summary"]["failed_criteria"] == [check, "mcp_tools_list"], format_report(report)


# --- determinism and adversarial: planted reward bugs, each caught by its level ---------------------------------------

@pytest.mark.parametrize("bug", list(broken_envs.CHEATS))
def test_each_planted_reward_bug_is_caught_by_its_level(bug):
    name, level, check = broken_envs.CHEATS[bug]
    report = validate(f"broken_envs:{name}", level=level, budget=200)
    failed = next(c for c in report["criteria"] if c["id"] == check)
    assert not report["passed"] and not failed["passed"], format_report(report)
    assert ":" in failed["details"] or "(" in failed["details"], failed  # says what to do
    below = {"adversarial": "determinism", "determinism": "runtime"}[level]  # the level below does not see it
    assert check not in validate(f"broken_envs:{name}", level=below)["summary"]["failed_criteria"]


def test_guess_passes_all_levels_and_reports_each_policy():
    report = validate("broken_envs:Guess", level="all", budget=200)
    assert report["passed"] and report["level"] == "adversarial", format_report(report)
    assert list(report["policies"]) == ["do-nothing", "random", "degenerate", "invalid", "hill-climb"]
    assert report["policies"]["invalid"]["invalid_share"] == 1.0  # refused by the server, earning nothing
    ends = next(c for c in report["criteria"] if c["id"] == "episodes_end")
    assert ends["passed"] and not ends.get("skipped"), ends


def test_a_declared_unsupported_seed_is_warned_of_not_ignored():
    report = validate("broken_envs:DeclaredUnseeded", level="determinism")
    by = {c["id"]: c for c in report["criteria"]}
    assert by["seed_honesty"]["passed"] and "seed 5 was not honoured" in by["seed_honesty"]["details"], by["seed_honesty"]
    assert by["episode_determinism"]["skipped"] and by["seeds_differ"]["skipped"]


def test_the_adversarial_report_from_the_command_line(server):
    url = server("broken_envs:MessageLength")  # by URL: held to what its /metadata declares
    r = openenv("validate", "--url", url, "--level", "all", "--budget", "200", "--json")
    report = json.loads(r.stdout)
    assert r.returncode == 1 and report["summary"]["failed_criteria"] == ["no_unsolved_reward"], r.stdout[-2000:]
    assert report["policies"]["degenerate"]["return"] == pytest.approx(0.8)
    r = openenv("validate", "--url", url, "--level", "adversarial", "--budget", "200")
    table = r.stdout.splitlines()[-6:]
    assert len(table) == 6, (r.returncode, r.stdout[-1000:], r.stderr[-2000:])
    assert table[0].split()[:5] == ["policy", "return", "episodes", "steps", "invalid"], r.stdout
    assert table[3].split()[:2] == ["degenerate", "0.8"], table
