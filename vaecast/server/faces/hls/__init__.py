"""The LL-HLS face: `playlist` makes a rendition's playlists from its fragments' facts
(pure), `routes` serves them and the media from its log, `face` is what the app builds."""
