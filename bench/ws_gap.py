"""Where the one-session WebSocket gap to the floor goes: five servers, one raw client, alternating short slices.

The servers, all on 127.0.0.1, each in its own process:

- floor:     ``floor_server.py``, bare ``websockets`` (bench_core's floor);
- uvicorn:   a bare ASGI echo on uvicorn with our settings (``server_config``): the server stack, with no framework;
- canned:    our server, whose sessions answer every frame with one fixed observation frame: everything but the action path;
- minimal:   our server, whose sessions do only what any server must for a step: read the JSON, check the action, call
             echo's ``step``, write the envelope (no message types, ids, limits or rubrics);
- ours:      our server as ``openenv serve echo`` runs it.

Each slice opens one session, resets, warms up, then sends a step and waits for its reply, for ``--secs`` seconds;
the five servers take turns, ``--slices`` times, so that machine noise falls on all of them alike. Server CPU per step
is read from ``/proc/PID/stat``.

Usage: python bench/ws_gap.py [--slices 8] [--secs 2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_core import HOST, RESET_MSG, STEP_MSG, cpu_seconds, free_port, noise_line  # noqa: E402

UVICORN_ECHO = """
import sys
from openenv_nb.server import serve
async def app(scope, receive, send):
    if scope["type"] != "websocket": return
    await receive(); await send({"type": "websocket.accept"})
    while (m := await receive())["type"] == "websocket.receive": await send({"type": "websocket.send", "text": m["text"]})
serve(app, port=int(sys.argv[1]), log_level="warning", announce=False)
"""

OURS_VARIANT = """
import sys
import openenv_nb.server as S
import openenv_nb.sessions as SS
from openenv_nb.envs.echo import EchoAction, EchoEnvironment
from openenv_nb.types import loads, to_envelope
app, kind, full = S.create_app(EchoEnvironment, max_concurrent_envs=64), sys.argv[2], SS.Session.handle
if kind == "canned":
    frame = {"type": "observation", "data": to_envelope(EchoEnvironment().step(EchoAction(message="hi")))}
    async def handle(self, text): return frame
else:
    check = EchoAction.__pydantic_validator__.validate_python
    async def handle(self, text):
        m = loads(text)
        if m.get("type") != "step": return await full(self, text)
        return {"type": "observation", "data": to_envelope(self.env.step(check(m["data"])))}
SS.Session.handle = handle
S.serve(app, port=int(sys.argv[1]), log_level="warning", announce=False)
"""


def commands(port: int) -> dict[str, list[str]]:
    "The command line of each server, listening on `port`."
    py, bench = sys.executable, Path(__file__).resolve().parent
    return {"floor": [py, str(bench / "floor_server.py"), "--port", str(port)],
            "uvicorn": [py, "-c", UVICORN_ECHO, str(port)],
            "canned": [py, "-c", OURS_VARIANT, str(port), "canned"],
            "minimal": [py, "-c", OURS_VARIANT, str(port), "minimal"],
            "ours": [py, "-m", "openenv_nb.cli", "serve", "echo", "--port", str(port), "--log-level", "warning"]}


async def one_slice(url: str, secs: float) -> int:
    "Steps done in `secs` seconds by one session, sending a step and waiting for its reply each time."
    from websockets.asyncio.client import connect
    async with connect(url, compression=None, max_size=None) as ws:
        await ws.send(RESET_MSG); await ws.recv()
        for _ in range(300): await ws.send(STEP_MSG); await ws.recv()
        n, end = 0, time.perf_counter() + secs
        while time.perf_counter() < end:
            await ws.send(STEP_MSG); await ws.recv(); n += 1
    return n


def wait_listening(port: int, timeout: float = 30) -> None:
    "Return once something accepts connections on `port`."
    import socket
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try: socket.create_connection((HOST, port), timeout=1).close(); return
        except OSError: time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port} after {timeout} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slices", type=int, default=8)
    ap.add_argument("--secs", type=float, default=2.0)
    a = ap.parse_args()
    print(noise_line("before"))
    procs, ports = {}, {}
    try:
        for name in commands(0):
            ports[name] = free_port()
            procs[name] = subprocess.Popen(commands(ports[name])[name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for port in ports.values(): wait_listening(port)
        rate, cpu = {n: [] for n in procs}, {n: [] for n in procs}
        for _ in range(a.slices):
            for name, p in procs.items():
                c0, t0 = cpu_seconds(p.pid), time.perf_counter()
                steps = asyncio.run(one_slice(f"ws://{HOST}:{ports[name]}/ws", a.secs))
                c1 = cpu_seconds(p.pid)
                rate[name].append(steps / a.secs)
                cpu[name].append((c1 - c0) / (steps + 301) * 1e6)  # the slice's steps, its warm-up and its reset
    finally:
        for p in procs.values(): p.terminate()
    floor = statistics.median(rate["floor"])
    print(f"\n| server | steps/s, 1 session: median [min-max] of {a.slices} | / floor | server CPU per step (µs) |")
    print("|---|---|---|---|")
    for name in procs:
        r = rate[name]
        print(f"| {name} | {statistics.median(r):,.0f} [{min(r):,.0f}-{max(r):,.0f}] | {statistics.median(r) / floor:.2f}x "
              f"| {statistics.median(cpu[name]):.0f} |")
    print("\n" + noise_line("after"))


if __name__ == "__main__":
    main()
