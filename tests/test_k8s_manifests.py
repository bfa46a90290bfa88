"""deploy/k8s/: every manifest valid, offline, and in step with the code and the Containerfile.

Kubernetes' own kinds (Namespace, ConfigMap, Secret, Service, StatefulSet) are validated with
kubernetes-validate, which ships the Kubernetes JSON schemas (no network: the test blocks
sockets while it validates), in strict mode (an unknown field fails). Agones' Fleet and
FleetAutoscaler are custom resources its schemas do not have: they are checked structurally
against deploy/k8s/schema/agones.json, written from Agones' documented fields, and the pod
template inside the Fleet against the Kubernetes PodTemplate schema. Then what a schema cannot
know: every command line is one the CLI accepts, every image is the one the Containerfile
builds, the user it runs as, the probes on the --metrics port, the rings and the key files.
"""

from __future__ import annotations

import copy
import json
import re
import socket
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import jsonschema
import kubernetes_validate
import pytest
import yaml

from echo.session.config import ServerConfig

REPO = Path(__file__).resolve().parents[1]
K8S = REPO / "deploy" / "k8s"
CONTAINERFILE = REPO / "deploy" / "Containerfile"
#: The Kubernetes release the manifests are checked against (Agones supports it).
KUBERNETES = "1.33"
AGONES_KINDS = {"Fleet", "FleetAutoscaler"}


def manifests() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(K8S.rglob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                found.append((f"{path.relative_to(K8S)}:{document['kind']}", document))
    return found


ALL = manifests()


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in ALL if doc["kind"] == kind]


def one(kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in by_kind(kind) if d["metadata"]["name"] == name]
    return found


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No socket can be opened: what validates here validates without a network."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the validation tried to use the network")

    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def k8s_validate(resource: dict[str, Any]) -> None:
    kubernetes_validate.validate(resource, KUBERNETES, strict=True)


def agones_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((K8S / "schema" / "agones.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


def pod_template(fleet: dict[str, Any]) -> dict[str, Any]:
    """The Fleet's GameServer pod template as a Kubernetes PodTemplate object."""
    template = fleet["spec"]["template"]["spec"]["template"]
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "gameserver"},
            "template": template}  # fmt: skip


def test_there_are_the_expected_resources() -> None:
    kinds = sorted(name for name, _ in ALL)
    assert kinds == sorted([
        "config.yaml:ConfigMap", "echo-lobby.yaml:Service", "echo-lobby.yaml:StatefulSet",
        "echo-server-fleet.yaml:Fleet", "echo-server-fleet.yaml:FleetAutoscaler",
        "echo-topics.yaml:Service", "echo-topics.yaml:StatefulSet", "namespace.yaml:Namespace",
        "keys/secrets.example.yaml:Secret", "keys/secrets.example.yaml:Secret",
        "keys/secrets.example.yaml:Secret",
    ])  # fmt: skip


@pytest.mark.parametrize("name,resource", ALL, ids=[n for n, _ in ALL])
def test_every_manifest_validates_offline(
    name: str, resource: dict[str, Any], offline: None
) -> None:
    if resource["kind"] in AGONES_KINDS:
        jsonschema.validate(resource, agones_schema())
        if resource["kind"] == "Fleet":
            k8s_validate(pod_template(resource))
    else:
        k8s_validate(resource)


