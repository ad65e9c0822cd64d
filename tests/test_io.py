"""The byte cursors: whatever the sizes of the buffers the bytes arrive in, every read gives what was written.

``StreamInput`` (Data.db chunk by chunk) must read exactly what ``DataInput`` reads from the same bytes in one
buffer, for every read method, wherever the buffer boundaries fall.
"""

from __future__ import annotations

from typing import Callable, Iterable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cassandra_cdc.storage.binary_io import DataInput, DataOutput
from cassandra_cdc.sstable.stream import StreamInput

# (method name, strategy of values it reads back)
FIELDS: dict[str, st.SearchStrategy] = {
    "byte": st.integers(0, 0xFF),
    "uint16": st.integers(0, 0xFFFF),
    "int32": st.integers(-(1 << 31), (1 << 31) - 1),
    "int64": st.integers(-(1 << 63), (1 << 63) - 1),
    "uvint": st.one_of(st.integers(0, 0x7F), st.integers(0, (1 << 64) - 1)),
    "bytes_vint": st.binary(max_size=40),
    "raw": st.binary(max_size=20),
}

fields = st.lists(st.one_of([st.tuples(st.just(name), values) for name, values in FIELDS.items()]),
                  min_size=1, max_size=30)


def encode(items: list[tuple[str, object]]) -> bytes:
    out = DataOutput()
    for name, value in items:
        if name == "raw":
            out += value  # type: ignore[operator]
        else:
            getattr(out, name)(value)
    return bytes(out)


def read_all(inp: DataInput, items: list[tuple[str, object]], position: Callable[[], int]) -> list[tuple]:
    """Each field read back, with the position after it."""
    read = []
    for name, value in items:
        field = inp.raw(len(value)) if name == "raw" else getattr(inp, name)()  # type: ignore[arg-type]
        read.append((field, position()))
    return read


def split(data: bytes, cuts: Iterable[int]) -> list[bytes]:
    bounds = [0, *sorted(set(cuts)), len(data)]
    return [data[start:stop] for start, stop in zip(bounds, bounds[1:])]


def check_streamed(items: list[tuple[str, object]], data: bytes, chunks: list[bytes]) -> None:
    whole = DataInput(data)
    expected = read_all(whole, items, lambda: whole.pos)
    assert [field for field, _ in expected] == [value for _, value in items]
    stream = StreamInput(chunks)
    assert read_all(stream, items, lambda: stream.position) == expected, [len(c) for c in chunks]
    assert stream.at_end()


SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(items=fields)
def test_every_field_reads_the_same_through_buffers_of_every_size(items: list[tuple[str, object]]) -> None:
    data = encode(items)
    for size in range(1, len(data) + 2):
        check_streamed(items, data, [data[i:i + size] for i in range(0, len(data), size)])


@SETTINGS
@given(items=fields, data=st.data())
def test_every_field_reads_the_same_through_buffers_of_uneven_sizes(items: list[tuple[str, object]],
                                                                    data: st.DataObject) -> None:
    encoded = encode(items)
    cuts = data.draw(st.lists(st.integers(0, len(encoded)), max_size=len(encoded)))
    check_streamed(items, encoded, split(encoded, cuts))
