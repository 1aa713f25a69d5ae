"""Project errors. Each names the bad value; HTTP mapping lives only in serve/ (http.py, router.py)."""


class SolarisError(Exception):
    """Base class of every error the project raises on purpose."""


class ConfigError(SolarisError, ValueError):
    """A configuration field holds an invalid value."""


class DataError(SolarisError, ValueError):
    """An input file or table is malformed; the message names the file and column."""


class CheckpointError(SolarisError):
    """A checkpoint is missing, corrupt or of an incompatible version."""


class RequestError(SolarisError, ValueError):
    """A lookup or cache request carries an invalid value (too many candidates, a negative
    id, a non-finite time or vector); the message names the value."""
