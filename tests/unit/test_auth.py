"""The app's credentials (``serve/auth.py``): tokens from the environment or a file, never a
default; operator calls off without a token; a constant-time check of each kind of call."""

from __future__ import annotations

import pytest

from serve.auth import OPERATOR_ENV, SERVICE_ENV, Credentials, load_token
from solaris.errors import ConfigError

OP, SVC = "o" * 20, "s" * 20


def test_tokens_come_from_the_variable_or_its_file(tmp_path):
    assert load_token(OPERATOR_ENV, {}) is None  # nothing set: no token, no default
    assert load_token(OPERATOR_ENV, {OPERATOR_ENV: f" {OP}\n"}) == OP.encode()
    f = tmp_path / "token"
    f.write_text(OP + "\n")
    assert load_token(OPERATOR_ENV, {f"{OPERATOR_ENV}_FILE": str(f)}) == OP.encode()
    with pytest.raises(ConfigError, match=f"{OPERATOR_ENV}_FILE='/nonexistent'"):
        load_token(OPERATOR_ENV, {f"{OPERATOR_ENV}_FILE": "/nonexistent"})
    with pytest.raises(ConfigError, match="5 characters; at least 16"):
        load_token(SERVICE_ENV, {SERVICE_ENV: "short"})


def test_operator_calls_are_off_without_a_token_and_401_on_a_wrong_one():
    none = Credentials.from_env(False, {})
    assert none.refusal("operator", f"Bearer {OP}")[0] == 403
    creds = Credentials.from_env(False, {OPERATOR_ENV: OP})
    assert creds.refusal("operator", f"Bearer {OP}") is None
    assert creds.refusal("operator", f"bearer  {OP} ") is None  # the scheme is case-blind
    for header in (None, "", "Bearer", f"Basic {OP}", f"Bearer {OP}x", f"Bearer {SVC}"):
        assert creds.refusal("operator", header)[0] == 401, header
    # no service token: service calls and reads are open
    assert creds.refusal("service", None) is None and creds.refusal("read", None) is None


def test_a_service_token_guards_service_calls_and_reads():
    creds = Credentials.from_env(True, {OPERATOR_ENV: OP, SERVICE_ENV: SVC})
    assert creds.refusal("service", f"Bearer {SVC}") is None
    assert creds.refusal("service", f"Bearer {OP}")[0] == 401  # not the operator's
    assert creds.refusal("service", None)[0] == 401
    assert creds.refusal("read", f"Bearer {OP}") is None  # reads take either
    assert creds.refusal("read", f"Bearer {SVC}") is None
    assert creds.refusal("read", "Bearer nope-nope-nope-nope")[0] == 401
    with pytest.raises(ConfigError, match=f"serve.profile=cluster.*{SERVICE_ENV}"):
        Credentials.from_env(True, {OPERATOR_ENV: OP})  # the cluster profile needs one
