"""Plug-in examples: models outside ``solaris`` that SOLARIS builds by import path."""
