"""The producers' wing: what makes jobs from requests. `uploads` reads a POST into a
request (limits, timeouts, forms, demo and push requests), `submit` admits it,
`push` and `push_batch` take a push session's blocks, `live_demo` is the server as
the producer of a demo's push session."""
