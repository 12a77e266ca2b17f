"""The architecture corpus (issue 12 item 6): `transformers` architecture definitions at tiny configs,
exported by both torch exporters, with ONNX Runtime's outputs on fixed inputs beside each file.

    python tools/make_arch_corpus.py --out DIR [--models roberta,llama,...] [--exporters torchscript,dynamo]
        [--jobs N] [--static] [--list]

For every architecture (text encoders, decoder LLMs with grouped-query attention and rotary
embeddings, vision backbones, detection, segmentation, speech encoders) it builds the model from a
config written here (a few layers, widths of 16-64, but every block type the architecture has: GQA,
rotary, relative positions, sliding windows, windowed attention...), no hub access; seeds torch;
redraws the weights variance-preserving and calibrates BatchNorm on a random batch (tools/export_torch.py's
_rescale, so outputs are O(1)); exports it with ``torch.onnx.export(dynamo=False, opset_version=17)``
and ``torch.onnx.export(dynamo=True)`` (batch, and sequence for text, symbolic unless --static); checks
each file with onnx.checker and ONNX Runtime against PyTorch; and writes

    DIR/NAME.EXPORTER.onnx   the export
    DIR/NAME.EXPORTER.npz    the fixed inputs (``in.<name>``) and ONNX Runtime's outputs (``out.<name>``)
    DIR/manifest.json        versions (torch, transformers, onnx, onnxruntime, onnxscript), seed, and per
                             model and exporter: ok or the exporter's error, file, size, opset, op counts,
                             ORT against PyTorch

An exporter that fails is a row of the manifest with its error, not a missing file. With --jobs N
each model exports in its own process (a crash in one cannot take the others down). Models are not
committed; tools/check_models.py --arch-corpus DIR checks them. Needs torch, transformers and
onnxscript (the versions are whatever is installed: the manifest pins them).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import export_torch as et  # noqa: E402  (tools/export_torch.py: rescaling, exporters, checks)
from check_corpus import run_group  # noqa: E402  (a child process with its group, killed on timeout)

log = logging.getLogger("make_arch_corpus")

SEED = 0
DIMS = {"batch": 2, "seq": 16}  # the fixed inputs' example dims
VOCAB = 100
IMAGE = 32
EXPORTERS = ("torchscript", "dynamo")
H, L, FFN = 32, 2, 64  # hidden width, layers, FFN width of the transformer blocks


@dataclasses.dataclass
class Arch:
    name: str
    family: str  # text-encoder | decoder | seq2seq | vision | detection | segmentation | speech
    description: str
    build: Callable[[], Any]  # -> the transformers model
    inputs: list[et.InputSpec]
    outputs: list[str]


# ---- inputs -------------------------------------------------------------------------------------------


def _text(token_types: bool = False) -> list[et.InputSpec]:
    specs = [
        et.InputSpec("input_ids", "int64", ["batch", "seq"], 2, VOCAB, "int"),  # 0, 1 are pad ids in some
        et.InputSpec("attention_mask", "int64", ["batch", "seq"], 0, 2, "mask"),
    ]
    if token_types:
        specs.append(et.InputSpec("token_type_ids", "int64", ["batch", "seq"], 0, 2, "int"))
    return specs


def _image(size: int = IMAGE) -> list[et.InputSpec]:
    return [et.InputSpec("pixel_values", "float32", ["batch", 3, size, size])]


def _audio(samples: int) -> list[et.InputSpec]:
    return [et.InputSpec("input_values", "float32", ["batch", samples])]


def _mel(bins: int, frames: int) -> list[et.InputSpec]:
    return [et.InputSpec("input_features", "float32", ["batch", bins, frames])]


# ---- wrappers: forward(named inputs) -> tuple of tensors ----------------------------------------------


_wrap = et._wrap  # a module whose forward has one named parameter per input, returning a tuple


# ---- the architectures ----------------------------------------------------------------------------------
# Each builder imports its classes itself, so that one missing from an older transformers fails its own
# row only. Decoders: use_cache=False (no past key/values in the graph).


def _roberta() -> Any:
    from transformers import RobertaConfig, RobertaModel

    cfg = RobertaConfig(vocab_size=VOCAB, hidden_size=H, num_hidden_layers=L, num_attention_heads=4,
                        intermediate_size=FFN, max_position_embeddings=64, type_vocab_size=1)  # fmt: skip
    return RobertaModel(cfg, add_pooling_layer=False)


def _xlm_roberta() -> Any:
    from transformers import XLMRobertaConfig, XLMRobertaModel

    cfg = XLMRobertaConfig(vocab_size=VOCAB, hidden_size=H, num_hidden_layers=L, num_attention_heads=4,
                           intermediate_size=FFN, max_position_embeddings=64, type_vocab_size=1)  # fmt: skip
    return XLMRobertaModel(cfg)  # with the pooler (tanh over the first token)


def _albert() -> Any:
    from transformers import AlbertConfig, AlbertModel

    # factorized embeddings (16 -> 32) and one layer group shared by both layers
    cfg = AlbertConfig(vocab_size=VOCAB, embedding_size=16, hidden_size=H, num_hidden_layers=L,
                       num_attention_heads=4, intermediate_size=FFN, max_position_embeddings=64)  # fmt: skip
    return AlbertModel(cfg)


def _electra() -> Any:
    from transformers import ElectraConfig, ElectraModel

    cfg = ElectraConfig(vocab_size=VOCAB, embedding_size=16, hidden_size=H, num_hidden_layers=L,
                        num_attention_heads=4, intermediate_size=FFN, max_position_embeddings=64)  # fmt: skip
    return ElectraModel(cfg)


def _deberta_v2() -> Any:
    from transformers import DebertaV2Config, DebertaV2Model

    # disentangled attention: content-to-position and position-to-content terms over log buckets
    cfg = DebertaV2Config(vocab_size=VOCAB, hidden_size=H, num_hidden_layers=L, num_attention_heads=4,
                          intermediate_size=FFN, max_position_embeddings=64, relative_attention=True,
                          position_buckets=8, max_relative_positions=-1, pos_att_type=["p2c", "c2p"],
                          norm_rel_ebd="layer_norm", share_att_key=True, position_biased_input=False,
                          type_vocab_size=0)  # fmt: skip
    return DebertaV2Model(cfg)


def _mpnet() -> Any:
    from transformers import MPNetConfig, MPNetModel

    # T5-style relative position buckets added to every layer's attention scores (32 buckets: the model
    # computes them with its default of 32, whatever the config says)
    cfg = MPNetConfig(vocab_size=VOCAB, hidden_size=H, num_hidden_layers=L, num_attention_heads=4,
                      intermediate_size=FFN, max_position_embeddings=64)  # fmt: skip
    return MPNetModel(cfg, add_pooling_layer=False)


def _t5_encoder() -> Any:
    from transformers import T5Config, T5EncoderModel

    # relative position bias (bidirectional buckets) in the first layer, RMS norm, no biases, gated GELU
    cfg = T5Config(vocab_size=VOCAB, d_model=H, d_kv=8, d_ff=FFN, num_layers=L, num_heads=4,
                   relative_attention_num_buckets=8, relative_attention_max_distance=16,
                   feed_forward_proj="gated-gelu", use_cache=False)  # fmt: skip
    return T5EncoderModel(cfg)


def _modernbert() -> Any:
    from transformers import ModernBertConfig, ModernBertModel

    # rotary positions, alternating global and local (sliding-window) attention, GeGLU, no biases
    cfg = ModernBertConfig(vocab_size=VOCAB, hidden_size=H, intermediate_size=FFN, num_hidden_layers=3,
                           num_attention_heads=4, max_position_embeddings=64, global_attn_every_n_layers=2,
                           local_attention=8, pad_token_id=0, bos_token_id=1, eos_token_id=1, cls_token_id=1,
                           sep_token_id=1)  # fmt: skip
    return ModernBertModel(cfg)


def _decoder(config_cls: str, model_cls: str, **kw: Any) -> Callable[[], Any]:
    def build() -> Any:
        import transformers

        base = dict(vocab_size=VOCAB, hidden_size=H, intermediate_size=FFN, num_hidden_layers=L,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                    use_cache=False)  # fmt: skip
        base.update(kw)
        cfg = getattr(transformers, config_cls)(**{k: v for k, v in base.items() if v is not None})
        return getattr(transformers, model_cls)(cfg)

    return build


def _gpt_neox() -> Any:
    from transformers import GPTNeoXConfig, GPTNeoXModel

    # partial rotary (a quarter of each head), parallel attention and MLP residuals
    cfg = GPTNeoXConfig(vocab_size=VOCAB, hidden_size=H, num_hidden_layers=L, num_attention_heads=4,
                        intermediate_size=FFN, max_position_embeddings=64, rotary_pct=0.25,
                        use_parallel_residual=True, use_cache=False)  # fmt: skip
    return GPTNeoXModel(cfg)


def _opt() -> Any:
    from transformers import OPTConfig, OPTModel

    # learned positions offset by 2 (counted from the mask), ReLU FFN, pre-norm
    cfg = OPTConfig(vocab_size=VOCAB, hidden_size=H, num_hidden_layers=L, num_attention_heads=4, ffn_dim=FFN,
                    max_position_embeddings=64, word_embed_proj_dim=H, use_cache=False)  # fmt: skip
    return OPTModel(cfg)


def _falcon() -> Any:
    from transformers import FalconConfig, FalconModel

    # the new decoder architecture: grouped KV heads, parallel attention and MLP, rotary
    cfg = FalconConfig(vocab_size=VOCAB, hidden_size=H, num_hidden_layers=L, num_attention_heads=4,
                       new_decoder_architecture=True, num_kv_heads=2, parallel_attn=True, bias=False,
                       alibi=False, max_position_embeddings=64, use_cache=False)  # fmt: skip
    return FalconModel(cfg)


def _bloom() -> Any:
    from transformers import BloomConfig, BloomModel

    # ALiBi: per-head linear position biases instead of position embeddings; embedding LayerNorm
    cfg = BloomConfig(vocab_size=VOCAB, hidden_size=H, n_layer=L, n_head=4, use_cache=False)
    return BloomModel(cfg)


def _gpt_bigcode() -> Any:
    from transformers import GPTBigCodeConfig, GPTBigCodeModel

    # multi-query attention: one key/value head for all query heads, fused c_attn
    cfg = GPTBigCodeConfig(vocab_size=VOCAB, n_embd=H, n_layer=L, n_head=4, n_inner=FFN, n_positions=64,
                           multi_query=True, use_cache=False)  # fmt: skip
    return GPTBigCodeModel(cfg)


def _gptj() -> Any:
    from transformers import GPTJConfig, GPTJModel

    # interleaved (every-other-element) rotary on the first 4 dims of each head, parallel attention + MLP
    cfg = GPTJConfig(vocab_size=VOCAB, n_embd=H, n_layer=L, n_head=4, rotary_dim=4, n_positions=64, use_cache=False)
    return GPTJModel(cfg)


def _mamba() -> Any:
    from transformers import MambaConfig, MambaModel

    # selective state-space scan (the slow path: a loop over time steps), causal depthwise conv1d
    cfg = MambaConfig(vocab_size=VOCAB, hidden_size=H, state_size=8, num_hidden_layers=L, expand=2, conv_kernel=4,
                      use_cache=False)  # fmt: skip
    return MambaModel(cfg)


def _resnet() -> Any:
    from transformers import ResNetConfig, ResNetForImageClassification

    cfg = ResNetConfig(embedding_size=8, hidden_sizes=[8, 16, 16, 32], depths=[1, 1, 1, 1], num_labels=10)
    return ResNetForImageClassification(cfg)


def _convnext() -> Any:
    from transformers import ConvNextConfig, ConvNextForImageClassification

    cfg = ConvNextConfig(hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1], num_labels=10)
    return ConvNextForImageClassification(cfg)


def _mobilenet_v2() -> Any:
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    # TF-style "same" padding (explicit Pads before the strided depthwise convs), ReLU6
    return MobileNetV2ForImageClassification(MobileNetV2Config(num_labels=10, depth_multiplier=0.35, image_size=IMAGE))


def _efficientnet() -> Any:
    from transformers import EfficientNetConfig, EfficientNetModel

    # squeeze-excitation, swish, depthwise "same" padding; 0.25 width, 1 repeat per stage. hidden_dim is
    # the top BatchNorm's width, which must be the top conv's: round_filters(1280) = 320 at width 0.25
    cfg = EfficientNetConfig(image_size=IMAGE, width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320,
                             num_block_repeats=[1, 1, 1, 1, 1, 1, 1])  # fmt: skip
    return EfficientNetModel(cfg)


def _regnet() -> Any:
    from transformers import RegNetConfig, RegNetModel

    # grouped 3x3 convs (group width 8) with squeeze-excitation (RegNetY)
    cfg = RegNetConfig(embedding_size=8, hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1], groups_width=8,
                       layer_type="y")  # fmt: skip
    return RegNetModel(cfg)


def _convnextv2() -> Any:
    from transformers import ConvNextV2Config, ConvNextV2ForImageClassification

    # global response normalization (an L2 norm over H, W divided by its channel mean) in every block
    cfg = ConvNextV2Config(hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1], num_labels=10)
    return ConvNextV2ForImageClassification(cfg)


def _poolformer() -> Any:
    from transformers import PoolFormerConfig, PoolFormerModel

    # token mixing by AvgPool(3, count_include_pad=False) - x, GroupNorm(1), layer scale
    return PoolFormerModel(PoolFormerConfig(hidden_sizes=[16, 32, 32, 64], depths=[1, 1, 1, 1], mlp_ratio=2.0))


def _mobilevit() -> Any:
    from transformers import MobileViTConfig, MobileViTModel

    # inverted residuals, then transformers over unfolded 2x2 patches (reshape/transpose unfold and fold;
    # the last stage's 2x2 map is interpolated up to the patch size)
    cfg = MobileViTConfig(image_size=64, hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64],
                          num_attention_heads=2, patch_size=2)  # fmt: skip
    return MobileViTModel(cfg)


def _levit() -> Any:
    from transformers import LevitConfig, LevitModel

    # conv stem, attention with a learned per-offset bias (gathered), attention-subsample stages, hardswish
    cfg = LevitConfig(image_size=64, hidden_sizes=[32, 48, 64], num_attention_heads=[2, 3, 4], depths=[1, 1, 1],
                      key_dim=[8, 8, 8], attention_ratio=[2, 2, 2], mlp_ratio=[2, 2, 2],
                      down_ops=[["Subsample", 8, 2, 4, 2, 2], ["Subsample", 8, 4, 4, 2, 2]])  # fmt: skip
    return LevitModel(cfg)


def _dpt() -> Any:
    from transformers import DPTConfig, DPTForDepthEstimation

    # ViT, reassembled at 4 scales (transposed conv up, strided conv down), fusion blocks with bilinear
    # upsampling (align_corners), depth head
    cfg = DPTConfig(hidden_size=H, num_hidden_layers=4, num_attention_heads=4, intermediate_size=FFN,
                    image_size=IMAGE, patch_size=8, backbone_out_indices=[0, 1, 2, 3],
                    neck_hidden_sizes=[8, 16, 32, 32], fusion_hidden_size=16,
                    reassemble_factors=[4, 2, 1, 0.5])  # fmt: skip
    return DPTForDepthEstimation(cfg)


def _bart() -> Any:
    from transformers import BartConfig, BartModel

    # encoder-decoder: learned positions with BART's offset of 2, post-norm blocks, the decoder's
    # causal self-attention and cross-attention over the encoder (padding mask on the encoder side)
    cfg = BartConfig(vocab_size=VOCAB, d_model=H, encoder_layers=L, decoder_layers=L, encoder_attention_heads=4,
                     decoder_attention_heads=4, encoder_ffn_dim=FFN, decoder_ffn_dim=FFN, max_position_embeddings=64,
                     pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
                     use_cache=False)  # fmt: skip
    return BartModel(cfg)


def _clip_text() -> Any:
    from transformers import CLIPTextConfig, CLIPTextModel

    # causal mask and padding mask together, quick GELU, pooling at the highest token id (argmax)
    cfg = CLIPTextConfig(vocab_size=VOCAB, hidden_size=H, intermediate_size=FFN, num_hidden_layers=L,
                         num_attention_heads=4, max_position_embeddings=32, eos_token_id=VOCAB - 1)  # fmt: skip
    return CLIPTextModel(cfg)


def _detr() -> Any:
    from transformers import DetrConfig, DetrForObjectDetection, ResNetConfig

    # a ResNet backbone (transformers', not timm's), sine position embeddings over the feature map's
    # mask, an encoder-decoder over object queries, class and box heads
    bb = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], layer_type="basic",
                      out_features=["stage4"])  # fmt: skip
    cfg = DetrConfig(use_timm_backbone=False, backbone_config=bb, use_pretrained_backbone=False, d_model=H,
                     encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
                     encoder_ffn_dim=FFN, decoder_ffn_dim=FFN, num_queries=10, num_labels=3)  # fmt: skip
    return DetrForObjectDetection(cfg)


def _rt_detr() -> Any:
    from transformers import RTDetrConfig, RTDetrForObjectDetection, RTDetrResNetConfig

    # ResNet backbone, hybrid encoder (attention on the top level, CSP fusion), query selection by TopK,
    # multi-scale deformable attention (grid_sample) in the decoder, box refinement
    bb = RTDetrResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], layer_type="basic",
                            out_features=["stage2", "stage3", "stage4"])  # fmt: skip
    cfg = RTDetrConfig(backbone_config=bb, encoder_in_channels=[32, 64, 128], feat_strides=[8, 16, 32], d_model=H,
                       encoder_hidden_dim=H, encoder_ffn_dim=FFN, encoder_attention_heads=4, encoder_layers=1,
                       decoder_layers=1, decoder_attention_heads=4, decoder_ffn_dim=FFN, num_queries=10, num_labels=3,
                       decoder_in_channels=[H, H, H], num_feature_levels=3, decoder_n_points=2,
                       use_pretrained_backbone=False, num_denoising=0)  # fmt: skip
    return RTDetrForObjectDetection(cfg)


def _deit() -> Any:
    from transformers import DeiTConfig, DeiTModel

    # ViT with a distillation token beside the class token
    cfg = DeiTConfig(hidden_size=H, num_hidden_layers=L, num_attention_heads=4, intermediate_size=FFN,
                     image_size=IMAGE, patch_size=8)  # fmt: skip
    return DeiTModel(cfg, add_pooling_layer=False)


def _beit() -> Any:
    from transformers import BeitConfig, BeitModel

    # relative position bias per layer, layer scale, mean pooling
    cfg = BeitConfig(hidden_size=H, num_hidden_layers=L, num_attention_heads=4, intermediate_size=FFN,
                     image_size=IMAGE, patch_size=8, use_relative_position_bias=True, layer_scale_init_value=0.1,
                     use_mean_pooling=True)  # fmt: skip
    return BeitModel(cfg)


def _dinov2() -> Any:
    from transformers import Dinov2Config, Dinov2Model

    # layer scale, SwiGLU FFN, interpolated position embeddings
    cfg = Dinov2Config(hidden_size=H, num_hidden_layers=L, num_attention_heads=4, mlp_ratio=2, image_size=IMAGE,
                       patch_size=8, use_swiglu_ffn=True, layerscale_value=0.5)  # fmt: skip
    return Dinov2Model(cfg)


def _swin() -> Any:
    from transformers import SwinConfig, SwinModel

    # windowed attention with relative position bias; shifted windows' mask; patch merging
    cfg = SwinConfig(image_size=IMAGE, patch_size=2, embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=4)
    return SwinModel(cfg)


def _segformer() -> Any:
    from transformers import SegformerConfig, SegformerForSemanticSegmentation

    # overlapping patch embeddings, spatial-reduction attention, Mix-FFN (depthwise conv), all-MLP decoder
    cfg = SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                          patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
                          decoder_hidden_size=32, num_labels=5)  # fmt: skip
    return SegformerForSemanticSegmentation(cfg)


def _yolos() -> Any:
    from transformers import YolosConfig, YolosForObjectDetection

    # ViT with detection tokens; class logits and box MLP heads
    cfg = YolosConfig(hidden_size=H, num_hidden_layers=L, num_attention_heads=4, intermediate_size=FFN,
                      image_size=[IMAGE, IMAGE], patch_size=8, num_detection_tokens=5, num_labels=3)  # fmt: skip
    return YolosForObjectDetection(cfg)


MEL_BINS, MEL_FRAMES = 16, 32


def _whisper_encoder() -> Any:
    from transformers import WhisperConfig, WhisperModel

    # two 1-D convs (the second strided) over log-mel frames, sinusoidal positions, pre-norm blocks
    cfg = WhisperConfig(vocab_size=VOCAB, num_mel_bins=MEL_BINS, d_model=H, encoder_layers=L, decoder_layers=1,
                        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=FFN,
                        decoder_ffn_dim=FFN, max_source_positions=MEL_FRAMES // 2, max_target_positions=16,
                        pad_token_id=0, bos_token_id=1, eos_token_id=1, decoder_start_token_id=1,
                        use_cache=False)  # fmt: skip
    return WhisperModel(cfg).encoder


AUDIO = 800


def _speech(config_cls: str, model_cls: str) -> Callable[[], Any]:
    def build() -> Any:
        import transformers

        # conv feature encoder (group norm on the first layer), convolutional positions (weight norm)
        cfg = getattr(transformers, config_cls)(
            hidden_size=H, num_hidden_layers=L, num_attention_heads=4, intermediate_size=FFN,
            conv_dim=(16, 16, 16), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=4, feat_extract_norm="group", mask_time_prob=0.0)  # fmt: skip
        return getattr(transformers, model_cls)(cfg)

    return build


LHS = ["last_hidden_state"]
ARCHS: dict[str, Arch] = {
    a.name: a
    for a in [
        # text encoders
        Arch("roberta", "text-encoder", "RoBERTa (RobertaModel)", _roberta, _text(), LHS),
        Arch("xlm_roberta", "text-encoder", "XLM-R with pooler (XLMRobertaModel)", _xlm_roberta, _text(),
             ["last_hidden_state", "pooler_output"]),
        Arch("albert", "text-encoder", "ALBERT, shared layers, factorized embeddings", _albert, _text(True), LHS),
        Arch("electra", "text-encoder", "ELECTRA discriminator body", _electra, _text(True), LHS),
        Arch("deberta_v2", "text-encoder", "DeBERTa-v2 disentangled relative attention", _deberta_v2, _text(), LHS),
        Arch("mpnet", "text-encoder", "MPNet relative position buckets", _mpnet, _text(), LHS),
        Arch("t5_encoder", "text-encoder", "T5 encoder (relative bias, RMS norm, gated GELU)", _t5_encoder,
             _text(), LHS),
        Arch("modernbert", "text-encoder", "ModernBERT (rotary, local/global attention, GeGLU)", _modernbert,
             _text(), LHS),
        # decoder LLMs
        Arch("llama", "decoder", "LLaMA (GQA 4/2, rotary, SwiGLU, RMSNorm)",
             _decoder("LlamaConfig", "LlamaModel"), _text(), LHS),
        Arch("mistral", "decoder", "Mistral (GQA, rotary, sliding window 6)",
             _decoder("MistralConfig", "MistralModel", sliding_window=6), _text(), LHS),
        Arch("qwen2", "decoder", "Qwen2 (GQA, rotary, biased QKV)", _decoder("Qwen2Config", "Qwen2Model"),
             _text(), LHS),
        Arch("qwen3", "decoder", "Qwen3 (GQA, rotary, q/k RMSNorm)",
             _decoder("Qwen3Config", "Qwen3Model", head_dim=8), _text(), LHS),
        Arch("phi3", "decoder", "Phi-3 (fused QKV and gate/up projections, GQA, rotary)",
             _decoder("Phi3Config", "Phi3Model", pad_token_id=0), _text(), LHS),
        Arch("gemma", "decoder", "Gemma (GeGLU, (1+w) RMSNorm, scaled embeddings, GQA, rotary)",
             _decoder("GemmaConfig", "GemmaModel", head_dim=8), _text(), LHS),
        Arch("gemma2", "decoder", "Gemma-2 (logit soft-capping, alternating sliding window, sandwich norms)",
             _decoder("Gemma2Config", "Gemma2Model", head_dim=8, sliding_window=6), _text(), LHS),
        Arch("gpt_neox", "decoder", "GPT-NeoX (partial rotary, parallel residual)", _gpt_neox, _text(), LHS),
        Arch("opt", "decoder", "OPT (learned offset positions, ReLU)", _opt, _text(), LHS),
        Arch("falcon", "decoder", "Falcon new decoder architecture (GQA, parallel attention, rotary)", _falcon,
             _text(), LHS),
        Arch("bloom", "decoder", "BLOOM (ALiBi)", _bloom, _text(), LHS),
        Arch("gpt_bigcode", "decoder", "GPT-BigCode (multi-query attention)", _gpt_bigcode, _text(), LHS),
        Arch("gptj", "decoder", "GPT-J (interleaved partial rotary, parallel residual)", _gptj, _text(), LHS),
        Arch("mamba", "decoder", "Mamba (selective scan, causal conv1d)", _mamba, _text(), LHS),
        # vision
        Arch("resnet", "vision", "ResNet bottleneck (ResNetForImageClassification)", _resnet, _image(), ["logits"]),
        Arch("convnext", "vision", "ConvNeXt (depthwise 7x7, channels-last LayerNorm, layer scale)", _convnext,
             _image(), ["logits"]),
        Arch("mobilenet_v2", "vision", "MobileNetV2 0.35 (TF padding, ReLU6)", _mobilenet_v2, _image(), ["logits"]),
        Arch("efficientnet", "vision", "EfficientNet (squeeze-excitation, swish, same padding)", _efficientnet,
             _image(), ["last_hidden_state", "pooler_output"]),
        Arch("regnet", "vision", "RegNetY (grouped convs, squeeze-excitation)", _regnet, _image(),
             ["last_hidden_state", "pooler_output"]),
        Arch("convnextv2", "vision", "ConvNeXt-V2 (global response normalization)", _convnextv2, _image(),
             ["logits"]),
        Arch("poolformer", "vision", "PoolFormer (AvgPool token mixer without padding counts)", _poolformer,
             _image(64), LHS),
        Arch("mobilevit", "vision", "MobileViT (unfolded-patch transformers, interpolation)", _mobilevit,
             _image(64), ["last_hidden_state", "pooler_output"]),
        Arch("levit", "vision", "LeViT (attention biases by offset, attention subsampling)", _levit, _image(64),
             ["last_hidden_state", "pooler_output"]),
        Arch("deit", "vision", "DeiT (distillation token)", _deit, _image(), LHS),
        Arch("beit", "vision", "BEiT (relative position bias, layer scale, mean pooling)", _beit, _image(),
             ["last_hidden_state", "pooler_output"]),
        Arch("dinov2", "vision", "DINOv2 (layer scale, SwiGLU)", _dinov2, _image(),
             ["last_hidden_state", "pooler_output"]),
        Arch("swin", "vision", "Swin (shifted windows, relative bias, patch merging)", _swin, _image(),
             ["last_hidden_state", "pooler_output"]),
        Arch("dpt", "segmentation", "DPT depth estimation (dense prediction: reassemble, fusion, upsampling)",
             _dpt, _image(), ["predicted_depth"]),
        Arch("bart", "seq2seq", "BART encoder-decoder (offset positions, cross-attention)", _bart,
             [*_text(), et.InputSpec("decoder_input_ids", "int64", ["batch", "seq"], 2, VOCAB, "int")], LHS),
        Arch("clip_text", "text-encoder", "CLIP text tower (causal + padding mask, argmax pooling)", _clip_text,
             _text(), ["last_hidden_state", "pooler_output"]),
        Arch("detr", "detection", "DETR (ResNet backbone, sine positions, object queries)", _detr, _image(64),
             ["logits", "pred_boxes"]),
        Arch("rt_detr", "detection", "RT-DETR (TopK query selection, deformable attention by grid_sample)",
             _rt_detr, _image(64), ["logits", "pred_boxes"]),
        Arch("segformer", "segmentation", "SegFormer (spatial-reduction attention, Mix-FFN, MLP decoder)",
             _segformer, _image(), ["logits"]),
        Arch("yolos", "detection", "YOLOS (ViT with detection tokens, box MLP)", _yolos, _image(),
             ["logits", "pred_boxes"]),
        # speech
        Arch("whisper_encoder", "speech", "Whisper encoder (conv front end over log-mel, sinusoidal positions)",
             _whisper_encoder, _mel(MEL_BINS, MEL_FRAMES), LHS),
        Arch("wav2vec2", "speech", "Wav2Vec2 (conv feature encoder, weight-normed conv positions)",
             _speech("Wav2Vec2Config", "Wav2Vec2Model"), _audio(AUDIO), LHS),
        Arch("hubert", "speech", "HuBERT", _speech("HubertConfig", "HubertModel"), _audio(AUDIO), LHS),
    ]
}  # fmt: skip


def versions() -> dict[str, str]:
    import onnx
    import onnxruntime
    import torch
    import transformers

    out = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__, "numpy": np.__version__}  # fmt: skip
    try:
        import onnxscript

        out["onnxscript"] = onnxscript.__version__
    except ImportError:
        out["onnxscript"] = "absent"
    return out


def _case(arch: Arch, attn: str | None = None) -> et.ModelCase:
    """export_torch's ModelCase for this architecture (its exporters and _rescale take one)."""
    names = [s.name for s in arch.inputs]
    return et.ModelCase(arch.name, arch.description,
                        lambda _tiny: _wrap(_with_attn(arch.build(), attn), names, arch.outputs),
                        arch.inputs, arch.outputs)  # fmt: skip


