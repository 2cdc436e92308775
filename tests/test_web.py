"""The web interface in a real browser: Debian's Chromium, driven by Playwright for Python.

Skipped when Chromium or Playwright is missing, failed instead when OPENENV_REQUIRE names `browser`.
Screenshots go to $OPENENV_ARTIFACTS, else openenv-nb-artifacts-UID/ in the temporary folder, for a person to look at.
"""
import importlib.util
import json
import os
import re
import tempfile
from enum import Enum
from pathlib import Path
from typing import Literal

import pytest
from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from pydantic import Field, field_validator

from conftest import start_server, need_browser, CHROMIUM
from openenv_nb.client import GenericEnvClient
from openenv_nb.environment import Environment
from openenv_nb.server import create_app, serve_in_thread
from openenv_nb.types import Action, Observation, State

pytestmark = pytest.mark.browser

ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking"]
# one folder a user: another user's run on the same machine owns the one it made
ARTIFACTS = Path(os.environ.get("OPENENV_ARTIFACTS") or Path(tempfile.gettempdir()) / f"openenv-nb-artifacts-{os.getuid()}")
HAS_CODING = importlib.util.find_spec("openenv_nb.envs.coding") is not None


# ---- an environment with one field of each kind ----
class Colour(str, Enum):
    red = "red"
    green = "green"


class Knobs(Action):
    """One field of each kind a form can hold."""
    message: str = Field(description="Text to send")
    count: int = Field(3, ge=0, le=10, description="How many times")
    scale: float = Field(1.0, gt=0)
    loud: bool = False
    mode: Literal["plain", "fancy"] = "plain"
    colour: Colour | None = None
    code: str = ""
    tags: list[str] = []

    @field_validator("message")
    @classmethod
    def not_forbidden(cls, v):
        if v == "forbidden": raise ValueError("that word is not allowed")
        return v


class Dial(Observation):
    text: str = ""


class KnobsEnv(Environment[Knobs, Dial, State]):
    """Repeats the message `count` times; the reward is `count * scale`."""
    SUPPORTS_CONCURRENT_SESSIONS = True
    def __init__(self): super().__init__(); self._state = State()
    def reset(self, seed=None, episode_id=None, **kw):
        self._state = State(episode_id=episode_id or "knobs-1", step_count=0)
        return Dial(text="ready", reward=0.0)
    def step(self, action, timeout_s=None, **kw):
        if action.message == "boom": raise RuntimeError("the environment blew up")
        self._state.step_count += 1
        text = " ".join([action.message.upper() if action.loud else action.message] * action.count)
        return Dial(text=text, reward=action.count * action.scale, done=action.count == 0)
    @property
    def state(self): return self._state


# ---- fixtures ----
@pytest.fixture(scope="module")
def browser():
    sync_playwright = need_browser()
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def echo_web(browser):
    """An echo server started by `openenv serve echo --web`, in a subprocess."""
    p = start_server("echo", "--web")
    yield p.base_url
    p.stop()


@pytest.fixture(scope="module")
def knobs_web(browser):
    with serve_in_thread(create_app(KnobsEnv, web=True)) as url: yield url


@pytest.fixture
def open_page(browser):
    """Factory: `open_page(url)` gives a page on `url/web` (or at `url`, a share link), connected;
    every page is closed after the test."""
    from playwright.sync_api import expect
    ctx = browser.new_context(viewport={"width": 1280, "height": 860})
    errors = []
    def make(url, sent=None):
        page = ctx.new_page()
        page.on("pageerror", lambda e: errors.append(str(e)))
        if sent is not None:  # record the frames the page sends on its sockets
            page.on("websocket", lambda ws: ws.on("framesent", lambda payload: sent.append(json.loads(payload))))
        page.goto(url if "/web" in url else url + "/web")  # a server's address, or a share link
        expect(page.locator("#status")).to_have_text("live")
        return page
    yield make
    ctx.close()
    assert not errors, f"the page's script failed: {errors}"


def shot(page, name: str):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)


