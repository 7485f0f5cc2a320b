"""A CloudEvents receiver for the notification tests, validating every request with the
`cloudevents` SDK (its HTTP binding parses the structured JSON and refuses an event that
lacks a required attribute or is not CloudEvents 1.0) and checking the HMAC signature.

    receiver.py PORT SECRET LOG [FAIL_FIRST]

Each valid event is appended to LOG as a JSON line {id, type, subject, path}; a Slack-style
body (`{"text": ...}`, on /slack) as {slack: text}. With FAIL_FIRST=n, the first n
deliveries of each event id are answered 503 (not logged), so retries are exercised.
Invalid requests are answered 400 and logged as {invalid: why}.
"""

import hashlib
import hmac
import json
import sys
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cloudevents.v1.http import from_http

port, secret, log = int(sys.argv[1]), sys.argv[2].encode(), sys.argv[3]
fail_first = int(sys.argv[4]) if len(sys.argv) > 4 else 0
tries = Counter()


def record(entry):
    with open(log, "a") as f:
        f.write(json.dumps(entry) + "\n")


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, status):
        self.send_response(status)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.path == "/slack":
            record({"slack": json.loads(body)["text"]})
            return self.answer(200)
        want = "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(self.headers.get("x-drivetrain-signature", ""), want):
            record({"invalid": "bad signature"})
            return self.answer(400)
        try:
            event = from_http(dict(self.headers), body)
        except Exception as e:  # the SDK's validation errors
            record({"invalid": f"{type(e).__name__}: {e}"})
            return self.answer(400)
        structured = self.headers.get("content-type", "").startswith("application/cloudevents+json")
        if event["specversion"] != "1.0" or not structured:
            record({"invalid": "not structured CloudEvents 1.0"})
            return self.answer(400)
        tries[event["id"]] += 1
        if tries[event["id"]] <= fail_first:
            return self.answer(503)
        record({"id": event["id"], "type": event["type"], "subject": event["subject"], "path": self.path})
        self.answer(200)


ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
