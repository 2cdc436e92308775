"""Benchmark tool calls: a tool call over WebSocket against a classic echo step, and `POST /mcp` against upstream 0.10.

Two servers run side by side in one run, on 127.0.0.1:

- ours:     ``python -m openenv_nb.cli serve echo``: one builtin that answers ``EchoAction`` steps and the MCP echo tools
            (``echo_message``, ``echo_with_length``).
- upstream: ``bench/upstream_echo_server.py --apps mcp,echo`` on openenv 0.10.0 (its own venv, see
            ``tests/upstream_venv.py``): its ``MCPEnvironment`` with FastMCP echo tools, as upstream's echo_env has, and
            the classic echo (for context: the issue's targets compare ours with ours, and ours with upstream's MCP app).

Both run on uvicorn with uvloop and httptools (the row "server stack" says what each interpreter has). What is timed:

- **WS, server CPU per call**: a classic step (``{"type": "step", "data": {"message": "hi"}}``), a tool
  step (``CallToolAction`` of ``echo_message``) and an ``mcp`` message (JSON-RPC ``tools/call`` of ``echo_message``),
  each sequential send/recv on a bare ``websockets`` connection of its own; the three take turns in short slices
  (``--slices``), so that the load of other processes falls on each alike. Target: tool step and ``mcp`` message each at most
  1.3x the classic step's server CPU, on our server.
- **``POST /mcp`` ``tools/call`` req/s** of ``echo_message`` with no session (each call gets a fresh environment, as on
  upstream), one keep-alive ``http.client`` connection, and server CPU per request. Target: ours at least 2x upstream.

Load comes from a separate process (this script in ``--load`` mode). Phases are interleaved (classic, tool, mcp, then
HTTP ours and upstream) and repeated ``--repeat`` times; the table gives the median and the min-max over the repeats,
and each ratio is taken within a repeat (so slow drift of the machine cancels out). Server CPU is read from
``/proc/PID/stat`` around each timed phase. The load average and a CPU probe are printed before and after.

Usage: python bench/bench_mcp.py [--quick] [--repeat N] [--duration S] [--only ours,upstream]
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_core import (BENCH, HOST, Server, _on_sigterm, cpu_seconds, event_loop_runner, free_port, health_status,  # noqa: E402
                        log_tail, machine_busy_seconds, noise_line, percentile, raise_nofile, server_stack, start_server,
                        stop, stop_all, track, upstream_python)

RESET_MSG = json.dumps({"type": "reset", "data": {}})
TOOLS_CALL = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo_message", "arguments": {"message": "hi"}}}
WS_KINDS = {  # kind: (frame, what its reply must contain)
    "classic": (json.dumps({"type": "step", "data": {"message": "hi"}}), '"echoed_message":"hi"'),
    "tool": (json.dumps({"type": "step", "data": {"type": "call_tool", "tool_name": "echo_message", "arguments": {"message": "hi"}}}),
             '"tool_name":"echo_message"'),
    "mcp": (json.dumps({"type": "mcp", "data": TOOLS_CALL}), '"result"'),
}
WS_LABELS = {"classic": "classic echo step (EchoAction)", "tool": "tool step (CallToolAction echo_message)",
             "mcp": '"mcp" message (JSON-RPC tools/call)'}
HTTP_BODY = json.dumps(TOOLS_CALL).encode()
TOOL_CPU_TARGET, HTTP_RATE_TARGET = 1.3, 2.0


# ---------------------------------------------------------------- load (child process)

def _compact(reply: str) -> str:
    return reply.replace(" ", "")


async def load_ws(spec: dict) -> dict:
    """One connection per kind of frame; the kinds take turns in short slices, each slice sequential send/recv on its
    connection, so that a change in the machine's load falls on every kind alike. Per kind: server CPU per call,
    calls/s, p50, and the CPU other processes used meanwhile."""
    from websockets.asyncio.client import connect

    kinds, pid, clock = spec["kinds"], spec["server_pid"], time.perf_counter
    socks = {k: await connect(spec["urls"][k], compression=None, open_timeout=20, max_queue=None) for k in kinds}
    try:
        for kind, ws in socks.items():
            frame, must = WS_KINDS[kind]
            await ws.send(RESET_MSG)
            await ws.recv()
            await ws.send(frame)
            first = _compact(await ws.recv())
            if must not in first or '"hi"' not in first or '"type":"error"' in first:
                return {"error": f"unexpected {kind} reply: {first[:300]}"}
            for _ in range(spec["warmup"]):
                await ws.send(frame)
                await ws.recv()
        tot = {k: {"calls": 0, "cpu": 0.0, "wall": 0.0, "other": 0.0, "lat": []} for k in kinds}
        for _ in range(spec["slices"]):
            for kind in kinds:
                ws, (frame, _), t = socks[kind], WS_KINDS[kind], tot[kind]
                all0, cpu0, own0, t0 = machine_busy_seconds(), cpu_seconds(pid), time.process_time(), clock()
                deadline = t0 + spec["duration"] / spec["slices"]
                while clock() < deadline:
                    t1 = clock()
                    await ws.send(frame)
                    await ws.recv()
                    t["lat"].append(clock() - t1)
                    t["calls"] += 1
                t1, cpu1, own1, all1 = clock(), cpu_seconds(pid), time.process_time(), machine_busy_seconds()
                t["cpu"], t["wall"] = t["cpu"] + cpu1 - cpu0, t["wall"] + t1 - t0
                t["other"] += max(0.0, (all1 - all0) - (cpu1 - cpu0) - (own1 - own0))
        for kind, ws in socks.items():  # still answering as it should
            await ws.send(WS_KINDS[kind][0])
            if WS_KINDS[kind][1] not in _compact(await ws.recv()):
                return {"error": f"{kind} replies changed during the run"}
    finally:
        for ws in socks.values():
            await ws.close()
    out = {}
    for kind, t in tot.items():
        t["lat"].sort()
        out[kind] = {"calls": t["calls"], "rate": t["calls"] / t["wall"], "cpu": t["cpu"] / t["calls"] * 1e6,
                     "p50": percentile(t["lat"], 0.5) * 1e6, "other_cpu_pct": t["other"] / t["wall"] * 100}
    return out


def _tool_value(body: bytes):
    """The value of a ``tools/call`` reply, or an error."""
    reply = json.loads(body)
    if reply.get("error") is not None or "result" not in reply:
        raise RuntimeError(f"tools/call failed: {body[:300]!r}")
    r = reply["result"]
    return r.get("data", r.get("structured_content", {}).get("result") if isinstance(r.get("structured_content"), dict) else None)


def load_http(spec: dict) -> dict:
    """Sequential keep-alive ``POST /mcp`` ``tools/call`` on one ``http.client`` connection; req/s and server CPU."""
    conn = http.client.HTTPConnection(HOST, spec["port"], timeout=10)
    headers = {"Content-Type": "application/json"}

    def post() -> bytes:
        conn.request("POST", "/mcp", body=HTTP_BODY, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"POST /mcp: HTTP {resp.status}: {data[:200]!r}")
        return data

    try:
        if _tool_value(post()) != "hi":
            return {"error": "POST /mcp tools/call did not echo 'hi'"}
        for _ in range(spec["warmup"]):
            post()
        n, clock = 0, time.perf_counter
        cpu0, t0 = cpu_seconds(spec["server_pid"]), clock()
        deadline = t0 + spec["duration"]
        while clock() < deadline:
            last = post()
            n += 1
        t1, cpu1 = clock(), cpu_seconds(spec["server_pid"])
        if _tool_value(last) != "hi":
            return {"error": "POST /mcp tools/call stopped echoing"}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"[:300]}
    finally:
        conn.close()
    return {"calls": n, "rate": n / (t1 - t0), "cpu": (cpu1 - cpu0) / n * 1e6}


def load_main(spec_json: str) -> None:
    """Entry point of the load process: run one phase, print its result as JSON."""
    spec = json.loads(spec_json)
    result = load_http(spec) if spec["mode"] == "http" else event_loop_runner()(load_ws(spec))
    print(json.dumps(result), flush=True)


def run_load(spec: dict, timeout: float) -> dict:
    """Run one load phase in a separate process; its JSON result, or {"error": ...}."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--load", json.dumps(spec)]
    proc = track(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True))
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"load process timed out after {timeout:.0f}s"}
    finally:
        stop(proc)
    lines = out.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"error": " ".join((err or out).strip().splitlines()[-1:])[:300] or f"rc={proc.returncode}"}
    return json.loads(lines[-1])


