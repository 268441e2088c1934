// One of the page's <video>s, played through Media Source Extensions (segments
// appended as they arrive, so playback starts after the first decoded chunk) or,
// where the browser has no MediaSource, through a plain <video src>. Knows nothing
// of jobs or HTTP: the Session decides what to play and what a failure means.
//
// The Media Source is `MediaSource` where the browser has it, else
// `ManagedMediaSource` (iPhone Safari 17.1+ has only that one; it needs the video's
// remote playback off); found by feature detection, never by user agent.
//
// The page has two, stacked: the one in front is seen, the other (class "behind")
// is invisible. A job with a preview plays its preview in front while its final
// loads behind; handOver() then swaps them at the same playback time.

// Feeds a SourceBuffer one segment at a time (appendBuffer throws while `updating`).
class AppendQueue {
  constructor(mediaSource, sourceBuffer, onMediaSegment) {
    this.mediaSource = mediaSource;
    this.sourceBuffer = sourceBuffer;
    this.onMediaSegment = onMediaSegment;
    this.queue = [];
    // Appends whose updateend has not fired yet. `updating` turns false before
    // updateend is dispatched, so a second append can start in between: each
    // updateend belongs to the oldest append still listed here.
    this.appending = [];
    this.ending = false;
    sourceBuffer.addEventListener("updateend", () => {
      const done = this.appending.shift();
      if (done && done.media) this.onMediaSegment();
      this.next();
    });
  }

  append(bytes, media) {
    this.queue.push({ bytes, media });
    this.next();
  }

  // No more segments: end the stream once the queue has drained.
  end() {
    this.ending = true;
    this.next();
  }

  next() {
    if (this.sourceBuffer.updating || this.mediaSource.readyState !== "open") return;
    if (this.queue.length) {
      const segment = this.queue.shift();
      this.appending.push(segment);
      this.sourceBuffer.appendBuffer(segment.bytes);
    } else if (this.ending) {
      this.mediaSource.endOfStream();
    }
  }
}

// The Media Source constructor to use, or null.
export function mediaSourceClass() {
  return window.MediaSource ?? window.ManagedMediaSource ?? null;
}

export class Player {
  // Callbacks of whoever plays now; reset() drops them, so a replaced session
  // hears nothing of the next one's video.
  #handlers = null;
  // Bumped by reset(): a frame callback or a MediaSource opened for an earlier
  // video sees it changed and stops.
  #generation = 0;

