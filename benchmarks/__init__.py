"""Side-by-side measurements of vaecast against the pipelines a user would pick instead.

`python -m benchmarks --help`; results land in `benchmarks/results/`. Modules:
- `server`: the measured server process (vaecast's app plus one handler per baseline);
- `pipelines`: the baselines' synchronous work (decode-then-encode, chunked pre-encode,
  the FFmpeg CLI pipe) and the decode-only / encode-only references;
- `client`: the HTTP client that times each response and checks what it received;
- `arms`, `memory`, `fanout`, `throughput`, `profiling`: the report's sections;
- `report`: JSON, the Markdown table and the PNG timeline.
"""
