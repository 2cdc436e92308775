"""Clients against real servers: the sync twin inside a running loop, dead servers, and no orphans."""
import asyncio
import os
import select
import signal
import subprocess
import sys
import textwrap

import pytest

from openenv_nb.client import GenericEnvClient
from openenv_nb.envs.echo import EchoAction, EchoEnv
from openenv_nb.providers import LocalProcessProvider, healthy
from openenv_nb.types import EnvConnectionError, EnvTimeoutError


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
    env = EchoEnv(url, message_timeout_s=60).sync()
    try:
        env.reset()
        os.killpg(p.proc.pid, signal.SIGKILL)
        with pytest.raises(EnvConnectionError) as e: env.step(EchoAction(message="anyone?"))
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
