"""Clients against real servers: the sync twin inside a running loop, dead servers, and no orphans."""
import asyncio
import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
import threading

import pytest

from openenv_nb.client import EpisodeLost, GenericEnvClient, parse_reply
from openenv_nb.envs.echo import EchoAction, EchoEnv, EchoHTTPEnv, EchoObservation
from openenv_nb.providers import LocalProcessProvider, healthy
from openenv_nb.types import EnvConnectionError, EnvServerError, EnvTimeoutError
from conftest import start_server


def test_sync_client_inside_a_running_event_loop(echo_url):
    async def inside():  # as in a Jupyter cell: a loop is running in this thread
        asyncio.get_running_loop()
        with EchoEnv(echo_url).sync() as env:
            env.reset()
            return env.step(EchoAction(message="in a loop")).observation.echoed_message
    assert asyncio.run(inside()) == "in a loop"


def test_a_killed_server_is_named_without_waiting_for_the_timeout():
    "The dropped connection is the error (an `EnvConnectionError`), not the message timeout (an `EnvTimeoutError`)."
    p = LocalProcessProvider("echo"); url = p.start()
    env = EchoEnv(url, message_timeout_s=60, connect_timeout_s=2).sync()
    try:
        env.reset()
        os.killpg(p.proc.pid, signal.SIGKILL)
        with pytest.raises(EpisodeLost) as e: env.step(EchoAction(message="anyone?"))
        assert url.replace("http", "ws") in str(e.value) and "closed during 'step'" in str(e.value)
        with pytest.raises(EnvConnectionError, match="Could not connect"): env.reset()
    finally:
        p.stop()


def test_a_hung_server_times_out_with_its_url():
    p = LocalProcessProvider("echo"); url = p.start()
    env = GenericEnvClient(url, message_timeout_s=1).sync()
    try:
        env.reset()
        os.killpg(p.proc.pid, signal.SIGSTOP)
        with pytest.raises(EnvTimeoutError, match="No reply to 'step' from ws://127.0.0.1"): env.step({"message": "x"})
    finally:
        os.killpg(p.proc.pid, signal.SIGCONT)
        p.stop()


def test_from_local_starts_and_stops_its_server():
    env = EchoEnv.from_local().sync()
    env.reset()
    url, proc = env.base_url, env._provider.proc
    assert healthy(url)
    env.close()
    assert proc.poll() is not None and not healthy(url)


CALLER = textwrap.dedent("""
    import os, sys, time
    from openenv_nb.providers import LocalProcessProvider
    p = LocalProcessProvider("echo"); p.start()
    print(p.proc.pid, flush=True)
    if sys.argv[1] == "raise": raise RuntimeError("the caller failed between start and connect")
    time.sleep(60)
""")


