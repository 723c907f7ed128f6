"""Code the benchmarks, demos and scripts under ``tools/`` share, as an importable package (no
``sys.path`` edits): the harness (arguments, machine stamp, result files, one-core runs),
the corpora, the GPU model and measuring, the demos' verdicts.

``tools/`` holds entry points only. Run them from the checkout as ``python tools/NAME.py``
where the project is installed (``pip install -e .`` puts this package beside ``bcl_stream``),
or as ``python -m tools.NAME`` from the checkout's root, which needs no install.
Importing this package loads nothing: each module says what it pulls in.
"""
