"""Files written by a real Cassandra node for the fidelity tests: how ``tests/data/cassandra-5.0`` is made,
and how the tests make them again on a live node of each version (5.0, 4.1, 4.0).

One real node (``localcluster``) runs three times, each time with other ``cassandra.yaml`` settings
(:func:`phases`): on 5.0, SSTable format ``big`` with a plain commit log, ``bti`` with an LZ4-compressed one,
then an encrypted commit log; on 4.x (``big`` SSTables only) a plain, an LZ4-compressed and an encrypted
commit log. Each run writes :func:`workload` into a keyspace of its own, keeps a copy of the commit log
segments once the periodic sync has written them, flushes, keeps the SSTables, and has Cassandra's own
``sstabledump`` (``SSTableExport`` of the node's version) print each of them. Then the node is stopped, the
SSTables of those keyspaces are removed, every kept segment is put back into its commit log directory, and
the node started again replays them: ``SELECT JSON *`` of each table is what Cassandra reads back.

``python tests/fidelity_files.py`` regenerates the 5.0 directory (needs ``make install``'s JVM artifacts).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import gzip
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from cassandra_cdc.demo.cql_workload import has_vectors
from cassandra_cdc.localcluster import CassandraCluster, artifacts, sstable_format
# The JVM options nodetool runs with are the ones sstabledump needs (Java 17 module access, small JVM).
from cassandra_cdc.localcluster.cassandra import JAVA17_ACCESS, SMALL_JVM

FIXTURES = Path(__file__).resolve().parent / "data" / "cassandra-5.0"
KEYSTORE_PASSWORD = "cassandra"
KEY_ALIAS = "fidelity:1"
# The largest TTL CQL accepts (20 years): nothing written expires while the fixtures are in use. 4.x keeps
# expiry times as 32-bit seconds and refuses one past 2038: there, 10 years.
LONG_TTL = {"5.0": 630_720_000, "4.1": 315_360_000, "4.0": 315_360_000}
BASE_TIMESTAMP = 1_750_000_000_000_000

# Table compression of each copy of the ``everything`` table.
COMPRESSIONS = {
    "none": "{'enabled': 'false'}",
    "lz4": "{'class': 'LZ4Compressor', 'chunk_length_in_kb': 4}",
    "snappy": "{'class': 'SnappyCompressor', 'chunk_length_in_kb': 4}",
    "deflate": "{'class': 'DeflateCompressor', 'chunk_length_in_kb': 4}",
    "zstd": "{'class': 'ZstdCompressor', 'chunk_length_in_kb': 4}",
}


def encryption_settings(keystore: Path) -> dict[str, Any]:
    return {"transparent_data_encryption_options": {
        "enabled": True, "chunk_length_kb": 64, "cipher": "AES/CBC/PKCS5Padding", "key_alias": KEY_ALIAS,
        "key_provider": [{"class_name": "org.apache.cassandra.security.JKSKeyProvider",
                          "parameters": [{"keystore": str(keystore), "keystore_password": KEYSTORE_PASSWORD,
                                          "store_type": "JCEKS", "key_password": KEYSTORE_PASSWORD}]}]}}


# Every run: index blocks every KiB of a partition, so a partition of a few KiB is already "wide"; the
# request timeouts of a machine busy with other work.
COMMON_SETTINGS = {"column_index_size": "1KiB", "cdc_enabled": False, "read_request_timeout": "60000ms",
                   "write_request_timeout": "60000ms", "range_request_timeout": "60000ms",
                   "request_timeout": "60000ms"}
CLIENT_TIMEOUT = 120.0


@dataclasses.dataclass(frozen=True)
class Phase:
    """One run of the node: its keyspace, the SSTable format it writes and keeps (``None``: its SSTables are
    not kept), the compressions of its ``everything`` tables, its commit log's settings."""

    keyspace: str
    sstables: str | None
    compressions: tuple[str, ...]
    commitlog_settings: Callable[[Path], dict[str, Any]]


