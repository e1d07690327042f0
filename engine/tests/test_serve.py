"""The reference server over real HTTP on 127.0.0.1: a real `python -m ddtree_engine.serve` subprocess."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

pytest.importorskip("torch")
for _op in ("draft_topk_lse", "build_tree", "tree_attention", "tree_accept", "kv_commit"):
    # The loop runs on the ops' PyTorch references; each lands with its op.
    pytest.importorskip(f"ddtree_engine.reference.{_op}", reason=f"reference {_op} not in the tree yet")

ENGINE_PY = Path(__file__).resolve().parents[1] / "python"
BOOT_TIMEOUT = 120.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Srv:
    def __init__(self, args: list[str], tmp: Path) -> None:
        self.port = _free_port()
        self.log = tmp / f"server-{self.port}.log"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ENGINE_PY), os.environ.get("PYTHONPATH")])),
                   PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ddtree_engine.serve", "--host", "127.0.0.1", "--port", str(self.port), *args],
            stdout=subprocess.DEVNULL, stderr=self.log.open("w"), env=env, stdin=subprocess.DEVNULL,
        )

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_listening(self) -> None:
        deadline = time.monotonic() + BOOT_TIMEOUT
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"server exited early:\n{self.log.read_text()}"
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.02)
        raise AssertionError(f"server never listened:\n{self.log.read_text()}")

    def wait_ready(self) -> None:
        self.wait_listening()
        deadline = time.monotonic() + BOOT_TIMEOUT
        while time.monotonic() < deadline:
            if self.get("/health")[0] == 200:
                return
            assert self.proc.poll() is None, f"server exited early:\n{self.log.read_text()}"
            time.sleep(0.1)
        raise AssertionError(f"server never became healthy:\n{self.log.read_text()}")

    def request(self, method: str, path: str, body: Any = None, raw: bytes | None = None,
                timeout: float = 120) -> tuple[int, bytes]:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def get(self, path: str) -> tuple[int, bytes]:
        return self.request("GET", path)

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        status, data = self.request("POST", path, body)
        return status, json.loads(data)

    def stream(self, path: str, body: dict[str, Any], on_event: Any = None) -> list[Any]:
        req = urllib.request.Request(self.base + path, data=json.dumps({**body, "stream": True}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        events: list[Any] = []
        with urllib.request.urlopen(req, timeout=120) as r:
            assert r.headers["Content-Type"].startswith("text/event-stream")
            for line in r:
                line = line.strip()
                if not line:
                    continue
                assert line.startswith(b"data: "), line
                payload = line[6:]
                ev = "[DONE]" if payload == b"[DONE]" else json.loads(payload)
                events.append(ev)
                if on_event:
                    on_event(ev)
        return events

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"server ignored SIGTERM:\n{self.log.read_text()}")
        return int(self.proc.returncode)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Srv]:
    """Configured like the unit ddtreectl renders: a --config YAML with SGLang's long names."""
    tmp = tmp_path_factory.mktemp("serve")
    cfg = tmp / "sglang-k26-ddtree.yaml"
    cfg.write_text(
        'model-path: "/models/Kimi-K2.6"\nserved-model-name: "kimi-k2.6"\ntp-size: 8\nhost: "0.0.0.0"\n'
        'port: 30000\nspeculative-algorithm: "DDTREE"\nspeculative-draft-model-path: "/models/Kimi-K2.6-DFlash"\n'
        "speculative-ddtree-budget: 8\n"
    )
    srv = Srv(["--config", str(cfg), "--allow-random-weights", "--random-seed", "0", "--max-running-requests",
               "3", "--max-queued-requests", "4", "--context-length", "512"], tmp)
    try:
        srv.wait_ready()
        yield srv
    finally:
        assert srv.stop() == 0, srv.log.read_text()


