"""The byte tokenizer of rltok models for transformers: ids are the UTF-8 bytes of the text.

Ids 0..255 are bytes, 256 is BOS (prepended by default, as rltok prepends it to every document;
the model predicts it as end of document, so it is also ``eos_token``), 257 is PAD (input only).
Special-token strings typed in the text are bytes like any other (``split_special_tokens``): the
text ``"<|bos|>"`` is seven bytes, as rltok reads it. Decoding joins the bytes and replaces
invalid UTF-8 with U+FFFD, as rltok does.

This file is copied into every export (``rltok.hf.save_for_transformers``).
"""

from __future__ import annotations

from transformers import PreTrainedTokenizer

from ..schema import BOS, N_INPUT_IDS, PAD

BOS_TOKEN = "<|bos|>"
PAD_TOKEN = "<|pad|>"


class RltokByteTokenizer(PreTrainedTokenizer):
    """Bytes as ids with rltok's special ids (BOS 256, PAD 257)."""

    model_input_names = ["input_ids", "attention_mask"]
    vocab_files_names: dict = {}

    def __init__(self, bos_token: str = BOS_TOKEN, eos_token: str = BOS_TOKEN, pad_token: str = PAD_TOKEN,
                 add_bos_token: bool = True, split_special_tokens: bool = True, **kwargs):
        for name in ("unk_token", "sep_token", "cls_token", "mask_token"):
            kwargs.pop(name, None)  # no such ids
        kwargs.pop("added_tokens_decoder", None)  # fixed: the two special ids
        # saved into tokenizer_config.json: AutoTokenizer(trust_remote_code=True) finds this class
        kwargs.setdefault("auto_map", {"AutoTokenizer": ["tokenization_rltok.RltokByteTokenizer", None]})
        self.add_bos_token = bool(add_bos_token)
        self._added_tokens_decoder = {}
        kwargs["clean_up_tokenization_spaces"] = False  # bytes are the text: nothing to clean
        super().__init__(bos_token=bos_token, eos_token=eos_token, pad_token=pad_token,
                         split_special_tokens=split_special_tokens, add_bos_token=add_bos_token, **kwargs)

    # -- vocabulary: 256 byte tokens (one character each, chr(byte)), then BOS and PAD --------------
    @property
    def vocab_size(self) -> int:
        return N_INPUT_IDS

    def get_vocab(self) -> dict[str, int]:
        vocab = {chr(i): i for i in range(256)}
        vocab.update({str(self.bos_token): BOS, str(self.pad_token): PAD})
        return vocab

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        return [chr(b) for b in text.encode("utf-8")]

    def _convert_token_to_id(self, token: str) -> int:
        if token == str(self.bos_token):
            return BOS
        if token == str(self.pad_token):
            return PAD
        if len(token) == 1 and ord(token) < 256:
            return ord(token)
        raise ValueError(f"{token!r} is not a byte token")

    def _convert_id_to_token(self, index: int) -> str:
        if index == BOS:
            return str(self.bos_token)
        if index == PAD:
            return str(self.pad_token)
        if 0 <= index < 256:
            return chr(index)
        raise ValueError(f"id {index} is outside the byte vocabulary (0..{N_INPUT_IDS - 1})")

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        out, run = [], bytearray()
        for t in tokens:
            if len(t) == 1 and ord(t) < 256:
                run.append(ord(t))
                continue
            out.append(run.decode("utf-8", errors="replace"))
            run = bytearray()
            out.append(t)
        out.append(run.decode("utf-8", errors="replace"))
        return "".join(out)

    # -- special tokens: BOS in front (when add_bos_token), nothing at the end -----------------------
    def build_inputs_with_special_tokens(self, token_ids_0: list[int], token_ids_1: list[int] | None = None) -> list[int]:
        bos = [BOS] if self.add_bos_token else []
        return bos + token_ids_0 + (token_ids_1 or [])

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        return 1 if self.add_bos_token else 0

    def get_special_tokens_mask(self, token_ids_0: list[int], token_ids_1: list[int] | None = None,
                                already_has_special_tokens: bool = False) -> list[int]:
        if already_has_special_tokens:
            return [int(i in (BOS, PAD)) for i in token_ids_0 + (token_ids_1 or [])]
        return ([1] if self.add_bos_token else []) + [0] * (len(token_ids_0) + len(token_ids_1 or []))

    def create_token_type_ids_from_sequences(self, token_ids_0: list[int],
                                             token_ids_1: list[int] | None = None) -> list[int]:
        return [0] * len(self.build_inputs_with_special_tokens(token_ids_0, token_ids_1))

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str, ...]:
        return ()  # the vocabulary is the 256 bytes: nothing to save