def _plain_commitlog(_: Path) -> dict[str, Any]:
    return {}


def _lz4_commitlog(_: Path) -> dict[str, Any]:
    return {"commitlog_compression": [{"class_name": "LZ4Compressor"}]}


def phases(version: str) -> dict[str, Phase]:
    """The runs of a node of ``version``, by the name of the directory each one's files go to."""
    if version == "5.0":
        return {"big": Phase("fid_big", "big", tuple(COMPRESSIONS), _plain_commitlog),
                "bti": Phase("fid_bti", "bti", tuple(COMPRESSIONS), _lz4_commitlog),
                "encrypted": Phase("fid_enc", None, ("lz4",), encryption_settings)}
    return {"big": Phase("fid_big", "big", tuple(COMPRESSIONS), _plain_commitlog),
            "compressed": Phase("fid_lz4", None, ("lz4",), _lz4_commitlog),
            "encrypted": Phase("fid_enc", None, ("lz4",), encryption_settings)}


def phase_directories(root: Path) -> list[Path]:
    """The directories of the runs whose files are under ``root``."""
    return sorted(directory for directory in root.iterdir() if (directory / "schema.cql").is_file())


def schema_statements(keyspace: str, compressions: tuple[str, ...], version: str) -> list[str]:
    vectors = "v_vector vector<float, 3>, v_vector_text vector<text, 2>," if has_vectors(version) else ""
    tables = [f"""CREATE TABLE {keyspace}.everything_{name} (
    pk int, ck text,
    s_text text static, s_set set<int> static,
    v_ascii ascii, v_bigint bigint, v_blob blob, v_boolean boolean, v_date date, v_decimal decimal,
    v_double double, v_duration duration, v_float float, v_inet inet, v_int int, v_smallint smallint,
    v_text text, v_time time, v_timestamp timestamp, v_timeuuid timeuuid, v_tinyint tinyint, v_uuid uuid,
    v_varchar varchar, v_varint varint, {vectors}
    v_list list<text>, v_set set<int>, v_map map<text, int>,
    v_frozen_list frozen<list<int>>, v_nested map<text, frozen<list<int>>>,
    v_deep frozen<map<int, frozen<set<text>>>>, v_list_of_points list<frozen<point>>,
    v_tuple tuple<int, text, double>, v_nested_tuple frozen<tuple<int, tuple<text, blob>>>,
    v_frozen_udt frozen<address>, v_udt address,
    PRIMARY KEY (pk, ck)
) WITH compression = {COMPRESSIONS[name]}""" for name in compressions]
    return [
        f"CREATE KEYSPACE {keyspace} WITH replication = "
        "{'class': 'SimpleStrategy', 'replication_factor': 1}",
        f"CREATE TYPE {keyspace}.point (x double, y double)",
        f"CREATE TYPE {keyspace}.address (street text, zip int, codes frozen<list<int>>, at frozen<point>)",
        *tables,
        f"CREATE TABLE {keyspace}.counters (pk int, ck int, n counter, m counter, PRIMARY KEY (pk, ck))",
    ]


ALL_VALUES = {
    "v_ascii": "'plain ascii'", "v_bigint": "9223372036854775807", "v_blob": "0xcafe00ff",
    "v_boolean": "true", "v_date": "'2024-02-29'", "v_decimal": "12345.6789", "v_double": "3.141592653589793",
    "v_duration": "1y2mo3w4d5h6m7s8ms9us10ns", "v_float": "7.62", "v_inet": "'192.168.1.20'",
    "v_int": "42", "v_smallint": "32767", "v_text": "'text é✓ 日本'", "v_time": "'13:14:15.123456789'",
    "v_timestamp": "'2024-05-01 12:34:56.789Z'", "v_timeuuid": "50554d6e-29bb-11e5-b345-feff819cdc9f",
    "v_tinyint": "127", "v_uuid": "3f2504e0-4f89-11d3-9a0c-0305e82c3301", "v_varchar": "'varchar'",
    "v_varint": "123456789012345678901234567890", "v_vector": "[1.5, -2.25, 0.1]",
    "v_vector_text": "['first', 'second']", "v_list": "['one', 'two', 'three']", "v_set": "{3, 1, 2}",
    "v_map": "{'k1': 1, 'k2': 2}", "v_frozen_list": "[1, 2, 3]", "v_nested": "{'a': [1, 2], 'b': []}",
    "v_deep": "{1: {'x', 'y'}, 2: {}}", "v_list_of_points": "[{x: 1, y: 2}, {x: -0.5, y: 1e300}]",
    "v_tuple": "(1, 'one', 1.0)", "v_nested_tuple": "(2, ('two', 0x02))",
    "v_frozen_udt": "{street: 'Main St', zip: 12345, codes: [1, 2], at: {x: 0.5, y: 0.25}}",
    "v_udt": "{street: 'Side St', zip: 54321, codes: [], at: null}",
    "s_text": "'static text'", "s_set": "{10, 20}",
}

