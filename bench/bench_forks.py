"""Forks of live episodes (issue 26): snapshot, restore and fork latency, and memory per branch, native against replay.

For each family (echo, Gymnasium's CartPole, chess, an OpenSpiel game, and the coding sandbox, whose forks are by
replay only) and each k (steps taken before the fork, 10 and 200), over one WebSocket with `openenv_nb.forks`:
- step: one step's latency (the anchor), on its own session, its episode restarted (untimed) when it ends;
- snapshot: `snapshot()` of the live episode at step k;
- restore: `restore(snapshot)` into another session (a replay runs the k steps again);
- fork(1): `fork(1)` end to end (a snapshot, a new session, a restore), and fork(n) per branch;
- memory per branch: the server's RSS growth (from /proc) over n branches, and the PSS growth of the server and its
  children (the coding environment's sandbox workers are children).
"Native" is the family's own target, which copies itself (`snapshot_state` / `restore_state`); "replay" is the same
class with its hooks removed (`snapshot_state = restore_state = None`, `REPLAYABLE`), served from this file, so the
server rebuilds the episode by replaying its log. Each (family, mode, k) has a fresh server process, so that memory
freed by one measure is not reused by the next. Where an episode cannot last k steps (CartPole falls, games end), the
longest valid k is used and printed. A family whose extra is missing is skipped, saying so.
The env-side table times `snapshot_state` / `restore_state` against a step in this process, with no server, and how
long the server's sizing of a native snapshot (`snapshots._size`: one pickle) takes.

    python bench/bench_forks.py [--quick] [--repeat 3] [--only echo,cartpole] [--json results.json]

Targets (issue 26): a native fork of echo or CartPole at most 2x the cost of one step; replay linear in k (the
table's "k=200 / k=10" ratio of replay restores).
"""
import argparse
import asyncio
import copy
import importlib.util
import json
import os
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_core import noise_line, percentile, proc_tree, raise_nofile  # noqa: E402

GAME = "2048"  # OpenSpiel: one player and chance, episodes of hundreds of moves
FAMILIES = {  # name: (native target, replay target, the module its extra brings)
    "echo": ("echo", "bench_forks:ReplayedEcho", None),
    "cartpole": ("gym:CartPole-v1", "bench_forks:ReplayedCartPole", "gymnasium"),
    "chess": ("chess", "bench_forks:ReplayedChess", "chess"),
    "openspiel": (f"openspiel:{GAME}", "bench_forks:ReplayedSpiel", "pyspiel"),
    "coding": (None, "coding", None),  # by replay only: its code history in a fresh worker
}
EXTRA = {"gymnasium": "gym", "chess": "chess", "pyspiel": "openspiel"}
_BASES = {"ReplayedEcho": "echo", "ReplayedCartPole": "gym:CartPole-v1", "ReplayedChess": "chess",
          "ReplayedSpiel": f"openspiel:{GAME}"}


def __getattr__(name: str):
    "The replay classes, made on first use (in the server that serves them): the family's class, hooks removed."
    if name not in _BASES: raise AttributeError(name)
    from openenv_nb.targets import resolve
    base = resolve(_BASES[name])[0]
    cls = type(name, (base,), {"snapshot_state": None, "restore_state": None, "REPLAYABLE": True,
                               "__module__": __name__, "__qualname__": name})
    globals()[name] = cls
    return cls


def policy(family: str, obs: dict, i: int, rng: random.Random) -> dict:
    "The action of step `i`, seen `obs`: one that keeps the episode going where that takes a choice."
    if family == "echo": return {"message": "hi"}
    if family == "cartpole":
        x, dx, th, dth = obs["obs"]
        return {"action": int(th + 0.5 * dth + 0.01 * (x + dx) > 0)}
    if family == "chess": return {"move": rng.choice(sorted(obs["legal_moves"]))}
    if family == "openspiel":  # 2048: down, left, right, up, the first legal (keeps the board alive long)
        return {"action_id": next(a for a in (2, 3, 1, 0) if a in obs["legal_actions"])}
    if family == "coding": return {"code": f"x{i} = {i}\ntotal = x{i} + {i}"}
    raise ValueError(family)


