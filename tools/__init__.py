"""Entry points: benchmarks, demos, the GPU check, Fabric training and the test runner. Run as
``python tools/NAME.py`` with the project installed, or ``python -m tools.NAME`` from the
checkout's root; what they share lives in ``bcl_bench``."""