EXTREME_VALUES = {
    "v_ascii": "'it''s \"quoted\" \\\\ ~'", "v_bigint": "-9223372036854775808", "v_blob": "0x00",
    "v_boolean": "false", "v_date": "'1900-01-01'", "v_decimal": "-0.000000000000000001234",
    "v_double": "-Infinity", "v_duration": "-2mo3d4h", "v_float": "NaN", "v_inet": "'2001:db8::ff00:42:8329'",
    "v_int": "-2147483648", "v_smallint": "-32768", "v_text": "'line\nbreak \"q\" \\\\ \t tab 🎉'",
    "v_time": "'00:00:00'", "v_timestamp": "'1969-12-31 23:59:59.999Z'",
    "v_timeuuid": "maxTimeuuid('2013-01-01 00:05+0000')", "v_tinyint": "-128",
    "v_uuid": "00000000-0000-0000-0000-000000000000", "v_varchar": "''",
    "v_varint": "-98765432109876543210987654321098765432109876543210", "v_vector": "[-0.0, 3.4e38, 1e-45]",
    "v_vector_text": "['', 'é']", "v_list": "['x']", "v_set": "{-1}", "v_map": "{'': 0}",
    "v_frozen_list": "[]", "v_nested": "{'z': [-1]}", "v_deep": "{-5: {''}}",
    "v_list_of_points": "[{x: NaN, y: Infinity}]", "v_tuple": "(null, null, -0.0)",
    "v_nested_tuple": "(null, (null, 0x))", "v_frozen_udt": "{street: 'only street'}",
    "v_udt": "{zip: 0}",
}

# Empty values, which only blobAsX makes for most types. (Not of boolean: sstabledump fails on that one.)
EMPTY_VALUES = {
    "v_text": "''", "v_blob": "0x", "v_ascii": "''", "v_int": "blobAsInt(0x)", "v_bigint": "blobAsBigint(0x)",
    "v_varint": "blobAsVarint(0x)", "v_decimal": "blobAsDecimal(0x)", "v_uuid": "blobAsUuid(0x)",
    "v_inet": "blobAsInet(0x)", "v_double": "blobAsDouble(0x)", "v_timestamp": "blobAsTimestamp(0x)",
}


def workload(keyspace: str, compressions: tuple[str, ...], version: str) -> list[str]:
    """Every kind of write and deletion, into each ``everything`` table and the counter table."""
    statements: list[str] = []
    for name in compressions:
        table = f"{keyspace}.everything_{name}"
        # Uncompressed, a row larger than a 64 KiB read; compressed, one spanning a few 4 KiB chunks.
        statements += [s.replace("{t}", table)
                       for s in _table_workload(66_000 if name == "none" else 5_000, version)]
    counters = f"{keyspace}.counters"
    for pk in range(3):
        for ck in range(3):
            statements += [f"UPDATE {counters} SET n = n + {pk * 10 + ck + 1}, m = m - {ck} "
                           f"WHERE pk = {pk} AND ck = {ck}"]
    statements += [f"UPDATE {counters} SET n = n - 100 WHERE pk = 0 AND ck = 0",
                   f"UPDATE {counters} SET m = m + 5 WHERE pk = 1 AND ck = 1",
                   f"DELETE FROM {counters} WHERE pk = 2 AND ck = 2",
                   f"DELETE m FROM {counters} WHERE pk = 1 AND ck = 0"]
    return _with_timestamps(statements)


