"""Byte-level tokenizer: ids 0-255 are the bytes of UTF-8 text, then a few special tokens. Nothing to
download, every string round-trips, and any vocab_size >= NUM_SPECIAL_END works (ids past the specials are
reserved: a random model may emit them; they decode to nothing)."""

from __future__ import annotations

import codecs
from typing import Iterable, Sequence

BOS, EOS, IM_START, IM_END, PAD = 256, 257, 258, 259, 260
NUM_SPECIAL_END = 261
SPECIAL_NAMES = {BOS: "<|bos|>", EOS: "<|eos|>", IM_START: "<|im_start|>", IM_END: "<|im_end|>", PAD: "<|pad|>"}


class ByteTokenizer:
    bos_id, eos_id, im_start_id, im_end_id = BOS, EOS, IM_START, IM_END

    def __init__(self, vocab_size: int = 320) -> None:
        if vocab_size < NUM_SPECIAL_END:
            raise ValueError(f"vocab_size must be >= {NUM_SPECIAL_END} (256 bytes + specials), got {vocab_size}")
        self.vocab_size = vocab_size

    def encode(self, text: str, *, bos: bool = False) -> list[int]:
        # Special-token spellings inside user text stay plain bytes: text can never inject a control token.
        ids = list(text.encode("utf-8"))
        return [BOS, *ids] if bos else ids

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(t for t in ids if 0 <= t < 256).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """ChatML-like: <|im_start|>role\\ncontent<|im_end|>\\n per message, then the assistant header."""
        ids = [BOS]
        for m in messages:
            ids += [IM_START, *self.encode(f"{m['role']}\n{m['content']}"), IM_END, *self.encode("\n")]
        return ids + [IM_START, *self.encode("assistant\n")]

    @property
    def stop_ids(self) -> list[int]:
        return [EOS, IM_END]


class IncrementalDetokenizer:
    """Streams text from token ids without splitting a multi-byte UTF-8 character across chunks."""

    def __init__(self) -> None:
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, ids: Iterable[int]) -> str:
        return self._dec.decode(bytes(t for t in ids if 0 <= t < 256))

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)
