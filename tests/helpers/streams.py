"""What the streaming tests share: one small decoder of each kind, latents pushed from another
thread as a push session's arrive, and a census of the tensors a block of code leaves alive."""

from __future__ import annotations

import collections
import contextlib
import gc
import itertools
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType

import torch
from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLWan
from torch import nn

from tests.helpers.models import MINIMAX_LATENT_CHANNELS, MINIMAX_TINY_CONFIG, WAN_TINY_CONFIG
from tests.helpers.wan import wan_decoder
from vaecast.models.base import ChunkedDecoder
from vaecast.models.linear import LinearDecoder
from vaecast.models.minimax import MiniMaxH3Decoder
from vaecast.models.taehv import TAEHVConfig, TAEHVDecoder, TAEHVNet
from vaecast.models.tiny import TinyDecoder

WAIT_S = 30.0
MINIMAX_WINDOW, MINIMAX_STRIDE = 7, 5


@dataclass(frozen=True, slots=True)
class Case:
    """A decoder, latents for it (up to their full length), and its commit rule."""

    decoder: ChunkedDecoder
    latents: torch.Tensor
    min_frames: int
    # Chunks that must be published once this many latent frames have arrived.
    committed: Callable[[int], int]
    # A module inside the model that runs during every decode (None: parameter-free).
    model_part: nn.Module | None

    @property
    def max_frames(self) -> int:
        return int(self.latents.shape[2])


