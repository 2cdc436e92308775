"""Environments on Ray: a real two-node cluster on this machine (head 127.0.0.2, worker 127.0.0.3), started with
`ray start` by `LocalCluster` (test support, in `ray_cluster.py`) and stopped by process id (never `ray stop`)."""
import os
import subprocess
import time

import pytest

from openenv_nb.envs.echo import EchoAction, EchoObservation
from openenv_nb.providers import ProviderError, healthy
from openenv_nb.ray import PlacementError, RayProvider
from openenv_nb.resume import Resume
from openenv_nb.types import EnvConnectionError, State
from openenv_nb.vector import VectorEnv
from conftest import need
from ray_cluster import LocalCluster, gone, kill_all, mentioning, process_tree, running

try:
    import ray
except ImportError:
    ray = None

pytestmark = pytest.mark.ray
HEAD, WORKER = "127.0.0.2", "127.0.0.3"


class EchoVector(VectorEnv[EchoAction, EchoObservation, State]):
    pass


@pytest.fixture(scope="module")
def cluster():
    need("ray", ray is not None, "Ray is not installed (pip install 'openenv-nb[ray]')")
    c = LocalCluster(nodes=2, num_cpus=4, labels=[{"openenv-node": "head"}, {"openenv-node": "worker"}])
    c.start()
    d = c.dir
    yield c
    c.stop()
    assert mentioning(d) == [], "processes of the test cluster left behind"


def wait_for(cond, within_s: float) -> bool:
    """Whether `cond()` holds within `within_s`, checked as the provider's watcher changes things."""
    deadline = time.monotonic() + within_s
    while not cond():
        if time.monotonic() > deadline: return False
        time.sleep(0.05)
    return True


def provider(cluster, **kw) -> RayProvider:
    """A provider on the test cluster: small servers (half a CPU), checked often."""
    return RayProvider(**{"num_cpus": 0.5, "address": cluster.address, "check_interval_s": 0.5, **kw})


def test_the_cluster_helpers_find_and_end_a_process_tree():
    """`process_tree` and `kill_all`, which `LocalCluster` relies on to leave nothing behind."""
    child = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & echo started; wait"], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "started\n"  # both sleeps are forked before the echo runs
    tree = process_tree(child.pid)
    assert len(tree) == 3 and tree[0] == child.pid and child.pid in mentioning("sleep 60 & sleep 60")
    kill_all(tree)
    child.wait(); child.stdout.close()
    assert gone(tree), f"left: {[p for p in tree if running(p)]}"


def test_servers_on_both_nodes_run_an_episode_and_leave_nothing(cluster):
    rp = provider(cluster, num_servers=4, spread=True)
    with rp:
        assert sorted(s.node_ip for s in rp.servers) == [HEAD, HEAD, WORKER, WORKER]
        assert len(set(rp.urls)) == 4 and all(u.split("//")[1].split(":")[0] == s.node_ip for u, s in zip(rp.urls, rp.servers))
        with EchoVector(rp, num_envs=8).sync() as venv:
            r = venv.reset(seed=0)
            assert r.ok and r.observations[7].echoed_message == "Echo environment ready!"
            r = venv.step([EchoAction(message="x" * i) for i in range(8)])
            assert r.ok and [o.message_length for o in r.observations] == list(range(8))
            h = rp.health()
            assert [x["healthy"] for x in h] == [True] * 4 and sum(x["active_sessions"] for x in h) == 8
        assert all(s.server_pid != s.pid for s in rp.servers)  # the default: a server process per actor
        pids, urls = [p for s in rp.servers for p in (s.pid, s.server_pid)], list(rp.urls)
        assert ray.is_initialized()
    assert rp.urls == [] and rp.servers == [] and not ray.is_initialized()  # it connected, so it disconnected
    assert gone(pids), f"actor or server processes left: {[p for p in pids if running(p)]}"
    assert not any(healthy(u) for u in urls)


def test_labels_place_servers_and_thread_servers_leave_nothing(cluster):
    with provider(cluster, num_servers=2, label_selector={"openenv-node": "worker"}, backend="thread") as rp:
        assert [s.node_ip for s in rp.servers] == [WORKER, WORKER]
        assert all(s.server_pid == s.pid for s in rp.servers)
        with EchoVector(rp, num_envs=2).sync() as venv:
            assert venv.step([EchoAction(message="ab")] * 2).rewards == [0.2, 0.2]
        pids = [s.pid for s in rp.servers]
    assert gone(pids), f"actor processes left: {[p for p in pids if running(p)]}"