def _columns(values: dict[str, str], with_vectors: bool = True) -> tuple[str, str]:
    kept = {name: value for name, value in values.items() if with_vectors or not name.startswith("v_vector")}
    return ", ".join(kept), ", ".join(kept.values())


def _table_workload(big_blob_bytes: int, version: str) -> list[str]:
    names, values = _columns(ALL_VALUES, has_vectors(version))
    extreme_names, extreme_values = _columns(EXTREME_VALUES, has_vectors(version))
    long_ttl = LONG_TTL[version]
    empty_names, empty_values = _columns(EMPTY_VALUES)
    random_bytes = random.Random(big_blob_bytes).randbytes(big_blob_bytes).hex()
    statements = [
        f"INSERT INTO {{t}} (pk, ck, {names}) VALUES (1, 'a', {values})",
        f"INSERT INTO {{t}} (pk, ck, {extreme_names}) VALUES (1, 'b', {extreme_values})",
        f"INSERT INTO {{t}} (pk, ck, {empty_names}) VALUES (2, 'empty', {empty_values})",
        f"INSERT INTO {{t}} (pk, ck, v_int, v_text, v_map) VALUES (2, 'ttl', 7, 'expiring', {{'t': 1}}) "
        f"USING TTL {long_ttl}",
        f"UPDATE {{t}} USING TTL {long_ttl - 1000} SET v_bigint = 5, v_list = v_list + ['ttl'] "
        "WHERE pk = 1 AND ck = 'a'",
        # Cell deletions: by DELETE and by writing null.
        "DELETE v_int, v_udt, v_frozen_udt FROM {t} WHERE pk = 1 AND ck = 'a'",
        "INSERT INTO {t} (pk, ck, v_int, v_text, v_set) VALUES (1, 'nulls', null, 'x', null)",
        # Lists: append, prepend, set and delete by index, remove by value, overwrite.
        "UPDATE {t} SET v_list = v_list + ['appended', 'again'] WHERE pk = 1 AND ck = 'a'",
        "UPDATE {t} SET v_list = ['prepended'] + v_list WHERE pk = 1 AND ck = 'a'",
        "UPDATE {t} SET v_list[1] = 'replaced' WHERE pk = 1 AND ck = 'a'",
        "DELETE v_list[2] FROM {t} WHERE pk = 1 AND ck = 'a'",
        "UPDATE {t} SET v_list = v_list - ['again'] WHERE pk = 1 AND ck = 'a'",
        "UPDATE {t} SET v_list = ['new', 'list'] WHERE pk = 1 AND ck = 'b'",
        # Sets and maps element by element.
        "UPDATE {t} SET v_set = v_set + {7, 8} WHERE pk = 1 AND ck = 'a'",
        "UPDATE {t} SET v_set = v_set - {1} WHERE pk = 1 AND ck = 'a'",
        "UPDATE {t} SET v_map['k3'] = 3, v_map = v_map + {'k4': 4} WHERE pk = 1 AND ck = 'a'",
        "DELETE v_map['k1'] FROM {t} WHERE pk = 1 AND ck = 'a'",
        "UPDATE {t} SET v_map = v_map - {'k2'} WHERE pk = 1 AND ck = 'a'",
        "UPDATE {t} SET v_nested['c'] = [3, 3, 3] WHERE pk = 1 AND ck = 'a'",
        "DELETE v_nested['a'] FROM {t} WHERE pk = 1 AND ck = 'a'",
        "UPDATE {t} SET v_list_of_points = v_list_of_points + [{x: 3, y: 4}] WHERE pk = 1 AND ck = 'a'",
        # A non-frozen UDT field by field.
        "UPDATE {t} SET v_udt.zip = 99, v_udt.street = 'Field St' WHERE pk = 1 AND ck = 'b'",
        "DELETE v_udt.street FROM {t} WHERE pk = 1 AND ck = 'b'",
        # Static columns: alone in a partition, updated, deleted.
        "UPDATE {t} SET s_text = 'only static' WHERE pk = 4",
        "UPDATE {t} SET s_set = s_set + {30} WHERE pk = 1",
        "DELETE s_set FROM {t} WHERE pk = 1",
        "UPDATE {t} SET s_set = {40, 41} WHERE pk = 1",
        # A row with only its primary key; a row made by UPDATE alone (no row marker).
        "INSERT INTO {t} (pk, ck) VALUES (2, 'key only')",
        "UPDATE {t} SET v_int = 3 WHERE pk = 2 AND ck = 'updated'",
        # Row deletions, range deletions, a partition deletion with a later write, a partition deletion only.
        "INSERT INTO {t} (pk, ck, v_int) VALUES (1, 'deleted row', 1)",
        "DELETE FROM {t} WHERE pk = 1 AND ck = 'deleted row'",
        "DELETE FROM {t} WHERE pk = 1 AND ck = 'never written'",
        *[f"INSERT INTO {{t}} (pk, ck, v_int) VALUES (3, 'r{i}', {i})" for i in range(1, 7)],
        "DELETE FROM {t} WHERE pk = 3 AND ck > 'r1' AND ck <= 'r3'",
        "DELETE FROM {t} WHERE pk = 3 AND ck >= 'r5'",
        "DELETE FROM {t} WHERE pk = 3 AND ck < 'r0'",
        "INSERT INTO {t} (pk, ck, v_int) VALUES (3, 'r2', 22)",
        "INSERT INTO {t} (pk, ck, v_int, s_text) VALUES (5, 'gone', 1, 'gone')",
        "DELETE FROM {t} WHERE pk = 5",
        "INSERT INTO {t} (pk, ck, v_int) VALUES (5, 'after', 2)",
        "DELETE FROM {t} WHERE pk = 6",
        # A wide partition (many index blocks) and a row larger than the reader's buffers.
        *[f"INSERT INTO {{t}} (pk, ck, v_text, v_int) VALUES (100, 'w{i:03d}', 'wide {i}', {i})"
          for i in range(80)],
        f"INSERT INTO {{t}} (pk, ck, v_blob, v_text) VALUES (200, 'big', 0x{random_bytes}, '{'big ' * 300}')",
    ]
    return statements


