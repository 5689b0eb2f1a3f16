"""Class data sharing for the local RocketMQ JVMs: one dynamic AppCDS archive per main
class (NameServer, broker), so a node maps RocketMQ's classes already parsed and verified
instead of loading them from the jars at every start (decision 0038: a 2-broker cluster
ready in 5.0 s instead of 8.5 s, 9.3 CPU seconds to ready instead of 16.5).

The archive lives beside the jars (``<lib>/.cds/``), named by a digest of the ``java``
binary, the main class and the class path (every jar's name, size and mtime), so new jars
or another JDK get a new archive. The first node of a main class to start while there is
none writes one when it stops (``-XX:ArchiveClassesAtExit``): a claim file (created with
``O_EXCL``, holding the claiming process's pid) makes it the only writer, the JVM writes
to a temporary name, and the node renames it into place once the JVM has exited. A node
killed (SIGKILL, as a crash) writes nothing and gives the claim back; a claim whose
process is gone is taken over. The JVM checks an archive against its own build and class
path and runs without one that does not match (``-Xshare:auto``, the default), so an
archive can make a start faster, never fail it. ``QCLIENT_ROCKETMQ_CDS=0`` turns it off.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import xxhash

__all__ = ["CDS_ENV", "Archive", "archive_for"]

log = logging.getLogger(__name__)

#: ``0`` turns class data sharing off (every node loads its classes from the jars)
CDS_ENV = "QCLIENT_ROCKETMQ_CDS"


@dataclass(frozen=True)
class Archive:
    """The archive of one main class on one class path, and its writer's files."""

    path: Path

    @property
    def _claim(self) -> Path:
        return self.path.with_name(self.path.name + ".claim")

    @property
    def _partial(self) -> Path:
        return self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")

    def flags(self) -> tuple[list[str], bool]:
        """The JVM flags of a start, and whether this start writes the archive (then
        ``published`` or ``abandoned`` must follow when its JVM has exited)."""
        if self.path.is_file():
            return [f"-XX:SharedArchiveFile={self.path}"], False
        if not self._take_claim():
            return [], False  # another node writes it; this one starts without
        return [f"-XX:ArchiveClassesAtExit={self._partial}"], True

    def published(self) -> None:
        """The writing JVM exited after a clean stop: put its archive in place."""
        try:
            if self._partial.is_file() and self._partial.stat().st_size > 0:
                os.replace(self._partial, self.path)
                log.info("class data archive written: %s", self.path)
                prefix = self.path.name.rsplit("-", 1)[0]
                for old in self.path.parent.glob(f"{prefix}-*.jsa"):
                    if old != self.path:  # an archive of jars replaced since
                        old.unlink(missing_ok=True)
        except OSError as exc:
            log.info("class data archive %s not written: %s", self.path, exc)
        finally:
            self.abandoned()

    def abandoned(self) -> None:
        """The writing JVM was killed, or the archive is in place: drop the partial
        file and the claim."""
        for f in (self._partial, self._claim):
            try:
                f.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.info("could not remove %s: %s", f, exc)

    def _take_claim(self) -> bool:
        for _ in range(2):  # once more after removing a dead process's claim
            try:
                fd = os.open(self._claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                if not self._claim_is_stale():
                    return False
                self._claim.unlink(missing_ok=True)
                continue
            except OSError:
                return False  # a read-only lib: no archive, starts as before
            with os.fdopen(fd, "w") as f:
                f.write(str(os.getpid()))
            return True
        return False

    def _claim_is_stale(self) -> bool:
        try:
            pid = int(self._claim.read_text())
        except (OSError, ValueError):
            return False  # being written by its claimer right now
        if pid == os.getpid():
            return False  # another node of this process writes it
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


def archive_for(java: str, lib: Path, main: str, classpath: tuple[Path, ...]) -> Archive | None:
    """The archive of ``main`` run by ``java`` on ``lib``'s jars and ``classpath``, or None
    when class data sharing is off or the jars cannot be listed."""
    if os.environ.get(CDS_ENV, "1") == "0":
        return None
    try:
        digest = xxhash.xxh3_64(os.path.realpath(java).encode())
        digest.update(main.encode())
        for jar in (*sorted(lib.glob("*.jar")), *classpath):
            st = jar.stat()
            digest.update(f"{jar.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode())
        folder = lib / ".cds"
        folder.mkdir(exist_ok=True)
    except OSError:
        return None
    return Archive(folder / f"{main.rsplit('.', 1)[-1]}-{digest.hexdigest()}.jsa")
