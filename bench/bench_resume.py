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
from openenv_nb.vector import VectorEnv


async def vector_rate(urls: list[str], resume: bool, steps: int, n: int = 256) -> float:
    "Environment steps per second of a `VectorEnv` of `n` echo environments."
    async with VectorEnv(urls, num_envs=n, resume=resume) as v:
        await v.reset(seed=1)
        acts = [{"message": "hi"}] * n
        for _ in range(20): await v.step(acts)
        t = time.perf_counter()
        for _ in range(steps): await v.step(acts)
        return steps * n / (time.perf_counter() - t)


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
    vec = create_app(EchoEnvironment, max_concurrent_envs=512)
    with serve_in_thread(on_app) as on, serve_in_thread(off_app) as off, serve_in_thread(vec) as v:
        runs = {k: [] for k in ("WS off", "WS on", "batch 256 off", "batch 256 on")}
        for _ in range(a.repeat):
            runs["WS off"].append(asyncio.run(rate(off, False, a.steps)))
            runs["WS on"].append(asyncio.run(rate(on, True, a.steps)))
            runs["batch 256 off"].append(asyncio.run(vector_rate([v], False, a.steps // 50)))
            runs["batch 256 on"].append(asyncio.run(vector_rate([v], True, a.steps // 50)))
    print(f"| case | steps/s (median of {a.repeat}) | stdev | min | max |")
    print("|---|---|---|---|---|")
    for name, xs in runs.items():
        print(f"| {name} | {statistics.median(xs):,.0f} | {statistics.stdev(xs):,.0f} | {min(xs):,.0f} | {max(xs):,.0f} |")
    for case in ("WS", "batch 256"):
        on_, off_ = statistics.median(runs[f"{case} on"]), statistics.median(runs[f"{case} off"])
        print(f"{case}: resume costs {1 - on_ / off_:+.1%} of steps/s")
    print("(client and server in one process: the servers run in threads)")


if __name__ == "__main__":
    main()
