"""A lost node at scale: a `VectorEnv` of many echo environments over a simulated Ray cluster of several nodes on
this machine (`LocalCluster` from `tests/ray_cluster.py`: nodes on 127.0.0.2, .3, ...), one node killed
mid-rollout. Reports the time to detect (the provider's failed health checks), to replace (its servers restarted
on the survivors), to resume (the step that met the loss returns with every episode rebuilt by replay), the
batch's speed before and after, and the cluster's memory (RSS of its processes).

    python bench/bench_ray_resume.py [--nodes 8] [--envs 10000] [--servers-per-node 2] [--steps 20]

The issue's figure: 10,000 environments, 8 nodes, 0 episodes lost, back to full speed within 30 s.
"""
import argparse
import os
import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent.parent / "tests"))  # the test cluster (test support)
from ray_cluster import LocalCluster, mentioning  # noqa: E402

from openenv_nb.envs.echo import EchoAction, EchoObservation  # noqa: E402
from openenv_nb.ray import RayProvider  # noqa: E402
from openenv_nb.resume import Resume  # noqa: E402
from openenv_nb.types import State  # noqa: E402
from openenv_nb.vector import VectorEnv  # noqa: E402


class EchoVector(VectorEnv[EchoAction, EchoObservation, State]): pass


def rss_mb(pids) -> float:
    "The resident memory of `pids`, in MB."
    total = 0
    for p in pids:
        try: total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError): pass
    return total / 2**20


def rate(venv, n: int, steps: int) -> float:
    "Environment-steps per second over `steps` batch steps."
    acts = [EchoAction(message="hi")] * n
    t = time.perf_counter()
    for _ in range(steps): assert venv.step(acts).ok
    return steps * n / (time.perf_counter() - t)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--envs", type=int, default=10_000)
    ap.add_argument("--servers-per-node", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    servers = a.nodes * a.servers_per_node
    per = -(-a.envs // servers)
    t0 = time.monotonic()
    with LocalCluster(nodes=a.nodes, num_cpus=4) as cluster:
        up = time.monotonic() - t0
        with RayProvider("echo", num_servers=servers, spread=True, num_cpus=0.25, address=cluster.address,
                         check_interval_s=0.5, failures_to_restart=2, sessions_per_server=per + 1) as rp:
            patient = Resume(attempts=400, total_s=300, first_delay_s=0.1, max_delay_s=1.0)
            with EchoVector(rp, num_envs=a.envs, resume=patient).sync() as venv:
                assert venv.reset(seed=0).ok
                before = rate(venv, a.envs, a.steps)
                mem = rss_mb(mentioning(cluster.dir))
                victim = cluster.ips[1]
                lost = sum(1 for i in range(a.envs) if rp.servers[venv.async_env._where[i][0]].node_ip == victim)
                kill = time.time(); tk = time.monotonic()
                cluster.kill_node(1)
                r = venv.step([EchoAction(message="after")] * a.envs)
                resumed = time.monotonic() - tk
                failed = [e for e in r.errors if e is not None]
                detect = min((t for t, what in rp.events if "failed" in what), default=float("nan")) - kill
                replace = max((t for t, what in rp.events if "restarted" in what), default=float("nan")) - kill
                after = rate(venv, a.envs, a.steps)
                rebuilt = venv.resumes
    print(f"| nodes | environments | servers | lost with the node | rebuilt | lost for good |")
    print("|---|---|---|---|---|---|")
    print(f"| {a.nodes} | {a.envs:,} | {servers} | {lost:,} | {rebuilt:,} | {len(failed):,} |")
    print()
    print("| cluster up | detect | replace | resume (the step that met the loss) | env-steps/s before | after | cluster RSS |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {up:.1f} s | {detect:.1f} s | {replace:.1f} s | {resumed:.1f} s | {before:,.0f} | {after:,.0f} | "
          f"{mem:,.0f} MB |")


if __name__ == "__main__":
    main()
