"""Preprocessing: JSONL/Parquet records -> tokenized, costed MDS or WebDataset shards.

Modules: ``sources`` (reading and parsing records), ``layouts`` (the layouts SFT records
come in), ``templates`` (the model's chat template through ``transformers``, or the built-in
ChatML of ``chat``, and the loss masks), ``tokenizers`` (cl100k offline, a local
``tokenizer.json`` or Hugging Face tokenizer directory), ``outliers`` (the
``--max-record-tokens`` policy), ``work`` (the tokenizing process pool), ``output`` (existing
outputs and ``--overwrite``), ``pipeline`` (:func:`preprocess`). Worker processes import
``work`` only, so this package's import stays light: the writers (and streaming) load inside
:func:`preprocess`.
"""

from bcl_stream.preprocess.pipeline import PreprocessReport, preprocess

__all__ = ["PreprocessReport", "preprocess"]
