"""Spark sink for qclient: the "qclient" data source and a pandas UDF (work in progress)."""
