// One job as the page shows it: the fetch of its content (MSE) or the <video src>
// fallback, its server-sent events, and everything the page knows about it. The
// state lives here and nowhere else; the UI listens and renders:
//   "change"   the state changed
//   "error"    detail: a message to show (also recorded in state.errors)
//   "finished" the job reached its end on the server (the jobs list is stale)
// close() tears the session down (fetch aborted, EventSource closed, video emptied)
// and silences it: callbacks still in flight see #closed and do nothing.
//
// A job with a preview (its object has `variants`) has two renditions of the same
// latents. The preview plays at once in the front <video>; once the server says the
// final has caught up with its viewer (`final_ready`, else `final_done`), the final
// loads into the <video> behind and player.js's handOver() swaps them at the same
// playback time. "Stop full decode" (stopFinal) stops the final only: the preview
// plays on to its end (handed back to, if the final was already in front).
//
// A job still decoding, slower than real time, would stall if played from its first
// fragment: the server predicts `stall_free_start_s`, the earliest delay after the
// first fragment from which it plays to its end without a stall (0: faster than real
// time). The page waits that long (the latest value heard) before it plays; a
// finished job, and a preview (fast by design), play at once. A preview's final is
// swapped in, once ready, only where it plays on stall-free from the viewer's place.

import { apiFetch, errorMessage, fetchJson, getJson } from "./api.js";
import { Segmenter } from "./boxes.js";
import { handOver } from "./player.js";

const LIVE = ["queued", "in_progress"];
const PREVIEW = "preview";
const FINAL = "final";
const LIVE_RENDITION = "live";
// The video's clock standing still between two presented frames longer than this is a
// stall (a 16 fps frame: 62 ms).
const STALL_MS = 150;
// How often a start still waiting (or a final not yet safe to swap to) looks again.
const WAIT_TICK_MS = 100;

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// One rendition of a job with a preview, as the page knows it.
function blankRendition(decoder) {
  return {
    decoder,
    status: "queued",       // its variants[...].status, as the server last reported it
    chunksDone: 0,
    chunksTotal: null,
    framesDone: 0,
    fragmentsAppended: 0,
    bytesReceived: 0,
    loading: false,         // its content is being fetched into a <video>
    streamEnded: false,
    ended: false,           // preview_done / final_done (or _error) heard
    error: null,
  };
}

// What the page shows before any job (also the starting point of each session).
export function blankState() {
  return {
    jobId: null,
    status: "idle",         // the job's status, as the server last reported it
    partial: false,         // it failed or was cancelled keeping its video so far
    playsLive: false,       // it plays the job's live rendition (one stream, nothing to switch)
    liveSources: [],        // playing it: the rendition each of its chunks so far is
    playback: null,         // "mse", "mms" (ManagedMediaSource), "src" or "hls" (none)
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
    // A job with a preview. The figures above (fragmentsAppended, bytesReceived,
    // streamEnded) are then those of the rendition in front; chunks and frames the final's.
    rendition: null,        // "preview" / "final": in front; null: a job without a preview
    renditions: null,       // {preview, final}: blankRendition() each, final with `ready`
    finalReady: false,      // final_ready heard (or the job object says so)
    finalReadyAt: null,     // performance.now() then
    finalStopped: false,    // the user stopped the full decode
    switchedAt: null,       // performance.now() of the switch to the final
    timeBefore: null,       // the preview's currentTime just before that switch
    timeAfter: null,        // the final's just after it
    switches: [],           // every swap: {from, to, reason, at, before, after}
    lastMediaTime: null,    // the frame last presented in front (requestVideoFrameCallback)
    backwardSteps: 0,       // presented frames earlier than the one before, seeks aside
    lastFrameAt: null,      // performance.now() of the frame last presented in front
    stalls: [],             // {at, ms, mediaMs, starved, rendition}: the clock stood still over STALL_MS (see #attach)
    // Playing a job still decoding no earlier than it plays stall-free (see the top).
    stallFreeStartS: null,  // the latest stall_free_start_s heard (the final's, with a preview)
    firstFragmentAt: null,  // performance.now() when the front's first fragment was appended
    rateKnownAt: null,      // performance.now() when the server's decode rate was first known
    startedAtStallFreeS: null, // the stall-free start the server said when playback began
    startingInMs: null,     // while the start waits: how long still, as last computed
    startDelayMs: null,     // how long after the first fragment the page started playing
  };
}

