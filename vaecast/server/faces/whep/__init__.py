"""The WHEP face: WebRTC playback of running and live jobs, from the encode they
already have.

`offer` checks a client's SDP offer and picks its video codec; `media` reads a
rendition's fragments once into access units that its viewers share, and runs the
encodes they may need (VP8, Opus) once per job; `tracks` paces those units to each
viewer; `sessions` holds the viewers' sessions and ends each for a reason, while
their peer connections live in a process of their own (`peer_process` starts it and
talks to it over `peer_wire`; `peer_host` is its main); `settings` and
`ice_addresses` say where ICE looks. `routes` is the HTTP face, `face` what the app
builds.
"""
