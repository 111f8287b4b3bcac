"""PySpark connector: rsnet broker topics as a Spark source and sink (format ``rsnet``).

    import rsnet.spark
    rsnet.spark.register(spark)
    df = spark.readStream.format("rsnet").option("url", "tcp://127.0.0.1:7600").option("topic", "orders").load()

Needs the extra ``rsnet[spark]`` (pyspark 4.x with pyarrow) and Java 17. See the README's
Spark section for the options, the type mapping and the delivery guarantees.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Any

# What the connector needs beyond rsnet, checked first: a missing one would otherwise fail
# deep inside .source with no word of the extra that brings it.
try:
    import pyarrow  # type: ignore[import-untyped]  # noqa: F401
    import pyspark  # noqa: F401
except ModuleNotFoundError as missing:
    raise ModuleNotFoundError(
        f"rsnet.spark needs {missing.name}: install rsnet with the spark extra "
        "(in a clone: pip install -e '.[spark]'), which brings pyspark 4.x and pyarrow",
        name=missing.name,
    ) from None

from .source import DataLossError, RsnetDataSource  # after the check above

__all__ = ["DataLossError", "RsnetDataSource", "check_java", "register"]


def register(spark: Any) -> None:
    """Make ``format("rsnet")`` available in ``spark`` (a SparkSession). PySpark has no
    discovery of Python data sources: each session registers them."""
    spark.dataSource.register(RsnetDataSource)


JAVA_NEEDED = 17
"""The oldest Java PySpark 4 starts on."""


def check_java() -> str:
    """The ``java`` Spark will start, or RuntimeError saying how to install one. Call it
    before building a SparkSession: without Java, or with one older than 17, PySpark fails
    with an obscure gateway error (or ``UnsupportedClassVersionError``)."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    install = "install it, e.g. `apt-get install -y openjdk-17-jre-headless`, or set JAVA_HOME"
    if not java or not os.path.exists(java):
        where = f"JAVA_HOME={home} has no bin/java" if home else "no java on PATH and JAVA_HOME is not set"
        raise RuntimeError(f"rsnet.spark: Spark needs Java {JAVA_NEEDED} ({where}); {install}")
    major = java_major_version(java)
    if major is not None and major < JAVA_NEEDED:
        raise RuntimeError(
            f"rsnet.spark: Spark needs Java {JAVA_NEEDED} or later, and {java} is Java {major}; {install}"
        )
    return java


def java_major_version(java: str) -> int | None:
    """The major version ``java -version`` reports (8 for "1.8.0_402", 17 for "17.0.9"), or None
    if it does not say."""
    try:
        shown = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r'version "(\d+)(?:\.(\d+))?', shown)
    if found is None:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major
