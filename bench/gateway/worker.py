"""The same `add` function as app.py, as a wirepool worker behind wirepool-gateway, and the
stream of small rows the bench sends through the gateway (the same rows as the Rust worker,
rust/wirepool/examples/readme_worker.rs, and the top README's taste)."""

import wirepool


@wirepool.method
def add(req: dict) -> dict:
    return {"sum": req["a"] + req["b"]}


@wirepool.stream
def decls(req: dict, ctx: wirepool.Context):
    for i in range(req["n"]):
        if ctx.cancelled:
            break
        yield {"i": i, "name": f"decl_{i}", "kind": "theorem"}


if __name__ == "__main__":
    wirepool.serve()
