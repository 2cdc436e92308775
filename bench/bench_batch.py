"""Rollout throughput: batched frames (the `batch` extension, `VectorEnv`) against one frame per step.

Echo environments, aggregate environment-steps/s for 64, 256 and 1,024 environments, in one run:
- ours, batched, one server          VectorEnv over one connection (columns: `batch.step`, see `server`)
- ours, batched, dicts               the same, untyped: dicts in and out, as upstream's GenericEnvClient below
- ours, batched, local default       VectorEnv over one server process per core
- ours, one frame per step           N `EchoEnv` clients, one WebSocket each
- upstream, one frame per step       N openenv 0.10.0 `GenericEnvClient`s against openenv 0.10.0's server
- core, one frame per step           N openenv-core 0.2.3 `GenericEnvClient`s against openenv-core's server
Servers run as their users get them (uvicorn picks uvloop and httptools wherever installed; see bench_core's
"server stack" row). Load runs in a separate process; server CPU per environment-step is read from /proc, the load
process's (the client's) from its own clock over the timed part.

    python bench/bench_batch.py [--quick] [--sizes 64,256,1024] [--seconds 3]
"""
import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_core import (core_python, cpu_seconds, noise_line, raise_nofile, server_stack, start_server, stop,  # noqa: E402
                        stop_all, upstream_python)

# N GenericEnvClients, one WebSocket each, written as openenv's users write them; the same script serves openenv-core
# 0.2.3 and openenv 0.10.0 (run by each one's python).
CORE_LOAD = r'''
import asyncio, json, sys, time
from openenv.core.generic_client import GenericEnvClient
url, n, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
async def one(deadline, counts, i):
    env = GenericEnvClient(base_url=url, message_timeout_s=120)
    await env.connect(); await env.reset()
    while time.perf_counter() < deadline:
        await env.step({"message": "hello"}); counts[i] += 1
    await env.close()
async def main():
    counts = [0] * n
    clients = []
    t0 = time.perf_counter() + 30  # room to open; the clock below starts once all are open
    opened = asyncio.Event()
    start, cpu = time.perf_counter(), time.process_time()
    deadline = start + 30 + seconds
    await asyncio.gather(*[one(deadline, counts, i) for i in range(n)])
    print(json.dumps({"steps": sum(counts), "seconds": time.perf_counter() - start, "cpu": time.process_time() - cpu}))
asyncio.run(main())
'''


def load(spec: dict) -> dict:
    """Run one load phase in this (child) process and return its counts."""
    raise_nofile()
    from openenv_nb.envs.echo import EchoAction, EchoEnv, EchoObservation
    from openenv_nb.types import State
    from openenv_nb.vector import VectorEnv

    class EchoVector(VectorEnv[EchoAction, EchoObservation, State]): pass

    n, seconds, urls = spec["n"], spec["seconds"], spec["urls"]

    async def batched(dicts: bool = False):
        cls = VectorEnv if dicts else EchoVector
        async with cls(urls, num_envs=n, message_timeout_s=120) as venv:
            await venv.reset()
            actions = [{"message": "hello"} if dicts else EchoAction(message="hello") for _ in range(n)]
            for _ in range(3): await venv.step(actions)
            steps, errors, t0, c0 = 0, 0, time.perf_counter(), time.process_time()
            while time.perf_counter() - t0 < seconds:
                r = await venv.step(actions)
                steps += n; errors += sum(e is not None for e in r.errors)
            return {"steps": steps, "seconds": time.perf_counter() - t0, "errors": errors, "cpu": time.process_time() - c0}

    async def per_frame():
        envs = [EchoEnv(urls[0], message_timeout_s=120) for _ in range(n)]
        await asyncio.gather(*[e.connect() for e in envs])
        await asyncio.gather(*[e.reset() for e in envs])
        counts, t0, c0 = [0] * n, time.perf_counter(), time.process_time()
        async def run(i):
            while time.perf_counter() - t0 < seconds:
                await envs[i].step(EchoAction(message="hello")); counts[i] += 1
        await asyncio.gather(*[run(i) for i in range(n)])
        out = {"steps": sum(counts), "seconds": time.perf_counter() - t0, "errors": 0, "cpu": time.process_time() - c0}
        await asyncio.gather(*[e.close() for e in envs])
        return out

    return asyncio.run(batched(spec["mode"] == "batched_dicts") if spec["mode"].startswith("batched") else per_frame())


