"""The tick log: its format and reader, the recorder that writes it as a tick runs, replay
with drift reports, rewind and fork, and what ``sim log`` prints."""
