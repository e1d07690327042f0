"""One scheduler thread owns the model and the DDTree engine. HTTP handler threads submit `GenRequest`s
into a bounded queue and read events from each request's own queue; between rounds the scheduler admits
queued requests into free batch slots (continuous batching), runs one round for every active slot and
hands each request its new tokens."""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddtree_engine.serve.config import ServerConfig
from ddtree_engine.serve.metrics import Metrics
from ddtree_engine.tokenizer import ByteTokenizer, IncrementalDetokenizer

log = logging.getLogger("ddtree_engine.serve")
KERNEL_HEAD_DIMS = (64, 128, 256)  # what libddtree's tree_attention kernel supports


class QueueFull(Exception):
    pass


class NotReady(Exception):
    pass


@dataclass
class GenRequest:
    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 0.0
    seed: int = 0
    stop: list[str] = field(default_factory=list)
    budget: int = 0
    ignore_eos: bool = False
    # Events for the handler: ("text", str) chunks, then ("done", finish_reason) or ("error", message).
    events: "queue.Queue[tuple[str, Any]]" = field(default_factory=queue.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    completion_tokens: int = 0
    # scheduler-private
    _detok: IncrementalDetokenizer = field(default_factory=IncrementalDetokenizer)
    _text: str = ""
    _sent: int = 0


class Scheduler:
    def __init__(self, cfg: ServerConfig, metrics: Metrics) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.tokenizer = ByteTokenizer()
        self.queue: "queue.Queue[GenRequest]" = queue.Queue(maxsize=cfg.max_queued_requests)
        self.ready = threading.Event()
        self.load_error: str | None = None
        self.stopping = threading.Event()  # no new requests; finish running ones
        self.stopped = threading.Event()
        self.engine: Any = None
        self._drain_deadline = float("inf")
        self.device = "cpu"
        self.backend_name = "none"
        self._thread = threading.Thread(target=self._main, name="ddtree-scheduler", daemon=True)

    # ---- handler side -------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def submit(self, req: GenRequest) -> None:
        if self.stopping.is_set():
            raise NotReady("server is shutting down")
        if not self.ready.is_set():
            raise NotReady(self.load_error or "model is still loading")
        try:
            self.queue.put_nowait(req)
        except queue.Full:
            raise QueueFull(f"request queue is full ({self.cfg.max_queued_requests} waiting)") from None
        self.metrics.num_queue_reqs = self.queue.qsize()

    def begin_drain(self, timeout: float) -> None:
        """Stop admitting; running requests may finish for up to `timeout` s, then fail."""
        self._drain_deadline = time.monotonic() + timeout  # set before the flag the loop reads
        self.stopping.set()

    def shutdown(self, timeout: float) -> None:
        """begin_drain (if not begun) and wait for the scheduler thread to finish."""
        if not self.stopping.is_set():
            self.begin_drain(timeout)
        self._thread.join(timeout + 10)

    # ---- scheduler thread ---------------------------------------------------------------------------
    def _load(self) -> None:
        import torch

        from ddtree_engine.backend import default_backend
        from ddtree_engine.decode import DDTreeEngine
        from ddtree_engine.drafter import TinyDrafter, distill_drafter
        from ddtree_engine.model import ModelConfig, TinyTransformer, random_weights
        from ddtree_engine.model_io import load_model

        cfg = self.cfg
        if cfg.load_delay:
            # Simulates a slow model load so health checks can be tested (503 while loading).
            deadline = time.monotonic() + cfg.load_delay
            while time.monotonic() < deadline and not self.stopping.is_set():
                time.sleep(0.05)
        dev = cfg.device
        if dev == "auto":
            dev = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = dev
        if not dev.startswith("cuda"):
            torch.set_num_threads(cfg.cpu_threads)
        mpath = cfg.model_path
        if mpath.startswith("random:"):
            mcfg, weights = ModelConfig(), random_weights(ModelConfig(), int(mpath.split(":", 1)[1] or 0))
        elif Path(mpath).exists():
            mcfg, weights = load_model(mpath)
        elif cfg.allow_random_weights:
            log.warning("model path %s does not exist: using random weights (seed %d)", mpath, cfg.random_seed)
            mcfg, weights = ModelConfig(), random_weights(ModelConfig(), cfg.random_seed)
        else:
            raise FileNotFoundError(
                f"model path {mpath!r} does not exist (use random:SEED or --allow-random-weights for a test model)"
            )
        if mcfg.vocab_size < self.tokenizer.stop_ids[-1] + 2:
            raise ValueError(f"model vocab {mcfg.vocab_size} is too small for the byte tokenizer")
        # CPU: exact fp64-accumulate numerics. GPU: bf16 K/V so the CUDA tree-attention kernel applies.
        if dev.startswith("cuda"):
            model = TinyTransformer(mcfg, weights, device=dev, exact=False, act_dtype=torch.float32,
                                    kv_dtype=torch.bfloat16)
        else:
            model = TinyTransformer(mcfg, weights, device=dev)
        budget = cfg.speculative_ddtree_budget if cfg.ddtree_enabled else 0
        drafter = TinyDrafter(model, block_len=cfg.speculative_block_size - 1, seed=cfg.random_seed + 1)
        if budget and cfg.draft_distill_steps:
            agree = distill_drafter(model, drafter, steps=cfg.draft_distill_steps, seed=cfg.random_seed)
            log.info("drafter distilled for %d steps: held-out agreement %s", cfg.draft_distill_steps,
                     ", ".join(f"{k} {v:.2f}" for k, v in agree.items()))
        backend = default_backend(dev)
        if backend.name == "cuda" and mcfg.head_dim not in KERNEL_HEAD_DIMS:
            from ddtree_engine.backend import mixed_backend
            from ddtree_engine.reference.tree_attention import tree_attention

            log.warning("head_dim %d has no tree-attention kernel: using the PyTorch reference attention",
                        mcfg.head_dim)
            backend = mixed_backend("cuda+ref-attention", backend, tree_attention=tree_attention)
        self.backend_name = backend.name
        self.budget = budget
        self.engine = DDTreeEngine(
            model, drafter, backend, slots=cfg.max_running_requests, max_budget=budget,
            max_context=cfg.context_length, topk=cfg.speculative_ddtree_topk, stop_ids=self.tokenizer.stop_ids,
        )
        if dev.startswith("cuda") and cfg.cuda_graph and backend.graph_safe:
            self.engine.capture_graph()

    def _main(self) -> None:
        try:
            self._load()
        except Exception as e:  # reported in the log; the main thread exits 1
            self.load_error = f"model load failed: {type(e).__name__}: {e}"
            log.error("%s", self.load_error)
            self._fail_queued(self.load_error)
            self.stopped.set()
            return
        if not self.stopping.is_set():
            self.ready.set()
            log.info("ready: model %s on %s (%s ops), budget %d", self.cfg.model_name, self.device,
                     self.backend_name, self.budget)
        owner: dict[int, GenRequest] = {}
        try:
            self._loop(owner)
        except Exception as e:  # a bug or device error: fail everything clearly rather than hang clients
            log.exception("scheduler crashed")
            for req in owner.values():
                req.events.put(("error", f"engine failure: {type(e).__name__}: {e}"))
            self._fail_queued(f"engine failure: {type(e).__name__}: {e}")
        finally:
            self.metrics.num_running_reqs = 0
            self.stopped.set()

    def _loop(self, owner: dict[int, GenRequest]) -> None:
        eng = self.engine
        while True:
            if self.stopping.is_set():
                self._fail_queued("server is shutting down; request not started")
                if not owner:
                    return
                if time.monotonic() > self._drain_deadline:
                    for slot, req in list(owner.items()):
                        eng.release(slot)
                        req.events.put(("error", "server shut down before the request finished"))
                        owner.pop(slot)
                    return
            else:
                self._admit(owner)
            for slot, req in list(owner.items()):
                if req.cancelled.is_set():
                    eng.release(slot)
                    owner.pop(slot)
            self.metrics.num_running_reqs = len(owner)
            self.metrics.num_queue_reqs = self.queue.qsize()
            if not owner:
                if not self.stopping.is_set():
                    try:
                        req = self.queue.get(timeout=0.05)
                    except queue.Empty:
                        continue
                    self._start(req, owner)
                continue
            t0 = time.perf_counter()
            out = eng.step()
            self.metrics.rounds += 1
            self.metrics.round_seconds += time.perf_counter() - t0
            for slot, toks in out.new_tokens.items():
                req = owner.get(slot)
                if req is None:
                    continue
                self.metrics.generation_tokens += len(toks)
                self.metrics.round_tokens += len(toks)
                reason = out.finished.get(slot)
                done = self._emit(req, toks, reason)
                if done is not None:
                    if reason is None:  # stopped by a stop string on the host: free the device slot
                        eng.release(slot)
                    owner.pop(slot)
                    self.metrics.requests_finished += 1

    def _admit(self, owner: dict[int, GenRequest]) -> None:
        while len(owner) < self.engine.B:
            try:
                req = self.queue.get_nowait()
            except queue.Empty:
                return
            self._start(req, owner)

    def _start(self, req: GenRequest, owner: dict[int, GenRequest]) -> None:
        from ddtree_engine.decode import Request

        if req.cancelled.is_set():
            return
        slot = next(s for s in range(self.engine.B) if s not in owner)
        try:
            self.engine.admit(slot, Request(prompt=req.prompt_ids, max_new_tokens=req.max_tokens,
                                            budget=min(req.budget, self.budget), temperature=req.temperature,
                                            seed=req.seed, ignore_stop=req.ignore_eos))
        except ValueError as e:
            req.events.put(("error", str(e)))
            return
        self.metrics.prompt_tokens += len(req.prompt_ids)
        owner[slot] = req

    def _emit(self, req: GenRequest, toks: list[int], reason: str | None) -> str | None:
        """Send new text to the request; returns the finish reason once it is finished."""
        stops = set(self.tokenizer.stop_ids)
        text_toks = [t for t in toks if t not in stops]
        req.completion_tokens += len(toks)
        req._text += req._detok.push(text_toks)
        if reason is not None:
            req._text += req._detok.flush()
        for s in req.stop:
            cut = req._text.find(s)
            if cut >= 0:
                req._text = req._text[:cut]
                reason = "stop"
        # Hold back a tail that could still grow into a stop string.
        hold = 0 if reason else max((len(s) - 1 for s in req.stop), default=0)
        upto = max(req._sent, len(req._text) - hold)
        if upto > req._sent:
            req.events.put(("text", req._text[req._sent:upto]))
            req._sent = upto
        if reason is not None:
            req.events.put(("done", reason))
        return reason

    def _fail_queued(self, message: str) -> None:
        while True:
            try:
                req = self.queue.get_nowait()
            except queue.Empty:
                break
            req.events.put(("error", message))
        self.metrics.num_queue_reqs = 0


def random_seed() -> int:
    return int.from_bytes(os.urandom(7), "little")
