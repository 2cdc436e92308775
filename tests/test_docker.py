"""Environments in real Docker containers: images built once per session, episodes over WS and HTTP, failures that
leave nothing behind, pools, and the clean-up of crashed callers. Needs a running Docker engine;
skipped without one unless OPENENV_REQUIRE names `docker`."""
import asyncio
import os
import subprocess
import sys
import textwrap
import threading
import time
import tomllib
from pathlib import Path

import pytest

from openenv_nb.client import GenericEnvClient
from openenv_nb.envs.coding import CodeAction, CodingEnv, CodingHTTPEnv
from openenv_nb.envs.echo import EchoAction, EchoEnv, EchoHTTPEnv
from openenv_nb.images import BUILTIN, ImageBuildError, build, builtin_dockerfile, check_dockerfile, project_dockerfile
from openenv_nb.providers import (LABEL, OWNER_LABEL, DockerProvider, ProviderError, ServerPool, cleanup, owner_alive,
                                  owner_id)
from openenv_nb.scaffold import init_project
from openenv_nb.types import EnvConnectionError
from openenv_nb.vector import VectorEnv

pytestmark = pytest.mark.docker
NBS = Path(__file__).parent.parent / "nbs"


@pytest.fixture(scope="session")
def engine(docker_engine): return docker_engine


def quiet(line): pass


@pytest.fixture(scope="session")
def echo_image(engine):
    return build("echo", log=quiet)


@pytest.fixture(scope="session")
def coding_image(engine):
    return build("coding", log=quiet)


SLOW_ENV = '''
import os, time
from openenv_nb.environment import Environment
from openenv_nb.envs.echo import EchoAction, EchoObservation
from openenv_nb.types import State

class SlowEnv(Environment[EchoAction, EchoObservation, State]):
    "Echo, but `sleep N` says so in the log, then sleeps N seconds (in the server's thread pool); reset greets with $GREETING."
    SUPPORTS_CONCURRENT_SESSIONS = True
    def __init__(self): super().__init__(); self._state = State()
    def reset(self, seed=None, episode_id=None, **kw):
        self._state = State(episode_id=episode_id, step_count=0)
        return EchoObservation(echoed_message=os.environ.get("GREETING", "ready"), reward=0.0)
    def step(self, action, timeout_s=None, **kw):
        if action.message.startswith("sleep "):
            print("sleeping", flush=True)
            time.sleep(float(action.message.split()[1]))
        self._state.step_count += 1
        return EchoObservation(echoed_message=action.message, message_length=len(action.message), reward=1.0)
    @property
    def state(self): return self._state
'''


@pytest.fixture(scope="session")
def project_image(engine, tmp_path_factory):
    "An `openenv init`-style project built from the reference Dockerfile: a slow env, and a module that crashes."
    proj = tmp_path_factory.mktemp("docker-project") / "slowenv"
    proj.mkdir()
    (proj / "Dockerfile").write_text(project_dockerfile("slow_env:SlowEnv"))
    (proj / "requirements.txt").write_text("")
    (proj / "slow_env.py").write_text(SLOW_ENV)
    (proj / "crash_env.py").write_text('raise RuntimeError("boom at import: this server cannot start")\n')
    (proj / ".env").write_text("HF_TOKEN=hf_not_for_images\n")
    return build(proj, tag="openenv-nb-test/slowenv:latest", log=quiet)


def ours(engine, owner=None) -> list:
    "Containers labelled as ours (started by `owner`, when given)."
    label = f"{OWNER_LABEL}={owner}" if owner else LABEL
    return engine.containers.list(all=True, filters={"label": label})


def mine(engine) -> list:
    return ours(engine, owner_id())


def wait_for_log(container, text: str, limit_s: float = 120):
    "Wait until `container` has written `text` (polling its log; `limit_s` only guards against hanging)."
    deadline = time.monotonic() + limit_s
    while text not in container.logs().decode(errors="replace"):
        if time.monotonic() > deadline: pytest.fail(f"{container.name} did not write {text!r} within {limit_s:g} s")
        time.sleep(0.05)


# ---------------------------------------------------------------- images

