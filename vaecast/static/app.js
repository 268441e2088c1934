"use strict";
// The vaecast preview page. Starts a decode job, then plays its progressive MP4
// through Media Source Extensions: the body of GET /v1/videos/{id}/content is cut
// at top-level ISO-BMFF box boundaries, and the init segment and each moof+mdat
// go to a SourceBuffer as soon as they arrive, so playback starts after the first
// decoded chunk. Progress comes from the job's server-sent events.

// vaecast/models/scenes.py SCENE_NAMES (the server has no endpoint listing them).
const SCENES = ["showcase", "shapes", "gradient", "texture", "text", "landscape", "fade", "noise"];
const RECENT_JOBS = 10;

const $ = (id) => document.getElementById(id);
const video = $("video");

// What the page knows about the job it shows. window.vaecast.state is a copy.
const state = {
  ready: false,           // the model and job lists have loaded once
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

// The job being shown: replaced as a whole when another one starts, so that
// callbacks of an old job can tell they are stale (`session !== current`).
let current = null;

// ---------------------------------------------------------------- ISO-BMFF

// Cuts a byte stream into complete top-level boxes, however the bytes arrive.
class BoxSplitter {
  constructor() {
    this.parts = [];
    this.length = 0;
  }

  // Adds bytes; returns the boxes completed by them, as [{type, bytes}].
  push(chunk) {
    this.parts.push(chunk);
    this.length += chunk.length;
    const boxes = [];
    for (;;) {
      const size = boxSize(this.peek(16));
      if (size === null || size > this.length) return boxes;
      const bytes = this.take(size);
      boxes.push({ type: String.fromCharCode(...bytes.subarray(4, 8)), bytes });
    }
  }

  // The first `count` bytes (fewer if fewer are held), without consuming them.
  peek(count) {
    return this.copy(Math.min(count, this.length), false);
  }

  take(count) {
    return this.copy(count, true);
  }

  copy(count, consume) {
    const out = new Uint8Array(count);
    let filled = 0;
    let index = 0;
    while (filled < count) {
      const part = this.parts[index];
      const n = Math.min(part.length, count - filled);
      out.set(part.subarray(0, n), filled);
      filled += n;
      if (!consume) {
        index += 1;
      } else if (n === part.length) {
        this.parts.shift();
      } else {
        this.parts[0] = part.subarray(n);
      }
    }
    if (consume) this.length -= count;
    return out;
  }
}

// A box's total size from its first bytes (32-bit size, or size 1 and a 64-bit
// largesize after the type), or null while too few bytes are known.
function boxSize(head) {
  if (head.length < 8) return null;
  const view = new DataView(head.buffer, head.byteOffset, head.length);
  let size = view.getUint32(0);
  if (size === 1) {
    if (head.length < 16) return null;
    const large = view.getBigUint64(8);
    if (large > BigInt(Number.MAX_SAFE_INTEGER)) throw new Error("an MP4 box is too large");
    size = Number(large);
    if (size < 16) throw new Error(`an MP4 box has a bad largesize: ${size}`);
  } else if (size < 8) {
    // 0 ("to the end of the file") never appears in a stream that is still growing.
    throw new Error(`an MP4 box has a bad size: ${size}`);
  }
  return size;
}

function concat(arrays) {
  const out = new Uint8Array(arrays.reduce((n, a) => n + a.length, 0));
  let offset = 0;
  for (const a of arrays) {
    out.set(a, offset);
    offset += a.length;
  }
  return out;
}

// ---------------------------------------------------------------- playback

// Feeds a SourceBuffer one segment at a time (appendBuffer throws while `updating`).
class Appender {
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

function sourceOpened(mediaSource) {
  return new Promise((resolve) => mediaSource.addEventListener("sourceopen", resolve, { once: true }));
}

async function play(session, contentUrl) {
  if (!window.MediaSource) {
    state.playback = "src";
    video.src = contentUrl;
    await video.play().catch((error) => fail(session, `playback: ${error.message}`));
    return;
  }
  const response = await apiFetch(contentUrl, { signal: session.abort.signal });
  if (!response.ok) throw new Error(await errorMessage(response));
  const type = response.headers.get("Content-Type");
  state.contentType = type;
  if (!MediaSource.isTypeSupported(type)) {
    session.abort.abort();
    throw new Error(`this browser cannot play ${type}`);
  }
  state.playback = "mse";
  const mediaSource = new MediaSource();
  video.src = URL.createObjectURL(mediaSource);
  await sourceOpened(mediaSource);
  URL.revokeObjectURL(video.src);
  if (session !== current) return;
  const appender = new Appender(mediaSource, mediaSource.addSourceBuffer(type), () => {
    state.fragmentsAppended += 1;
    if (state.fragmentsAppended === 1) {
      video.play().catch((error) => fail(session, `playback: ${error.message}`));
    }
    render();
  });
  const splitter = new BoxSplitter();
  let pending = [];
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
      if (!session.cancelled && session === current) fail(session, await streamCutReason(session, error));
      break;
    }
    if (chunk.done || session !== current) break;
    state.bytesReceived += chunk.value.length;
    let boxes;
    try {
      boxes = splitter.push(chunk.value);
    } catch (error) {
      session.abort.abort();
      throw error;
    }
    for (const box of boxes) {
      // The init segment ends with moov, a media segment with mdat.
      pending.push(box.bytes);
      if (box.type === "moov" || box.type === "mdat") {
        appender.append(concat(pending), box.type === "mdat");
        pending = [];
      }
    }
    render();
  }
  if (session !== current) return;
  if ((splitter.length || pending.length) && !cut && !session.cancelled) {
    fail(session, "the stream ended inside an MP4 box");
  }
  state.streamEnded = true;
  appender.end();
  render();
}

