"""The skip every RocketMQ test module carries."""

from __future__ import annotations

import os

import pytest

from qclient.engines.rocketmq.local.runtime import missing

#: skips a module when no Java 17+ or no RocketMQ jars are here; CI installs the jars in
#: `make setup`, so there (``$CI`` set) a missing JVM or jar is a failure, not a skip
_WHY = missing()
needs_rocketmq = pytest.mark.skipif(_WHY is not None and not os.environ.get("CI"), reason=str(_WHY))
