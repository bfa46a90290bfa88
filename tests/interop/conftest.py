from __future__ import annotations

from pathlib import Path

import pytest

from tests.interop.aeron import compile_peer


@pytest.fixture(scope="session")
def aeron_classpath(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The real Java Aeron 1.15.1 and the compiled peer program (fails loudly if absent)."""
    return compile_peer(Path(tmp_path_factory.mktemp("echo-interop-classes")))
