"""``sim serve``: a page that shows a world live and steers it, and the JSON API it uses.

``app`` is the aiohttp application and its trust boundary, ``views`` what the API
answers (read from the world and its tick logs), ``driver`` the runs started from the
page (the library's ``Runner`` on a thread of its own). The page's files are in
``static/``, shipped with the package. docs/serve.md documents the API.
"""
