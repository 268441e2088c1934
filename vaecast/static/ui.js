// The page's DOM: reading its forms, rendering a state into it, the recent-jobs
// table and the API-key form. Holds no state of its own: what it shows comes in as
// arguments (app.js decides when), so rendering twice is always harmless.

const $ = (id) => document.getElementById(id);

// ------------------------------------------------------------ forms

export function fillScenes(scenes) {
  $("scene").replaceChildren(...scenes.map((name) => new Option(name)));
}

export function fillModels(models) {
  for (const select of document.querySelectorAll("select.model")) {
    select.replaceChildren(new Option("server default", ""), ...models.map((m) => new Option(m)));
  }
}

// The preview decoders offered (demo and upload): none, `linear` (it reads any
// model's latents: the server refuses what does not fit) and the served models.
// "" is the server's default (`vaecast serve --preview MODEL=DECODER`): nothing sent.
export function fillPreviews(models) {
  const names = ["linear", ...models.filter((m) => m !== "linear")];
  for (const select of document.querySelectorAll("select.preview")) {
    select.replaceChildren(
      new Option("server default", ""),
      new Option("none", "none"),
      ...names.map((name) => new Option(name)),
    );
  }
}

// The demo form offers only what this server accepts (/healthz `limits`): a frame
// count or size past its limits is disabled, and so is one whose product with the
// other choice is past the demo's pixel budget; a choice made impossible moves to the
// largest one still allowed.
export function applyLimits(limits) {
  const form = document.getElementById("demo-form");
  const frames = form.elements.frames;
  const size = form.elements.size;
  const pixels = (option) => option.value.split("x").map(Number).reduce((a, b) => a * b);
  const fits = (count, area) =>
    count <= limits.max_frames &&
    area <= limits.max_pixels_per_frame &&
    count * area <= limits.max_demo_pixels;
  const update = () => {
    const count = Number(frames.value);
    const area = pixels(size.selectedOptions[0]);
    for (const option of frames.options) option.disabled = !fits(Number(option.value), area);
    for (const option of size.options) option.disabled = !fits(count, pixels(option));
  };
  const settle = (select) => {
    if (!select.selectedOptions[0].disabled) return;
    const allowed = [...select.options].filter((option) => !option.disabled);
    if (allowed.length) allowed[allowed.length - 1].selected = true;
  };
  frames.addEventListener("change", () => {
    update();
    settle(size);
    update();
  });
  size.addEventListener("change", () => {
    update();
    settle(frames);
    update();
  });
  update();
}

// Runs `task(form)` on submit, with the form's button disabled until it settles.
export function onSubmit(id, task) {
  $(id).addEventListener("submit", (event) => {
    event.preventDefault();
    const button = event.target.querySelector("button[type=submit]");
    button.disabled = true;
    task(event.target).finally(() => (button.disabled = false));
  });
}

export function onClick(id, handler) {
  $(id).addEventListener("click", handler);
}

// The demo form as a JSON request body for POST /v1/videos.
export function demoRequest(form) {
  const data = new FormData(form);
  const [width, height] = data.get("size").split("x").map(Number);
  const body = {
    scene: data.get("scene"),
    frames: Number(data.get("frames")),
    width,
    height,
    seed: Number(data.get("seed")),
    fps: Number(data.get("fps")),
    // Produced block by block inside a push session: it plays from the first block.
    live: true,
  };
  if (data.get("model")) body.model = data.get("model");
  // A fast preview first, then the model's final, switched to where the viewer is.
  if (data.get("preview")) body.preview = data.get("preview");
  return { headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) };
}

// The upload form as multipart; an empty model or preview means the server's default.
export function uploadRequest(form) {
  const data = new FormData(form);
  if (!data.get("model")) data.delete("model");
  if (!data.get("preview")) data.delete("preview");
  return { body: data };
}

// Shows the key form; resolves to the key typed in (api.js asks one at a time).
export function askForKey(reason) {
  return new Promise((resolve) => {
    const form = $("key-form");
    $("key-reason").textContent = reason;
    form.hidden = false;
    form.key.focus();
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const key = form.key.value.trim();
      form.reset();
      form.hidden = true;
      resolve(key);
    }, { once: true });
  });
}

// ------------------------------------------------------------ display

// The one message in the error line (null hides it). Not derived from
// state.errors: list and connection failures show here without being a job's error.
export function showError(message) {
  $("error").hidden = !message;
  $("error").textContent = message || "";
}

// `state` is what window.vaecast.state returns; `cancellable` and `finalStoppable`
// enable their buttons; `video` is the <video> in front.
export function render(state, { cancellable, finalStoppable, video }) {
  $("job-id").textContent = state.jobId || "–";
  $("job-id").title = state.jobId || "";
  $("status").textContent = state.status.replace("_", " ") + (state.partial ? " (partial)" : "");
  $("chunks").textContent =
    state.chunksTotal === null ? "–" : `${state.chunksDone} / ${state.chunksTotal} (${state.framesDone} frames)`;
  $("decode-bar").value = state.chunksTotal ? state.chunksDone / state.chunksTotal : 0;
  $("ttff").textContent = state.timeToFirstFrameMs === null ? "–" : `${(state.timeToFirstFrameMs / 1000).toFixed(2)} s`;
  $("decode-fps").textContent = state.decodeFps === null ? "–" : `${state.decodeFps.toFixed(1)} frames/s`;
  // With the <video src> fallback the browser fetches the stream, out of the page's sight.
  $("bytes").textContent = ["mse", "mms"].includes(state.playback) ? formatBytes(state.bytesReceived) : "–";
  renderBuffered(state.seconds, video);
  renderAhead(state, video);
  $("cancel").disabled = !cancellable;
  renderRenditions(state, finalStoppable);
}

