"""SOLARIS: speculative offloading of latent-based representations for inference scaling.

Pure core: nothing under ``solaris`` imports Ray.
"""

__version__ = "0.1.0"
