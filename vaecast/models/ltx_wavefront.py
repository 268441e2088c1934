"""LTX-Video's and LTX-2's video decoders as layer-by-layer streams
(`vaecast/models/wavefront.py`): their whole-clip decode, each frame out as soon as
the work it depends on is done.

diffusers' `LTXVideoDecoder3d` and `LTX2VideoDecoder3d` (Apache-2.0) run, in order:
conv_in, the mid block's resnets, each up block's (conv_in resnet, upsampler,
resnets), norm_out with the timestep scale-shift and SiLU, conv_out, and the
unpatchify. `wavefront_net` builds the same forward from the module's own layers as
stages: each `LTX*CausalConv3d` a `TemporalConv` of its kernel (causal as the decoder
runs it: LTX-Video's per conv, LTX-2's from its `is_causal`), each resnet a `Residual`
of norm1 -> (scale-shift) -> SiLU -> conv1 -> norm2 -> (scale-shift) -> SiLU -> conv2
beside norm3 -> conv_shortcut (a kernel of one frame), each upsampler a `Residual` (or
not) of its conv and per-frame rearrangement, then its first `stride - 1` frames
dropped. The per-clip timestep embeddings are computed once, as each block computes
them. The norms act on each position (RMS over channels, LayerNorm over channels).

Since this re-states the forward of six diffusers classes per family, it is used only
where it is shown to be that forward:
- the decoder is made only of the modules `ltx_reach.py` knows (its reach is shown);
- no layer injects noise (diffusers draws it per call, so a split decode would differ:
  such a VAE keeps the windows);
- `check` decodes a small random clip (4 latent frames, 2x2 latents, pushed one latent
  at a time) both ways at load and requires the frames to agree to within float
  rounding (`TOLERANCE` of the frames' scale).
Where one fails the stream keeps the exact windows, with one log line saying why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vaecast.models.wavefront import (
    Chain,
    DropFirst,
    NetFactory,
    Pointwise,
    Residual,
    Stage,
    TemporalConv,
    conv3d,
)

# How far the check's frames may be from the whole forward's, relative to their largest
# magnitude: float rounding of convs that accumulate over a shorter input, not a bug.
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}
BOUND_FOR_OTHER_DTYPES = 1e-2
# The check's clip: latent frames, and latents each side in space.
CHECK_LATENT_FRAMES = 4
CHECK_LATENT_SIZE = 2

_Op = Callable[[torch.Tensor], torch.Tensor]


def wavefront_net(decoder: Any, temb: torch.Tensor | None) -> NetFactory:
    """A factory of fresh layer-by-layer nets for `decoder`, run at timestep `temb` (the
    decoder's own argument: None unless timestep-conditioned)."""

    def make(batch: int, dtype: torch.dtype, device: torch.device) -> Stage:
        return _Builder(decoder, temb, batch, dtype).net()

    return make


def check(decoder: Any, make_net: NetFactory, temb: torch.Tensor | None) -> str | None:
    """Why the nets of `make_net` are not `decoder`'s forward on a small clip, or None."""
    parameter = next(decoder.parameters())
    generator = torch.Generator().manual_seed(0)
    size = CHECK_LATENT_SIZE
    shape = (1, int(decoder.conv_in.conv.in_channels), CHECK_LATENT_FRAMES, size, size)
    latents = torch.randn(shape, generator=generator).to(parameter.device, parameter.dtype)
    with torch.inference_mode():
        whole = _forward(decoder, latents, temb)
        net = make_net(1, latents.dtype, latents.device)
        parts: list[torch.Tensor] = []
        for latent in latents.split(1, dim=2):
            net.push(latent, parts.append)
        net.finish(parts.append)
    streamed = torch.cat(parts, dim=2)
    if streamed.shape != whole.shape:
        return (
            f"its layers streamed frames of shape {tuple(streamed.shape)}, its forward "
            f"{tuple(whole.shape)}"
        )
    difference = float((streamed.double() - whole.double()).abs().max())
    scale = max(float(whole.double().abs().max()), 1.0)
    bound = TOLERANCE.get(whole.dtype, BOUND_FOR_OTHER_DTYPES) * scale
    if not difference <= bound:
        return f"its layers streamed frames {difference:.3g} from its forward's (bound {bound:.3g})"
    return None


def _forward(decoder: Any, latents: torch.Tensor, temb: torch.Tensor | None) -> torch.Tensor:
    if _is_ltx2(decoder):
        return decoder(latents, temb, causal=None)
    return decoder(latents, temb)


def _is_ltx2(decoder: Any) -> bool:
    return type(decoder).__name__ == "LTX2VideoDecoder3d"


class _Builder:
    """One net's stages, from the decoder's modules."""

    def __init__(self, decoder: Any, temb: torch.Tensor | None, batch: int, dtype: Any) -> None:
        self.decoder = decoder
        self.batch = batch
        self.dtype = dtype
        # LTX-2's decoder runs every conv as its `is_causal` says (`causal=None`).
        self.causal: bool | None = bool(decoder.is_causal) if _is_ltx2(decoder) else None
        if decoder.timestep_scale_multiplier is not None:
            temb = temb * decoder.timestep_scale_multiplier
        self.temb = temb

    def net(self) -> Stage:
        decoder, stages = self.decoder, []
        stages.append(self.conv(decoder.conv_in))
        mid_temb = self.embedded(decoder.mid_block, self.temb)
        stages += [self.resnet(resnet, mid_temb) for resnet in decoder.mid_block.resnets]
        for block in decoder.up_blocks:
            if block.conv_in is not None:  # given the decoder's timestep, not the block's
                stages.append(self.resnet(block.conv_in, self.temb))
            block_temb = self.embedded(block, self.temb)
            stages += [self.upsampler(upsampler) for upsampler in block.upsamplers or ()]
            stages += [self.resnet(resnet, block_temb) for resnet in block.resnets]
        stages += [Pointwise(self.output_norm()), self.conv(decoder.conv_out)]
        stages.append(Pointwise(self.unpatchify))
        return Chain(stages)

    def embedded(self, block: Any, temb: torch.Tensor | None) -> torch.Tensor | None:
        """What `block` hands its resnets: its own embedding of the timestep, if it has
        one."""
        if block.time_embedder is None:
            return temb
        assert temb is not None
        embedded = block.time_embedder(
            timestep=temb.flatten(),
            resolution=None,
            aspect_ratio=None,
            batch_size=self.batch,
            hidden_dtype=self.dtype,
        )
        return embedded.view(self.batch, -1, 1, 1, 1)

    def conv(self, module: Any) -> TemporalConv:
        causal = self.causal if self.causal is not None else bool(module.is_causal)
        return TemporalConv(conv3d(module.conv), int(module.kernel_size[0]), causal)

    def norm(self, module: Any) -> _Op:
        if type(module).__name__ == "PerChannelRMSNorm":  # LTX-2's: over dim 1 already
            return module
        return lambda h: module(h.movedim(1, -1)).movedim(-1, 1)

    def resnet(self, block: Any, temb: torch.Tensor | None) -> Stage:
        shifts: tuple[torch.Tensor, ...] | None = None
        if block.scale_shift_table is not None:
            assert temb is not None
            table = block.scale_shift_table[None, ..., None, None, None]
            shifts = (temb.unflatten(1, (4, -1)) + table).unbind(dim=1)
        norm1, norm2 = self.norm(block.norm1), self.norm(block.norm2)

        def before_conv1(h: torch.Tensor) -> torch.Tensor:
            h = norm1(h)
            if shifts is not None:
                h = h * (1 + shifts[1]) + shifts[0]
            return block.nonlinearity(h)

        def before_conv2(h: torch.Tensor) -> torch.Tensor:
            h = norm2(h)
            if shifts is not None:
                h = h * (1 + shifts[3]) + shifts[2]
            return block.dropout(block.nonlinearity(h))

        shortcut_conv = None
        if block.conv_shortcut is not None:  # a kernel of one frame: per frame
            shortcut_conv = conv3d(getattr(block.conv_shortcut, "conv", block.conv_shortcut))

        def shortcut(h: torch.Tensor) -> torch.Tensor:
            if block.norm3 is not None:
                h = block.norm3(h.movedim(1, -1)).movedim(-1, 1)
            return h if shortcut_conv is None else shortcut_conv(h)

        main = Chain(
            [
                Pointwise(before_conv1),
                self.conv(block.conv1),
                Pointwise(before_conv2),
                self.conv(block.conv2),
            ]
        )
        return Residual(main, Pointwise(shortcut))

    def upsampler(self, upsampler: Any) -> Stage:
        stride = tuple(int(s) for s in upsampler.stride)

        def rearranged(h: torch.Tensor) -> torch.Tensor:
            """Each frame's channels to `stride` frames and pixels, as diffusers does."""
            b, _, frames, height, width = h.shape
            h = h.reshape(b, -1, *stride, frames, height, width)
            return h.permute(0, 1, 5, 2, 6, 3, 7, 4).flatten(6, 7).flatten(4, 5).flatten(2, 3)

        main: Stage = Chain([self.conv(upsampler.conv), Pointwise(rearranged)])
        if upsampler.residual:
            repeats = stride[0] * stride[1] * stride[2] // int(upsampler.upscale_factor)
            residual = Pointwise(lambda h: rearranged(h).repeat(1, repeats, 1, 1, 1))
            main = Residual(main, residual)
        return Chain([main, DropFirst(stride[0] - 1)])

    def output_norm(self) -> _Op:
        decoder, norm = self.decoder, self.norm(self.decoder.norm_out)
        shift = scale = None
        if decoder.time_embedder is not None:
            temb = self.embedded(decoder, self.temb)
            assert temb is not None
            table = decoder.scale_shift_table[None, ..., None, None, None]
            shift, scale = (temb.unflatten(1, (2, -1)) + table).unbind(dim=1)

        def op(h: torch.Tensor) -> torch.Tensor:
            h = norm(h)
            if shift is not None and scale is not None:
                h = h * (1 + scale) + shift
            return decoder.conv_act(h)

        return op

    def unpatchify(self, h: torch.Tensor) -> torch.Tensor:
        p, p_t = int(self.decoder.patch_size), int(self.decoder.patch_size_t)
        b, _, frames, height, width = h.shape
        h = h.reshape(b, -1, p_t, p, p, frames, height, width)
        return h.permute(0, 1, 5, 2, 6, 4, 7, 3).flatten(6, 7).flatten(4, 5).flatten(2, 3)
