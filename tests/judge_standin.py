"""A stand-in for an OpenAI-compatible chat endpoint: `POST /v1/chat/completions`, as a judge model serves it.

What it answers depends on the last message of the request:
- `[reply TEXT]` somewhere in it: the assistant's reply is TEXT (otherwise it is "Score: 0.5");
- `[error]`: a 503 with an OpenAI-style error body;
- `[garbage]`: a 200 whose body is not a chat completion;
- `[hang]`: no reply until `RELEASE` is set (the tests set it when they are done), to provoke timeouts.
Every request is kept in `CALLS` (its body and its Authorization header) for the tests to inspect.
"""
import asyncio
import re
import threading

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

app = FastAPI()
CALLS: list[dict] = []
RELEASE = threading.Event()
HANG_LIMIT_S = 60  # a hung request gives up on its own after this, so a server never outlives a failed test for long


def completion(text: str, model: str) -> dict:
    "A chat-completion response whose only choice says `text`."
    return {"id": "chatcmpl-standin", "object": "chat.completion", "model": model,
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


@app.post("/v1/chat/completions")
async def chat(request: Request):
    body = await request.json()
    CALLS.append({"body": body, "authorization": request.headers.get("authorization")})
    prompt = body["messages"][-1]["content"]
    if "[error]" in prompt:
        return JSONResponse({"error": {"message": "overloaded", "type": "server_error"}}, status_code=503)
    if "[garbage]" in prompt: return {"unexpected": True}
    if "[hang]" in prompt: await asyncio.to_thread(RELEASE.wait, HANG_LIMIT_S)
    m = re.search(r"\[reply (.*?)\]", prompt, re.S)
    return completion(m.group(1) if m else "Score: 0.5", body.get("model", ""))
