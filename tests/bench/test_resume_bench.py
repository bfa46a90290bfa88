"""bench/resume_bench.py on real processes: a killed `echo-lobby-client` started again with its
state file takes its seat back, a library member takes its seat back with its token, and a
lobby whose only member was killed leaves search. Functional, not timed: every figure must be
measured (the bench raises if a step never happens), none may be negative, and the ghost
lobby must stay listed until its member's silence is noticed."""

from __future__ import annotations

from bench.resume_bench import GHOST_BOUND_MS, SPAN, figures, measure
from tests.ports import free_base


def test_one_repeat_measures_every_figure() -> None:
    [run] = measure(1, bases=lambda: free_base(SPAN))
    assert set(run) == {
        "resume_process_printed",
        "resume_process_seen",
        "import_floor",
        "resume_library",
        "join_library",
        "ghost",
    }
    assert all(v > 0 for v in run.values())
    # Seen by the owner no earlier than the new process said it was back in its seat.
    assert run["resume_process_seen"] >= run["resume_process_printed"]
    # Not listed until the server noticed the silence: a member's liveness, less the heartbeat
    # interval at most (the kill may come just before a heartbeat was due).
    assert run["ghost"] > GHOST_BOUND_MS - 1000
    assert {key[0] for key in figures(run)} >= {"resume_process", "resume_library", "ghost_lobby"}
