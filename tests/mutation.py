"""Mutation testing of the pure cores (mutmut), module by module, with kill rates.

    python -m tests.mutation [MODULE | GROUP ...]     # ./dev mutate [MODULE | GROUP ...]

The modules come in groups, each with the fast unit tests its mutants may run: `transport`
(the transport's pure modules: `[tool.mutmut]` in pyproject.toml) and one group per table
`[tool.echo-mutate.GROUP]` (`only_mutate`, `tests`): `session` (with its crypto), `tickets`,
`channels`, `topics`, `lobby`, `lobby-protocol`. A group has a test selection of its own
because mutmut runs the whole selection once to learn which tests reach which function, and a
change of selection throws away every earlier verdict: one shared selection would make a
lobby mutant wait on the transport's tests and the other way round.

MODULE is a name (`frames`), a dotted name or a path (`echo/transport/core/frames.py`); GROUP is a
group's name (every module in it); none means every module of every group. mutmut works in
`.mutation/GROUP/` (git-ignored), a scratch directory that links to the sources and the tests
(which hold the reference captures the codec tests read), so its copy of the tree never lands
in the checkout. Results are kept there between runs: mutmut re-checks only mutants of
functions that changed.

`--recheck` runs only the mutants that were not killed last time (after new tests were
written, say): a killed mutant stays killed when tests are added, so its earlier verdict is
carried over, provided its module's source has not changed since (mutmut names mutants by
function and number; an edited module gets a full run instead).

`--sample N` checks at most N mutants of each module, drawn with a seeded generator
(`--seed`, 0 by default; the same seed and source give the same sample, so `--recheck` after
new tests re-runs the same draw): for the lobby's and channels' big modules, whose full runs
take hours on a shared machine. The rate is then killed over checked in the sample, and the
summary says how many of how many were drawn.

An equivalent mutant (one no test can kill, because the program does the same with it) is
marked in its group's `equivalent` table in pyproject.toml, mutant name = one-line reason:
it is left out of the rate and listed apart with its reason. A mark on a mutant that was
killed or no longer exists (its function changed) is reported, so that it can go.

`--report` runs nothing: it prints the rates and survivors of the last run (of the same
draw, given the same `--sample` and `--seed`), while a run is still going for instance.

A module in which mutmut finds nothing to mutate (it mutates the bodies of functions and
methods only: a module of enums, attrs records and constants has no mutant) is listed as such,
without a rate; it is never handed to mutmut alone, which would stop with "could not find any
test case for any mutant" (the lobby protocol's first modules are such).

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
import random
import re
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRATCH = ROOT / ".mutation"
KILLED = {"killed", "timeout", "caught by type check"}
NOT_COUNTED = {"not checked", "skipped"}
_RESULT = re.compile(r"^\s+(\S+): (.+)$")


def groups() -> dict[str, tuple[list[str], list[str]]]:
    """Each group's name: the modules it mutates (dotted) and the tests they may run."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]
    found = {
        "transport": (
            tool["mutmut"]["only_mutate"],
            tool["mutmut"]["pytest_add_cli_args_test_selection"],
        )
    }
    for name, group in tool.get("echo-mutate", {}).items():
        found[name] = (group["only_mutate"], group["tests"])
    return {
        name: ([path.removesuffix(".py").replace("/", ".") for path in paths], tests)
        for name, (paths, tests) in found.items()
    }


