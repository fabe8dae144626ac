"""Worker used by bench_pool.py."""

import wirepool


@wirepool.method(codecs=["json", "msgpack", "raw"])
def echo(req):
    return req


@wirepool.method(name="echo_inline", codecs=["json", "msgpack", "raw"], inline=True)
def echo_inline(req):
    return req


@wirepool.stream(codecs=["json", "msgpack"])
def rows(req, ctx: wirepool.Context):
    for i in range(req["n"]):
        yield {"i": i, "name": f"decl_{i}", "kind": "theorem"}


if __name__ == "__main__":
    wirepool.serve()