@pytest.mark.parametrize("how", ["raise", "sigkill"])
def test_no_orphan_when_the_caller_dies(how):
    caller = subprocess.Popen([sys.executable, "-c", CALLER, how], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid = int(caller.stdout.readline())
    if how == "sigkill": caller.kill()
    caller.wait(30)
    try: fd = os.pidfd_open(pid)  # readable once the process has ended
    except ProcessLookupError: return  # gone already
    try: ended, _, _ = select.select([fd], [], [], 60)  # 60 s: a guard against hanging, not a timing
    finally: os.close(fd)
    assert ended, f"server {pid} outlived its caller ({how})"


def test_a_server_that_cannot_start_leaves_nothing():
    p = LocalProcessProvider("helpers_that_do_not_exist:Env", startup_timeout_s=20)
    with pytest.raises(Exception, match="exited with code"): p.start()
    assert p.proc is None


SCRIPT = textwrap.dedent("""
    import sys
    from openenv_nb.envs.echo import EchoAction, EchoEnv
    env = EchoEnv(sys.argv[1])  # no .sync(), no asyncio.run: plain calls block
    env.reset()
    print(env.step(EchoAction(message="plain")).observation.echoed_message)
    with EchoEnv(sys.argv[1]) as env2:
        other = env2.new_session()
        env2.reset(); other.reset()
        env2.step(EchoAction(message="x"))
        print(env2.state().step_count, other.state().step_count)
    env.close()
""")


def test_a_plain_script_needs_no_sync(echo_url):
    out = subprocess.run([sys.executable, "-c", SCRIPT, echo_url], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["plain", "1", "0"]


def test_calls_stay_awaitable_inside_a_loop(echo_url):
    async def inside():
        env = EchoEnv(echo_url)
        await env.reset()
        r = await env.step(EchoAction(message="awaited"))
        await env.close()
        return r.observation.echoed_message
    assert asyncio.run(inside()) == "awaited"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_server_killed_and_restarted_between_episodes():
    p = LocalProcessProvider("echo"); url = p.start()
    port, again = int(url.rsplit(":", 1)[1]), None
    env = EchoEnv(url, connect_timeout_s=60)
    try:
        env.reset(); env.step(EchoAction(message="a"))
        os.killpg(p.proc.pid, signal.SIGKILL)
        p.stop()
        again = LocalProcessProvider("echo", port=port); again.start()
        assert env.reset().observation.echoed_message == "Echo environment ready!"  # reconnects by itself
        assert env.step(EchoAction(message="b")).observation.metadata["step"] == 1
    finally:
        env.close(); p.stop()
        if again is not None: again.stop()


def test_connect_waits_for_a_server_that_is_starting():
    port = free_port()
    env, got = EchoEnv(f"http://127.0.0.1:{port}", connect_timeout_s=120), {}
    caller = threading.Thread(target=lambda: got.update(r=env.reset()))  # refused at first: it tries again
    caller.start()
    p = LocalProcessProvider("echo", port=port)
    try:
        p.start()
        caller.join(120)  # a guard against hanging, not a timing
        assert got["r"].observation.echoed_message == "Echo environment ready!"
    finally:
        env.close(); p.stop()


class Proxy:
    "A TCP proxy in front of a server whose connections can be cut, as a load balancer cuts idle ones."
    def __init__(self, base_url: str):
        self.target = int(base_url.rsplit(":", 1)[1])
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url, self.conns = f"http://127.0.0.1:{self.sock.getsockname()[1]}", []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try: c, _ = self.sock.accept()
            except OSError: return
            s = socket.create_connection(("127.0.0.1", self.target))
            self.conns += [c, s]
            for a, b in ((c, s), (s, c)): threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a, b):
        try:
            while data := a.recv(65536): b.sendall(data)
        except OSError: pass
        for x in (a, b):
            try: x.shutdown(socket.SHUT_RDWR)
            except OSError: pass

    def cut(self):
        for c in self.conns:
            try: c.shutdown(socket.SHUT_RDWR)
            except OSError: pass
        self.conns = []

    def close(self):
        self.sock.close(); self.cut()


def test_a_socket_dropped_mid_episode_is_resumed(echo_url):
    "The same episode goes on after the cut: the step is applied once, on the session the server kept."
    proxy = Proxy(echo_url)
    env = EchoEnv(proxy.url)
    try:
        env.reset(); env.step(EchoAction(message="a"))
        proxy.cut()
        assert env.step(EchoAction(message="b")).observation.metadata["step"] == 2
        assert env.state().step_count == 2 and env.resumes == 1
    finally:
        env.close(); proxy.close()


def test_without_resume_a_socket_dropped_mid_episode_is_an_episode_lost_then_reset_works(echo_url):
    proxy = Proxy(echo_url)
    env = EchoEnv(proxy.url, resume=False)
    try:
        env.reset(); env.step(EchoAction(message="a"))
        proxy.cut()
        with pytest.raises(EpisodeLost, match=r"closed during 'step'.*reset\(\) starts a new one"): env.step(EchoAction(message="b"))
        with pytest.raises(EpisodeLost, match=r"was lost"): env.state()  # never a silent new episode
        assert env.reset().observation.echoed_message == "Echo environment ready!"
        assert env.step(EchoAction(message="c")).observation.metadata["step"] == 1
        proxy.cut()  # dropped between episodes: reset() reconnects
        assert env.reset().observation.echoed_message == "Echo environment ready!"
    finally:
        env.close(); proxy.close()


def test_results_keep_metadata_on_every_client(echo_url):
    want = {"original_message": "hi", "step": 1}
    with GenericEnvClient(echo_url) as g:
        g.reset()
        r = g.step({"message": "hi"})
        assert r.metadata == r.observation["metadata"] == want
    with EchoEnv(echo_url) as env:
        env.reset()
        r = env.step(EchoAction(message="hi"))
        assert r.metadata == r.observation.metadata == want
    r = EchoHTTPEnv(echo_url).step(EchoAction(message="hi"))
    assert r.observation.metadata == {"original_message": "hi", "step": 1}


def test_every_reply_shape_of_openenv_010_parses():
    obs = {"echoed_message": "hi", "message_length": 2}
    for payload in [{"observation": {**obs, "metadata": {"k": 1}}, "reward": 0.2, "done": False, "metadata": {"k": 1}},
                    {"observation": {**obs, "metadata": {"k": 1}}, "reward": 0.2, "done": False},
                    {"observation": obs, "reward": 0.2, "done": False, "metadata": {"k": 1}}]:
        typed, generic = parse_reply(payload, EchoObservation), parse_reply(payload)
        assert typed.observation.metadata == typed.metadata == generic.metadata == generic.observation["metadata"] == {"k": 1}
        assert (typed.reward, typed.done, typed.observation.reward) == (0.2, False, 0.2)


def test_a_full_server_says_so_rather_than_dropping_the_connection():
    p = start_server("echo", max_sessions=1)
    try:
        with EchoEnv(p.base_url) as first:
            first.reset()
            with pytest.raises(EnvServerError) as e: EchoEnv(p.base_url).reset()
            assert e.value.code == "CAPACITY_REACHED"
    finally:
        p.stop()


# ---------------------------------------------------------------- two doors: a gateway's Authorization and the server's token

def test_the_server_token_stays_in_authorization_when_it_is_free():
    """Today's wire: a token alone travels as `Authorization: Bearer`, on WebSocket and HTTP, and opens the server."""
    from openenv_nb.envs.echo import EchoEnvironment
    from openenv_nb.server import create_app, serve_in_thread
    with serve_in_thread(create_app(EchoEnvironment, token="s3cret")) as url:
        with EchoEnv(url, token="s3cret", headers={"X-Trace": "t1"}).sync() as env:
            assert env.headers == {"X-Trace": "t1", "Authorization": "Bearer s3cret"}
            assert env.reset().observation.echoed_message
        with EchoHTTPEnv(url, token="s3cret") as h: assert h.reset().observation.echoed_message
        with pytest.raises(EnvConnectionError, match="401"): EchoEnv(url, token="").sync().connect()


def test_a_gateway_authorization_and_the_server_token_travel_side_by_side():
    """A private Space's `Authorization` before a server with its own token: the client sends that token in
    `X-OpenEnv-Token`, and the server lets it in, over WebSocket and HTTP, while the gateway's header alone does not."""
    from openenv_nb.envs.echo import EchoEnvironment
    from openenv_nb.server import create_app, serve_in_thread
    gateway = {"Authorization": "Bearer hf_not_the_server_token"}
    env = EchoEnv("http://127.0.0.1:1", headers=gateway, token="s3cret")
    assert env.headers == {**gateway, "X-OpenEnv-Token": "s3cret"}  # what is sent, whatever the server
    with serve_in_thread(create_app(EchoEnvironment, token="s3cret")) as url:
        with EchoEnv(url, headers=gateway, token="s3cret").sync() as env: assert env.reset().observation.echoed_message
        with EchoHTTPEnv(url, headers=gateway, token="s3cret") as h: assert h.reset().observation.echoed_message
        with pytest.raises(EnvConnectionError, match="401"): EchoEnv(url, headers=gateway, token="").sync().connect()
        with pytest.raises(EnvConnectionError, match="401"): EchoEnv(url, headers=gateway, token="wrong").sync().connect()
