"""Audio diffusion transformers: a 1-D RoPE over the token sequence.

Shapes: ``D`` head_dim, ``R`` rotary_dim, ``N`` tokens. Each is ``posenc.RotaryEmbedding``
(Su et al. 2021, RoFormer, eq. 34) in the half-split layout at positions ``0 .. N-1`` over
the whole self-attention sequence (prefix tokens included):

* ACE-Step: the whole head, ``rope_theta`` (Qwen3's layout);
* Stable Audio Open: the first ``R = D/2`` features, theta 10000 (its pipeline builds the
  table, the attention processor rotates that part only);
* Stable Audio 3: the first ``R = D/2`` features, theta 10000;
* LongCat-Audio-DiT: the whole head, theta 100000 (audio latents and text each from 0);
* MiniMax-Music 3: the first ``rotary_dim`` features, theta 10000.

The grid arguments of ``diffusers_positions`` only count the tokens here: ``N = F H W``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc.diffusers._common import Config, Family, need, row
from posenc.encodings.rotary.module import RotaryEmbedding

__all__ = ["AUDIO_FAMILIES"]


def _ace_step(config: Config) -> RotaryEmbedding:
    return RotaryEmbedding(int(need(config, "head_dim")), base=float(need(config, "rope_theta")))


def _stable_audio(config: Config) -> RotaryEmbedding:
    width = int(need(config, "attention_head_dim"))
    return RotaryEmbedding(width, rotary_dim=width // 2)


def _stable_audio3(config: Config) -> RotaryEmbedding:
    width = int(need(config, "embed_dim")) // int(need(config, "num_heads"))
    return RotaryEmbedding(width, rotary_dim=width // 2)


def _longcat_audio(config: Config) -> RotaryEmbedding:
    width = int(need(config, "dit_dim")) // int(need(config, "dit_heads"))
    return RotaryEmbedding(width, base=100000.0)


def _minimax_music3(config: Config) -> RotaryEmbedding:
    width = int(need(config, "attention_head_dim"))
    return RotaryEmbedding(width, rotary_dim=int(need(config, "rotary_dim")))


def _sequence(config: Config, frames: int, height: int, width: int) -> Tensor:
    """Token indices ``[N]``, ``N = F H W``."""
    return torch.arange(frames * height * width)


AUDIO_FAMILIES: tuple[Family, ...] = (
    row(
        "ACE-Step 1-D RoPE", "AceStepTransformer1DModel", _ace_step, _sequence,
        "_ace_step_rotary_freqs (get_1d_rotary_pos_embed, half-split)",
    ),
    row(
        "Stable Audio Open 1-D partial RoPE", "StableAudioDiTModel", _stable_audio, _sequence,
        "the pipeline's get_1d_rotary_pos_embed, StableAudioAttnProcessor2_0",
    ),
    row(
        "LongCat-Audio-DiT 1-D RoPE", "LongCatAudioDiTTransformer", _longcat_audio, _sequence,
        "AudioDiTRotaryEmbedding, _apply_rotary_emb",
    ),
    row(
        "MiniMax-Music 3 1-D partial RoPE", "MiniMaxMusic3Transformer1DModel", _minimax_music3,
        _sequence, "MiniMaxMusic3RotaryEmbedding, _apply_partial_rotary_emb",
    ),
    row(
        "Stable Audio 3 1-D partial RoPE", "StableAudio3DiTModel", _stable_audio3, _sequence,
        "StableAudio3RotaryEmbedding, _apply_rotary_partial",
    ),
)  # fmt: skip
