"""A causal streaming pass over diffusers' `HunyuanVideo15Decoder3D`, a step at a time.

The decoder is causal in time throughout: its 3-D convs pad only in front
(`time_causal_padding`, replicate), its norms are RMS norms over channels alone (no
GroupNorm spans frames), its temporal upsamplers are depth-to-space rearrangements
that treat the clip's first frame apart (1 frame out) and every later one alike (2
out), and its mid-block attention masks each frame's queries to the keys of its own
and earlier frames. So frame k's output depends on frames <= k only, and the decode
can run a few latent frames at a time if each step is handed what earlier steps left:

- each causal conv: the last `kernel_t - 1` frames of its time-padded input (the
  replicated first frame included, while fewer real frames have come), put in front
  of the next step's input, which is padded in space only;
- each attention block: the keys and values of every earlier frame, which the next
  step's queries attend to together with their own frame's (and earlier frames' of
  the same step, by the same causal mask);
- each temporal upsampler: whether the clip's first frame has been seen.

The steps run the model's own modules (convs, norms, activations, projections) on
their inputs and repeat the few lines of glue between them from diffusers' forwards
(`HunyuanVideo15ResnetBlock`, `HunyuanVideo15AttnBlock`, `HunyuanVideo15Upsample`,
`HunyuanVideo15MidBlock`, `HunyuanVideo15UpBlock3D`, `HunyuanVideo15Decoder3D`, in
diffusers 0.42.1), with the same operations in the same order. `check_decoder` refuses
a decoder whose structure is not the one this repeats.

Every value a step computes is the one the whole-clip forward computes; the kernels may
round differently over a few frames than over all of them (a conv's algorithm, or the
attention's reduction, is chosen by shape), which is the only difference from
`decoder(z)`: in fp32, measured up to 2e-6 with the tests' VAE and 6e-6 with a deeper
one (outputs up to ~4), often 0; tested within 1e-5.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

# Child modules of each block the pass runs, exactly: a block that gains a layer (say
# a norm that spans time) is refused rather than skipped.
BLOCK_CHILDREN: dict[str, frozenset[str]] = {
    "HunyuanVideo15Decoder3D": frozenset(
        {"conv_in", "mid_block", "up_blocks", "norm_out", "conv_act", "conv_out"}
    ),
    "HunyuanVideo15MidBlock": frozenset({"attentions", "resnets"}),
    "HunyuanVideo15UpBlock3D": frozenset({"resnets", "upsamplers"}),
    "HunyuanVideo15ResnetBlock": frozenset(
        {"nonlinearity", "norm1", "conv1", "norm2", "conv2", "conv_shortcut"}
    ),
    "HunyuanVideo15AttnBlock": frozenset({"norm", "to_q", "to_k", "to_v", "proj_out"}),
    "HunyuanVideo15Upsample": frozenset({"conv"}),
    "HunyuanVideo15CausalConv3d": frozenset({"conv"}),
}
# Attributes (not modules) the pass reads, per block.
BLOCK_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "HunyuanVideo15Decoder3D": ("repeat",),
    "HunyuanVideo15Upsample": ("add_temporal_upsample", "repeats", "_dcae_upsample_rearrange"),
    "HunyuanVideo15CausalConv3d": ("time_causal_padding", "pad_mode"),
}
# Frame-local modules: run on a step's frames as they are (a Conv3d outside a causal
# conv only with a kernel of one frame).
FRAME_LOCAL = frozenset({"HunyuanVideo15RMS_norm", "SiLU", "Conv3d"})


@dataclass(slots=True)
class DecoderState:
    """What one decode's earlier steps left for the next, keyed by module."""

    convs: dict[int, torch.Tensor] = field(default_factory=dict)
    keys: dict[int, torch.Tensor] = field(default_factory=dict)
    values: dict[int, torch.Tensor] = field(default_factory=dict)
    frames_in: int = 0  # latent frames already decoded

    def clear(self) -> None:
        self.convs.clear()
        self.keys.clear()
        self.values.clear()


