"""Lightning integration for bcl-stream: DataModule, collate, TinyGPT, CLI entry, callbacks."""