  constructor(video) {
    this.video = video;
    video.addEventListener("error", () => this.#handlers?.error(`video error: ${video.error.message}`));
  }

  // Deleted in the browser tests' fallback check, so read on each use.
  get hasMediaSource() {
    return mediaSourceClass() !== null;
  }

  // "mse" (MediaSource), "mms" (ManagedMediaSource) or null (neither).
  get mediaSourceKind() {
    const found = mediaSourceClass();
    if (found === null) return null;
    return found === window.MediaSource ? "mse" : "mms";
  }

  // Whether the browser plays HLS in a plain <video src> (Safari), for when it has
  // no Media Source at all.
  get playsHls() {
    return Boolean(this.video.canPlayType("application/vnd.apple.mpegurl"));
  }

  canStream(type) {
    return mediaSourceClass().isTypeSupported(type);
  }

  // Takes the video for `handlers`: frame() on each frame presented (or, without
  // requestVideoFrameCallback, firstPlaying() once), error(message) on a media error.
  attach(handlers) {
    this.#handlers = handlers;
    const generation = this.#generation;
    if ("requestVideoFrameCallback" in HTMLVideoElement.prototype) {
      const onFrame = (now, metadata) => {
        if (generation !== this.#generation) return;
        handlers.frame(metadata.mediaTime);
        this.video.requestVideoFrameCallback(onFrame);
      };
      this.video.requestVideoFrameCallback(onFrame);
    } else {
      this.video.addEventListener(
        "playing",
        () => generation === this.#generation && handlers.firstPlaying(),
        { once: true },
      );
    }
  }

  // The fallback: the browser fetches and plays the URL itself (out of our sight).
  playUrl(url) {
    this.video.src = url;
    return this.video.play();
  }

  play() {
    return this.video.play();
  }

  // A MediaSource with one SourceBuffer of `type`, once it is open; null if the
  // video was reset meanwhile. onMediaSegment() runs after each media segment is in.
  async openStream(type, onMediaSegment) {
    const generation = this.#generation;
    const Source = mediaSourceClass();
    // A ManagedMediaSource plays only where remote playback (AirPlay) is off.
    if (Source !== window.MediaSource) this.video.disableRemotePlayback = true;
    const mediaSource = new Source();
    const url = URL.createObjectURL(mediaSource);
    this.video.src = url;
    await new Promise((resolve) => mediaSource.addEventListener("sourceopen", resolve, { once: true }));
    URL.revokeObjectURL(url);
    if (generation !== this.#generation) return null;
    return new AppendQueue(mediaSource, mediaSource.addSourceBuffer(type), onMediaSegment);
  }

  // Empties the video and forgets its handlers.
  reset() {
    this.#handlers = null;
    this.#generation += 1;
    this.video.removeAttribute("src");
    this.video.load();
  }

  // Puts the video in front (seen, with controls) or behind (invisible, paused).
  setFront(front) {
    this.video.classList.toggle("behind", !front);
    this.video.controls = front;
    this.video.setAttribute("aria-hidden", String(!front));
  }

  get front() {
    return !this.video.classList.contains("behind");
  }
}

// ------------------------------------------------------------ hand-over

const HAVE_CURRENT_DATA = 2;
const HAVE_FUTURE_DATA = 3;
const POLL_MS = 4;
const SEEK_TIMEOUT_MS = 5000;

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Playing on (not paused by the user, not at its end, not stalled for data).
function moving(video) {
  return !video.paused && !video.ended && video.readyState >= HAVE_FUTURE_DATA;
}

// Whether `video` holds [t, t + need] (the intersection of its tracks, as MSE buffers).
function holds(video, t, need) {
  const ranges = video.buffered;
  for (let i = 0; i < ranges.length; i += 1) {
    if (ranges.start(i) <= t + 1e-3 && ranges.end(i) >= t + need - 1e-3) return true;
  }
  return false;
}

// Seeks the (paused) video to `t`; true once it shows the frame there.
async function seekTo(video, t, stop) {
  const seeked = new Promise((resolve) => video.addEventListener("seeked", resolve, { once: true }));
  video.currentTime = t;
  const deadline = performance.now() + SEEK_TIMEOUT_MS;
  let done = false;
  seeked.then(() => (done = true));
  while (!done || video.readyState < HAVE_CURRENT_DATA) {
    if (stop() || performance.now() > deadline) return false;
    await sleep(POLL_MS);
  }
  return true;
}

// Swaps `from` (in front, playing) for `to` (behind, loading the same video in
// another rendition) at the same playback time, with no jump back and no restart:
// `to` is seeked, paused and invisible, to the middle of a frame a little ahead
// of `from` (`leadS`), and brought to the front, playing, when `from` presents
// that very frame. When `from` does not move (paused by the user, stalled on data
// it lacks, ended), `to` takes over where it stands. `frameS` is one frame's
// duration; `stop()` true abandons the hand-over (then null). Resolves to
// {before, after, at, played}: each video's currentTime at the swap, its
// performance.now(), and the promise of `to`'s play() (resolved if it was paused).
export async function handOver(from, to, { frameS, leadS = 0.3, stop = () => false }) {
  const a = from.video;
  const b = to.video;
  b.muted = true; // behind, it stays silent even if something plays it
  for (;;) {
    // 1. Where `to` will take over: the middle of a frame, once `to` holds it.
    let target;
    for (;;) {
      if (stop()) return null;
      if (moving(a)) {
        const frame = Math.ceil((a.currentTime + leadS) / frameS);
        target = (frame + 0.5) * frameS;
        if (holds(b, target, frameS)) break;
      } else {
        target = a.currentTime;
        if (holds(b, target, 0)) break;
      }
      await sleep(POLL_MS * 5);
    }
    // 2. Show that frame behind.
    if (!(await seekTo(b, target, stop))) {
      if (stop()) return null;
      continue;
    }
    // 3. Wait for `from` to reach the frame `to` shows; aim again if it stops short
    // of it or (timers held back) passes it.
    const first = target - frameS / 2;
    const last = target + frameS / 2;
    for (;;) {
      if (stop()) return null;
      const t = a.currentTime;
      if (t >= first - 1e-3 && t < last) return swap(from, to);
      if (t >= last || !moving(a)) {
        if (!moving(a) && Math.abs(t - target) < 1e-3) return swap(from, to);
        break;
      }
      await sleep(POLL_MS);
    }
  }
}

function swap(from, to) {
  const a = from.video;
  const b = to.video;
  const before = a.currentTime;
  const playing = !a.paused && !a.ended;
  b.volume = a.volume;
  b.playbackRate = a.playbackRate;
  b.muted = a.muted;
  to.setFront(true);
  from.setFront(false);
  const played = playing ? b.play() : Promise.resolve();
  a.pause();
  return { before, after: b.currentTime, at: performance.now(), played };
}

// ------------------------------------------------------------ watchdog

const WATCH_MS = 250;
const STUCK_MS = 1000;
const NUDGE_S = 0.001;
// A playhead this close to the end of the data it stands in is at a hole's edge (a
// player stops a frame or two short of a buffered range's end): it jumps the hole.
const EDGE_S = 0.25;

// Where a playhead stuck at `t` can play on from: a hair ahead inside the data it stands
// in, or, at its edge, the start of the next data past the hole; null when nothing is
// buffered ahead (then it waits for data, as it should).
export function nudgeTarget(buffered, t) {
  for (let i = 0; i < buffered.length; i += 1) {
    const start = buffered.start(i);
    const end = buffered.end(i);
    if (start <= t && end > t + EDGE_S) return t + NUDGE_S;
    if (start > t) return start;
  }
  return null;
}

// A playhead that stops while data ahead of it is buffered (a hole between appended
// segments, a seek that never completes, or a decoder that did not resume: what made
// Gradio add a watchdog that restarts a frozen player) is nudged: after STUCK_MS
// without moving, not paused, not ended, it is moved to `nudgeTarget` and played.
// `onNudge()` counts it.
export class Watchdog {
  #timer = null;
  #last = null;
  #since = 0;

  constructor(video, onNudge) {
    this.video = video; // () => the <video> in front
    this.onNudge = onNudge;
  }

  start() {
    this.#timer ??= setInterval(() => this.check(performance.now()), WATCH_MS);
  }

  stop() {
    clearInterval(this.#timer);
    this.#timer = null;
  }

  check(now) {
    const video = this.video();
    // A seek is given longer (a seek over a hole may never complete, one into data does).
    const patience = video?.seeking ? 3 * STUCK_MS : STUCK_MS;
    if (!video || video.paused || video.ended || !video.buffered.length) {
      this.#last = null;
      return;
    }
    const t = video.currentTime;
    if (t !== this.#last) {
      this.#last = t;
      this.#since = now;
      return;
    }
    if (now - this.#since < patience) return;
    this.#since = now;
    const target = nudgeTarget(video.buffered, t);
    if (target === null) return;
    video.currentTime = target;
    video.play().catch(() => {});
    this.onNudge(t, target);
  }
}