@pytest.mark.parametrize("ask, says", [
    (dict(resources={"gpu_node": 1}), "no node has the resource 'gpu_node'"),
    (dict(label_selector={"openenv-node": "mars"}), "no node has the labels {'openenv-node': 'mars'}"),
    (dict(num_cpus=16), "each server asks for CPU 16, and the largest node has 4"),
], ids=["resource", "label", "cpus"])
def test_impossible_placement_hits_our_timeout(cluster, ask, says):
    """Ray would wait forever; the provider gives up after its own limit (pytest's timeout guards the rest)."""
    with pytest.raises(PlacementError, match="Ray placed 0 of 2 servers within 2 s") as e:
        provider(cluster, num_servers=2, placement_timeout_s=2, **ask).start()
    assert says in str(e.value)
    assert not ray.is_initialized()


def test_a_server_that_cannot_start_says_why(cluster):
    with pytest.raises(ProviderError, match="No module named 'no_such_module'"):
        provider(cluster, target="no_such_module:Env", num_servers=1).start()
    assert not ray.is_initialized()


def test_local_starts_and_ends_a_ray_of_its_own(cluster, monkeypatch):
    """`local=True` (a laptop): a Ray instance of the provider's own, gone after `stop`."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # no token file written to ~/.ray
    init = {"_node_ip_address": "127.0.0.4", "num_cpus": 2, "object_store_memory": 100 * 2**20}
    before = set(process_tree(os.getpid()))  # the module's cluster is under this process too
    with RayProvider(local=True, init_kwargs=init, num_servers=2, num_cpus=0.5) as rp:
        assert [s.node_ip for s in rp.servers] == ["127.0.0.4"] * 2
        with EchoVector(rp, num_envs=2).sync() as venv:
            assert venv.step([EchoAction(message="abc")] * 2).ok
        ours = set(process_tree(os.getpid())) - before - set(mentioning(cluster.dir))
        assert ours, "no Ray processes under this one"
    assert not ray.is_initialized() and gone(ours), f"left: {[p for p in ours if running(p)]}"


@pytest.mark.docker
def test_servers_in_docker_containers_leave_nothing(cluster, docker_engine):
    from openenv_nb.images import build
    from openenv_nb.providers import OWNER_LABEL, owner_id
    client = docker_engine
    image = build("echo", log=lambda line: None)
    with provider(cluster, num_servers=2, spread=True, backend="docker", image=image) as rp:
        assert sorted(s.node_ip for s in rp.servers) == [HEAD, WORKER] and all(s.container for s in rp.servers)
        with EchoVector(rp, num_envs=4).sync() as venv:
            assert venv.step([EchoAction(message="ab")] * 4).rewards == [0.2] * 4
        owners = [owner_id(s.pid) for s in rp.servers]
        names = [s.container for s in rp.servers]
        assert {c.name for o in owners for c in client.containers.list(filters={"label": f"{OWNER_LABEL}={o}"})} == set(names)
    assert [c.name for o in owners for c in client.containers.list(all=True, filters={"label": f"{OWNER_LABEL}={o}"})] == []


def test_killing_the_worker_node_moves_its_servers_and_rebuilds_its_episodes(cluster):
    """Last in the file: it kills the module's worker node. 256 environments over four servers, two of them on the
    worker: its 128 episodes are rebuilt by replay on the replacement servers, the others go on untouched."""
    n = 256
    with provider(cluster, num_servers=4, spread=True, failures_to_restart=2, sessions_per_server=n // 4) as rp:
        on_worker = [s.index for s in rp.servers if s.node_ip == WORKER]
        assert len(on_worker) == 2
        old = list(rp.urls)
        patient = Resume(attempts=200, total_s=120, first_delay_s=0.1, max_delay_s=1.0)
        with EchoVector(rp, num_envs=n, resume=patient).sync() as venv:  # in server order, 64 each
            assert venv.reset(seed=0).ok
            assert venv.step([EchoAction(message="hi")] * n).ok
            t0 = time.monotonic()
            cluster.kill_node(1)
            r = venv.step([EchoAction(message="again")] * n)  # waits for the replacements, then replays
            took = time.monotonic() - t0
            assert r.ok, [e for e in r.errors if e][:3]
            assert {o.echoed_message for o in r.observations} == {"again"}
            assert venv.resumes == n // 2 and [s.step_count for s in venv.states()] == [2] * n
            print(f"{n // 2} episodes rebuilt {took:.1f} s after the node was killed; events: {rp.events}")
            assert all(rp.urls[k] != old[k] and rp.servers[k].node_ip == HEAD for k in on_worker)
            assert [rp.urls[k] for k in range(4) if k not in on_worker] == [old[k] for k in range(4) if k not in on_worker]
        assert any("restarted" in what for _, what in rp.events)
        pids = [s.pid for s in rp.servers]
    assert gone(pids)
