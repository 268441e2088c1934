"""The pieces of `tools/fit_tiny.py` that make its data: augmented real crops, the
procedural pool that a resume rebuilds exactly, and 8-aligned crops."""

from __future__ import annotations

import fit_tiny
import pytest
import torch


@pytest.fixture(scope="module")
def pool() -> fit_tiny.RealPool:
    return fit_tiny.RealPool()


@pytest.mark.slow
@pytest.mark.usefixtures("need_clips")
@pytest.mark.parametrize(("frames", "crop"), fit_tiny.SHAPES)
def test_real_crops_have_the_batch_shape(pool: fit_tiny.RealPool, frames: int, crop: int) -> None:
    g = torch.Generator().manual_seed(1)
    batch = pool.batch(g, 6, frames, crop)
    assert batch.shape == (6, 3, frames, crop, crop) and batch.dtype == torch.float32
    assert batch.min() >= 0 and batch.max() <= 1
    # Real pictures (a crop of night sky may be flat, not a whole batch), all different.
    assert batch.std() > 0.05
    assert len({round(float(b.mean()), 6) for b in batch}) == len(batch)


@pytest.mark.slow
@pytest.mark.usefixtures("need_clips")
def test_real_crops_are_seeded(pool: fit_tiny.RealPool) -> None:
    a = pool.batch(torch.Generator().manual_seed(5), 4, 9, 64)
    b = pool.batch(torch.Generator().manual_seed(5), 4, 9, 64)
    c = pool.batch(torch.Generator().manual_seed(6), 4, 9, 64)
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.slow
@pytest.mark.usefixtures("need_clips")
def test_real_crops_never_come_from_held_out_frames(pool: fit_tiny.RealPool) -> None:
    import real_clips

    spans = [real_clips.fit_span(c.name) for c in real_clips.CLIPS]
    assert [int(s.shape[1]) for s in pool.spans] == [len(s) for s in spans]
    for span, frames in zip(pool.spans, spans, strict=True):
        assert torch.equal(span, torch.from_numpy(frames.copy()).permute(3, 0, 1, 2))


def test_crop_batch_is_8_aligned_and_inside_the_clip() -> None:
    clip = torch.arange(3 * 9 * 40 * 56, dtype=torch.float32).reshape(1, 3, 9, 40, 56)
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        crop = fit_tiny.crop_batch(g, [clip], 1, 5, 16)
        assert crop.shape == (1, 3, 5, 16, 16)
        origin = int(crop[0, 0, 0, 0, 0])
        y, x = (origin % (40 * 56)) // 56, origin % 56
        assert y % 8 == 0 and x % 8 == 0


@pytest.mark.slow
def test_procedural_pool_is_rebuilt_exactly_on_resume() -> None:
    pool = fit_tiny.ClipPool(seed=0, size=2, frames=5)
    pool.refresh()
    state = pool.state()
    assert state == {"indices": [2, 1], "next": 1, "rendered": 3}
    again = fit_tiny.ClipPool.__new__(fit_tiny.ClipPool)
    again.seed, again.frames = 0, 5
    again.restore(state)
    assert all(torch.equal(a, b) for a, b in zip(pool.clips, again.clips, strict=True))
    # Fit renders never reuse the held-out or selection seeds.
    assert max(fit_tiny.SELECTION_SEEDS) < fit_tiny.RENDER_SEED_BASE


def test_widening_keeps_the_function_and_opens_new_channels() -> None:
    from vaecast.models import tiny

    torch.manual_seed(0)
    narrow = (tiny.TinyEncoderNet(), tiny.TinyDecoderNet())
    wide = (
        tiny.TinyEncoderNet(quarter=32, sub=40, step=80),
        tiny.TinyDecoderNet(step=80, sub=40, quarter=32),
    )
    # Non-zero last convs, as after a fit (a fresh net's output convs would hide errors).
    for net in narrow:
        for p in net.parameters():
            p.data.normal_(0, 0.05)
    for net, old in zip(wide, narrow, strict=True):
        fit_tiny.widen_into(net, old.state_dict())
    clip = torch.rand(2, 3, 9, 32, 48, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = fit_tiny.reconstruct(*narrow, clip)
        after = fit_tiny.reconstruct(*wide, clip)
    assert torch.allclose(before, after, atol=1e-5)
    # The new channels learn: the loss has a gradient on the weights out of them.
    loss = (fit_tiny.reconstruct(*wide, clip) - clip).square().mean()
    loss.backward()
    assert wide[1].out.weight.grad[:, 24:].abs().sum() > 0
    assert wide[0].mem.mix.weight.grad[:64, 64:80].abs().sum() > 0


def test_motion_candidates_keep_the_window_that_moves_most() -> None:
    # Left half still, right half new noise every frame: windows differ in motion.
    clip = torch.zeros(1, 3, 9, 32, 64)
    clip[..., 32:] = torch.rand(1, 3, 9, 32, 32, generator=torch.Generator().manual_seed(0))

    def motion(window: torch.Tensor) -> float:
        return float((window[:, :, 1:] - window[:, :, :-1]).abs().mean())

    gained = 0
    for seed in range(20):
        one = fit_tiny.crop_batch(torch.Generator().manual_seed(seed), [clip], 1, 5, 16)
        # The first of the candidates is the single draw: the kept one moves at least as much.
        four = fit_tiny.crop_batch(torch.Generator().manual_seed(seed), [clip], 1, 5, 16, 4)
        assert four.shape == one.shape == (1, 3, 5, 16, 16) and four.dtype == torch.float32
        assert motion(four) >= motion(one)
        gained += motion(four) > motion(one)
    assert gained >= 3


@pytest.mark.slow
@pytest.mark.usefixtures("need_clips")
def test_real_weights_draw_clips_by_weight() -> None:
    names = [c.name for c in fit_tiny.real_clips.CLIPS]
    uniform = fit_tiny.RealPool()
    # The default draws exactly as before the option existed: one randint per crop.
    g, h = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert [uniform.pick(g) for _ in range(50)] == [
        int(torch.randint(len(names), (), generator=h)) for _ in range(50)
    ]
    assert fit_tiny.RealPool(fit_tiny._clip_weights("city=1")).weights is None
    weighted = fit_tiny.RealPool(fit_tiny._clip_weights("city=3,bikes=0"))
    g = torch.Generator().manual_seed(4)
    counts = torch.bincount(torch.tensor([weighted.pick(g) for _ in range(3000)]), minlength=4)
    share = dict(zip(names, (counts / counts.sum()).tolist(), strict=True))
    assert share["bikes"] == 0
    assert share["city"] == pytest.approx(0.6, abs=0.04)  # 3 / (1 + 0 + 1 + 3)
    assert share["bigbuckbunny"] == pytest.approx(0.2, abs=0.03)


@pytest.mark.parametrize(
    "text", ["nope=1", "city=", "city=-1", "bigbuckbunny=0,bikes=0,carphone=0,city=0"]
)
def test_real_weights_reject_bad_values(text: str) -> None:
    with pytest.raises(ValueError):
        fit_tiny._clip_weights(text)
