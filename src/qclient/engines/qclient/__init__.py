"""The engine shipped with qclient: its name server and delay broker, over HTTP."""
