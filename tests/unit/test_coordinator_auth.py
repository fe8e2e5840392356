"""Coordinator authentication, tested without sockets: what a valid token is, what a client
sends, and which metadata the server accepts (``refusal``: None means served)."""

from __future__ import annotations

import string

import pytest

from orchestra._gang.coordinator import Coordinator
from orchestra._gang.coordinator_auth import (
    TOKEN_METADATA_KEY,
    new_token,
    refusal,
    token_metadata,
    validate_token,
)
from orchestra._gang.coordinator_client import CoordinatorClient

pytestmark = pytest.mark.timeout(10)

TOKEN = "s3cret-" + "a" * 57


def test_new_tokens_are_256_random_bits_in_hex() -> None:
    tokens = {new_token() for _ in range(100)}
    assert len(tokens) == 100
    assert all(len(t) == 64 and set(t) <= set(string.hexdigits.lower()) for t in tokens)


def test_a_client_sends_the_token_as_bearer_authorization_metadata() -> None:
    assert token_metadata(TOKEN) == ((TOKEN_METADATA_KEY, f"Bearer {TOKEN}"),)
    assert token_metadata(None) == ()


def test_the_metadata_a_client_sends_is_accepted() -> None:
    assert refusal(TOKEN, token_metadata(TOKEN)) is None
    assert refusal(TOKEN, [("user-agent", "grpc"), *token_metadata(TOKEN)]) is None
    assert refusal(TOKEN, [("authorization", f"Bearer {TOKEN}".encode())]) is None


@pytest.mark.parametrize("metadata, reason", [
    ([], "no token"),
    ([("user-agent", "xla")], "no token"),
    ([("x-orchestra-token", TOKEN)], "no token"),
    ([("authorization", TOKEN)], "wrong token"),                   # the scheme is required
    ([("authorization", f"Bearer {TOKEN[:-1]}")], "wrong token"),
    ([("authorization", f"Bearer {TOKEN}x")], "wrong token"),
    ([("authorization", f"bearer {TOKEN.upper()}")], "wrong token"),
    ([("authorization", "Bearer ")], "wrong token"),
], ids=["none", "other metadata", "other header", "bare token", "prefix", "longer",
        "other case", "empty"])
def test_metadata_without_the_exact_token_is_refused_naming_why(
        metadata: list[tuple[str, str]], reason: str) -> None:
    why = refusal(TOKEN, metadata)
    assert why is not None and reason in why
    assert TOKEN not in why     # a refusal never echoes the secret


@pytest.mark.parametrize("token, match", [
    ("", "empty"),
    ("has space", "printable ASCII without spaces"),
    (" lead", "printable ASCII without spaces"),
    ("new\nline", "printable ASCII without spaces"),
    ("caf\u00e9", "printable ASCII without spaces"),
])
def test_tokens_that_cannot_travel_as_metadata_are_refused(token: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        validate_token(token)


def test_a_coordinator_or_client_refuses_an_invalid_token_before_any_io() -> None:
    with pytest.raises(ValueError, match="empty"):
        Coordinator(1, token="")
    with pytest.raises(ValueError, match="printable ASCII"):
        CoordinatorClient("127.0.0.1:1", 0, token="two words")


def test_a_coordinator_knows_its_token_and_one_without_accepts_anyone() -> None:
    assert Coordinator(1, token=TOKEN).token == TOKEN
    assert Coordinator(1).token is None
    assert Coordinator(1).refused_calls == 0
