"""Where bcl-stream meets the libraries it builds on.

:mod:`bcl_stream.io.streaming_compat` is the one module that touches Mosaic Streaming's and
webdataset's private or unstable internals; everything else calls its small typed hooks.
"""
