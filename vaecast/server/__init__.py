"""The HTTP server, in wings:

- `stream`: the stream core. A job (its record, renditions and runner), each rendition
  (its segment log, its fragment index, what the faces attached), the manager that
  admits and runs jobs, retention and the durable store's side. It imports no face.
- `faces`: the delivery faces over that core, one folder each: `progressive` (the MP4,
  growing, then a file), `hls` (LL-HLS) and `whep` (WebRTC); `faces.face` says what a
  face is, and the config lists the faces an app serves.
- `intake`: the producers' wing. Uploads, push sessions and batches, the live demo.
- `api`: the jobs API (create, list, get, delete, events, push blocks), health, metrics
  and the page.
- `edge`: what every request crosses first. Security (Host, Origin, API key), timeouts,
  multipart and body buffering, HTTP errors and ranges, loop-lag watch.
- `contract`: the API's typed models, each route's operation record, and the OpenAPI
  document made from the app's router.

`app` puts them together (and `app.serving` serves it); `config` holds the settings;
`metrics` the Prometheus text.
Nothing here imports `vaecast.cluster`: Ray mode hands the manager its runners.
"""
