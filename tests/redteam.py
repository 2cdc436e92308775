"""The red-team corpus: code that has escaped the interpreter (a server of `raw_coding`, `executor="exec"`) tries each
way out that the sandbox promises to close. `tests/test_coding.py` runs it against a server in each form we ship.

An attack is Python run in a worker, with `T`, a dict of targets, defined before it: pids to signal or read, a
secret to look for, paths, the server's port. It prints `LEAK <what> <where>` for each way through it found; anything
else (an error, a refusal, silence) is the sandbox holding. Two-session attacks are split in halves: the victim's
half (`*_victim`) runs in one session and the attacker's in another, while both are open.

Run as a script, this starts a server as `nobody`, with some syscalls refused to it, as a host or container that
refuses them would: `python redteam.py as-nobody unshare,landlock_create_ruleset -m openenv_nb.cli serve ...`.
"""
import json
import os
import sys

from openenv_nb.envs.coding import CodingEnvironment

SECRET_VAR = "REDTEAM_SECRET"  # the server's environment variable holding the secret


def raw_coding() -> CodingEnvironment:
    """The OS layers alone, as if the interpreter had been escaped (served as `redteam:raw_coding`)."""
    return CodingEnvironment(executor="exec", timeout_s=15.0, cpu_s=15.0, memory_mb=512, total_memory_mb=16_384)


ENVIRON = '''
import os
try: seen = {int(p) for p in os.listdir("/proc") if p.isdigit()}
except OSError: seen = set()
for pid in sorted((seen | set(T["pids"])) - {os.getpid()}):
    try: data = open(f"/proc/{pid}/environ", "rb").read()
    except OSError: continue
    if T["secret"].encode() in data: print("LEAK environ", pid)
'''

MEM = '''
import os
for pid in T["pids"]:
    if pid == os.getpid(): continue
    for f in ("mem", "environ", "maps"):
        try: open(f"/proc/{pid}/{f}", "rb").close()
        except OSError: continue
        print("LEAK", f, pid)
'''

SIGNALS = '''
import fcntl, os, resource
r, w = os.pipe()
for pid in T["pids"] + [1, -1]:
    if pid in (0, os.getpid()): continue
    for what, f in [("kill", lambda: os.kill(pid, 0)),
                    ("sigio", lambda: fcntl.fcntl(r, fcntl.F_SETOWN, pid)),
                    ("prlimit", lambda: resource.prlimit(pid, resource.RLIMIT_NOFILE)),
                    ("affinity", lambda: os.sched_setaffinity(pid, os.sched_getaffinity(pid))),
                    ("priority", lambda: os.setpriority(os.PRIO_PROCESS, pid, os.getpriority(os.PRIO_PROCESS, pid))),
                    ("pidfd", lambda: os.close(os.pidfd_open(pid)))]:
        try: f()
        except (OSError, ValueError, OverflowError): continue
        print("LEAK", what, pid)
'''

FILES = '''
for p in [T["secret_file"], "/etc/passwd", "/etc/hostname", "/proc/1/cmdline", T["server_home"]]:
    try: open(p, "rb").read(1)
    except (OSError, TypeError): continue
    print("LEAK read", p)
try: open(T["outside"], "w").write("x"); print("WROTE", T["outside"])  # harmless in a tmp of its own; the test looks outside
except OSError: pass
'''

NETWORK = '''
import socket
for family, addr in [(socket.AF_INET, ("127.0.0.1", T["port"])), (socket.AF_INET6, ("::1", T["port"]))]:
    try: socket.create_connection(addr, timeout=3).close()
    except OSError: continue
    print("LEAK connect", addr)
try: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close(); print("LEAK unix socket")
except OSError: pass
'''

PROCESSES = '''
import os
try: pid = os.fork()
except OSError: pid = None
if pid == 0: os._exit(0)
if pid is not None: print("LEAK fork", pid)
try: fd = os.memfd_create("x"); os.close(fd); print("LEAK memfd")
except OSError: pass
'''

SYSV_VICTIM = '''
import ctypes
shmid = ctypes.CDLL(None, use_errno=True).shmget(T["key"], 4096, 0o1666)  # IPC_CREAT | 0666: anyone may attach
print("MADE" if shmid >= 0 else "REFUSED")
'''

SYSV = '''
import ctypes
if ctypes.CDLL(None, use_errno=True).shmget(T["key"], 0, 0) >= 0: print("LEAK sysv", T["key"])
'''

TMP_VICTIM = '''
import json, os
made = []
for d in [os.environ["TMPDIR"], "/tmp", "/dev/shm"]:
    p = os.path.join(d, T["marker"])
    try: open(p, "w").write(T["secret"]); made.append(os.path.realpath(p))
    except OSError: pass
print(json.dumps(made))
'''

TMP = '''
import os
mine = os.path.realpath(os.environ["TMPDIR"])
for p in T["paths"] + T["homes"]:
    if os.path.isdir(p) and os.path.realpath(p) == mine: continue  # its own home (a tmpfs of its own is at the same path)
    try:
        if os.path.isdir(p): os.listdir(p); print("LEAK list", p)
        elif T["secret"] in open(p).read(): print("LEAK read", p)
    except OSError: pass
'''

