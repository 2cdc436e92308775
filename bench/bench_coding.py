"""Benchmark the coding environment: sandboxed workers over WebSocket, side by side with smolagents' executor in process.

Columns:

- ours (WS):  ``openenv serve coding`` in a subprocess; a raw ``websockets`` client in this process, one step at a
  time per session. Every step crosses client -> server -> worker process -> server -> client.
- ours (lib): ``openenv_nb.sandbox.Sandbox(ready=2)`` used directly, no server: the sandbox's own cost.

A reset takes a worker from the sandbox's ready pool (two workers forked and confined ahead of time, refilled by a
background thread while the episode runs; the only warm-up the sandbox has). Resets back to back drain the pool and
wait for forks; a reset after an episode of steps, as a rollout does it, finds a worker ready. Both are measured.
- floor:      smolagents' ``LocalPythonExecutor`` called in this process, configured as OpenEnv's coding environment
  configures it (``additional_authorized_imports=["json"]``, its default 30 s timeout, OpenEnv's two helper tools).
  No process boundary, no limits: the floor under any sandbox.

Measured: step latency (p50/p99) of ``print(1)``, of a loop calibrated to take about 10 ms in the floor, and of a
step that defines a function and calls it; reset latency; steps/s with 1, 4 and 16 sessions stepping at once; the
memory of idle sessions (RSS and PSS of the server, the fork server and the workers). The machine is shared: a CPU
probe and the load average are printed before and after, and p50s are the figures to trust.

The sandbox is measured as it ships: each worker in the sandbox's PID namespace, with a tmpfs of its own, Landlock,
the syscall filter with its argument checks, and the hardened interpreter.

Usage: python bench/bench_coding.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

from websockets.asyncio.client import connect

from openenv_nb.client import ws_url
from openenv_nb.providers import LocalProcessProvider
from openenv_nb.sandbox import Sandbox, SandboxConfig, shared_zygote

PRINT, DEFCALL = "print(1)", "def f(x):\n    return x * 2 + 1\nf(20)"
RESET = json.dumps({"type": "reset", "data": {}})
CLK = time.perf_counter


# ---------------------------------------------------------------- small helpers

def pct(xs: list[float], q: float) -> float:
    """The `q` quantile of `xs` (nearest rank)."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def timed(fn, n: int, warmup: int = 5) -> list[float]:
    """Seconds taken by each of `n` calls of `fn`, after `warmup` calls."""
    for _ in range(warmup): fn()
    out = []
    for _ in range(n):
        t = CLK(); fn(); out.append(CLK() - t)
    return out


