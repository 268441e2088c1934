"""The delivery faces over the stream core, one folder each: `progressive` (the MP4
over plain HTTP, growing, then a file), `hls` (LL-HLS) and `whep` (WebRTC). `common`
is what they all do with a request for a rendition. A face is what
`vaecast.server.faces.face` says; the config lists the ones an app serves, `standard` the
ones it serves by default.

The packages import nothing on their own: the CLI reads WHEP's settings
(`whep.settings`) without importing aiohttp, aiortc or torch."""
