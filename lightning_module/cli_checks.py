"""Usage checks of ``python -m lightning_module`` made before Lightning and torch are imported.

Why: importing Lightning and torch takes seconds (5-14 s measured on the 2-core development
machine), and LightningCLI only builds the DataModule after that; under ``strategy: ddp`` a
wrong path used to surface after the ranks were launched, ~16 s in. The paths a user types most
often (the datasets, the checkpoint to resume, an ``HFCausalLM``'s model directory) are read here from the ``--config`` files and
the command line with the YAML parser alone, and one that does not exist locally is refused in
one line at once. Anything this cannot read (a remote path, a value LightningCLI would compute)
is left to the DataModule, which checks the same again when it is built.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

from bcl_stream.errors import DatasetError

DATA_KEYS = ("data", "val_data", "test_data")
"""DataModule keys that name one dataset (a directory, or a URL); the last two in ``eval``."""
STREAM_KEYS = ("streams", "val_streams", "test_streams")
"""DataModule arguments that name a mixture's streams (``PATH[:options]`` or dicts)."""
EVAL_GROUP = "eval"
"""The DataModule's group of validation and test data (``data.eval.val_data``)."""
HF_MODEL = "HFCausalLM"
"""The model class whose ``model`` argument is a local directory checked here."""


def _options(argv: Sequence[str]) -> Iterator[tuple[str, str]]:
    """(``--name``, value) pairs of ``--name value`` and ``--name=value``."""
    args = list(argv)
    for i, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        if "=" in arg:
            name, _, value = arg.partition("=")
            yield name, value
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            yield arg, args[i + 1]


def _data_section(config: Any) -> dict[str, Any]:
    """The DataModule's arguments, with its ``eval`` group's keys beside ``data``."""
    data = config.get("data") if isinstance(config, dict) else None
    if not isinstance(data, dict):
        return {}
    init = data.get("init_args")
    section = {**data, **init} if isinstance(init, dict) else data
    evaluation = section.get(EVAL_GROUP)
    return {**section, **evaluation} if isinstance(evaluation, dict) else section


def _model_dir(config: Any) -> Any:
    """``model.init_args.model`` of an ``HFCausalLM`` model section (None otherwise)."""
    model = config.get("model") if isinstance(config, dict) else None
    if not isinstance(model, dict) or not str(model.get("class_path", "")).endswith(HF_MODEL):
        return None
    init = model.get("init_args")
    return init.get("model") if isinstance(init, dict) else None


def given_paths(argv: Sequence[str]) -> dict[str, Any]:
    """The dataset arguments, ``ckpt_path`` and an ``HFCausalLM``'s model directory as the
    command line sets them, configs first (in order) and ``--data.X`` / ``--ckpt_path`` /
    ``--model.model`` options over them, as LightningCLI does."""
    import yaml

    found: dict[str, Any] = {}
    for name, value in _options(argv):
        if name == "--config" and os.path.isfile(value):
            with open(value, encoding="utf-8") as fh:
                config = yaml.safe_load(fh)
            section = _data_section(config)
            found.update({k: section[k] for k in (*DATA_KEYS, *STREAM_KEYS) if k in section})
            if isinstance(config, dict) and config.get("ckpt_path") is not None:
                found["ckpt_path"] = config["ckpt_path"]
            if _model_dir(config) is not None:
                found["model"] = _model_dir(config)
        elif name == "--ckpt_path":
            found["ckpt_path"] = value
        elif name in ("--model.model", "--model.init_args.model"):
            found["model"] = value
        else:
            key = name.removeprefix("--data.").removeprefix("init_args.")
            key = key.removeprefix(f"{EVAL_GROUP}.")
            if name.startswith("--data.") and key in DATA_KEYS:
                found[key] = value
            elif name.startswith("--data.") and key in STREAM_KEYS:
                found[key] = yaml.safe_load(value)  # a list, as config_paths writes it
    return found


def given_data_keys(argv: Sequence[str]) -> set[str]:
    """The top-level keys of the ``data`` section the command line sets: the configs' ``data:``
    keys (``init_args`` followed) and the first name of every ``--data.NAME`` option. The
    DataModule's entry point refuses those it does not take in one line, naming the grouped
    key (a flat ``data.window``: ``data.plan.window``), before LightningCLI prints its usage."""
    import yaml

    keys: set[str] = set()
    for name, value in _options(argv):
        if name == "--config" and os.path.isfile(value):
            with open(value, encoding="utf-8") as fh:
                config = yaml.safe_load(fh)
            data = config.get("data") if isinstance(config, dict) else None
            if isinstance(data, dict):
                init = data.get("init_args")
                keys |= set(init if isinstance(init, dict) else data) - {"class_path"}
        elif name.startswith("--data."):
            first = name.removeprefix("--data.").removeprefix("init_args.").split(".")[0]
            keys.add(first)
    return keys


def _local(path: Any) -> str | None:
    """A local filesystem path (None for a URL, a null or anything that is not a string)."""
    if not isinstance(path, str) or not path or path in ("null", "None"):
        return None
    if "://" in path and not path.startswith("file://"):
        return None
    return path.removeprefix("file://")


def _stream_path(stream: Any) -> Any:
    if isinstance(stream, dict):
        return stream.get("path")
    return str(stream).split(":", 1)[0] if isinstance(stream, str) else None


def check_paths(argv: Sequence[str]) -> None:
    """Raise :class:`DatasetError` naming the first dataset or checkpoint path that is local
    and does not exist (see the module docstring)."""
    found = given_paths(argv)
    named: list[tuple[str, Any]] = [(k, found.get(k)) for k in DATA_KEYS]
    for key in STREAM_KEYS:
        streams = found.get(key)
        if isinstance(streams, list):
            named += [(f"{key}[{i}]", _stream_path(s)) for i, s in enumerate(streams)]
    for key, value in named:
        path = _local(value)
        if path is not None and not os.path.exists(path):
            where = key if key.startswith(("data", "streams")) else f"{EVAL_GROUP}.{key}"
            raise DatasetError(
                f"data.{where}: {path}: no such dataset directory (from the config or "
                f"--data.{where.split('[')[0]}); give the directory `bcl-stream preprocess` "
                "wrote, or an s3:// URL"
            )
    model = _local(found.get("model"))
    if model is not None and not os.path.isfile(os.path.join(model, "config.json")):
        raise DatasetError(
            f"model.model: {model}: no config.json; HFCausalLM needs a local Hugging Face model "
            "directory (save_pretrained's output, or a config.json alone for a random init)"
        )
    ckpt = _local(found.get("ckpt_path"))
    if ckpt is not None and ckpt not in ("last", "best", "hpc") and not os.path.exists(ckpt):
        raise DatasetError(f"--ckpt_path {ckpt}: no such checkpoint file")
