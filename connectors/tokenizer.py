"""Hugging Face ``tokenizers`` tokenizers, loaded from a ``tokenizer.json``, encoding to int32 arrays."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from topics.errors import MixflowError

if TYPE_CHECKING:
    from tokenizers import Tokenizer


class TokenizerError(MixflowError):
    """A tokenizer file that is missing or cannot be loaded, or a token it does not know."""


class TextTokenizer:
    """Encodes batches of texts with the tokenizer's parallel batch encoding.

    Special tokens (BOS, a post-processor's template) are added only with ``add_special_tokens=True``;
    the end-of-document token is appended later, by the sample builder."""

    def __init__(self, tokenizer: Tokenizer, *, add_special_tokens: bool = False, name: str = "tokenizer") -> None:
        self._tokenizer = tokenizer
        self.add_special_tokens = add_special_tokens
        self.name = name

    @classmethod
    def from_file(cls, path: str | Path, *, add_special_tokens: bool = False) -> TextTokenizer:
        """Load any ``tokenizer.json``; ``TokenizerError`` naming the path when it cannot be loaded."""
        from tokenizers import Tokenizer  # here: a loader of a pre-tokenized source needs no tokenizer library

        path = Path(path)
        if not path.is_file():
            msg = f"tokenizer file {path} does not exist"
            raise TokenizerError(msg)
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # the Rust side raises plain Exception for any malformed file
            msg = f"cannot load tokenizer {path}: {exc}"
            raise TokenizerError(msg) from exc
        return cls(tokenizer, add_special_tokens=add_special_tokens, name=str(path))

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def text_token(self, token_id: int) -> str | None:
        """The token ``token_id`` stands for, when text tokenizes to it: an entry of the model's vocabulary or
        an added token that is not special. None for a special token (``<|endoftext|>``, ``<|vision_start|>``:
        text gives one only where it spells it out) and for an id past the vocabulary."""
        added = self._tokenizer.get_added_tokens_decoder()
        if token_id in added:
            return None if added[token_id].special else added[token_id].content
        return self._tokenizer.id_to_token(token_id)

    @property
    def padding_id(self) -> int | None:
        """The padding token the tokenizer file sets (its ``padding`` section), if any."""
        padding = self._tokenizer.padding
        return None if padding is None else int(padding["pad_id"])

    def token_id(self, token: str) -> int:
        """The id of ``token`` (e.g. ``"<|endoftext|>"``); ``TokenizerError`` when it is unknown."""
        token_id = self._tokenizer.token_to_id(token)
        if token_id is None:
            msg = f"token {token!r} is not in the vocabulary of {self.name}"
            raise TokenizerError(msg)
        return token_id

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """One int32 array of token ids per text, in order."""
        if not texts:
            return []
        encodings = self._tokenizer.encode_batch_fast(list(texts), add_special_tokens=self.add_special_tokens)
        return [np.asarray(encoding.ids, dtype=np.int32) for encoding in encodings]

    def decode(self, tokens: np.ndarray) -> str:
        return self._tokenizer.decode(tokens.tolist(), skip_special_tokens=False)
