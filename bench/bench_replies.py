"""Server memory under a burst of amplifying `batch` messages (issue 24): RSS before, at its peak, and after.

Each message is ~400 KB of ops (4,096 steps over a few environments) whose environment answers 40 KB per step, as a
coding step printing its fill of stdout and stderr does: unbounded, one reply would be 160 MB. The server caps each
reply (`max_reply_size`, 32 MiB by default) and answers the entries past it with an error. Target: RSS after the burst
within 500 MB of RSS before.

    python bench/bench_replies.py [--rounds 3] [--parallel 3] [--ops 4096]
"""
import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SERVER = r'''
import sys
from openenv_nb.envs.echo import EchoAction, EchoObservation
from openenv_nb.environment import Environment
from openenv_nb.server import create_app, serve
from openenv_nb.types import State
class Loud(Environment[EchoAction, EchoObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True
    def reset(self, seed=None, episode_id=None, **kw): return EchoObservation(echoed_message="", reward=0.0)
    def step(self, action, timeout_s=None, **kw):
        return EchoObservation(echoed_message="o" * 20_000 + action.message, message_length=20_000,
                               reward=1.0, metadata={"stderr": "e" * 20_000})
    @property
    def state(self): return State()
serve(create_app(Loud, max_concurrent_envs=256), port=int(sys.argv[1]))
'''


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"): return int(line.split()[1]) / 1024
    return float("nan")


def free_port() -> int:
    with socket.socket() as s: s.bind(("127.0.0.1", 0)); return s.getsockname()[1]


async def one(url: str, ops: int, envs: int) -> tuple[int, int]:
    from websockets.asyncio.client import connect
    async with connect(url, max_size=None, additional_headers={"x-openenv-extensions": "batch"}) as ws:
        await ws.send(json.dumps({"type": "batch.open", "data": {"count": envs}})); await ws.recv()
        msg = json.dumps({"type": "batch", "data": {"ops": [{"env": i % envs, "type": "step",
                                                            "data": {"message": "x" * 60}}
                                                           for i in range(ops)]}})
        await ws.send(msg)
        reply = await ws.recv()
        out = json.loads(reply)
        return len(msg), len(reply), sum(r["type"] == "error" for r in out["data"]["results"])


async def burst(url, pid, args):
    peak = rss_mb(pid)
    async def watch():
        nonlocal peak
        while True: peak = max(peak, rss_mb(pid)); await asyncio.sleep(0.01)
    w = asyncio.create_task(watch())
    sizes = []
    for _ in range(args.rounds):
        sizes += await asyncio.gather(*[one(url, args.ops, args.envs) for _ in range(args.parallel)])
    w.cancel()
    return peak, sizes


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--parallel", type=int, default=3)
    p.add_argument("--ops", type=int, default=4096)
    p.add_argument("--envs", type=int, default=8)
    args = p.parse_args()
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    srv = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], env=env)
    try:
        import urllib.request
        for _ in range(300):
            try: urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1); break
            except OSError: time.sleep(0.1)
        before = rss_mb(srv.pid)
        peak, sizes = asyncio.run(burst(f"ws://127.0.0.1:{port}/ws", srv.pid, args))
        time.sleep(1.0)  # let the last replies be freed
        after = rss_mb(srv.pid)
        msg, reply, errors = sizes[0]
        print(f"| messages | {len(sizes)} ({args.rounds} rounds of {args.parallel} at once) |")
        print(f"| one message | {msg / 1e3:.0f} KB, {args.ops} steps of 40 KB each |")
        print(f"| one reply | {reply / 1e6:.1f} MB ({errors} of {args.ops} entries over the cap) |")
        print(f"| server RSS before | {before:.0f} MB |")
        print(f"| server RSS peak | {peak:.0f} MB |")
        print(f"| server RSS after | {after:.0f} MB (+{after - before:.0f} MB; target within 500 MB) |")
    finally:
        srv.terminate(); srv.wait(10)


if __name__ == "__main__": main()
