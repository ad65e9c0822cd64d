"""Spark's Python worker daemon (``spark.python.daemon.module``) with the pipeline's imports done once.

Spark forks a Python worker from the daemon whenever a task finds no idle one: at a query's start, and
when more tasks run at once than workers are idle; it keeps them for later tasks, of later micro-batches
and queries too. Each new worker imported pandas, pyarrow, pyspark.sql and this package again, about a
second of CPU per worker: most of the Python CPU of a query's first micro-batch (py-spy,
benchmarks/RESULTS.md). Imported here, before the daemon forks, they are shared by every worker.

The daemon and its workers import PySpark from the installed package, not from the archives that pip's
PySpark bundles for Spark to put first on its Python processes' path (``pyspark/python/lib/pyspark.zip``,
and py4j's). Python compiles every module it imports from an archive, on every import: nothing is cached.
And each new worker, once PySpark has added the job's files directory to its path, has every archive
importer read its archive's directory again (``importlib.invalidate_caches``). The archives hold the same
code as the package they are bundled in; an archive without its package installed beside it (a Spark
distribution's ``$SPARK_HOME/python/lib``) stays.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Where pip's PySpark keeps the archives it bundles, inside its package: <site-packages>/pyspark/python/lib.
BUNDLED_ARCHIVES_DIRECTORY = ("pyspark", "python", "lib")


def without_bundled_archives(path: list[str]) -> list[str]:
    """``path`` (a ``sys.path``) without the archives of pip's PySpark whose package is importable from a
    directory of ``path`` itself: ``pyspark.zip`` when ``pyspark`` is installed there, ``py4j-*.zip`` when
    ``py4j`` is."""
    directories = {Path(entry) for entry in path}
    kept = []
    for entry in path:
        archive = Path(entry)
        if archive.suffix == ".zip" and archive.parts[-4:-1] == BUNDLED_ARCHIVES_DIRECTORY:
            site = archive.parents[len(BUNDLED_ARCHIVES_DIRECTORY)]
            package = archive.name.split("-")[0].removesuffix(".zip")  # pyspark.zip, py4j-0.10.9.9-src.zip
            if site in directories and (site / package / "__init__.py").is_file():
                continue
        kept.append(entry)
    return kept


if __name__ == "__main__":
    sys.path[:] = without_bundled_archives(sys.path)  # before anything imports pyspark

    import pandas  # noqa: F401
    import pyarrow  # noqa: F401
    from pyspark import daemon

    from . import change_processor, event_sink, kafka_source  # noqa: F401

    daemon.manager()