// A job with a preview: which rendition is on screen, each one's progress, and the
// "stop full decode" button. Hidden for a job without one.
function renderRenditions(state, finalStoppable) {
  const renditions = state.renditions;
  const badge = $("rendition");
  if (state.playsLive) {
    // One stream: how much of it so far is the final's (the rest the preview's).
    const finals = state.liveSources.filter((source) => source === "final").length;
    badge.hidden = false;
    $("renditions-figure").hidden = true;
    $("stop-final").hidden = true;
    badge.textContent = `live · ${finals} of ${state.liveSources.length} chunks full quality`;
    badge.dataset.rendition = "live";
    return;
  }
  badge.hidden = renditions === null;
  $("renditions-figure").hidden = renditions === null;
  $("stop-final").hidden = renditions === null;
  $("stop-final").disabled = !finalStoppable;
  if (renditions === null) return;
  const { preview, final } = renditions;
  let label;
  let note = "";
  if (state.rendition === "final") {
    label = `final · ${final.decoder}`;
  } else {
    label = `preview · ${preview.decoder}`;
    if (state.finalStopped) note = "full decode stopped";
    else if (final.status === "failed") note = "full decode failed";
    else if (final.ready) note = "switching to the final…";
    else if (!final.ended) note = `final decoding (${final.decoder})`;
  }
  badge.textContent = note ? `${label} — ${note}` : label;
  badge.dataset.rendition = state.rendition;
  badge.classList.toggle("stopped", state.finalStopped);
  const progress = (r) => `${r.chunksDone}${r.chunksTotal === null ? "" : ` / ${r.chunksTotal}`} ${r.status.replace("_", " ")}`;
  $("renditions").textContent = `preview ${progress(preview)} · final ${progress(final)}`;
}

// The buffered bar: how much of the video's `seconds` the <video> in front holds.
export function renderBuffered(seconds, video) {
  const ranges = video.buffered;
  const end = ranges.length ? ranges.end(ranges.length - 1) : 0;
  $("buffer-bar").value = seconds ? Math.min(1, end / seconds) : 0;
}

// How far ahead of the playhead the <video> in front holds a running job
// ("live, 0.4 s ahead"), or, while its start waits to be stall-free, how long still.
export function renderAhead(state, video) {
  let text = "–";
  if (state.startingInMs !== null) {
    text = `starting in ${(state.startingInMs / 1000).toFixed(1)} s`;
  } else if (state.startDelayMs === null && state.firstFragmentAt !== null && video.paused) {
    text = "starting…"; // waiting for the server's first prediction
  } else if (state.status === "in_progress" && state.startDelayMs !== null) {
    const ranges = video.buffered;
    const end = ranges.length ? ranges.end(ranges.length - 1) : 0;
    text = `live, ${Math.max(0, end - video.currentTime).toFixed(1)} s ahead`;
  }
  $("ahead").textContent = text;
}

function formatBytes(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} kB`;
  return `${(n / 1024 / 1024).toFixed(2)} MB`;
}

// ------------------------------------------------------------ recent jobs

// Rows for GET /v1/videos' jobs; `watch(job)` when a row's Watch is clicked.
export function renderJobs(jobs, watch) {
  const rows = jobs.map((job) => {
    const row = document.createElement("tr");
    row.append(
      cell(job.id.replace(/^video_/, "").slice(0, 8), job.id),
      cell(job.status.replace("_", " ")),
      cell(`${job.frames ?? "…"} @ ${job.fps}`), // a push session: length known at its end
      cell(job.width === null ? "…" : `${job.width}×${job.height}`),
    );
    const actions = document.createElement("td");
    if (job.status === "queued" || job.status === "in_progress" || job.status === "completed") {
      const button = document.createElement("button");
      button.type = "button";
      button.textContent = "Watch";
      button.addEventListener("click", () => watch(job));
      actions.append(button);
    }
    if (job.status === "completed") {
      const link = document.createElement("a");
      link.href = job.urls.content;
      link.download = `${job.id}.mp4`;
      link.textContent = "Download";
      actions.append(link);
    }
    if (job.status === "queued" || job.status === "in_progress" || job.status === "completed") {
      // The same fragments as Low-Latency HLS: for Safari, iOS and any HLS player.
      const hls = document.createElement("a");
      hls.href = job.urls.playlist;
      hls.textContent = "HLS";
      hls.title = "LL-HLS playlist (Safari, VLC, ffplay, hls.js)";
      actions.append(hls);
    }
    row.append(actions);
    return row;
  });
  $("jobs").replaceChildren(...rows);
}

function cell(text, title) {
  const td = document.createElement("td");
  td.textContent = text;
  if (title) td.title = title;
  return td;
}
