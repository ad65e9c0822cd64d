"""Pipelined ``MapState`` requests against Spark's own state server (a local session, RocksDB state)."""

from __future__ import annotations

import io
import json
import os
import struct
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pandas as pd
from pyspark import cloudpickle
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import BinaryType, IntegerType, StringType, StructField, StructType

from cassandra_cdc.pipeline import state_requests
from cassandra_cdc.pipeline.state_requests import MapStateRequests

KEY = StructType([StructField("k", IntegerType())])
VALUE = StructType([StructField("v", BinaryType())])
REPORT = StructType([StructField("report", StringType())])
KEYS = 3000
# Spark's Python workers cannot import a test module: the processor goes to them whole.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def value_of(key: int, generation: int) -> bytes:
    """Values of many sizes, one larger than a window of requests, so that windows hold one to hundreds."""
    size = 200_000 if key == 7 else key % 97 * 13
    return bytes([generation]) * size + key.to_bytes(4, "big")


class Probe(StatefulProcessor):
    """Batch 0 writes every key; batch 1 reads them back, removes the odd ones, writes the even ones again;
    batch 2 reads them back. Each batch reports what ``get_all`` read and what one call per key reads."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.map = handle.getMapState("values", KEY, VALUE)
        self.requests = MapStateRequests(self.map, "values")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        batch = int(pd.concat(list(rows))["batch"].max())
        keys = [(k,) for k in range(KEYS)] + [(KEYS + 1,)]  # one never written
        if batch == 0:
            self.requests.update_all(((k,), (value_of(k, 1),)) for k in range(KEYS))
        elif batch == 1:
            read = self.requests.get_all(keys)
            self.requests.remove_all([(k,) for k in range(1, KEYS, 2)])
            self.requests.update_all(((k,), (value_of(k, 2),)) for k in range(0, KEYS, 2))
        read = [None if value is None else bytes(value[0]) for value in self.requests.get_all(keys)]
        one_by_one = [None if value is None else bytes(value[0]) for value in map(self.map.getValue, keys)]
        report = {"batch": batch, "pipelined": self.requests.pipelined, "read": [None if v is None else v.hex()
                                                                                 for v in read],
                  "same_as_calls": read == one_by_one}
        yield pd.DataFrame({"report": [json.dumps(report)]})


def run_batch(spark: Any, tmp_path: Path, batch: int) -> dict[str, Any]:
    source = tmp_path / "input"
    source.mkdir(exist_ok=True)
    (source / f"{batch}.json").write_text(json.dumps({"g": 0, "batch": batch}) + "\n")
    reports: list[dict[str, Any]] = []
    rows = spark.readStream.schema("g INT, batch INT").json(str(source))
    query = (rows.groupBy("g").transformWithStateInPandas(Probe(), REPORT, "Update", "None")
             .writeStream.foreachBatch(lambda frame, _: reports.extend(
                 json.loads(row.report) for row in frame.collect()))
             .trigger(availableNow=True).option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    query.awaitTermination(300)
    assert len(reports) == 1, reports
    return reports[0]


def test_requests_written_ahead_read_and_write_what_one_call_at_a_time_does(spark: Any, tmp_path: Path) -> None:
    expected = {1: [value_of(k, 1).hex() for k in range(KEYS)] + [None],
                2: [value_of(k, 2).hex() if k % 2 == 0 else None for k in range(KEYS)] + [None]}
    for batch, generation in ((0, 1), (1, 2), (2, 2)):
        report = run_batch(spark, tmp_path, batch)
        assert report["pipelined"] is True  # the installed PySpark's protocol, not the fallback
        assert report["same_as_calls"] is True
        assert report["read"] == expected[generation], f"batch {batch}"


def test_a_state_that_is_not_pysparks_is_called_one_key_at_a_time(monkeypatch: Any) -> None:
    class Values:
        def __init__(self) -> None:
            self.values: dict[tuple[Any, ...], tuple[Any, ...]] = {}

        def getValue(self, key: tuple[Any, ...]) -> tuple[Any, ...] | None:
            return self.values.get(key)

        def updateValue(self, key: tuple[Any, ...], value: tuple[Any, ...]) -> None:
            self.values[key] = value

        def removeKey(self, key: tuple[Any, ...]) -> None:
            del self.values[key]

    requests = MapStateRequests(Values(), "values")
    assert not requests.pipelined
    requests.update_all([((1,), (b"a",)), ((2,), (b"b",))])
    requests.remove_all([(1,)])
    assert requests.get_all([(1,), (2,)]) == [None, (b"b",)]


def test_another_pyspark_versions_state_client_is_called_one_key_at_a_time(monkeypatch: Any) -> None:
    client = SimpleNamespace(sockfile=None, _receive_proto_message=None, pickleSer=None)
    assert state_requests._speaks_protocol(client)
    monkeypatch.setattr(state_requests, "PROTOCOL_VERSIONS", ("3.5.",))
    assert not state_requests._speaks_protocol(client)


def test_requests_are_the_messages_pysparks_own_client_builds() -> None:
    """Each request is the message PySpark's own state client builds for the call, whatever came before."""
    from pyspark.serializers import PickleSerializer
    from pyspark.sql.streaming.proto import StateMessage_pb2 as proto

    written = io.BytesIO()
    requests = requests_written_to(written)
    assert requests.pipelined
    requests.update_all([((1,), (b"a" * 100,)), ((2,), (b"",))])
    requests.remove_all([(1,)])
    requests.get_all([(2,), (300,)])

    def pysparks(**operation: Any) -> bytes:
        call = proto.StateVariableRequest(mapStateCall=proto.MapStateCall(stateName="values", **operation))
        return proto.StateRequest(stateVariableRequest=call).SerializeToString()

    dumps = PickleSerializer().dumps
    expected = [pysparks(updateValue=proto.UpdateValue(userKey=dumps((1,)), value=dumps((b"a" * 100,)))),
                pysparks(updateValue=proto.UpdateValue(userKey=dumps((2,)), value=dumps((b"",)))),
                pysparks(removeKey=proto.RemoveKey(userKey=dumps((1,)))),
                pysparks(getValue=proto.GetValue(userKey=dumps((2,)))),
                pysparks(getValue=proto.GetValue(userKey=dumps((300,))))]
    frames, data = [], written.getvalue()
    while data:
        version, length = struct.unpack(">ii", data[:8])
        assert version == 0
        frames.append(data[8:8 + length])
        data = data[8 + length:]
    assert frames == expected


def test_what_the_requests_carried_is_not_kept() -> None:
    """The requests keep nothing of what they carried (here 160 MB): a protobuf message keeps every value set
    on it until it is freed, so that one message reused for every request would hold them all."""
    class Discarded:
        def write(self, data: bytes) -> None:
            pass

        def flush(self) -> None:
            pass

    requests = requests_written_to(Discarded())
    before = resident_bytes()
    for generation in range(20):
        requests.update_all(((k,), (bytes([generation]) * 2000 + k.to_bytes(4, "big"),)) for k in range(4000))
    assert resident_bytes() - before < 40 << 20


def requests_written_to(sockfile: Any) -> MapStateRequests:
    """Requests of a state ``values`` whose client (PySpark's, as far as they use it) writes to ``sockfile``
    and reads an empty answer for each."""
    from pyspark.serializers import PickleSerializer

    api = SimpleNamespace(sockfile=sockfile, _receive_proto_message=lambda: (0, "", b""),
                          pickleSer=PickleSerializer())
    client = SimpleNamespace(_stateful_processor_api_client=api)
    return MapStateRequests(SimpleNamespace(_mapStateClient=client), "values")


def resident_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
