"""Default shard limits, one pair for both writers (MDS and WebDataset) and ``preprocess``.

No imports: the CLI reads these while it builds its options.
"""

SHARD_RECORDS = 2048
"""Default records per shard, the same for MDS and WebDataset. A plan deals whole shards to
nodes and mixes records across a node's shard group, so what decides how well data spreads
over nodes is the shard count, not the bytes: a byte limit alone put all 64K records of a
38 MB chat corpus in one MDS shard (nothing to deal to a second node, nothing to read in
parallel). 2048 records give a 1M-record dataset 489 shards (61 per node on 8 nodes, 7-8 on 64)
while keeping a shard a few MB of typical SFT records."""
SHARD_BYTES = 1 << 26
"""Default byte limit per shard (64 MB), the same for both formats: 2048 records of 8192
uint32 tokens, so it bites only on datasets of records near the usual length cap."""
