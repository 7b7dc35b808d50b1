"""The token path off truss's event loop: stream-worker processes (docs/design.md, "Stream workers").

`pool.StreamPool` (in the truss process) starts N `worker` processes. Each worker tokenizes prompts,
calls the engine model with token ids over its own gRPC channel, decodes the streamed ids, matches
stop strings and counts usage, and sends the truss process per-request text updates, many per
socket write. The truss process only validates requests, routes them, and writes each stream
whatever text has arrived as one HTTP chunk.
"""
