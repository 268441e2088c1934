// Top-level ISO-BMFF boxes of a progressive MP4, cut out of a byte stream however
// it arrives. Pure: bytes in, whole boxes (and SourceBuffer segments) out; no DOM,
// no network, so a test can drive it alone (tests/browser imports this module).

// Cuts a byte stream into complete top-level boxes.
export class BoxSplitter {
  constructor() {
    this.parts = [];
    this.length = 0; // bytes held that belong to no complete box yet
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

  // Copies across the held parts, so a box may span any number of network chunks.
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
export function boxSize(head) {
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

export function concat(arrays) {
  const out = new Uint8Array(arrays.reduce((n, a) => n + a.length, 0));
  let offset = 0;
  for (const a of arrays) {
    out.set(a, offset);
    offset += a.length;
  }
  return out;
}

// Groups whole boxes into what a SourceBuffer takes in one append: the init
// segment (ftyp ... moov) and each media segment (moof ... mdat). Appending a
// moof without its mdat would make Chromium wait or fail, hence the grouping.
export class Segmenter {
  #boxes = new BoxSplitter();
  #pending = []; // whole boxes of a segment whose last box has not arrived

  // Adds bytes; returns the segments completed by them, as [{bytes, media}].
  push(chunk) {
    const segments = [];
    for (const box of this.#boxes.push(chunk)) {
      this.#pending.push(box.bytes);
      if (box.type === "moov" || box.type === "mdat") {
        segments.push({ bytes: concat(this.#pending), media: box.type === "mdat" });
        this.#pending = [];
      }
    }
    return segments;
  }

  // True while bytes are held that no complete segment has taken yet.
  get holding() {
    return this.#boxes.length > 0 || this.#pending.length > 0;
  }
}
