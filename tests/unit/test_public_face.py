"""The public face ``bcl_stream``: every public name resolves to the object its home module
defines, ``dir()`` lists it, an unknown name is an AttributeError naming the module, and
``import bcl_stream`` alone (in a fresh interpreter) loads no heavy library and none of the
modules behind the names.
"""

from __future__ import annotations

import ast
import importlib
import json
from pathlib import Path

import pytest
from cli_process import python_process

import bcl_stream

INIT = Path(bcl_stream.__file__)
HEAVY = ("torch", "streaming", "webdataset", "lightning", "transformers", "tokenizers", "tiktoken")
DOCUMENTED = (
    # the names the docs import (README, docs/): each must be on the face, spelled so
    "open_dataset",
    "PackLoader",
    "PlanConfig",
    "ReaderConfig",
    "ReadOptions",
    "CostedMDSWriter",
    "CostedWDSWriter",
    "MDSPackDataset",
    "WDSPackDataset",
    "CostModel",
    "get_preset",
    "preset_names",
    "BCLStreamError",
    "CostIndexError",
    "DatasetError",
    "StateError",
    "PlanError",
    "RemoteAccessError",
)


def test_the_documented_names_are_public() -> None:
    assert set(DOCUMENTED) <= set(bcl_stream.__all__)
    assert sorted(bcl_stream.__all__) == sorted(bcl_stream._HOMES)


@pytest.mark.parametrize("name", bcl_stream.__all__)
def test_each_name_resolves_to_its_home_and_is_listed(name: str) -> None:
    value = getattr(bcl_stream, name)
    home = bcl_stream._HOMES[name]
    assert value is getattr(importlib.import_module(home), name)
    assert value.__module__ == home, f"{name} is defined in {value.__module__}, not {home}"
    assert name in dir(bcl_stream)


def test_unknown_attribute_names_the_module() -> None:
    with pytest.raises(AttributeError, match=r"module 'bcl_stream' has no attribute 'no_such'"):
        bcl_stream.no_such  # noqa: B018
    with pytest.raises(ImportError, match="no_such"):
        exec("from bcl_stream import no_such", {})


def test_type_checking_imports_match_the_homes() -> None:
    """What mypy and IDEs see (the ``TYPE_CHECKING`` imports) is what the face resolves."""
    tree = ast.parse(INIT.read_text())
    guarded = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    )
    seen = {
        alias.name: node.module
        for node in ast.walk(guarded)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert seen == bcl_stream._HOMES


def test_import_is_light_in_a_fresh_interpreter() -> None:
    code = (
        "import json, sys\n"
        "import bcl_stream\n"
        "names = bcl_stream.__all__\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('bcl_stream.'))\n"
        f"heavy = sorted(m for m in {HEAVY!r} if m in sys.modules)\n"
        "print(json.dumps({'heavy': heavy, 'loaded': loaded, 'names': len(names)}))\n"
    )
    proc = python_process(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"heavy": [], "loaded": [], "names": len(bcl_stream.__all__)}


def test_a_light_name_stays_light_in_a_fresh_interpreter() -> None:
    """Naming a planner or cost type from the face does not pull the readers' libraries."""
    code = (
        "import json, sys\n"
        "from bcl_stream import CostModel, PlanConfig, ReaderConfig, DatasetError\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    )
    proc = python_process(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


def test_open_dataset_takes_one_location_or_a_list_of_streams(wds_dir: Path) -> None:
    """The docs' spelling: ``open_dataset(location, config)`` for one dataset (a string or a
    path), ``open_dataset([streams], config)`` for a mixture; anything else is refused."""
    config = bcl_stream.ReaderConfig.build(world_size=2, pack_size=4, window=3, seed=1)
    one = bcl_stream.open_dataset(str(wds_dir), config, 1)
    same = bcl_stream.open_dataset(wds_dir, config, 1)
    mixture = bcl_stream.open_dataset([str(wds_dir)], config, 1)
    assert type(one) is type(same) is bcl_stream.WDSPackDataset
    assert type(mixture) is bcl_stream.MixturePackDataset
    assert one.rank == mixture.rank == 1
    first = [r["sample_id"] for r in next(iter(one))]
    assert first == [r["sample_id"] for r in next(iter(same))]
    assert len(one) == len(mixture)  # one stream, read once: the same epoch
    refused = r"a wds dataset \(its cost index says so\), but format='mds'"
    with pytest.raises(bcl_stream.DatasetError, match=refused):
        bcl_stream.open_dataset(wds_dir, config, 1, format="mds")
    for bad in (None, []):
        with pytest.raises(ValueError, match="a dataset location or a non-empty list of streams"):
            bcl_stream.open_dataset(bad, config, 1)
