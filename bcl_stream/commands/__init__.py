"""Subcommands of ``bcl-stream`` (see ``bcl_stream.cli``)."""
