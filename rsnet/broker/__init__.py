"""The rsnet stream broker: topics with durable, replayable logs, fan-out, auth and operations."""
