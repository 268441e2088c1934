"""Ways for generators to feed a vaecast server: `vaecast.integrations.diffusers` runs
diffusers' video pipelines into one (whole latents uploaded, SkyReels-V2's causal blocks
in `skyreels`, FramePack's sections in `framepack`, frames a producer decoded itself).
Nothing here is imported by the server."""
