"""An OpenID Connect issuer for the tests, on loopback: a discovery document, a JWKS, and
ID tokens minted with PyJWT (an implementation nobody here wrote).

GET /.well-known/openid-configuration   {issuer, jwks_uri}
GET /jwks                               the current keys (k1; after /rotate, k2 only)
POST /rotate                            the issuer rotates its key: k1 out, k2 in
GET /mint?kid=k1&sub=alice&groups=a,b&aud=drivetrain&exp=600&iss=...&forge=1
        an RS256 token; `exp` seconds from now (negative: expired), `iss` default this
        issuer, `forge=1` (or a `kid` it never had) signed by a key that is not the
        issuer's but names `kid`.

Prints `listening on http://127.0.0.1:PORT` and serves until killed.
"""

import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

KEYS = {kid: rsa.generate_private_key(public_exponent=65537, key_size=2048) for kid in ("k1", "k2")}
FORGER = rsa.generate_private_key(public_exponent=65537, key_size=2048)
STATE = {"published": ["k1"], "jwks_fetches": 0}


def jwk(kid):
    d = json.loads(RSAAlgorithm.to_jwk(KEYS[kid].public_key()))
    d.update({"kid": kid, "use": "sig", "alg": "RS256"})
    return d


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, code, body, kind="application/json"):
        data = body.encode() if isinstance(body, str) else body
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        url = urlparse(self.path)
        base = f"http://{self.server.server_address[0]}:{self.server.server_address[1]}"
        if url.path == "/.well-known/openid-configuration":
            self.answer(200, json.dumps({"issuer": base, "jwks_uri": base + "/jwks"}))
        elif url.path == "/jwks":
            STATE["jwks_fetches"] += 1
            self.answer(200, json.dumps({"keys": [jwk(k) for k in STATE["published"]]}))
        elif url.path == "/stats":
            self.answer(200, json.dumps(STATE))
        elif url.path == "/mint":
            q = {k: v[0] for k, v in parse_qs(url.query).items()}
            kid = q.get("kid", "k1")
            now = int(time.time())
            claims = {
                "iss": q.get("iss", base),
                "sub": q.get("sub", "alice"),
                "aud": q.get("aud", "drivetrain"),
                "iat": now,
                "exp": now + int(q.get("exp", "600")),
                "groups": [g for g in q.get("groups", "").split(",") if g],
            }
            key = FORGER if q.get("forge") or kid not in KEYS else KEYS[kid]
            token = jwt.encode(claims, key, algorithm="RS256", headers={"kid": kid})
            self.answer(200, token, "text/plain")
        else:
            self.answer(404, "{}")

    def do_POST(self):
        if urlparse(self.path).path == "/rotate":
            STATE["published"] = ["k2"]
            self.answer(200, "{}")
        else:
            self.answer(404, "{}")


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
server.serve_forever()