async function streamCutReason(session, error) {
  try {
    const job = await getJson(`/v1/videos/${session.id}`);
    if (job.error) return job.error.message;
  } catch {
    // Fall through to the network error itself.
  }
  return `the video stream broke off: ${error.message}`;
}

function watchFrames(session) {
  const onFrame = () => {
    if (session !== current) return;
    state.framesShown += 1;
    if (state.firstFrameAt === null) firstFrame();
    video.requestVideoFrameCallback(onFrame);
  };
  if ("requestVideoFrameCallback" in HTMLVideoElement.prototype) {
    video.requestVideoFrameCallback(onFrame);
  } else {
    video.addEventListener("playing", () => session === current && firstFrame(), { once: true });
  }
}

function firstFrame() {
  state.firstFrameAt = performance.now();
  if (state.clickedAt !== null) state.timeToFirstFrameMs = state.firstFrameAt - state.clickedAt;
  render();
}

// ---------------------------------------------------------------- events

function followEvents(session) {
  const events = new EventSource(`/v1/videos/${session.id}/events`);
  session.events = events;
  const on = (type, handle) =>
    events.addEventListener(type, (event) => {
      // EventSource fires its own data-less "error" when the connection drops
      // (it reconnects by itself); only the server's events carry data.
      if (session !== current || event.data === undefined) return;
      handle(JSON.parse(event.data));
      render();
    });
  on("state", (job) => {
    applyJob(job);
    if (job.status === "in_progress") session.rate = { at: performance.now(), frames: job.frames_done };
  });
  on("queued", (event) => (state.status = event.status));
  on("started", (event) => {
    state.status = event.status;
    session.rate = { at: performance.now(), frames: 0 };
  });
  on("chunk", (event) => {
    state.status = event.status;
    state.chunksDone = event.index + 1;
    state.chunksTotal = event.total;
    state.framesDone = event.frames_done;
    if (session.rate) {
      const seconds = (performance.now() - session.rate.at) / 1000;
      state.decodeFps = (event.frames_done - session.rate.frames) / seconds;
    }
  });
  on("done", (event) => {
    events.close();
    applyJob(event.job);
    relist();
  });
  on("error", (event) => {
    events.close();
    state.status = event.status;
    if (!session.cancelled) fail(session, event.error.message);
    relist();
  });
}

// Takes what a job object says (a `state` event, a `done` event, a POST answer).
function applyJob(job) {
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
  if (job.error && current && !current.cancelled) fail(current, job.error.message);
}

// ---------------------------------------------------------------- jobs

async function show(job, clickedAt) {
  stop();
  const session = { id: job.id, abort: new AbortController(), events: null, rate: null, cancelled: false };
  current = session;
  Object.assign(state, {
    jobId: job.id, playback: null, contentType: null, clickedAt, firstFrameAt: null,
    timeToFirstFrameMs: null, decodeFps: null, bytesReceived: 0, fragmentsAppended: 0,
    framesShown: 0, streamEnded: false, errors: [],
  });
  showError(null);
  applyJob(job);
  render();
  watchFrames(session);
  followEvents(session);
  try {
    await play(session, job.urls.content);
  } catch (error) {
    if (error.name !== "AbortError" && !session.cancelled) fail(session, error.message);
  }
}

