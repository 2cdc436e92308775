"""Environments on Ray: throughput through the vector client, and how fast servers come up.

A real two-node Ray cluster on this machine (`LocalCluster`, the tests' cluster from `tests/ray_cluster.py`: head
127.0.0.2, worker 127.0.0.3, started with `ray start` and stopped by process id), then, in one run:
- aggregate echo environment-steps/s through `VectorEnv` for 64 and 256 environments over the same number of
  servers (default 4) placed by `RayProvider` on both nodes (process servers, the default, and thread servers),
  against the same servers started by the local-process provider; load from a separate process, medians of
  `--repeat` phases, server CPU per environment-step from /proc;
  Linux shares CPU fairly between sessions (autogroups) under load, so every side gets the same: each Ray node is a
  session of its own, the local servers run in two sessions (half of them in each, as the two nodes), and the load
  process in one of its own. Without that, servers sharing the benchmark's session lose CPU to the other users of a
  shared machine, and look slower than they are;
- time from `RayProvider.start()` to every server healthy (and `stop()`), for 4 and 16 servers, with each backend,
  next to starting as many local processes at once.

    python bench/bench_ray.py [--quick] [--sizes 64,256] [--servers 4] [--seconds 3] [--repeat 3] [--startup 4,16]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parent.parent / "tests"))  # the test cluster (test support)
from bench_core import cpu_seconds, noise_line, raise_nofile  # noqa: E402


def load(spec: dict) -> dict:
    """One load phase, in this (child) process: `n` echo environments stepped in lockstep for `seconds`."""
    import asyncio
    raise_nofile()
    from openenv_nb.envs.echo import EchoAction, EchoObservation
    from openenv_nb.types import State
    from openenv_nb.vector import VectorEnv

    class EchoVector(VectorEnv[EchoAction, EchoObservation, State]): pass

    async def run():
        n = spec["n"]
        async with EchoVector(spec["urls"], num_envs=n, message_timeout_s=120) as venv:
            await venv.reset()
            actions = [EchoAction(message="hello")] * n
            for _ in range(3): await venv.step(actions)
            steps, errors, t0 = 0, 0, time.perf_counter()
            while time.perf_counter() - t0 < spec["seconds"]:
                r = await venv.step(actions)
                steps += n; errors += sum(e is not None for e in r.errors)
            return {"steps": steps, "seconds": time.perf_counter() - t0, "errors": errors}
    return asyncio.run(run())


def run_load(n: int, urls: list[str], seconds: float, pids: list[int]) -> dict:
    """A load phase in a child process (a session of its own); with the servers' CPU seconds per environment-step."""
    c0 = sum(cpu_seconds(p) for p in pids)
    r = subprocess.run([sys.executable, __file__, "--load", json.dumps({"n": n, "urls": urls, "seconds": seconds})],
                       capture_output=True, text=True, timeout=300, start_new_session=True)
    cpu = sum(cpu_seconds(p) for p in pids) - c0
    if r.returncode != 0: return {"error": (r.stderr or r.stdout)[-300:].replace("\n", " ")}
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["rate"], out["cpu_us"] = out["steps"] / out["seconds"], 1e6 * cpu / max(out["steps"], 1)
    return out


def host(spec: dict):
    """In a child process of a session of its own: start `k` local echo servers, print where, serve until stdin closes."""
    from openenv_nb.providers import ServerPool
    pool = ServerPool.local("echo", spec["k"], max_sessions=spec["per"])
    pool.start()
    try:
        print(json.dumps({"urls": pool.urls, "pids": [p.proc.pid for p in pool.providers]}), flush=True)
        sys.stdin.read()
    finally: pool.stop()