async def play(env, family: str, seed: int, k: int) -> int:
    "Reset with `seed` and take up to `k` steps; the steps taken before the episode ended (or `k`)."
    rng = random.Random(seed)
    obs = (await env.reset(seed=seed)).observation
    for i in range(k):
        r = await env.step(policy(family, obs, i, rng))
        if r.done: return i  # step i+1 ended it: i steps leave a live episode
        obs = r.observation
    return k


def mem_kb(pid: int) -> tuple[int, int]:
    "The server's RSS, and the PSS of it and its descendants, in KiB."
    def field(path, name):
        try:
            for line in Path(path).read_text().splitlines():
                if line.startswith(name): return int(line.split()[1])
        except OSError: pass
        return 0
    return field(f"/proc/{pid}/status", "VmRSS:"), sum(field(f"/proc/{p}/smaps_rollup", "Pss:")
                                                        for p in proc_tree(pid))


def stats(xs: list[float]) -> dict:
    s = sorted(xs)
    return {"p50": statistics.median(s), "p99": percentile(s, 0.99), "n": len(s)}


async def timed(fn, times: int) -> list[float]:
    "Milliseconds of each of `times` awaited calls of `fn`."
    out = []
    for _ in range(times):
        t = time.perf_counter()
        await fn()
        out.append(1e3 * (time.perf_counter() - t))
    return out


async def measure(url: str, pid: int, family: str, seed: int, k: int, size: dict) -> dict:
    "Every figure for one server, at step k of the episode that `seed` starts."
    import openenv_nb.forks  # noqa: F401  (snapshot, restore, fork)
    from openenv_nb.client import GenericEnvClient
    out = {}
    async with GenericEnvClient(url) as env, GenericEnvClient(url) as twin, GenericEnvClient(url) as anchor:
        got = await play(env, family, seed, k)
        assert got == k, f"{family}: the episode of seed {seed} lasted {got} steps, not {k}"
        # the client's share: `snapshot()` and `restore()` each copy the client's episode log (k steps) apart;
        # they deep-copied it before, which grew with k (kept as the "before" column)
        from openenv_nb.forks import _copied
        out["log_copy"] = stats(await timed(lambda: asyncio.sleep(0, _copied(env.episode)), 20))
        out["log_deepcopy"] = stats(await timed(lambda: asyncio.sleep(0, copy.deepcopy(env.episode)), 20))
        await anchor.reset(seed=seed)
        await twin.reset(seed=seed)
        # memory first, on a fresh server: n branches held at once
        m0 = mem_kb(pid)
        t = time.perf_counter()
        kids = await env.fork(size["mem"])
        out["fork_mem_ms"] = 1e3 * (time.perf_counter() - t) / size["mem"]
        m1 = mem_kb(pid)
        out["rss_kb"] = (m1[0] - m0[0]) / size["mem"]
        out["pss_kb"] = (m1[1] - m0[1]) / size["mem"]
        out["branches"] = size["mem"]
        for c in kids: await c.close()
        # the anchor: one step, episodes restarted (untimed) when they end
        rng, obs, steps, i = random.Random(seed), (await anchor.reset(seed=seed)).observation, [], 0
        for _ in range(size["steps"]):
            a = policy(family, obs, i, rng)
            t = time.perf_counter()
            r = await anchor.step(a)
            steps.append(1e3 * (time.perf_counter() - t))
            obs, i = r.observation, i + 1
            if r.done or (family == "coding" and i >= 50):
                obs, i = (await anchor.reset(seed=seed)).observation, 0
        out["step"] = stats(steps)
        snaps = []
        async def snap(): snaps.append(await env.snapshot())
        out["snapshot"] = stats(await timed(snap, size["snaps"]))
        out["native"] = snaps[-1].native
        out["restore"] = stats(await timed(lambda: twin.restore(snaps[-1]), size["restores"]))
        async def fork1():
            for c in await env.fork(1): await c.close()
        out["fork1"] = stats(await timed(fork1, size["forks"]))
        per = []
        for _ in range(size["forkn_times"]):
            t = time.perf_counter()
            kids = await env.fork(size["n"])
            per.append(1e3 * (time.perf_counter() - t) / size["n"])
            for c in kids: await c.close()
        out["forkn_branch"] = stats(per)
        out["n"] = size["n"]
    return out


