"""Floor server for the benchmark: a bare `websockets` echo on /ws, no framework.

Each text/binary frame received on ``/ws`` is sent back unchanged: no JSON, no
sessions, no validation. It is the lower bound of what a Python WebSocket
server can do on this machine, so the benchmark reports ours/floor ratios.
``GET /health`` answers 200 so start-up can be timed like the other servers.

Usage: python bench/floor_server.py --port 8000 [--host 127.0.0.1] [--loop uvloop|asyncio]
"""

import argparse
import asyncio
import http

from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed

HEALTH_BODY = '{"status":"healthy","server":"floor"}'


def process_request(connection, request):
    """Answer ``GET /health`` over plain HTTP, 404 anything but ``/ws``, else upgrade."""
    if request.path == "/health":
        response = connection.respond(http.HTTPStatus.OK, HEALTH_BODY)
        response.headers["Content-Type"] = "application/json"
        return response
    if request.path != "/ws":
        return connection.respond(http.HTTPStatus.NOT_FOUND, "not found\n")
    return None


async def echo(websocket):
    """Send every frame back as it came, until the client goes away."""
    try:
        async for message in websocket:
            await websocket.send(message)
    except ConnectionClosed:  # the client closed while we were sending
        pass


async def main(host, port):
    """Serve forever on ``host:port``."""
    async with serve(echo, host, port, process_request=process_request,
                     backlog=2048) as server:
        await server.serve_forever()


def run(host, port, loop):
    """Run ``main`` on uvloop when asked for and installed, else on asyncio."""
    if loop == "uvloop":
        try:
            import uvloop
            return uvloop.run(main(host, port))
        except ImportError:
            pass
    asyncio.run(main(host, port))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    ap.add_argument("--max-sessions", type=int, default=None, help="accepted and ignored")
    a = ap.parse_args()
    try:
        run(a.host, a.port, a.loop)
    except KeyboardInterrupt:
        pass
