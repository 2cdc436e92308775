"""A stand-in for the Hugging Face Hub: the endpoints `huggingface_hub` calls to push a Space, recording each call.

Served by the tests as `hub_standin:app` with HF_ENDPOINT pointing at it. It accepts one token, `hf_standin_token`,
for the user `alice`; it records every request in `CALLS` (GET /_calls returns them, with the files committed and the
Space secrets set).
Files are committed inline (`uploadMode: regular`), which is what the Hub answers for small text files, so the real
client code runs from whoami to the commit without needing LFS or Xet storage.
"""
import base64
import hashlib
import json

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

TOKEN, USER = "hf_standin_token", "alice"
app = FastAPI()
CALLS: list[dict] = []
REPOS: dict[str, dict] = {}   # repo id -> {"private": bool, "sdk": str, "files": {path: text}, "secrets": {key: value}}


def _authorized(request: Request) -> bool:
    return request.headers.get("authorization") == f"Bearer {TOKEN}"


def _denied():
    return JSONResponse({"error": "Invalid credentials in Authorization header"}, status_code=401)


@app.middleware("http")
async def record(request: Request, call_next):
    if request.url.path not in ("/_calls", "/health"):
        CALLS.append({"method": request.method, "path": request.url.path, "query": str(request.url.query)})
    return await call_next(request)


@app.get("/health")
def health():  # for the test fixtures, which wait on it
    return {"status": "healthy"}


@app.get("/_calls")
def calls():
    return {"calls": CALLS, "repos": REPOS}


@app.get("/api/agent-harnesses")
def agent_harnesses():  # huggingface_hub's user-agent detection: no harnesses
    return {"standardEnvVars": [], "harnesses": {}}


@app.get("/api/whoami-v2")
def whoami(request: Request):
    if not _authorized(request): return _denied()
    return {"type": "user", "name": USER, "fullname": "Alice", "orgs": [{"name": "my-org"}],
            "auth": {"type": "access_token", "accessToken": {"displayName": "standin", "role": "write"}}}


@app.post("/api/repos/create")
async def create_repo(request: Request):
    if not _authorized(request): return _denied()
    body = await request.json()
    repo_id = f"{body.get('organization') or USER}/{body['name']}"
    CALLS[-1]["body"] = body
    if repo_id in REPOS: return JSONResponse({"error": "You already created this space repo", "url": f"{request.base_url}spaces/{repo_id}"}, status_code=409)
    REPOS[repo_id] = {"type": body.get("type"), "sdk": body.get("sdk"), "private": body.get("visibility") == "private" or body.get("private"),
                      "files": {}, "secrets": {}}
    return {"url": f"{str(request.base_url).rstrip('/')}/spaces/{repo_id}", "name": repo_id, "id": repo_id}


@app.post("/api/validate-yaml")
async def validate_yaml(request: Request):
    return {"errors": [], "warnings": []}


@app.post("/api/spaces/{org}/{name}/preupload/{revision}")
async def preupload(org: str, name: str, revision: str, request: Request):
    if not _authorized(request): return _denied()
    if f"{org}/{name}" not in REPOS: return JSONResponse({"error": "Repository not found"}, status_code=404)
    body = await request.json()
    return {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None} for f in body["files"]],
            "commitOid": "0" * 40}


@app.post("/api/spaces/{org}/{name}/secrets")
async def add_secret(org: str, name: str, request: Request):  # `HfApi.add_space_secret`
    if not _authorized(request): return _denied()
    repo = REPOS.get(f"{org}/{name}")
    if repo is None: return JSONResponse({"error": "Repository not found"}, status_code=404)
    body = await request.json()
    repo["secrets"][body["key"]] = body["value"]
    CALLS[-1]["body"] = {"key": body["key"], "description": body.get("description")}  # the value stays out of the call log
    return JSONResponse(None)


