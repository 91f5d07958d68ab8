"""A webhook receiver that plays ChatGPT for herald's tests: it answers the signed challenge,
checks every POST with the official Standard Webhooks verifier (PyPI `standardwebhooks`), and
prints one JSON line per message on stdout. Its answers are scripted on stdin: a line
`{"status": 503, "times": 2}` makes the next two POSTs get 503 (410, 413, 307 the same way).

Usage: webhook_receiver.py SECRET [SECRET...]   (the first line printed names the port; the
environment's RECEIVER_PORT chooses it)
"""

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

SECRETS = sys.argv[1:]
SCRIPT = []
LOCK = threading.Lock()


def say(**fields):
    with LOCK:
        sys.stdout.write(json.dumps(fields) + "\n")
        sys.stdout.flush()


def verified(body, headers):
    """The secrets whose signature checks out (the verifier also refuses a stale timestamp)."""
    good = []
    for s in SECRETS:
        try:
            Webhook(s).verify(body, headers)
            good.append(s)
        except WebhookVerificationError:
            pass
    return good


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, status, body=b"", headers=()):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        headers = {k.lower(): v for k, v in self.headers.items()}
        good = verified(body, headers)
        msg_id = headers.get("webhook-id")
        sub = headers.get("x-mcp-subscription-id")
        if not good:
            say(event="refused", id=msg_id, sub=sub)
            return self.answer(401)
        with LOCK:
            scripted = None
            if SCRIPT:
                scripted = SCRIPT[0]["status"]
                SCRIPT[0]["times"] -= 1
                if SCRIPT[0]["times"] <= 0:
                    SCRIPT.pop(0)
        msg = json.loads(body)
        signatures = len(headers.get("webhook-signature", "").split(" "))
        if scripted is not None:
            say(event="answered", status=scripted, id=msg_id, sub=sub, body=msg)
            location = [("Location", "http://127.0.0.1:1/elsewhere")] if scripted in (301, 302, 307, 308) else []
            return self.answer(scripted, b"", location)
        say(event="delivered", id=msg_id, sub=sub, body=msg, path=self.path,
            signatures=signatures, secrets=[SECRETS.index(s) for s in good])
        if msg.get("type") == "verification":
            reply = json.dumps({"challenge": msg["challenge"]}).encode()
            return self.answer(200, reply, [("Content-Type", "application/json")])
        return self.answer(204)


def script():
    for line in sys.stdin:
        line = line.strip()
        if line:
            order = json.loads(line)
            with LOCK:
                if order.get("clear"):
                    SCRIPT.clear()
                else:
                    SCRIPT.append(order)
            say(event="scripted")


server = ThreadingHTTPServer(("127.0.0.1", int(os.environ.get("RECEIVER_PORT", "0"))), Handler)
say(event="listening", port=server.server_address[1])
threading.Thread(target=script, daemon=True).start()
server.serve_forever()
