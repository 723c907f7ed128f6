"""Errors keep their cause: no ``raise ... from None`` in our code, and the one-line report
shows the chain of causes only on request (``--debug`` / ``BCL_STREAM_DEBUG``).

The command-line side (real processes) is in ``tests/integration/test_cli_user_path.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bcl_stream.errors import DEBUG_ENV, DatasetError, debug_requested, report

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ("bcl_stream", "lightning_module", "bcl_bench", "tools")

ALLOWED_FROM_NONE: dict[str, str] = {}
"""``"path:line" -> why`` for a ``from None`` that must stay. Empty: hiding a cause has never
been needed (an error whose cause is noise can still say so in its message)."""


def raises_from_none(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Raise)
        and isinstance(node.cause, ast.Constant)
        and node.cause.value is None
    ]


def test_no_raise_from_none() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for package in CHECKED
        for path in sorted((ROOT / package).rglob("*.py"))
        for line in raises_from_none(path)
    ]
    left = [where for where in found if where not in ALLOWED_FROM_NONE]
    assert not left, f"chain the cause (`except X as exc: raise ... from exc`) at {left}"


def test_the_checker_sees_from_none(tmp_path: Path) -> None:
    code = "try:\n    pass\nexcept KeyError:\n    raise ValueError('x') from None\n"
    (tmp_path / "m.py").write_text(code)
    assert raises_from_none(tmp_path / "m.py") == [4]


def failing() -> DatasetError:
    try:
        int("seven")
    except ValueError as exc:
        try:
            raise DatasetError("data.jsonl:3: length 'seven' is not an integer") from exc
        except DatasetError as error:
            return error
    raise AssertionError("unreachable")


@pytest.mark.parametrize(("flag", "env"), [(False, None), (False, "0"), (True, None), (False, "1")])
def test_report_is_one_line_unless_debugging(
    flag: bool, env: str | None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if env is None:
        monkeypatch.delenv(DEBUG_ENV, raising=False)
    else:
        monkeypatch.setenv(DEBUG_ENV, env)
    assert report("bcl-stream plan", failing(), debug=flag) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1] == "bcl-stream plan: error: data.jsonl:3: length 'seven' is not an integer"
    debugging = flag or env == "1"
    assert debug_requested(flag) == debugging
    if debugging:
        text = "\n".join(lines)
        assert "ValueError: invalid literal for int()" in text  # the original cause
        assert "direct cause of the following exception" in text
        assert "bcl_stream.errors.DatasetError" in text
    else:
        assert len(lines) == 1
