"""The stills face: a job's thumbnail and spritesheet (`?variant=thumbnail|spritesheet`
on its `/content`), made from its MP4 as it grows."""