def _latents(channels: int, frames: int, height: int, width: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(1, channels, frames, height, width, generator=generator)


def _windows_done(received: int) -> int:
    # Windows whose latents are all real: the bodies a stream can commit early.
    return max(0, (received - MINIMAX_WINDOW) // MINIMAX_STRIDE + 1)


def build_case(name: str) -> Case:
    """One decoder per kind at tiny sizes, random weights (the shipped ones for `tiny`)."""
    torch.manual_seed(0)
    if name == "linear":
        return Case(LinearDecoder(), _latents(16, 6, 2, 3, 1), 1, lambda n: n, None)
    if name == "tiny":
        decoder = TinyDecoder()
        # Its first layer: every step runs it once, on the decoding thread.
        return Case(decoder, _latents(16, 5, 2, 3, 2), 1, lambda n: n, decoder._net.inp)
    if name.startswith("taehv"):
        per_chunk = 2 if name == "taehv-grouped" else 1
        net = TAEHVNet(TAEHVConfig(latent_channels=16, widths=(8, 8, 4, 4)))
        decoder = TAEHVDecoder(net, latents_per_chunk=per_chunk)
        latents = _latents(16, 5, 2, 3, 3)
        return Case(decoder, latents, 1, lambda n: n // per_chunk, net.decoder[-1])
    if name == "wan2.1":
        wan = wan_decoder(AutoencoderKLWan(**WAN_TINY_CONFIG).eval())
        # 1x1 latents: the size at which post_quant_conv over several frames at once
        # rounds differently from one frame at a time (one thread, CPU).
        latents = _latents(16, 5, 1, 1, 4)
        return Case(wan.decoder, latents, 1, lambda n: n, wan.vae_decoder.conv_out)
    if name == "minimax-h3":
        vae = AutoencoderKLMiniMaxH3(**MINIMAX_TINY_CONFIG).eval()
        with torch.no_grad():  # random residual scales, so every layer counts
            for parameter in vae.parameters():
                parameter.copy_(torch.randn_like(parameter) * 0.2)
        latents = _latents(MINIMAX_LATENT_CHANNELS, 14, 2, 3, 5)
        return Case(MiniMaxH3Decoder(vae), latents, 3, _windows_done, vae.decoder)
    raise KeyError(name)


CASE_NAMES = ("linear", "tiny", "taehv", "taehv-grouped", "wan2.1", "minimax-h3")


def split(latents: torch.Tensor, cuts: Sequence[int]) -> list[torch.Tensor]:
    """`latents` cut along T before each index in `cuts`."""
    bounds = [0, *sorted(cuts), int(latents.shape[2])]
    return [latents[:, :, a:b] for a, b in itertools.pairwise(bounds)]


class PushedBlocks:
    """Latent blocks pushed from another thread, as a push session's arrive.

    `__next__` waits on a queue that a producer thread fills. Block i goes in either
    before the decoder asks for it (`early[i]`: the generator was ahead) or only once
    the decoder is waiting for it; after the last block, the end comes the same way
    (`early[-1]`), and is `error` raised from `__next__` if one is given (a server
    cancels a push session so). `asked` records, each time the decoder asks, the
    latent frames it had received and the chunks it had published by then.
    """

    def __init__(
        self,
        blocks: list[torch.Tensor],
        early: Sequence[bool],
        published: Callable[[], int],
        error: BaseException | None = None,
    ) -> None:
        assert len(early) == len(blocks) + 1
        self._items: collections.deque[torch.Tensor | BaseException | None] = collections.deque(
            [*blocks, error]
        )
        self._early = list(early)
        self._published = published
        self._queue: queue.Queue[torch.Tensor | BaseException | None] = queue.Queue()
        self._condition = threading.Condition()
        self._requests = 0
        self._stopped = False
        self._received = 0
        self.asked: list[tuple[int, int]] = []
        self.ended_with_chunks: int | None = None  # chunks published when it ended
        self._thread = threading.Thread(target=self._produce, daemon=True)

    def __iter__(self) -> PushedBlocks:
        return self

    def __next__(self) -> torch.Tensor:
        self.asked.append((self._received, self._published()))
        with self._condition:
            self._requests += 1
            self._condition.notify_all()
        item = self._queue.get(timeout=WAIT_S)
        if isinstance(item, torch.Tensor):
            self._received += int(item.shape[2])
            return item
        self.ended_with_chunks = self._published()
        if item is not None:
            raise item
        raise StopIteration

    def __enter__(self) -> PushedBlocks:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with self._condition:
            self._stopped = True
            self._condition.notify_all()
        self._thread.join(WAIT_S)
        assert not self._thread.is_alive()
        # What a decoder that stopped early never took is the producer's to drop.
        self._items.clear()
        while not self._queue.empty():
            self._queue.get_nowait()

    def _produce(self) -> None:
        for index, early in enumerate(self._early):
            if not early:
                with self._condition:
                    self._condition.wait_for(lambda i=index: self._asked_for(i), timeout=WAIT_S)
                    if self._stopped:
                        return
            self._queue.put(self._items.popleft())

    def _asked_for(self, index: int) -> bool:
        return self._stopped or self._requests > index


@contextlib.contextmanager
def tensor_census() -> Iterator[Callable[[], list[tuple[int, ...]]]]:
    """Inside the block, the returned function lists the shapes of the tensors that were
    created since the block began and are still alive. Objects that existed before
    are frozen out of the garbage collector's view (garbage among them too, until the
    block ends), so the census is cheap."""
    gc.freeze()
    try:

        def alive() -> list[tuple[int, ...]]:
            gc.collect()
            return [
                tuple(obj.shape)
                for obj in gc.get_objects()
                # type(), not isinstance(): some torch objects warn when asked for
                # their __class__.
                if issubclass(type(obj), torch.Tensor)
            ]

        yield alive
    finally:
        gc.unfreeze()


@contextlib.contextmanager
def failing_after(module: nn.Module, calls: int, error: BaseException) -> Iterator[None]:
    """`module` raises `error` when it is called more than `calls` times.

    Its `forward` is wrapped rather than hooked: a module with hooks runs through a
    closure of torch's that holds the call's arguments, which clearing the frames of
    a traceback cannot reach, and the decoders' own calls have no hooks.
    """
    forward = module.forward
    seen = [0]

    def failing(*args: object, **kwargs: object) -> object:
        seen[0] += 1
        if seen[0] > calls:
            raise error
        return forward(*args, **kwargs)

    module.forward = failing  # type: ignore[method-assign]
    try:
        yield
    finally:
        del module.forward


def count_calls(module: nn.Module, run: Callable[[], object]) -> int:
    """How many times `module` is called while `run()` runs."""
    seen = [0]
    handle = module.register_forward_pre_hook(lambda module, args: seen.__setitem__(0, seen[0] + 1))
    try:
        run()
    finally:
        handle.remove()
    return seen[0]
