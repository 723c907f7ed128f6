"""The plan a reader follows, built from cost indexes: reader config, the epoch plan (lazy per
rank, or whole for tools), a mixture's streams, the cursor into a plan, and the checks every
entry point makes. Pure planning arithmetic lives in ``bcl_stream.planner`` (numpy only);
this package adds the data (indexes), caching and validation around it.
"""
