"""Test support for Ray: a real multi-node Ray cluster on this machine, and the process helpers that clean up after it.

Used by `tests/test_ray.py`, `bench/bench_ray.py` and the cells of `nbs/13_ray.ipynb` that run with `--flags ray`.
Not part of the library: `openenv_nb.ray` is what users call; this is how its tests get a cluster without a second
machine.

`LocalCluster` starts a head and worker nodes with `ray start`, each bound to its own loopback address (`127.0.0.2`,
`127.0.0.3`, ...; Linux routes all of `127.0.0.0/8` to loopback), all in a temporary directory of their own.
`kill_node` kills a node's processes at once, as a machine that loses power would; `stop` ends only the processes
this cluster started, by their ids (never `ray stop`, which ends every Ray process on the machine). Its nodes run
with token authentication off (`RAY_AUTH_MODE=disabled`), set explicitly: a token left in `~/.ray` by an earlier
local `ray.init()` would otherwise turn it on for the head but not for the workers, which then cannot join."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from openenv_nb.providers import free_port


def _children() -> dict[int, list[int]]:
    """Every process's children, from `/proc`."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit(): continue
        try: ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError): continue
        kids.setdefault(ppid, []).append(int(d))
    return kids


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants (Linux)."""
    kids, out, todo = _children(), [], [pid]
    while todo:
        p = todo.pop(); out.append(p); todo += kids.get(p, [])
    return out


def mentioning(text: str) -> list[int]:
    """Processes (other than this one) whose command line contains `text`, e.g. a directory only ours were started with."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid(): continue
        try:
            if text in Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"): out.append(int(d))
        except OSError: continue
    return out


def kill_all(pids: list[int], sig: int = signal.SIGKILL):
    """Send `sig` to each of `pids` that still runs."""
    for p in pids:
        try: os.kill(p, sig)
        except (ProcessLookupError, PermissionError): pass


def running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try: return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError: return False


def gone(pids, within_s: float = 10.0) -> bool:
    """Whether every process in `pids` has exited within `within_s` (a signal is delivered, not obeyed, at once)."""
    deadline = time.monotonic() + within_s
    while any(running(p) for p in pids):
        if time.monotonic() > deadline: return False
        time.sleep(0.05)
    return True


class LocalCluster:
    """A Ray cluster of several nodes on this machine, each on its own loopback address."""
    def __init__(self, nodes: int = 2, # the head and `nodes - 1` workers
                 num_cpus: float = 4, # logical CPUs of each node
                 resources: list[dict] | None = None, # custom resources per node
                 labels: list[dict] | None = None, # node labels per node
                 first_ip: str = "127.0.0.2", # the head's address; the workers' follow
                 startup_timeout_s: float = 120.0, # limit on each node starting
                ):
        base, last = first_ip.rsplit(".", 1)
        self.ips = [f"{base}.{int(last) + i}" for i in range(nodes)]
        self.num_cpus, self.startup_timeout_s = num_cpus, startup_timeout_s
        self.resources, self.labels = list(resources or [{}] * nodes), list(labels or [{}] * nodes)
        self.procs: list[subprocess.Popen | None] = []
        self.dir, self.address = None, None

    def __repr__(self): return f"LocalCluster({self.address!r}, nodes={self.ips})"
    def __enter__(self): self.start(); return self
    def __exit__(self, *exc): self.stop()

    def _args(self, i: int) -> list[str]:
        """The `ray start` arguments of node `i` (the head for `0`, which also sets the cluster's address)."""
        args = ["--block", "--node-ip-address", self.ips[i], "--num-cpus", str(self.num_cpus), "--disable-usage-stats",
                "--object-store-memory", str(100 * 2**20), "--include-log-monitor", "false"]
        if self.resources[i]: args += ["--resources", json.dumps(self.resources[i])]
        if self.labels[i]: args += ["--labels", ",".join(f"{k}={v}" for k, v in self.labels[i].items())]
        if i > 0: return args + ["--address", self.address]
        port = free_port(self.ips[0])
        self.address = f"{self.ips[0]}:{port}"
        return args + ["--head", "--port", str(port), "--include-dashboard", "false", "--temp-dir", self.dir,
                       "--dashboard-port", str(free_port(self.ips[0]))]

    def _node(self, i: int) -> subprocess.Popen:
        """Start node `i` with `ray start --block` and wait until its log says it runs."""
        log = Path(self.dir) / f"node-{i}.log"
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
        with open(log, "wb") as out:
            p = subprocess.Popen([sys.executable, "-m", "ray.scripts.scripts", "start", *self._args(i)], stdin=subprocess.DEVNULL,
                                 stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout_s
        while "Ray runtime started" not in log.read_text(errors="replace"):
            if p.poll() is not None or time.monotonic() > deadline:
                kill_all(process_tree(p.pid))
                raise RuntimeError(f"Ray node {self.ips[i]} did not start:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:]))
            time.sleep(0.1)
        return p

    def start(self) -> str:
        """Start the head, then the workers; the head's address (for `RayProvider(address=...)`)."""
        if self.procs: return self.address
        self.dir = tempfile.mkdtemp(prefix="oe-ray-", dir="/tmp")  # short: Ray's socket paths live under it
        try:
            for i in range(len(self.ips)): self.procs.append(self._node(i))
        except BaseException:
            self.stop(); raise
        return self.address

    def kill_node(self, i: int) -> list[int]:
        """Kill node `i`'s processes at once (SIGKILL), as a machine that dies; their ids."""
        p = self.procs[i]
        if p is None: return []
        pids = process_tree(p.pid)
        kill_all(pids)
        p.wait()
        self.procs[i] = None
        return pids

    def stop(self):
        """Kill every process of this cluster, by id, and remove its directory."""
        for i in reversed(range(len(self.procs))): self.kill_node(i)
        if self.dir:
            for _ in range(3):
                left = mentioning(self.dir)  # workers whose node went before them: they name our directory
                if not left: break
                kill_all(left); gone(left, 2.0)
            shutil.rmtree(self.dir, ignore_errors=True)
        self.procs, self.dir, self.address = [], None, None
