"""The class data archive's files without a JVM: one writer per archive, a dead writer's
claim taken over, a clean stop publishes, a kill leaves nothing, sharing can be off."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from qclient.engines.rocketmq.local.cds import CDS_ENV, Archive, archive_for

MAIN = "org.apache.rocketmq.broker.BrokerStartup"


@pytest.fixture
def lib(tmp_path: Path) -> Path:
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "rocketmq-broker-5.5.0.jar").write_bytes(b"jar")
    return lib


def _partial(flags: list[str]) -> Path:
    (flag,) = flags
    assert flag.startswith("-XX:ArchiveClassesAtExit=")
    return Path(flag.split("=", 1)[1])


def test_the_first_start_writes_and_the_next_maps(lib: Path) -> None:
    archive = archive_for("java", lib, MAIN, ())
    assert archive is not None and archive.path.parent == lib / ".cds"
    flags, writes = archive.flags()
    assert writes
    # another node meanwhile (this process or another) starts without
    assert archive_for("java", lib, MAIN, ()) == archive
    assert archive.flags() == ([], False)
    _partial(flags).write_bytes(b"archive")  # what the JVM writes at its exit
    archive.published()
    assert archive.path.read_bytes() == b"archive"
    assert archive.flags() == ([f"-XX:SharedArchiveFile={archive.path}"], False)
    assert sorted(p.name for p in archive.path.parent.iterdir()) == [archive.path.name]


def test_a_killed_writer_leaves_nothing_and_the_next_start_writes(lib: Path) -> None:
    archive = archive_for("java", lib, MAIN, ())
    assert archive is not None
    flags, _ = archive.flags()
    _partial(flags).write_bytes(b"half")
    archive.abandoned()
    assert list(archive.path.parent.iterdir()) == []
    assert archive.flags()[1]


def test_a_claim_of_a_process_that_died_is_taken_over(lib: Path) -> None:
    archive = archive_for("java", lib, MAIN, ())
    assert archive is not None
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    claim = archive.path.with_name(archive.path.name + ".claim")
    claim.write_text(dead.stdout.strip())
    assert archive.flags()[1]
    assert claim.read_text() == str(os.getpid())
    # a live process's claim is not taken: its JVM may be writing now
    claim.write_text(str(os.getppid()))
    assert archive.flags() == ([], False)


def test_new_jars_get_a_new_archive_and_the_old_one_goes(lib: Path) -> None:
    old = archive_for("java", lib, MAIN, ())
    assert old is not None
    flags, _ = old.flags()
    _partial(flags).write_bytes(b"old")
    old.published()
    (lib / "rocketmq-broker-5.5.0.jar").write_bytes(b"a new build")
    new = archive_for("java", lib, MAIN, ())
    assert new is not None and new.path != old.path
    flags, _ = new.flags()
    _partial(flags).write_bytes(b"new")
    new.published()
    assert [p.name for p in (lib / ".cds").iterdir()] == [new.path.name]


def test_sharing_off_or_a_read_only_lib_starts_as_before(
    lib: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CDS_ENV, "0")
    assert archive_for("java", lib, MAIN, ()) is None
    monkeypatch.delenv(CDS_ENV)
    ro = Archive(lib / "missing" / "BrokerStartup-0.jsa")  # its folder cannot take a claim
    assert ro.flags() == ([], False)


def test_a_broker_heap_below_its_start_is_a_clear_error() -> None:
    from qclient.engines.rocketmq.local import RocketMQCluster

    with pytest.raises(ValueError, match=r"^broker_heap_mb must be at least 256, got 128$"):
        RocketMQCluster(brokers=1, broker_heap_mb=128)
