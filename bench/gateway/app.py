"""The same `add` function as worker.py, as a plain ASGI app for gunicorn + uvicorn workers, and
the same stream of small rows as NDJSON (POST /stream/decls), one body message per row, as
Starlette's StreamingResponse sends a generator's items."""

import json


def add(req: dict) -> dict:
    return {"sum": req["a"] + req["b"]}


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    req = json.loads(body)
    if scope["path"] == "/stream/decls":
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/x-ndjson")]})
        for i in range(req["n"]):
            row = {"i": i, "name": f"decl_{i}", "kind": "theorem"}
            await send({"type": "http.response.body",
                        "body": json.dumps(row, separators=(",", ":")).encode() + b"\n",
                        "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    out = json.dumps(add(req)).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(out)).encode())]})
    await send({"type": "http.response.body", "body": out})
