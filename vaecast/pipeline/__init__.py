"""The decode pipeline: latents in, one fMP4 fragment per decoded chunk out.

`run` drives a chunked decode on a thread and encodes each chunk as it comes; the
rest are its parts: the bridge from the decode thread, the latent feed of a push
session, the spare encoders, thread priorities, the decode heap, preview-first and
the interfaces a caller implements.
"""