def tree(pid: int) -> list[int]:
    """`pid` and its live descendants."""
    kids: dict[int, list[int]] = {}
    for e in os.listdir("/proc"):
        if e.isdigit():
            try: ppid = int(Path(f"/proc/{e}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError): continue
            kids.setdefault(ppid, []).append(int(e))
    out, todo = [], [pid]
    while todo:
        p = todo.pop(); out.append(p); todo += kids.get(p, [])
    return out


def memory_mb(pid: int) -> tuple[float, float]:
    """(RSS, PSS) in MB of `pid` and its descendants; PSS shares each shared page among the processes that map it."""
    rss = pss = 0
    for p in tree(pid):
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"): rss += int(line.split()[1])
                elif line.startswith("Pss:"): pss += int(line.split()[1])
        except OSError: continue
    return rss / 1024, pss / 1024


def cpu_probe_ms() -> float:
    """A fixed pure-Python loop, in ms: the machine's noise."""
    t = CLK(); sum(i * i for i in range(300_000)); return (CLK() - t) * 1e3


def noise(label: str) -> str:
    ms = sorted(cpu_probe_ms() for _ in range(5))
    return (f"noise {label}: cpu probe min/median/max {ms[0]:.0f}/{statistics.median(ms):.0f}/{ms[-1]:.0f} ms; "
            f"loadavg {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


# ---------------------------------------------------------------- the floor: smolagents in process, as OpenEnv uses it

def floor_executor():
    """A `LocalPythonExecutor` set up as OpenEnv's coding environment sets one up (`PyExecutor`)."""
    import traceback
    from smolagents import LocalPythonExecutor
    ex = LocalPythonExecutor(additional_authorized_imports=["json"])
    ex.send_tools({"format_exc": traceback.format_exc, "safe_json_dumps": lambda o: json.dumps(o, default=repr)})
    return ex


def loop_code(target_ms: float = 10.0) -> str:
    """A summing loop sized to take about `target_ms` in the floor."""
    ex, n = floor_executor(), 2000
    code = lambda n: f"s = 0\nfor i in range({n}):\n    s += i\ns"
    took = statistics.median(timed(lambda: ex(code(n)), 5, 1))
    return code(max(100, int(n * target_ms / 1e3 / took)))


# ---------------------------------------------------------------- ours over WebSocket

async def ws_steps(url: str, code: str, n: int) -> list[float]:
    """Latency of `n` sequential steps of `code` on one session, after a reset and a warm-up."""
    msg = json.dumps({"type": "step", "data": {"code": code}})
    async with connect(ws_url(url), compression=None, max_size=None) as ws:
        await ws.send(RESET); await ws.recv()
        out = []
        for i in range(n + 10):
            t = CLK(); await ws.send(msg); reply = await ws.recv(); dt = CLK() - t
            if i >= 10: out.append(dt)
        assert json.loads(reply)["data"]["observation"]["exit_code"] == 0, reply
        return out


async def ws_resets(url: str, n: int) -> list[float]:
    """Latency of `n` sequential resets on one session (each forks a fresh worker)."""
    async with connect(ws_url(url), compression=None, max_size=None) as ws:
        out = []
        for i in range(n + 3):
            t = CLK(); await ws.send(RESET); await ws.recv(); dt = CLK() - t
            if i >= 3: out.append(dt)
        return out


async def ws_episode_resets(url: str, n: int, steps: int = 5) -> list[float]:
    """Latency of the reset that starts each of `n` episodes of `steps` steps of `print(1)` (as a rollout resets)."""
    msg = json.dumps({"type": "step", "data": {"code": PRINT}})
    async with connect(ws_url(url), compression=None, max_size=None) as ws:
        out = []
        for i in range(n + 3):
            t = CLK(); await ws.send(RESET); await ws.recv(); dt = CLK() - t
            if i >= 3: out.append(dt)
            for _ in range(steps): await ws.send(msg); await ws.recv()
        return out


async def ws_rate(url: str, sessions: int, seconds: float) -> float:
    """Steps per second of `print(1)` with `sessions` sessions stepping at once."""
    msg = json.dumps({"type": "step", "data": {"code": PRINT}})
    async def one(stop):
        async with connect(ws_url(url), compression=None, max_size=None) as ws:
            await ws.send(RESET); await ws.recv()
            await ws.send(msg); await ws.recv()
            await ready.wait()
            n = 0
            while CLK() < stop[0]:
                await ws.send(msg); await ws.recv(); n += 1
            return n
    ready, stop = asyncio.Event(), [float("inf")]
    tasks = [asyncio.create_task(one(stop)) for _ in range(sessions)]
    await asyncio.sleep(0.5 + 0.05 * sessions)  # every session open and reset
    t = CLK(); stop[0] = t + seconds; ready.set()
    counts = await asyncio.gather(*tasks)
    return sum(counts) / (CLK() - t)


async def idle_sessions(url: str, server_pid: int, n: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """Memory (RSS, PSS) of the server's process tree with no session, then with `n` reset and idle."""
    await asyncio.sleep(0.5)
    before = memory_mb(server_pid)
    conns = [await connect(ws_url(url), compression=None, max_size=None) for _ in range(n)]
    for ws in conns:
        await ws.send(RESET); await ws.recv()
    await asyncio.sleep(1.0)
    during = memory_mb(server_pid)
    for ws in conns: await ws.close()
    return before, during


# ---------------------------------------------------------------- the run

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps and shorter phases (a smoke run)")
    a = ap.parse_args(argv)
    n, secs = (100, 1.0) if a.quick else (400, 3.0)
    print(noise("before"))
    loop = loop_code()
    codes = {"print(1)": PRINT, "10 ms loop": loop, "def + call": DEFCALL}
    res: dict[str, dict[str, str]] = {}

    # floor
    ex = floor_executor()
    for k, c in codes.items():
        lat = timed(lambda: ex(c), n if k != "10 ms loop" else n // 4)
        res.setdefault(k, {})["floor"] = f"{pct(lat, .5)*1e3:.2f} / {pct(lat, .99)*1e3:.2f}"
    lat = timed(floor_executor, n // 4)
    res["reset"] = {"floor": f"{pct(lat, .5)*1e3:.2f} / {pct(lat, .99)*1e3:.2f}"}
    for _ in range(100): ex(PRINT)  # warm-up
    t, k = CLK(), 0
    while CLK() - t < secs: ex(PRINT); k += 1
    res["rate 1"] = {"floor": f"{k / (CLK() - t):,.0f}"}

    # ours, the sandbox alone
    t = CLK(); shared_zygote(); zygote_s = CLK() - t
    with Sandbox(SandboxConfig(), ready=2) as sb:  # as the coding environment makes it
        for k, c in codes.items():
            lat = timed(lambda: sb.run(c), n if k != "10 ms loop" else n // 4)
            res[k]["lib"] = f"{pct(lat, .5)*1e3:.2f} / {pct(lat, .99)*1e3:.2f}"
        lat = timed(sb.start, n // 4)
        res["reset"]["lib"] = f"{pct(lat, .5)*1e3:.2f} / {pct(lat, .99)*1e3:.2f}"
        def episode():
            for _ in range(5): sb.run(PRINT)
            t = CLK(); sb.start(); return CLK() - t
        lat = [episode() for _ in range(n // 4)]
        res["reset ep"] = {"lib": f"{pct(lat, .5)*1e3:.2f} / {pct(lat, .99)*1e3:.2f}"}

    # ours over WebSocket
    # 16 idle sessions of 1 GB each (and 2 kept ready) are more than the default memory cap allows on a small machine:
    # the cap counts what each worker may use, and idle ones use a few MB, which is what this measures
    p = LocalProcessProvider("coding", max_sessions=64, env_vars={"OPENENV_SANDBOX_TOTAL_MEMORY_MB": str(64 * 1024)})
    t = CLK(); url = p.start(); server_s = CLK() - t
    try:
        t = CLK(); asyncio.run(ws_resets(url, 1)); first = CLK() - t
        for k, c in codes.items():
            lat = asyncio.run(ws_steps(url, c, n if k != "10 ms loop" else n // 4))
            res[k]["ws"] = f"{pct(lat, .5)*1e3:.2f} / {pct(lat, .99)*1e3:.2f}"
        lat = asyncio.run(ws_resets(url, n // 4))
        res["reset"]["ws"] = f"{pct(lat, .5)*1e3:.2f} / {pct(lat, .99)*1e3:.2f}"
        lat = asyncio.run(ws_episode_resets(url, n // 4))
        res["reset ep"]["ws"] = f"{pct(lat, .5)*1e3:.2f} / {pct(lat, .99)*1e3:.2f}"
        for s in (1, 4, 16):
            res.setdefault(f"rate {s}", {})["ws"] = f"{asyncio.run(ws_rate(url, s, secs)):,.0f}"
        (r0, p0), (r16, p16) = asyncio.run(idle_sessions(url, p.proc.pid, 16))
    finally: p.stop()

    rows = [("print(1) step, p50 / p99 (ms)", "print(1)", "p50 ≤ 3 ms over WS"),
            ("10 ms loop step, p50 / p99 (ms)", "10 ms loop", ""),
            ("def + call step, p50 / p99 (ms)", "def + call", ""),
            ("reset, back to back, p50 / p99 (ms)", "reset", "≤ 20 ms"),
            ("reset after a 5-step episode, p50 / p99 (ms)", "reset ep", "≤ 20 ms"),
            ("steps/s, 1 session", "rate 1", ""), ("steps/s, 4 sessions", "rate 4", ""), ("steps/s, 16 sessions", "rate 16", "")]
    print(f"\nmachine: {os.cpu_count()} cores, shared with other work; python {sys.version.split()[0]}")
    print(f"10 ms loop: {loop.splitlines()[1]}\n")
    print("| measure | ours (WS) | ours (lib) | floor: smolagents in process | target |\n|---|---|---|---|---|")
    for label, key, target in rows:
        r = res.get(key, {})
        print(f"| {label} | {r.get('ws', 'n/a')} | {r.get('lib', 'n/a')} | {r.get('floor', 'n/a')} | {target} |")
    per = (p16 - p0) / 16
    ok = "yes" if p16 - p0 < 400 else "NO"
    print(f"| memory, server tree idle: RSS / PSS (MB) | {r0:.0f} / {p0:.0f} | | | |")
    print(f"| memory, with 16 idle sessions: RSS / PSS (MB) | {r16:.0f} / {p16:.0f} | | | |")
    print(f"| memory of 16 idle sessions (PSS added, MB) | {p16 - p0:.0f} ({per:.1f} per session) | | | < 400 MB: {ok} |")
    print(f"| first reset of a fresh server (starts the fork server, ms) | {first*1e3:.0f} | {zygote_s*1e3:.0f} | | |")
    print(f"| server start to healthy (s) | {server_s:.2f} | | | |")
    print()
    print(noise("after"))


if __name__ == "__main__":
    main()