def _expected_greedy(prompt: str, max_tokens: int, ignore_eos: bool = False) -> tuple[str, int]:
    """What the server must answer at temperature 0: plain AR decoding of the same seeded model."""
    from ddtree_engine.decode import ar_generate
    from ddtree_engine.model import ModelConfig, TinyTransformer
    from ddtree_engine.tokenizer import ByteTokenizer

    tok = ByteTokenizer()
    model = TinyTransformer.random(ModelConfig(), seed=0)
    out = ar_generate(model, tok.encode(prompt, bos=True), max_tokens, stop_ids=() if ignore_eos else tok.stop_ids)
    return tok.decode(t for t in out if t not in tok.stop_ids), len(out)


def test_server_info_reports_rendered_config(server: Srv) -> None:
    status, info = server.request("GET", "/server_info")
    info = json.loads(info)
    assert status == 200
    assert info["tp_size"] == 8 and info["model_path"] == "/models/Kimi-K2.6"
    assert info["served_model_name"] == "kimi-k2.6"
    assert info["speculative_algorithm"] == "DDTREE" and info["speculative_ddtree_budget"] == 8
    assert info["speculative_draft_model_path"] == "/models/Kimi-K2.6-DFlash"
    assert info["port"] == server.port  # the command line wins over the file
    assert info["status"] == "ready"
    status, models = server.request("GET", "/v1/models")
    assert [m["id"] for m in json.loads(models)["data"]] == ["kimi-k2.6"]
    assert server.get("/health_generate")[0] == 200


def test_completion_greedy_equals_ar_decoding(server: Srv) -> None:
    status, body = server.post("/v1/completions", {"model": "kimi-k2.6", "prompt": "Hello, tree!",
                                                   "max_tokens": 40, "temperature": 0})
    assert status == 200, body
    text, n = _expected_greedy("Hello, tree!", 40)
    choice = body["choices"][0]
    assert body["object"] == "text_completion"
    assert choice["text"] == text
    assert body["usage"]["completion_tokens"] == n
    assert body["usage"]["prompt_tokens"] == len("Hello, tree!") + 1
    assert choice["finish_reason"] == ("length" if n == 40 else "stop")


def test_streaming_matches_non_streaming(server: Srv) -> None:
    body = {"prompt": "stream me", "max_tokens": 30, "temperature": 0}
    _, whole = server.post("/v1/completions", body)
    events = server.stream("/v1/completions", body)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


def test_chat_completion_and_chat_stream(server: Srv) -> None:
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    status, body = server.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 12, "temperature": 0})
    assert status == 200, body
    assert body["object"] == "chat.completion"
    msg = body["choices"][0]["message"]
    assert msg["role"] == "assistant" and isinstance(msg["content"], str)
    events = server.stream("/v1/chat/completions", {"messages": msgs, "max_tokens": 12, "temperature": 0})
    assert events[-1] == "[DONE]"
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1])
    assert text == msg["content"]


def test_seeded_sampling_is_reproducible(server: Srv) -> None:
    body = {"prompt": "dice", "max_tokens": 24, "temperature": 0.9, "seed": 1234}
    a = server.post("/v1/completions", body)[1]["choices"][0]["text"]
    b = server.post("/v1/completions", body)[1]["choices"][0]["text"]
    assert a == b


