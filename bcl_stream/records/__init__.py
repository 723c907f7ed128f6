"""Records as sources hold them, and the one declaration of how they become token ids.

- :mod:`~bcl_stream.records.source`: :class:`~bcl_stream.records.source.RecordSource`, the
  frozen declaration of the record knobs (columns, tokenizer, conversation mask).
- :mod:`~bcl_stream.records.kind`: the :class:`~bcl_stream.records.kind.RecordKind` protocol
  a kind of record implements, and the types kinds share.
- one module per kind: :mod:`~bcl_stream.records.text`, :mod:`~bcl_stream.records.chat`,
  :mod:`~bcl_stream.records.prompt_response`.
- :mod:`~bcl_stream.records.registry`: the kinds in detection order, and the only dispatch on
  them (``preprocess``, ``annotate`` and the readers go through it).

See docs/extending.md, "A record kind", for what a new kind implements.
"""