def _with_timestamps(statements: list[str]) -> list[str]:
    """Each write its own client timestamp, increasing, so that their order is the statements' order
    whatever the clocks (counter updates take none: Cassandra refuses them)."""
    out = []
    for index, statement in enumerate(statements):
        if ".counters " in statement:
            out.append(statement)
            continue
        timestamp = BASE_TIMESTAMP + index * 10
        verb = statement.split(" ", 1)[0]
        if verb == "INSERT":
            if " USING TTL " in statement:
                out.append(statement.replace(" USING TTL ", f" USING TIMESTAMP {timestamp} AND TTL "))
            else:
                out.append(f"{statement} USING TIMESTAMP {timestamp}")
        elif verb == "UPDATE":
            table_end = statement.index(" ", len("UPDATE "))
            using = " AND " if statement[table_end:].startswith(" USING") else " USING "
            if using == " AND ":
                out.append(statement.replace(" USING TTL ", f" USING TIMESTAMP {timestamp} AND TTL ", 1))
            else:
                out.append(f"{statement[:table_end]} USING TIMESTAMP {timestamp}{statement[table_end:]}")
        else:  # DELETE ... FROM table WHERE
            where = statement.index(" WHERE ")
            out.append(f"{statement[:where]} USING TIMESTAMP {timestamp}{statement[where:]}")
    return out