# ---------------------------------------------------------------- servers

def start_upstream(logdir: Path, timeout: float = 120.0) -> tuple[Server, dict[str, int]]:
    """Upstream's MCP echo app and classic echo app in one process; the server and the port of each app."""
    server = Server("upstream", port=free_port(), log=logdir / "upstream-mcp.log")
    try:
        cmd = [upstream_python(), str(BENCH / "upstream_echo_server.py"), "--host", HOST, "--port", str(server.port),
               "--apps", "mcp,echo", "--log-level", "warning"]
    except Exception as e:
        server.error = f"no upstream interpreter: {e}"
        return server, {}
    t0 = time.perf_counter()
    with open(server.log, "wb") as log:
        server.proc = track(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=BENCH.parent))
    while time.perf_counter() - t0 < timeout and server.proc.poll() is None:
        text = server.log.read_text(errors="replace")
        if "upstream listening " in text:
            ports = json.loads(text.split("upstream listening ", 1)[1].splitlines()[0])
            if all(health_status(p) == 200 for p in ports.values()):
                server.cold_starts.append(time.perf_counter() - t0)
                return server, ports
        time.sleep(0.05)
    stop(server.proc)
    server.error = f"upstream MCP server did not start: {log_tail(server.log) or '(empty log)'}"
    return server, {}


