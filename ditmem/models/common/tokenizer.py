"""Byte-level tokenizers built in code (no downloads) for the embedded tiny models.

Each tokenizer is a ``tokenizers`` BPE model whose vocabulary is the 256 byte symbols of
the byte-level alphabet with no merges (every UTF-8 byte is one token), plus the special
tokens a model's chat template or padding needs, appended after the bytes. Deterministic:
the same call builds the same ids in every process.

    qwen_tokenizer()   -> transformers.Qwen2TokenizerFast  (Qwen chat special tokens)
    t5_tokenizer()     -> transformers.PreTrainedTokenizerFast with <pad>, </s>, <unk> (ids 256-258)
"""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)

T5_SPECIAL_TOKENS = ("<pad>", "</s>", "<unk>")


def byte_vocab() -> dict[str, int]:
    """The 256 byte-level symbols mapped to ids 0..255 (in byte order)."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    # ByteLevel.alphabet() is a set; order it by the byte each symbol stands for.
    table = _byte_to_symbol()
    if set(table.values()) != set(alphabet):
        raise RuntimeError("tokenizers' ByteLevel alphabet differs from the GPT-2 byte table")
    return {table[b]: b for b in range(256)}


def _byte_to_symbol() -> dict[int, str]:
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def byte_level_tokenizer(special_tokens: tuple[str, ...] = ()) -> Tokenizer:
    """A raw ``tokenizers.Tokenizer``: byte-level BPE, no merges, ``special_tokens`` get
    ids 256, 257, ... in the given order."""
    tok = Tokenizer(models.BPE(vocab=byte_vocab(), merges=[], fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special_tokens])
    return tok


def qwen_tokenizer(model_max_length: int = 32768):
    """A ``Qwen2TokenizerFast`` over the byte-level vocabulary with the Qwen chat special
    tokens (``<|endoftext|>`` is pad/eos). Vocabulary size 256 + 8."""
    from transformers import Qwen2TokenizerFast

    tok = byte_level_tokenizer(QWEN_SPECIAL_TOKENS)
    return Qwen2TokenizerFast(
        tokenizer_object=tok,
        unk_token=None,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        model_max_length=model_max_length,
    )


def t5_tokenizer(model_max_length: int = 512):
    """A ``PreTrainedTokenizerFast`` for UMT5-style encoders: byte-level vocabulary with
    ``<pad>`` (id 256), ``</s>`` (257) appended to every sequence, ``<unk>`` (258)."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    tok = byte_level_tokenizer(T5_SPECIAL_TOKENS)
    eos_id = tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", eos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=model_max_length,
    )


def vocab_size(tokenizer) -> int:
    """Number of ids a tokenizer can emit (bytes + special tokens): the text encoder's
    minimum ``vocab_size``."""
    return len(tokenizer)
