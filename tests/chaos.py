"""A chaos proxy for the tests: a TCP proxy on 127.0.0.1 that cuts connections at seeded random points.

A cut may fall anywhere, including between a request and its reply: a chunk read from one side is either dropped
with the connection (a request the server never gets, a reply the client never reads) or forwarded first. The
server behind it can be swapped (`target`), as when a server is killed and another takes its place."""
import asyncio
import random


class Chaos:
    def __init__(self, target: int, # the port of the server behind the proxy
                 p: float = 0.0, # chance that a chunk cuts its connection
                 seed: int = 0):
        self.target, self.p, self.rng = target, p, random.Random(seed)
        self.cuts, self.live, self.server = 0, set(), None

    async def __aenter__(self):
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    async def __aexit__(self, *exc):
        self.server.close()
        self.cut_all()
        await self.server.wait_closed()

    def cut_all(self):
        "Cut every open connection at once (a network blip)."
        for w in list(self.live): w.transport.abort()
        self.live.clear()

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter):
        try: ur, uw = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError: w.transport.abort(); return
        pair = (w, uw)
        self.live.update(pair)
        await asyncio.gather(self._pipe(r, uw, pair), self._pipe(ur, w, pair), return_exceptions=True)
        for x in pair: x.transport.abort(); self.live.discard(x)

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter, pair):
        while data := await r.read(65536):
            cut = self.rng.random() < self.p
            if cut and self.rng.random() < 0.5: w.write(data)  # forwarded, then cut
            if cut:
                self.cuts += 1
                for x in pair: x.transport.abort()
                return
            w.write(data)
            await w.drain()
        w.close()