def _with_attn(model: Any, attn: str | None) -> Any:
    """The model with transformers' attention implementation `attn` (eager: matmul + softmax written out;
    sdpa: torch's scaled_dot_product_attention); None keeps the model's default. A model that has no
    such implementation raises, and that is its row."""
    if attn:
        if hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation(attn)
        else:
            model.config._attn_implementation = attn
    return model


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"


def _ort_outputs(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, {i.name: feeds[i.name] for i in sess.get_inputs()}), strict=True))


def export_arch(arch: Arch, out: Path, exporters: list[str], static: bool, seed: int = SEED,
                attn: str | None = None) -> dict[str, Any]:  # fmt: skip
    """Build, rescale, export with each exporter, check against PyTorch, save ORT's outputs. Every
    failure is recorded in the returned record; nothing raises."""
    import torch

    record: dict[str, Any] = {"model": arch.name, "family": arch.family, "description": arch.description,
                              "seed": seed, "static": static, "example_dims": DIMS,
                              "inputs": [dataclasses.asdict(s) for s in arch.inputs], "outputs": arch.outputs,
                              "exports": {}}  # fmt: skip
    case = _case(arch, attn)
    try:
        module = et._module(case, seed, "scaled", DIMS)
        inner = module.model
        record["attn_implementation"] = getattr(getattr(inner, "config", None), "_attn_implementation", None)
        record["parameters"] = int(sum(p.numel() for p in module.parameters()))
        rng = np.random.default_rng(seed)
        feeds = {s.name: et._example(s, DIMS, rng) for s in arch.inputs}
        args = tuple(torch.from_numpy(feeds[s.name]) for s in arch.inputs)
        runs = [et._reference(module, case, feeds)]
        if not static:  # a second shape checks that the symbolic dims really are symbolic in the file
            other = {"batch": DIMS["batch"] + 1, "seq": DIMS["seq"] // 2 + 3}
            runs.append(et._reference(module, case, {s.name: et._example(s, other, rng) for s in arch.inputs}))
    except Exception as e:  # a config this transformers does not take, or a model that fails in PyTorch
        record["error"] = f"build: {_first_line(e)}"
        for exporter in exporters:
            record["exports"][exporter] = {"ok": False, "stage": "build", "error": _first_line(e)}
        return record
    for exporter in exporters:
        path = out / f"{arch.name}.{exporter}.onnx"
        npz = path.with_suffix(".npz")
        for stale in (path, npz, Path(str(path) + ".data")):
            stale.unlink(missing_ok=True)
        res: dict[str, Any] = {"file": path.name}
        t0 = time.perf_counter()
        try:
            with torch.no_grad():
                if exporter == "torchscript":
                    et._export_torchscript(module, case, args, path, static, et.TORCHSCRIPT_OPSET)
                else:
                    trace = args if static else et._trace_args(case, args)
                    et._export_dynamo(module, case, trace, path, static, None, quiet=True)
        except Exception as e:  # the exporter's failure is the row
            res.update(ok=False, stage="export", error=_first_line(e))
            log.debug("%s", traceback.format_exc())
        if "error" not in res:
            try:
                ref = _ort_outputs(path, feeds)
                np.savez(npz, **{f"in.{k}": v for k, v in feeds.items()}, **{f"out.{k}": v for k, v in ref.items()})
                res["npz"] = npz.name
                res.update(ok=True, **{k: v for k, v in et._check(path, case, runs).items() if k != "ok"})
            except Exception as e:  # ORT cannot run it, or disagrees with PyTorch: recorded, the file stays
                res.update(ok=False, stage="onnxruntime", error=_first_line(e))
        res["seconds"] = round(time.perf_counter() - t0, 1)
        record["exports"][exporter] = res
        log.info("%s.%s: %s (%.1f s)", arch.name, exporter, "ok" if res["ok"] else f"FAILED {res['error']}",
                 res["seconds"])  # fmt: skip
    return record


def _export_in_child(name: str, out: Path, exporters: list[str], static: bool, timeout_s: int,
                     end: float | None = None, attn: str | None = None) -> dict[str, Any]:  # fmt: skip
    """One model in its own process (a crash or hang there is that model's row); none starts after
    `end` (time.monotonic()), and none runs past it."""
    part = out / "records" / f"{name}.json"
    if end is not None:
        timeout_s = min(timeout_s, int(end - time.monotonic()))
    if timeout_s <= 0:
        why = "not run: the session's time was spent"
        return {"model": name, "family": ARCHS[name].family, "description": ARCHS[name].description, "error": why,
                "exports": {e: {"ok": False, "stage": "export", "error": why} for e in exporters}}  # fmt: skip
    part.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--out", str(out), "--models", name, "--exporters", ",".join(exporters),
           "--record-only"] + (["--static"] if static else []) + (["--attn", attn] if attn else [])  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    try:
        proc = run_group(cmd, env, timeout_s)
        (out / "records" / f"{name}.log").write_text(proc.stdout + proc.stderr)
        if part.exists():
            return json.loads(part.read_text())
        tail = (proc.stderr.strip().splitlines() or [""])[-1][:200]
        why = f"exporting process ended with rc {proc.returncode}: {tail}"
    except subprocess.TimeoutExpired:
        why = f"exporting process ran past {timeout_s} s"
    return {"model": name, "family": ARCHS[name].family, "description": ARCHS[name].description, "error": why,
            "exports": {e: {"ok": False, "stage": "export", "error": why} for e in exporters}}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="output folder (models are not committed)")
    p.add_argument("--models", default=",".join(ARCHS), help="comma-separated architecture names")
    p.add_argument("--exporters", default=",".join(EXPORTERS))
    p.add_argument("--static", action="store_true", help="every dim fixed at the example sizes")
    p.add_argument("--attn", choices=["eager", "sdpa"], help="transformers' attention implementation (default: "
                   "each model's own); give a separate --out, the file names do not carry it")  # fmt: skip
    p.add_argument("--jobs", type=int, default=1, help="models exported in parallel, one process each")
    p.add_argument("--timeout", type=int, default=600, help="seconds per model with --jobs")
    p.add_argument("--deadline", type=float, help="with --jobs: seconds after which no model starts or runs")
    p.add_argument("--list", action="store_true", help="print the architectures and exit")
    p.add_argument("--record-only", action="store_true", help=argparse.SUPPRESS)  # a --jobs child
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if a.list:
        for arch in ARCHS.values():
            print(f"{arch.name:16} {arch.family:13} {arch.description}")
        return 0
    if a.out is None:
        p.error("--out is required")
    names = [n for n in a.models.split(",") if n]
    unknown = [n for n in names if n not in ARCHS]
    exporters = [e for e in a.exporters.split(",") if e]
    if unknown or not set(exporters) <= set(EXPORTERS):
        print(f"error: unknown model(s) {unknown} or exporter(s) {exporters}; models: {', '.join(ARCHS)}; "
              f"exporters: {', '.join(EXPORTERS)}", file=sys.stderr)  # fmt: skip
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "records").mkdir(exist_ok=True)
    import torch

    logging.getLogger("torch").setLevel(logging.ERROR)
    if a.record_only or a.jobs <= 1:
        torch.set_num_threads(1 if a.record_only else max(1, os.cpu_count() or 1))
        records = []
        for n in names:
            rec = export_arch(ARCHS[n], a.out, exporters, a.static, attn=a.attn)
            (a.out / "records" / f"{n}.json").write_text(json.dumps(rec, indent=1) + "\n")
            records.append(rec)
        if a.record_only:
            return 0
    else:
        end = time.monotonic() + a.deadline if a.deadline else None
        with ThreadPoolExecutor(a.jobs) as pool:
            records = list(pool.map(lambda n: _export_in_child(n, a.out, exporters, a.static, a.timeout, end, a.attn),
                                    names))  # fmt: skip
    manifest_path = a.out / "manifest.json"
    old = json.loads(manifest_path.read_text()).get("models", {}) if manifest_path.exists() else {}
    ver = versions()
    manifest = {
        "made_by": "tools/make_arch_corpus.py",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "versions": ver,
        "seed": SEED,
        "example_dims": DIMS,
        "torchscript_opset": et.TORCHSCRIPT_OPSET,
        "models": {**old, **{r["model"]: {**r, "versions": ver} for r in records}},
    }
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    rows = [(r["model"], e, x) for r in records for e, x in r["exports"].items()]
    good = sum(x["ok"] for _, _, x in rows)
    print(f"{good}/{len(rows)} exports ok ({len(records)} models, torch {ver['torch']}, "
          f"transformers {ver['transformers']}); manifest {manifest_path}")  # fmt: skip
    for m, e, x in rows:
        if not x["ok"]:
            print(f"  {m}.{e}: {x.get('stage')}: {x['error']}")
    return 0 if good == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
