"""Child of the file-size-limit test: a store whose files may not grow past a limit
(RLIMIT_FSIZE: EFBIG, the unprivileged stand-in for a full disk). Prints one JSON line."""

from __future__ import annotations

import json
import resource
import sys

from qclient.server.store import DelayStore, DiskFullError, NewMessage, StoreConfig


def main() -> None:
    data_dir, limit = sys.argv[1], int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    s = DelayStore(StoreConfig(data_dir=data_dir, bucket_ms=1000, fsync=False))
    s.open()
    out: dict[str, object] = {}
    try:
        for k in range(1000):
            before = s.stats()["log_bytes"]
            batch = [NewMessage("t", 0, f"m{k}-{i}", bytes(5000), 0) for i in range(10)]
            try:
                s.submit(batch).result(10)
            except DiskFullError as exc:
                out = {"error": str(exc), "before": before, "after": s.stats()["log_bytes"]}
                break
        s.submit([NewMessage("t", 0, "small", b"x", 0)]).result(10)  # goes on after it
        out["end"] = s.stats()["log_bytes"]
    finally:
        s.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
