"""Secrets are compared in constant time: no `==` / `!=` / `in` on a MAC, tag, proof, secret,
key or fingerprint in the modules that handle them (`hmac.compare_digest` instead)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import echo.session

SESSION = Path(echo.session.__file__).parent
MODULES = ["crypto.py", "keywire.py", "resume.py", "admission.py", "machine.py"]
SECRET = re.compile(r"(tag|mac|proof|secret|fingerprint|confirm|public|shared|key)s?$", re.I)
#: names that match but hold no secret (a count, a flag, an id)
NOT_SECRET = {"key_refusals", "hello_key", "client_key", "connect_key", "resume_counter"}
#: admission.py: `key` and `owner_key` are per-address keys (an IP or an IPv6 prefix)
ADDRESS_KEYS = {"key", "owner_key"}


def _names(node: ast.AST) -> list[str]:
    found = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            found.append(sub.id)
        elif isinstance(sub, ast.Attribute):
            found.append(sub.attr)
    return found


def secret_comparisons(source: str, exempt: frozenset[str] = frozenset()) -> list[str]:
    problems = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        if not any(isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn) for op in node.ops):
            continue
        operands = [node.left, *node.comparators]
        # Comparing with a constant (None, a length) or a length of something is not secret.
        if any(isinstance(o, ast.Constant) for o in operands):
            continue
        if any(isinstance(o, ast.Call) and getattr(o.func, "id", "") == "len" for o in operands):
            continue
        names = [n for o in operands for n in _names(o)]
        hits = [n for n in names if SECRET.search(n) and n not in NOT_SECRET and n not in exempt]
        if hits:
            problems.append(f"line {node.lineno}: {ast.unparse(node)}")
    return problems


@pytest.mark.parametrize("module", MODULES)
def test_no_secret_is_compared_with_eq(module: str) -> None:
    exempt = frozenset(ADDRESS_KEYS) if module == "admission.py" else frozenset()
    assert secret_comparisons((SESSION / module).read_text(), exempt) == []


def test_the_check_finds_what_it_should() -> None:
    assert secret_comparisons("ok = tag == expected_tag\n") != []
    assert secret_comparisons("ok = proof != mine\n") != []
    assert secret_comparisons("ok = self.pin.fingerprint == fingerprint(public)\n") != []
    assert secret_comparisons("ok = hmac.compare_digest(tag, expected_tag)\n") == []
    assert secret_comparisons("ok = len(tag) == 16\n") == []
    assert secret_comparisons("ok = key == other\n") != []
    assert secret_comparisons("ok = key == other\n", frozenset(ADDRESS_KEYS)) == []
