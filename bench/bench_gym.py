"""Gymnasium through openenv-nb against Gymnasium's own vector environments: env-steps/s, same env, same count.

CartPole-v1 (by default) with 64 environments, random actions, auto-reset, in one run:
- gymnasium SyncVectorEnv              all environments in this process, no isolation
- gymnasium AsyncVectorEnv             one subprocess per environment
- ours, VectorEnv, 1 server            batched frames (`batch.step` columns) over one WebSocket to one local server process
- ours, VectorEnv, 1 server, typed     the same, actions and observations as pydantic models on the client
- ours, VectorEnv, local default       batched frames to one server process per core
- ours, floor                          1 server whose environment returns its last observation (through the batch
                                       hook, as Gymnasium's does): the framework alone
- experiment, columnar                 one session holding a server-side SyncVectorEnv: lists in, lists out, one
                                       envelope per vector step (what a columnar batch message could reach)
Each phase runs in a fresh process; `--repeat` runs every phase again (in turn) and the table gives the median with
the min-max spread. CPU per env-step (from /proc: every process of the phase, the servers apart) is the steadier
figure on a shared machine. Targets (issue 16): ours >= 3x AsyncVectorEnv and
>= 0.5x SyncVectorEnv.

    python bench/bench_gym.py [--envs 64] [--seconds 3] [--repeat 3] [--env CartPole-v1] [--profile DIR]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_core import cpu_seconds, noise_line, raise_nofile  # noqa: E402

if os.environ.get("BENCH_GYM_SPEC"):  # imported by a server as `bench_gym:Served`, `bench_gym:Floor` or `bench_gym:Columnar`
    from openenv_nb.envs.gym import make_gym_target
    Served = make_gym_target(os.environ["BENCH_GYM_SPEC"])

    class Floor(Served):
        "The same classes and frames, no Gymnasium work per step: what the framework alone costs."
        async def reset_async(self, seed=None, episode_id=None, **kwargs):
            from openenv_nb.types import to_envelope
            self.last = self.reset(seed=seed, episode_id=episode_id)
            self.wire = to_envelope(self.last)["observation"]  # what the batch hook sends
            return self.last

        async def step_async(self, action, timeout_s=None, **kwargs): return self.last

        @classmethod
        async def step_batch_async(cls, envs, actions):  # the batch hook's path, with no Gymnasium work either
            from openenv_nb.environment import Steps
            return Steps([e.wire for e in envs], [e.last.reward for e in envs], [False] * len(envs), [None] * len(envs))

    from openenv_nb.envs.gym import gym_types, InlineGymEnvironment
    from openenv_nb.types import Action, Observation, State
    from pydantic import create_model

    _act, _obs = gym_types(os.environ["BENCH_GYM_SPEC"])
    Actions = create_model("Actions", __base__=Action, actions=(list[_act.model_fields["action"].annotation], ...))
    class Observations(Observation):
        obs: list = []
        rewards: list[float] = []
        terminated: list[bool] = []
        truncated: list[bool] = []

    class Columnar(InlineGymEnvironment):
        "A whole Gymnasium SyncVectorEnv in one session, lists in and out: one frame per vector step, no per-env envelope."
        action_type, observation_type = Actions, Observations
        def __init__(self):
            import gymnasium as gym
            self.transform, self.vec = None, gym.vector.SyncVectorEnv([lambda: gym.make(os.environ["BENCH_GYM_SPEC"]) for _ in range(int(os.environ["BENCH_GYM_N"]))])
        def reset(self, seed=None, episode_id=None, **kwargs): return Observations(obs=self.vec.reset(seed=seed)[0].tolist())
        def step(self, action, timeout_s=None, **kwargs):
            import numpy as np
            o, r, te, tr, _ = self.vec.step(np.asarray(action.actions))
            return Observations(obs=o.tolist(), rewards=r.tolist(), terminated=te.tolist(), truncated=tr.tolist())
        def close(self): self.vec.close()

PLAN = 512  # steps of pre-drawn actions, cycled


def plan(env_id: str, n: int):
    "Pre-drawn random actions, `PLAN` steps of `n`: the same for every phase."
    import gymnasium as gym
    import numpy as np
    space = gym.make(env_id).action_space
    return np.random.default_rng(0).integers(space.start, space.start + space.n, (PLAN, n))


def timed(step, actions, seconds: float, n: int) -> dict:
    "Call `step` with the actions in turn for `seconds` (after a warm-up); env-steps, seconds, and CPU µs per env-step."
    for k in range(20): step(actions[k % len(actions)])
    k, t0, c0 = 0, time.perf_counter(), cpu_seconds(os.getpid())
    while time.perf_counter() - t0 < seconds:
        step(actions[k % len(actions)]); k += 1
    return {"steps": k * n, "seconds": time.perf_counter() - t0, "cpu_us": 1e6 * (cpu_seconds(os.getpid()) - c0) / (k * n)}


def gymnasium_phase(kind: str, env_id: str, n: int, seconds: float) -> dict:
    import gymnasium as gym
    make = gym.vector.SyncVectorEnv if kind == "sync" else gym.vector.AsyncVectorEnv
    venv = make([lambda: gym.make(env_id) for _ in range(n)])
    try:
        venv.reset(seed=0)
        return timed(venv.step, list(plan(env_id, n)), seconds, n)
    finally: venv.close()


def target(env_id: str, n: int, kind: str) -> tuple[str, dict]:
    "What a server serves: `gym:ID` where the target loader knows it, else this file's `Served`; `Floor` or `Columnar` for those phases."
    try:
        from openenv_nb.targets import resolve
    except ImportError:
        from openenv_nb.cli import resolve
    name = {"floor": "Floor", "columnar": "Columnar"}.get(kind, "Served")
    try:
        if name != "Served": raise LookupError(f"{name} is served from this file")
        resolve(f"gym:{env_id}")
        return f"gym:{env_id}", {}
    except (Exception, SystemExit):
        path = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH", "")]))
        return f"bench_gym:{name}", {"BENCH_GYM_SPEC": env_id, "BENCH_GYM_N": str(n), "PYTHONPATH": path}


def ours_phase(kind: str, env_id: str, n: int, seconds: float, profile: str | None) -> dict:
    import asyncio
    from openenv_nb.envs.gym import GymState, gym_types
    from openenv_nb.providers import LocalProcessProvider
    from openenv_nb.vector import VectorEnv, spread
    try: import uvloop; run = uvloop.run
    except ImportError: run = asyncio.run
    tgt, env_vars = target(env_id, n, kind)
    servers = max(1, min(os.cpu_count() or 1, n)) if kind == "local" else 1
    providers = [LocalProcessProvider(tgt, max_sessions=max(spread(n, servers)), env_vars=env_vars) for _ in range(servers)]
    act, obs = gym_types(env_id)
    typed = kind == "typed"
    rows = plan(env_id, n).tolist()
    actions = [[act(action=a) for a in row] if typed else [{"action": a} for a in row] for row in rows]
    cls = VectorEnv[act, obs, GymState] if typed else VectorEnv
    if kind == "columnar": return columnar_phase(providers[0], rows, seconds, n)

    async def go():
        async with cls(num_envs=n, auto_reset=True, providers=providers) as venv:
            await venv.reset(seed=0)
            pids = [p.proc.pid for p in providers]
            spy = [subprocess.Popen(["py-spy", "record", "-o", f"{profile}/server-{kind}-{i}.txt", "-f", "raw", "-d", str(int(seconds) + 1),
                                     "-p", str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                   for i, pid in enumerate(pids)] if profile else []
            for k in range(20): await venv.step(actions[k % PLAN])
            k, errors, t0 = 0, 0, time.perf_counter()
            c0, a0 = sum(cpu_seconds(p) for p in pids), cpu_seconds(os.getpid())
            while time.perf_counter() - t0 < seconds:
                r = await venv.step(actions[k % PLAN]); k += 1
                errors += sum(e is not None for e in r.errors)
            dt, cpu, total = time.perf_counter() - t0, sum(cpu_seconds(p) for p in pids) - c0, cpu_seconds(os.getpid()) - a0
            for s in spy: s.wait()
            return {"steps": k * n, "seconds": dt, "errors": errors, "servers": servers,
                    "server_cpu_us": 1e6 * cpu / max(k * n, 1), "cpu_us": 1e6 * total / max(k * n, 1)}
    return run(go())


def columnar_phase(provider, rows: list, seconds: float, n: int) -> dict:
    "One client, one session holding all `n` environments: a frame per vector step."
    import asyncio
    from openenv_nb.client import GenericEnvClient
    async def go():
        async with GenericEnvClient(provider=provider) as c:
            await c.reset(seed=0)
            for k in range(20): await c.step({"actions": rows[k % PLAN]})
            k, t0, c0, a0 = 0, time.perf_counter(), cpu_seconds(provider.proc.pid), cpu_seconds(os.getpid())
            while time.perf_counter() - t0 < seconds:
                await c.step({"actions": rows[k % PLAN]}); k += 1
            dt, cpu, total = time.perf_counter() - t0, cpu_seconds(provider.proc.pid) - c0, cpu_seconds(os.getpid()) - a0
            return {"steps": k * n, "seconds": dt, "server_cpu_us": 1e6 * cpu / (k * n), "cpu_us": 1e6 * total / (k * n)}
    return asyncio.run(go())


PHASES = {  # key: (label, kind)
    "sync": ("gymnasium SyncVectorEnv (one process)", "sync"),
    "async": ("gymnasium AsyncVectorEnv (a process per env)", "async"),
    "ours1": ("openenv-nb VectorEnv, 1 server", "one"),
    "ours1t": ("openenv-nb VectorEnv, 1 server, typed", "typed"),
    "local": ("openenv-nb VectorEnv, local default ({servers} servers)", "local"),
    "floor": ("openenv-nb VectorEnv, 1 server, no Gymnasium work (the framework's floor)", "floor"),
    "columnar": ("experiment: one session steps a server-side SyncVectorEnv (a frame per vector step)", "columnar"),
}


def phase(spec: dict) -> dict:
    "Run one phase in this (child) process."
    raise_nofile()
    kind = PHASES[spec["phase"]][1]
    if kind in ("sync", "async"): return gymnasium_phase(kind, spec["env"], spec["n"], spec["seconds"])
    return ours_phase(kind, spec["env"], spec["n"], spec["seconds"], spec.get("profile"))


def run_phase(spec: dict, timeout: float = 600) -> dict:
    r = subprocess.run([sys.executable, __file__, "--phase", json.dumps(spec)], capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0: return {"error": (r.stderr or r.stdout)[-400:].replace("\n", " ")}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--envs", type=int, default=64)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--only", default=",".join(PHASES), help="phases to run: " + ",".join(PHASES))
    p.add_argument("--profile", help="a folder: py-spy records each server during the timed part (raw folded stacks)")
    p.add_argument("--phase", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.phase: return print(json.dumps(phase(json.loads(a.phase))))
    if a.profile: Path(a.profile).mkdir(parents=True, exist_ok=True)
    keys = [k for k in a.only.split(",") if k in PHASES]
    print(noise_line("before"))
    runs = {k: [] for k in keys}
    for rep in range(a.repeat):
        for k in (keys if rep % 2 == 0 else keys[::-1]):  # alternate the order, so drift hits every phase alike
            r = run_phase({"phase": k, "env": a.env, "n": a.envs, "seconds": a.seconds, "profile": a.profile})
            runs[k].append(r)
            print(f"  run {rep + 1} {k}: " + (r["error"] if "error" in r else f"{r['steps'] / r['seconds']:,.0f} env-steps/s"), flush=True)
    print(noise_line("after"))
    rate = lambda k: statistics.median(r["steps"] / r["seconds"] for r in runs[k] if "error" not in r) if any("error" not in r for r in runs.get(k, [])) else None
    print(f"\n{a.env}, {a.envs} environments, random actions, auto-reset; median of {a.repeat} runs of {a.seconds:g} s\n")
    print("| | env-steps/s | min - max | vs Sync | vs Async | CPU µs/env-step, all processes (client / servers) |")
    print("|---|---|---|---|---|---|")
    for k in keys:
        ok = [r for r in runs[k] if "error" not in r]
        label = PHASES[k][0].format(servers=ok[0].get("servers", "?") if ok else "?")
        if not ok: print(f"| {label} | n/a ({runs[k][0]['error'][:80]}) | | | | |"); continue
        rs = [r["steps"] / r["seconds"] for r in ok]
        vs = lambda b: f"{rate(k) / rate(b):.2f}x" if rate(b) else "n/a"
        med = lambda key: statistics.median(r[key] for r in ok)
        cpu = f"{med('cpu_us'):.1f}" + (f" ({med('cpu_us') - med('server_cpu_us'):.1f} / {med('server_cpu_us'):.1f})" if "server_cpu_us" in ok[0] else "")
        errs = sum(r.get("errors", 0) for r in ok)
        print(f"| {label} | {rate(k):,.0f} | {min(rs):,.0f} - {max(rs):,.0f} | {vs('sync')} | {vs('async')} | {cpu} |" + (f" {errs} errors" if errs else ""))
    best = max((rate(k) or 0 for k in ("ours1", "local") if k in runs), default=0)
    if rate("sync") and rate("async") and best:
        print(f"\nTargets: >= 3x AsyncVectorEnv: {best / rate('async'):.2f}x ({'met' if best >= 3 * rate('async') else 'missed'}); "
              f">= 0.5x SyncVectorEnv: {best / rate('sync'):.2f}x ({'met' if best >= 0.5 * rate('sync') else 'missed'}) (best openenv-nb row)")


if __name__ == "__main__":
    main()
