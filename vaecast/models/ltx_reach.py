"""How far in time an LTX video decoder looks: the margin an exact windowed stream needs.

LTX-Video's and LTX-2's video decoders (diffusers' `LTXVideoDecoder3d` and
`LTX2VideoDecoder3d`, Apache-2.0) are not causal as released: each frame depends on
latents after it as well as before. But only within a bounded reach, because of what
they are made of:
- every layer that mixes frames is a temporal conv of kernel k, replicate-padded at the
  clip's ends: (k - 1) / 2 frames each side, or k - 1 before when causal;
- their norms act on each position alone (RMS and layer norms over channels), and the
  timestep embedding is one per clip;
- each temporal upsampler (stride s) drops its first s - 1 frames, mapping n frames to
  s * n - s + 1, so the decode of latents [a, b) is, level by level, the whole clip's
  from frame a * s on, but for what its own ends' padding changes.

A conv at a level of s frames per latent reaches (k - 1) / 2 / s latent frames; the
sum over the decoder, rounded up, plus one latent at each end for the upsamplers'
alignment, bounds how far from a window's ends its frames differ from the whole clip's
(`Reach`). `temporal_reach` walks the decoder in its forward's order to add it up, and
names what it cannot account for (a module of a kind it does not know, a strided or
dilated temporal conv): for such a decoder no bound is shown, and its stream decodes the
whole clip at once. The tests check the bound against a perturbed latent's reach.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

from vaecast.models.margin_windows import Reach

# What the walk reads, by class: LTX-Video's and LTX-2's blocks.
CONVS = frozenset({"LTXVideoCausalConv3d", "LTX2VideoCausalConv3d"})
RESNETS = frozenset({"LTXVideoResnetBlock3d", "LTX2VideoResnetBlock3d"})
UPSAMPLERS = frozenset({"LTXVideoUpsampler3d", "LTX2VideoUpsampler3d"})
BLOCKS = frozenset(
    {"LTXVideoMidBlock3d", "LTX2VideoMidBlock3d", "LTXVideoUpBlock3d", "LTX2VideoUpBlock3d"}
)
DECODERS = frozenset({"LTXVideoDecoder3d", "LTX2VideoDecoder3d"})
# Modules that act on each position alone (or on the per-clip timestep embedding).
POSITION_LOCAL = frozenset(
    {"RMSNorm", "PerChannelRMSNorm", "LayerNorm", "SiLU", "Dropout", "Identity", "ModuleList"}
)
# The timestep embedding's own modules: they see the timestep, never a frame.
TIME_EMBEDDER = "time_embedder"


def temporal_reach(decoder: Any) -> Reach | list[str]:
    """The decoder's `Reach`, or what keeps it from being shown."""
    problems = _unknown_modules(decoder)
    if problems:
        return problems
    walk = _Walk(causal=_decoder_causal(decoder))
    walk.conv("conv_in", decoder.conv_in)
    for i, resnet in enumerate(decoder.mid_block.resnets):
        walk.resnet(f"mid_block.resnets.{i}", resnet)
    for b, block in enumerate(decoder.up_blocks):
        if block.conv_in is not None:
            walk.resnet(f"up_blocks.{b}.conv_in", block.conv_in)
        for u, upsampler in enumerate(block.upsamplers or ()):
            walk.upsample(f"up_blocks.{b}.upsamplers.{u}", upsampler)
        for i, resnet in enumerate(block.resnets):
            walk.resnet(f"up_blocks.{b}.resnets.{i}", resnet)
    walk.conv("conv_out", decoder.conv_out)
    if int(getattr(decoder, "patch_size_t", 1)) != 1:
        walk.problems.append(f"decoder.patch_size_t {decoder.patch_size_t} (1 expected)")
    if walk.problems:
        return walk.problems
    # One latent more at each end: each upsampler's dropped frames shift a window's
    # first frame by up to one frame of its level.
    return Reach(math.ceil(walk.before) + 1, math.ceil(walk.after) + 1)


def temporal_scale(decoder: Any) -> int:
    """Frames per latent frame: the product of the temporal upsamplers' strides."""
    scale = 1
    for block in decoder.up_blocks:
        for upsampler in block.upsamplers or ():
            scale *= int(upsampler.stride[0])
    return scale


def _decoder_causal(decoder: Any) -> bool | None:
    """LTX-2's decoder takes `causal` at run time (`vae.decode` passes None: its own
    `is_causal`); LTX-Video's convs each know theirs (None here)."""
    return bool(decoder.is_causal) if type(decoder).__name__ == "LTX2VideoDecoder3d" else None


def _unknown_modules(decoder: Any) -> list[str]:
    kind = type(decoder).__name__
    if kind not in DECODERS:
        return [f"decoder of class {' or '.join(sorted(DECODERS))}, not {kind}"]
    known = CONVS | RESNETS | UPSAMPLERS | BLOCKS | POSITION_LOCAL
    problems = []
    for name, module in _modules_outside_time_embedders(decoder):
        kind = type(module).__name__
        if kind in known or kind == "Conv3d":  # a bare Conv3d is checked where it is used
            continue
        problems.append(f"decoder.{name} ({kind}, whose reach over time is not known)")
    return problems


def _modules_outside_time_embedders(decoder: Any) -> Iterator[tuple[str, Any]]:
    for name, module in decoder.named_modules():
        if name and TIME_EMBEDDER not in name.split("."):
            yield name, module


class _Walk:
    """The reach so far, in latent frames, and the level's frames per latent."""

    def __init__(self, causal: bool | None) -> None:
        self.causal = causal
        self.scale = 1
        self.before = Fraction(0)
        self.after = Fraction(0)
        self.problems: list[str] = []

    def conv(self, name: str, module: Any) -> None:
        kind = type(module).__name__
        inner = module.conv if kind in CONVS else module
        if kind not in CONVS and kind != "Conv3d":
            self.problems.append(f"decoder.{name} ({kind}, not a temporal conv)")
            return
        kernel, stride = int(inner.kernel_size[0]), int(inner.stride[0])
        dilation = int(inner.dilation[0])
        if stride != 1 or dilation != 1 or kernel % 2 == 0:
            self.problems.append(
                f"decoder.{name} (temporal kernel {kernel}, stride {stride}, dilation "
                f"{dilation}: an odd kernel of stride and dilation 1 expected)"
            )
            return
        if kind == "Conv3d":  # no padding of its own in time: only a kernel of one frame
            if kernel != 1 or int(inner.padding[0]) != 0:
                self.problems.append(f"decoder.{name} (a bare Conv3d over {kernel} frames)")
            return
        causal = self.causal if self.causal is not None else bool(module.is_causal)
        if causal:
            self.before += Fraction(kernel - 1, self.scale)
        else:
            self.before += Fraction((kernel - 1) // 2, self.scale)
            self.after += Fraction((kernel - 1) // 2, self.scale)

    def resnet(self, name: str, block: Any) -> None:
        if type(block).__name__ not in RESNETS:
            self.problems.append(f"decoder.{name} ({type(block).__name__}, not a resnet block)")
            return
        self.conv(f"{name}.conv1", block.conv1)
        self.conv(f"{name}.conv2", block.conv2)
        if block.conv_shortcut is not None:
            self.conv(f"{name}.conv_shortcut", block.conv_shortcut)

    def upsample(self, name: str, upsampler: Any) -> None:
        self.conv(f"{name}.conv", upsampler.conv)
        self.scale *= int(upsampler.stride[0])
