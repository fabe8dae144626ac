"""The same `add` function as worker.py, as a plain ASGI app for gunicorn + uvicorn workers."""

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
    out = json.dumps(add(json.loads(body))).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(out)).encode())]})
    await send({"type": "http.response.body", "body": out})