def check_decoder(decoder: Any) -> list[str]:
    """What `decoder` lacks, or has more of, than the structure this pass repeats."""
    problems: list[str] = []
    if type(decoder).__name__ != "HunyuanVideo15Decoder3D":
        return [f"decoder of class HunyuanVideo15Decoder3D, not {type(decoder).__name__}"]
    causal_convs = {
        f"{name}.conv"
        for name, module in decoder.named_modules()
        if type(module).__name__ == "HunyuanVideo15CausalConv3d"
    }
    for name, module in decoder.named_modules():
        kind = type(module).__name__
        expected = BLOCK_CHILDREN.get(kind)
        if kind == "ModuleList":
            continue
        if expected is None:
            if kind not in FRAME_LOCAL:
                problems.append(f"decoder.{name} ({kind}, not a module the pass knows)")
            elif kind == "Conv3d" and name not in causal_convs and module.kernel_size[0] != 1:
                problems.append(f"decoder.{name} (a Conv3d over {module.kernel_size[0]} frames)")
            continue
        children = {child for child, _ in module.named_children()}
        # conv_shortcut and upsamplers are None when a block has none.
        present = {c for c in expected if hasattr(module, c)}
        if children - expected or present != expected:
            problems.append(
                f"decoder.{name or '<root>'} ({kind}) with children {sorted(children)}, "
                f"expected {sorted(expected)}"
            )
        problems += [
            f"decoder.{name or '<root>'}.{attribute}"
            for attribute in BLOCK_ATTRIBUTES.get(kind, ())
            if not hasattr(module, attribute)
        ]
        if kind == "HunyuanVideo15CausalConv3d" and hasattr(module, "time_causal_padding"):
            problems += _check_causal_conv(name, module)
        if kind == "HunyuanVideo15AttnBlock":
            problems += _check_attention_mask(name, module)
    return problems


def _check_causal_conv(name: str, module: Any) -> list[str]:
    conv = module.conv
    padding = tuple(module.time_causal_padding)
    kernel_t = int(conv.kernel_size[0])
    ok = (
        len(padding) == 6
        and padding[4] == kernel_t - 1
        and padding[5] == 0
        and conv.stride[0] == 1
        and conv.dilation[0] == 1
        and not isinstance(conv.padding, str)
        and conv.padding[0] == 0
    )
    if ok:
        return []
    return [
        f"decoder.{name}: a causal conv padded {padding} in front of a kernel of "
        f"{tuple(conv.kernel_size)}, stride {tuple(conv.stride)}, dilation "
        f"{tuple(conv.dilation)}, padding {conv.padding} (expected kernel_t - 1 frames in "
        f"front only, stride and dilation 1 in time)"
    ]


def _check_attention_mask(name: str, module: Any) -> list[str]:
    """Whether the block's own mask is the causal one `_causal_mask` builds (cheap: a few
    frames of a few tokens)."""
    frames, frame_tokens = 3, 2
    prepare = getattr(module, "prepare_causal_attention_mask", None)
    ours = _causal_mask(0, frames, frame_tokens, torch.float32, torch.device("cpu"), 1)
    if callable(prepare):
        theirs = prepare(frames, frame_tokens, torch.float32, torch.device("cpu"), batch_size=1)
        if isinstance(theirs, torch.Tensor) and torch.equal(theirs, ours):
            return []
    return [f"decoder.{name}.prepare_causal_attention_mask (a mask causal over frames)"]


def decode_step(decoder: Any, z: torch.Tensor, state: DecoderState) -> torch.Tensor:
    """Latent frames `state.frames_in ..` (BCTHW, as `decoder` takes them) to their frames."""
    first = state.frames_in == 0
    hidden = _causal_conv(decoder.conv_in, z, state) + z.repeat_interleave(
        repeats=decoder.repeat, dim=1
    )
    mid = decoder.mid_block
    hidden = _resnet(mid.resnets[0], hidden, state)
    for attention, resnet in zip(mid.attentions, mid.resnets[1:], strict=True):
        if attention is not None:
            hidden = _attention(attention, hidden, state)
        hidden = _resnet(resnet, hidden, state)
    for up_block in decoder.up_blocks:
        for resnet in up_block.resnets:
            hidden = _resnet(resnet, hidden, state)
        if up_block.upsamplers is not None:
            for upsampler in up_block.upsamplers:
                hidden = _upsample(upsampler, hidden, state, first)
    hidden = decoder.norm_out(hidden)
    hidden = decoder.conv_act(hidden)
    hidden = _causal_conv(decoder.conv_out, hidden, state)
    state.frames_in += int(z.shape[2])
    return hidden


