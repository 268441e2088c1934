// One job as the page shows it: the fetch of its content (MSE) or the <video src>
// fallback, its server-sent events, and everything the page knows about it. The
// state lives here and nowhere else; the UI listens and renders:
//   "change"   the state changed
//   "error"    detail: a message to show (also recorded in state.errors)
//   "finished" the job reached its end on the server (the jobs list is stale)
// close() tears the session down (fetch aborted, EventSource closed, video emptied)
// and silences it: callbacks still in flight see #closed and do nothing.

import { apiFetch, errorMessage, fetchJson, getJson } from "./api.js";
import { Segmenter } from "./boxes.js";

const LIVE = ["queued", "in_progress"];

// What the page shows before any job (also the starting point of each session).
export function blankState() {
  return {
    jobId: null,
    status: "idle",         // the job's status, as the server last reported it
    playback: null,         // "mse" or "src" (the fallback without MediaSource)
    contentType: null,
    clickedAt: null,        // performance.now() when the user started the job
    firstFrameAt: null,     // performance.now() when its first frame was on screen
    timeToFirstFrameMs: null,
    framesPlanned: null,
    seconds: null,
    chunksDone: 0,
    chunksTotal: null,
    framesDone: 0,
    decodeFps: null,
    bytesReceived: 0,
    fragmentsAppended: 0,   // moof+mdat pairs the SourceBuffer has taken
    framesShown: 0,         // requestVideoFrameCallback calls while this job played
    streamEnded: false,     // the content fetch ended and endOfStream() was called
    errors: [],
  };
}

export class Session extends EventTarget {
  #abort = new AbortController();
  #events = null;   // the EventSource
  #rate = null;     // {at, frames}: where the decode-speed estimate starts
  #closed = false;

  constructor(job, { player, clickedAt }) {
    super();
    this.job = job;
    this.id = job.id;
    this.player = player;
    this.cancelled = false; // the user cancelled: the cut stream that follows is no fault
    this.state = { ...blankState(), jobId: job.id, clickedAt };
  }

  get cancellable() {
    return !this.#closed && !this.cancelled && LIVE.includes(this.state.status);
  }

  // Shows the job and plays it; settles when its content stream has ended. Never
  // rejects: what goes wrong is recorded as the session's error.
  async start() {
    this.#applyJob(this.job);
    this.#changed();
    this.player.attach({
      frame: () => {
        this.state.framesShown += 1;
        if (this.state.firstFrameAt === null) this.#firstFrame();
      },
      firstPlaying: () => this.#firstFrame(),
      error: (message) => this.fail(message),
    });
    this.#followEvents();
    try {
      await this.#play(this.job.urls.content);
    } catch (error) {
      if (error.name !== "AbortError" && !this.cancelled) this.fail(error.message);
    }
  }

  // Asks the server to cancel the job. The server then ends the content stream and
  // the events itself, so what was decoded stays playable to its end.
  async cancel() {
    this.cancelled = true;
    this.#changed();
    try {
      this.#applyJob(await fetchJson(`/v1/videos/${this.id}`, { method: "DELETE" }));
    } catch (error) {
      this.fail(error.message);
    }
    this.#changed();
  }

