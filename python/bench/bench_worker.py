"""Worker used by bench_pool.py."""

import wirepool


@wirepool.method(codecs=["json", "msgpack", "raw"])
def echo(req):
    return req


@wirepool.method(name="echo_inline", codecs=["json", "msgpack", "raw"], inline=True)
def echo_inline(req):
    return req


@wirepool.method(codecs=["raw"])
async def echo_async(data):
    return data


@wirepool.stream(codecs=["json", "msgpack"])
def rows(req, ctx: wirepool.Context):
    for i in range(req["n"]):
        yield {"i": i, "name": f"decl_{i}", "kind": "theorem"}


ROW = b"0123456789abcdefghij"


@wirepool.stream(codecs=["raw"])
def rows_raw(req):
    for _ in range(int(bytes(req))):
        yield ROW


if __name__ == "__main__":
    wirepool.serve()
