"""One SparkSession (local[2]) and one ``rsnet broker`` process for the whole test run."""

from __future__ import annotations

import os
import sys

import pytest

import rsnet.spark

from .support import broker_process


@pytest.fixture(scope="session")
def spark():
    rsnet.spark.check_java()  # a clear message instead of PySpark's gateway error
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    fast_jvm = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"
    session = (
        SparkSession.builder.master("local[2]")
        .appName("rsnet-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.adaptive.enabled", "false")
        # Tests move a few rows: compiling whole-stage Java code for each plan costs more than it saves.
        .config("spark.sql.codegen.wholeStage", "false")
        .config("spark.driver.extraJavaOptions", fast_jvm)
        .config("spark.executor.extraJavaOptions", fast_jvm)
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    rsnet.spark.register(session)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def broker_url(tmp_path_factory):
    with broker_process(tmp_path_factory.mktemp("broker")) as url:
        yield url