def test_the_validation_catches_mistakes(offline: None) -> None:
    """The checks above can fail: a misspelt field, a wrong type, a wrong enum value."""
    lobby = copy.deepcopy(one("StatefulSet", "echo-lobby"))
    container = lobby["spec"]["template"]["spec"]["containers"][0]
    container["readinessProbe"]["httpGet"]["pth"] = container["readinessProbe"]["httpGet"].pop(
        "path"
    )
    with pytest.raises(kubernetes_validate.ValidationError):
        k8s_validate(lobby)
    service = copy.deepcopy(one("Service", "echo-lobby"))
    service["spec"]["ports"][0]["port"] = "seven thousand"
    with pytest.raises(kubernetes_validate.ValidationError):
        k8s_validate(service)
    schema = agones_schema()
    fleet = copy.deepcopy(one("Fleet", "echo-server"))
    fleet["spec"]["template"]["spec"]["ports"][0]["portPolicy"] = "static"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(fleet, schema)
    fleet = copy.deepcopy(one("Fleet", "echo-server"))
    fleet["spec"]["template"]["spec"]["healthz"] = {}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(fleet, schema)
    fleet = copy.deepcopy(one("Fleet", "echo-server"))
    del fleet["spec"]["template"]["spec"]["ports"][0]["hostPort"]  # Static needs it
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(fleet, schema)
    fleet = copy.deepcopy(one("Fleet", "echo-server"))
    fleet["spec"]["template"]["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        k8s_validate(pod_template(fleet))
    autoscaler = copy.deepcopy(one("FleetAutoscaler", "echo-server"))
    del autoscaler["spec"]["policy"]["buffer"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(autoscaler, schema)


# ---------------------------------------------------------------------- the image


def containerfile_image() -> str:
    text = CONTAINERFILE.read_text()
    (tag,) = re.findall(r"docker build -f deploy/Containerfile -t (\S+) \.", text)
    return tag


def pod_specs() -> Iterator[dict[str, Any]]:
    for kind in ("StatefulSet",):
        for resource in by_kind(kind):
            yield resource["spec"]["template"]["spec"]
    for fleet in by_kind("Fleet"):
        yield fleet["spec"]["template"]["spec"]["template"]["spec"]


def containers() -> Iterator[dict[str, Any]]:
    for spec in pod_specs():
        yield from spec.get("initContainers", [])
        yield from spec["containers"]


def test_every_image_is_the_one_the_containerfile_builds() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    image = containerfile_image()
    assert image == f"echo-server:{version}"
    assert {c["image"] for c in containers()} == {image}
    text = CONTAINERFILE.read_text()
    # Every docker run line of its header runs the same image.
    assert set(re.findall(r"docker run .*?(echo-server\S*)", text)) == {image}


def test_the_containerfile_builds_what_the_manifests_run() -> None:
    """Read, not run (no container engine here): what it copies exists, the user is the
    manifests' runAsUser, and every command the pods run is installed by it."""
    text = CONTAINERFILE.read_text()
    for line in re.findall(r"^COPY (.*)$", text, re.M):
        *sources, _ = line.split()
        for source in sources:
            assert (REPO / source).exists(), source
    (uid,) = re.findall(r"useradd .*--uid (\d+)", text)
    (user,) = re.findall(r"^USER (\S+)$", text, re.M)
    assert user == uid
    for spec in pod_specs():
        assert spec["securityContext"]["runAsUser"] == int(uid)
        assert spec["securityContext"]["runAsNonRoot"] is True
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    (entrypoint,) = re.findall(r"^ENTRYPOINT (\[.*\])$", text, re.M)
    assert json.loads(entrypoint)[0] in scripts
    assert "RUN pip install --no-cache-dir ." in text
    for container in containers():
        command = container.get("command", json.loads(entrypoint))[0]
        assert command in scripts or command == "install", command  # (coreutils, in the base)


# ---------------------------------------------------------------------- the command lines


def command_line(container: dict[str, Any], tmp_path: Path) -> tuple[str, list[str]]:
    """The program and its arguments, as the pod runs them: the ENTRYPOINT when the container
    names no command, its args after; $(VAR)s filled with the values the pod gives them."""
    (entrypoint,) = re.findall(r"^ENTRYPOINT (\[.*\])$", CONTAINERFILE.read_text(), re.M)
    argv = container.get("command") or json.loads(entrypoint)
    argv = [*argv, *container.get("args", [])]
    config = one("ConfigMap", "echo-config")["data"]
    values = {"POD_NAME": "echo-lobby-1", "NODE_IP": "10.0.0.7", **config}
    for variable in container.get("env", []):
        assert "value" in variable or variable["valueFrom"], variable
    filled = []
    for arg in argv[1:]:
        arg = re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)], arg)
        # the events file's folder is a volume in the pod; here, a folder that exists
        filled.append(arg.replace("/var/lib/echo", str(tmp_path)))
    return argv[0], filled


def cli(program: str) -> click.Command:
    from echo.lobby.cli import announce_main, server_main
    from echo.server.cli import main as echo_server
    from echo.topics.cli import server_main as topics_main

    commands = {"echo-server": echo_server, "echo-lobby": server_main,
                "echo-topics": topics_main, "echo-lobby-announce": announce_main}  # fmt: skip
    return commands[program]


def test_every_command_line_is_one_the_cli_accepts(tmp_path: Path) -> None:
    seen = set()
    for container in containers():
        program, args = command_line(container, tmp_path)
        if program == "install":
            continue
        seen.add(program)
        context = cli(program).make_context(program, args)  # parses, converts, checks
        assert context.params  # (a usage error raised above)
    assert seen == {"echo-server", "echo-lobby", "echo-topics", "echo-lobby-announce"}


