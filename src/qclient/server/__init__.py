"""Server side of qclient: the name server and the delay broker.

The SDK never imports this package; both share only :mod:`qclient.protocol`.
"""
