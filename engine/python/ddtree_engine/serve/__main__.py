"""Entry point: `python -m ddtree_engine.serve [--config file.yaml] [--host H] [--port P] ...`.

Exit codes: 0 after a clean shutdown (SIGTERM/SIGINT: stop accepting, drain running requests for up to
--drain-timeout seconds, fail the rest with a clear error), 2 for a bad flag or config file, 1 when the
port cannot be bound or the model cannot be loaded."""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time

from ddtree_engine.serve.config import ConfigError, load_config


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = load_config(argv)
    except ConfigError as e:
        print(f"ddtree_engine.serve: error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=getattr(logging, cfg.log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    log = logging.getLogger("ddtree_engine.serve")
    from ddtree_engine.serve.http import Server

    try:
        server = Server(cfg)
    except OSError as e:
        print(f"ddtree_engine.serve: error: cannot listen on {cfg.host}:{cfg.port}: {e.strerror}", file=sys.stderr)
        return 1
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received %s: draining", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.scheduler.start()
    http_thread = threading.Thread(target=server.httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                   name="http", daemon=True)
    http_thread.start()
    log.info("listening on http://%s:%d (model %s, loading)", cfg.host, server.port, cfg.model_name)
    while not stop.wait(0.2):
        if server.scheduler.load_error:
            # Exit non-zero so systemd marks the unit failed (and Restart=on-failure applies).
            log.error("exiting: %s", server.scheduler.load_error)
            server.httpd.shutdown()
            server.httpd.server_close()
            return 1
    # New generation requests now get 503; the listener closes; running requests may finish.
    server.scheduler.begin_drain(cfg.drain_timeout)
    server.httpd.shutdown()
    server.httpd.server_close()
    server.scheduler.shutdown(cfg.drain_timeout)
    deadline = time.monotonic() + 5.0  # let handler threads write their last bytes
    while server.inflight and time.monotonic() < deadline:
        time.sleep(0.02)
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
