// The vaecast preview page's entry module. Starts a decode job, then shows it as a
// Session (session.js): its progressive MP4 plays through Media Source Extensions
// while its server-sent events drive the progress. This file only wires the page:
// which session is shown, the forms, the jobs list, and window.vaecast.
//
//   app.js ── ui.js        DOM: forms, rendering, jobs table, key form
//          ├─ session.js   one job: fetch + EventSource + its state (its live rendition,
//          │               or with ?play=switch its preview, then its final)
//          │    ├─ player.js   <video>: MSE append queue, <video src> fallback, hand-over
//          │    └─ boxes.js    MP4 byte stream -> boxes -> segments (pure)
//          ├─ scrub.js     the job's spritesheet under the video: scrub, then seek
//          ├─ whep.js      ?player=webrtc: the job over WebRTC (WHEP) instead
//          └─ api.js       fetch with the API key (header + cookie), 401 -> ask

import { fetchJson, getJson, restoreApiKey, useKeyPrompt } from "./api.js";
import { Player, Watchdog } from "./player.js";
import { Scrubber } from "./scrub.js";
import { Session, blankState } from "./session.js";
import * as ui from "./ui.js";
import { WhepPlayer } from "./whep.js";

// vaecast/demo/scenes.py SCENE_NAMES (the server has no endpoint listing them).
const SCENES = ["showcase", "shapes", "gradient", "texture", "text", "landscape", "fade", "noise"];
const RECENT_JOBS = 10;

const player = new Player(document.getElementById("video"));
// Behind it: a job's final while its preview plays in front (session.js).
const spare = new Player(document.getElementById("video-final"));
const scrubber = new Scrubber(document.getElementById("scrub"));

// The page's own state. Everything about the job shown is in `session.state`.
const page = {
  ready: false,       // the model and job lists have loaded once
  whep: null,         // ?player=webrtc: the WhepPlayer in front
  session: null,      // the Session shown, or null before the first job
  submitting: null,   // "submitting" / "uploading" while a POST is on its way: the status shown
  requestErrors: [],  // failed POSTs (no job to hold them), until a job is shown
  nudges: [],         // the watchdog's: [stuck at, moved to] of each frozen playhead
};

// A playhead frozen with data ahead of it is moved on (player.js Watchdog).
const watchdog = new Watchdog(shownVideo, (from, to) => {
  page.nudges.push([from, to]);
  render();
});

// What window.vaecast.state returns (a copy) and what the page renders.
function view() {
  const state = page.session ? page.session.state : blankState();
  return {
    ready: page.ready,
    ...state,
    status: page.submitting ?? state.status,
    errors: [...state.errors, ...page.requestErrors],
    nudges: page.nudges.length,
  };
}

function render() {
  const idle = page.submitting === null;
  ui.render(view(), {
    cancellable: idle && Boolean(page.session?.cancellable),
    finalStoppable: idle && Boolean(page.session?.finalStoppable),
    video: shownVideo(),
  });
}

// The <video> in front.
function shownVideo() {
  return page.session?.shownVideo ?? player.video;
}

// Replaces the job shown; the previous one keeps running on the server.
// `playsElsewhere`: "webrtc" where the WHEP player has the <video> (the session then
// shows the job's state only).
function show(job, clickedAt, playsElsewhere = null) {
  page.session?.close();
  if (!playsElsewhere) stopWhep();
  const live = new URLSearchParams(location.search).get("play") !== "switch";
  const session = new Session(job, { player, spare, clickedAt, playsElsewhere, live });
  page.session = session;
  page.requestErrors = [];
  scrubber.show(job, shownVideo);
  session.addEventListener("change", render);
  session.addEventListener("change", () => scrubber.update(session.state));
  session.addEventListener("error", (event) => ui.showError(event.detail));
  session.addEventListener("finished", relist);
  ui.showError(null);
  session.start();
}

// Sends a job request; once the server accepts it, shows the job (which then plays
// on in the background while the form is free again).
async function submit(status, request) {
  const clickedAt = performance.now();
  ui.showError(null);
  page.submitting = status;
  render();
  let job;
  try {
    job = await fetchJson("/v1/videos", { method: "POST", ...request });
  } catch (error) {
    page.submitting = null;
    page.requestErrors.push(error.message);
    ui.showError(error.message);
    render();
    return;
  }
  page.submitting = null;
  relist();
  show(job, clickedAt);
}

async function cancel() {
  const session = page.session;
  if (!session) return;
  await session.cancel(); // its first "change" disables the button at once
  relist();
}

async function stopFinal() {
  const session = page.session;
  if (!session) return;
  await session.stopFinal(); // its first "change" disables the button at once
  relist();
}

async function refreshJobs() {
  const list = await getJson(`/v1/videos?limit=${RECENT_JOBS}`);
  ui.renderJobs(list.data, (job) => show(job, performance.now()));
}

// Refreshes the list in the background; a failure shows but stops nothing.
function relist() {
  refreshJobs().catch((error) => ui.showError(`cannot list the jobs: ${error.message}`));
}

async function loadModels() {
  const { models, limits } = await getJson("/healthz");
  ui.fillModels(models);
  if (limits) ui.applyLimits(limits);
  ui.fillPreviews(models);
}

function setup() {
  useKeyPrompt(ui.askForKey);
  restoreApiKey();
  ui.fillScenes(SCENES);
  ui.onSubmit("demo-form", (form) => submit("submitting", ui.demoRequest(form)));
  ui.onSubmit("upload-form", (form) => submit("uploading", ui.uploadRequest(form)));
  ui.onClick("cancel", cancel);
  ui.onClick("stop-final", stopFinal);
  ui.onClick("refresh", relist);
  for (const type of ["progress", "timeupdate", "waiting", "playing", "ended"]) {
    for (const each of [player, spare]) {
      each.video.addEventListener(type, () => {
        const state = view();
        ui.renderBuffered(state.seconds, shownVideo());
        ui.renderAhead(state, shownVideo());
      });
    }
  }
  // Read by the browser tests (tests/browser): a snapshot, never the live object.
  window.vaecast = Object.freeze({
    get state() {
      return structuredClone(view());
    },
    // ?player=webrtc: what the WebRTC player's getStats says (null without one).
    webrtc: () => page.whep?.stats() ?? Promise.resolve(null),
    // The scrubbing preview: its layout, sheets fetched, what each covered, tile shown.
    scrub: () => scrubber.snapshot(),
  });
  watchdog.start();
  Promise.all([loadModels(), refreshJobs(), watchFromAddress()])
    .then(() => (page.ready = true))
    .catch((error) => ui.showError(`cannot reach the server: ${error.message}`));
  render();
}

// `/?video=ID` (what vaecast.client's page_url gives a producer to share) shows that
// job at once: a push session plays from its first block, a finished job from disk.
// `&player=webrtc` plays it over WebRTC (WHEP) instead: a running or live job only.
async function watchFromAddress() {
  const address = new URLSearchParams(location.search);
  const id = address.get("video");
  if (!id) return;
  const url = `/v1/videos/${encodeURIComponent(id)}`;
  if (address.get("player") === "webrtc") {
    page.whep = new WhepPlayer(player.video);
    page.whep.play(`${url}/whep`).catch((error) => ui.showError(`WebRTC: ${error.message}`));
    show(await getJson(url), performance.now(), "webrtc");
    return;
  }
  show(await getJson(url), performance.now());
}

// A job picked from the list plays through the page's own player: the WebRTC one
// hands the <video> back.
function stopWhep() {
  if (!page.whep) return;
  page.whep.close();
  page.whep = null;
}

setup();
