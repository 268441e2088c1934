"""The commands on latent files: `latents` makes one, `decode` decodes one to an
MP4 file, `push` pushes one to a server block by block.

Each is one function of the parsed arguments that returns the exit status; the
heavier imports (torch, the demo scenes, the push client) happen when it runs.
"""

from __future__ import annotations

import argparse
import errno

import torch

from vaecast.cli.decode_file import decode_to_file
from vaecast.cli.decode_options import (
    DEFAULTS,
    encoder_settings,
    load_decoder,
    resolve_diffusers,
    weights_by_model,
)
from vaecast.cli.output_files import write_whole
from vaecast.cli.start_checks import check_encoder, check_writable_folder
from vaecast.codecs.stream import Soundtrack
from vaecast.errors import InvalidRequestError, VaecastError
from vaecast.latent_files import AUDIO_RATE_KEY, check_audio, load_latents
from vaecast.models.layouts import layout_of
from vaecast.models.sound import decode_sound, sound_of
from vaecast.params import parse_fps
from vaecast.pipeline.run import VideoOutput


def run_latents(args: argparse.Namespace) -> int:
    import torch
    from safetensors.torch import save

    from vaecast.demo.soundtrack import DEFAULT_SAMPLE_RATE_HZ
    from vaecast.demo.sources import parse_scene_spec, read_video_file, scene_audio, scene_latents
    from vaecast.demo.video_soundtrack import read_soundtrack
    from vaecast.models.tiny import encode_video

    tensors: dict[str, torch.Tensor] = {}
    metadata: dict[str, str] = {"model": "tiny"}

    if args.scene is not None:
        fields = {
            "scene": args.scene,
            "frames": args.frames,
            "width": args.width,
            "height": args.height,
            "seed": args.seed,
        }
        spec = parse_scene_spec(fields)
        latents = scene_latents(spec, device=args.device)
        fps = parse_fps(args.fps, DEFAULTS.default_fps)
        if not args.no_sound:
            tensors["audio"] = torch.from_numpy(scene_audio(spec, fps))
            metadata[AUDIO_RATE_KEY] = str(DEFAULT_SAMPLE_RATE_HZ)
    else:
        video = read_video_file(args.video, args.max_frames)
        # The soundtrack before the encode, which takes long: a file whose audio
        # cannot be read is refused at once.
        if not args.no_sound:
            soundtrack = read_soundtrack(args.video, video.start_s, video.seconds)
            if soundtrack is not None:
                tensors["audio"] = torch.from_numpy(soundtrack.waveform)
                metadata[AUDIO_RATE_KEY] = str(soundtrack.sample_rate)
        latents, fps = encode_video(video.pixels, device=args.device), video.fps
    tensors["latents"] = latents.cpu().contiguous()
    metadata["fps"] = str(fps)
    write_whole(args.output, save(tensors, metadata=metadata))
    sound = " with sound" if "audio" in tensors else ""
    print(f"wrote {args.output}: latents {tuple(latents.shape)}, {float(fps):g} fps{sound}")
    return 0


def run_decode(args: argparse.Namespace) -> int:
    folder = args.output.parent
    # The output's place is checked before anything is read or decoded, and said as -o:
    # the file is written beside it as a hidden .part first, whose name means nothing.
    if not folder.is_dir():
        if folder.exists():
            raise NotADirectoryError(errno.ENOTDIR, "-o names a folder that is a file", str(folder))
        raise FileNotFoundError(errno.ENOENT, "-o names a folder that does not exist", str(folder))
    if args.output.is_dir():
        raise IsADirectoryError(errno.EISDIR, "-o names a folder, not a file", str(args.output))
    check_writable_folder("-o", str(folder))
    data = args.latents.read_bytes()
    models, weights = resolve_diffusers([args.model], weights_by_model(args.weights, [args.model]))
    decoder = load_decoder(models[0], args.device, weights.get(models[0]))
    layout = layout_of(decoder)
    try:
        latent_file = load_latents(data, layout=layout.bind)
    except VaecastError as error:
        raise InvalidRequestError(f"{args.latents}: not a latent file: {error.message}") from None
    fps = parse_fps(args.fps or latent_file.metadata.get("fps"), DEFAULTS.default_fps)
    soundtrack = None
    if latent_file.audio is not None:  # muxed as the server muxes it
        waveform, sample_rate = check_audio(
            latent_file.audio, latent_file.metadata.get(AUDIO_RATE_KEY)
        )
        soundtrack = Soundtrack(waveform, sample_rate)
    if latent_file.audio_latents is not None:  # decoded as the server decodes them
        sound = decode_sound(sound_of(decoder), models[0], latent_file.audio_latents)
        soundtrack = Soundtrack(*check_audio(torch.from_numpy(sound[0]), str(sound[1])))
    settings = encoder_settings(args)
    check_encoder(settings, fps)  # one line before the decode, not a traceback after it
    output = VideoOutput(fps, settings, soundtrack)
    plan = decode_to_file(latent_file.latents, decoder, output, args.output)
    sound = "" if soundtrack is None else f", {soundtrack.channels} audio channel(s)"
    print(
        f"wrote {args.output} ({plan.frames} frames, {plan.width}x{plan.height}, "
        f"{float(fps):g} fps{sound})"
    )
    return 0


def run_push(args: argparse.Namespace) -> int:
    from vaecast.cli.push_file import push_file  # the client: no server, no model loaded

    return push_file(
        args.latents,
        args.url,
        latent_fps=args.latent_fps,
        block_frames=args.block_frames,
        model=args.model,
        fps=args.fps,
        api_key=args.api_key,
        timeout=args.timeout,
    )
