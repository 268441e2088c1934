"""The layer-by-layer stream (`vaecast/models/wavefront.py`) on a small net of its parts
against the same net's whole-clip forward: any split gives the same frames, each conv
call is worth making (depth first where frames are large, whole pushes where they are
small), chunks as the windows cut them, and `conv3d` as the module's own forward."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from vaecast.models.margin_windows import MarginWindows
from vaecast.models.wavefront import (
    Chain,
    DropFirst,
    Pointwise,
    Residual,
    Stage,
    TemporalConv,
    WavefrontStream,
    conv3d,
)

CHANNELS = 4


class Net(torch.nn.Module):
    """conv (k 3) -> residual [conv (k 5, causal) -> conv (k 1)] -> each frame to two,
    the first dropped -> conv (k 3): its whole-clip forward, padded as LTX's convs are."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first = torch.nn.Conv3d(CHANNELS, CHANNELS, 3, padding=(0, 1, 1))
        self.causal = torch.nn.Conv3d(CHANNELS, CHANNELS, (5, 3, 3), padding=(0, 1, 1))
        self.pointwise = torch.nn.Conv3d(CHANNELS, CHANNELS, 1)
        self.last = torch.nn.Conv3d(CHANNELS, CHANNELS, 3, padding=(0, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.first(_padded(x, 1, 1))
        x = x + self.pointwise(self.causal(_padded(torch.relu(x), 4, 0)))
        x = _doubled(x)[:, :, 1:]
        return self.last(_padded(x, 1, 1))

    def stages(self) -> Stage:
        causal = TemporalConv(conv3d(self.causal), 5, causal=True)
        pointwise = TemporalConv(conv3d(self.pointwise), 1, causal=False)
        main = Chain([Pointwise(torch.relu), causal, pointwise])
        return Chain(
            [
                TemporalConv(conv3d(self.first), 3, causal=False),
                Residual(main, Pointwise(lambda x: x)),
                Pointwise(_doubled),
                DropFirst(1),
                TemporalConv(conv3d(self.last), 3, causal=False),
            ]
        )


def _padded(x: torch.Tensor, before: int, after: int) -> torch.Tensor:
    first, last = x[:, :, :1], x[:, :, -1:]
    return torch.cat([first.repeat(1, 1, before, 1, 1), x, last.repeat(1, 1, after, 1, 1)], 2)


def _doubled(x: torch.Tensor) -> torch.Tensor:
    return x.repeat_interleave(2, dim=2)


def streamed(stage: Stage, x: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for block in x.split(sizes, dim=2):
        stage.push(block, out.append)
    stage.finish(out.append)
    return out


@pytest.mark.parametrize(
    "sizes", [[1] * 9, [9], [2, 7], [4, 1, 4], [8, 1]], ids=["1s", "whole", "2+7", "4+1+4", "8+1"]
)
@pytest.mark.parametrize("size", [3, 80], ids=["small frames", "large frames"])
def test_any_split_is_the_whole_forward(sizes: list[int], size: int) -> None:
    net = Net().eval()
    x = torch.randn(1, CHANNELS, 9, size, size, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        whole = net(x)
        frames = torch.cat(streamed(net.stages(), x, sizes), dim=2)
    assert frames.shape == whole.shape == (1, CHANNELS, 17, size, size)
    torch.testing.assert_close(frames, whole, rtol=0, atol=1e-5)


def test_one_frame_in_and_out() -> None:
    net = Net().eval()
    x = torch.randn(1, CHANNELS, 1, 3, 3)
    with torch.inference_mode():
        torch.testing.assert_close(
            torch.cat(streamed(net.stages(), x, [1]), 2), net(x), rtol=0, atol=1e-5
        )


def logged(calls: list[str], name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    def conv(x: torch.Tensor) -> torch.Tensor:
        calls.append(name)
        return x[:, :, 1:-1]

    return conv


def three_convs(calls: list[str]) -> Chain:
    return Chain([TemporalConv(logged(calls, name), 3, causal=False) for name in "abc"])


def test_large_frames_go_on_one_at_a_time() -> None:
    """Depth first: the last conv runs before the first has taken every frame, so the
    first output frames need little more than the work they depend on (a conv's first
    frame waits for the one after it, and calls nothing)."""
    calls: list[str] = []
    outputs: list[int] = []
    three_convs(calls).push(torch.zeros(1, 1, 6, 64, 64), lambda x: outputs.append(x.shape[2]))
    assert calls == ["a", "a", "b"] + ["a", "b", "c"] * 3
    assert outputs == [1, 1, 1]  # three of six frames have what they read after them


def test_small_frames_take_a_push_whole() -> None:
    """Frames of few positions are taken by each conv in one call per push, and at the
    finish in two at most (the tail the convs before it left, then its own), not frame
    by frame."""
    calls: list[str] = []
    chain = three_convs(calls)
    out = streamed(chain, torch.zeros(1, 1, 30, 4, 4), [30])
    pushed, finished = calls[:3], calls[3:]
    assert pushed == ["a", "b", "c"] and finished == ["a", "b", "b", "c", "c"]
    assert sum(x.shape[2] for x in out) == 30


def test_the_stream_cuts_the_windows_chunks_and_checks_the_frame_count() -> None:
    windows = MarginWindows(temporal_scale=8, chunk_latents=3, window_latents=3, reach=None)

    def make_net(frames_per_latent: int) -> Callable[..., Stage]:
        # Latent k to frames: 1 for the first, 8 after (what the real decoders do) or not.
        def make(batch: int, dtype: torch.dtype, device: torch.device) -> Stage:
            return Chain(
                [Pointwise(lambda x: x.repeat_interleave(frames_per_latent, 2)), DropFirst(7)]
            )

        return make

    emitted: list[int] = []
    stream = WavefrontStream(windows, lambda z: z, make_net(8))
    for _ in range(4):
        stream.push(
            torch.zeros(1, 2, 2, 1, 1), lambda frames, yuv=None: emitted.append(frames.shape[2])
        )
    stream.finish(8, lambda frames, yuv=None: emitted.append(frames.shape[2]))
    assert emitted == [17, 24, 16]
    stream.close()
    wrong = WavefrontStream(windows, lambda z: z, make_net(4))
    wrong.push(torch.zeros(1, 2, 8, 1, 1), lambda frames, yuv=None: None)
    with pytest.raises(RuntimeError, match="8 latent frames decoded to 25 frames, expected 57"):
        wrong.finish(8, lambda frames, yuv=None: None)


@pytest.mark.parametrize("mode", ["zeros", "reflect"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_conv3d_is_the_modules_forward(mode: str, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    module = torch.nn.Conv3d(3, 5, 3, padding=(0, 1, 1), padding_mode=mode).to(dtype)
    x = torch.randn(1, 3, 4, 6, 7, dtype=dtype)
    with torch.inference_mode():
        torch.testing.assert_close(conv3d(module)(x), module(x), rtol=0, atol=1e-5)
        if mode == "reflect":  # really reflected, not zero-padded
            zero_padded = F.conv3d(x, module.weight, module.bias, padding=(0, 1, 1))
            assert not torch.allclose(conv3d(module)(x), zero_padded)


def test_conv3d_leaves_onednn_off_where_the_user_turned_it_off() -> None:
    torch.manual_seed(0)
    module = torch.nn.Conv3d(3, 5, 3, padding=(0, 1, 1))
    x = torch.randn(1, 3, 4, 6, 7)
    torch.backends.mkldnn.enabled = False
    try:
        with torch.inference_mode():
            assert torch.equal(conv3d(module)(x), module(x))
    finally:
        torch.backends.mkldnn.enabled = True
