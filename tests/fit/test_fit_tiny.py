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
