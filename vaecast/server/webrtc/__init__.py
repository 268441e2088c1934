"""WebRTC playback (WHEP) of running and live jobs, from the encode they already have.

`offer` checks a client's SDP offer and picks its video codec; `media` reads a
rendition's fragments once into access units that its viewers share, and runs the
encodes they may need (VP8, Opus) once per job; `tracks` paces those units to each
viewer; `sessions` holds the peer connections and ends each for a reason;
`settings` and `ice_addresses` say where ICE looks. The HTTP face is
`vaecast.server.faces.whep`.
"""
