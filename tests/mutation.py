"""Mutation testing of the transport's pure modules (mutmut), module by module, with kill rates.

    python -m tests.mutation [MODULE ...]     # ./dev mutate [MODULE ...]

MODULE is a name (`frames`), a dotted name or a path (`echo/transport/frames.py`); none means
every module of `[tool.mutmut] only_mutate` in pyproject.toml, which also names the fast unit
tests mutmut may run. mutmut works in `.mutation/` (git-ignored), a scratch directory that links
to the sources and the tests (which hold the reference captures the codec tests read), so its
copy of the tree never lands in the checkout. Results are kept there between
runs: mutmut re-checks only mutants of functions that changed.

`--recheck` runs only the mutants that were not killed last time (after new tests were
written, say): a killed mutant stays killed when tests are added, so its earlier verdict is
carried over, provided its module's source has not changed since (mutmut names mutants by
function and number; an edited module gets a full run instead).

Prints, per module, the mutants killed out of those checked and the rate, then every survivor
with its diff. A timeout counts as killed (the mutant hung the tests); "no tests" (no selected
test runs that function) counts as survived. Exit status 0 unless mutmut itself failed, or
`--min-rate` is given and a module is below it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / ".mutation"
KILLED = {"killed", "timeout", "caught by type check"}
NOT_COUNTED = {"not checked", "skipped"}
_RESULT = re.compile(r"^\s+(\S+): (.+)$")


def configured_modules() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    return [path.removesuffix(".py").replace("/", ".") for path in config["only_mutate"]]


def module_name(text: str, known: list[str]) -> str:
    name = text.removesuffix(".py").replace("/", ".").strip(".")
    for candidate in known:
        if candidate == name or candidate.endswith("." + name):
            return candidate
    raise SystemExit(f"{text}: not one of the mutated modules ({', '.join(known)})")


def prepare() -> None:
    """The scratch directory mutmut runs in, linked to the current sources and tests."""
    WORK.mkdir(exist_ok=True)
    shutil.copy(ROOT / "pyproject.toml", WORK / "pyproject.toml")
    links = {"echo": ROOT / "echo", "tests": ROOT / "tests"}
    for name, target in links.items():
        link = WORK / name
        if link.is_symlink() and link.resolve() == target.resolve():
            continue
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
    # A compiled module would be imported instead of its mutated source: none may be copied.
    if list((ROOT / "echo").rglob("*.so")):
        raise SystemExit("compiled extensions in echo/: run ./dev clean first")
    for stale in (WORK / "mutants").rglob("*.so") if (WORK / "mutants").exists() else ():
        stale.unlink()
    # mutmut copies every source into mutants/ and mutates only those in only_mutate, then
    # regenerates a copy only when its source is newer: a module added to only_mutate later
    # kept its plain copy and was never mutated ("nothing matches"). A copy without the
    # .meta that mutating writes is such a copy: remove it, so that it is made again.
    # Its record of which tests reach which functions (mutmut-stats.json) predates that
    # module too, so every mutant of it would be "no tests": that record goes as well.
    for module in configured_modules():
        copy = WORK / "mutants" / (module.replace(".", "/") + ".py")
        if copy.exists() and not copy.with_name(copy.name + ".meta").exists():
            copy.unlink()
            (WORK / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)
    # The same record is not updated when a test changes: a survivor that a new or changed
    # test now reaches would be rechecked against the old tests only (reported surviving).
    # It goes whenever a test file is newer than it; mutmut measures it again.
    stats = WORK / "mutants" / "mutmut-stats.json"
    if stats.exists():
        made = stats.stat().st_mtime
        if any(test.stat().st_mtime > made for test in (ROOT / "tests").rglob("*.py")):
            stats.unlink()


def mutmut(*args: str) -> subprocess.CompletedProcess[str]:
    executable = Path(sys.executable).with_name("mutmut")
    return subprocess.run(
        [str(executable), *args], cwd=WORK, text=True, capture_output=True, check=False
    )


def _source_hashes(modules: list[str]) -> dict[str, str]:
    return {
        m: hashlib.sha256((ROOT / (m.replace(".", "/") + ".py")).read_bytes()).hexdigest()
        for m in modules
    }


def _previous_hashes() -> dict[str, str]:
    try:
        saved: dict[str, str] = json.loads((WORK / "sources.json").read_text())
    except (OSError, ValueError):
        return {}
    return saved


def _save_hashes(sources: dict[str, str]) -> None:
    # Written once a run is through: the sources that the results in mutants/ were made from.
    (WORK / "sources.json").write_text(json.dumps({**_previous_hashes(), **sources}))


def results() -> dict[str, str]:
    done = mutmut("results", "--all", "true")
    if done.returncode:
        raise SystemExit(done.stdout + done.stderr)
    found = {}
    for line in done.stdout.splitlines():
        match = _RESULT.match(line)
        if match:
            found[match.group(1)] = match.group(2)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*")
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("MUTATE_JOBS", "1")))
    parser.add_argument("--min-rate", type=float, default=None, help="per cent")
    parser.add_argument("--quiet", action="store_true", help="no survivor diffs")
    parser.add_argument("--recheck", action="store_true", help="only last run's survivors")
    args = parser.parse_args()
    known = configured_modules()
    modules = [module_name(m, known) for m in args.modules] or known
    prepare()
    before = results() if args.recheck and (WORK / "mutants").exists() else {}
    sources = _source_hashes(modules)
    previous = _previous_hashes()
    failed = False
    for module in modules:
        targets = [f"{module}.*"]
        if before and previous.get(module) == sources[module]:
            targets = [
                name
                for name, status in before.items()
                if name.startswith(module + ".") and status not in KILLED
            ]
            if not targets:
                continue
        print(f"==> mutmut: {module} ({len(targets)} targets)", file=sys.stderr, flush=True)
        done = mutmut("run", "--max-children", str(args.jobs), *targets)
        if list((WORK / "mutants").rglob("*.so")):
            # Built while mutmut copied the tree: the mutants may have run compiled code.
            raise SystemExit(f"{module}: extension files reached .mutation/mutants; run again")
        if done.returncode:
            print(done.stdout[-4000:] + done.stderr[-4000:], file=sys.stderr)
            failed = True
    _save_hashes(sources)
    statuses = results()
    for name, status in before.items():
        module = name.split(".x")[0]
        if (
            status in KILLED
            and statuses.get(name) == "not checked"
            and (previous.get(module) == sources.get(module))
        ):
            statuses[name] = status  # carried over: killed by the earlier, smaller test set
    below = False
    print(f"\n{'module':<34} {'killed':>7} {'checked':>8} {'rate':>7}  other")
    for module in modules:
        mine = {k: v for k, v in statuses.items() if k.startswith(module + ".")}
        counts = Counter(mine.values())
        checked = sum(n for status, n in counts.items() if status not in NOT_COUNTED)
        killed = sum(n for status, n in counts.items() if status in KILLED)
        rate = 100.0 * killed / checked if checked else 0.0
        other = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()) if s not in KILLED)
        print(f"{module:<34} {killed:>7} {checked:>8} {rate:>6.1f}%  {other}")
        if args.min_rate is not None and rate < args.min_rate:
            below = True
    survivors = [
        name
        for name, status in sorted(statuses.items())
        if status not in KILLED | NOT_COUNTED and any(name.startswith(m + ".") for m in modules)
    ]
    if survivors:
        print(f"\n{len(survivors)} surviving mutants:")
    for name in survivors:
        print(f"  {name}: {statuses[name]}")
        if not args.quiet:
            shown = mutmut("show", name).stdout
            print("    " + "\n    ".join(shown.splitlines()[1:]))
    return 1 if failed or below else 0


if __name__ == "__main__":
    sys.exit(main())
