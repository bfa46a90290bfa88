"""The repository stands alone: no product or test file reads or cites anything outside it.

A clone into an empty folder must pass the suite, so nothing may reach beside the checkout (a
relative path up to a parent folder, a path climbing above the root from `__file__`, an
absolute path into someone's machine), and comments cite the project's own
`docs/architecture.md` or public sources by their titles, never a design note, a numbered
source or an issue number that only its authors had.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest

from tests.transport.pcapng import CAPTURE_NAMES, captures_dir

ROOT = Path(__file__).resolve().parents[1]
THIS = PurePosixPath("tests/test_self_contained.py")

#: What is checked: the product, its tests, benchmarks, tools and examples, and the scripts and
#: files that build and run them. Documentation pages are prose for people and may link outward.
SCANNED_DIRS = ("echo", "tests", "bench", "tools", "examples")
SCANNED_FILES = ("dev", ".ci/run", "setup.py", "pyproject.toml")
#: Never scanned: generated, installed or binary content.
SKIPPED_DIRS = {
    "__pycache__",
    "node_modules",
    ".venv",
    ".mutation",
    ".hypothesis",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    "build",
}
#: Data, not code: the reference captures (and their tshark listings), and benchmark results
#: (which record the machine they ran on).
SKIPPED_PREFIXES = (PurePosixPath("tests/data"), PurePosixPath("bench/results"))
SKIPPED_SUFFIXES = {".so", ".pyc", ".pcapng", ".png", ".svg", ".jar", ".class", ".gz", ".zip"}

#: The engineers' background folder beside a checkout, named only as built here, so that this
#: file itself (its patterns and its planted violations) names no path outside the repository.
BG = "sha" + "red"
#: The planted lines below build what they name from parts too (a parent folder, the
#: background notes), so that this file itself names nothing outside the repository.
UP = "." + "./"

#: Absolute paths a file may name: the system's own, the same on every machine. Anything else
#: rooted at / (a home directory, /work, /root, /srv, /opt, ...) is someone's machine.
ALLOWED_ROOTS = {
    "tmp",  # scratch files and examples of them
    "proc",  # /proc/self/status, /proc/net/... (process and network facts)
    "sys",  # /sys/class/net/... (interfaces in the namespace labs)
    "dev",  # /dev/null, /dev/urandom
    "etc",  # /etc/hosts, /etc/os-release, systemd units
    "usr",  # /usr/bin/env, /usr/bin/chromium, /usr/lib/jvm
    "bin",  # /bin/sh
    "sbin",  # /sbin/ip
    "lib",  # /lib/systemd/...
    "run",  # /run/netns, /run/user
    "var",  # /var/lib/echo, /var/log (deployment)
    "nonexistent",  # a path that exists nowhere: what a missing-file test passes
    # not files: the Agones SDK sidecar's REST paths (/watch/gameserver, /alpha/player/...)
    "watch",
    "alpha",
}

#: Paths that escape the checkout however they are written.
OUTSIDE_PATTERNS = (
    (re.compile(r"(?<![\w.])\.\./"), "a relative path climbing out of its folder"),
    (re.compile(rf"\b{BG}/(?:reference|seeds)\b"), "the engineers' background folder"),
)

#: Citations that mean nothing to a reader of the repository.
CITATION_PATTERNS = (
    (re.compile(r"\bseed ?0\d\d\b", re.IGNORECASE), "a numbered source ('seed 00x')"),
    (re.compile(r"\bse" + "eds/"), "a numbered source's file"),
    (re.compile(r"\bseed(?:'s)? §", re.IGNORECASE), "a numbered source's section"),
    (re.compile(r"\bissues? ?#?\d+", re.IGNORECASE), "an issue number"),
    (re.compile(r"\bDES" + r"IGN\.md\b"), "a design note that is not in the repository"),
    (
        re.compile(r"\baeron-" + r"protocol\.md\b|\b[a-z-]+-" + r"anchors\.md\b"),
        "a reference note not here",
    ),
    (re.compile(r"\breference §"), "a section of a reference note not here"),
)

#: `Path(__file__)` climbing: `.parents[N]`, and any number of `.parent` after it or instead.
FILE_CLIMB = re.compile(
    r"Path\(__file__\)(?:\.resolve\(\)|\.absolute\(\))?"
    r"(?:\.parents\[(?P<index>\d+)\])?(?P<parents>(?:\.parent\b)*)"
)
#: A shell script's own folder, climbed: "$(dirname "$0")" followed by parent steps.
SCRIPT_CLIMB = re.compile(r"""\$\(dirname "?\$(?:0|\{BASH_SOURCE\[0\]\})"?\)(?P<ups>(?:/\.\.)*)""")
#: An absolute path: a slash that starts a token (not "MB/s", "and/or", "a/b", "://", "{pid}/"),
#: then a name that starts with a letter (not "/64", "/ 2") and a further slash.
ABSOLUTE_PATH = re.compile(r"(?<![\w.~:/\\\-\]\)>}])/(?P<root>[A-Za-z][\w.-]*)(?=/)")


def violations(text: str, path: PurePosixPath) -> list[str]:
    """Every place in `text` (the content of the file at `path`, relative to the repository
    root) that names something outside the repository or cites what only its authors had."""
    found: list[str] = []
    depth = len(path.parts) - 1  # how many folders up from the file's own folder is the root
    for number, line in enumerate(text.splitlines(), 1):
        where = f"{path}:{number}"
        for pattern, what in OUTSIDE_PATTERNS + CITATION_PATTERNS:
            match = pattern.search(line)
            if match:
                found.append(f"{where}: {what}: {match.group(0)!r}")
        for match in FILE_CLIMB.finditer(line):
            index, parents = match.group("index"), match.group("parents")
            if index is None and not parents:
                continue
            # parents[0] and .parent are the file's folder: the root is `depth` steps up.
            steps = (int(index) + 1 if index is not None else 0) + parents.count(".parent")
            if steps > depth + 1:
                found.append(f"{where}: climbs above the repository root: {match.group(0)!r}")
        for match in SCRIPT_CLIMB.finditer(line):
            if match.group("ups").count("/..") > depth:
                found.append(f"{where}: climbs above the repository root: {match.group(0)!r}")
        for match in ABSOLUTE_PATH.finditer(line):
            if match.group("root") not in ALLOWED_ROOTS:
                found.append(f"{where}: an absolute path outside the system's own: "
                             f"{line[match.start():].split()[0]!r}")
    return found


def scanned_files() -> Iterator[Path]:
    for name in SCANNED_FILES:
        if (ROOT / name).is_file():
            yield ROOT / name
    for folder in SCANNED_DIRS:
        for path in sorted((ROOT / folder).rglob("*")):
            relative = PurePosixPath(path.relative_to(ROOT).as_posix())
            if not path.is_file() or path.suffix in SKIPPED_SUFFIXES:
                continue
            if SKIPPED_DIRS.intersection(relative.parts[:-1]) or any(
                relative.is_relative_to(prefix) for prefix in SKIPPED_PREFIXES
            ):
                continue
            yield path


def test_no_file_names_a_path_outside_the_repository_or_an_unpublished_source() -> None:
    problems: list[str] = []
    checked = 0
    for path in scanned_files():
        relative = PurePosixPath(path.relative_to(ROOT).as_posix())
        if relative == THIS:
            continue  # the patterns and the planted samples below
        data = path.read_bytes()
        if b"\0" in data:
            continue
        checked += 1
        problems += violations(data.decode("utf-8", errors="replace"), relative)
    assert checked > 200, f"only {checked} files scanned: is the tree where this test thinks?"
    assert not problems, "\n".join(problems)


# ---- the checker itself: it catches what it must and nothing legitimate ---------------------

TESTS_FILE = PurePosixPath("tests/transport/pcapng.py")  # two folders below the root
TOP_FILE = PurePosixPath("setup.py")


@pytest.mark.parametrize(
    ("line", "path"),
    [
        (f'path = Path(__file__).resolve().parents[2].parent / "{BG}" / "x"', TESTS_FILE),
        ("ROOT = Path(__file__).resolve().parents[3]", TESTS_FILE),
        ("ROOT = Path(__file__).parent.parent.parent.parent", TESTS_FILE),
        ("HERE = Path(__file__).parents[0].parent.parent.parent", TESTS_FILE),
        ("ROOT = Path(__file__).resolve().parents[1]", TOP_FILE),
        (f'cd "$(dirname "$0")/{UP}.."', PurePosixPath(".ci/run")),
        (f'captures = "{UP}{BG}/reference/aeron-captures"', TESTS_FILE),
        (f"open('{UP}notes.txt')", TESTS_FILE),
        (f"# the captures in {BG}/reference/aeron-captures", TESTS_FILE),
        (f'DATA = "/work/{BG}/reference"', TESTS_FILE),
        ('KEYS = Path("/home/alice/keys")', TESTS_FILE),
        ("see /root/echo/notes", TESTS_FILE),
        ('"/srv/echo/events.jsonl"', TESTS_FILE),
        ('(f"/opt/data/{name}")', TESTS_FILE),
        ('"""Echo 2.0 server (seed 000 §4.5): config."""', TESTS_FILE),
        ("# Seed 002's three fixes", TESTS_FILE),
        ("# se" + "eds/004 flow control", TESTS_FILE),
        ("# (seed §4.3's spoofer)", TESTS_FILE),
        ("# issue 13 item 5", TESTS_FILE),
        ("# Issue 15: close() said", TESTS_FILE),
        ("# see issue #7", TESTS_FILE),
        ('"""The public surface (DES' + 'IGN.md §4)."""', TESTS_FILE),
        ("# (reference aeron-" + "protocol.md §7.4)", TESTS_FILE),
        ("# (reference lobby-" + "anchors.md §1)", TESTS_FILE),
        ("# loss detection (reference §2.5)", TESTS_FILE),
    ],
)
def test_the_checker_catches_a_planted_violation(line: str, path: PurePosixPath) -> None:
    assert violations(f"x = 1\n{line}\n", path), line


@pytest.mark.parametrize(
    ("line", "path"),
    [
        ("ROOT = Path(__file__).resolve().parents[2]", TESTS_FILE),
        ("HERE = Path(__file__).parent", TESTS_FILE),
        ("ROOT = Path(__file__).parent.parent.parent", TESTS_FILE),
        ("ROOT = Path(__file__).resolve().parents[0]", TOP_FILE),
        ("ROOT = Path(__file__).resolve().parent", TOP_FILE),
        ('cd "$(dirname "$0")/.."', PurePosixPath(".ci/run")),
        ('cd "$(dirname "$0")"', PurePosixPath("dev")),
        ('out = "/tmp/events.jsonl"', TESTS_FILE),
        ('Path("/proc/self/status").read_text()', TESTS_FILE),
        ('"/sys/class/net/veth0/mtu"', TESTS_FILE),
        ('BROWSER = "/usr/bin/chromium"', TESTS_FILE),
        ('open("/dev/null", "wb")', TESTS_FILE),
        ('"/etc/systemd/system/echo-server.service"', TESTS_FILE),
        ('ip = "/sbin/ip"', TESTS_FILE),
        ('with open(f"/proc/{pid}/task/{pid}/children") as f:', TESTS_FILE),
        ('["--ticket-key", "/nonexistent/key"]', TESTS_FILE),
        ("ExecStart=/usr/bin/env echo-server", TESTS_FILE),
        ("rates in MB/s and round trips/s, and/or p99", TESTS_FILE),
        ("an IPv6 host owns a whole /64, so count per /64 prefix", TESTS_FILE),
        ('URI = "aeron:udp?endpoint=127.0.0.1:9000|control-mode=dynamic"', TESTS_FILE),
        ("https://github.com/aeron-io/aeron/wiki/Protocol-Specification", TESTS_FILE),
        ("# Wait for it... then go on", TESTS_FILE),
        ("# the io7m Aeron guide §4.4, Aeron's wire-protocol page", TESTS_FILE),
        ("# docs/architecture.md, Conventions", TESTS_FILE),
        ("# the soft-state publish/subscribe note", TESTS_FILE),
        ("# random seed 7: same seed, same file; hypothesis seed=3", TESTS_FILE),
        ("rng = random.Random(seed)  # PYTHONHASHSEED differs per process", TESTS_FILE),
        ('"--seed", "7"  # generated with (seed 2004)', TESTS_FILE),
        (f"--duologue-ports {BG}: two ports for every duologue", TESTS_FILE),
        ("# aeron-io/aeron#2061: MDC sends every stream", TESTS_FILE),
        ('path = ROOT / "tests" / "data" / "aeron-captures"', TESTS_FILE),
    ],
)
def test_the_checker_lets_legitimate_lines_pass(line: str, path: PurePosixPath) -> None:
    assert violations(f"x = 1\n{line}\n", path) == []


# ---- the data the tests need is in the repository --------------------------------------------


def test_the_reference_captures_are_in_the_repository() -> None:
    folder = captures_dir()
    assert folder.is_relative_to(ROOT), folder
    assert folder == ROOT / "tests" / "data" / "aeron-captures"
    readme = (folder / "README.md").read_text()
    assert "Aeron C media driver 1.47.3" in readme
    for name in CAPTURE_NAMES:
        assert (folder / f"{name}.pcapng").stat().st_size > 10_000, name
        assert (folder / f"{name}.txt").stat().st_size > 10_000, name
        assert f"{name}.pcapng" in readme, name


def test_the_reference_captures_are_tracked_and_not_ignored() -> None:
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing can be ignored")
    folder = "tests/data/aeron-captures"
    names = sorted(
        [f"{folder}/README.md"]
        + [f"{folder}/{n}.{ext}" for n in CAPTURE_NAMES for ext in ("pcapng", "txt")]
    )
    tracked = subprocess.run(
        [git, "ls-files", "--", folder], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert sorted(tracked) == names
    ignored = subprocess.run(
        [git, "check-ignore", "--no-index", "--", *names],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert ignored.returncode == 1 and ignored.stdout == "", ignored.stdout
