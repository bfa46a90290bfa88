"""The transport's shape rules (docs/architecture.md, Conventions), kept true: no module in
echo/transport (its sub-packages included) over 600 lines, no function or method over 60 lines
of code (its docstring, comments and blank lines aside), and `api.py` touches no private member
of the driver or the core (only its own)."""

from __future__ import annotations

import ast
from pathlib import Path

import echo.transport

PACKAGE = Path(echo.transport.__file__).parent
MODULES = sorted(PACKAGE.rglob("*.py"))
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60


def test_the_package_has_its_modules() -> None:
    # The public api on top, the pure core and the trio driver in sub-packages of their own.
    names = {path.relative_to(PACKAGE).as_posix() for path in MODULES}
    assert {
        "api.py",
        "driver/loop.py",
        "core/frames.py",
        "core/publication.py",
        "core/image.py",
    } <= names


def test_no_module_is_over_600_lines() -> None:
    sizes = {
        path.relative_to(PACKAGE).as_posix(): len(path.read_text().splitlines())
        for path in MODULES
    }
    assert {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES} == {}


def _code_lines(node: ast.FunctionDef | ast.AsyncFunctionDef, source: list[str]) -> int:
    """Lines of `node` that hold code: not blank, not only a comment, not its docstring."""
    assert node.end_lineno is not None
    skip: set[int] = set()
    first = node.body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        assert first.end_lineno is not None
        skip = set(range(first.lineno, first.end_lineno + 1))
    lines = range(node.lineno, node.end_lineno + 1)
    return sum(
        1
        for n in lines
        if n not in skip and source[n - 1].strip() and not source[n - 1].strip().startswith("#")
    )


def test_no_function_is_over_60_lines_of_code() -> None:
    long: dict[str, int] = {}
    for path in MODULES:
        text = path.read_text()
        source = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = _code_lines(node, source)
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(PACKAGE).as_posix()}:{node.name}"] = lines
    assert long == {}


def test_code_lines_leave_out_the_docstring_comments_and_blank_lines() -> None:
    text = '''def f():
    """Doc
    string."""
    # a comment

    x = 1
    return x
'''
    node = ast.parse(text).body[0]
    assert isinstance(node, ast.FunctionDef)
    assert _code_lines(node, text.splitlines()) == 3  # def, x = 1, return


def test_the_api_touches_no_private_member_but_its_own() -> None:
    # `self._x` (its own state) and `other._x` where `other` is an api object of the same
    # module are fine; `x._y` on anything else (driver, channel, core) is not.
    tree = ast.parse((PACKAGE / "api.py").read_text())
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        ):
            found.append(f"{ast.unparse(node)} (line {node.lineno})")
    assert found == []
