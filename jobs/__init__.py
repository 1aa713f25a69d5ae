"""Ray jobs: runnable with ``python jobs/X.py`` and ``ray job submit``."""
