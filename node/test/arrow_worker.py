"""A Python worker for node/test/arrow.test.ts: Arrow tables across languages (needs pyarrow)."""

import pyarrow as pa

import wirepool


@wirepool.method(codecs=["arrow"])
def describe(table: pa.Table) -> pa.Table:
    """The table it got, described as a table: each column's name, Arrow type, null count and values."""
    return pa.table({
        "name": table.column_names,
        "type": [str(f.type) for f in table.schema],
        "nulls": pa.array([c.null_count for c in table.columns], pa.int64()),
        "values": [repr(c.to_pylist()) for c in table.columns],
    })


@wirepool.method(codecs=["arrow"])
def make(_req: pa.Table) -> pa.Table:
    """A table of int64, float64 and string columns, with nulls, made by pyarrow."""
    return pa.table({
        "i": pa.array([1, None, -(2**63)], pa.int64()),
        "f": pa.array([0.5, float("-inf"), None], pa.float64()),
        "s": pa.array(["a", None, "é"], pa.string()),
    })


if __name__ == "__main__":
    wirepool.serve()
