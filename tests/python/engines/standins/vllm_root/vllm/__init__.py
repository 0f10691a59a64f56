"""STAND-IN package for the kvpool engine contract tests (not the engine)."""
