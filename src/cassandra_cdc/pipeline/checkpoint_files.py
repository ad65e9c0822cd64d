"""The files the pipeline and the bootstrap keep in the checkpoint, wherever the checkpoint is.

The checkpoint is a Hadoop path (a local directory, ``file://``, ``hdfs://``, ``s3a://``...) that Spark
reads and writes through Hadoop's ``FileSystem``; the pipeline's own checks (and the bootstrap's progress
file) read and write their files the same way, through the session's JVM. Before Spark starts there is no
JVM: only a local checkpoint (a plain path or ``file://``) can be read then.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession


class CheckpointFiles(Protocol):
    def location(self, name: str) -> str:
        """The file ``name`` (relative to the checkpoint) as shown to the user."""

    def exists(self, name: str) -> bool: ...

    def batch_files(self, directory: str) -> list[str]:
        """The names, relative to the checkpoint, of the files in ``directory`` named by a batch id."""

    def read_text(self, name: str) -> str:
        """Raises OSError or ValueError (not UTF-8) for a file that cannot be read."""

    def write_text(self, name: str, text: str) -> None:
        """Replaces the file at once: a reader, also after a crash, sees the old text or the new one."""

    def delete(self, name: str) -> None:
        """Nothing happens when there is no such file."""


def local_directory(checkpoint: str) -> Path | None:
    """The directory of a local checkpoint (a path or a ``file://`` URI); None for any other scheme."""
    parsed = urlparse(checkpoint)
    if parsed.scheme == "file":
        return Path(parsed.path)
    return Path(checkpoint) if parsed.scheme == "" else None


def is_batch_id(name: str) -> bool:
    return name[:1].isdigit()


class LocalCheckpointFiles:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def location(self, name: str) -> str:
        return str(self.directory / name)

    def exists(self, name: str) -> bool:
        return (self.directory / name).exists()

    def batch_files(self, directory: str) -> list[str]:
        folder = self.directory / directory
        names = sorted(path.name for path in folder.iterdir()) if folder.is_dir() else []
        return [f"{directory}/{name}" for name in names if is_batch_id(name)]

    def read_text(self, name: str) -> str:
        return (self.directory / name).read_text(encoding="utf-8")

    def write_text(self, name: str, text: str) -> None:
        path = self.directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as file:
                file.write(text)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        _fsync_directory(path.parent)
        # Hadoop's local file system keeps a checksum beside each file it writes, and refuses to read a
        # file whose checksum no longer matches: one written here has none.
        (path.parent / f".{path.name}.crc").unlink(missing_ok=True)

    def delete(self, name: str) -> None:
        (self.directory / name).unlink(missing_ok=True)


def _fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable, where the file system allows it."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


class HadoopCheckpointFiles:
    """The checkpoint's files through Spark's own ``CheckpointFileManager`` for the URI (Hadoop's file system
    the session's JVM resolves it to), as Spark reads and writes its checkpoint files."""

    def __init__(self, spark: SparkSession, checkpoint: str) -> None:
        self.jvm = spark._jvm  # type: ignore[attr-defined]
        self.checkpoint = checkpoint.rstrip("/")
        self.files = self.jvm.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager.create(
            self.jvm.org.apache.hadoop.fs.Path(self.checkpoint),
            spark._jsc.hadoopConfiguration())  # type: ignore[attr-defined]

    def location(self, name: str) -> str:
        return f"{self.checkpoint}/{name}"

    def path(self, name: str):  # type: ignore[no-untyped-def]  (a py4j proxy of org.apache.hadoop.fs.Path)
        return self.jvm.org.apache.hadoop.fs.Path(self.location(name))

    def exists(self, name: str) -> bool:
        return bool(self.files.exists(self.path(name)))

    def batch_files(self, directory: str) -> list[str]:
        if not self.exists(directory):
            return []
        names = sorted(status.getPath().getName() for status in self.files.list(self.path(directory)))
        return [f"{directory}/{name}" for name in names if is_batch_id(name)]

    def read_text(self, name: str) -> str:
        try:
            stream = self.files.open(self.path(name))
            try:
                content = bytes(stream.readAllBytes())
            finally:
                stream.close()
        except Py4JJavaError as error:
            raise OSError(str(error.java_exception.toString())) from None
        return content.decode("utf-8")

    def write_text(self, name: str, text: str) -> None:
        # As Spark writes its own checkpoint files: to a temporary file renamed over the old one on close
        # (HDFS: an atomic rename), so that a crash mid-write leaves the old file, not a part of the new one.
        path = self.path(name)
        self.files.mkdirs(path.getParent())  # the rename's target directory (a first write: the checkpoint's)
        stream = self.files.createAtomic(path, True)
        try:
            stream.write(bytearray(text.encode("utf-8")))
        except BaseException:
            stream.cancel()
            raise
        stream.close()

    def delete(self, name: str) -> None:
        self.files.delete(self.path(name))


def checkpoint_files(checkpoint: str, spark: SparkSession | None) -> CheckpointFiles | None:
    """The checkpoint's files through Hadoop when the session exists, else local ones; None for a
    checkpoint that only Hadoop can reach, before Spark starts."""
    if spark is not None:
        return HadoopCheckpointFiles(spark, checkpoint)
    directory = local_directory(checkpoint)
    return None if directory is None else LocalCheckpointFiles(directory)