def equivalent_mutants() -> dict[str, str]:
    """Every mutant marked equivalent (`[tool.echo-mutate.GROUP.equivalent]`): its reason."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]
    marked: dict[str, str] = {}
    for group in tool.get("echo-mutate", {}).values():
        marked.update(group.get("equivalent", {}))
    return marked


def configured_modules() -> list[str]:
    return [module for modules, _ in groups().values() for module in modules]


def group_of(module: str) -> str:
    return next(name for name, (modules, _) in groups().items() if module in modules)


def module_names(text: str, known: list[str]) -> list[str]:
    if text in groups():
        return groups()[text][0]
    name = text.removesuffix(".py").replace("/", ".").strip(".")
    for candidate in known:
        if candidate == name or candidate.endswith("." + name):
            return [candidate]
    raise SystemExit(
        f"{text}: not a group ({', '.join(groups())}) nor one of the mutated modules"
        f" ({', '.join(known)})"
    )


def _toml_list(items: list[str]) -> str:
    return "[\n" + "".join(f"    {json.dumps(item)},\n" for item in items) + "]"


def group_pyproject(group: str, modules: list[str] | None = None) -> str:
    """pyproject.toml with `[tool.mutmut]` naming this group's tests and its modules (or just
    `modules` of it: mutmut mutates every module it names before running any mutant, which
    takes minutes for the lobby's big modules; which modules it names changes no verdict)."""
    text = (ROOT / "pyproject.toml").read_text()
    start = text.index("\n[tool.mutmut]\n")
    end = text.find("\n[", start + 1)
    original = tomllib.loads(text)["tool"]["mutmut"]
    everything, tests = groups()[group]
    modules = everything if modules is None else modules
    table = [
        "[tool.mutmut]",
        f"source_paths = {json.dumps(original['source_paths'])}",
        "only_mutate = " + _toml_list([m.replace(".", "/") + ".py" for m in modules]),
        # the Hypothesis profile of tests/conftest.py: no deadline, the same examples each run
        "pytest_add_cli_args = "
        + json.dumps([*original["pytest_add_cli_args"], "--hypothesis-profile=mutation"]),
        "pytest_add_cli_args_test_selection = " + _toml_list(tests),
        "use_git_change_detection = false",
        'also_copy = ["examples"]',
    ]
    scratch = text[:start] + "\n" + "\n".join(table) + "\n" + (text[end:] if end > 0 else "")
    return _without_groups(scratch)


def _without_groups(text: str) -> str:
    """`text` without its `[tool.echo-mutate.*]` tables. mutmut forgets every verdict when its
    pyproject.toml changes at all: a mark of equivalence, or a test added to another group,
    would otherwise throw away a group's results (a run of hours for the lobby). The group's
    own tests are in its `[tool.mutmut]` already."""
    kept: list[str] = []
    skipping = False
    for line in text.splitlines(keepends=True):
        if line.startswith("["):
            skipping = line.startswith("[tool.echo-mutate")
        if not skipping:
            kept.append(line)
    return "".join(kept)


def prepare(group: str) -> Path:
    """The scratch directory mutmut runs a group in, linked to the current sources and tests."""
    work = SCRATCH / group
    work.mkdir(parents=True, exist_ok=True)
    (work / "pyproject.toml").write_text(group_pyproject(group))
    # examples/: the identity tests take their tokens from the example backend
    links = {"echo": ROOT / "echo", "tests": ROOT / "tests", "examples": ROOT / "examples"}
    for name, target in links.items():
        link = work / name
        if link.is_symlink() and link.resolve() == target.resolve():
            continue
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
    # A compiled module would be imported instead of its mutated source: none may be copied.
    if list((ROOT / "echo").rglob("*.so")):
        raise SystemExit("compiled extensions in echo/: run ./dev clean first")
    for stale in (work / "mutants").rglob("*.so") if (work / "mutants").exists() else ():
        stale.unlink()
    # mutmut copies every source into mutants/ and mutates only those in only_mutate, then
    # regenerates a copy only when its source is newer: a module added to only_mutate later
    # kept its plain copy and was never mutated ("nothing matches"). A copy without the
    # .meta that mutating writes is such a copy: remove it, so that it is made again.
    # Its record of which tests reach which functions (mutmut-stats.json) predates that
    # module too, so every mutant of it would be "no tests": that record goes as well.
    # A copy that has its .meta but no mutants is one that mutmut wrote over with the plain
    # source while it mutated only other modules (an older ./dev mutate, or an interrupted
    # run): both go. Not so a module that has no mutants at all (`_nothing_to_mutate`): its
    # copy is always plain, and its .meta is the record that it has none.
    for module in groups()[group][0]:
        copy = work / "mutants" / (module.replace(".", "/") + ".py")
        meta = copy.with_name(copy.name + ".meta")
        if (
            meta.exists()
            and copy.exists()
            and "__mutmut_" not in copy.read_text()
            and not _nothing_to_mutate(work, module)
        ):
            meta.unlink()
        if copy.exists() and not meta.exists():
            copy.unlink()
            (work / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)
    # The same record is not updated when a test changes: a survivor that a new or changed
    # test now reaches would be rechecked against the old tests only (reported surviving).
    # It goes whenever a test file is newer than it; mutmut measures it again.
    stats = work / "mutants" / "mutmut-stats.json"
    if stats.exists():
        made = stats.stat().st_mtime
        if any(test.stat().st_mtime > made for test in (ROOT / "tests").rglob("*.py")):
            stats.unlink()
    return work


