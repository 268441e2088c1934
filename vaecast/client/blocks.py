"""Push blocks as a vaecast server reads them: latents or frames (and audio) as safetensors.

Apart from the sessions (`vaecast.client`) because serializing a block is pure and has
its own rules: latents keep their float dtype, float frames are quantized to uint8 on
their own device (the server's rounding) before the one copy to the host, and only the
mistakes that would otherwise cost a round trip are checked here.
"""

from __future__ import annotations

import numpy as np
import torch
from safetensors.torch import save as save_safetensors

from vaecast.errors import InvalidRequestError

Array = torch.Tensor | np.ndarray

_NUMPY_FLOATS = (np.float16, np.float32, np.float64)


def encode_block(latents: Array, audio: Array | None = None) -> bytes:
    """One block as the server reads it: safetensors with `latents` and maybe `audio`.

    The latents keep their float dtype (the server converts); the audio goes as float32.
    Checked here only as far as a mistake would otherwise cost a round trip.
    """
    tensor = _tensor(latents, "latents")
    if not tensor.is_floating_point():
        raise InvalidRequestError(f"latents must be floating point, got {tensor.dtype}")
    if tensor.ndim not in (4, 5):
        raise InvalidRequestError(
            f"a block is (C, t, H, W) or (B, C, t, H, W), got shape {tuple(tensor.shape)}"
        )
    if tensor.numel() == 0:
        raise InvalidRequestError(f"the block is empty: shape {tuple(tensor.shape)}")
    tensors = {"latents": tensor.contiguous()}
    if audio is not None:
        tensors["audio"] = _tensor(audio, "audio").to(torch.float32).contiguous()
    return save_safetensors(tensors)


def encode_frames_block(
    frames: Array, audio: Array | None = None, value_range: tuple[float, float] = (0.0, 1.0)
) -> bytes:
    """One frames block as the server reads it: safetensors with uint8 `frames`, `(T, H, W,
    3)` for one video or `(B, 3, T, H, W)` for a batch, and maybe `audio`. Floats are
    quantized to uint8 first, on their own device (`vaecast.codecs.quantize.quantize_to_host`,
    the server's own rounding), and copied to the host once per video."""
    from vaecast.codecs.quantize import quantize_to_host

    if isinstance(frames, np.ndarray) and frames.dtype == np.uint8:
        pixels = torch.from_numpy(frames if frames.flags.writeable else frames.copy())
    elif isinstance(frames, torch.Tensor) and frames.dtype == torch.uint8:
        pixels = frames.detach().cpu()
    else:
        tensor = frames if isinstance(frames, torch.Tensor) else _tensor(frames, "frames")
        if not tensor.is_floating_point():
            raise InvalidRequestError(f"frames must be uint8 or floating point, got {tensor.dtype}")
        if tensor.ndim == 4:
            tensor = tensor.unsqueeze(0)
        if tensor.ndim != 5 or tensor.shape[1] != 3:
            raise InvalidRequestError(
                f"float frames are (B, 3, T, H, W) or (3, T, H, W), got {tuple(frames.shape)}"
            )
        videos = [
            torch.from_numpy(quantize_to_host(tensor[b : b + 1].detach(), value_range))
            for b in range(tensor.shape[0])
        ]
        # One video as (T, H, W, 3); a batch as (B, 3, T, H, W), the server's batched form.
        pixels = videos[0] if len(videos) == 1 else torch.stack(videos).permute(0, 4, 1, 2, 3)
    one_video = pixels.ndim == 4 and pixels.shape[-1] == 3
    batched = pixels.ndim == 5 and pixels.shape[1] == 3
    if not (one_video or batched) or pixels.numel() == 0:
        raise InvalidRequestError(
            f"uint8 frames are (T, H, W, 3) or (B, 3, T, H, W), got {tuple(pixels.shape)}"
        )
    tensors = {"frames": pixels.contiguous()}
    if audio is not None:
        tensors["audio"] = _tensor(audio, "audio").to(torch.float32).contiguous()
    return save_safetensors(tensors)


def _tensor(value: Array, name: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()  # a block on the GPU is copied once, here
    if isinstance(value, np.ndarray):
        if value.dtype not in _NUMPY_FLOATS:
            raise InvalidRequestError(f"{name} must be float16, 32 or 64, got {value.dtype}")
        # torch.from_numpy warns on a read-only array; a copy is one block, cheap.
        writable = value if value.flags.writeable else value.copy()
        return torch.from_numpy(np.ascontiguousarray(writable))
    raise InvalidRequestError(f"{name} must be a torch tensor or a numpy array, got {type(value)}")
