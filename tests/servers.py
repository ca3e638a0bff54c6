"""A real OpenAI-compatible HTTP server on loopback, for the openai backend's tests."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ChatServer:
    """A real HTTP server on 127.0.0.1 that answers /v1/chat/completions with `respond`.

    `respond(body, n)` gets the request body and the request's number (1-based) and returns
    (status, payload, headers, delay_s). The server counts requests in flight at once.
    """

    def __init__(self, respond):
        self.respond, self.bodies, self.headers = respond, [], []
        self.lock, self.in_flight, self.max_in_flight = threading.Lock(), 0, 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length))
                with server.lock:
                    server.bodies.append(body)
                    server.headers.append(dict(self.headers))
                    number = len(server.bodies)
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    if self.path != "/v1/chat/completions":
                        status, payload, headers, delay = 404, {"error": {"message": "no such path"}}, {}, 0
                    else:
                        status, payload, headers, delay = server.respond(body, number)
                    time.sleep(delay)
                    data = json.dumps(payload).encode()
                    self.send_response(status)
                    for key, value in {"Content-Type": "application/json", **headers}.items():
                        self.send_header(key, value)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)
                finally:
                    with server.lock:
                        server.in_flight -= 1

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.block_on_close = False
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def chat_reply(text, finish="stop", logprobs=None):
    choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
    if logprobs is not None:
        choice["logprobs"] = {"content": [{"token": "x", "logprob": lp, "top_logprobs": []} for lp in logprobs]}
    return {"id": "c1", "object": "chat.completion", "choices": [choice]}
