"""The lobby page of ``echo-lobby --web``: a small static site (plain HTML, CSS and the
JavaScript client of clients/js as an ES module; no build step) served beside the WebSocket
door, on the same address and port, so that the page's own origin is the door.

`pages` answers a request for one of the page's files (pure); `files` reads them from the
package (``static/``; ``static/lobby.js`` is clients/js/lobby.js itself, a link in the
repository and a copy in a built wheel); the door's listener serves them
(`echo.lobby.webpage.serve`).
"""
