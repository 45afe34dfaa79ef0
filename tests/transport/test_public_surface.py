"""cluster.transport declares its public surface, and every name of it resolves."""

from __future__ import annotations

import pytest

import cluster.transport as transport


@pytest.mark.parametrize("name", transport.__all__)
def test_every_public_name_resolves(name: str) -> None:
    assert getattr(transport, name).__name__ == name


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="NoSuchThing"):
        transport.NoSuchThing  # noqa: B018
