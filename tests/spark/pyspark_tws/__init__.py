"""Processors in the shape of PySpark's own transformWithState test suite, for the parity tests."""