# ---------------------------------------------------------------- the run

def spread(values: list[float], fmt: str = "{:,.0f}") -> str:
    """``median [min-max]`` of a list of figures."""
    if not values:
        return "n/a"
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}–{fmt.format(max(values))}]"


def measure(names: list[str], repeat: int, duration: float, warmup: int, slices: int) -> tuple[dict, list[str], dict]:
    """Every phase, ``repeat`` times, interleaved; figures by (row, server), notes, and each server's stack."""
    figs: dict[tuple[str, str], list[float]] = {}
    notes: list[str] = []
    stacks = {}
    add = lambda key, name, v: figs.setdefault((key, name), []).append(v)
    with tempfile.TemporaryDirectory(prefix="bench-mcp-") as tmp:
        servers: dict[str, Server] = {}
        ports: dict[str, dict[str, int]] = {}
        try:
            if "ours" in names:
                servers["ours"] = start_server("ours", Path(tmp))
                ports["ours"] = {"mcp": servers["ours"].port, "echo": servers["ours"].port}
            if "upstream" in names:
                servers["upstream"], ports["upstream"] = start_upstream(Path(tmp))
            for name, server in servers.items():
                if server.error:
                    notes.append(f"{name}: {server.error}")
                stacks[name] = server_stack(name)
            live = {n: s for n, s in servers.items() if not s.error}
            for r in range(repeat):
                order = list(live) if r % 2 == 0 else list(reversed(live))
                for name in order:
                    server = live[name]
                    urls = {k: f"ws://{HOST}:{ports[name]['echo' if k == 'classic' else 'mcp']}/ws" for k in WS_KINDS}
                    out = run_load({"mode": "ws", "kinds": list(WS_KINDS), "urls": urls, "server_pid": server.proc.pid,
                                    "duration": duration, "slices": slices, "warmup": warmup}, timeout=3 * duration + 90)
                    if "error" in out:
                        notes.append(f"{name} ws: {out['error']}")
                    for kind in WS_KINDS if "error" not in out else ():
                        for f in ("cpu", "rate", "p50", "other_cpu_pct"):
                            add(f"ws.{kind}.{f}", name, out[kind][f])
                    out = run_load({"mode": "http", "port": ports[name]["mcp"], "server_pid": server.proc.pid,
                                    "duration": duration, "warmup": warmup}, timeout=duration + 60)
                    if "error" in out:
                        notes.append(f"{name} POST /mcp: {out['error']}")
                        continue
                    add("http.rate", name, out["rate"])
                    add("http.cpu", name, out["cpu"])
            for name, server in live.items():
                if not server.alive:
                    notes.append(f"{name}: {server.error}")
        finally:
            for server in servers.values():
                stop(server.proc)
    return figs, notes, stacks


def paired(figs: dict, a: tuple[str, str], b: tuple[str, str]) -> list[float]:
    """``a / b`` within each repeat (both lists in repeat order)."""
    return [x / y for x, y in zip(figs.get(a, []), figs.get(b, [])) if y]


