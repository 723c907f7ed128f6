"""Relative paths in a ``python -m lightning_module`` config resolve against the config's root.

Why: run from another directory, ``--config configs/cpu_demo.yaml`` wrote its logs and
checkpoints into the current directory and looked for its data there, so the same config
meant different files depending on where it was launched. A relative path in a config file
now resolves against that file's root:

1. ``--root DIR`` on the command line (relative to the current directory), else
2. the environment variable ``BCL_STREAM_ROOT`` (the same), else
3. the config's own ``root:`` key (relative to the config file: the demo configs say
   ``root: ..``, the repository), else
4. the config file's directory.

A path typed on the command line (``--data.data DIR``) stays relative to the current
directory, as a shell user means it. Absolute paths and URLs are left alone.

How: before LightningCLI parses anything (and before ``cli_checks`` looks for missing
paths), every ``--config FILE`` given after the subcommand is followed by options that set
FILE's relative paths (:data:`PATH_KEYS`, the callbacks' :data:`CALLBACK_PATH_ARGS`, the
mixture streams' paths) to absolute ones. jsonargparse applies options in order, so these win
over FILE and lose to anything after it: the precedence LightningCLI already has. The config
LightningCLI saves then holds absolute paths, and Lightning's ``ddp`` launcher re-runs the
rewritten command line in every rank.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

import yaml

from bcl_stream import StreamSpec

ROOT_ENV = "BCL_STREAM_ROOT"
"""Environment variable naming the root of relative config paths (under ``--root``)."""
ROOT_OPTION = "--root"
SUBCOMMANDS = ("fit", "validate", "test", "predict")
PATH_KEYS = (
    "trainer.default_root_dir",
    "data.data",
    "data.eval.val_data",
    "data.eval.test_data",
    "data.cache_dir",
    "data.batch.processor",
    "ckpt_path",
)
"""Dotted config keys whose value is one local path (or a URL, left alone)."""
HF_MODEL_KEY = "model.init_args.model"
"""The model directory of an ``HFCausalLM`` model section (another model's ``model`` argument
may be no path, so only this class's is resolved)."""
STREAM_KEYS = (
    "data.streams",
    "data.eval.val_streams",
    "data.eval.test_streams",
)
"""Dotted config keys holding a mixture's streams (``PATH[:options]`` strings or dicts)."""
CALLBACK_PATH_ARGS = ("directory", "dirpath")
"""``init_args`` of ``trainer.callbacks`` entries that are paths (``PackLogger``,
``ModelCheckpoint``)."""
CHECKPOINT_NAMES = ("last", "best", "hpc")
"""``ckpt_path`` values Lightning resolves itself."""


def _relative(value: Any) -> TypeGuard[str]:
    """A local relative path (not a URL, not absolute, not ``~``, not empty or null)."""
    return (
        isinstance(value, str)
        and value not in ("", "null", "None")
        and "://" not in value
        and not os.path.isabs(value)
        and not value.startswith("~")
    )


def _get(config: Any, dotted: str) -> Any:
    """``config["a"]["b"]`` for ``"a.b"``, through ``init_args`` of a class_path section."""
    node = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping):
            return None
        if part not in node and isinstance(node.get("init_args"), Mapping):
            node = node["init_args"]
        node = node.get(part)
    return node


def _options(argv: Sequence[str], name: str) -> list[tuple[int, str]]:
    """(position, value) of every ``name VALUE`` / ``name=VALUE`` in ``argv``."""
    found = []
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            found.append((i, argv[i + 1]))
        elif arg.startswith(name + "="):
            found.append((i, arg.split("=", 1)[1]))
    return found


def root_for(config_file: str, config: Any, argv: Sequence[str], env: Mapping[str, str]) -> str:
    """The directory ``config_file``'s relative paths resolve against (the module docstring's
    order: ``--root``, ``$BCL_STREAM_ROOT``, the file's ``root:`` key, the file's directory)."""
    given = _options(argv, ROOT_OPTION)
    if given:
        return os.path.abspath(given[-1][1])
    if env.get(ROOT_ENV):
        return os.path.abspath(env[ROOT_ENV])
    here = os.path.dirname(os.path.abspath(config_file))
    own = config.get("root") if isinstance(config, Mapping) else None
    if isinstance(own, str) and own:
        return os.path.normpath(os.path.join(here, own))
    return here


def _stream(stream: Any, root: str) -> Any:
    """A stream (``PATH[:options]`` or ``{"path": ...}``) with a relative path made absolute."""
    if isinstance(stream, Mapping):
        path = stream.get("path")
        return {**stream, "path": os.path.join(root, path)} if _relative(path) else stream
    if isinstance(stream, str):
        path = StreamSpec.parse(stream).path
        return os.path.join(root, path) + stream[len(path) :] if _relative(path) else stream
    return stream


def _callback(callback: Any, root: str) -> Any:
    if not isinstance(callback, Mapping) or not isinstance(callback.get("init_args"), Mapping):
        return callback
    init = dict(callback["init_args"])
    for name in CALLBACK_PATH_ARGS:
        if _relative(init.get(name)):
            init[name] = os.path.join(root, init[name])
    return {**callback, "init_args": init}


def path_overrides(config: Any, root: str) -> list[str]:
    """Options that set ``config``'s relative paths to absolute ones under ``root``."""
    out = []
    hf_model = str(_get(config, "model.class_path") or "").endswith(".HFCausalLM")
    for key in (*PATH_KEYS, HF_MODEL_KEY) if hf_model else PATH_KEYS:
        value = _get(config, key)
        if key == "ckpt_path" and value in CHECKPOINT_NAMES:
            continue
        if _relative(value):
            out.append(f"--{key}={os.path.join(root, value)}")
    for key in STREAM_KEYS:
        streams = _get(config, key)
        if isinstance(streams, list):
            resolved = [_stream(s, root) for s in streams]
            if resolved != streams:
                out.append(f"--{key}={json.dumps(resolved)}")
    callbacks = _get(config, "trainer.callbacks")
    if isinstance(callbacks, list):
        resolved = [_callback(c, root) for c in callbacks]
        if resolved != callbacks:
            out.append(f"--trainer.callbacks={json.dumps(resolved)}")
    return out


def resolve_config_paths(argv: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
    """``argv`` with every config file's relative paths made absolute (module docstring).
    Idempotent (Lightning's ``ddp`` launcher runs the rewritten command line through here
    again in every rank): options already in place after a config are not added twice.
    Config files before the subcommand (LightningCLI's nested ``fit:`` form) are left as
    they are."""
    env = os.environ if env is None else env
    args = list(argv)
    start = next((i for i, a in enumerate(args) if a in SUBCOMMANDS), -1) + 1
    out = args[:start]
    i = start
    while i < len(args):
        arg = args[i]
        out.append(arg)
        i += 1
        if arg in ("--config", "-c") and i < len(args):
            path = args[i]
            out.append(path)
            i += 1
        elif arg.startswith("--config="):
            path = arg.split("=", 1)[1]
        else:
            continue
        if not os.path.isfile(path):
            continue  # an inline YAML string, or a missing file LightningCLI reports
        with open(path, encoding="utf-8") as fh:
            config = yaml.safe_load(fh)
        added = path_overrides(config, root_for(path, config, args, env))
        if args[i : i + len(added)] != added:
            out += added
    return out
