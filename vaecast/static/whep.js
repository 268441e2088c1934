// WHEP playback (draft-ietf-wish-whep) of a running or live job into a <video>.
//
// The page's WebRTC player (`/?video=ID&player=webrtc`): one RTCPeerConnection that
// receives video and audio, its offer POSTed once ICE gathering is done (the server
// takes no trickled candidates), the answer applied. The server sends the job's own
// H.264 where this browser takes it, else VP8; `X-WebRTC-Video` says which.

import { apiFetch, errorMessage } from "./api.js";

const GATHER_TIMEOUT_MS = 2000;

export class WhepPlayer {
  constructor(video) {
    this.video = video;
    this.pc = null;
    this.session = null; // the session's URL, for the DELETE that ends it
    this.codec = null;
  }

  async play(url) {
    const pc = new RTCPeerConnection();
    this.pc = pc;
    pc.addTransceiver("video", { direction: "recvonly" });
    pc.addTransceiver("audio", { direction: "recvonly" });
    const stream = new MediaStream();
    pc.ontrack = (event) => {
      stream.addTrack(event.track);
      this.video.srcObject = stream;
      this.video.play().catch(() => {}); // muted: autoplay is allowed
    };
    await pc.setLocalDescription(await pc.createOffer());
    await gathered(pc);
    const response = await apiFetch(url, {
      method: "POST",
      headers: { "Content-Type": "application/sdp" },
      body: pc.localDescription.sdp,
    });
    if (response.status !== 201) throw new Error(await errorMessage(response));
    this.session = new URL(response.headers.get("Location"), location.href).href;
    this.codec = response.headers.get("X-WebRTC-Video");
    await pc.setRemoteDescription({ type: "answer", sdp: await response.text() });
  }

  // What getStats says of the video received, for the page and its tests.
  async stats() {
    const out = { connection: this.pc?.connectionState ?? "new", codec: this.codec };
    if (!this.pc) return out;
    (await this.pc.getStats()).forEach((report) => {
      if (report.type === "inbound-rtp" && report.kind === "video") {
        Object.assign(out, {
          framesDecoded: report.framesDecoded ?? 0,
          framesDropped: report.framesDropped ?? 0,
          framesReceived: report.framesReceived ?? 0,
          packetsLost: report.packetsLost ?? 0,
          freezeCount: report.freezeCount ?? 0,
        });
      }
    });
    return out;
  }

  async close() {
    const session = this.session;
    this.session = null;
    this.pc?.close();
    this.video.srcObject = null;
    if (session) await apiFetch(session, { method: "DELETE" }).catch(() => {});
  }
}

function gathered(pc) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, GATHER_TIMEOUT_MS);
    pc.addEventListener("icegatheringstatechange", () => {
      if (pc.iceGatheringState === "complete") {
        clearTimeout(timer);
        resolve();
      }
    });
  });
}
