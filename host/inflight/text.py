"""Text in and out of a checkpoint: its `tokenizers` tokenizer and its chat template.

    codec = TextCodec.from_dir(path)     # tokenizer.json (+ tokenizer_config.json)
    ids = codec.encode("Hello")          # the tokenizer's own special tokens (BOS) included
    prompt = codec.chat([{"role": "user", "content": "Hi"}])   # the chat template, rendered
    stream = codec.stream(stop=["\\n\\n"]); stream.update(ids); stream.take()

The chat template is rendered as `transformers` renders it: jinja2's sandbox with trim_blocks
and lstrip_blocks, `raise_exception`, `tojson`, `strftime_now`, the tokenizer's special tokens
(`bos_token`, `eos_token`, ...) and `add_generation_prompt`.

`TextStream` turns a growing list of generated token ids into text pieces: the text of all
tokens is decoded again each time (a piece of a multi-byte character is held back until the
character is complete) and stop strings are looked for in it: the text ends before the first
one found, and any tail that could still become a stop string is held back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")


class TextError(ValueError):
    """The tokenizer files are missing or unusable, or a chat cannot be rendered."""


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # AddedToken as tokenizer_config.json stores it
        return value.get("content")
    return value


@dataclass
class TextCodec:
    tokenizer: Any  # tokenizers.Tokenizer
    config: dict[str, Any] = field(default_factory=dict)
    chat_template: str | None = None

    @classmethod
    def from_dir(cls, path: str | Path) -> TextCodec:
        from tokenizers import Tokenizer

        path = Path(path)
        file = path / "tokenizer.json"
        if not file.is_file():
            raise TextError(f"'{path}' holds no tokenizer.json")
        try:
            tokenizer = Tokenizer.from_file(str(file))
        except Exception as exc:  # noqa: BLE001 - the library's own error types
            raise TextError(f"'{file}' cannot be loaded: {exc}") from None
        config: dict[str, Any] = {}
        cfg_file = path / "tokenizer_config.json"
        if cfg_file.is_file():
            try:
                config = json.loads(cfg_file.read_text())
            except ValueError as exc:
                raise TextError(f"'{cfg_file}' is not valid JSON: {exc}") from None
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        jinja = path / "chat_template.jinja"
        if template is None and jinja.is_file():
            template = jinja.read_text()
        return cls(tokenizer, config, template)

    # --- tokens ----------------------------------------------------------------------------------
    def special(self, key: str) -> str | None:
        return _token_text(self.config.get(key))

    def token_id(self, text: str | None) -> int | None:
        return None if text is None else self.tokenizer.token_to_id(text)

    @property
    def eos_token_id(self) -> int | None:
        return self.token_id(self.special("eos_token"))

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_texts(self, ids: list[int]) -> list[str]:
        """Each token's own text (decoded alone: byte-level pieces of a character may be '\\ufffd')."""
        return [self.tokenizer.decode([i], skip_special_tokens=False) for i in ids]

    # --- chat --------------------------------------------------------------------------------------
    def chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
             **extra: Any) -> str:
        if not self.chat_template:
            raise TextError("this model has no chat template (tokenizer_config.json chat_template)")
        values = {k: self.special(k) for k in SPECIAL_KEYS}
        values.update(extra)
        try:
            return _compile(self.chat_template).render(
                messages=messages, add_generation_prompt=add_generation_prompt, **values)
        except TextError:
            raise
        except Exception as exc:  # noqa: BLE001 - jinja2's errors, the template's own
            raise TextError(f"the chat template failed: {type(exc).__name__}: {exc}") from None

    def chat_ids(self, messages: list[dict[str, Any]], **extra: Any) -> list[int]:
        # the template writes the special tokens itself (as transformers' apply_chat_template)
        return self.encode(self.chat(messages, **extra), add_special_tokens=False)

    def stream(self, stop: list[str] | tuple[str, ...] = (), skip_special_tokens: bool = True) -> TextStream:
        return TextStream(self, list(stop), skip_special_tokens)


_TEMPLATES: dict[str, Any] = {}


def _compile(source: str) -> Any:
    template = _TEMPLATES.get(source)
    if template is None:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TextError(f"the chat template refused the messages: {message}")

        def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
                   separators: Any = None, sort_keys: bool = False) -> str:
            return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                              sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        template = _TEMPLATES[source] = env.from_string(source)
    return template


@dataclass
class TextStream:
    codec: TextCodec
    stop: list[str]
    skip_special_tokens: bool = True
    ids: list[int] = field(default_factory=list)
    text: str = ""
    sent: int = 0  # characters of `text` already taken
    stopped: bool = False

    def update(self, ids: list[int]) -> bool:
        """The generated tokens so far; True once a stop string was found (the text ends before it)."""
        if self.stopped:
            return True
        self.ids = list(ids)
        text = self.codec.decode(self.ids, self.skip_special_tokens)
        if self.stop:
            start = max(0, len(self.text) - max(map(len, self.stop)))
            found = [i for i in (text.find(s, start) for s in self.stop) if i >= 0]
            if found:
                text, self.stopped = text[:min(found)], True
        self.text = text
        return self.stopped

    def take(self, final: bool = False) -> str:
        """The text not taken yet; before the end, without an incomplete character or a tail
        that may still become a stop string."""
        end = len(self.text)
        if not (final or self.stopped):
            while end > self.sent and self.text[end - 1] == "\ufffd":
                end -= 1
            for s in self.stop:
                for k in range(min(len(s) - 1, end - self.sent), 0, -1):
                    if self.text[end - k:end] == s[:k]:
                        end -= k
                        break
        piece = self.text[self.sent:end]
        self.sent = max(self.sent, end)
        return piece
