"""What the episode log and resume cost: WS steps/s of one `EnvClient` session on an echo server, with resume on
(the client keeps its log and asks for `resume`; the server keeps each session's last reply) and off (`resume=False`
on a server with `resume_grace_s=0`), side by side in one run, alternating, so the machine's drift hits both.

Usage: python bench/bench_resume.py [--steps N] [--repeat R]
The target (issue 25): resume costs at most 5% of steps/s.
"""
import argparse
import asyncio
import statistics
import time

from openenv_nb.client import GenericEnvClient
from openenv_nb.envs.echo import EchoEnvironment
from openenv_nb.runner import serve_in_thread
from openenv_nb.server import create_app


async def rate(url: str, resume: bool, steps: int) -> float:
    async with GenericEnvClient(url, resume=resume) as env:
        await env.reset(seed=1)
        for _ in range(200): await env.step({"message": "warm"})
        t = time.perf_counter()
        for _ in range(steps): await env.step({"message": "hi"})
        return steps / (time.perf_counter() - t)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=7)
    a = ap.parse_args()
    on_app = create_app(EchoEnvironment, max_concurrent_envs=4)
    off_app = create_app(EchoEnvironment, max_concurrent_envs=4, resume_grace_s=0)
    with serve_in_thread(on_app) as on, serve_in_thread(off_app) as off:
        runs = {"on": [], "off": []}
        for _ in range(a.repeat):
            for name, url in (("off", off), ("on", on)):
                runs[name].append(asyncio.run(rate(url, name == "on", a.steps)))
    print(f"| resume | steps/s (median of {a.repeat}) | stdev | min | max |")
    print("|---|---|---|---|---|")
    for name, xs in runs.items():
        print(f"| {name} | {statistics.median(xs):,.0f} | {statistics.stdev(xs):,.0f} | {min(xs):,.0f} | {max(xs):,.0f} |")
    print(f"cost of resume: {1 - statistics.median(runs['on']) / statistics.median(runs['off']):+.1%} of steps/s "
          "(client and server in one process here: the server runs in a thread)")


if __name__ == "__main__":
    main()