function stop() {
  if (!current) return;
  current.abort.abort();
  if (current.events) current.events.close();
  current = null;
  video.removeAttribute("src");
  video.load();
}

// Sends a job request; once the server accepts it, shows the job (which then plays
// on in the background while the form is free again).
async function submit(status, request) {
  const clickedAt = performance.now();
  showError(null);
  state.status = status;
  render();
  let job;
  try {
    job = await fetchJson("/v1/videos", { method: "POST", ...request });
  } catch (error) {
    state.status = "idle";
    state.errors.push(error.message);
    showError(error.message);
    render();
    return;
  }
  relist();
  show(job, clickedAt);
}

async function cancel() {
  if (!current) return;
  const session = current;
  session.cancelled = true;
  $("cancel").disabled = true;
  try {
    applyJob(await fetchJson(`/v1/videos/${session.id}`, { method: "DELETE" }));
  } catch (error) {
    fail(session, error.message);
  }
  render();
  relist();
}

async function refreshJobs() {
  const list = await getJson(`/v1/videos?limit=${RECENT_JOBS}`);
  const rows = list.data.map((job) => {
    const row = document.createElement("tr");
    row.append(
      cell(job.id.replace(/^video_/, "").slice(0, 8), job.id),
      cell(job.status.replace("_", " ")),
      cell(`${job.frames} @ ${job.fps}`),
      cell(`${job.width}×${job.height}`),
    );
    const actions = document.createElement("td");
    if (job.status === "queued" || job.status === "in_progress" || job.status === "completed") {
      const watch = document.createElement("button");
      watch.type = "button";
      watch.textContent = "Watch";
      watch.addEventListener("click", () => show(job, performance.now()));
      actions.append(watch);
    }
    if (job.status === "completed") {
      const link = document.createElement("a");
      link.href = job.urls.content;
      link.download = `${job.id}.mp4`;
      link.textContent = "Download";
      actions.append(link);
    }
    row.append(actions);
    return row;
  });
  $("jobs").replaceChildren(...rows);
}

// Refreshes the list in the background; a failure shows but stops nothing.
function relist() {
  refreshJobs().catch((error) => showError(`cannot list the jobs: ${error.message}`));
}

function cell(text, title) {
  const td = document.createElement("td");
  td.textContent = text;
  if (title) td.title = title;
  return td;
}

// ---------------------------------------------------------------- API key

// A server started with --api-key answers 401 to /v1 without it. The page then asks
// for the key once, keeps it in localStorage, and sends it as "Authorization: Bearer"
// with fetch(); EventSource, <video src> and download links cannot send a header, so
// the key also goes into the cookie vaecast_api_key, SameSite=Strict: the browser
// attaches it only to requests this site's own pages start (the server's docstring,
// vaecast/server/security.py, says why that is safe).
const KEY_STORAGE = "vaecast_api_key";
const KEY_COOKIE = "vaecast_api_key";
let apiKey = localStorage.getItem(KEY_STORAGE);
let keyAsked = null; // the one pending question, shared by every request that got 401

function keepApiKey(key) {
  apiKey = key;
  localStorage.setItem(KEY_STORAGE, key);
  document.cookie = `${KEY_COOKIE}=${encodeURIComponent(key)}; SameSite=Strict; Path=/`;
}

// fetch() with the key; on 401 asks the user for it and tries again.
async function apiFetch(url, options = {}) {
  for (;;) {
    const sent = apiKey;
    const headers = new Headers(options.headers);
    if (sent) headers.set("Authorization", `Bearer ${sent}`);
    const response = await fetch(url, { ...options, headers });
    if (response.status !== 401) return response;
    await response.body?.cancel();
    // A key typed in while this request was on its way: try that one first.
    if (apiKey === sent) {
      await askForKey(sent ? "That key was not accepted." : "This server needs an API key.");
    }
  }
}

function askForKey(reason) {
  keyAsked ??= new Promise((resolve) => {
    const form = $("key-form");
    $("key-reason").textContent = reason;
    form.hidden = false;
    form.key.focus();
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      keepApiKey(form.key.value.trim());
      form.reset();
      form.hidden = true;
      keyAsked = null;
      resolve();
    }, { once: true });
  });
  return keyAsked;
}

