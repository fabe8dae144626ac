"""The same `add` function as app.py, as a wirepool worker behind wirepool-gateway."""

import wirepool


@wirepool.method
def add(req: dict) -> dict:
    return {"sum": req["a"] + req["b"]}


if __name__ == "__main__":
    wirepool.serve()