class LocalHosts:
    """Local-process servers in `sessions` sessions of their own (like the Ray nodes), by `host` children."""
    def __init__(self, m: int, per: int, sessions: int = 2):
        ks = [m // sessions + (i < m % sessions) for i in range(sessions)]
        self.procs = [subprocess.Popen([sys.executable, __file__, "--host", json.dumps({"k": k, "per": per})], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True, start_new_session=True) for k in ks if k]
        self.urls, self.pids = [], []
        for p in self.procs:
            got = json.loads(p.stdout.readline())
            self.urls += got["urls"]; self.pids += got["pids"]

    def stop(self):
        for p in self.procs:
            p.stdin.close()
            try: p.wait(15)
            except subprocess.TimeoutExpired: os.killpg(p.pid, 9); p.wait()


def median_cell(runs: list[dict]) -> str:
    """`median steps/s (server CPU µs per step)`, with the spread of the runs."""
    ok = [r for r in runs if "error" not in r]
    if not ok: return f"n/a ({runs[0]['error'][:60]})"
    rates = sorted(r["rate"] for r in ok)
    errors = sum(r["errors"] for r in ok)
    return (f"{statistics.median(rates):,.0f} ({statistics.median(r['cpu_us'] for r in ok):.0f} µs)"
            f" [{rates[0]:,.0f}–{rates[-1]:,.0f}]" + (f", {errors} errors" if errors else ""))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="1 s phases, one repeat, startup for 4 servers only")
    p.add_argument("--sizes", default="64,256")
    p.add_argument("--servers", type=int, default=4)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--startup", default="4,16")
    p.add_argument("--load", help=argparse.SUPPRESS)
    p.add_argument("--host", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.load: return print(json.dumps(load(json.loads(a.load))))
    if a.host: return host(json.loads(a.host))
    if a.quick: a.seconds, a.repeat, a.startup = 1.0, 1, "4"
    raise_nofile()
    import ray
    from openenv_nb.providers import ServerPool
    from openenv_nb.ray import RayProvider
    from ray_cluster import LocalCluster

    sizes, startups, m = [int(s) for s in a.sizes.split(",")], [int(s) for s in a.startup.split(",")], a.servers
    per = max(sizes) // m + 1
    print(noise_line("before"))
    cluster, started = LocalCluster(nodes=2, num_cpus=8), []
    t0 = time.perf_counter()
    try:
        cluster.start()
        t_cluster = time.perf_counter() - t0
        t0 = time.perf_counter()
        ray.init(address=cluster.address, logging_level="warning", log_to_driver=False)
        t_connect = time.perf_counter() - t0

        # ---------------------------------------------------------------- throughput
        ray_proc = RayProvider(num_servers=m, num_cpus=0.5, spread=True, sessions_per_server=per)
        ray_thread = RayProvider(num_servers=m, num_cpus=0.5, spread=True, sessions_per_server=per, backend="thread")
        for x in (ray_thread, ray_proc): x.start(); started.append(x)
        local = LocalHosts(m, per); started.append(local)
        setups = [(f"Ray, {m} process servers on 2 nodes (default)", ray_proc.urls, [s.server_pid for s in ray_proc.servers],
                   sorted(s.node_ip for s in ray_proc.servers)),
                  (f"Ray, {m} thread servers on 2 nodes", ray_thread.urls, [s.server_pid for s in ray_thread.servers],
                   sorted(s.node_ip for s in ray_thread.servers)),
                  (f"local-process provider, {m} servers", local.urls, local.pids, ["127.0.0.1"] * m)]
        table = {}
        for _ in range(a.repeat):
            for n in sizes:
                for label, urls, pids, _nodes in setups:  # interleaved, so drift in the machine's load hits all alike
                    table.setdefault((label, n), []).append(run_load(n, urls, a.seconds, pids))
        for x in (ray_thread, ray_proc, local): x.stop()
        started.clear()

        # ---------------------------------------------------------------- startup
        starts = {}
        for k in startups:
            row = []
            for backend in ("process", "thread"):
                rp = RayProvider(num_servers=k, num_cpus=0.25, spread=True, backend=backend)
                t0 = time.perf_counter(); rp.start(); row.append(time.perf_counter() - t0)
                nodes = {ip: sum(s.node_ip == ip for s in rp.servers) for ip in cluster.ips}
                t0 = time.perf_counter(); rp.stop(); row.append(time.perf_counter() - t0)
            pool = ServerPool.local("echo", k)
            t0 = time.perf_counter(); pool.start(); row.append(time.perf_counter() - t0)
            pool.stop()
            starts[k] = (*row, nodes)
        print(noise_line("after"))
    finally:
        for x in started: x.stop()
        if ray.is_initialized(): ray.shutdown()
        cluster.stop()

    print(f"\nRay cluster: 2 nodes on this machine ({', '.join(cluster.ips)}), started in {t_cluster:.1f} s; "
          f"driver connected in {t_connect:.1f} s. Ray {ray.__version__}, {os.cpu_count()} cores.")
    for label, _u, _p, nodes in setups: print(f"- {label}: servers on {', '.join(nodes)}")
    print(f"\n| environment-steps/s, median of {a.repeat} × {a.seconds:g} s (server CPU per step) [min–max] | "
          + " | ".join(f"{n} envs" for n in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    for label, *_ in setups:
        print(f"| {label} | " + " | ".join(median_cell(table[label, n]) for n in sizes) + " |")
    print("\n| servers | `RayProvider.start()` → all healthy: process (default) | `stop()` | thread | `stop()` "
          "| local processes, started at once | placed |")
    print("|---|---|---|---|---|---|---|")
    for k, (*times, nodes) in starts.items():
        print(f"| {k} | " + " | ".join(f"{t:.1f} s" for t in times) + " | "
              + ", ".join(f"{c} on {ip}" for ip, c in nodes.items()) + " |")


if __name__ == "__main__":
    main()
