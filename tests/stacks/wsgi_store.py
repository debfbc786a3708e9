"""An inventory service on the standard library's WSGI server, for the bypass catalogue
(tests/tests/proxy_http/stacks.rs). It routes PATH_INFO, which every WSGI server gives
percent-decoded (PEP 3333), as Flask, Django and gunicorn apps see it: PUT /inventory/<sku>
stores the body under the sku, GET answers it (404 when there is none). Prints its port, then
serves until killed."""

import re
import sys
from wsgiref.simple_server import WSGIRequestHandler, make_server

ROUTE = re.compile(r"^/inventory/([^/]+)/?$")
store = {}


def app(environ, start_response):
    m = ROUTE.match(environ["PATH_INFO"])
    if not m:
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"no such route\n"]
    sku = m.group(1)
    if environ["REQUEST_METHOD"] == "PUT":
        length = int(environ.get("CONTENT_LENGTH") or 0)
        store[sku] = environ["wsgi.input"].read(length)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"stored\n"]
    if sku not in store:
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"none\n"]
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [store[sku]]


class Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass


server = make_server("127.0.0.1", 0, app, handler_class=Quiet)
print(server.server_port, flush=True)
server.serve_forever()
