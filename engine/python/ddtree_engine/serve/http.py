"""HTTP front end (stdlib ThreadingHTTPServer): OpenAI-compatible completions and chat completions
(streaming as server-sent events), /v1/models, /health, /health_generate, /server_info, /metrics."""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ddtree_engine.serve.config import ServerConfig
from ddtree_engine.serve.metrics import Metrics
from ddtree_engine.serve.scheduler import GenRequest, NotReady, QueueFull, Scheduler, random_seed

log = logging.getLogger("ddtree_engine.serve")
MAX_BODY = 1 << 20
HEALTH_TIMEOUT = 20.0
# A request that produces no event for this long fails (the scheduler is wedged or gone).
EVENT_TIMEOUT = 300.0


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param, self.status = param, status


def _get(body: dict[str, Any], key: str, types: type | tuple[type, ...], default: Any = None) -> Any:
    if key not in body or body[key] is None:
        return default
    value = body[key]
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise BadRequest(f"'{key}' must be {_type_name(types)}, got a boolean", key)
    if not isinstance(value, types):
        raise BadRequest(f"'{key}' must be {_type_name(types)}, got {type(value).__name__}", key)
    return value


def _type_name(types: type | tuple[type, ...]) -> str:
    ts = types if isinstance(types, tuple) else (types,)
    return " or ".join({"int": "an integer", "float": "a number", "str": "a string", "bool": "a boolean",
                        "list": "a list", "dict": "an object"}.get(t.__name__, t.__name__) for t in ts)


class Server:
    def __init__(self, cfg: ServerConfig) -> None:
        self.cfg = cfg
        self.metrics = Metrics(model_name=cfg.model_name)
        self.scheduler = Scheduler(cfg, self.metrics)
        self.started = time.time()
        self.inflight = 0
        self.inflight_lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"app": self})
        self.httpd = ThreadingHTTPServer((cfg.host, cfg.port), handler)
        self.httpd.daemon_threads = True

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    # ---- request parsing ----------------------------------------------------------------------------
    def parse_generation(self, body: dict[str, Any], chat: bool) -> tuple[GenRequest, bool]:
        cfg, tok = self.cfg, self.scheduler.tokenizer
        model = _get(body, "model", str)
        if model is not None and model not in (cfg.model_name, cfg.model_path):
            raise BadRequest(f"model {model!r} is not served here (this server serves {cfg.model_name!r})", "model")
        if chat:
            messages = _get(body, "messages", list)
            if not messages:
                raise BadRequest("'messages' is required and must be a non-empty list", "messages")
            for i, m in enumerate(messages):
                if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(
                        m.get("content"), str):
                    raise BadRequest(f"messages[{i}] must be an object with string 'role' and 'content'",
                                     "messages")
            ids = tok.apply_chat_template(messages)
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
                prompt = prompt[0]
            if isinstance(prompt, str):
                ids = tok.encode(prompt, bos=True)
            elif isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
                if any(not 0 <= t < tok.vocab_size for t in prompt):
                    raise BadRequest(f"prompt token ids must lie in [0, {tok.vocab_size})", "prompt")
                ids = list(prompt)
            elif prompt is None:
                raise BadRequest("'prompt' is required", "prompt")
            else:
                raise BadRequest("'prompt' must be a string, a list of one string, or a non-empty list of "
                                 "token ids", "prompt")
        room = cfg.context_length - len(ids)
        if room < 1:
            raise BadRequest(f"prompt is {len(ids)} tokens; the context limit is {cfg.context_length}", "prompt")
        key = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
        max_tokens = _get(body, key, int, min(cfg.default_max_tokens, room))
        if not 1 <= max_tokens <= room:
            raise BadRequest(f"'{key}' must be between 1 and {room} for this prompt ({len(ids)} tokens, "
                             f"context {cfg.context_length}), got {max_tokens}", key)
        temperature = float(_get(body, "temperature", (int, float), 1.0))
        if not 0.0 <= temperature <= 2.0:
            raise BadRequest(f"'temperature' must be between 0 and 2, got {temperature}", "temperature")
        top_p = float(_get(body, "top_p", (int, float), 1.0))
        if top_p != 1.0:
            raise BadRequest("only top_p = 1 is supported (sampling stays lossless under DDTree)", "top_p")
        if _get(body, "n", int, 1) != 1:
            raise BadRequest("only n = 1 is supported", "n")
        for unsupported in ("logprobs", "top_logprobs", "echo", "best_of", "suffix", "tools", "logit_bias"):
            if body.get(unsupported) not in (None, False, [], {}) and not (
                    unsupported == "best_of" and body.get(unsupported) == 1):
                raise BadRequest(f"'{unsupported}' is not supported by this server", unsupported)
        stop = body.get("stop")
        if stop is None:
            stops: list[str] = []
        elif isinstance(stop, str):
            stops = [stop]
        elif isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= 4:
            stops = list(stop)
        else:
            raise BadRequest("'stop' must be a string or a list of at most 4 strings", "stop")
        if any(not s for s in stops):
            raise BadRequest("'stop' strings must be non-empty", "stop")
        seed = _get(body, "seed", int)
        budget = _get(body, "ddtree_budget", int, self.cfg.speculative_ddtree_budget)
        if budget < 0:
            raise BadRequest("'ddtree_budget' must be >= 0", "ddtree_budget")
        stream = _get(body, "stream", bool, False)
        ignore_eos = _get(body, "ignore_eos", bool, False)
        req = GenRequest(prompt_ids=ids, max_tokens=max_tokens, temperature=temperature,
                         seed=(seed if seed is not None else random_seed()) & ((1 << 63) - 1), stop=stops,
                         budget=budget, ignore_eos=ignore_eos)
        return req, stream


