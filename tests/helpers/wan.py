"""A `WanDecoder` with the modules it decodes through, for tests that hook or break them.

On a CPU the Wan 2.1 decoder runs a channels-last copy of the VAE's `post_quant_conv`
and decoder (`vaecast.models.wan.channels_last_modules`), so a hook on the VAE's own
modules would see nothing there.
"""

from __future__ import annotations

from typing import Any, NamedTuple
from unittest import mock

from torch import nn

import vaecast.models.wan
from vaecast.models.wan import WanDecoder


class BuiltWan(NamedTuple):
    decoder: WanDecoder
    post_quant_conv: nn.Module  # the one its decodes run
    vae_decoder: nn.Module  # the VAE's decoder network its decodes run
    copied: bool  # whether those are a channels-last copy rather than the VAE's own


def wan_decoder(vae: Any, **options: Any) -> BuiltWan:
    """`WanDecoder(vae, **options)` and the modules it runs."""
    made: list[tuple[nn.Module, nn.Module]] = []
    copy_modules = vaecast.models.wan.channels_last_modules

    def recorded(model: Any) -> tuple[nn.Module, nn.Module]:
        made.append(copy_modules(model))
        return made[-1]

    with mock.patch.object(vaecast.models.wan, "channels_last_modules", recorded):
        decoder = WanDecoder(vae, **options)
    assert len(made) <= 1
    if made:
        return BuiltWan(decoder, made[0][0], made[0][1], True)
    return BuiltWan(decoder, vae.post_quant_conv, vae.decoder, False)