def test_stop_string_truncates(server: Srv) -> None:
    full, _ = _expected_greedy("x", 100, ignore_eos=True)
    # The random model's bytes are mostly not valid UTF-8; stop on a printable ASCII character.
    probe = next(c for c in full[5:] if c.isascii() and c.isprintable())
    body = {"prompt": "x", "max_tokens": 100, "temperature": 0, "ignore_eos": True}
    status, out = server.post("/v1/completions", {**body, "stop": [probe, "never-there"]})
    assert status == 200
    assert out["choices"][0]["text"] == full[: full.index(probe)]
    assert out["choices"][0]["finish_reason"] == "stop"
    events = server.stream("/v1/completions", {**body, "stop": probe})
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == full[: full.index(probe)]
    assert events[-2]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("path,raw,needle", [
    ("/v1/completions", b"{not json", "not valid JSON"),
    ("/v1/completions", b"[1, 2]", "JSON object"),
    ("/v1/completions", b'{"max_tokens": 5}', "'prompt' is required"),
    ("/v1/completions", b'{"prompt": 17}', "'prompt' must be"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": "10"}', "'max_tokens' must be an integer"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 0}', "'max_tokens' must be between"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 100000}', "'max_tokens' must be between"),
    ("/v1/completions", b'{"prompt": "x", "model": "gpt-9"}', "not served here"),
    ("/v1/completions", b'{"prompt": "x", "temperature": -1}', "'temperature'"),
    ("/v1/completions", b'{"prompt": "x", "stream": "yes"}', "'stream' must be a boolean"),
    ("/v1/completions", b'{"prompt": [1, 99999]}', "token ids"),
    ("/v1/completions", b'{"prompt": "x", "logprobs": 3}', "'logprobs' is not supported"),
    ("/v1/chat/completions", b'{"messages": []}', "'messages' is required"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user"}]}', "messages[0]"),
])
def test_malformed_requests_get_400_with_message(server: Srv, path: str, raw: bytes, needle: str) -> None:
    status, data = server.request("POST", path, raw=raw)
    assert status == 400, data
    err = json.loads(data)
    assert needle in err["error"]["message"] and err["error"]["code"] == 400


def test_unknown_route_is_404(server: Srv) -> None:
    assert server.get("/v2/nothing")[0] == 404


def test_concurrent_clients_get_their_own_answers(server: Srv) -> None:
    prompts = [f"client {i}" for i in range(6)]
    results: dict[int, Any] = {}

    def worker(i: int) -> None:
        results[i] = server.post("/v1/completions", {"prompt": prompts[i], "max_tokens": 16, "temperature": 0})

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    for i in range(6):
        status, body = results[i]
        assert status in (200, 429), body
        if status == 200:
            assert body["choices"][0]["text"] == _expected_greedy(prompts[i], 16)[0]
    assert sum(results[i][0] == 200 for i in range(6)) >= 3


def test_queue_bound_and_metrics_gauges(server: Srv) -> None:
    """3 slots + 4 queue places: a burst of 10 long requests gets some 429s, and /metrics shows the
    running and queued gauges while it lasts and zero afterwards."""
    statuses: list[int] = []
    seen: list[tuple[int, int]] = []

    def worker(i: int) -> None:
        statuses.append(server.post("/v1/completions", {"prompt": f"burst {i}", "max_tokens": 400,
                                                        "temperature": 0, "ignore_eos": True})[0])

    def gauges() -> tuple[int, int]:
        text = server.get("/metrics")[1].decode()
        vals = {line.split("{")[0]: int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
                if line.startswith("sglang:num_")}
        return vals["sglang:num_running_reqs"], vals["sglang:num_queue_reqs"]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        seen.append(gauges())
        time.sleep(0.05)
    assert sorted(set(statuses)) == [200, 429], statuses
    # Accepted = the 4 queue places + whatever the scheduler had already moved into its 3 slots.
    assert statuses.count(200) >= 5, statuses
    # The gauges saw the slots full and a queue, and never more than the configured bounds.
    assert max(r for r, _ in seen) == 3 and max(q for _, q in seen) >= 1, seen
    assert max(q for _, q in seen) <= 4, seen
    assert gauges() == (0, 0)
    metrics = server.get("/metrics")[1].decode()
    assert "sglang:generation_tokens_total" in metrics and "# TYPE sglang:num_queue_reqs gauge" in metrics


def test_health_generate_is_503_while_loading_then_200(tmp_path: Path) -> None:
    srv = Srv(["--load-delay", "6", "--model-path", "random:0"], tmp_path)
    try:
        srv.wait_listening()
        status, data = srv.get("/health_generate")
        assert status == 503 and b"loading" in data
        assert srv.get("/health")[0] == 503
        assert srv.post("/v1/completions", {"prompt": "x", "max_tokens": 2})[0] == 503
        srv.wait_ready()
        assert srv.get("/health_generate")[0] == 200
    finally:
        assert srv.stop() == 0


def test_sigterm_during_request_completes_it_and_exits_0(tmp_path: Path) -> None:
    srv = Srv(["--model-path", "random:0", "--speculative-algorithm", "DDTREE", "--ddtree-budget", "4",
               "--drain-timeout", "600"], tmp_path)
    srv.wait_ready()
    started = threading.Event()
    events: list[Any] = []

    def client() -> None:
        def on_event(ev: Any) -> None:
            if ev != "[DONE]" and ev["choices"][0]["text"]:
                started.set()
        events.extend(srv.stream("/v1/completions", {"prompt": "long", "max_tokens": 120, "temperature": 0,
                                                     "ignore_eos": True}, on_event))

    t = threading.Thread(target=client)
    t.start()
    assert started.wait(120), srv.log.read_text()
    srv.proc.send_signal(signal.SIGTERM)
    t.join(120)
    assert srv.proc.wait(60) == 0, srv.log.read_text()
    assert events[-1] == "[DONE]"
    final = events[-2]
    assert final["choices"][0]["finish_reason"] in ("length", "stop")
    text = "".join(e["choices"][0]["text"] for e in events[:-1])
    assert text == _expected_greedy("long", 120, ignore_eos=True)[0]
    assert final["usage"]["completion_tokens"] == 120


def test_sigterm_past_drain_timeout_fails_request_cleanly(tmp_path: Path) -> None:
    srv = Srv(["--model-path", "random:0", "--drain-timeout", "0.3", "--context-length", "4096"], tmp_path)
    srv.wait_ready()
    started = threading.Event()
    events: list[Any] = []

    def client() -> None:
        events.extend(srv.stream("/v1/completions", {"prompt": "x", "max_tokens": 4000, "temperature": 0,
                                                     "ignore_eos": True},
                                 lambda ev: started.set()))

    t = threading.Thread(target=client)
    t.start()
    assert started.wait(120)
    srv.proc.send_signal(signal.SIGTERM)
    t.join(120)
    assert srv.proc.wait(60) == 0, srv.log.read_text()
    assert events[-1] == "[DONE]"
    assert events[-2]["object"] == "error" and "shut down" in events[-2]["message"]


def test_serves_a_saved_model_file(tmp_path: Path) -> None:
    from ddtree_engine.decode import ar_generate
    from ddtree_engine.model import ModelConfig, TinyTransformer, random_weights
    from ddtree_engine.model_io import save_model
    from ddtree_engine.tokenizer import ByteTokenizer

    cfg = ModelConfig(d_model=64, n_heads=2, n_kv_heads=1, ffn_dim=176)
    weights = random_weights(cfg, seed=42)
    path = save_model(tmp_path / "model.pt", cfg, weights)
    srv = Srv(["--model-path", str(path), "--served-model-name", "tiny", "--speculative-algorithm", "DDTREE",
               "--ddtree-budget", "6"], tmp_path)
    try:
        srv.wait_ready()
        status, body = srv.post("/v1/completions", {"model": "tiny", "prompt": "saved", "max_tokens": 24,
                                                    "temperature": 0, "ignore_eos": True})
        assert status == 200, body
        tok = ByteTokenizer()
        ref = ar_generate(TinyTransformer(cfg, weights), tok.encode("saved", bos=True), 24)
        assert body["choices"][0]["text"] == tok.decode(ref)
    finally:
        assert srv.stop() == 0


def test_missing_model_path_exits_1_with_reason(tmp_path: Path) -> None:
    srv = Srv(["--model-path", str(tmp_path / "nope")], tmp_path)
    assert srv.proc.wait(BOOT_TIMEOUT) == 1
    log = srv.log.read_text()
    assert "does not exist" in log and str(tmp_path / "nope") in log


def test_bad_config_exits_2_with_file_and_key(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("model-path: x\nnot-a-flag: 3\n")
    env = dict(os.environ, PYTHONPATH=str(ENGINE_PY))
    r = subprocess.run([sys.executable, "-m", "ddtree_engine.serve", "--config", str(cfg)], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert str(cfg) in r.stderr and "not-a-flag" in r.stderr
