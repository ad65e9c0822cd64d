"""Many ``MapState`` reads or writes for one price: requests written ahead of their answers.

Each call of PySpark's ``MapState`` is a blocking round trip to the task's state server in the JVM: the
Python worker writes a request, waits, reads the answer. Most of a call's cost is that wait (the two
processes taking turns), not the work on either side (benchmarks/RESULTS.md, "Pipelined state calls").
The state server answers the requests of its socket one after the other, in order, so a worker that
writes many requests before reading their answers pays the wait once for all of them.

``MapStateRequests`` does that with the state client of the PySpark version it was tested with, and falls
back to one call at a time for any other (or for a ``MapState`` that is not PySpark's). What it writes
ahead is bounded so that neither side can wait on the other for ever: a window's requests fit in the
socket's buffers whatever the answers' sizes (the server may block writing an answer only once it has read
every request of the window), and the window's answers to writes are a few bytes each.

Keys and values are pickled tuples both ways, without PySpark's conversion to and from ``Row``: the state
server pickles every value it answers as a call that parses the state's schema from JSON and builds a row
converter for it, per answer. The states given here must have keys and values that need no conversion
(numbers, strings, bytes).
"""

from __future__ import annotations

import io
import logging
import pickle
import struct
from typing import Any, Iterable, Sequence

import pyspark
from pyspark.sql.streaming.proto import StateMessage_pb2 as proto

log = logging.getLogger(__name__)

# The PySpark versions whose state client's protocol this module speaks (message version 0, a length and
# a ``StateRequest``, answered by a length and a ``StateResponse``).
PROTOCOL_VERSIONS = ("4.3.",)
# Bytes of requests written ahead of reading their answers: under the smallest socket buffers a loopback
# connection starts with (a 16 KiB send buffer, a 128 KiB receive buffer).
WINDOW_BYTES = 32 << 10
WINDOW_REQUESTS = 512
_HEADER = struct.Struct(">ii")  # message version, length


class StateRequestError(RuntimeError):
    """The state server refused a request."""


class MapStateRequests:
    """``getValue``, ``updateValue`` and ``removeKey`` of a ``MapState`` for many keys at once."""

    def __init__(self, state: Any, name: str) -> None:
        self._state = state
        self._name = name
        client = getattr(state, "_mapStateClient", None)
        api = getattr(client, "_stateful_processor_api_client", None)
        self._client = client if _speaks_protocol(api) else None
        if self._client is not None:
            self._dumps = api.pickleSer.dumps  # as PySpark pickles a row's values for the state server

    @property
    def pipelined(self) -> bool:
        """Whether requests are written ahead of their answers (else: one call at a time)."""
        return self._client is not None

    def get_all(self, keys: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...] | None]:
        """The values of ``keys``, in their order (None: no value)."""
        if self._client is None:
            return [self._state.getValue(key) for key in keys]
        answers = self._exchange(self._request(getValue=proto.GetValue(userKey=self._dumps(key)))
                                 for key in keys)
        return [_AnswerUnpickler(io.BytesIO(value)).load() if value else None for value in answers]

    def update_all(self, items: Iterable[tuple[tuple[Any, ...], tuple[Any, ...]]]) -> None:
        """Set the value of each ``(key, value)``."""
        if self._client is None:
            for key, value in items:
                self._state.updateValue(key, value)
            return
        self._exchange(self._request(updateValue=proto.UpdateValue(userKey=self._dumps(key),
                                                                   value=self._dumps(value)))
                       for key, value in items)

    def remove_all(self, keys: Iterable[tuple[Any, ...]]) -> None:
        """Remove the values of ``keys``."""
        if self._client is None:
            for key in keys:
                self._state.removeKey(key)
            return
        self._exchange(self._request(removeKey=proto.RemoveKey(userKey=self._dumps(key))) for key in keys)

    def _request(self, **call: Any) -> bytes:
        """A ``StateRequest`` of one ``MapStateCall`` of this state (``call``: its one operation)."""
        return proto.StateRequest(stateVariableRequest=proto.StateVariableRequest(
            mapStateCall=proto.MapStateCall(stateName=self._name, **call))).SerializeToString()

    def _exchange(self, requests: Iterable[bytes]) -> list[bytes]:
        """Send ``requests`` in windows, each written whole before its answers are read; their answers'
        values, in order. Every answer of a window is read before a refusal is raised, so that the
        connection stays in step."""
        api = self._client._stateful_processor_api_client  # type: ignore[union-attr]
        values: list[bytes] = []
        window: list[bytes] = []
        window_bytes = 0
        for request in requests:
            window.append(request)
            window_bytes += len(request)
            if window_bytes >= WINDOW_BYTES or len(window) >= WINDOW_REQUESTS:
                values.extend(self._send_window(api, window))
                window, window_bytes = [], 0
        if window:
            values.extend(self._send_window(api, window))
        return values

    def _send_window(self, api: Any, window: list[bytes]) -> list[bytes]:
        out = api.sockfile
        for request in window:
            out.write(_HEADER.pack(0, len(request)))
            out.write(request)
        out.flush()
        answers = [api._receive_proto_message() for _ in window]
        refused = [error for status, error, _ in answers if status != 0]
        if refused:
            raise StateRequestError(f"the state server refused {len(refused)} of {len(window)} requests to "
                                    f"{self._name}: {refused[0]}")
        return [value for _, _, value in answers]


class _AnswerUnpickler(pickle.Unpickler):
    """Reads a value the state server pickled as a ``Row`` as the tuple of its values."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "pyspark.sql.types":
            if name == "_parse_datatype_json_string":
                return _ignored_schema
            if name == "_create_row_inbound_converter":
                return _values_converter
        return super().find_class(module, name)


def _ignored_schema(_json: str) -> None:
    return None


def _values(*values: Any) -> tuple[Any, ...]:
    return values


def _values_converter(_schema: None) -> Any:
    return _values


def _speaks_protocol(api: Any) -> bool:
    if not pyspark.__version__.startswith(PROTOCOL_VERSIONS):
        return False
    return all(hasattr(api, name) for name in ("sockfile", "_receive_proto_message", "pickleSer"))


__all__ = ["MapStateRequests", "PROTOCOL_VERSIONS", "StateRequestError"]