  // Stops showing the job (another one replaces it); the job itself runs on.
  close() {
    if (this.#closed) return;
    this.#closed = true;
    this.#abort.abort();
    this.#events?.close();
    this.player.reset();
  }

  fail(message) {
    if (this.#closed) return;
    // A failed job reports itself twice: as an `error` event and as a cut stream.
    if (this.state.errors.includes(message)) return;
    this.state.errors.push(message);
    this.dispatchEvent(new CustomEvent("error", { detail: message }));
    this.#changed();
  }

  #changed() {
    if (!this.#closed) this.dispatchEvent(new Event("change"));
  }

  #firstFrame() {
    this.state.firstFrameAt = performance.now();
    if (this.state.clickedAt !== null) {
      this.state.timeToFirstFrameMs = this.state.firstFrameAt - this.state.clickedAt;
    }
    this.#changed();
  }

  // ------------------------------------------------------------ playback

  async #play(contentUrl) {
    const state = this.state;
    if (!this.player.hasMediaSource) {
      state.playback = "src";
      await this.player.playUrl(contentUrl).catch((error) => this.fail(`playback: ${error.message}`));
      return;
    }
    const response = await apiFetch(contentUrl, { signal: this.#abort.signal });
    if (!response.ok) throw new Error(await errorMessage(response));
    const type = response.headers.get("Content-Type");
    state.contentType = type;
    if (!this.player.canStream(type)) {
      this.#abort.abort();
      throw new Error(`this browser cannot play ${type}`);
    }
    state.playback = "mse";
    const stream = await this.player.openStream(type, () => {
      state.fragmentsAppended += 1;
      if (state.fragmentsAppended === 1) {
        this.player.play().catch((error) => this.fail(`playback: ${error.message}`));
      }
      this.#changed();
    });
    if (this.#closed || stream === null) return;
    const segmenter = new Segmenter();
    const reader = response.body.getReader();
    let cut = false;
    for (;;) {
      let chunk;
      try {
        chunk = await reader.read();
      } catch (error) {
        // A cancelled job's stream is cut by the server; any other cut is a fault
        // whose reason the job object holds.
        cut = true;
        if (!this.cancelled && !this.#closed) this.fail(await this.#streamCutReason(error));
        break;
      }
      if (chunk.done || this.#closed) break;
      state.bytesReceived += chunk.value.length;
      let segments;
      try {
        segments = segmenter.push(chunk.value);
      } catch (error) {
        this.#abort.abort();
        throw error;
      }
      for (const segment of segments) stream.append(segment.bytes, segment.media);
      this.#changed();
    }
    if (this.#closed) return;
    if (segmenter.holding && !cut && !this.cancelled) this.fail("the stream ended inside an MP4 box");
    state.streamEnded = true;
    stream.end();
    this.#changed();
  }

  async #streamCutReason(error) {
    try {
      const job = await getJson(`/v1/videos/${this.id}`);
      if (job.error) return job.error.message;
    } catch {
      // Fall through to the network error itself.
    }
    return `the video stream broke off: ${error.message}`;
  }

  // ------------------------------------------------------------ events

  #followEvents() {
    const events = new EventSource(`/v1/videos/${this.id}/events`);
    this.#events = events;
    const state = this.state;
    const on = (type, handle) =>
      events.addEventListener(type, (event) => {
        // EventSource fires its own data-less "error" when the connection drops
        // (it reconnects by itself); only the server's events carry data.
        if (this.#closed || event.data === undefined) return;
        handle(JSON.parse(event.data));
        this.#changed();
      });
    on("state", (job) => {
      this.#applyJob(job);
      if (job.status === "in_progress") this.#rate = { at: performance.now(), frames: job.frames_done };
    });
    on("queued", (event) => (state.status = event.status));
    on("started", (event) => {
      state.status = event.status;
      this.#rate = { at: performance.now(), frames: 0 };
    });
    on("chunk", (event) => {
      state.status = event.status;
      state.chunksDone = event.index + 1;
      state.chunksTotal = event.total;
      state.framesDone = event.frames_done;
      if (this.#rate) {
        const seconds = (performance.now() - this.#rate.at) / 1000;
        state.decodeFps = (event.frames_done - this.#rate.frames) / seconds;
      }
    });
    on("done", (event) => {
      events.close();
      this.#applyJob(event.job);
      this.dispatchEvent(new Event("finished"));
    });
    on("error", (event) => {
      events.close();
      state.status = event.status;
      if (!this.cancelled) this.fail(event.error.message);
      this.dispatchEvent(new Event("finished"));
    });
  }

  // Takes what a job object says (a `state` event, a `done` event, a POST or DELETE answer).
  #applyJob(job) {
    const state = this.state;
    state.status = job.status;
    state.framesPlanned = job.frames;
    state.seconds = job.frames / job.fps; // exact; job.seconds is rounded
    state.chunksDone = job.chunks.done;
    state.chunksTotal = job.chunks.total;
    state.framesDone = job.frames_done;
    const { queued_s: queued, total_s: total } = job.timings;
    if (job.status === "completed" && queued !== null && total > queued) {
      state.decodeFps = job.frames / (total - queued); // the server's own clock
    }
    if (job.error && !this.cancelled) this.fail(job.error.message);
  }
}