def _mutated(work: Path, module: str) -> bool:
    return (work / "mutants" / (module.replace(".", "/") + ".py.meta")).exists()


def _nothing_to_mutate(work: Path, module: str) -> bool:
    """Whether mutmut, mutating `module` from its current source, found nothing to mutate.

    mutmut mutates the bodies of functions and methods only (not module-level code, class
    bodies, nor decorated functions such as properties): a module of declarations (enums,
    attrs records, constants: the lobby protocol's `records`, `requests`, `replies`,
    `updates`) has no mutant. mutmut still writes its .meta, with no mutant in it."""
    meta = work / "mutants" / (module.replace(".", "/") + ".py.meta")
    source = ROOT / (module.replace(".", "/") + ".py")
    if not meta.exists() or source.stat().st_mtime > meta.stat().st_mtime:
        return False  # not mutated yet, or edited since: it may have mutants now
    return not json.loads(meta.read_text())["exit_code_by_key"]


#: the modules mutmut found nothing to mutate in (reported apart, not as a rate of 0)
EMPTY: set[str] = set()


def configure(work: Path, group: str, modules: list[str] | None = None) -> None:
    (work / "pyproject.toml").write_text(group_pyproject(group, modules))


def mutmut(work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    executable = Path(sys.executable).with_name("mutmut")
    return subprocess.run(
        [str(executable), *args], cwd=work, text=True, capture_output=True, check=False
    )


_NOTHING = "__echo_generate_only__"


def _all_mutants(work: Path, group: str, module: str, jobs: int) -> list[str]:
    """Every mutant of `module`, generating them first if need be (a run whose filter matches
    no mutant makes mutmut generate the mutants and measure the tests, then stop)."""
    meta = work / "mutants" / (module.replace(".", "/") + ".py.meta")
    source = ROOT / (module.replace(".", "/") + ".py")
    edited = meta.exists() and source.stat().st_mtime > meta.stat().st_mtime
    if edited and not json.loads(meta.read_text())["exit_code_by_key"]:
        meta.unlink()  # it had no mutant, and has been edited since: mutated again below
    if not meta.exists():
        # A plain copy of it (written while another module of the group ran) is newer than its
        # source, so mutmut would keep it unmutated ("0 files mutated") and match nothing: it
        # goes, and with it the record of which tests reach which functions, which predates it.
        (work / "mutants" / (module.replace(".", "/") + ".py")).unlink(missing_ok=True)
        (work / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)
    elif not edited:
        names: dict[str, object] = json.loads(meta.read_text())["exit_code_by_key"]
        return sorted(names)
    # Made now, or again for a module edited since (mutmut keeps the verdicts of the functions
    # that did not change): a sample drawn from the old names would hold mutants that are gone.
    configure(work, group, [m for m in groups()[group][0] if m == module or _mutated(work, m)])
    done = mutmut(work, "run", "--max-children", str(jobs), f"{module}.{_NOTHING}")
    if _nothing_to_mutate(work, module):
        # Without a mutated module beside it, mutmut stops here with "could not find any test
        # case for any mutant" (no function for a test to reach): not a failure.
        return []
    if "nothing matches" not in done.stdout + done.stderr or not meta.exists():
        raise SystemExit(
            f"{module}: generating its mutants failed\n{done.stdout[-4000:]}{done.stderr[-4000:]}"
        )
    return sorted(json.loads(meta.read_text())["exit_code_by_key"])


def sample(names: list[str], size: int, seed: int, module: str) -> list[str]:
    """At most `size` of `names`, the same for the same seed, module and names."""
    if len(names) <= size:
        return names
    return sorted(random.Random(f"{seed}:{module}").sample(sorted(names), size))


def _source_hashes(modules: list[str]) -> dict[str, str]:
    return {
        m: hashlib.sha256((ROOT / (m.replace(".", "/") + ".py")).read_bytes()).hexdigest()
        for m in modules
    }


def _previous_hashes(work: Path) -> dict[str, str]:
    try:
        saved: dict[str, str] = json.loads((work / "sources.json").read_text())
    except (OSError, ValueError):
        return {}
    return saved


def _save_hashes(work: Path, sources: dict[str, str]) -> None:
    # Written once a run is through: the sources that the results in mutants/ were made from.
    (work / "sources.json").write_text(json.dumps({**_previous_hashes(work), **sources}))


def results(work: Path) -> dict[str, str]:
    done = mutmut(work, "results", "--all", "true")
    if done.returncode:
        raise SystemExit(done.stdout + done.stderr)
    found = {}
    for line in done.stdout.splitlines():
        match = _RESULT.match(line)
        if match:
            found[match.group(1)] = match.group(2)
    return found


#: module: (the mutants drawn, how many it has in all), for the modules run with --sample
SAMPLED: dict[str, tuple[set[str], int]] = {}


def run_group(
    group: str, modules: list[str], args: argparse.Namespace
) -> tuple[dict[str, str], bool]:
    """Runs mutmut on the group's modules, one at a time: every mutant's status, and whether
    mutmut itself failed."""
    work = prepare(group)
    before = results(work) if args.recheck and (work / "mutants").exists() else {}
    sources = _source_hashes(modules)
    previous = _previous_hashes(work)
    failed = False
    for module in modules:
        # Its mutants made first (if not yet): handing mutmut a module with none to mutate, or
        # an empty list of names (which means every mutant), would go wrong.
        everything = _all_mutants(work, group, module, args.jobs)
        if not everything:
            EMPTY.add(module)
            print(f"==> mutmut: {module} (nothing to mutate)", file=sys.stderr, flush=True)
            continue
        targets = [f"{module}.*"]
        if args.sample is not None:
            targets = sample(everything, args.sample, args.seed, module)
            SAMPLED[module] = (set(targets), len(everything))
        if before and previous.get(module) == sources[module]:
            targets = [
                name
                for name, status in before.items()
                if name.startswith(module + ".")
                and status not in KILLED
                and (args.sample is None or name in targets)
            ]
            if not targets:
                continue
        print(f"==> mutmut: {module} ({len(targets)} targets)", file=sys.stderr, flush=True)
        if not _mutated(work, module):
            # not mutated yet: its plain copy (made while another module ran) goes, and with
            # it the record of which tests reach which functions, which predates its mutants
            (work / "mutants" / (module.replace(".", "/") + ".py")).unlink(missing_ok=True)
            (work / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)
        # mutmut writes a plain copy over every module it is not told to mutate: the group's
        # modules mutated already stay named (mutmut finds them unchanged), the rest wait
        configure(work, group, [m for m in groups()[group][0] if m == module or _mutated(work, m)])
        done = mutmut(work, "run", "--max-children", str(args.jobs), *targets)
        if list((work / "mutants").rglob("*.so")):
            # Built while mutmut copied the tree: the mutants may have run compiled code.
            raise SystemExit(f"{module}: extension files reached {work}/mutants; run again")
        if done.returncode:
            print(done.stdout[-4000:] + done.stderr[-4000:], file=sys.stderr)
            failed = True
    configure(work, group)
    _save_hashes(work, sources)
    statuses = results(work)
    for name, status in before.items():
        module = name.split(".x")[0]
        if (
            status in KILLED
            and statuses.get(name) == "not checked"
            and (previous.get(module) == sources.get(module))
        ):
            statuses[name] = status  # carried over: killed by the earlier, smaller test set
    for name in statuses:
        module = name.split(".x")[0]
        if module in SAMPLED and name not in SAMPLED[module][0]:
            statuses[name] = "not checked"  # not drawn: an earlier run's verdict is not mixed in
    return statuses, failed


def report(modules: list[str], statuses: dict[str, str], min_rate: float | None) -> bool:
    """Prints each module's rate (equivalent mutants left out); whether one is below min_rate."""
    below = False
    print(f"\n{'module':<34} {'killed':>7} {'checked':>8} {'rate':>7}  other")
    for module in modules:
        if module in EMPTY:
            print(f"{module:<34} {'-':>7} {'-':>8} {'-':>7}  nothing to mutate (declarations)")
            continue
        mine = {k: v for k, v in statuses.items() if k.startswith(module + ".")}
        counts = Counter(mine.values())
        checked = sum(
            n for status, n in counts.items() if status not in NOT_COUNTED | {"equivalent"}
        )
        killed = sum(n for status, n in counts.items() if status in KILLED)
        rate = 100.0 * killed / checked if checked else 0.0
        other = [f"{n} {s}" for s, n in sorted(counts.items()) if s not in KILLED]
        if module in SAMPLED:
            drawn, total = SAMPLED[module]
            other.append(f"sample of {len(drawn)} / {total}")
        print(f"{module:<34} {killed:>7} {checked:>8} {rate:>6.1f}%  {', '.join(other)}")
        if min_rate is not None and rate < min_rate:
            below = True
    return below


def report_marks(modules: list[str], statuses: dict[str, str], marked: dict[str, str]) -> None:
    """Lists the equivalent mutants with their reasons, and the marks that should go."""
    mine = [n for n in sorted(marked) if any(n.startswith(m + ".") for m in modules)]
    equivalent = [n for n in mine if statuses.get(n) == "equivalent"]
    if equivalent:
        print(f"\n{len(equivalent)} equivalent mutants (marked in pyproject.toml):")
        for name in equivalent:
            print(f"  {name}: {marked[name]}")
    stale = [
        f"  {n}: {'killed' if statuses[n] in KILLED else 'no such mutant now'}"
        for n in mine
        if n not in statuses or statuses[n] in KILLED
    ]
    if stale:
        print(f"\n{len(stale)} marks of equivalence to remove:")
        print("\n".join(stale))


def last_results(group: str, modules: list[str], args: argparse.Namespace) -> dict[str, str]:
    """The statuses of the last run, without running anything (--report); with --sample, of
    the same draw (a module never run has no mutants yet: nothing is reported for it)."""
    work = SCRATCH / group
    if not (work / "mutants").exists():
        return {}
    statuses = results(work)
    for module in modules:
        meta = work / "mutants" / (module.replace(".", "/") + ".py.meta")
        if _nothing_to_mutate(work, module):
            EMPTY.add(module)
        if args.sample is not None and meta.exists():
            everything = sorted(json.loads(meta.read_text())["exit_code_by_key"])
            SAMPLED[module] = (
                set(sample(everything, args.sample, args.seed, module)),
                len(everything),
            )
    for name in statuses:
        module = name.split(".x")[0]
        if module in SAMPLED and name not in SAMPLED[module][0]:
            statuses[name] = "not checked"
    return statuses


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help="modules or groups (default: all)")
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("MUTATE_JOBS", "1")))
    parser.add_argument("--min-rate", type=float, default=None, help="per cent")
    parser.add_argument("--quiet", action="store_true", help="no survivor diffs")
    parser.add_argument("--recheck", action="store_true", help="only last run's survivors")
    parser.add_argument("--sample", type=int, default=None, help="at most N mutants a module")
    parser.add_argument("--seed", type=int, default=0, help="the draw of --sample")
    parser.add_argument("--report", action="store_true", help="the last run's rates, no run")
    args = parser.parse_args()
    if args.sample is not None and args.sample < 1:
        parser.error("--sample must be at least 1")
    known = configured_modules()
    chosen = [m for text in args.modules for m in module_names(text, known)] or known
    modules = list(dict.fromkeys(chosen))
    statuses: dict[str, str] = {}
    failed = False
    works: dict[str, Path] = {}
    for group in groups():
        wanted = [m for m in modules if group_of(m) == group]
        if wanted and args.report:
            statuses.update(last_results(group, wanted, args))
            works[group] = SCRATCH / group
        elif wanted:
            found, group_failed = run_group(group, wanted, args)
            statuses.update(found)
            failed = failed or group_failed
            works[group] = SCRATCH / group
    marked = equivalent_mutants()
    for name, status in statuses.items():
        if name in marked and status not in KILLED | NOT_COUNTED:
            statuses[name] = "equivalent"
    below = report(modules, statuses, args.min_rate)
    survivors = [
        name
        for name, status in sorted(statuses.items())
        if status not in KILLED | NOT_COUNTED | {"equivalent"}
        and any(name.startswith(m + ".") for m in modules)
    ]
    if survivors:
        print(f"\n{len(survivors)} surviving mutants:")
    for name in survivors:
        print(f"  {name}: {statuses[name]}")
        if not args.quiet:
            module = next(m for m in modules if name.startswith(m + "."))
            shown = mutmut(works[group_of(module)], "show", name).stdout
            print("    " + "\n    ".join(shown.splitlines()[1:]))
    report_marks(modules, statuses, marked)
    return 1 if failed or below else 0


if __name__ == "__main__":
    sys.exit(main())