def run_load(spec: dict, pids: list[int], timeout: float = 300) -> dict:
    """Run a load phase in a child process; add the servers' CPU seconds used during it."""
    c0 = sum(cpu_seconds(p) for p in pids)
    if spec["mode"] in ("core", "upstream"):
        python = core_python() if spec["mode"] == "core" else upstream_python()
        cmd = [python, "-c", CORE_LOAD, spec["urls"][0], str(spec["n"]), str(spec["seconds"])]
    else:
        cmd = [sys.executable, __file__, "--load", json.dumps(spec)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    cpu = sum(cpu_seconds(p) for p in pids) - c0
    if r.returncode != 0: return {"error": (r.stderr or r.stdout)[-300:].replace("\n", " ")}
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["cpu_us"] = 1e6 * cpu / max(out["steps"], 1)
    out["client_cpu_us"] = 1e6 * out.get("cpu", 0.0) / max(out["steps"], 1)  # the load process, over its timed part
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="1 s phases")
    p.add_argument("--sizes", default="64,256,1024")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--load", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.load: return print(json.dumps(load(json.loads(a.load))))
    raise_nofile()
    seconds = 1.0 if a.quick else a.seconds
    sizes = [int(s) for s in a.sizes.split(",")]
    logdir = Path(tempfile.mkdtemp(prefix="bench-batch-"))
    print(noise_line("before"))
    servers = {k: start_server(n, logdir) for k, n in [("ours1", "ours"), ("ours2", "ours"), ("upstream", "upstream"),
                                                       ("core", "core")]}
    try:
        for k, s in servers.items():
            if s.error: print(f"{k}: {s.error}")
        for name in ("ours", "upstream", "core"):
            try: print(f"server stack, {name}: {server_stack(name)}")
            except Exception as e: print(f"server stack, {name}: unknown ({e})")
        o1, o2, up, core = servers["ours1"], servers["ours2"], servers["upstream"], servers["core"]
        cores = os.cpu_count() or 1
        phases = [("ours, batched, 1 server", "batched", [o1], [o1.http_url]),
                  ("ours, batched, 1 server, dicts in and out (as upstream's generic client)", "batched_dicts", [o1], [o1.http_url]),
                  (f"ours, batched, {min(cores, 2)} servers (local default)", "batched", [o1, o2][:min(cores, 2)],
                   [o1.http_url, o2.http_url][:min(cores, 2)]),
                  ("ours, one frame per step", "per_frame", [o1], [o1.http_url]),
                  ("upstream 0.10.0, one frame per step", "upstream", [up], [up.http_url]),
                  ("core 0.2.3, one frame per step", "core", [core], [core.http_url])]
        table = {}
        for label, mode, srv, urls in phases:
            for n in sizes:
                if any(s.error for s in srv): table[label, n] = {"error": "server not running"}; continue
                table[label, n] = run_load({"mode": mode, "n": n, "seconds": seconds, "urls": urls}, [s.proc.pid for s in srv])
        print(noise_line("after"))
        print()
        print("| environment-steps/s (CPU µs per env-step: server / client) | " + " | ".join(f"{n} envs" for n in sizes) + " |")
        print("|---|" + "---|" * len(sizes))
        for label, *_ in phases:
            cells = []
            for n in sizes:
                r = table[label, n]
                cells.append(f"n/a ({r['error'][:60]})" if "error" in r else f"{r['steps'] / r['seconds']:,.0f} ({r['cpu_us']:.1f} / {r['client_cpu_us']:.1f})"
                             + (f", {r['errors']} errors" if r.get("errors") else ""))
            print(f"| {label} | " + " | ".join(cells) + " |")
        one, dicts, local, ours_pf, up_pf, core_pf = (p[0] for p in phases)
        ratio = lambda a, b, n: (table[a, n]["steps"] / table[a, n]["seconds"]) / (table[b, n]["steps"] / table[b, n]["seconds"])
        print()
        for n in sizes:
            try:
                print(f"{n} envs: batched / upstream per frame = {ratio(one, up_pf, n):.1f}x with 1 server ({ratio(dicts, up_pf, n):.1f}x "
                      f"with dicts), {ratio(local, up_pf, n):.1f}x with the local default; batched / core per frame = "
                      f"{ratio(one, core_pf, n):.1f}x; batched (1 server) / ours per frame = {ratio(one, ours_pf, n):.1f}x")
            except (KeyError, ZeroDivisionError, TypeError): pass
        print("\nTarget: >= 10x upstream 0.10.0's one-frame-per-step figure with 256 environments, in the same run.")
    finally:
        for s in servers.values(): stop(s.proc)
        stop_all()


if __name__ == "__main__":
    main()
