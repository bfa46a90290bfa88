"""deploy/grafana/echo-dashboard.json: valid, well formed, and every metric it queries is one
the servers export (sample names, so a histogram's `_bucket` counts too)."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import echo.session as es
from echo.lobby.server import LobbyServer
from echo.ops.http import Health
from echo.ops.metrics import (
    LobbyCollector,
    TicketCollector,
    TopicsCollector,
    new_registry,
    session_collectors,
)
from echo.topics.driver import TopicServer
from tests.ports import free_base

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "echo-dashboard.json"
METRIC = re.compile(r"\b((?:echo|process)_[a-z0-9_]+)\b")


def exported_samples() -> dict[str, set[str]]:
    """Sample name -> its label names, over every collector of every server."""
    lobby = LobbyServer(es.ServerConfig(port=free_base(4)))
    registry = new_registry(
        Health(),
        LobbyCollector(lobby),
        *session_collectors(lobby.sessions),
        TopicsCollector(TopicServer(port=0)),
        TicketCollector(Counter()),
    )
    samples: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, set()).update(sample.labels)
        if not family.samples:  # a labelled counter nothing counted yet
            samples.setdefault(family.name + "_total", set())
    return samples


def panels() -> list[dict[str, Any]]:
    board = json.loads(DASHBOARD.read_text())
    return [p for p in board["panels"] if p["type"] != "row"]


def queries() -> list[str]:
    return [target["expr"] for panel in panels() for target in panel["targets"]]


def test_the_dashboard_is_grafana_json_with_distinct_panels() -> None:
    board = json.loads(DASHBOARD.read_text())
    assert board["title"] and board["uid"] and board["schemaVersion"] >= 30
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    names = {v["name"] for v in board["templating"]["list"]}
    assert names == {"datasource", "job"}
    for panel in panels():
        assert panel["title"] and panel["targets"], panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        assert all('job=~"$job"' in t["expr"] for t in panel["targets"]), panel["title"]


def test_every_metric_the_dashboard_queries_is_exported() -> None:
    exported = exported_samples()
    queried = {name for expr in queries() for name in METRIC.findall(expr)}
    assert queried, "no metric found in the dashboard"
    unknown = sorted(queried - set(exported))
    assert not unknown, f"the dashboard queries metrics no server exports: {unknown}"


def test_every_label_the_dashboard_groups_by_is_on_its_metric() -> None:
    exported = exported_samples()
    for expr in queries():
        for labels in re.findall(r"by \(([a-z_, ]+)\)", expr):
            for label in (x.strip() for x in labels.split(",")):
                if label in ("instance", "job"):
                    continue  # added by Prometheus at scrape time
                names = METRIC.findall(expr)
                assert any(label in exported[name] for name in names), (label, expr)


def test_the_panels_the_operators_need_are_there() -> None:
    joined = "\n".join(queries())
    for metric in (
        "echo_session_sessions_open",
        "echo_session_admissions_total",
        "echo_transport_datagrams_received_total",
        "echo_transport_drops_total",
        "echo_lobby_members",
        "echo_topics_deliveries_total",
    ):
        assert metric in joined, metric
    for quantile in ("0.5", "0.99"):
        assert (
            f"histogram_quantile({quantile}, sum by (le) "
            f'(rate(echo_lobby_join_duration_seconds_bucket{{job=~"$job"}}' in joined
        )
