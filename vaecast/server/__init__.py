"""The HTTP server, in three wings:

- `stream`: the stream core. A job (its record, fragments, broadcast and runner), the
  manager that admits and runs jobs, the segment log, the fan-out to viewers, retention.
- `faces`: the protocol faces over that core. Content (live and finished MP4, Range),
  the jobs API and events, HLS, push sessions, uploads, the demo page.
- `edge`: what every request crosses first. Security (Host, Origin, API key), timeouts,
  multipart and body buffering, HTTP errors and ranges, loop-lag watch.

`app` puts them together; `config` holds the settings; `metrics` the Prometheus text.
Nothing here imports `vaecast.cluster`: Ray mode hands the manager its runners.
"""