def test_images_follow_the_rules(engine, echo_image, coding_image, project_image):
    for text in [builtin_dockerfile(n) for n in BUILTIN] + [project_dockerfile("m:E")]:
        assert check_dockerfile(text) == []
    for tag in (echo_image, coding_image, project_image):
        cfg = engine.images.get(tag).attrs["Config"]
        assert cfg["User"] not in ("", "root", "0"), tag
        assert "/health" in " ".join(cfg["Healthcheck"]["Test"]), tag
        env = dict(e.split("=", 1) for e in cfg["Env"])
        assert {"HOST", "PORT"} <= set(env), tag
        assert not [k for k in env if any(w in k for w in ("TOKEN", "SECRET", "PASSWORD", "KEY"))], env
    # the project's .env stayed out of the image
    out = engine.containers.run(project_image, ["sh", "-c", "ls -a /app; id -u"], remove=True, network_mode="host").decode()
    assert "slow_env.py" in out and ".env" not in out.split() and out.split()[-1] == "10001"


def test_a_bad_dockerfile_fails_with_the_engines_error(engine, tmp_path):
    (tmp_path / "Dockerfile").write_text("ARG BASE_IMAGE=python:3.11-slim\nFROM ${BASE_IMAGE}\nRUN echo about to fail && exit 7\n")
    lines = []
    with pytest.raises(ImageBuildError, match="returned a non-zero code: 7") as e:
        build(tmp_path, tag="openenv-nb-test/bad:latest", log=lines.append)
    assert any("about to fail" in l for l in e.value.log) and any("Step 3/" in l for l in lines)
    (tmp_path / "Dockerfile").write_text("FROM ${BASE_IMAGE}\nFORM nothing\n")
    with pytest.raises(ImageBuildError, match="(?i)unknown instruction: FORM"):
        build(tmp_path, tag="openenv-nb-test/bad:latest", log=quiet)
    (tmp_path / "Dockerfile").write_text("ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\n")
    with pytest.raises(ImageBuildError, match="openenv-nb-test/no-such-base"):
        build(tmp_path, tag="openenv-nb-test/bad:latest", base_image="openenv-nb-test/no-such-base:1", log=quiet)
    with pytest.raises(FileNotFoundError, match="No Dockerfile"):
        build(tmp_path / "nowhere", log=quiet)