def sstabledump(conf: Path, data_file: Path, version: str) -> None:
    """Cassandra's own ``sstabledump -t`` of one SSTable (timestamps as microseconds), of Cassandra
    ``version`` (on the project's Java, as nodetool), with the ``cassandra.yaml`` and ``logback-tools.xml``
    of ``conf``, next to it as ``*-sstabledump.json``."""
    command = [artifacts.java_executable(), "-Xmx256m", *SMALL_JVM, *JAVA17_ACCESS,
               f"-Dcassandra.config=file://{conf / 'cassandra.yaml'}",
               f"-Dlogback.configurationFile={conf / 'logback-tools.xml'}",
               f"-Dcassandra.storagedir={conf}", "-cp",
               artifacts.classpath(artifacts.CASSANDRA_VERSIONS[version]),
               "org.apache.cassandra.tools.SSTableExport", "-t", str(data_file)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"sstabledump {data_file} failed ({result.returncode}): {result.stderr[-2000:]}")
    # Its indentation off (JSON strings hold no raw line breaks): the same JSON, half the size.
    compact = "\n".join(line.strip() for line in result.stdout.splitlines()) + "\n"
    data_file.with_name(data_file.name.replace("-Data.db", "-sstabledump.json")).write_text(compact)


def generate_keystore(path: Path) -> None:
    subprocess.run(["keytool", "-genseckey", "-keyalg", "AES", "-keysize", "128", "-storetype", "JCEKS",
                    "-keystore", str(path), "-storepass", KEYSTORE_PASSWORD, "-keypass", KEYSTORE_PASSWORD,
                    "-alias", KEY_ALIAS], check=True, capture_output=True)


def _segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("CommitLog-*.log"))


def _trimmed_copy(source: Path, target: Path) -> None:
    """A segment without most of the zeros Cassandra preallocates after its last section: the same to any
    reader, and far smaller to keep. The last bytes written may be zeros too (a CRC's): a KiB of zeros is
    kept past the last byte that is not, so that both the data and the empty sync marker after it stay."""
    data = source.read_bytes()
    written = len(data.rstrip(b"\0"))
    target.write_bytes(data[:written + _KEPT_ZEROS])


_KEPT_ZEROS = 1024


def _execute(session: Any, statement: str, attempts: int = 3) -> None:
    """A statement, again when it timed out on a busy machine. Writing one twice (an append) changes what
    the files hold, not whether Cassandra and we read them alike."""
    from cassandra import OperationTimedOut, ReadTimeout, WriteTimeout

    for attempt in range(1, attempts + 1):
        try:
            session.execute(statement)
            return
        except (OperationTimedOut, ReadTimeout, WriteTimeout):
            if attempt == attempts:
                raise


def _run_phase(node: Any, driver_of: Callable[[], Any], phase: Phase, version: str, out: Path) -> None:
    keyspace = phase.keyspace
    schema = schema_statements(keyspace, phase.compressions, version)
    writes = workload(keyspace, phase.compressions, version)
    with driver_of() as driver:
        driver.profile_manager.default.request_timeout = CLIENT_TIMEOUT
        session = driver.connect()
        for statement in [*schema, *writes]:
            _execute(session, statement)
        described = session.execute(f"DESCRIBE KEYSPACE {keyspace} WITH INTERNALS")
        (out / "schema.cql").write_text("\n\n".join(row.create_statement for row in described) + "\n")
    # The periodic sync (every second) writes the sections: then the segments hold every write.
    time.sleep(2.5)
    (out / "commitlog").mkdir()
    for segment in _segments(node.commitlog_dir):
        _trimmed_copy(segment, out / "commitlog" / segment.name)


def _keep_sstables(node: Any, keyspace: str, out: Path) -> list[Path]:
    data_files = []
    for table_dir in sorted((node.directory / "data" / keyspace).iterdir()):
        target = out / "sstables" / keyspace / table_dir.name
        target.mkdir(parents=True)
        for component in table_dir.iterdir():
            # The bloom filter only answers "maybe here?" to reads by key: no reader of the fixtures needs it.
            if component.is_file() and not component.name.endswith("-Filter.db"):
                shutil.copy2(component, target / component.name)
        data_files += sorted(target.glob("*-Data.db"))
    return data_files


