"""Apache RocketMQ 5 engine: the remoting protocol codec and its drivers."""
