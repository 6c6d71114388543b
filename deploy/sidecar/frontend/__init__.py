"""What keeps the HTTP frontend of a supervised tritonserver whole.

Triton's HTTP frontend hands every ``generate_stream`` response to the event thread of the
request's connection by writing a small command to a non-blocking ``AF_UNIX`` socket pair
(libevhtp's ``evthr_defer``), and ignores a failed write. A thread behind by more commands than
the socket's buffer holds therefore loses responses: streams end short of their last tokens, or
never end (docs/operations/response-keeper.md has the reproduction and the releases affected).

The response keeper (``keeper``), preloaded into a sidecar's tritonserver, makes such a write
wait for room instead: that tritonserver keeps every response on any buffer.
"""