def _causal_conv(module: Any, x: torch.Tensor, state: DecoderState) -> torch.Tensor:
    padding = tuple(module.time_causal_padding)
    carried = padding[4]  # kernel_t - 1: the frames a step needs from before it
    previous = state.convs.get(id(module))
    if previous is None:
        padded = F.pad(x, padding, mode=module.pad_mode)
    else:
        spatial = F.pad(x, (*padding[:4], 0, 0), mode=module.pad_mode)
        padded = torch.cat([previous, spatial], dim=2)
    if carried:
        # A copy, so that the step's input is freed while the next step is awaited.
        state.convs[id(module)] = padded[:, :, padded.shape[2] - carried :].clone()
    return module.conv(padded)


def _resnet(block: Any, x: torch.Tensor, state: DecoderState) -> torch.Tensor:
    residual = x
    hidden = block.norm1(x)
    hidden = block.nonlinearity(hidden)
    hidden = _causal_conv(block.conv1, hidden, state)
    hidden = block.norm2(hidden)
    hidden = block.nonlinearity(hidden)
    hidden = _causal_conv(block.conv2, hidden, state)
    if block.conv_shortcut is not None:
        residual = block.conv_shortcut(residual)
    return hidden + residual


def _attention(block: Any, x: torch.Tensor, state: DecoderState) -> torch.Tensor:
    identity = x
    x = block.norm(x)
    query = block.to_q(x)
    key = block.to_k(x)
    value = block.to_v(x)
    batch_size, channels, frames, height, width = query.shape
    tokens = frames * height * width

    def tokens_of(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.reshape(batch_size, channels, tokens).permute(0, 2, 1).unsqueeze(1)

    query = tokens_of(query).contiguous()
    key, value = tokens_of(key).contiguous(), tokens_of(value).contiguous()
    past_keys = state.keys.get(id(block))
    past_frames = 0
    if past_keys is not None:
        past_frames = past_keys.shape[2] // (height * width)
        key = torch.cat([past_keys, key], dim=2)
        value = torch.cat([state.values[id(block)], value], dim=2)
    state.keys[id(block)], state.values[id(block)] = key, value
    mask = _causal_mask(past_frames, frames, height * width, query.dtype, query.device, batch_size)
    x = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)
    x = x.squeeze(1).reshape(batch_size, frames, height, width, channels).permute(0, 4, 1, 2, 3)
    x = block.proj_out(x)
    return x + identity


def _causal_mask(
    past_frames: int,
    frames: int,
    frame_tokens: int,
    dtype: torch.dtype,
    device: torch.device,
    batch_size: int,
) -> torch.Tensor:
    """Rows of `HunyuanVideo15AttnBlock.prepare_causal_attention_mask` for this step's
    frames, over the keys of every frame so far: 0 where a query's frame may see a key's,
    -inf after."""
    query_frame = torch.arange(frames * frame_tokens, device=device) // frame_tokens
    key_frame = torch.arange((past_frames + frames) * frame_tokens, device=device) // frame_tokens
    hidden = key_frame[None, :] > query_frame[:, None] + past_frames
    mask = torch.zeros(hidden.shape, dtype=dtype, device=device).masked_fill(hidden, float("-inf"))
    return mask.unsqueeze(0).expand(batch_size, -1, -1)


def _upsample(block: Any, x: torch.Tensor, state: DecoderState, first: bool) -> torch.Tensor:
    rearrange = block._dcae_upsample_rearrange
    h = _causal_conv(block.conv, x, state)
    if not block.add_temporal_upsample:
        h = rearrange(h, r1=1, r2=2, r3=2)
        shortcut = x.repeat_interleave(repeats=block.repeats, dim=1)
        return h + rearrange(shortcut, r1=1, r2=2, r3=2)
    # The clip's first frame gives one frame (half the channels); every later one two.
    h_parts, x_parts = [], []
    if first:
        h_first = rearrange(h[:, :, :1, :, :], r1=1, r2=2, r3=2)
        h_parts.append(h_first[:, : h_first.shape[1] // 2])
        x_first = rearrange(x[:, :, :1, :, :], r1=1, r2=2, r3=2)
        x_parts.append(x_first.repeat_interleave(repeats=block.repeats // 2, dim=1))
        h, x = h[:, :, 1:, :, :], x[:, :, 1:, :, :]
    if h.shape[2]:
        h_parts.append(rearrange(h, r1=2, r2=2, r3=2))
        x_next = rearrange(x, r1=2, r2=2, r3=2)
        x_parts.append(x_next.repeat_interleave(repeats=block.repeats, dim=1))
    h = h_parts[0] if len(h_parts) == 1 else torch.cat(h_parts, dim=2)
    shortcut = x_parts[0] if len(x_parts) == 1 else torch.cat(x_parts, dim=2)
    return h + shortcut