FILL_VICTIM = '''
import os
home, total = os.environ["TMPDIR"], 0
try:
    for i in range(T["fill_mb"] // 16):
        with open(os.path.join(home, f"fill{i}"), "wb", buffering=0) as f:
            for _ in range(16): f.write(b"x" * 2**20); total += 1
except OSError as e: print("STOPPED", e.errno)
print("FILLED", total)
'''

FILL = '''
import os
try:
    with open(os.path.join(os.environ["TMPDIR"], "mine"), "wb", buffering=0) as f: f.write(b"y" * 8 * 2**20)
    print("WROTE 8 MB")
except OSError as e: print("LEAK tmp_full", e.errno)
'''

ATTACKS = {"environ": ENVIRON, "mem": MEM, "signals": SIGNALS, "files": FILES, "network": NETWORK, "processes": PROCESSES,
           "sysv": SYSV, "tmp": TMP, "fill": FILL}
VICTIMS = {"sysv": SYSV_VICTIM, "tmp": TMP_VICTIM, "fill": FILL_VICTIM}


def code(attack: str, targets: dict) -> str:
    """The code of `attack` (a key of `ATTACKS` or `VICTIMS`), with `T = targets` before it."""
    body = ATTACKS.get(attack) if not attack.endswith("_victim") else VICTIMS[attack.removesuffix("_victim")]
    return f"import json\nT = json.loads({json.dumps(json.dumps(targets))})\n" + body


# ---------------------------------------------------------------- a server as nobody

def _closed_gate(path: str) -> str | None:
    """The first directory on the way to `path` (itself left out) that other users may not enter, or `None`."""
    cur = "/"
    for part in path.strip("/").split("/")[:-1]:
        cur = os.path.join(cur, part)
        if not os.stat(cur).st_mode & 0o001: return cur
    return None


def open_to_all(paths) -> dict[str, list[str]]:
    """In this process's mount namespace (made private first), make each of `paths` reachable by any uid at its own path.

    A directory on the way that others may not enter (`/root`, mode 700) is covered by a small tmpfs of mode 755 that
    holds only `paths` under it, each bound from its real place (through a descriptor opened before the cover). Paths
    stay as they are, so a venv's `pyvenv.cfg`, its `.pth` files and `PYTHONPATH` work unchanged; nothing is written
    anywhere, and nothing outside this process changes. Returns the covered directories and what each holds."""
    from openenv_nb.sandbox.linux import CLONE_NEWNS, MS_BIND, MS_NODEV, MS_NOSUID, MS_PRIVATE, MS_REC, _libc, _ok, unshare
    real = sorted({os.path.realpath(p) for p in paths if os.path.isabs(p) and os.path.exists(p)})
    tops = [p for p in real if not any(p.startswith(q + "/") for q in real)]
    gates: dict[str, list[str]] = {}
    for p in tops:
        if (g := _closed_gate(p)): gates.setdefault(g, []).append(p)
    unshare(CLONE_NEWNS)
    _ok(_libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    for gate, inside in gates.items():
        fds = [os.open(p, os.O_PATH) for p in inside]  # before the cover hides them
        _ok(_libc.mount(b"tmpfs", gate.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0755,size=1m"), f"cover {gate}")
        for p, fd in zip(inside, fds):
            if os.path.isdir(f"/proc/self/fd/{fd}"): os.makedirs(p, exist_ok=True)
            else: os.makedirs(os.path.dirname(p), exist_ok=True); open(p, "a").close()
            _ok(_libc.mount(f"/proc/self/fd/{fd}".encode(), p.encode(), None, MS_BIND | MS_REC, None), f"bind {p}")
            os.close(fd)
    return gates


def as_nobody(deny: list[str], argv: list[str]):
    """Exec this Python, as `nobody`, with `argv`, and the syscalls `deny` refused (`EPERM`) to it and its children.

    This Python, its venv and the project may live where `nobody` cannot go (`/root/.pyenv`, a venv or a checkout
    under `/root`): `open_to_all` makes them reachable, at their own paths, in a mount namespace of this process's
    own: the interpreter's installation (`sys.base_prefix`: the binary and its `libpython`), the venv (`sys.prefix`)
    and every entry of `sys.path` (the project's source, `PYTHONPATH`, what `.pth` files add)."""
    from openenv_nb.sandbox.linux import drop_user, install_seccomp
    open_to_all([sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix, os.path.dirname(sys.executable),
                 *sys.path, *os.environ.get("PYTHONPATH", "").split(os.pathsep)])
    if deny: install_seccomp(denied=tuple(deny))
    drop_user(65534)
    os.chdir("/")
    os.execve(sys.executable, [sys.executable, *argv], os.environ)


if __name__ == "__main__" and sys.argv[1:2] == ["as-nobody"]:
    as_nobody([s for s in sys.argv[2].split(",") if s], sys.argv[3:])
