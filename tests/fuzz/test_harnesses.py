"""The parser fuzzers in the test suite: every harness replays its committed corpus, and runs
under atheris for a short fixed budget from it (the long runs: ``./dev fuzz``, docs/fuzzing.md).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from echo.channels import wire
from echo.lobby import hello
from tests.fuzz import corpus, harnesses, run
from tests.fuzz.registry import COVERS

#: Executions per harness in the suite: a few thousand each, about half a minute in all.
RUNS = 2000


def test_the_registry_the_seeds_and_the_corpus_name_the_same_harnesses() -> None:
    assert list(harnesses.HARNESSES) == list(COVERS) == list(corpus.SEEDS) == run.names()
    on_disk = sorted(p.name for p in corpus.CORPUS.iterdir() if p.is_dir())
    assert on_disk == sorted(COVERS)


def test_the_committed_corpus_is_what_the_encoders_make() -> None:
    # `python -m tests.fuzz.corpus` regenerates it; a stale or hand-edited file shows here.
    for name, expected in corpus.files().items():
        committed = {p.name: p.read_bytes() for p in (corpus.CORPUS / name).iterdir()}
        assert committed == expected, f"run python -m tests.fuzz.corpus ({name})"


@pytest.mark.parametrize("name", list(harnesses.HARNESSES))
def test_every_corpus_input_keeps_the_contract(name: str) -> None:
    files = sorted((corpus.CORPUS / name).iterdir())
    assert files
    for path in files:
        harnesses.HARNESSES[name](path.read_bytes())


def test_a_short_fuzz_run_of_each_harness_finds_nothing() -> None:
    with ThreadPoolExecutor(2) as pool:
        results = list(
            pool.map(
                lambda name: run.run_one(name, runs=RUNS, seconds=None, work=None),
                harnesses.HARNESSES,
            )
        )
    for result in results:
        # A crash prints the input and the traceback (atheris); anything else is the output.
        start = result.output.find("=== Uncaught")
        assert not result.crashed, (result.name, result.output[start if start >= 0 else -3000 :])
        assert result.executions == RUNS, (result.name, result.output[-3000:])


# --- the harnesses can fail: a parser that breaks its contract is caught ---------------------


def test_an_exception_other_than_the_parsers_error_escapes(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(data: bytes) -> hello.Hello:
        raise IndexError("index out of range")

    monkeypatch.setattr(hello, "parse_hello_untrusted", broken)
    with pytest.raises(IndexError):
        harnesses.lobby_hello(b"LOBBY1\x01a\x00\x00")


def test_a_value_that_does_not_round_trip_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    encode = wire.encode
    # An encoder that drops the last payload byte of a DATA frame.
    monkeypatch.setattr(
        wire,
        "encode",
        lambda f: (
            encode(wire.Data(f.channel, f.payload[:-1])) if isinstance(f, wire.Data) else encode(f)
        ),
    )
    with pytest.raises(AssertionError):
        harnesses.channels_wire(wire.encode(wire.Data(0, b"hello")))


def test_every_regression_input_is_in_the_corpus() -> None:
    for name, inputs in corpus.REGRESSIONS.items():
        names = {p.name for p in Path(corpus.CORPUS / name).iterdir()}
        assert all(corpus._name("regression", data) in names for data in inputs)
