"""``qclient.__all__`` is exactly the public names of the package (as httpx checks)."""

from __future__ import annotations

import inspect

import qclient
from qclient import errors


def test_all_is_the_public_names() -> None:
    def is_public(name: str) -> bool:
        value = getattr(qclient, name)
        return (
            not name.startswith("_")
            and name != "TYPE_CHECKING"
            and not inspect.ismodule(value)
            # (names imported for the package's own use: typing, __future__)
            and getattr(value, "__module__", "qclient").startswith("qclient")
        )

    public = {name for name in dir(qclient) if is_public(name)}
    lazy = set(qclient._LAZY)  # loaded on first use: not in dir() until then
    assert set(qclient.__all__) - {"__version__"} == public | lazy
    assert len(set(qclient.__all__)) == len(qclient.__all__)


def test_every_name_resolves_and_every_error_is_exported() -> None:
    for name in qclient.__all__:
        assert getattr(qclient, name) is not None
    assert set(errors.__all__) <= set(qclient.__all__)
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.QClientError)


def test_closed_errors_share_a_base() -> None:
    assert issubclass(qclient.ProducerClosedError, qclient.ClosedError)
    assert issubclass(qclient.ConsumerClosedError, qclient.ClosedError)
    assert not issubclass(qclient.ConsumerClosedError, qclient.ProducerClosedError)
