"""Benchmark environments in Docker containers against the local-process provider, in the same run.

Measured, alternating Docker and local runs so that both see the same machine noise:

- **first reset**: from ``EchoEnv.from_docker_image(image)`` (resp. ``EchoEnv.from_local()``) to the reply of the
  first ``reset()``, split into the provider's start (container or process up, ``/health`` answering) and the
  connect + reset after it; then ``close()`` (container stopped and removed, or process ended).
- **pool of 8**: ``ServerPool.docker(image, 8)`` (resp. ``ServerPool.local("echo", 8)``) from ``start()`` until all
  eight have answered a first ``reset()``; then ``stop()``.
- **steps/s**: sequential ``step()`` on one session, to show what the container's networking costs (host network:
  nothing measurable).
- **image**: the echo image's size, and the base image's; the build time (cached, or ``--no-cache``).
- **noise**: a fixed pure-Python loop timed before and after, and the load average.

Usage: python bench/bench_docker.py [--repeat 5] [--pool 8] [--steps 2000] [--no-cache]
Needs a running Docker engine; builds on ``$OPENENV_BASE_IMAGE`` or the local base.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

from openenv_nb.envs.echo import EchoAction, EchoEnv
from openenv_nb.images import build
from openenv_nb.providers import ServerPool, docker_client

LOCAL_BASE = "openenv-nb/base:py3.11"


def spin(n: int = 3_000_000) -> float:
    "Seconds for a fixed pure-Python loop: the machine's speed right now."
    t = time.perf_counter()
    x = 0
    for i in range(n): x += i
    return time.perf_counter() - t


async def first_reset(make) -> dict:
    "Times of one client's life: provider start, connect + first reset, close."
    t0 = time.perf_counter()
    env = make()
    await asyncio.get_running_loop().run_in_executor(None, env._provider.start)
    t1 = time.perf_counter()
    env.base_url = env._provider.base_url
    await env.reset()
    t2 = time.perf_counter()
    await env.close()
    t3 = time.perf_counter()
    return {"start": t1 - t0, "reset": t2 - t1, "total": t2 - t0, "close": t3 - t2}


async def first_reset_plain(make) -> float:
    "From the constructor to the first reset's reply, as a user writes it (no split)."
    t0 = time.perf_counter()
    env = make()
    try:
        await env.reset()
        return time.perf_counter() - t0
    finally:
        await env.close()


async def pool_run(make_pool) -> dict:
    "Times of a pool: start of all servers, then a first reset on each; then stop."
    t0 = time.perf_counter()
    pool = make_pool()
    await asyncio.to_thread(pool.start)
    t1 = time.perf_counter()
    clients = [EchoEnv(u) for u in pool.urls]
    await asyncio.gather(*[c.reset() for c in clients])
    t2 = time.perf_counter()
    await asyncio.gather(*[c.close() for c in clients])
    t3 = time.perf_counter()
    await asyncio.to_thread(pool.stop)
    t4 = time.perf_counter()
    return {"start": t1 - t0, "total": t2 - t0, "stop": t4 - t3}


async def steps(make, n: int) -> float:
    "Sequential steps per second on one session."
    async with make() as env:
        await env.reset()
        for _ in range(50): await env.step(EchoAction(message="warm"))
        t = time.perf_counter()
        for _ in range(n): await env.step(EchoAction(message="hi"))
        return n / (time.perf_counter() - t)


def fmt(xs: list[float], unit: str = "s") -> str:
    if unit == "/s": return f"{statistics.median(xs):,.0f} ({min(xs):,.0f}–{max(xs):,.0f})"
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}–{max(xs):.2f})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5, help="runs of each measurement (default 5)")
    ap.add_argument("--pool", type=int, default=8, help="servers in a pool (default 8)")
    ap.add_argument("--steps", type=int, default=2000, help="steps for the steps/s figure (default 2000)")
    ap.add_argument("--no-cache", action="store_true", help="time a build from scratch (the requirements' layer included)")
    a = ap.parse_args()

    client = docker_client()
    if not os.environ.get("OPENENV_BASE_IMAGE"):
        try: client.images.get(LOCAL_BASE); os.environ["OPENENV_BASE_IMAGE"] = LOCAL_BASE
        except Exception: pass
    noise0, load0 = [spin() for _ in range(3)], os.getloadavg()
    t = time.perf_counter()
    tag = build("echo", no_cache=a.no_cache, log=lambda l: None)
    build_s = time.perf_counter() - t
    size = client.images.get(tag).attrs["Size"]
    base = os.environ.get("OPENENV_BASE_IMAGE")
    base_size = client.images.get(base).attrs["Size"] if base else None

    docker_make = lambda: EchoEnv.from_docker_image(tag)
    local_make = lambda: EchoEnv.from_local("echo")
    res = {k: [] for k in ("d1", "l1", "dp", "lp", "d1p", "l1p", "ds", "ls")}

    async def run_all():
        for _ in range(1): await first_reset(docker_make); await first_reset(local_make)  # warm caches
        for _ in range(a.repeat):
            res["d1"].append(await first_reset(docker_make))
            res["l1"].append(await first_reset(local_make))
            res["d1p"].append(await first_reset_plain(docker_make))
            res["l1p"].append(await first_reset_plain(local_make))
        for _ in range(max(1, a.repeat // 2 + 1)):
            res["dp"].append(await pool_run(lambda: ServerPool.docker(tag, a.pool)))
            res["lp"].append(await pool_run(lambda: ServerPool.local("echo", a.pool)))
        res["ds"].append(await steps(docker_make, a.steps))
        res["ls"].append(await steps(local_make, a.steps))
    asyncio.run(run_all())
    noise1, load1 = [spin() for _ in range(3)], os.getloadavg()

    col = lambda rows, key: [r[key] for r in rows]
    print(f"\n## Docker vs local process: echo environment ({os.cpu_count()} cores, {a.repeat} runs; median (min–max), seconds)\n")
    print("| measurement | Docker container | local process | Docker / local |")
    print("|---|---|---|---|")
    def row(name, d, l, unit="s"):
        ratio = statistics.median(d) / statistics.median(l)
        print(f"| {name} | {fmt(d, unit)} | {fmt(l, unit)} | {ratio:.2f}× |")
    row("**from_docker_image / from_local → first reset**", res["d1p"], res["l1p"])
    row("  provider start (up, `/health` answers)", col(res["d1"], "start"), col(res["l1"], "start"))
    row("  then connect + first reset", col(res["d1"], "reset"), col(res["l1"], "reset"))
    row("  `close()` (container removed / process ended)", col(res["d1"], "close"), col(res["l1"], "close"))
    row(f"**pool of {a.pool}: start → first reset on all**", col(res["dp"], "total"), col(res["lp"], "total"))
    row(f"  pool of {a.pool}: all servers up", col(res["dp"], "start"), col(res["lp"], "start"))
    row(f"  pool of {a.pool}: `stop()`", col(res["dp"], "stop"), col(res["lp"], "stop"))
    row("steps/s, one session (sequential)", res["ds"], res["ls"], "/s")
    print()
    print(f"- image `{tag}`: {size / 1e6:.0f} MB" + (f" (base `{base}`: {base_size / 1e6:.0f} MB, so "
          f"{(size - base_size) / 1e6:.0f} MB of openenv-nb and its requirements)" if base_size else ""))
    print(f"- build: {build_s:.1f} s ({'from scratch, --no-cache' if a.no_cache else 'layers cached'})")
    target = statistics.median(res["d1p"])
    print(f"- target, first reset within 2 s of start: {'met' if target < 2 else 'NOT met'} ({target:.2f} s median)")
    print(f"- noise: fixed loop {statistics.median(noise0) * 1e3:.0f} ms before, {statistics.median(noise1) * 1e3:.0f} ms after; "
          f"load average {load0[0]:.2f} before, {load1[0]:.2f} after (other engineers share these cores)")


if __name__ == "__main__":
    main()
