"""``bcl_stream.io.streaming_compat``: each hook against the installed streaming and webdataset,
the version check, and the rule that no other module reaches into their internals.

The enforcing test reads every ``.py`` file under ``bcl_stream/``, ``lightning_module/`` and
``tools/`` as a syntax tree (nothing is imported) and fails on, outside the compat module:

- an import of a module below the libraries' top level (``streaming.base.storage``,
  ``webdataset.writer``): only their top-level names are public API;
- an imported name or a module path part starting with ``_``, or an ``_attribute`` of a name
  bound from those libraries (``wds._x``, ``MDSWriter._write_index``);
- a submodule reached through an attribute chain (``wds.writer.make_encoder``);
- in a subclass of a library class, a read of ``self._x`` the class never assigns itself
  (an inherited private attribute) or of the writer internals in ``SUBCLASS_INTERNALS``;
- any mention of an internal we have relied on (``KNOWN_PRIVATE``): attribute, name, defined
  function or exact string (``getattr(obj, "tarstream")``), on any object, since the objects
  are typed ``Any`` where they are used.
"""

from __future__ import annotations

import ast
import io
import json
import os
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bcl_stream.io import streaming_compat as compat

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("bcl_stream", "lightning_module", "bcl_bench", "tools")
COMPAT = "bcl_stream/io/streaming_compat.py"
LIBRARIES = ("streaming", "webdataset")
KNOWN_PRIVATE = frozenset(
    {
        "_shard_states",
        "_ShardState",
        "_cache_filelock",
        "_write_index",
        "_work_queue",
        "_get_work",
        "prepare_shard",
        "tarstream",
        "make_encoder",
        "reader_from_json",
        "CloudDownloader",
        "CloudUploader",
        "clean_stale_shared_memory",
        "get_hash",
        "new_samples",
        "_iterator",  # torch DataLoader's; persistent workers learn of the cursor another way
        "fp",  # PIL's stream under an image streaming decoded lazily
    }
)
CALL_ONLY = frozenset({"prepare_shard"})
"""Calling ``dataset.prepare_shard(i)`` is public; defining, assigning or passing it is a hook."""
SUBCLASS_INTERNALS = frozenset({"executor", "event", "new_samples", "cloud_writer"})


# --- the checker ------------------------------------------------------------------------------


def _library(module: str) -> bool:
    return module.split(".")[0] in LIBRARIES


def _imports(tree: ast.AST) -> tuple[list[str], set[str]]:
    """Problems with the imports, and the names bound from the libraries."""
    problems: list[str] = []
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _library(alias.name):
                    if "." in alias.name:
                        problems.append(f"{node.lineno}: imports submodule {alias.name}")
                    bound.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if not _library(node.module):
                continue
            if "." in node.module:
                problems.append(f"{node.lineno}: imports from submodule {node.module}")
            for alias in node.names:
                if alias.name.startswith("_"):
                    problems.append(f"{node.lineno}: imports private {alias.name}")
                bound.add(alias.asname or alias.name)
    return problems, bound


def _subclass_uses(tree: ast.AST, bound: set[str]) -> Iterator[str]:
    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        if not any(isinstance(b, ast.Name) and b.id in bound for b in cls.bases):
            continue
        own = {
            n.attr
            for n in ast.walk(cls)
            if isinstance(n, ast.Attribute)
            and isinstance(n.ctx, ast.Store)
            and isinstance(n.value, ast.Name)
            and n.value.id == "self"
        } | {n.name for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        for n in ast.walk(cls):
            if not (isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)):
                continue
            if n.value.id != "self" or isinstance(n.ctx, ast.Store):
                continue
            if n.attr in SUBCLASS_INTERNALS or (n.attr.startswith("_") and n.attr not in own):
                yield f"{n.lineno}: {cls.name} uses inherited internal self.{n.attr}"