def generate(out: Path, work: Path, version: str = "5.0", progress: Callable[[str], None] = print) -> None:
    """Run every phase on a node of Cassandra ``version``, and the replay; the files go to ``out``, which
    holds none of them yet (a README may be there already). ``work`` is the node's directory."""
    out.mkdir(parents=True, exist_ok=True)
    keystore = out / "fidelity.jceks"
    generate_keystore(keystore)
    settings: dict[str, Any] = {}
    # sstabledump runs while the node goes on: with a copy of the node's configuration, which the next
    # start rewrites.
    dump_conf = work / "sstabledump-conf"
    dumps = []
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for name, phase in phases(version).items():
            settings = {**COMMON_SETTINGS, **phase.commitlog_settings(keystore),
                        **(sstable_format(phase.sstables or "bti") if version == "5.0" else {})}
            phase_out = out / name
            phase_out.mkdir()
            with CassandraCluster(work, nodes=1, config=settings, progress=progress,
                                  version=version) as cluster:
                node = cluster.nodes[0]
                _run_phase(node, cluster.driver, phase, version, phase_out)
                node.nodetool("flush", phase.keyspace)
                if phase.sstables:
                    if not dump_conf.exists():
                        shutil.copytree(node.directory / "conf", dump_conf)
                    dumps += [pool.submit(sstabledump, dump_conf, data, version)
                              for data in _keep_sstables(node, phase.keyspace, phase_out)]
            progress(f"phase {name} written")
        _replay(work, settings, version, out, progress)
        for dump in dumps:
            dump.result()
    progress("sstabledump done")


def _replay(work: Path, settings: dict[str, Any], version: str, out: Path,
            progress: Callable[[str], None]) -> None:
    """The node, its tables of the workload emptied, replays every kept segment at start-up."""
    cluster = CassandraCluster(work, nodes=1, config=settings, progress=progress, version=version)
    node = cluster.nodes[0]
    keyspaces = [phase.keyspace for phase in phases(version).values()]
    for keyspace in keyspaces:
        for table_dir in (node.directory / "data" / keyspace).iterdir():
            for component in table_dir.iterdir():
                if component.is_file():
                    component.unlink()
    for phase_directory in phase_directories(out):
        for segment in _segments(phase_directory / "commitlog"):
            shutil.copy2(segment, node.commitlog_dir / segment.name)
    selected: dict[str, list[Any]] = {}
    with cluster:
        with cluster.driver() as driver:
            driver.profile_manager.default.request_timeout = CLIENT_TIMEOUT
            session = driver.connect()
            for keyspace in keyspaces:
                for table in session.execute("SELECT table_name FROM system_schema.tables "
                                             "WHERE keyspace_name = %s", [keyspace]):
                    name = f"{keyspace}.{table.table_name}"
                    selected[name] = [row.json for row in session.execute(f"SELECT JSON * FROM {name}")]
    # One row a line as the node wrote it, compressed: SELECT JSON lists all of a table's forty columns,
    # mostly null.
    lines = [f'{{"table": "{table}", "row": {row}}}\n' for table, rows in selected.items() for row in rows]
    with gzip.open(out / "replayed-select.jsonl.gz", "wt", encoding="utf-8") as file:
        file.writelines(lines)
    progress("replayed")


def main(arguments: list[str]) -> None:
    """``python tests/fidelity_files.py [TARGET]``: the 5.0 files made anew in TARGET (default: the fixtures),
    whose old files go first (but for its README)."""
    target = Path(arguments[0]) if arguments else FIXTURES
    for old in target.glob("*"):
        if old.name != "README.md":
            shutil.rmtree(old) if old.is_dir() else old.unlink()
    with tempfile.TemporaryDirectory(prefix="cassandra-5.0-node-") as work:
        generate(target, Path(work))


if __name__ == "__main__":
    main(sys.argv[1:])
