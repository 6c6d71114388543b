"""``/v1/responses``: ``routes``, ``protocol`` (wire schemas), ``translate`` (a request as the chat
request it runs as), ``shape`` and ``events`` (chat's answers as responses and their events)."""
