"""Scripts under ``tools/`` loaded as modules, so tests call their functions directly (they
are scripts, not a package: no ``import tools.x``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def load_tool(name: str, module_name: str | None = None) -> ModuleType:
    """``tools/NAME.py`` as a module registered in ``sys.modules`` under ``module_name``
    (default ``NAME``; dataclasses and pickling look their module up there)."""
    module_name = module_name or name
    spec = importlib.util.spec_from_file_location(module_name, TOOLS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module