@app.post("/api/spaces/{org}/{name}/commit/{revision}")
async def commit(org: str, name: str, revision: str, request: Request):
    if not _authorized(request): return _denied()
    repo = REPOS.get(f"{org}/{name}")
    if repo is None: return JSONResponse({"error": "Repository not found"}, status_code=404)
    lines = [json.loads(l) for l in (await request.body()).decode().splitlines() if l.strip()]
    for line in lines:
        if line["key"] == "header": CALLS[-1]["summary"] = line["value"].get("summary")
        if line["key"] == "file":
            v = line["value"]
            data = base64.b64decode(v["content"]) if v.get("encoding") == "base64" else v["content"].encode()
            repo["files"][v["path"]] = data.decode("utf-8", errors="replace") if not v["path"].endswith(".whl") else f"<{len(data)} bytes>"
        if line["key"] in ("lfsFile", "deletedFile", "deletedFolder", "copyFile"):
            return JSONResponse({"error": f"the stand-in does not take {line['key']}"}, status_code=400)
    oid = hashlib.sha1(json.dumps(sorted(repo["files"])).encode()).hexdigest()
    return {"success": True, "commitOid": oid, "commitUrl": f"{str(request.base_url).rstrip('/')}/spaces/{org}/{name}/commit/{oid}",
            "pullRequestUrl": None}


@app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "HEAD"])
async def unknown(path: str, request: Request):
    CALLS[-1]["unknown"] = True
    return JSONResponse({"error": f"the stand-in does not serve /{path}"}, status_code=404)


# Reading Spaces back, as `AutoEnv.from_hub` does (tests/test_registry.py): a Space's info, its file tree, its files.
# Anyone reads a public Space, and only the token holder a private one. `PUT /_spaces/ORG/NAME`, the tests' own, sets
# where the Space's app answers (`host`) and its `stage`, or makes a Space with `files` that no push made.
from fastapi.responses import Response


def _readable(repo_id: str, request: Request):
    repo = REPOS.get(repo_id)
    if repo is None or (repo["private"] and not _authorized(request)):
        return None, JSONResponse({"error": "Repository not found"}, status_code=404, headers={"X-Error-Code": "RepoNotFound"})
    return repo, None


def _sha(data) -> str:
    return hashlib.sha1(json.dumps(data, sort_keys=True).encode()).hexdigest()


@app.put("/_spaces/{org}/{name}")
async def set_space(org: str, name: str, request: Request):
    repo = REPOS.setdefault(f"{org}/{name}", {"type": "space", "sdk": "docker", "private": False, "files": {}, "secrets": {}})
    repo.update(await request.json())
    return {"ok": True}


@app.get("/api/spaces/{org}/{name}")
@app.get("/api/spaces/{org}/{name}/revision/{revision}")
def space_info(org: str, name: str, request: Request, revision: str = "main"):
    repo, denied = _readable(f"{org}/{name}", request)
    if denied: return denied
    return {"id": f"{org}/{name}", "sha": _sha(repo["files"]), "private": bool(repo["private"]), "sdk": repo["sdk"],
            "host": repo.get("host"), "runtime": {"stage": repo.get("stage", "RUNNING")},
            "siblings": [{"rfilename": p} for p in sorted(repo["files"])]}


@app.get("/api/spaces/{org}/{name}/tree/{revision}")
def tree(org: str, name: str, revision: str, request: Request):
    repo, denied = _readable(f"{org}/{name}", request)
    if denied: return denied
    return [{"type": "file", "path": p, "size": len(t.encode()), "oid": _sha(t)} for p, t in sorted(repo["files"].items())]


@app.api_route("/spaces/{org}/{name}/resolve/{revision}/{path:path}", methods=["GET", "HEAD"])
def resolve_file(org: str, name: str, revision: str, path: str, request: Request):
    repo, denied = _readable(f"{org}/{name}", request)
    if denied: return denied
    if path not in repo["files"]:
        return JSONResponse({"error": "Entry not found"}, status_code=404, headers={"X-Error-Code": "EntryNotFound"})
    text = repo["files"][path]
    return Response(text.encode(), headers={"X-Repo-Commit": _sha(repo["files"]), "ETag": f'"{_sha(text)}"'})


app.router.routes.sort(key=lambda r: getattr(r, "path", "") == "/{path:path}")  # the catch-all answers last