# ---- the echo environment ----
def test_step_shows_observation_and_history(open_page, echo_web):
    from playwright.sync_api import expect
    page = open_page(echo_web)
    expect(page.locator("#env-name")).to_have_text("EchoEnvironment")
    page.click("#reset")
    expect(page.locator("#observation")).to_contain_text("Echo environment ready!")
    expect(page.locator("#stat-step")).to_have_text("0")
    page.fill("#field-message", "hello")
    page.click("#step")
    expect(page.locator("#observation")).to_contain_text("hello")
    expect(page.locator("#stat-reward")).to_have_text("0.5")
    expect(page.locator("#stat-step")).to_have_text("1")
    expect(page.locator("#stat-done")).to_have_text("no")
    rows = page.locator("#history tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.nth(0)).to_contain_text("hello")
    expect(rows.nth(1)).to_contain_text("reset")
    page.fill("#field-message", "enter works")
    page.press("#field-message", "Enter")
    expect(rows).to_have_count(3)
    expect(rows.nth(0).locator("td").nth(3)).to_have_text("1.1")
    page.click("#raw summary")
    raw = json.loads(page.locator("#raw-json").text_content())
    assert raw["type"] == "observation" and {k: v for k, v in raw["data"]["observation"].items() if k != "metadata"} == {"echoed_message": "enter works", "message_length": 11}
    assert raw["data"]["metadata"] == {"original_message": "enter works", "step": 2}
    page.click("#state")
    expect(page.locator("#state-view")).to_contain_text('"step_count": 2')
    expect(page.locator("#plot svg circle")).to_have_count(2)
    shot(page, "web-echo.png")


def test_two_tabs_get_two_independent_episodes(open_page, echo_web):
    from playwright.sync_api import expect
    a, b = open_page(echo_web), open_page(echo_web)
    for page in (a, b):
        expect(page.locator("#pages")).to_have_text("1 page open")
        expect(page.locator("#share-what")).to_have_text(
            "Watch or drive this episode from another tab: ")
    links = [p.locator("#share-link").get_attribute("href") for p in (a, b)]
    share = re.escape(echo_web) + r"/web/\?join=[\w-]{12}"
    assert links[0] != links[1] and all(re.fullmatch(share, u) for u in links)
    a.click("#reset")
    a.fill("#field-message", "from page A")
    a.click("#step")
    expect(a.locator("#history tbody tr")).to_have_count(2)
    b.click("#state")  # a round trip: B's episode never began, and A's step is not in it
    expect(b.locator("#state-view")).to_contain_text('"step_count": 0')
    expect(b.locator("#history tbody tr")).to_have_count(0)
    expect(b.locator("#observation")).to_contain_text("No episode yet")
    b.click("#reset")
    b.fill("#field-message", "from page B")
    b.click("#step")
    expect(b.locator("#history tbody tr")).to_have_count(2)
    expect(b.locator("#history tbody tr").nth(0)).to_contain_text("from page B")
    expect(a.locator("#history tbody tr").nth(0)).to_contain_text("from page A")
    expect(a.locator("#history")).not_to_contain_text("from page B")
    expect(a.locator("#stat-step")).to_have_text("1")
    shot(b, "web-own-episode.png")


def test_a_tab_that_joins_by_the_share_link_sees_and_drives_the_same_episode(open_page, echo_web):
    from playwright.sync_api import expect
    a = open_page(echo_web)
    link = a.locator("#share-link").get_attribute("href")
    a.click("#reset")
    a.fill("#field-message", "from page A")
    a.click("#step")
    expect(a.locator("#history tbody tr")).to_have_count(2)
    b = open_page(link)
    expect(b.locator("#share-link")).to_have_attribute("href", link)
    for page in (a, b):
        expect(page.locator("#pages")).to_have_text("2 pages open")
        expect(page.locator("#history tbody tr").nth(0)).to_contain_text("from page A")
    expect(b.locator("#step")).to_have_class(re.compile(r"\bprimary\b"))  # B may step at once
    b.fill("#field-message", "and from B")
    b.click("#step")
    expect(a.locator("#history tbody tr").nth(0)).to_contain_text("and from B")
    expect(a.locator("#history tbody tr")).to_have_count(3)
    expect(a.locator("#stat-step")).to_have_text("2")
    a.fill("#field-message", "A again")
    a.click("#step")
    expect(b.locator("#observation")).to_contain_text("A again")
    b.close()
    expect(a.locator("#pages")).to_have_text("1 page open")
    c = open_page(link)  # a page opened later with the link gets the history so far
    expect(c.locator("#history tbody tr")).to_have_count(4)
    expect(c.locator("#observation")).to_contain_text("A again")
    expect(c.locator("#notice")).to_be_hidden()
    shot(c, "web-joined.png")


def test_a_page_may_join_the_episode_of_the_http_routes(open_page, browser):
    import httpx
    from playwright.sync_api import expect
    with serve_in_thread(create_app(KnobsEnv, web=True)) as url:
        httpx.post(url + "/web/reset", json={"episode_id": "script"})
        httpx.post(url + "/web/step", json={"action": {"message": "set up", "count": 1}})
        page = open_page(url + "/web/?join=http")
        expect(page.locator("#share-what")).to_contain_text("the episode of the HTTP routes")
        expect(page.locator("#history tbody tr")).to_have_count(2)
        expect(page.locator("#stat-episode")).to_have_text("script")
        httpx.post(url + "/web/step", json={"action": {"message": "live", "count": 1}})
        expect(page.locator("#observation")).to_contain_text("live")
        page.fill("#field-message", "from the page")
        page.click("#step")
        expect(page.locator("#history tbody tr")).to_have_count(4)
        assert httpx.get(url + "/web/state").json() == {"episode_id": "script", "step_count": 3}


def test_a_page_beyond_capacity_is_told_what_to_do_and_may_join(open_page, browser):
    from playwright.sync_api import expect
    with serve_in_thread(create_app(KnobsEnv, web=True, max_concurrent_envs=1)) as url:
        first = open_page(url)
        link = first.locator("#share-link").get_attribute("href")
        ctx = browser.new_context()
        second = ctx.new_page()
        second.goto(url + "/web")
        message = second.locator("#message")
        expect(message).to_contain_text("CAPACITY_REACHED: Server at capacity: 1/1 environments")
        expect(message).to_contain_text("join an open episode with its share link")
        expect(second.locator("#status")).to_have_text("no room: click to retry")
        shot(second, "web-capacity.png")
        second.goto(link)  # joining needs no environment more
        expect(second.locator("#status")).to_have_text("live")
        expect(second.locator("#pages")).to_have_text("2 pages open")
        expect(second.locator("#message")).to_be_hidden()
        ctx.close()


def test_page_never_touches_other_sessions(open_page, echo_web):
    from playwright.sync_api import expect
    with GenericEnvClient(echo_web).sync() as trainer:
        trainer.reset(episode_id="trainer")
        trainer.step({"message": "mine"})
        page = open_page(echo_web)
        page.click("#reset")
        page.fill("#field-message", "page")
        for n in range(3):
            page.click("#step")
            expect(page.locator("#stat-step")).to_have_text(str(n + 1))
        assert trainer.state() == {"episode_id": "trainer", "step_count": 1}
        assert page.locator("#stat-episode").text_content() != "trainer"


# ---- every kind of field ----
def test_form_follows_the_schema(open_page, knobs_web):
    from playwright.sync_api import expect
    page = open_page(knobs_web)
    assert page.locator("#field-loud").get_attribute("type") == "checkbox"
    expect(page.locator("#field-mode option")).to_have_text(["plain", "fancy"])
    expect(page.locator("#field-colour option")).to_have_text(["—", "red", "green"])
    assert page.eval_on_selector("#field-code", "e => e.tagName + '.' + e.className") == "TEXTAREA.code"
    assert page.eval_on_selector("#field-tags", "e => e.tagName") == "TEXTAREA"
    expect(page.locator("[data-field=message] .req")).to_have_count(1)
    expect(page.locator("[data-field=count] .req")).to_have_count(0)
    expect(page.locator("[data-field=count] .hint")).to_have_text("How many times · ≥ 0, ≤ 10")
    assert page.input_value("#field-count") == "3"
    page.click("#reset")
    page.fill("#field-message", "hi")
    page.fill("#field-count", "2")
    page.fill("#field-scale", "1.5")
    page.check("#field-loud")
    page.select_option("#field-mode", label="fancy")
    page.select_option("#field-colour", label="green")
    page.fill("#field-tags", '["x", "y"]')
    page.click("#step")
    expect(page.locator("#observation")).to_contain_text("HI HI")
    expect(page.locator("#stat-reward")).to_have_text("3")
    action = page.locator("#history tbody tr").nth(0).locator("td").nth(1).get_attribute("title")
    for part in ("message=hi", "count=2", "scale=1.5", "loud=true", "mode=fancy", "colour=green", 'tags=["x","y"]'):
        assert part in action, (part, action)
    shot(page, "web-knobs.png")


def test_invalid_values_are_shown_and_not_sent(open_page, knobs_web):
    from playwright.sync_api import expect
    sent = []
    page = open_page(knobs_web, sent)
    page.click("#reset")
    expect(page.locator("#history tbody tr")).to_have_count(1)
    page.fill("#field-message", "hi")
    for field, value, msg in [("count", "abc", "Must be a whole number"), ("count", "11", "Must be at most 10"),
                              ("scale", "0", "Must be more than 0"), ("tags", "[oops", "Not valid JSON")]:
        page.fill(f"#field-{field}", value)
        page.click("#step")
        expect(page.locator(f"#error-field-{field}")).to_have_text(msg)
        assert page.get_attribute(f"#field-{field}", "aria-invalid") == "true"
        page.fill(f"#field-{field}", "")  # typing clears the error
        expect(page.locator(f"#error-field-{field}")).to_have_text("")
        page.fill(f"#field-{field}", value)
    page.click("#step")
    for field in ("count", "scale", "tags"): expect(page.locator(f"#error-field-{field}")).not_to_have_text("")
    shot(page, "web-field-errors.png")
    page.click("#state")  # a round trip: any step sent before it would be recorded before it
    expect(page.locator("#state-view")).to_contain_text('"step_count": 0')
    assert [f["type"] for f in sent] == ["reset", "state"], sent  # no step was sent
    expect(page.locator("#history tbody tr")).to_have_count(1)
    page.click("#reset-options summary")
    page.fill("#reset-seed", "-1")
    page.click("#reset")
    expect(page.locator("#error-reset-seed")).to_have_text("Must be at least 0")
    assert [f["type"] for f in sent] == ["reset", "state"], sent
    for field, value in [("count", "4"), ("scale", "0.5"), ("tags", "[]")]: page.fill(f"#field-{field}", value)
    page.click("#step")
    expect(page.locator("#observation")).to_contain_text("hi hi hi hi")
    assert [f["type"] for f in sent] == ["reset", "state", "step"]
    assert sent[-1]["data"] == {"message": "hi", "count": 4, "scale": 0.5, "loud": False, "mode": "plain", "tags": []}


def test_required_fields_are_checked_before_a_step_is_sent(open_page, knobs_web):
    from playwright.sync_api import expect
    sent = []
    page = open_page(knobs_web, sent)
    page.click("#reset")
    expect(page.locator("#history tbody tr")).to_have_count(1)
    expect(page.locator("[data-field=message] .req")).to_have_count(1)  # no default: required
    page.click("#step")
    expect(page.locator("#error-field-message")).to_have_text("Required")
    assert page.get_attribute("#field-message", "aria-invalid") == "true"
    assert page.evaluate("document.activeElement.id") == "field-message"
    page.press("#field-message", "Enter")  # the keyboard path is checked the same way
    page.click("#state")  # a round trip: a step sent before it would be recorded before it
    expect(page.locator("#state-view")).to_contain_text('"step_count": 0')
    assert [f["type"] for f in sent] == ["reset", "state"], sent
    shot(page, "web-required.png")
    page.fill("#field-message", "x")
    expect(page.locator("#error-field-message")).to_have_text("")
    page.fill("#field-message", "now")
    page.click("#step")
    expect(page.locator("#observation")).to_contain_text("now now now")
    assert [f["type"] for f in sent] == ["reset", "state", "step"]
    assert "code" not in sent[-1]["data"]  # an empty optional field: its default


def test_reset_is_the_primary_action_until_an_episode_exists(open_page, knobs_web):
    from playwright.sync_api import expect
    primary = re.compile(r"\bprimary\b")
    sent = []
    page = open_page(knobs_web, sent)
    expect(page.locator("#reset")).to_have_class(primary)
    expect(page.locator("#step")).not_to_have_class(primary)
    expect(page.locator("#step")).to_be_disabled()
    expect(page.locator("#step")).to_have_attribute("title", "Reset first: no episode yet")
    expect(page.locator("#step-hint")).to_contain_text("press Reset to start one")
    page.fill("#field-message", "too soon")
    page.press("#field-message", "Enter")
    page.press("#field-message", "Control+Enter")
    expect(page.locator("#message")).to_have_text("Reset first: no episode yet.")
    assert sent == [], sent
    shot(page, "web-before-reset.png")
    page.click("#reset")
    expect(page.locator("#step")).to_have_class(primary)
    expect(page.locator("#reset")).not_to_have_class(primary)
    expect(page.locator("#step")).to_be_enabled()
    expect(page.locator("#step-hint")).to_be_hidden()
    page.fill("#field-count", "0")  # a step that ends the episode: Reset leads again
    page.click("#step")
    expect(page.locator("#stat-done")).to_have_text("yes")
    expect(page.locator("#reset")).to_have_class(primary)
    expect(page.locator("#step")).not_to_have_class(primary)
    assert [f["type"] for f in sent] == ["reset", "step"]


def test_server_errors_are_shown(open_page, knobs_web):
    from playwright.sync_api import expect
    page = open_page(knobs_web)
    page.click("#reset")
    page.fill("#field-message", "forbidden")  # passes the page's checks, fails the server's
    page.click("#step")
    expect(page.locator("#error-field-message")).to_contain_text("that word is not allowed")
    page.fill("#field-message", "boom")
    page.click("#step")
    expect(page.locator("#message")).to_contain_text("EXECUTION_ERROR: RuntimeError: the environment blew up")
    page.fill("#field-message", "fine")
    page.click("#step")
    expect(page.locator("#message")).to_be_hidden()
    expect(page.locator("#observation")).to_contain_text("fine fine fine")


# ---- the coding environment, once it exists ----
@pytest.mark.skipif(not HAS_CODING, reason="openenv_nb.envs.coding is not built yet")
def test_coding_env(open_page, server):
    from playwright.sync_api import expect
    url = server("coding", "--web", max_sessions=1)
    page = open_page(url)
    assert page.eval_on_selector("#field-code", "e => e.tagName + '.' + e.className") == "TEXTAREA.code"
    page.click("#reset")
    expect(page.locator("#history tbody tr")).to_have_count(1, timeout=30_000)  # the first call makes the environment
    page.fill("#field-code", "x = 6 * 7\nprint(x)")
    page.click("#step")
    expect(page.locator("#observation")).to_contain_text("42", timeout=30_000)
    expect(page.locator("#history tbody tr")).to_have_count(2)
    page.fill("#field-code", "raise ValueError('nope')")
    page.click("#step")
    expect(page.locator("#history tbody tr")).to_have_count(3, timeout=30_000)
    expect(page.locator("#observation")).to_contain_text("nope")
    shot(page, "web-coding.png")


# ---- the doors: a token, another site, an idle page ----
def test_page_asks_for_the_token_once_and_keeps_it_for_the_tab(browser):
    from playwright.sync_api import expect
    with serve_in_thread(create_app(KnobsEnv, web=True, token="s3cret-t0ken")) as url:
        ctx = browser.new_context()
        page = ctx.new_page()
        page.goto(url + "/web")
        expect(page.locator("#status")).to_have_text("token needed")
        page.fill("#token-input", "wrong")
        page.click("#token-connect")
        expect(page.locator("#token-error")).to_have_text("The server refused this token.")
        page.fill("#token-input", "s3cret-t0ken")
        page.press("#token-input", "Enter")
        expect(page.locator("#status")).to_have_text("live")
        expect(page.locator("#token-form")).to_be_hidden()
        page.click("#reset")
        expect(page.locator("#history tbody tr")).to_have_count(1)
        page.reload()  # the tab keeps it
        expect(page.locator("#status")).to_have_text("live")
        assert page.evaluate("sessionStorage.getItem('openenv-nb-token')") == "s3cret-t0ken"
        shot(page, "web-token.png")
        fresh = browser.new_context()  # another browser session: asked again
        other = fresh.new_page()
        other.goto(url + "/web")
        expect(other.locator("#status")).to_have_text("token needed")
        fresh.close(); ctx.close()


ATTACK = """<!doctype html><script>
window.result = new Promise((done) => {
  const ws = new WebSocket(TARGET.replace("http", "ws") + "/ws/ui");
  ws.onmessage = (m) => { done("read: " + m.data.slice(0, 40)); ws.send(JSON.stringify({type: "step", data: {message: "pwned"}})); };
  ws.onclose = () => done("refused");
});
fetch(TARGET + "/web/step", {method: "POST", mode: "no-cors", headers: {"content-type": "text/plain"},
                              body: JSON.stringify({action: {message: "pwned"}})}).catch(() => {});
</script>"""


def test_a_page_from_another_site_can_neither_read_nor_drive_the_episode(browser, echo_web):
    """Finding 1: a page on another origin opened /ws/ui, read the shared history and stepped the episode."""
    from playwright.sync_api import expect
    evil = FastAPI()
    evil.get("/")(lambda: HTMLResponse(ATTACK.replace("TARGET", json.dumps(echo_web))))
    with serve_in_thread(evil) as evil_url:
        page = browser.new_context().new_page()
        page.goto(evil_url + "/")
        assert page.evaluate("window.result") == "refused"
        page.wait_for_load_state("networkidle")  # the fetch has been answered
    with GenericEnvClient(echo_web).sync() as trainer:  # a trainer still gets in: it sends no Origin
        assert trainer.reset().observation["echoed_message"]
    page = browser.new_context().new_page()
    page.goto(echo_web + "/web")
    expect(page.locator("#status")).to_have_text("live")
    assert "pwned" not in page.locator("#history").text_content()


def test_an_idle_page_is_let_go_and_comes_back_when_used(browser):
    from playwright.sync_api import expect
    with serve_in_thread(create_app(KnobsEnv, web=True, session_timeout=1)) as url:
        page = browser.new_context().new_page()
        page.goto(url + "/web")
        expect(page.locator("#status")).to_have_text("idle: click to reconnect", timeout=15_000)
        expect(page.locator("#message")).to_contain_text("SESSION_ERROR: Page closed after 1 s without a message")
        first = page.locator("#share-link").get_attribute("href")
        page.click("h1")
        expect(page.locator("#status")).to_have_text("live")  # a new room, and it says so
        expect(page.locator("#notice")).to_have_text(
            "The episode this page was in has ended (its last page closed): this is a new one.")
        assert page.locator("#share-link").get_attribute("href") != first


# ---- a tool environment, images, rubric components, parity with OpenEnv's page ----
from openenv_nb.mcp import MCPEchoEnvironment  # noqa: E402
from openenv_nb.forms import RUBRIC_KEY  # noqa: E402

PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGNQTX4NAAIkAXSaGkHUAAAAAElFTkSuQmCC"


class Say(Action):
    message: str = ""


class Picture(Observation):
    frame: str = PNG
    text: str = ""
    lines: list[dict] = []


class Painter(Environment[Say, Picture, State]):
    """Draws a frame at every step, with the rubric's scores in its metadata."""
    SUPPORTS_CONCURRENT_SESSIONS = True
    def __init__(self): super().__init__(); self._state = State()
    def reset(self, seed=None, episode_id=None, **kw):
        self._state = State(episode_id="paint", step_count=0)
        return Picture(text="ready", reward=0.0)
    def step(self, action, timeout_s=None, **kw):
        self._state.step_count += 1
        n = self._state.step_count
        return Picture(text=f"line one\nline two {action.message}", reward=0.5 * n, lines=[{"role": "game", "content": "a\nb"}],
                       metadata={RUBRIC_KEY: {"format": 1.0, "win": 0.25 * n, "total": 0.5 * n}})
    @property
    def state(self): return self._state


def test_tool_environment_has_a_form_per_tool(open_page):
    from playwright.sync_api import expect
    sent = []
    with serve_in_thread(create_app(MCPEchoEnvironment, web=True)) as url:
        page = open_page(url, sent)
        expect(page.locator("#tool option")).to_have_text(["echo_message", "echo_with_length"])
        expect(page.locator("#tool-about")).to_have_text("Echo back the provided message.")
        expect(page.locator("#step")).to_have_text("Call")
        page.click("#reset")
        page.fill("#field-message", "hello tools")
        page.click("#step")
        rows = page.locator("#history tbody tr")
        expect(rows).to_have_count(2)
        expect(rows.nth(0).locator("td").nth(1)).to_have_text('echo_message(message="hello tools")')
        expect(rows.nth(0).locator("td").nth(2)).to_have_text("hello tools")
        assert sent[-1]["data"] == {"type": "call_tool", "tool_name": "echo_message", "arguments": {"message": "hello tools"}}
        page.select_option("#tool", "echo_with_length")
        expect(page.locator("#tool-about")).to_have_text("Echo back the message with its length.")
        page.fill("#field-message", "abc")
        page.click("#step")
        expect(rows.nth(0).locator("td").nth(2)).to_contain_text('"length":3')
        shot(page, "web-tools.png")
        page.click("#state")
        expect(page.locator("#state-view")).to_contain_text('"step_count": 2')


def test_tool_errors_show_in_the_history(open_page):
    from playwright.sync_api import expect
    with serve_in_thread(create_app(MCPEchoEnvironment, web=True)) as url:
        page = open_page(url)
        page.click("#reset")
        page.evaluate("""() => { const s = document.querySelector('#tool'); const o = document.createElement('option');
                                 o.value = o.textContent = 'no_such_tool'; s.append(o); s.value = 'no_such_tool';
                                 s.dispatchEvent(new Event('change')); }""")
        page.fill("#field-tool_name", "no_such_tool")  # required: an empty one would not be sent
        page.click("#step")
        row = page.locator("#history tbody tr").nth(0)
        expect(row).to_have_class(re.compile(r"\bfailed\b"))  # an unknown tool: the page falls back on the raw call_tool form
        expect(row.locator("td").nth(2)).to_contain_text("tool_not_found")
        expect(page.locator("#message")).to_contain_text("tool_not_found: Unknown tool")


def test_images_rubric_and_readable_text(open_page):
    from playwright.sync_api import expect
    with serve_in_thread(create_app(Painter, web=True)) as url:
        page = open_page(url)
        expect(page.locator("#env-description")).to_have_text("Draws a frame at every step, with the rubric's scores in its metadata.")
        page.click("#reset")
        expect(page.locator("#observation figure[data-field=frame] img")).to_have_count(1)
        assert page.get_attribute("#observation figure img", "src") == PNG
        assert page.eval_on_selector("#observation figure img", "i => i.complete && i.naturalWidth") == 1  # the CSP let it load
        expect(page.locator("#plot")).to_contain_text("Rewards appear here")
        for m in ("a", "b"):
            page.fill("#field-message", m)
            page.click("#step")
        expect(page.locator("#history tbody tr")).to_have_count(3)
        expect(page.locator("#history tbody tr").nth(0).locator("td").nth(2)).to_contain_text("frame=[image]")
        expect(page.locator("#plot g.series")).to_have_count(3)  # the reward, then format and win; total is the reward's line
        expect(page.locator("#plot .legend span")).to_have_text(["━ reward", "━ format", "━ win"])
        expect(page.locator("#plot g[data-name=win] circle")).to_have_count(2)
        assert "line one\nline two b" in page.locator("#observation pre.code").first.text_content()
        expect(page.locator("#observation ol.list li")).to_have_count(1)
        assert "a\nb" in page.locator("#observation ol.list li").text_content()
        shot(page, "web-images-rubric.png")


def test_all_zero_rewards_label_zero_once(open_page):
    from playwright.sync_api import expect
    with serve_in_thread(create_app(KnobsEnv, web=True)) as url:
        page = open_page(url)
        page.click("#reset")
        page.fill("#field-message", "x")
        page.fill("#field-count", "0")
        page.click("#step")
        expect(page.locator("#plot svg circle")).to_have_count(1)
        expect(page.locator("#plot text.ylabel")).to_have_text(["0"])


def test_root_redirects_and_state_before_reset(browser):
    import httpx
    with serve_in_thread(create_app(KnobsEnv, web=True)) as url:
        r = httpx.get(url + "/", follow_redirects=False)
        assert (r.status_code, r.headers["location"]) == (307, "/web/")
        r = httpx.get(url + "/web/state")
        assert r.status_code == 409 and "reset" in r.json()["detail"]
        httpx.post(url + "/web/reset", json={})
        assert httpx.get(url + "/web/state").json()["step_count"] == 0


# ---- fork from here ----
def test_fork_from_here_opens_a_copy_that_goes_on_alone(open_page, echo_web):
    """Fork opens a new tab on a copy of the episode; stepping the copy leaves the original as it was, and the copy's
    reply is the one a from-scratch replay of the same actions gives."""
    from playwright.sync_api import expect
    a = open_page(echo_web)
    fork = a.locator("#fork")
    expect(fork).to_be_disabled()  # no episode yet
    a.click("#reset")
    for m in ("one", "two"):
        a.fill("#field-message", m)
        a.click("#step")
        expect(a.locator("#history tbody tr").nth(0)).to_contain_text(m)
    with a.context.expect_page() as opened:
        fork.click()
    b = opened.value
    expect(b.locator("#status")).to_have_text("live")
    expect(b.locator("#notice")).to_contain_text("A copy of the episode at step 2")
    expect(b.locator("#history tbody tr")).to_have_count(3)  # the history so far came along
    expect(b.locator("#stat-step")).to_have_text("2")
    link = b.locator("#share-link").get_attribute("href")
    assert link != a.locator("#share-link").get_attribute("href") and "join=" in link
    assert b.url == link  # a reload joins the copy rather than forking again
    b.fill("#field-message", "three")
    b.click("#step")
    expect(b.locator("#stat-step")).to_have_text("3")
    expect(b.locator("#history tbody tr")).to_have_count(4)
    b.click("#raw summary")
    got = json.loads(b.locator("#raw-json").text_content())["data"]
    with GenericEnvClient(echo_web).sync() as c:
        c.reset()
        for m in ("one", "two"): c.step({"message": m})
        r = c.step({"message": "three"})
    assert got["observation"] == r.observation and got["reward"] == r.reward and got["metadata"] == r.metadata
    # the original is as it was: two steps, "two" last; its state says so too
    expect(a.locator("#stat-step")).to_have_text("2")
    expect(a.locator("#history tbody tr")).to_have_count(3)
    expect(a.locator("#history")).not_to_contain_text("three")
    a.click("#state")
    expect(a.locator("#state-view")).to_contain_text('"step_count": 2')
    expect(a.locator("#pages")).to_have_text("1 page open")
    b.click("#state")
    expect(b.locator("#state-view")).to_contain_text('"step_count": 3')
    shot(b, "web-forked.png")
    c = open_page(link)  # the copy's share link joins it
    expect(c.locator("#history tbody tr")).to_have_count(4)
    expect(c.locator("#notice")).to_be_hidden()
    b.reload()  # asks to join by its address (not to fork again); with c there, the copy is still open
    expect(b.locator("#status")).to_have_text("live")
    expect(b.locator("#history tbody tr")).to_have_count(4)
    expect(b.locator("#pages")).to_have_text("2 pages open")


def test_fork_of_an_environment_that_cannot_be_copied_says_so(open_page, knobs_web):
    "An environment that neither copies nor replays itself: the new tab gets a new episode, and the reason."
    from playwright.sync_api import expect
    a = open_page(knobs_web)
    a.click("#reset")
    expect(a.locator("#fork")).to_be_enabled()
    with a.context.expect_page() as opened:
        a.click("#fork")
    b = opened.value
    expect(b.locator("#status")).to_have_text("live")
    expect(b.locator("#notice")).to_contain_text("No copy was made")
    expect(b.locator("#notice")).to_contain_text("can neither copy its state")
    expect(b.locator("#observation")).to_contain_text("No episode yet")
