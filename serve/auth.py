"""Credentials of the app's HTTP calls. No Ray import.

- **Operator calls** (``POST /scales``: anything that changes the running system's controls)
  need the operator's bearer token. With none configured they are off (403); a missing or
  wrong token is a 401.
- **Service calls** (``POST /rank``, ``POST /feedback``: the recommender's backend calls
  them) need the service token where one is configured; the cluster profile
  (``serve.profile=cluster``) refuses to start without one.
- **Read-only views** (``GET /stats``, ``GET /scales``) take either token where a service
  token is configured, and are open otherwise; ``GET /healthz`` is always open (load
  balancers and Serve's own probes call it; it says only whether the app is up, its tasks,
  versions and mode).

A token comes from the environment of the app's processes, never from the repository:
``SOLARIS_OPERATOR_TOKEN`` (the token itself) or ``SOLARIS_OPERATOR_TOKEN_FILE`` (a file
holding it), and likewise ``SOLARIS_SERVICE_TOKEN`` / ``SOLARIS_SERVICE_TOKEN_FILE``.
Tokens are compared in constant time (``hmac.compare_digest``).
"""

import hmac
import os
from collections.abc import Mapping
from pathlib import Path

from fastapi import HTTPException, Request

from solaris.errors import ConfigError

OPERATOR_ENV = "SOLARIS_OPERATOR_TOKEN"
SERVICE_ENV = "SOLARIS_SERVICE_TOKEN"
MIN_TOKEN_CHARS = 16  # a shorter secret is a typo or a placeholder, not a credential


def load_token(name: str, environ: Mapping[str, str] | None = None) -> bytes | None:
    """The token named ``name`` from ``environ`` (default ``os.environ``): the variable
    itself, else the file ``<name>_FILE`` names (surrounding whitespace stripped); None when
    neither is set. ConfigError (naming the variable or file) for an unreadable file or a
    token shorter than ``MIN_TOKEN_CHARS``."""
    env = os.environ if environ is None else environ
    value, path = env.get(name), env.get(f"{name}_FILE")
    if value:
        token, where = value.strip(), name
    elif path:
        try:
            token, where = Path(path).read_text().strip(), f"{name}_FILE={path}"
        except OSError as e:
            raise ConfigError(f"{name}_FILE={path!r}: cannot read the token ({e.strerror})")
    else:
        return None
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(f"{where}: the token has {len(token)} characters; at least "
                          f"{MIN_TOKEN_CHARS} are required")
    return token.encode()


def _matches(token: bytes | None, given: bytes) -> bool:
    return token is not None and hmac.compare_digest(token, given)


class Credentials:
    """The app's operator and service tokens and the checks of each kind of call."""

    def __init__(self, operator: bytes | None, service: bytes | None) -> None:
        self.operator = operator
        self.service = service
        self.refused = {"operator": 0, "service": 0, "read": 0}  # calls answered 401 / 403

    @classmethod
    def from_env(cls, require_service: bool,
                 environ: Mapping[str, str] | None = None) -> "Credentials":
        """Both tokens from the environment; ConfigError if ``require_service`` (the cluster
        profile) and no service token is set."""
        creds = cls(load_token(OPERATOR_ENV, environ), load_token(SERVICE_ENV, environ))
        if require_service and creds.service is None:
            raise ConfigError(f"serve.profile=cluster: /rank and /feedback need a service "
                              f"token; set {SERVICE_ENV} or {SERVICE_ENV}_FILE on every node")
        return creds

    @staticmethod
    def bearer(header: str | None) -> bytes | None:
        """The token of an ``Authorization: Bearer <token>`` header (None: none given)."""
        if not header:
            return None
        scheme, _, token = header.strip().partition(" ")
        return token.strip().encode() if scheme.lower() == "bearer" and token.strip() else None

    def refusal(self, kind: str, header: str | None) -> tuple[int, str] | None:
        """None if a call of ``kind`` (operator | service | read) with this Authorization
        header is allowed, else (status, reason)."""
        given = self.bearer(header)
        if kind == "operator":
            if self.operator is None:
                return 403, (f"operator calls are off: no operator token is configured "
                             f"({OPERATOR_ENV} or {OPERATOR_ENV}_FILE)")
            ok = given is not None and _matches(self.operator, given)
        elif self.service is None:  # service and read calls are open without a service token
            return None
        elif kind == "service":
            ok = given is not None and _matches(self.service, given)
        else:  # read: either token
            ok = given is not None and (_matches(self.service, given)
                                        | _matches(self.operator, given))
        if ok:
            return None
        return 401, ("a bearer token is required (Authorization: Bearer ...)" if given is None
                     else "the bearer token is not valid for this call")


def _guard(kind: str):
    # no ``from __future__ import annotations`` in this module: FastAPI reads ``Request``
    # from this signature's annotation object
    async def check(request: Request) -> None:
        creds: Credentials | None = getattr(request.app.state, "credentials", None)
        if creds is None:  # no router has started: nothing to check against, nothing allowed
            raise HTTPException(503, detail=[{"loc": ["header", "authorization"],
                                              "msg": "the app is starting"}])
        refused = creds.refusal(kind, request.headers.get("authorization"))
        if refused is not None:
            creds.refused[kind] += 1
            status, msg = refused
            raise HTTPException(status, detail=[{"loc": ["header", "authorization"],
                                                 "msg": msg}],
                                headers={"WWW-Authenticate": "Bearer"} if status == 401 else None)
    return check


operator_call = _guard("operator")  # FastAPI dependencies, one per kind of call
service_call = _guard("service")
read_call = _guard("read")
