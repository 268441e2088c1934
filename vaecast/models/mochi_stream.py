"""A causal streaming pass over diffusers' `MochiDecoder3D`, a latent frame at a time.

Mochi's decoder is causal in time throughout, so the whole-clip `decoder(z)` that
`AutoencoderKLMochi._decode` runs by default can be run a latent frame at a time if
each step is handed what earlier steps left. Every temporal operation, checked:

- its 3-D convs (`CogVideoXCausalConv3d`, `pad_mode="replicate"`, kernel 3, stride 1)
  pad only in front in time, by `kernel_t - 1` copies of the clip's first frame: a
  step needs the last `kernel_t - 1` frames of the previous step's time-padded input
  (the replicated first frame included while fewer real frames have come), put in
  front of its own input, which is padded in space only. diffusers' frame-wise mode
  carries no such cache for these convs (replicate padding returns none), which is
  why it is not the whole-clip decode;
- its norms (`MochiChunkedGroupNorm3D`) are GroupNorms over each frame alone (time is
  folded into the batch), so they span no frames; `check_decoder` also verifies it on
  a tiny input;
- its temporal upsampling (`MochiUpBlock3D`: a per-position linear projection, then a
  depth-to-space rearrangement) turns each frame into `temporal_expansion` frames of
  its own and no other's;
- its blocks have no attention (`add_attention=False`: every entry of `attentions`
  is None, checked), the 1x1x1 `conv_in` and the linear `proj_out` are per position;
- the frames `_decode` drops (`drop_last_temporal_frames`: the first
  `temporal_compression_ratio - 1`) all come from latent frame 0; the decoder's caller
  drops them from the first step's output.

So latent frame k decodes, given the carried frames, to output frames 6k .. 6k + 5
(temporal expansions 3, 2, 1 from the bottom), final as soon as it is decoded.

The steps run the model's own modules (convs, norms, activations, projections) on their
inputs and repeat the few lines of glue between them from diffusers' forwards
(`MochiResnetBlock3D`, `MochiMidBlock3D`, `MochiUpBlock3D`, `MochiDecoder3D`, and the
padding of `CogVideoXCausalConv3d`, in diffusers 0.42.1), with the same operations in
the same order; nothing of diffusers is patched or overridden. `check_decoder` refuses
a decoder whose structure is not the one this repeats.

Every value a step computes is the one the whole-clip forward computes; the kernels may
round differently over a frame than over the whole clip (a conv's or a matmul's
algorithm is chosen by shape), which is the only difference from `decoder(z)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

# Child modules of each block the pass runs, exactly: a block that gains a layer (say an
# attention, or a norm that spans time) is refused rather than skipped.
BLOCK_CHILDREN: dict[str, frozenset[str]] = {
    "MochiDecoder3D": frozenset(
        {"nonlinearity", "conv_in", "block_in", "up_blocks", "block_out", "proj_out"}
    ),
    # `norms` and `attentions` are lists of None in the decoder (checked apart).
    "MochiMidBlock3D": frozenset({"resnets", "norms", "attentions"}),
    "MochiUpBlock3D": frozenset({"resnets", "proj"}),
    "MochiResnetBlock3D": frozenset({"nonlinearity", "norm1", "conv1", "norm2", "conv2"}),
    "CogVideoXCausalConv3d": frozenset({"conv"}),
    "MochiChunkedGroupNorm3D": frozenset({"norm_layer"}),
}
# Attributes (not modules) the pass reads, per block.
BLOCK_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "MochiMidBlock3D": ("norms", "attentions"),
    "MochiUpBlock3D": ("temporal_expansion", "spatial_expansion"),
    "CogVideoXCausalConv3d": ("time_causal_padding", "pad_mode", "time_kernel_size"),
}
# Leaf modules that act on each position (or, GroupNorm inside the chunked norm, each
# frame) alone: run on a step's frames as they are. A Conv3d only with a kernel of one
# frame, or inside a causal conv.
FRAME_LOCAL = frozenset({"SiLU", "Linear", "GroupNorm", "Conv3d", "CogVideoXSafeConv3d"})


@dataclass(slots=True)
class DecoderState:
    """What one decode's earlier steps left for the next: each causal conv's last
    time-padded input frames, keyed by module."""

    convs: dict[int, torch.Tensor] = field(default_factory=dict)

    def clear(self) -> None:
        self.convs.clear()


def check_decoder(decoder: Any) -> list[str]:
    """What `decoder` lacks, or has more of, than the structure this pass repeats."""
    if type(decoder).__name__ != "MochiDecoder3D":
        return [f"decoder of class MochiDecoder3D, not {type(decoder).__name__}"]
    problems: list[str] = []
    inside_causal = {
        f"{name}.conv"
        for name, module in decoder.named_modules()
        if type(module).__name__ == "CogVideoXCausalConv3d"
    }
    for name, module in decoder.named_modules():
        kind = type(module).__name__
        label = f"decoder.{name}" if name else "decoder"
        if kind == "ModuleList":
            continue
        expected = BLOCK_CHILDREN.get(kind)
        if expected is None:
            if kind not in FRAME_LOCAL:
                problems.append(f"{label} ({kind}, not a module the pass knows)")
            elif (
                kind in ("Conv3d", "CogVideoXSafeConv3d")
                and name not in inside_causal
                and (tuple(module.kernel_size) != (1, 1, 1) or tuple(module.stride) != (1, 1, 1))
            ):
                problems.append(f"{label} (a {kind} of kernel {tuple(module.kernel_size)})")
            continue
        children = {child for child, _ in module.named_children()}
        if children != expected:
            problems.append(
                f"{label} ({kind}) with children {sorted(children)}, expected {sorted(expected)}"
            )
        absent = [a for a in BLOCK_ATTRIBUTES.get(kind, ()) if not hasattr(module, a)]
        problems += [f"{label}.{attribute}" for attribute in absent]
        if absent:
            continue
        if kind == "MochiMidBlock3D":
            if any(m is not None for m in (*module.norms, *module.attentions)):
                problems.append(f"{label}.attentions (an attention over time: none expected)")
        elif kind == "CogVideoXCausalConv3d":
            problems += _check_causal_conv(label, module)
        elif kind == "MochiChunkedGroupNorm3D" and "norm_layer" in children:
            problems += _check_frame_norm(label, module)
    return problems


def _check_causal_conv(label: str, module: Any) -> list[str]:
    conv = module.conv
    padding = tuple(module.time_causal_padding)
    kernel_t = int(conv.kernel_size[0])
    ok = (
        module.pad_mode == "replicate"
        and int(module.time_kernel_size) == kernel_t
        and len(padding) == 6
        and padding[4] == kernel_t - 1
        and padding[5] == 0
        and tuple(conv.stride) == (1, 1, 1)
        and tuple(conv.dilation) == (1, 1, 1)
        and not isinstance(conv.padding, str)
        and tuple(conv.padding) == (0, 0, 0)
    )
    if ok:
        return []
    return [
        f"{label}: a causal conv padded {padding} ({module.pad_mode}) in front of a kernel of "
        f"{tuple(conv.kernel_size)}, stride {tuple(conv.stride)}, dilation "
        f"{tuple(conv.dilation)}, padding {conv.padding} (expected replicate padding of "
        f"kernel_t - 1 frames in front only, stride and dilation 1, no padding of its own)"
    ]


def _check_frame_norm(label: str, module: Any) -> list[str]:
    """Whether the norm treats each frame alone: a frame's output must not change when
    another frame joins it (cheap: two frames of 2x2 positions)."""
    norm_layer = module.norm_layer
    if not isinstance(norm_layer, torch.nn.GroupNorm):
        return [f"{label}.norm_layer (a GroupNorm)"]
    weight = norm_layer.weight
    device = weight.device if weight is not None else torch.device("cpu")
    dtype = weight.dtype if weight is not None else torch.float32
    generator = torch.Generator().manual_seed(0)
    first = torch.randn(1, norm_layer.num_channels, 1, 2, 2, generator=generator)
    frames = torch.cat([first, first * 3 + 1], dim=2).to(device, dtype)
    with torch.no_grad():
        together = module(frames)[:, :, :1]
        alone = module(frames[:, :, :1])
    if torch.allclose(together, alone, rtol=0, atol=1e-4):
        return []
    return [f"{label} (a norm over each frame alone; it mixes frames)"]


def temporal_expansion(decoder: Any) -> int:
    """How many frames each latent frame decodes to (before any are dropped)."""
    scale = 1
    for up_block in decoder.up_blocks:
        scale *= int(up_block.temporal_expansion)
    return scale


def spatial_expansion(decoder: Any) -> int:
    """How many pixels each latent is wide (and high)."""
    scale = 1
    for up_block in decoder.up_blocks:
        scale *= int(up_block.spatial_expansion)
    return scale


def decode_step(decoder: Any, z: torch.Tensor, state: DecoderState) -> torch.Tensor:
    """The next latent frames of a decode (BCTHW, as `decoder` takes them) to their
    frames: `MochiDecoder3D.forward`, given what earlier steps left in `state`."""
    hidden = decoder.conv_in(z)
    hidden = _mid_block(decoder.block_in, hidden, state)
    for up_block in decoder.up_blocks:
        hidden = _up_block(up_block, hidden, state)
    hidden = _mid_block(decoder.block_out, hidden, state)
    hidden = decoder.nonlinearity(hidden)
    hidden = hidden.permute(0, 2, 3, 4, 1)
    hidden = decoder.proj_out(hidden)
    return hidden.permute(0, 4, 1, 2, 3)


def _causal_conv(module: Any, x: torch.Tensor, state: DecoderState) -> torch.Tensor:
    padding = tuple(module.time_causal_padding)
    carried = padding[4]  # kernel_t - 1: the frames a step needs from before it
    previous = state.convs.get(id(module))
    if previous is None:
        # The clip's first step: padded exactly as the module pads the whole clip.
        padded = F.pad(x, padding, mode="replicate")
    else:
        # Replicate padding copies values, so padding in space alone and putting the
        # carried (already padded) frames in front gives the whole clip's input frames.
        spatial = F.pad(x, (*padding[:4], 0, 0), mode="replicate")
        padded = torch.cat([previous, spatial], dim=2)
    if carried:
        # A copy, so that the step's input is freed while the next step is awaited.
        state.convs[id(module)] = padded[:, :, padded.shape[2] - carried :].clone()
    return module.conv(padded)


def _resnet(block: Any, inputs: torch.Tensor, state: DecoderState) -> torch.Tensor:
    hidden = block.norm1(inputs)
    hidden = block.nonlinearity(hidden)
    hidden = _causal_conv(block.conv1, hidden, state)
    hidden = block.norm2(hidden)
    hidden = block.nonlinearity(hidden)
    hidden = _causal_conv(block.conv2, hidden, state)
    return hidden + inputs


def _mid_block(block: Any, hidden: torch.Tensor, state: DecoderState) -> torch.Tensor:
    # Its attentions are all None (checked), so the block is its resnets in order.
    for resnet in block.resnets:
        hidden = _resnet(resnet, hidden, state)
    return hidden


def _up_block(block: Any, hidden: torch.Tensor, state: DecoderState) -> torch.Tensor:
    for resnet in block.resnets:
        hidden = _resnet(resnet, hidden, state)
    hidden = hidden.permute(0, 2, 3, 4, 1)
    hidden = block.proj(hidden)
    hidden = hidden.permute(0, 4, 1, 2, 3)
    batch_size, _, num_frames, height, width = hidden.shape
    st = block.temporal_expansion
    sh = block.spatial_expansion
    sw = block.spatial_expansion
    # Depth to space: each frame's channels become its own `st` frames, in order.
    hidden = hidden.view(batch_size, -1, st, sh, sw, num_frames, height, width)
    hidden = hidden.permute(0, 1, 5, 2, 6, 3, 7, 4).contiguous()
    return hidden.view(batch_size, -1, num_frames * st, height * sh, width * sw)