class _Handler(BaseHTTPRequestHandler):
    app: Server
    server_version = "ddtree-engine"
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args: Any) -> None:
        log.debug("%s " + fmt, self.address_string(), *args)

    # ---- responses ----------------------------------------------------------------------------------
    def _send(self, status: int, payload: Any, content_type: str = "application/json") -> None:
        data = payload if isinstance(payload, bytes) else (
            payload.encode() if isinstance(payload, str) else json.dumps(payload).encode())
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _error(self, status: int, message: str, param: str | None = None, etype: str | None = None) -> None:
        etype = etype or {400: "invalid_request_error", 404: "not_found_error", 405: "invalid_request_error",
                          413: "invalid_request_error", 429: "rate_limit_error"}.get(status, "server_error")
        self._send(status, {"object": "error", "message": message, "type": etype, "code": status,
                            "error": {"message": message, "type": etype, "param": param, "code": status}})

    # ---- routing ------------------------------------------------------------------------------------
    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        app, sched = self.app, self.app.scheduler
        if path == "/health":
            if sched.ready.is_set() and not sched.stopping.is_set():
                self._send(200, b"", "text/plain")
            else:
                self._error(503, sched.load_error or ("shutting down" if sched.stopping.is_set() else "loading"))
        elif path == "/health_generate":
            self._health_generate()
        elif path == "/v1/models":
            self._send(200, {"object": "list", "data": [{
                "id": app.cfg.model_name, "object": "model", "created": int(app.started), "owned_by": "ddtree-engine",
                "root": app.cfg.model_path, "max_model_len": app.cfg.context_length}]})
        elif path == "/get_model_info":
            self._send(200, {"model_path": app.cfg.model_path, "served_model_name": app.cfg.model_name,
                             "is_generation": True, "tokenizer_path": "byte-level (built in)"})
        elif path in ("/server_info", "/get_server_info"):
            info = app.cfg.server_info()
            info.update({"status": "ready" if sched.ready.is_set() else ("failed" if sched.load_error else "loading"),
                         "draining": sched.stopping.is_set(), "device": sched.device,
                         "ops_backend": sched.backend_name, "version": "ddtree-engine-0.1"})
            self._send(200, info)
        elif path == "/metrics":
            self._send(200, app.metrics.render(), "text/plain; version=0.0.4")
        else:
            self._error(404, f"no route for GET {path}")

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if path not in ("/v1/completions", "/v1/chat/completions"):
            self._read_body(ignore_errors=True)
            self._error(404 if not path.startswith("/health") else 405, f"no route for POST {path}")
            return
        chat = path == "/v1/chat/completions"
        app = self.app
        try:
            body = self._read_body()
            req, stream = app.parse_generation(body, chat)
        except BadRequest as e:
            app.metrics.requests_rejected += 1
            self._error(e.status, str(e), e.param)
            return
        self._generate(req, stream, chat)

    def _read_body(self, ignore_errors: bool = False) -> dict[str, Any]:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY:
            self.close_connection = True
            if ignore_errors:
                return {}
            raise BadRequest(f"request body must have a Content-Length between 0 and {MAX_BODY}", status=413)
        raw = self.rfile.read(length) if length else b""
        if ignore_errors:
            return {}
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise BadRequest(f"request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise BadRequest(f"request body must be a JSON object, got {type(body).__name__}")
        return body

    # ---- generation ---------------------------------------------------------------------------------
    def _submit(self, req: GenRequest) -> bool:
        app = self.app
        try:
            app.scheduler.submit(req)
        except QueueFull as e:
            app.metrics.requests_rejected += 1
            self._error(429, str(e))
            return False
        except NotReady as e:
            app.metrics.requests_rejected += 1
            self._error(503, str(e))
            return False
        app.metrics.requests_total += 1
        return True

    def _events(self, req: GenRequest) -> Any:
        while True:
            try:
                yield req.events.get(timeout=EVENT_TIMEOUT)
            except queue.Empty:
                yield ("error", "timed out waiting for the engine")
                return

    def _generate(self, req: GenRequest, stream: bool, chat: bool) -> None:
        app = self.app
        with app.inflight_lock:
            app.inflight += 1
        try:
            if not self._submit(req):
                return
            rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
            if stream:
                self._stream(req, rid, chat)
            else:
                self._complete(req, rid, chat)
        finally:
            req.cancelled.set()
            with app.inflight_lock:
                app.inflight -= 1

    def _usage(self, req: GenRequest) -> dict[str, int]:
        p, c = len(req.prompt_ids), req.completion_tokens
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def _complete(self, req: GenRequest, rid: str, chat: bool) -> None:
        parts: list[str] = []
        for kind, value in self._events(req):
            if kind == "text":
                parts.append(value)
            elif kind == "error":
                self._error(503, value)
                return
            else:
                text, reason = "".join(parts), value
                break
        base = {"id": rid, "created": int(time.time()), "model": self.app.cfg.model_name, "usage": self._usage(req)}
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason}
            self._send(200, {**base, "object": "chat.completion", "choices": [choice]})
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
            self._send(200, {**base, "object": "text_completion", "choices": [choice]})

    def _stream(self, req: GenRequest, rid: str, chat: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        obj = "chat.completion.chunk" if chat else "text_completion"
        created, model = int(time.time()), self.app.cfg.model_name

        def chunk(text: str | None, reason: str | None, first: bool = False) -> dict[str, Any]:
            if chat:
                delta: dict[str, Any] = {"role": "assistant"} if first else {}
                if text is not None:
                    delta["content"] = text
                choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": reason}
            else:
                choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
            return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}

        try:
            if chat:
                self._sse(chunk("", None, first=True))
            for kind, value in self._events(req):
                if kind == "text":
                    self._sse(chunk(value, None))
                elif kind == "error":
                    self._sse({"object": "error", "message": value, "type": "server_error", "code": 503,
                               "error": {"message": value, "type": "server_error", "code": 503}})
                    break
                else:
                    final = chunk(None if chat else "", value)
                    final["usage"] = self._usage(req)
                    self._sse(final)
                    break
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            log.info("client of %s went away", rid)

    def _sse(self, payload: dict[str, Any]) -> None:
        self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
        self.wfile.flush()

    def _health_generate(self) -> None:
        sched = self.app.scheduler
        if not sched.ready.is_set() or sched.stopping.is_set():
            self._error(503, sched.load_error or ("shutting down" if sched.stopping.is_set() else "loading"))
            return
        req = GenRequest(prompt_ids=[sched.tokenizer.bos_id], max_tokens=1, budget=0)
        try:
            sched.submit(req)
        except (QueueFull, NotReady) as e:
            self._error(503, str(e))
            return
        try:
            kind, value = req.events.get(timeout=HEALTH_TIMEOUT)
            while kind == "text":
                kind, value = req.events.get(timeout=HEALTH_TIMEOUT)
        except queue.Empty:
            req.cancelled.set()
            self._error(503, f"one-token generation did not finish within {HEALTH_TIMEOUT:.0f} s")
            return
        if kind == "error":
            self._error(503, value)
        else:
            self._send(200, b"", "text/plain")