def serve(target: str, sessions: int):
    from openenv_nb.providers import LocalProcessProvider
    path = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH", "")]))
    p = LocalProcessProvider(target, max_sessions=sessions, env_vars={"PYTHONPATH": path})
    p.start()
    return p


def sizes(family: str, mode: str, k: int, quick: bool) -> dict:
    "How many of each measure: fewer where each costs a replay of many slow steps (chess, coding)."
    slow = mode == "replay" and (k > 50 or family == "chess")
    if family == "coding": return dict(mem=2, steps=30, snaps=5, restores=3, forks=2, forkn_times=1, n=2)
    if quick and slow: return dict(mem=4, steps=100, snaps=20, restores=3, forks=2, forkn_times=1, n=4)
    if quick: return dict(mem=16, steps=100, snaps=20, restores=15, forks=8, forkn_times=2, n=8)
    if slow and family == "chess": return dict(mem=8, steps=300, snaps=50, restores=8, forks=5, forkn_times=2, n=8)
    return dict(mem=64, steps=600, snaps=100, restores=60, forks=30, forkn_times=5, n=32)


async def find_seed(url: str, family: str, k: int, tries: int) -> tuple[int, int]:
    "The first seed whose episode lasts `k` steps, else the one that lasts longest: `(seed, steps)`."
    from openenv_nb.client import GenericEnvClient
    best = (0, -1)
    async with GenericEnvClient(url) as env:
        for seed in range(tries):
            got = await play(env, family, seed, k)
            if got > best[1]: best = (seed, got)
            if got == k: break
    return best


def env_side(families: list[str]) -> dict:
    "In process, no server: a step, `snapshot_state`, `restore_state` and `snapshots._size`, in µs (median of 5)."
    import timeit
    from openenv_nb.environment import env_types
    from openenv_nb.snapshots import _log_size, _size
    from openenv_nb.targets import resolve
    out = {}
    for fam in families:
        if FAMILIES[fam][0] is None: continue
        cls = resolve(FAMILIES[fam][0])[0]
        a, b, act_type = cls(), cls(), env_types(cls)[0]
        rng, obs = random.Random(0), a.reset(seed=0).model_dump()
        for i in range(10):
            obs = a.step(act_type(**policy(fam, obs, i, rng))).model_dump()
        act = act_type(**policy(fam, obs, 10, rng))
        s = a.snapshot_state()
        def step():  # one step from the same state each time: restore (untimed) is done apart
            b.restore_state(s, "x"); t = time.perf_counter(); b.step(act); return time.perf_counter() - t
        n = 20 if fam == "chess" else 200  # a chess step (its opponent, its SVG) takes milliseconds
        us = lambda f: 1e6 * statistics.median(timeit.timeit(f, number=n) / n for _ in range(5))
        step_us = 1e6 * statistics.median(step() for _ in range(5 * n))
        out[fam] = {"step_us": step_us, "snapshot_us": us(a.snapshot_state),
                    "restore_us": us(lambda: b.restore_state(s, "x")),
                    "size_us": us(lambda: _size(s)), "bytes": _size(s)}
        if fam == "cartpole":  # before: a deep copy of the wrapped env to take, another to restore
            out[fam]["deepcopy_us"] = 2 * us(lambda: copy.deepcopy(a.env))
        for k in (10, 200):  # the server's sizing of the replay log every snapshot carries (JSON per step)
            log = ({"seed": 0}, [(policy(fam, obs, i, rng), {}, None) for i in range(k)])
            out[fam][f"log_size_us_k{k}"] = us(lambda: _log_size(log))
    return out