def verdict(ratios: list[float], op: str, target: float) -> str:
    """✓ or ✗ for the median ratio against the target."""
    if not ratios:
        return "n/a"
    m = statistics.median(ratios)
    return "✓" if (m <= target if op == "<=" else m >= target) else "✗"


def render(figs: dict, names: list[str], stacks: dict) -> str:
    """The markdown table: per server, median [min-max] over the repeats; the ratios the issue targets."""
    col = lambda key, fmt="{:,.0f}": [spread(figs.get((key, n), []), fmt) for n in names]
    lines = ["| metric | " + " | ".join(names) + " |", "|---|" + "---|" * len(names),
             "| server stack | " + " | ".join(stacks.get(n, "n/a") for n in names) + " |"]
    for kind, label in WS_LABELS.items():
        lines.append(f"| WS {label}: server CPU per call (µs) | " + " | ".join(col(f"ws.{kind}.cpu")) + " |")
        lines.append(f"| WS {label}: calls/s, 1 session | " + " | ".join(col(f"ws.{kind}.rate")) + " |")
    lines.append("| WS other processes' CPU during the tool phases (% of a core) | " + " | ".join(col("ws.tool.other_cpu_pct")) + " |")
    lines.append("| POST /mcp tools/call: req/s, 1 keep-alive client | " + " | ".join(col("http.rate")) + " |")
    lines.append("| POST /mcp tools/call: server CPU per request (µs) | " + " | ".join(col("http.cpu")) + " |")
    out = ["\n".join(lines), "", "| target | measured (median [min–max] over repeats) | |", "|---|---|---|"]
    for kind in ("tool", "mcp"):
        r = paired(figs, (f"ws.{kind}.cpu", "ours"), ("ws.classic.cpu", "ours"))
        out.append(f"| ours: WS {WS_LABELS[kind]} CPU / classic step CPU ≤ {TOOL_CPU_TARGET}x | {spread(r, '{:.2f}x')} | {verdict(r, '<=', TOOL_CPU_TARGET)} |")
    r = paired(figs, ("http.rate", "ours"), ("http.rate", "upstream"))
    out.append(f"| POST /mcp tools/call req/s, ours / upstream ≥ {HTTP_RATE_TARGET:g}x | {spread(r, '{:.2f}x')} | {verdict(r, '>=', HTTP_RATE_TARGET)} |")
    r = paired(figs, ("http.cpu", "upstream"), ("http.cpu", "ours"))
    out.append(f"| POST /mcp server CPU per request, upstream / ours (context) | {spread(r, '{:.2f}x')} | |")
    return "\n".join(out)


def main(argv=None) -> None:
    """Run the benchmark and print the tables."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short phases (smoke run)")
    ap.add_argument("--repeat", type=int, default=3, help="repeat every phase N times (median and min-max)")
    ap.add_argument("--duration", type=float, default=None, help="seconds per timed phase (default 3, quick 0.5)")
    ap.add_argument("--slices", type=int, default=10, help="turns each WS kind takes in a phase (they alternate)")
    ap.add_argument("--only", default="ours,upstream", help="comma-separated subset of ours,upstream")
    ap.add_argument("--load", help=argparse.SUPPRESS)  # internal: run as a load process
    a = ap.parse_args(argv)
    if a.load:
        return load_main(a.load)
    signal.signal(signal.SIGTERM, _on_sigterm)
    atexit.register(stop_all)
    raise_nofile()
    names = [n for n in ("ours", "upstream") if n in a.only.split(",")]
    duration, warmup = a.duration or (0.5 if a.quick else 3.0), 50 if a.quick else 300
    print(f"# bench_mcp: {', '.join(names)}; {os.cpu_count()} cores; {duration:g}s per kind and phase, WS kinds alternating in "
          f"{a.slices} slices; {a.repeat} repeat(s)", flush=True)
    noise = [noise_line("before")]
    figs, notes, stacks = measure(names, a.repeat, duration, warmup, a.slices)
    noise.append(noise_line("after"))
    print()
    print(render(figs, names, stacks))
    print()
    print("\n".join(noise))
    if notes:
        print("\nnotes:\n" + "\n".join(f"- {n}" for n in notes))


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        stop_all()
        sys.exit(130)
