"""The metadata database: lineage catalog models and migrations."""
