"""bcl-stream: Batch Cost Lookahead for synchronous distributed training on variable-length data.

The import of this package is deliberately light (numpy only): the planner, cost models and
simulator never pull torch, streaming or webdataset. Readers and writers live in
``bcl_stream.formats`` and import those libraries on demand.
"""

from bcl_stream.cost import CostModel, get_preset, preset_names
from bcl_stream.errors import BCLStreamError, CostIndexError, DatasetError, StateError

__all__ = [
    "BCLStreamError",
    "CostIndexError",
    "CostModel",
    "DatasetError",
    "StateError",
    "get_preset",
    "preset_names",
]

__version__ = "0.1.0"
