"""The planner and cost code must stay pure: numpy only, no torch, no I/O libraries."""

from __future__ import annotations

import subprocess
import sys


def test_planner_imports_no_torch_or_io_libraries() -> None:
    code = (
        "import sys, bcl_stream.planner, bcl_stream.cost, bcl_stream.analysis.sim;"
        "bad = [m for m in ('torch', 'streaming', 'webdataset', 'lightning', 'boto3', 'tiktoken') if m in sys.modules];"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_planner_modules_do_not_open_files() -> None:
    import importlib
    import inspect
    import pkgutil

    import bcl_stream.planner as planner

    names = [m.name for m in pkgutil.iter_modules(planner.__path__, "bcl_stream.planner.")]
    assert {"bcl_stream.planner.node_streams", "bcl_stream.planner.windows"} <= set(names)
    for module in map(importlib.import_module, names):
        source = inspect.getsource(module)
        for forbidden in ("open(", "np.load", "np.save", "Path(", "import os", "subprocess"):
            assert forbidden not in source, f"{module.__name__} uses {forbidden}"