// ---------------------------------------------------------------- HTTP

async function fetchJson(url, options) {
  const response = await apiFetch(url, options);
  if (!response.ok) throw new Error(await errorMessage(response));
  return response.json();
}

const getJson = (url) => fetchJson(url);

// The server's {"error": {"type", "message"}}, or the HTTP status when there is none.
async function errorMessage(response) {
  try {
    return (await response.json()).error.message;
  } catch {
    return `${response.status} ${response.statusText}`;
  }
}

// ---------------------------------------------------------------- display

function fail(session, message) {
  if (session !== current) return;
  // A failed job reports itself twice: as an `error` event and as a cut stream.
  if (state.errors.includes(message)) return;
  state.errors.push(message);
  showError(message);
  render();
}

function showError(message) {
  $("error").hidden = !message;
  $("error").textContent = message || "";
}

function render() {
  $("job-id").textContent = state.jobId || "–";
  $("job-id").title = state.jobId || "";
  $("status").textContent = state.status.replace("_", " ");
  $("chunks").textContent =
    state.chunksTotal === null ? "–" : `${state.chunksDone} / ${state.chunksTotal} (${state.framesDone} frames)`;
  $("decode-bar").value = state.chunksTotal ? state.chunksDone / state.chunksTotal : 0;
  $("ttff").textContent = state.timeToFirstFrameMs === null ? "–" : `${(state.timeToFirstFrameMs / 1000).toFixed(2)} s`;
  $("decode-fps").textContent = state.decodeFps === null ? "–" : `${state.decodeFps.toFixed(1)} frames/s`;
  // With the <video src> fallback the browser fetches the stream, out of the page's sight.
  $("bytes").textContent = state.playback === "mse" ? formatBytes(state.bytesReceived) : "–";
  renderBuffered();
  $("cancel").disabled = !current || current.cancelled || !["queued", "in_progress"].includes(state.status);
}

function renderBuffered() {
  const ranges = video.buffered;
  const end = ranges.length ? ranges.end(ranges.length - 1) : 0;
  $("buffer-bar").value = state.seconds ? Math.min(1, end / state.seconds) : 0;
}

function formatBytes(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} kB`;
  return `${(n / 1024 / 1024).toFixed(2)} MB`;
}

// ---------------------------------------------------------------- setup

function demoRequest(form) {
  const data = new FormData(form);
  const [width, height] = data.get("size").split("x").map(Number);
  const body = {
    scene: data.get("scene"),
    frames: Number(data.get("frames")),
    width,
    height,
    seed: Number(data.get("seed")),
    fps: Number(data.get("fps")),
  };
  if (data.get("model")) body.model = data.get("model");
  return { headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) };
}

function uploadRequest(form) {
  const data = new FormData(form);
  if (!data.get("model")) data.delete("model");
  return { body: data };
}

async function loadModels() {
  const health = await getJson("/healthz");
  for (const select of document.querySelectorAll("select.model")) {
    select.replaceChildren(new Option("server default", ""), ...health.models.map((m) => new Option(m)));
  }
}

function busy(form, task) {
  const button = form.querySelector("button[type=submit]");
  button.disabled = true;
  task.finally(() => (button.disabled = false));
}

function setup() {
  if (apiKey) keepApiKey(apiKey); // the cookie may have gone with the browser session
  $("scene").replaceChildren(...SCENES.map((name) => new Option(name)));
  $("demo-form").addEventListener("submit", (event) => {
    event.preventDefault();
    busy(event.target, submit("submitting", demoRequest(event.target)));
  });
  $("upload-form").addEventListener("submit", (event) => {
    event.preventDefault();
    busy(event.target, submit("uploading", uploadRequest(event.target)));
  });
  $("cancel").addEventListener("click", cancel);
  $("refresh").addEventListener("click", relist);
  for (const type of ["progress", "timeupdate", "waiting", "playing", "ended"]) {
    video.addEventListener(type, renderBuffered);
  }
  video.addEventListener("error", () => current && fail(current, `video error: ${video.error.message}`));
  window.vaecast = Object.freeze({
    get state() {
      return structuredClone(state);
    },
  });
  Promise.all([loadModels(), refreshJobs()])
    .then(() => (state.ready = true))
    .catch((error) => showError(`cannot reach the server: ${error.message}`));
  render();
}

setup();
