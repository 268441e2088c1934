"""The edge every request crosses: security, timeouts, bodies and multipart, HTTP errors."""
