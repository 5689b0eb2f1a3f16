"""Fixtures of the routing tests: the producer tests' mocked HTTP transport."""

from tests.producer.conftest import respx_transport

__all__ = ["respx_transport"]
