"""Secrets are compared in constant time: no ``==``, ``!=`` or ``in`` on a MAC, tag, digest,
signature, secret, cookie, token or proof anywhere in echo/ (`hmac.compare_digest` instead).

An early-exit comparison tells a forger, by how long the refusal took, how many leading bytes
of its guess were right; byte by byte, it then needs a few thousand tries instead of 2**128.
The scan reads every module's syntax tree: a comparison is flagged when one of its operands
(for ``in``: the element looked for) is named like a secret, unless the other side is a
literal or a module constant (``tag == _TAG_STR``: comparing with a public value reveals
nothing). What is not a secret despite its name is listed in `NOT_SECRETS`, with why.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ECHO = Path(__file__).resolve().parents[1] / "echo"
#: name parts that make an operand a secret (plurals too: ``tags``, ``secrets``)
SECRET_WORDS = frozenset(
    {"mac", "hmac", "tag", "digest", "hexdigest", "signature", "secret", "cookie", "token", "proof"}
)
#: (module, the comparison as ast.unparse writes it) -> why it compares no secret
NOT_SECRETS = {
    ("echo/transport/core/flow_control.py", "sm.group_tag == self.group_tag"): (
        "Aeron's receiver group tag: a public label every SM carries in the clear"
    ),
}
_CONSTANT_NAME = re.compile(r"_?[A-Z][A-Z0-9_]*")


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):
        return _name(node.value)
    if isinstance(node, ast.Call):
        return _name(node.func)
    return None


def names_a_secret(node: ast.expr) -> bool:
    name = _name(node)
    if name is None:
        return False
    parts = {part.lower() for part in re.split(r"_+|(?<=[a-z])(?=[A-Z])", name) if part}
    return any(part in SECRET_WORDS or part.removesuffix("s") in SECRET_WORDS for part in parts)


def is_public(node: ast.expr) -> bool:
    """A literal (or a tuple of them), None, or a module constant (UPPER_CASE)."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Tuple):
        return all(is_public(e) for e in node.elts)
    name = _name(node)
    return isinstance(node, ast.Name | ast.Attribute) and bool(
        name and _CONSTANT_NAME.fullmatch(name)
    )


def secret_comparisons(source: str) -> list[tuple[int, str]]:
    """(line, comparison) for every early-exit comparison of a secret in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for op, left, right in zip(node.ops, operands[:-1], operands[1:], strict=True):
            if isinstance(op, ast.Eq | ast.NotEq):
                flagged = (names_a_secret(left) or names_a_secret(right)) and not (
                    is_public(left) or is_public(right)
                )
            elif isinstance(op, ast.In | ast.NotIn):
                flagged = names_a_secret(left)
            else:
                continue
            if flagged:
                found.append((node.lineno, ast.unparse(node)))
                break
    return found


def test_no_secret_is_compared_with_an_early_exit_comparison() -> None:
    found = []
    for path in sorted(ECHO.rglob("*.py")):
        module = path.relative_to(ECHO.parent).as_posix()
        for line, text in secret_comparisons(path.read_text(encoding="utf-8")):
            if (module, text) not in NOT_SECRETS:
                found.append(f"{module}:{line}: {text}")
    assert not found, "compare these with hmac.compare_digest:\n" + "\n".join(found)


def test_every_exemption_is_still_needed() -> None:
    for module, text in NOT_SECRETS:
        found = [t for _, t in secret_comparisons((ECHO.parent / module).read_text())]
        assert text in found, f"{module}: {text!r} is gone: drop it from NOT_SECRETS"


@pytest.mark.parametrize(
    "source",
    [
        "if mac != expected: pass",
        "ok = received_tag == tag",
        "ok = hmac.new(k, m, h).digest() == given",
        "ok = signature[:16] == other",
        "ok = self.secret == secret",
        "ok = cookie in (a, b)",
        "ok = token not in seen",
        "ok = proof == make_proof(s)",
        "ok = a == b.hexdigest()",
        "ok = seat.tags == tags",
        "ok = sessionToken == t",
    ],
)
def test_the_scan_finds_a_secret_compared_early_exit(source: str) -> None:
    assert secret_comparisons(source), source


@pytest.mark.parametrize(
    "source",
    [
        "ok = hmac.compare_digest(mac, expected)",
        "ok = tag == _TAG_STR",
        "ok = cookie == (0, 0)",
        "ok = secret is None",
        "ok = len(tag) != 17",
        "ok = member_id in copy_tags",
        "ok = tokens < 1.0",
        "ok = machine == other",
    ],
)
def test_the_scan_passes_constant_time_and_public_comparisons(source: str) -> None:
    assert not secret_comparisons(source), source
