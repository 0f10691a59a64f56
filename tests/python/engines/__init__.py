"""Contract tests of the engine adapters (a package, so that its conftest does not shadow tests/python/conftest.py)."""