def test_the_probes_ask_the_metrics_endpoint(tmp_path: Path) -> None:
    for container in containers():
        _, args = command_line(container, tmp_path)
        if "livenessProbe" not in container:
            continue
        (metrics,) = [a.split("=", 1)[1] for a in args if a.startswith("--metrics=")]
        port = int(metrics.rsplit(":", 1)[1])
        named = {p["name"]: p["containerPort"] for p in container["ports"]}
        liveness = container["livenessProbe"]["httpGet"]
        readiness = container["readinessProbe"]["httpGet"]
        assert (liveness["path"], readiness["path"]) == ("/healthz", "/readyz")
        assert named[liveness["port"]] == named[readiness["port"]] == port
        assert metrics.startswith("0.0.0.0:")  # the kubelet probes the pod's address


def test_the_fleet_opens_the_ports_the_server_binds() -> None:
    fleet = one("Fleet", "echo-server")
    ports = fleet["spec"]["template"]["spec"]["ports"]
    config = ServerConfig(address="0.0.0.0", duologue_ports="shared")
    assert {p["containerPort"] for p in ports} == {
        config.port,
        config.control_port,
        *config.clients_port_range,
    }
    for port in ports:
        # what the server binds is what its CONNECT tells the client: no remapping
        assert port["portPolicy"] == "Static" and port["hostPort"] == port["containerPort"]
        assert port["protocol"] == "UDP"
    spec = fleet["spec"]["template"]["spec"]
    assert spec["container"] == "echo-server"
    (server,) = [c for c in spec["template"]["spec"]["containers"] if c["name"] == "echo-server"]
    assert "--agones" in server["args"]
    (max_clients,) = [a.split("=")[1] for a in server["args"] if a.startswith("--max-clients=")]
    assert spec["players"]["initialCapacity"] == int(max_clients)
    # the drain fits in the pod's grace before the kill
    (drain,) = [a.split("=")[1] for a in server["args"] if a.startswith("--drain-timeout=")]
    assert float(drain) + 10 < spec["template"]["spec"]["terminationGracePeriodSeconds"]
    autoscaler = one("FleetAutoscaler", "echo-server")
    assert autoscaler["spec"]["fleetName"] == fleet["metadata"]["name"]


@pytest.mark.parametrize("name,port", [("echo-lobby", 7600), ("echo-topics", 7400)])
def test_each_ring_lists_the_stable_names_of_its_statefulset(name: str, port: int) -> None:
    service = one("Service", name)
    assert service["spec"]["clusterIP"] == "None"  # headless: one DNS name per pod
    stateful = one("StatefulSet", name)
    assert stateful["spec"]["serviceName"] == name
    key = {"echo-lobby": "LOBBY_SERVERS", "echo-topics": "TOPICS_SERVERS"}[name]
    ring = one("ConfigMap", "echo-config")["data"][key].split(",")
    replicas = stateful["spec"]["replicas"]
    assert ring == [f"{name}-{n}.{name}:{port}" for n in range(replicas)]
    assert service["spec"]["selector"] == stateful["spec"]["selector"]["matchLabels"]


def test_every_secret_and_config_map_used_exists() -> None:
    secrets = {s["metadata"]["name"]: s for s in by_kind("Secret")}
    maps = {m["metadata"]["name"] for m in by_kind("ConfigMap")}
    namespaces = {n["metadata"]["name"] for n in by_kind("Namespace")}
    for _, resource in ALL:
        if resource["kind"] != "Namespace":
            assert resource["metadata"]["namespace"] in namespaces
    for spec in pod_specs():
        own = [*spec.get("initContainers", []), *spec["containers"]]
        mounts = {m["name"] for c in own for m in c.get("volumeMounts", [])}
        for volume in spec.get("volumes", []):
            if "secret" in volume:
                secret = secrets[volume["secret"]["secretName"]]
                assert volume["name"] in mounts
                assert set(secret["stringData"])  # the file names the commands read
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            for variable in container.get("env", []):
                ref = variable.get("valueFrom", {}).get("configMapKeyRef")
                if ref:
                    assert ref["name"] in maps
    # The key paths on the command lines are files of the Secrets mounted there.
    fleet_spec = one("Fleet", "echo-server")["spec"]["template"]["spec"]["template"]["spec"]
    init = fleet_spec["initContainers"][0]["command"]
    assert init[-2] == "/etc/echo/server-key/server.key" and init[-1].endswith("/server.key")
    assert "server.key" in secrets["echo-server-key"]["stringData"]
    assert "game.key" in secrets["echo-ticket-key"]["stringData"]
    assert "seat.key" in secrets["echo-seat-key"]["stringData"]
