"""Hand-made echo servers for `openenv validate --url`: one that follows the protocol, and one per criterion that
breaks only that criterion. `app` mounts them all on one server (one process for every test): the server that
breaks CRITERION is at `/x/CRITERION`, the good one at `/x/good`."""
from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect

from openenv_nb.envs.echo import EchoAction, EchoObservation
from openenv_nb.types import State

SCHEMA = {"action": EchoAction.model_json_schema(), "observation": EchoObservation.model_json_schema(),
          "state": State.model_json_schema()}
BROKEN = ["openapi_version_available", "health_endpoint", "metadata_endpoint", "schema_endpoint", "mcp_endpoint",
          "mode_endpoint_consistency", "ws_reset", "ws_step", "ws_state", "envelope_shape"]


def make(broken: str | None = None) -> FastAPI:
    """An echo server written by hand, breaking the criterion `broken` (none when `None`)."""
    app = FastAPI(title="hand-made echo", version="1.0.0")
    if broken == "openapi_version_available":
        real = app.openapi
        app.openapi = lambda: {**real(), "info": {"title": "hand-made echo", "version": 1}}

    def envelope(message: str | None) -> dict:
        obs = {"echoed_message": message or "ready", "message_length": len(message or "")}
        if broken == "envelope_shape": return {"observation": {**obs, "done": False}, "reward": "0.5", "done": False}
        return {"observation": obs, "reward": len(message or "") * 0.1, "done": False}

    @app.get("/health")
    def health(): return {"status": "sick" if broken == "health_endpoint" else "healthy"}

    @app.get("/metadata")
    def metadata(): return {"name": "hand-made echo", "description": None if broken == "metadata_endpoint" else "Echoes messages"}

    @app.get("/schema")
    def schema(): return {k: v for k, v in SCHEMA.items() if not (broken == "schema_endpoint" and k == "state")}

    if broken != "mcp_endpoint":
        @app.post("/mcp")
        def mcp(): return {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Invalid request"}}

    @app.post("/reset")
    def reset(): return envelope(None)

    @app.post("/step")
    async def step(request: Request): return envelope((await request.json())["action"]["message"])

    if broken != "mode_endpoint_consistency":
        @app.get("/state")
        def state(): return {"episode_id": None, "step_count": 0}

    @app.websocket("/ws")
    async def ws(sock: WebSocket):
        await sock.accept()
        steps = 0
        try:
            while True:
                m = await sock.receive_json()
                if m["type"] == "close": return
                if m["type"] == "reset" and broken == "ws_reset":
                    await sock.send_json({"type": "error", "data": {"message": "cannot reset", "code": "EXECUTION_ERROR"}})
                elif m["type"] == "reset": steps = 0; await sock.send_json({"type": "observation", "data": envelope(None)})
                elif m["type"] == "step" and broken == "ws_step":
                    await sock.send_json({"type": "error", "data": {"message": "step failed", "code": "EXECUTION_ERROR"}})
                elif m["type"] == "step":
                    steps += 1
                    await sock.send_json({"type": "observation", "data": envelope(m["data"]["message"])})
                elif m["type"] == "state":
                    await sock.send_json({"type": "state", "data": {"episode_id": "e", "step_count": 0 if broken == "ws_state" else steps}})
        except WebSocketDisconnect: return

    return app


app = FastAPI()
app.get("/health")(lambda: {"status": "healthy"})  # for the test fixtures, which wait on it
for name in [None, *BROKEN]: app.mount(f"/x/{name or 'good'}", make(name))
