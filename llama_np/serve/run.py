"""Start the server: load the model, bind the port, run uvicorn until SIGTERM or ^C."""

from __future__ import annotations

import argparse
import signal
import socket
import sys
import threading
from collections.abc import Callable

import uvicorn

from bench.probe import load_probe
from llama_np.api import LLM
from llama_np.errors import UsageError
from llama_np.model.kvcache import check_batch_fits
from llama_np.serve.app import Server as Shared
from llama_np.serve.app import create_app
from llama_np.serve.engine import Engine
from llama_np.serve.metrics import Metrics
from llama_np.serve.network import Limits, load_keys, uvicorn_config
from quant.host import usable_cores


def on_signals(server: uvicorn.Server, shared: Shared) -> None:
    """SIGTERM or ^C: take no more requests (503), let uvicorn close (the running requests
    finish, or are cancelled after --shutdown-timeout); a second ^C quits at once."""

    def handle(sig: int, frame: object) -> None:
        shared.shutting_down = True
        if server.should_exit and sig == signal.SIGINT:
            server.force_exit = True
        server.should_exit = True

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handle)


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, or one line saying why not (before the model loads)."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        # listening from here: a client that connects as soon as "serving" is printed
        # waits in the backlog until uvicorn accepts, instead of being refused
        sock.listen(2048)
    except OSError as e:
        raise UsageError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def run_http(server: uvicorn.Server, sock: socket.socket, engine: Engine) -> None:
    try:
        server.run(sockets=[sock])
    finally:
        engine.stop()  # a server that failed to start must not leave the loop waiting


def serve(args: argparse.Namespace, load: Callable[[], LLM]) -> int:
    """`llama-np serve`: listen first (a port taken is said before the model loads), then
    `load()` the model and run the engine loop on this thread, uvicorn on another."""
    keys = load_keys(args.api_key, args.api_key_file)  # a bad key file: said before loading
    limits = Limits(args.max_tokens_limit, args.max_n, args.max_body_bytes,
                    args.request_timeout, args.idle_timeout)  # fmt: skip
    sock = bind(args.host, args.port)
    llm = load()
    with llm:
        ctx = min(args.ctx_size or 2048, llm.config.max_seq_len)
        window = args.window  # None: the model's own, per layer
        check_batch_fits(llm.model, args.parallel, ctx, window, args.kv)
        engine = Engine(llm, args.parallel, ctx, args.kv, window, args.chunk, args.max_queue,
                        args.cache_prompt)  # fmt: skip
        engine.warm_up()
        probe = load_probe(args.threads or usable_cores())
        if probe is None:
            print("llama-np: note: no probe of this machine: /metrics leaves out the speed-"
                  "of-light figures (run `llama-np probe` once)", file=sys.stderr)  # fmt: skip
        model_id = args.alias or llm.config.name
        app = create_app(engine, model_id, Metrics(engine, probe, window), args.verbose, keys,
                         limits)  # fmt: skip
        config = uvicorn_config(app, limits, args.verbose, args.shutdown_timeout)
        port = sock.getsockname()[1]
        guarded = f", {len(keys)} API key{'s' * (len(keys) > 1)}" if keys else ""
        print(f"llama-np: serving {model_id} at http://{args.host}:{port}/v1 ({args.parallel} "
              f"slots of {ctx} tokens, {llm.kernels}{guarded})", file=sys.stderr,
              flush=True)  # fmt: skip
        server = uvicorn.Server(config)  # on a thread: it leaves the signals to us
        http = threading.Thread(target=run_http, args=(server, sock, engine), name="http",
                                daemon=True)  # fmt: skip
        on_signals(server, app.state.server)
        http.start()
        try:
            engine.run()  # the kernels' calls all come from this thread (Engine.start: why)
        finally:
            server.should_exit = True  # the loop failed: no server without it
            http.join(args.shutdown_timeout + 5)
    print("llama-np: server stopped", file=sys.stderr)
    return 0