def private_uses(source: str, filename: str = "<source>") -> list[str]:
    """``"line: what"`` for each use of a streaming/webdataset internal in ``source``."""
    tree = ast.parse(source, filename=filename)
    found, bound = _imports(tree)
    found += _subclass_uses(tree, bound)
    called = {
        id(n.func)
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            base = node.value
            if isinstance(base, ast.Name) and base.id in bound and node.attr.startswith("_"):
                found.append(f"{node.lineno}: private attribute {base.id}.{node.attr}")
            if (
                isinstance(base, ast.Attribute)
                and isinstance(base.value, ast.Name)
                and base.value.id in bound
                and base.attr[:1].islower()
            ):
                found.append(f"{node.lineno}: reaches into {base.value.id}.{base.attr}.{node.attr}")
            if node.attr in KNOWN_PRIVATE and not (node.attr in CALL_ONLY and id(node) in called):
                found.append(f"{node.lineno}: uses internal .{node.attr}")
        elif isinstance(node, ast.Name) and node.id in KNOWN_PRIVATE:
            found.append(f"{node.lineno}: uses internal {node.id}")
        elif (
            isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in KNOWN_PRIVATE
        ):
            found.append(f"{node.lineno}: overrides internal {node.name}")
        elif isinstance(node, ast.Constant) and node.value in KNOWN_PRIVATE:
            found.append(f"{node.lineno}: names internal {node.value!r}")
    return found


def offenders(root: Path = ROOT) -> dict[str, list[str]]:
    """Every checked file but the compat module that uses an internal, with its uses."""
    result: dict[str, list[str]] = {}
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            uses = [] if rel == COMPAT else private_uses(path.read_text(), rel)
            if uses:
                result[rel] = uses
    return result


def test_only_the_compat_module_uses_streaming_or_webdataset_internals() -> None:
    assert len(list((ROOT / "bcl_stream").rglob("*.py"))) > 40
    assert offenders() == {}


def test_the_compat_module_itself_is_seen_by_the_checker() -> None:
    """The exemption is needed: the checker does find the compat module's own uses."""
    uses = private_uses((ROOT / COMPAT).read_text(), COMPAT)
    assert any("_shard_states" in u for u in uses)
    assert any("make_encoder" in u for u in uses)  # webdataset's too


# What the tree did before the compat module (each line as it stood), one pattern each.
BEFORE = {
    "private import": "from streaming.base.dataset import _ShardState\n",
    "private state": "def f(dataset):\n    dataset._shard_states[0] = 1\n",
    "private lock by name": "lock = getattr(dataset, '_cache_filelock', None)\n",
    "replaced method": "dataset.prepare_shard = object()\n",
    "override": (
        "from streaming import MDSWriter\n"
        "class W(MDSWriter):\n"
        "    def _write_index(self):\n"
        "        self.executor.shutdown(wait=True)\n"
    ),
    "inherited internal": (
        "from streaming import MDSWriter\n"
        "class W(MDSWriter):\n"
        "    def end(self):\n"
        "        return self._hidden\n"
    ),
    "submodule attribute": "import webdataset as wds\nencode = wds.writer.make_encoder(True)\n",
    "tar stream": "def f(w):\n    w.tarstream = None\n",
    "submodule import": "from streaming.base.storage import CloudUploader\n",
    "shard reader": "from streaming.base.format import reader_from_json\n",
    "module private": "import streaming\nstreaming._private()\n",
    "private name import": "from webdataset import _hidden\n",
}


@pytest.mark.parametrize("case", sorted(BEFORE))
def test_the_checker_catches_each_pattern_the_tree_used(case: str) -> None:
    assert private_uses(BEFORE[case]) != []


def test_the_checker_lets_public_use_pass() -> None:
    source = (
        "import webdataset as wds\nfrom streaming import MDSWriter, StreamingDataset\n"
        "w = wds.ShardWriter('x-%06d.tar', maxcount=3)\n"
        "class C(MDSWriter):\n"
        "    def __init__(self):\n        self._mine = 1\n"
        "    def f(self):\n        return self._mine, self.shards\n"
        "def g(dataset):\n    dataset.prepare_shard(0, blocking=False)\n"
    )
    assert private_uses(source) == []


# --- version check ----------------------------------------------------------------------------


def test_installed_versions_are_the_supported_ones() -> None:
    assert compat.installed_versions() == compat.SUPPORTED


def test_supported_versions_are_the_project_pins() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    constraints = (ROOT / "constraints.txt").read_text().splitlines()
    for name, version in compat.SUPPORTED.items():
        assert f"{name}=={version}" in deps
        assert f"{name}=={version}" in constraints


def test_version_check_passes_supported_and_missing_libraries() -> None:
    compat.check_versions(dict(compat.SUPPORTED))
    compat.check_versions({"mosaicml-streaming": None, "webdataset": None})


@pytest.mark.parametrize(
    ("name", "version"), [("mosaicml-streaming", "0.14.0"), ("webdataset", "0.2.100")]
)
def test_version_check_names_installed_supported_and_the_fix(name: str, version: str) -> None:
    installed = {**compat.SUPPORTED, name: version}
    with pytest.raises(compat.UnsupportedLibraryError) as info:
        compat.check_versions(installed)
    message = str(info.value)
    assert "\n" not in message
    assert f"{name} {version} is installed" in message
    assert f"{name}=={compat.SUPPORTED[name]}" in message
    assert "constraints.txt" in message and "streaming_compat.py" in message
    assert isinstance(info.value, ImportError)


# --- Mosaic Streaming hooks -------------------------------------------------------------------


def _write_plain_mds(out: Path, n: int = 6, **kwargs: Any) -> list[np.ndarray]:
    from streaming import MDSWriter

    rows = [np.full(i + 1, i, dtype=np.uint32) for i in range(n)]
    with MDSWriter(out=str(out), columns={"input_ids": "ndarray:uint32"}, **kwargs) as writer:
        for row in rows:
            writer.write({"input_ids": row})
    return rows


def test_guard_downloads_lets_a_failed_download_be_retried(tmp_path: Path) -> None:
    """Without the guard the second ``get_item`` waits forever on a shard left PREPARING."""
    from streaming import StreamingDataset

    remote = tmp_path / "remote"
    rows = _write_plain_mds(remote)
    shard = (
        remote
        / json.loads((remote / "index.json").read_text())["shards"][0]["raw_data"]["basename"]
    )
    hidden = shard.with_name("hidden")
    shard.rename(hidden)
    dataset = StreamingDataset(
        remote=str(remote), local=str(tmp_path / "cache"), shuffle=False, batch_size=1
    )
    assert compat.guard_downloads(dataset) is dataset
    assert compat.guard_downloads(dataset).prepare_shard is dataset.prepare_shard  # idempotent
    with pytest.raises(FileNotFoundError):
        dataset.get_item(0)
    hidden.rename(shard)
    np.testing.assert_array_equal(dataset.get_item(0)["input_ids"], rows[0])


def test_own_index_writing_routes_finish_to_the_subclass(tmp_path: Path) -> None:
    from streaming import MDSWriter

    calls: list[bool] = []

    @compat.own_index_writing
    class Writer(MDSWriter):
        def write_dataset_index(self) -> None:
            calls.append(compat.wait_for_shard_uploads(self))

    with Writer(out=str(tmp_path), columns={"x": "int"}) as writer:
        writer.write({"x": 1})
    assert calls == [True]
    assert not (tmp_path / "index.json").exists()  # the stock index writing did not run
    assert list(tmp_path.glob("shard.*.mds"))


def test_own_index_writing_refuses_a_class_without_the_method() -> None:
    with pytest.raises(TypeError, match="write_dataset_index"):
        compat.own_index_writing(type("NoMethod", (), {}))


def test_close_shard_at_cuts_shards_by_record_count(tmp_path: Path) -> None:
    from streaming import MDSWriter

    with MDSWriter(out=str(tmp_path / "ds"), columns={"x": "int"}) as writer:
        for i in range(7):
            compat.close_shard_at(writer, 3)
            compat.close_shard_at(writer, None)  # no count limit: nothing happens
            writer.write({"x": i})
    index = json.loads((tmp_path / "ds" / "index.json").read_text())
    assert [s["samples"] for s in index["shards"]] == [3, 3, 1]


def test_wait_for_shard_uploads_refuses_unflushed_samples(tmp_path: Path) -> None:
    from streaming import MDSWriter

    writer = MDSWriter(out=str(tmp_path), columns={"x": "int"})
    writer.write({"x": 1})
    with pytest.raises(RuntimeError, match="flushed"):
        compat.wait_for_shard_uploads(writer)
    compat.abandon_shard_uploads(writer)
    assert not list(tmp_path.glob("shard.*.mds"))  # abandoned: the open shard is never written


def test_mds_shard_reader_and_decompress_read_a_compressed_shard(tmp_path: Path) -> None:
    rows = _write_plain_mds(tmp_path / "ds", compression="zstd")
    entry = json.loads((tmp_path / "ds" / "index.json").read_text())["shards"][0]
    zipped = tmp_path / "ds" / entry["zip_data"]["basename"]
    raw = compat.decompress(entry["compression"], zipped.read_bytes())
    (tmp_path / entry["raw_data"]["basename"]).write_bytes(raw)
    reader = compat.mds_shard_reader(str(tmp_path), entry)
    for i, row in enumerate(rows):
        np.testing.assert_array_equal(reader.get_item(i)["input_ids"], row)


def test_download_upload_and_list_through_streaming_storage(tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    remote.mkdir()
    staging = tmp_path / "staging"
    uploader = compat.open_uploader(str(staging), str(remote))
    (staging / "a.bin").write_bytes(b"payload")
    uploader.upload_file("a.bin")
    assert (remote / "a.bin").read_bytes() == b"payload"
    assert [Path(n).name for n in compat.list_objects(str(remote))] == ["a.bin"]
    compat.download_file(str(remote / "a.bin"), str(tmp_path / "got.bin"), 10.0)
    assert (tmp_path / "got.bin").read_bytes() == b"payload"


def test_clean_stale_shared_memory_once_runs_once_per_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import streaming.base.util as util

    calls: list[int] = []
    monkeypatch.setattr(util, "clean_stale_shared_memory", lambda: calls.append(1))
    for name in ("BCL_STREAM_KEEP_SHM", "LOCAL_RANK", "SLURM_LOCALID"):
        monkeypatch.delenv(name, raising=False)
    compat.clean_stale_shared_memory_once()
    assert calls == [1]
    monkeypatch.setenv("LOCAL_RANK", "0")  # a launched rank: the launcher's process cleaned
    compat.clean_stale_shared_memory_once()
    monkeypatch.delenv("LOCAL_RANK")
    monkeypatch.setenv("BCL_STREAM_KEEP_SHM", "1")
    compat.clean_stale_shared_memory_once()
    assert calls == [1]


# --- webdataset hooks -------------------------------------------------------------------------


def test_wds_member_encoder_encodes_what_stock_webdataset_decodes() -> None:
    ids = np.arange(5, dtype=np.uint32)
    encoded = compat.wds_member_encoder()(
        {"__key__": "0001", "input_ids.npy": ids, "json": {"a": 1}, "txt": "hi"}
    )
    assert all(isinstance(v, bytes) for k, v in encoded.items() if k != "__key__")
    np.testing.assert_array_equal(np.load(io.BytesIO(encoded["input_ids.npy"])), ids)
    assert json.loads(encoded["json"]) == {"a": 1}
    assert encoded["txt"] == b"hi"


def test_importing_the_compat_module_does_not_import_the_libraries() -> None:
    import subprocess
    import sys

    code = (
        "import sys, bcl_stream.io.streaming_compat; "
        "print(sorted(m for m in ('streaming', 'webdataset') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert re.sub(r"\s", "", out) == "[]"


def test_mds_image_file_bytes_gives_the_stored_file_of_jpeg_and_png_columns(
    tmp_path: Path,
) -> None:
    from PIL import Image
    from streaming import MDSWriter

    photo = tmp_path / "photo.jpg"
    Image.new("RGB", (40, 24), (200, 30, 90)).save(photo, format="JPEG")
    drawn = Image.new("RGB", (17, 9), (1, 2, 3))
    with MDSWriter(out=str(tmp_path / "ds"), columns={"j": "jpeg", "p": "png"}) as writer:
        writer.write({"j": Image.open(photo), "p": drawn})
    entry = json.loads((tmp_path / "ds" / "index.json").read_text())["shards"][0]
    record = compat.mds_shard_reader(str(tmp_path / "ds"), entry).get_item(0)
    assert compat.mds_image_file_bytes(record["j"]) == photo.read_bytes()
    png = compat.mds_image_file_bytes(record["p"])
    assert png is not None and png.startswith(b"\x89PNG")
    assert Image.open(io.BytesIO(png)).tobytes() == drawn.tobytes()
    assert compat.mds_image_file_bytes(drawn) is None  # decoded pixels: no file behind them
    assert compat.mds_image_file_bytes(b"\xff\xd8") is None
