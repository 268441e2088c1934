"""The demo: latents to stream without a diffusion model, in `tiny`'s latent space.

vaecast decodes latents; to show it working, something has to make them. The demo
renders a procedural scene here and encodes it with the embedded `tiny` encoder, so
the latents decode with `tiny`, and gives it a soundtrack that is heard exactly
where the picture moves. The same procedural clips are what `tiny` was fitted on.

- `motion`: the one law of motion, straight lines bouncing off walls, read by both
  the picture and the sound.
- `font`, `layers`: the drawing ingredients (a bitmap font; backgrounds, moving
  shapes and text, effects).
- `scenes`: the named scenes and random training clips composed from them.
- `soundtrack`: clicks on wall hits and a tone following a shape.
- `sources`: demo requests and video files turned into `tiny` latents.
- `live`: a scene's latents a block at a time, rendered and encoded as they are asked
  for, as a generator would produce them (for push sessions).
"""
