"""Storage: the cost index (sidecar) and its hashes, local and ``s3://`` access with bounded
retries, shard verification, and the one module that touches streaming's and webdataset's
private parts (``streaming_compat``).
"""
