"""The embedded tiny Qwen-Image: code-built tokenizer, determinism, stock pipeline, PATH load."""

import subprocess
import sys

import numpy as np
import pytest
import torch

import ditmem.models as dm
from ditmem.models import GenerationRequest
from ditmem.models.common.tokenizer import QWEN_SPECIAL_TOKENS, qwen_tokenizer, t5_tokenizer
from ditmem.models.qwen.tiny import build_pipeline

CHECKSUM = """
import torch
from ditmem.models.qwen.tiny import build_pipeline
pipe = build_pipeline(seed=0)
total = sum(float(p.detach().double().sum())
            for m in (pipe.transformer, pipe.vae, pipe.text_encoder) for p in m.parameters())
print(repr(total))
"""


def _checksum(pipe) -> float:
    return sum(float(p.detach().double().sum())
               for m in (pipe.transformer, pipe.vae, pipe.text_encoder) for p in m.parameters())


@pytest.fixture(scope="module")
def pipe():
    return build_pipeline(seed=0)


def test_tokenizers_are_byte_level_with_special_tokens():
    tok = qwen_tokenizer()
    assert len(tok) == 256 + len(QWEN_SPECIAL_TOKENS)
    text = "<|im_start|>user\nhé 7<|im_end|>"
    ids = tok(text).input_ids
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")
    assert ids[-1] == tok.convert_tokens_to_ids("<|im_end|>")
    assert len(ids) == 2 + len("user\nhé 7".encode())  # one id per UTF-8 byte
    assert tok.decode(ids) == text
    t5 = t5_tokenizer()
    enc = t5(["ab", "abcd"], padding="max_length", max_length=6)
    assert enc.input_ids[0] == [97, 98, t5.eos_token_id] + [t5.pad_token_id] * 3
    assert enc.attention_mask[1] == [1] * 5 + [0]


@pytest.mark.slow
def test_weights_deterministic_across_processes(pipe):
    out = subprocess.run([sys.executable, "-c", CHECKSUM], capture_output=True, text=True,
                         check=True)
    assert float(out.stdout.strip().splitlines()[-1]) == _checksum(pipe)
    assert _checksum(build_pipeline(seed=1)) != _checksum(pipe)


def test_stock_pipeline_runs_end_to_end_with_cfg(pipe):
    def run():
        return pipe("a red cat", negative_prompt="blurry", true_cfg_scale=4.0, height=64,
                    width=64, num_inference_steps=3, output_type="np",
                    generator=torch.Generator().manual_seed(0)).images

    a, b = run(), run()
    assert a.shape == (1, 64, 64, 3) and np.isfinite(a).all()
    assert np.array_equal(a, b)
    assert a.std() > 1e-3


@pytest.mark.slow
def test_load_from_a_diffusers_folder(tmp_path, pipe):
    pipe.save_pretrained(tmp_path)
    gen = dm.load(str(tmp_path))
    tiny = dm.load("tiny-qwen-image")
    request = GenerationRequest("hello", width=64, height=64, num_inference_steps=2, seed=5)
    assert np.array_equal(gen.reference(request), tiny.reference(request))
