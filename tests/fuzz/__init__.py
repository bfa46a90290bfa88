"""Fuzzing echo: coverage-guided harnesses for every parser of untrusted bytes, and a fuzzer of
a running server's ports.

- `tests.fuzz.harnesses`: one ``harness(data: bytes) -> None`` per parser; each asserts the
  parser's contract (a value or its documented error, never another exception; what decodes
  re-encodes to the same value).
- `tests.fuzz.corpus`: writes the committed seed corpus, ``tests/fuzz/corpus/<name>/``.
- ``python -m tests.fuzz [NAME ...] [--runs N | --seconds S]`` (``./dev fuzz``): runs them
  with atheris (libFuzzer), each in its own process; `tests/fuzz/test_harnesses.py` runs each
  for a short fixed budget in the test suite.
- `tests.fuzz.network`: random and mutated Aeron frames sent to a running echo-server.

Nothing here imports echo at package import time: atheris instruments echo's modules only if
they are first imported after it starts (`tests.fuzz.run`).
"""
