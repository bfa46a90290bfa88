"""One SparkSession for the whole pytest session: JVM start-up is the slow part of Spark tests.

The test JVMs compile with C1 only (`-XX:TieredStopAtLevel=1`, `SPARK_TEST_JAVA_OPTIONS`): a
test's Spark jobs are a few thousand rows each, over in seconds, so the JVM's time goes into
JIT-compiling Spark itself, and C2's optimising compiles never pay back in a run this short
(measured: session start 11 s -> 5 s, a 3,000-event analysis 12 s -> 6 s). What the code
computes does not depend on the JIT tier.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

SPARK_TEST_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    import pyspark  # noqa: F401  (a missing pyspark is a failure here, not a skip)

    from echo.telemetry.pipeline import build_spark

    session = build_spark(
        "local[2]",
        app_name="echo-tests",
        progress=False,
        conf={
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.driver.extraJavaOptions": SPARK_TEST_JAVA_OPTIONS,
        },
    )
    yield session
    session.stop()
