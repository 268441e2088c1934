// The scrubbing preview under the video: the job's spritesheet
// (`/content?variant=spritesheet`, a grid of up to 16 frames of the video so far).
// Moving along the bar shows the frame nearest that point of the video; letting go
// seeks the video there. The bar shows once the job has a chunk; the sheet is fetched
// only once someone reaches for the bar (pointer or focus), so a page nobody scrubs
// costs the server no still. From then on it grows with the job: it is fetched again
// when the job has new chunks, at most once a second, and once more when it ends; the
// server answers 304 while the sheet has not changed (its ETag).

import { apiFetch } from "./api.js";

const RELOAD_MS = 1000;

// "columns=4; rows=2; tile=160x90; covered=33; frames=1,3,..." -> a layout object.
export function parseLayout(header) {
  const fields = Object.fromEntries(header.split(";").map((part) => part.trim().split("=")));
  const [tileWidth, tileHeight] = fields.tile.split("x").map(Number);
  return {
    columns: Number(fields.columns),
    rows: Number(fields.rows),
    tileWidth,
    tileHeight,
    covered: Number(fields.covered),
    frames: fields.frames.split(",").map(Number),
  };
}

// The tile whose frame is nearest `position` (0..1) of the frames the sheet covers.
export function tileAt(layout, position) {
  const frame = position * (layout.covered - 1);
  let best = 0;
  layout.frames.forEach((each, i) => {
    if (Math.abs(each - frame) < Math.abs(layout.frames[best] - frame)) best = i;
  });
  return best;
}

export class Scrubber {
  #root;
  #bar;
  #tile;
  #job = null;
  #video = () => null;
  #sheetUrl = null; // the object URL of the sheet shown
  #chunksSeen = -1;
  #loading = null;
  #again = false;
  #lastLoad = 0;
  #wanted = false; // someone reached for the bar: keep its sheet fresh

  constructor(root) {
    this.#root = root;
    this.#bar = root.querySelector("input");
    this.#tile = root.querySelector(".tile");
    this.layout = null;
    this.loads = 0;     // sheets fetched (a 304 is not one)
    this.covered = [];  // `covered` of each sheet shown, in order
    this.shown = null;  // the tile shown, while the bar is moved
    this.#bar.addEventListener("input", () => this.#preview());
    this.#bar.addEventListener("change", () => this.#seek());
    this.#bar.addEventListener("pointerleave", () => this.#hideTile());
    for (const reach of ["pointerenter", "focus", "touchstart"]) {
      this.#bar.addEventListener(reach, () => this.#want(), { passive: true });
    }
  }

  #want() {
    if (this.#wanted) return;
    this.#wanted = true;
    if (this.#chunksSeen !== -1) this.#reload(true);
  }

  // A new job shown: forget the last one's sheet. `video()` is the <video> in front.
  show(job, video) {
    this.#job = job;
    this.#video = video;
    this.#chunksSeen = -1;
    this.#wanted = false;
    this.layout = null;
    this.loads = 0;
    this.covered = [];
    this.#root.hidden = true;
    this.#hideTile();
    if (this.#sheetUrl) URL.revokeObjectURL(this.#sheetUrl);
    this.#sheetUrl = null;
  }

  // The job's state changed: fetch the sheet again if it has more chunks, or ended.
  update(state) {
    if (!this.#job?.urls?.spritesheet || state.chunksDone === 0) return;
    const ended = ["completed", "failed", "cancelled"].includes(state.status);
    const mark = ended ? Infinity : state.chunksDone;
    if (mark === this.#chunksSeen) return;
    this.#chunksSeen = mark;
    this.#root.hidden = false;
    if (this.#wanted) this.#reload(ended);
  }

  #reload(now) {
    if (this.#loading) {
      this.#again = true;
      return;
    }
    const wait = now ? 0 : Math.max(0, this.#lastLoad + RELOAD_MS - performance.now());
    const job = this.#job;
    this.#loading = new Promise((resolve) => setTimeout(resolve, wait))
      .then(() => this.#load(job))
      .catch(() => {}) // a job without stills (broken, or gone): no sheet, nothing else
      .finally(() => {
        this.#loading = null;
        this.#lastLoad = performance.now();
        if (this.#again && job === this.#job) {
          this.#again = false;
          this.#reload(this.#chunksSeen === Infinity);
        }
      });
  }

  async #load(job) {
    const response = await apiFetch(job.urls.spritesheet, { cache: "no-cache" });
    if (job !== this.#job || !response.ok) return;
    const layout = parseLayout(response.headers.get("X-Spritesheet"));
    const url = URL.createObjectURL(await response.blob());
    if (job !== this.#job) return URL.revokeObjectURL(url);
    if (this.#sheetUrl) URL.revokeObjectURL(this.#sheetUrl);
    this.#sheetUrl = url;
    this.layout = layout;
    this.loads += 1;
    this.covered.push(layout.covered);
    this.#tile.style.backgroundImage = `url("${url}")`;
    this.#tile.style.width = `${layout.tileWidth}px`;
    this.#tile.style.height = `${layout.tileHeight}px`;
    if (this.shown !== null) this.#preview();
  }

  #preview() {
    const layout = this.layout;
    if (!layout) return;
    const index = tileAt(layout, Number(this.#bar.value));
    const column = index % layout.columns;
    const row = Math.floor(index / layout.columns);
    this.#tile.style.backgroundPosition =
      `-${column * layout.tileWidth}px -${row * layout.tileHeight}px`;
    this.#tile.hidden = false;
    this.shown = index;
  }

  #hideTile() {
    this.#tile.hidden = true;
    this.shown = null;
  }

  #seek() {
    const video = this.#video();
    const layout = this.layout;
    if (!video || !layout || !this.#job) return;
    video.currentTime = (Number(this.#bar.value) * (layout.covered - 1)) / this.#job.fps;
  }

  snapshot() {
    return { layout: this.layout, loads: this.loads, covered: [...this.covered], shown: this.shown };
  }
}
