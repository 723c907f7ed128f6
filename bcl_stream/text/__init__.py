"""How a record's text becomes token ids and a loss mask: tokenizers, the layouts records come
in, chat templates and loss spans. ``preprocess`` writes records with these rules and the
readers re-encode text columns with the same ones, so both import them from here (below
:mod:`bcl_stream.formats` and :mod:`bcl_stream.preprocess`). Importing it costs numpy only:
``tokenizers``, ``tiktoken`` and ``transformers`` load when a tokenizer is first loaded."""
