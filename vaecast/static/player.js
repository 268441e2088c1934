// The page's one <video>, played through Media Source Extensions (segments appended
// as they arrive, so playback starts after the first decoded chunk) or, where the
// browser has no MediaSource, through a plain <video src>. Knows nothing of jobs or
// HTTP: the Session decides what to play and what a failure means.

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
    return Boolean(window.MediaSource);
  }

  canStream(type) {
    return MediaSource.isTypeSupported(type);
  }

  // Takes the video for `handlers`: frame() on each frame presented (or, without
  // requestVideoFrameCallback, firstPlaying() once), error(message) on a media error.
  attach(handlers) {
    this.#handlers = handlers;
    const generation = this.#generation;
    if ("requestVideoFrameCallback" in HTMLVideoElement.prototype) {
      const onFrame = () => {
        if (generation !== this.#generation) return;
        handlers.frame();
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
    const mediaSource = new MediaSource();
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
}