def fmt(d: dict) -> str: return f"{d['p50']:.2f} / {d['p99']:.2f}"


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f}" + (f" ({min(xs):.2f}-{max(xs):.2f})" if len(xs) > 1 else "")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer samples and branches, 2 repeats: under two minutes")
    p.add_argument("--repeat", type=int, help="runs of everything (default 3, quick 2): the spread is the noise")
    p.add_argument("--only", default=",".join(FAMILIES), help="families: " + ",".join(FAMILIES))
    p.add_argument("--ks", default="10,200", help="steps before the fork")
    p.add_argument("--json", default="bench_forks.json", help="where the results go")
    a = p.parse_args()
    repeat = a.repeat or (2 if a.quick else 3)
    raise_nofile()
    fams = []
    for f in a.only.split(","):
        mod = FAMILIES[f][2]
        if mod and importlib.util.find_spec(mod) is None:
            print(f"skipped {f}: its extra is missing (pip install 'openenv-nb[{EXTRA[mod]}]')")
        else: fams.append(f)
    ks = [int(k) for k in a.ks.split(",")]
    print(noise_line("before"), flush=True)
    t0 = time.perf_counter()
    plan = {}  # (family, k wanted) -> (seed, k used)
    for f in fams:
        prov = serve(FAMILIES[f][0] or FAMILIES[f][1], 4)
        try:
            for k in ks:
                seed, got = asyncio.run(find_seed(prov.base_url, f, k, 4 if a.quick else 10))
                plan[f, k] = (seed, got)
                if got != k: print(f"{f}: no episode of the seeds tried lasts {k} steps; k = {got} (seed {seed})")
        finally: prov.stop()
    runs = {}  # (family, mode, k) -> list of results
    for rep in range(repeat):
        for f in fams:
            jobs = [(f, mode, k) for mode, tgt in zip(("native", "replay"), FAMILIES[f][:2]) if tgt for k in ks]
            with ThreadPoolExecutor(len(jobs)) as pool:  # fresh servers, started at once
                provs = list(pool.map(lambda j: serve(FAMILIES[j[0]][0 if j[1] == "native" else 1], 80), jobs))
            try:
                for j, prov in zip(jobs, provs):
                    seed, k = plan[f, j[2]]
                    size = sizes(f, j[1], k, a.quick)
                    r = asyncio.run(measure(prov.base_url, prov.proc.pid, f, seed, k, size))
                    runs.setdefault(j, []).append({**r, "k": k, "seed": seed})
                    print(f"  run {rep + 1} {f} {j[1]} k={k}: step {fmt(r['step'])} ms, restore "
                          f"{fmt(r['restore'])} ms, native={r['native']}", flush=True)
            finally:
                for prov in provs: prov.stop()
    print(noise_line("after"))
    side = env_side(fams)
    took = time.perf_counter() - t0
    Path(a.json).write_text(json.dumps({"repeat": repeat, "quick": a.quick, "seconds": took, "env_side": side,
                                        "runs": [{"family": f, "mode": m, "k_wanted": k, "results": rs}
                                                 for (f, m, k), rs in runs.items()]}, indent=1))
    med = lambda rs, key, q="p50": [r[key][q] for r in rs]
    print(f"\nMedian over {repeat} runs of each run's p50 (min-max over the runs in brackets), ms; p99 is the "
          "median of the runs' p99. Memory: KiB per branch.\n")
    print("| family | mode | k | step | snapshot | restore | fork(1) | fork(n) per branch | p99 step / snap / "
          "restore / fork(1) | restore / step | server RSS / branch | PSS of the tree / branch |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (f, m, kw), rs in runs.items():
        p99 = " / ".join(f"{statistics.median(med(rs, key, 'p99')):.2f}" for key in ("step", "snapshot", "restore", "fork1"))
        ratio = statistics.median(r["restore"]["p50"] / r["step"]["p50"] for r in rs)
        print(f"| {f} | {m} | {rs[0]['k']} | {spread(med(rs, 'step'))} | {spread(med(rs, 'snapshot'))} | "
              f"{spread(med(rs, 'restore'))} | {spread(med(rs, 'fork1'))} | "
              f"{spread(med(rs, 'forkn_branch'))} (n={rs[0]['n']}) | {p99} | {ratio:.1f}x | "
              f"{statistics.median(r['rss_kb'] for r in rs):,.0f} | {statistics.median(r['pss_kb'] for r in rs):,.0f} "
              f"(n={rs[0]['branches']}) |")
    print("\nReplay against k: restore p50 at each k, a straight line fitted through them (least squares), and "
          "the last k over the first. Linear in k: with three k or more, the points lie on the line (the worst miss is "
          "small).\n")
    print("| family | restore p50 by k (ms) | per replayed step (slope) | fixed (intercept) | worst miss of the line "
          "(of the largest) | "
          "last k over first k |")
    print("|---|---|---|---|---|---|")
    for f in fams:
        pts = [(rs[0]["k"], statistics.median(med(rs, "restore"))) for (g, m, _), rs in runs.items()
               if g == f and m == "replay"]
        if len(pts) < 2: continue
        mk, my = statistics.fmean(k for k, _ in pts), statistics.fmean(y for _, y in pts)
        slope = sum((k - mk) * (y - my) for k, y in pts) / sum((k - mk) ** 2 for k, _ in pts)
        icpt = my - slope * mk
        top = max(y for _, y in pts)  # misses as a share of the largest restore
        miss = (f"{max(abs(y - (icpt + slope * k)) for k, y in pts) / top:.0%}" if len(pts) > 2
                else "n/a: two points (--ks 10,100,200 adds one)")
        print(f"| {f} | {', '.join(f'k={k}: {y:.2f}' for k, y in pts)} | {1e3 * slope:.1f} µs | {icpt:.2f} ms | "
              f"{miss} | {pts[-1][1] / pts[0][1]:.1f}x for {pts[-1][0] / pts[0][0]:.0f}x the steps |")
    print("\nEnv side, in process (µs, median of 5): a native copy against a step; `_size` is the server's pickle "
          "of the snapshot, taken with each snapshot:\n")
    print("| family | step | snapshot_state | restore_state | copy / step | before: 2 deep copies | "
          "_size (pickle) | snapshot bytes |")
    print("|---|---|---|---|---|---|---|---|")
    for f, d in side.items():
        old = f"{d['deepcopy_us']:.1f} ({d['deepcopy_us'] / d['step_us']:.1f}x)" if "deepcopy_us" in d else "-"
        print(f"| {f} | {d['step_us']:.1f} | {d['snapshot_us']:.1f} | {d['restore_us']:.1f} | "
              f"{(d['snapshot_us'] + d['restore_us']) / d['step_us']:.1f}x | {old} | {d['size_us']:.1f} | "
              f"{d['bytes']:,} |")
    print("\nWhat grows with k in a native fork (ms, p50): the client copies its episode log apart on `snapshot()` "
          "and again on `restore()` (a deep copy before); the server sizes the replay log (JSON per step) on every "
          "snapshot:\n")
    print("| family | k | client log copy (each) | before: deep copy | server `_log_size` | native snapshot "
          "| native restore |")
    print("|---|---|---|---|---|---|---|")
    for (f, m, kw), rs in runs.items():
        if m != "native": continue
        ls = side.get(f, {}).get(f"log_size_us_k{kw}")
        print(f"| {f} | {rs[0]['k']} | {spread(med(rs, 'log_copy'))} | {spread(med(rs, 'log_deepcopy'))} | "
              f"{'-' if ls is None else f'{ls / 1e3:.2f}'} | {spread(med(rs, 'snapshot'))} | "
              f"{spread(med(rs, 'restore'))} |")
    print(f"\n{took:.0f} s; results in {a.json}")


if __name__ == "__main__":
    main()
