"""On-disk formats of the checkpoint location; byte layouts are documented in docs/formats.md."""
