"""Tests of vaecast.codecs."""
