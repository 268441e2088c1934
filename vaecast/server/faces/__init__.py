"""The protocol faces over the stream core: content, the jobs API and events, HLS,
push sessions, uploads and the page."""