export class Session extends EventTarget {
  #abort = new AbortController();
  #events = null;   // the EventSource
  #rate = null;     // {at, frames}: where the decode-speed estimate starts
  #closed = false;
  #previewAbort = null; // the preview's own fetch (ended once the final is in for good)
  #finalAbort = null;   // the final's own fetch (stopped with it)
  #handingOver = false; // a handOver() is under way
  #finalAlone = false;  // a finished preview job: its final plays alone, in front
  #waiting = null;      // {player, into}: a start held back until stall-free
  #starvedAt = null;    // when the video in front last ran out of data ("waiting")
  #waitTimer = null;
  #rateChunks = 0;      // chunks of the job (its final) heard: a rate needs two
  #firstChunkAt = null; // performance.now() when chunk 0 (the final's) was heard

  // `playsElsewhere`: another player (the WebRTC one) has the <video>; this session
  // follows the job's state and events only, and leaves the video alone.
  // `live`: a job with a live rendition plays it (false: its preview, then its final).
  constructor(job, { player, spare = null, clickedAt, playsElsewhere = null, live = true }) {
    super();
    this.job = job;
    this.id = job.id;
    this.player = player; // in front: the job, or its preview
    this.spare = spare;   // behind: a preview's final, until the swap
    this.playsElsewhere = playsElsewhere; // "webrtc", or null: this session plays it
    this.cancelled = false; // the user cancelled: the cut stream that follows is no fault
    this.state = { ...blankState(), jobId: job.id, clickedAt };
    // A running job with a live rendition plays it: one stream, each chunk the final's
    // when it came in time, the preview's otherwise; the server chose its start delay
    // so that it never stalls, so it plays at once and nothing is switched here.
    const spliced = live ? job.variants?.live : null;
    this.playsLive =
      Boolean(spliced && job.urls.live_content) &&
      LIVE.includes(job.status) &&
      LIVE.includes(spliced.status);
    this.state.playsLive = this.playsLive;
    if (job.variants && spare && !this.playsLive) {
      this.state.rendition = PREVIEW;
      this.state.renditions = {
        [PREVIEW]: blankRendition(job.variants.preview.decoder),
        [FINAL]: { ...blankRendition(job.variants.final.decoder), ready: false },
      };
      // Finished already (watched from the list): the final alone, nothing to switch.
      if (job.variants.final.status === "completed") {
        this.state.rendition = FINAL;
        this.#finalAlone = true;
      }
    }
  }

  get cancellable() {
    return !this.#closed && !this.cancelled && LIVE.includes(this.state.status);
  }

  // "Stop full decode" applies: a preview job whose final still runs.
  get finalStoppable() {
    const final = this.state.renditions?.[FINAL];
    return Boolean(final) && this.cancellable && !this.state.finalStopped && !final.ended;
  }

  // The <video> in front (what the buffered bar measures).
  get shownVideo() {
    return this.#front().video;
  }

