"""Unit tests written to kill surviving mutants of echo/transport/uri.py (./dev mutate uri)."""
