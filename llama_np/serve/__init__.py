"""`llama-np serve`: an OpenAI-compatible HTTP server on continuous batching.

    engine.py     the loop that owns the model: slots, chunked prefill, batched steps
    protocol.py   OpenAI's request and response bodies, checked field by field
    app.py        the routes (starlette), streaming as server-sent events
    network.py    API keys, the body's limit, a deadline for a request to arrive
    metrics.py    GET /metrics: counters and the steps held against the speed of light

Needs the `serve` extra: pip install 'llama-np[serve]'.
"""