  #front() {
    return this.spare?.front ? this.spare : this.player;
  }

  // Shows the job and plays it; settles when its content stream has ended. Never
  // rejects: what goes wrong is recorded as the session's error.
  async start() {
    this.#applyJob(this.job);
    if (this.playsElsewhere) {
      this.state.playback = this.playsElsewhere;
      this.#changed();
      this.#followEvents();
      return;
    }
    this.#changed();
    this.player.setFront(true);
    this.spare?.setFront(false);
    this.#attach(this.player);
    this.#followEvents();
    const renditions = this.state.renditions;
    if (renditions === null) {
      const url = this.playsLive ? this.job.urls.live_content : this.job.urls.content;
      await this.#playCaught(url, this.player, this.state, this.#abort.signal, true);
      return;
    }
    if (this.#finalAlone) {
      await this.#playCaught(this.job.urls.content, this.player, renditions[FINAL], this.#abort.signal, true);
      return;
    }
    // This job object may already say the final is ready.
    this.#maybeStartFinal("ready at start");
    this.#previewAbort = new AbortController();
    const signal = AbortSignal.any([this.#abort.signal, this.#previewAbort.signal]);
    await this.#playCaught(this.job.urls.preview_content, this.player, renditions[PREVIEW], signal, true);
  }

  #attach(player) {
    player.video.addEventListener("waiting", () => {
      if (player.front) this.#starvedAt = performance.now();
    });
    player.attach({
      frame: (mediaTime) => {
        if (!player.front) return; // the final behind, seeking
        const state = this.state;
        state.framesShown += 1;
        const previousMediaTime = state.lastMediaTime;
        if (previousMediaTime !== null && mediaTime < previousMediaTime - 1e-3) {
          state.backwardSteps += 1;
        }
        state.lastMediaTime = mediaTime;
        const now = performance.now();
        if (state.lastFrameAt !== null && !player.video.paused) {
          // A stall: the video's clock stood still for over STALL_MS between two
          // presented frames. mediaMs is how far the clock went meanwhile: a busy
          // machine that presents late, or skips frames, lets the clock run on.
          // `starved`: the video ran out of data meanwhile (its decode fell behind).
          const ms = now - state.lastFrameAt;
          const mediaMs = previousMediaTime === null ? 0 : 1000 * (mediaTime - previousMediaTime);
          const starved = this.#starvedAt !== null && this.#starvedAt >= state.lastFrameAt;
          if (ms - mediaMs > STALL_MS) {
            state.stalls.push({ at: now, ms, mediaMs, starved, rendition: state.rendition });
          }
        }
        state.lastFrameAt = now;
        if (state.firstFrameAt === null) this.#firstFrame();
      },
      firstPlaying: () => this.#firstFrame(),
      error: (message) => this.fail(message),
    });
    // A seek by the user is no backward step.
    player.video.onseeking = () => {
      if (player.front && !this.#handingOver) this.state.lastMediaTime = this.state.lastFrameAt = null;
    };
  }

  async #playCaught(url, player, into, signal, autoplay) {
    try {
      await this.#play(url, player, into, signal, autoplay);
    } catch (error) {
      if (error.name !== "AbortError" && !this.cancelled && !this.#stopped(into)) {
        this.fail(error.message);
      }
    }
  }

  // The final's cut or refused stream is no fault once the user stopped it.
  #stopped(into) {
    return this.state.finalStopped && into === this.state.renditions?.[FINAL];
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
    clearTimeout(this.#waitTimer);
    this.#abort.abort();
    this.#events?.close();
    if (this.playsElsewhere) return;
    this.player.reset();
    this.player.setFront(true);
    this.spare?.reset();
    this.spare?.setFront(false);
  }

  // Stops the full decode and keeps the preview: it plays on to its end (handed
  // back to at once if the final was in front). The server answers the DELETE once
  // the final has stopped, at its next chunk; the page does not wait for that.
  async stopFinal() {
    if (!this.finalStoppable) return;
    const state = this.state;
    state.finalStopped = true;
    this.#finalAbort?.abort();
    this.#changed();
    if (state.rendition === FINAL) this.#handBack();
    else if (!this.#handingOver) this.spare.reset(); // a hand-over ends itself (#handOver)
    try {
      this.#applyJob(
        await fetchJson(`/v1/videos/${this.id}?variant=${FINAL}`, { method: "DELETE" }),
      );
    } catch (error) {
      this.fail(error.message);
    }
    this.#changed();
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
    if (this.#closed) return;
    this.#checkStart();
    const state = this.state;
    if (state.renditions) {
      const front = state.renditions[state.rendition];
      state.fragmentsAppended = front.fragmentsAppended;
      state.bytesReceived = front.bytesReceived;
      state.streamEnded = front.streamEnded;
    }
    this.dispatchEvent(new Event("change"));
  }

  #firstFrame() {
    this.state.firstFrameAt = performance.now();
    if (this.state.clickedAt !== null) {
      this.state.timeToFirstFrameMs = this.state.firstFrameAt - this.state.clickedAt;
    }
    this.#changed();
  }

  // ------------------------------------------------------------ playback

  // The HLS playlist of the same rendition as `contentUrl`, or null.
  #playlistOf(contentUrl) {
    const urls = this.job.urls ?? {};
    if (contentUrl === urls.content) return urls.playlist ?? null;
    if (contentUrl === urls.preview_content) return urls.preview_playlist ?? null;
    return null;
  }

  // Plays (autoplay) or loads `contentUrl` into `player`; its figures go to `into`
  // (the state itself, or one of state.renditions).
  async #play(contentUrl, player, into, signal, autoplay) {
    const state = this.state;
    into.loading = true;
    if (!player.hasMediaSource) {
      // No Media Source at all: the browser's own player, of the HLS playlist where it
      // plays HLS (Safari without ManagedMediaSource), else of the MP4 as it grows.
      const playlist = this.#playlistOf(contentUrl);
      const hls = Boolean(playlist) && player.playsHls;
      state.playback = hls ? "hls" : "src";
      const url = hls ? playlist : contentUrl;
      if (autoplay) {
        await player.playUrl(url).catch((error) => this.fail(`playback: ${error.message}`));
      } else {
        player.video.preload = "auto";
        player.video.src = url;
      }
      return;
    }
    const response = await apiFetch(contentUrl, { signal });
    if (!response.ok) throw new Error(await errorMessage(response));
    const segmenter = new Segmenter();
    const reader = response.body.getReader();
    let cut = false;
    // The next segments, [] at the stream's end or cut (`cut` then says so).
    const next = async () => {
      for (;;) {
        let chunk;
        try {
          chunk = await reader.read();
        } catch (error) {
          // A cancelled job's stream is cut by the server; any other cut is a fault
          // whose reason the job object holds.
          cut = true;
          if (!this.cancelled && !this.#closed && !signal.aborted && !this.#stopped(into)) {
            this.fail(await this.#streamCutReason(error));
          }
          return [];
        }
        if (chunk.done || this.#closed || signal.aborted) return [];
        into.bytesReceived += chunk.value.length;
        let segments;
        try {
          segments = segmenter.push(chunk.value);
        } catch (error) {
          this.#abort.abort();
          throw error;
        }
        if (segments.length) return segments;
      }
    };
    const type = response.headers.get("Content-Type");
    state.contentType = type;
    if (!player.canStream(type)) {
      this.#abort.abort();
      throw new Error(`this browser cannot play ${type}`);
    }
    state.playback = player.mediaSourceKind;
    const stream = await player.openStream(type, () => {
      into.fragmentsAppended += 1;
      if (into.fragmentsAppended === 1 && autoplay) this.#startWhenStallFree(player, into);
      this.#changed();
    });
    if (this.#closed || stream === null || signal.aborted) return;
    let segments = await next();
    while (segments.length) {
      for (const segment of segments) stream.append(segment.bytes, segment.media);
      this.#changed();
      segments = await next();
    }
    if (this.#closed || signal.aborted) return;
    if (segmenter.holding && !cut && !this.cancelled && !this.#stopped(into)) {
      this.fail("the stream ended inside an MP4 box");
    }
    into.streamEnded = true;
    stream.end();
    this.#changed();
    this.#unloadPreview(); // the final's whole: the preview behind is needed no more
  }

  // ------------------------------------------------------------ stall-free start

  // The first fragment of `into` is in `player`: play it now (a preview, a finished
  // job) or once the job's stall-free start has passed.
  #startWhenStallFree(player, into) {
    const state = this.state;
    // When it went in: its updateend, or its first frame on screen if the video showed
    // that first (a frame callback may run before the updateend event is dispatched).
    state.firstFragmentAt = Math.min(performance.now(), state.firstFrameAt ?? Infinity);
    this.#waiting = { player, into };
    this.#checkStart();
  }

  // Plays the start waiting, if it is due; else looks again in a while. Run on every
  // change (an event heard, a fragment in) and on its own timer.
  #checkStart() {
    const waiting = this.#waiting;
    if (waiting === null || this.#closed) return;
    const state = this.state;
    clearTimeout(this.#waitTimer);
    const remaining = this.#startRemainingMs(waiting.into);
    if (remaining > 0) {
      state.startingInMs = Number.isFinite(remaining) ? remaining : null;
      this.#waitTimer = setTimeout(() => this.#changed(), Math.min(remaining, WAIT_TICK_MS));
      return;
    }
    this.#waiting = null;
    state.startingInMs = null;
    state.startDelayMs = performance.now() - state.firstFragmentAt;
    state.startedAtStallFreeS = state.stallFreeStartS; // what the start waited for
    state.lastFrameAt = null; // the wait, paused on the first frame, is no stall
    waiting.player.play().catch((error) => this.fail(`playback: ${error.message}`));
  }

  // How long the start of `into` still waits: 0 to play now, Infinity while the
  // server has not yet told (a rate needs two chunks: its value after the first is 0).
  #startRemainingMs(into) {
    const state = this.state;
    const preview = state.renditions?.[PREVIEW];
    if (into === preview || this.playsLive || this.cancelled || into.streamEnded) return 0;
    if (!LIVE.includes(state.status)) return 0;
    if (!this.#rateKnown()) return Infinity;
    return state.firstFragmentAt + state.stallFreeStartS * 1000 - performance.now();
  }

  // When the page first knew the decode's rate (what a start waits for, at the least).
  #noteRate() {
    if (this.state.rateKnownAt === null && this.#rateKnown()) this.state.rateKnownAt = performance.now();
  }

  // Whether stallFreeStartS is the server's prediction from a decode rate.
  #rateKnown() {
    const state = this.state;
    if (state.stallFreeStartS === null) return false;
    const total = state.renditions ? state.renditions[FINAL].chunksTotal : state.chunksTotal;
    return this.#rateChunks >= 2 || (total !== null && this.#rateChunks >= total);
  }

  // A preview's final, ready, plays on stall-free from where the viewer is: it is
  // complete, faster than real time (once caught up, it stays ahead: a stall-free
  // start under a frame is the first chunks' jitter), or the viewer's timeline
  // started at least its stall-free start after the final's first fragment (now -
  // currentTime: when the viewer would have started to be where it is, unpaused).
  #finalStallFree() {
    const final = this.state.renditions?.[FINAL];
    if (!final || final.status === "completed" || final.streamEnded || final.ended) return true;
    if (!this.#rateKnown()) return false;
    const value = this.state.stallFreeStartS;
    if (value * this.job.fps < 1 || this.#firstChunkAt === null) return true; // null: joined late
    const viewerStart = performance.now() - this.player.video.currentTime * 1000;
    return viewerStart - this.#firstChunkAt >= value * 1000;
  }

  // ------------------------------------------------------------ preview, then final

  // Loads the final behind and hands over to it, once: on final_ready, or the
  // final's end when ready never came, or the preview's failure.
  #maybeStartFinal(reason) {
    const renditions = this.state.renditions;
    const final = renditions?.[FINAL];
    if (!final || this.#closed || this.cancelled || this.state.finalStopped || final.loading) return;
    if (this.#finalAlone) return;
    if (final.error !== null) return;
    const due = final.ready || final.status === "completed" || renditions[PREVIEW].error !== null;
    if (!due) return;
    this.#finalAbort = new AbortController();
    const signal = AbortSignal.any([this.#abort.signal, this.#finalAbort.signal]);
    this.#attach(this.spare);
    this.#playCaught(this.job.urls.content, this.spare, final, signal, false);
    this.#handOver(this.player, this.spare, FINAL, reason, () => signal.aborted);
  }

  // Back to the preview (kept behind, still buffered) where the final stands.
  #handBack() {
    this.#handOver(this.spare, this.player, PREVIEW, "final stopped", () => this.#abort.signal.aborted);
  }

  async #handOver(from, to, rendition, reason, stop) {
    // One at a time: a hand-back waits for a hand-over still looking for its moment
    // (which the stop that caused the hand-back ends).
    while (this.#handingOver) await new Promise((resolve) => setTimeout(resolve, 10));
    if (this.#closed || stop()) return;
    this.#handingOver = true;
    let swapped = null;
    try {
      // The final, ready (caught up with the viewer), is swapped to only where it stays ahead.
      let safe = rendition !== FINAL;
      while (!safe && !this.#closed && !stop()) {
        safe = this.#finalStallFree();
        if (!safe) await sleep(WAIT_TICK_MS);
      }
      if (safe) {
        swapped = await handOver(from, to, { frameS: 1 / this.job.fps, stop: () => this.#closed || stop() });
      }
    } finally {
      this.#handingOver = false;
    }
    if (this.#closed) return;
    const state = this.state;
    if (swapped === null) {
      if (rendition === FINAL && state.finalStopped) this.spare.reset();
      return;
    }
    const previous = state.rendition;
    state.rendition = rendition;
    state.switches.push({ from: previous, to: rendition, reason, at: swapped.at, before: swapped.before, after: swapped.after });
    if (rendition === FINAL && state.switchedAt === null) {
      state.switchedAt = swapped.at;
      state.timeBefore = swapped.before;
      state.timeAfter = swapped.after;
    }
    swapped.played.catch((error) => this.fail(`playback: ${error.message}`));
    this.#changed();
    // Stopped in the instant of the swap: back again.
    if (rendition === FINAL && state.finalStopped) this.#handBack();
    this.#unloadPreview();
  }

  // The preview behind is kept until the final can no longer be stopped or fail
  // (a hand-back needs it), then emptied and its fetch ended.
  #unloadPreview() {
    const renditions = this.state.renditions;
    if (this.#finalAlone || this.state.rendition !== FINAL || !renditions[FINAL].streamEnded) return;
    if (renditions[FINAL].status !== "completed" || this.#previewAbort?.signal.aborted) return;
    this.#previewAbort?.abort();
    this.player.reset();
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
    on("length", (event) => {
      state.framesPlanned = event.frames;
      state.seconds = event.frames / this.job.fps;
      state.chunksTotal = event.chunks;
      if (state.renditions) state.renditions[FINAL].chunksTotal = event.chunks;
    });
    on("chunk", (event) => {
      state.status = event.status;
      // Playing the live rendition: its chunks are the stream's; else they are not.
      if ((event.variant === LIVE_RENDITION) !== this.playsLive) return;
      if (this.playsLive) state.liveSources[event.index] = event.source;
      if (event.variant !== PREVIEW) {
        // The job's (its final's) own figures: the start and the swap wait on them.
        if (event.stall_free_start_s !== undefined) state.stallFreeStartS = event.stall_free_start_s;
        this.#rateChunks = Math.max(this.#rateChunks, event.index + 1);
        if (event.index === 0 && this.#firstChunkAt === null) this.#firstChunkAt = performance.now();
        this.#noteRate();
      }
      if (event.variant !== undefined && state.renditions) {
        const rendition = state.renditions[event.variant];
        rendition.status = "in_progress";
        rendition.chunksDone = event.index + 1;
        rendition.chunksTotal = event.total ?? rendition.chunksTotal;
        rendition.framesDone = event.frames_done;
        if (event.variant === PREVIEW) return;
      }
      state.chunksDone = event.index + 1;
      state.chunksTotal = event.total ?? state.chunksTotal;
      state.framesDone = event.frames_done;
      if (this.#rate) {
        const seconds = (performance.now() - this.#rate.at) / 1000;
        state.decodeFps = (event.frames_done - this.#rate.frames) / seconds;
      }
    });
    on("final_ready", () => this.#finalIsReady("final_ready"));
    for (const variant of [PREVIEW, FINAL]) {
      on(`${variant}_done`, () => this.#renditionEnded(variant, null));
      on(`${variant}_error`, (event) => this.#renditionEnded(variant, event.error));
    }
    on("done", (event) => {
      events.close();
      this.#applyJob(event.job);
      this.dispatchEvent(new Event("finished"));
    });
    on("error", (event) => {
      events.close();
      state.status = event.status;
      state.partial = Boolean(event.partial);
      if (!this.#expectedEnd(event.status)) this.fail(event.error.message);
      this.dispatchEvent(new Event("finished"));
    });
  }

  // A job the user cancelled, or whose full decode the user stopped, ends
  // cancelled: no fault of the job's.
  #expectedEnd(status) {
    return this.cancelled || (this.state.finalStopped && status === "cancelled");
  }

  #finalIsReady(reason) {
    const final = this.state.renditions?.[FINAL];
    if (!final || final.ready) return;
    final.ready = true;
    this.state.finalReady = true;
    this.state.finalReadyAt = performance.now();
    this.#maybeStartFinal(reason);
  }

  #renditionEnded(variant, error) {
    const renditions = this.state.renditions;
    if (!renditions) return;
    const rendition = renditions[variant];
    rendition.ended = true;
    if (error === null) {
      rendition.status = "completed";
    } else {
      // The final's "error" when the user stopped it is what was asked for.
      const asked = this.cancelled || (this.state.finalStopped && variant === FINAL);
      rendition.status = asked ? "cancelled" : "failed"; // the event's status is the job's
      rendition.error = error.message;
      if (!asked) this.fail(`the ${variant} rendition failed: ${error.message}`);
    }
    if (variant === FINAL && error !== null && this.state.rendition === FINAL && !this.#finalAlone) {
      this.#handBack();
    }
    // The final's end (ready never came), or the preview's failure: switch now.
    this.#maybeStartFinal(`${variant}_${error === null ? "done" : "error"}`);
    this.#unloadPreview();
  }

  // Takes what a job object says (a `state` event, a `done` event, a POST or DELETE answer).
  #applyJob(job) {
    const state = this.state;
    state.status = job.status;
    state.partial = Boolean(job.partial);
    state.framesPlanned = job.frames;
    state.seconds = job.frames / job.fps; // exact; job.seconds is rounded
    state.chunksDone = job.chunks.done;
    state.chunksTotal = job.chunks.total;
    state.framesDone = job.frames_done;
    if (job.stall_free_start_s !== undefined) state.stallFreeStartS = job.stall_free_start_s;
    // Chunks done before this page listened count toward the rate (no anchor, though).
    const done = job.variants ? job.variants.final.chunks.done : job.chunks.done;
    this.#rateChunks = Math.max(this.#rateChunks, done);
    this.#noteRate();
    const { queued_s: queued, total_s: total } = job.timings;
    if (job.status === "completed" && queued !== null && total > queued) {
      state.decodeFps = job.frames / (total - queued); // the server's own clock
    }
    if (job.error && !this.#expectedEnd(job.status)) this.fail(job.error.message);
    const renditions = state.renditions;
    if (!renditions || !job.variants) return;
    for (const variant of [PREVIEW, FINAL]) {
      const from = job.variants[variant];
      const into = renditions[variant];
      into.status = from.status;
      into.chunksDone = from.chunks.done;
      into.chunksTotal = from.chunks.total;
      into.framesDone = from.frames_done;
      into.error = from.error?.message ?? null;
      if (!LIVE.includes(from.status)) into.ended = true;
    }
    // Joined late: final_ready came before this page listened.
    if (job.variants.final.ready_after_preview_s !== null) this.#finalIsReady("ready on joining");
    this.#maybeStartFinal("final ended on joining");
    this.#unloadPreview();
  }
}
