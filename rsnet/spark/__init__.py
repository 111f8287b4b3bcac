"""PySpark connector: rsnet broker topics as a Spark source and sink (format ``rsnet``).

    import rsnet.spark
    rsnet.spark.register(spark)
    df = spark.readStream.format("rsnet").option("url", "tcp://127.0.0.1:7600").option("topic", "orders").load()

Needs the extra ``rsnet[spark]`` (pyspark 4.x with pyarrow) and Java 17. See the README's
Spark section for the options, the type mapping and the delivery guarantees.
"""

from __future__ import annotations

import os
import shutil
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


def check_java() -> str:
    """The ``java`` Spark will start, or RuntimeError saying how to install one. Call it
    before building a SparkSession: without Java, PySpark fails with an obscure gateway error."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        where = f"JAVA_HOME={home} has no bin/java" if home else "no java on PATH and JAVA_HOME is not set"
        raise RuntimeError(
            f"rsnet.spark: Spark needs Java 17 ({where}); install it, e.g. "
            "`apt-get install -y openjdk-17-jre-headless`, or set JAVA_HOME"
        )
    return java
