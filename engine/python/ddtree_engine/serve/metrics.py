"""Prometheus text exposition of the server's gauges and counters. Names follow SGLang's
(`sglang:num_running_reqs`, `sglang:num_queue_reqs`, token counters) so the same drain check works on
both; DDTree-specific series are prefixed `ddtree:`."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class Metrics:
    model_name: str = ""
    num_running_reqs: int = 0
    num_queue_reqs: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests_total: int = 0
    requests_finished: int = 0
    requests_rejected: int = 0
    rounds: int = 0
    round_tokens: int = 0  # new tokens over all slots and rounds (accepted drafts + bonus)
    round_seconds: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def render(self) -> str:
        label = '{model_name="%s"}' % self.model_name.replace("\\", "\\\\").replace('"', '\\"')
        rows = [
            ("sglang:num_running_reqs", "gauge", "Requests decoding in a batch slot now.", self.num_running_reqs),
            ("sglang:num_queue_reqs", "gauge", "Requests waiting for a batch slot.", self.num_queue_reqs),
            ("sglang:prompt_tokens_total", "counter", "Prompt tokens prefilled.", self.prompt_tokens),
            ("sglang:generation_tokens_total", "counter", "Tokens generated.", self.generation_tokens),
            ("sglang:num_requests_total", "counter", "Generation requests accepted.", self.requests_total),
            ("ddtree:requests_finished_total", "counter", "Requests that finished.", self.requests_finished),
            ("ddtree:requests_rejected_total", "counter", "Requests refused (bad input, queue full, loading).",
             self.requests_rejected),
            ("ddtree:rounds_total", "counter", "Decoding rounds (one target forward each).", self.rounds),
            ("ddtree:round_tokens_total", "counter", "New tokens summed over slots and rounds.", self.round_tokens),
            ("ddtree:round_seconds_total", "counter", "Wall time spent in rounds.", round(self.round_seconds, 6)),
        ]
        out = []
        for name, kind, help_text, value in rows:
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name}{label} {value}"]
        return "\n".join(out) + "\n"
