"""One SparkSession for the whole pytest session: JVM start-up is the slow part of Spark tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


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
        },
    )
    yield session
    session.stop()