def test_openenv_build_command(engine, echo_image):
    "`openenv build` builds a built-in with the streamed log; cached layers make it quick."
    r = subprocess.run([sys.executable, "-m", "openenv_nb.cli", "build", "echo", "-t", echo_image, "--network", "host"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Step 1/" in r.stdout and echo_image in r.stdout


def test_an_openenv_init_project_builds_and_serves(engine, echo_image, tmp_path):
    "The project `openenv init` scaffolds follows the image rules, builds, and plays an episode in its container."
    proj = init_project("guess_env", tmp_path, log=None)
    assert check_dockerfile((proj / "Dockerfile").read_text()) == []
    tag = build(proj, tag="openenv-nb-test/guess-env:latest", log=quiet)
    with GenericEnvClient.from_docker_image(tag).sync() as env:
        env.reset(seed=1)
        env.step({"guess": 50})
        assert env.state()["step_count"] == 1
    assert mine(engine) == []


# ---------------------------------------------------------------- episodes

def test_echo_episode_over_ws_and_http(engine, echo_image):
    with EchoEnv.from_docker_image(echo_image, cpus=1, mem_limit="512m").sync() as env:
        name, url = env._provider.container.name, env.base_url
        assert env.reset(episode_id="d1").observation.echoed_message == "Echo environment ready!"
        r = env.step(EchoAction(message="container"))
        assert (r.observation.echoed_message, r.reward, r.done) == ("container", 0.9, False)
        assert r.observation.metadata == {"original_message": "container", "step": 1}
        assert env.state().model_dump() == {"episode_id": "d1", "step_count": 1}
        with EchoHTTPEnv(url) as h:
            assert h.health()["status"] == "healthy"
            assert h.metadata()["name"]
            assert set(h.schema()) >= {"action", "observation", "state"}
            assert h.reset().observation.echoed_message == "Echo environment ready!"
            assert h.step(EchoAction(message="http")).reward == pytest.approx(0.4)
        c = engine.containers.get(name)
        host, env_vars = c.attrs["HostConfig"], dict(e.split("=", 1) for e in c.attrs["Config"]["Env"])
        assert (host["NanoCpus"], host["Memory"]) == (10**9, 512 * 2**20)
        assert (env_vars["HOST"], f"http://127.0.0.1:{env_vars['PORT']}") == ("127.0.0.1", url)  # its own port, loopback only
        assert c.exec_run(c.attrs["Config"]["Healthcheck"]["Test"][1:]).exit_code == 0  # the image's HEALTHCHECK passes
    assert not engine.containers.list(all=True, filters={"name": name})


def test_coding_episode_over_ws_and_http(engine, coding_image):
    async def episode():
        env = await CodingEnv.from_docker_image(coding_image)  # OpenEnv's spelling: awaiting connects
        try:
            assert (await env.reset()).observation.exit_code == 0
            r = await env.step(CodeAction(code="def f(x):\n    return x * 21\nprint(f(2))"))
            assert (r.observation.stdout, r.observation.exit_code) == ("42\n", 0)
            r = await env.step(CodeAction(code="print(f(1) + 1)"))  # state persists across steps
            assert r.observation.stdout == "22\n"
            r = await env.step(CodeAction(code="1/0"))
            assert r.observation.exit_code == 1 and "ZeroDivisionError" in r.observation.stderr
            assert (await env.state()).step_count == 3
            with CodingHTTPEnv(env.base_url) as h:
                assert h.step(CodeAction(code="print(6 * 7)")).observation.stdout == "42\n"
            return env._provider.container.name
        finally:
            await env.close()
    name = asyncio.run(episode())
    assert not engine.containers.list(all=True, filters={"name": name})


def test_two_containers_at_once(engine, echo_image, project_image):
    async def two():
        a = GenericEnvClient.from_docker_image(echo_image)
        b = GenericEnvClient.from_docker_image(project_image, env_vars={"GREETING": "hello from b"})
        try:
            ra, rb = await asyncio.gather(a.reset(), b.reset())
            assert a.base_url != b.base_url
            assert (ra.observation["echoed_message"], rb.observation["echoed_message"]) == ("Echo environment ready!", "hello from b")
            sa, sb = await asyncio.gather(a.step({"message": "a"}), b.step({"message": "bb"}))
            assert (sa.reward, sb.reward) == (pytest.approx(0.1), 1.0)
            assert len(mine(engine)) == 2
        finally:
            await asyncio.gather(a.close(), b.close())
    asyncio.run(two())
    assert mine(engine) == []


# ---------------------------------------------------------------- failures leave nothing behind

def test_a_server_that_crashes_at_start(engine, project_image):
    "Seen as an exit (not as a server that never got healthy, which would take `startup_timeout_s`), with its log."
    with pytest.raises(ProviderError) as e:
        DockerProvider(project_image, env_vars={"OPENENV_TARGET": "crash_env:Env"}).start()
    msg = str(e.value)
    assert "exited with code 1" in msg and "boom at import: this server cannot start" in msg, msg
    assert mine(engine) == []


def test_a_wrong_image_name(engine):
    with pytest.raises(ProviderError, match="No image 'openenv-nb-test/no-such-image:1'"):
        GenericEnvClient.from_docker_image("openenv-nb-test/no-such-image:1").sync().reset()
    assert mine(engine) == []


def test_a_command_that_is_not_there(engine, echo_image):
    with pytest.raises(ProviderError, match="Docker could not start|exited with code"):
        DockerProvider(echo_image, command=["/no/such/server"]).start()
    assert mine(engine) == []


def test_a_server_that_never_gets_healthy(engine, echo_image):
    cmd = ["sh", "-c", "echo 'thinking about it'; exec sleep 60"]
    with pytest.raises(ProviderError, match=r"(?s)not healthy within 2 s.*thinking about it"):
        DockerProvider(echo_image, command=cmd, startup_timeout_s=2).start()
    assert mine(engine) == []


def test_close_while_a_step_is_in_flight(engine, project_image):
    "The step sleeps far longer than the suite's timeout: `close` can only pass by not waiting for it."
    async def run():
        env = GenericEnvClient.from_docker_image(project_image, stop_timeout_s=1)
        await env.reset()
        task = asyncio.create_task(env.step({"message": "sleep 3600"}))
        await asyncio.to_thread(wait_for_log, env._provider.container, "sleeping")  # the step is in flight
        await env.close()
        with pytest.raises(EnvConnectionError, match="closed during 'step'"): await task
    asyncio.run(run())
    assert mine(engine) == []


def test_container_stopped_under_a_step_in_flight(engine, project_image):
    "The provider is stopped from another thread (a trainer shutting down, say); the step's call raises at once."
    env = GenericEnvClient.from_docker_image(project_image, stop_timeout_s=1, message_timeout_s=3600).sync()
    try:
        env.reset()
        failed = []
        def stop_when_sleeping():
            try: wait_for_log(env._provider.container, "sleeping")
            except BaseException as e: failed.append(e)
            finally: env._provider.stop()
        stopper = threading.Thread(target=stop_when_sleeping)
        stopper.start()
        with pytest.raises(EnvConnectionError, match="closed during 'step'"): env.step({"message": "sleep 3600"})
        stopper.join()
        assert not failed, failed
    finally:
        env.close()
    assert mine(engine) == []


def test_the_clean_up_of_a_crashed_caller(engine, echo_image):
    "A caller killed with SIGKILL leaves its container; `cleanup` finds it by its dead owner and removes it."
    code = textwrap.dedent(f"""
        import os, signal
        from openenv_nb.providers import DockerProvider
        p = DockerProvider({echo_image!r}); p.start()
        print(p.container.name, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    name = r.stdout.strip()
    assert r.returncode == -9 and name, r.stderr[-2000:]
    assert [c.name for c in engine.containers.list(all=True, filters={"name": name})] == [name]
    assert name in cleanup()
    assert not engine.containers.list(all=True, filters={"name": name})


# ---------------------------------------------------------------- pools

def test_a_pool_of_containers(engine, echo_image):
    async def run(pool):
        async def episode(n):
            async with EchoEnv.lease(pool) as env:
                await env.reset()
                return env.base_url, (await env.step(EchoAction(message="x" * n))).reward
        got = await asyncio.gather(*[episode(n) for n in range(6)])
        assert [r for _, r in got] == pytest.approx([0.1 * n for n in range(6)])
        assert {u for u, _ in got} == set(pool.urls)
        async with VectorEnv(pool, num_envs=6) as venv:
            assert (await venv.step([{"message": "ab"}] * 6)).rewards == pytest.approx([0.2] * 6)
    with ServerPool.docker(echo_image, 3) as pool:
        assert len(set(pool.urls)) == 3 and len(mine(engine)) == 3
        asyncio.run(run(pool))
    assert mine(engine) == []


def test_a_pool_that_cannot_start_leaves_nothing(engine, echo_image, project_image):
    pool = ServerPool([DockerProvider(echo_image), DockerProvider(project_image, env_vars={"OPENENV_TARGET": "crash_env:Env"}),
                       DockerProvider(echo_image)])
    with pytest.raises(ProviderError, match="(?s)1 of 3 servers failed to start.*boom at import"): pool.start()
    assert mine(engine) == []


# ---------------------------------------------------------------- the notebooks' Docker cells

SKIP = sorted(set(tomllib.loads((NBS.parent / "pyproject.toml").read_text())["tool"]["nbdev"]["tst_flags"].split()) - {"docker"})


@pytest.mark.parametrize("nb", ["03_client.ipynb", "04_providers.ipynb", "10_images.ipynb"])
def test_notebook_docker_cells(engine, echo_image, nb):
    "The notebooks with their `docker` cells run (the other flags of `tst_flags` stay skipped)."
    run = ("import sys, nbdev.test as nbt; ok, _ = nbt.test_nb(sys.argv[1], skip_flags=sys.argv[2:]); "
           "sys.exit(0 if ok else 1)")
    r = subprocess.run([sys.executable, "-c", run, str(NBS / nb), *SKIP], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{nb} failed:\n{r.stdout[-4000:]}\n{r.stderr[-8000:]}"


# ---------------------------------------------------------------- last: nothing of ours is left

def test_none_of_ours_is_left(engine):
    "`docker ps -a --filter label=openenv-nb` shows nothing of this suite (nor of any caller that died)."
    left = [(c.name, c.labels.get(OWNER_LABEL, "")) for c in ours(engine)]
    assert [c for c in left if not owner_alive(c[1]) or c[1].split(":")[1] == str(os.getpid())] == [], left
