"""An OAuth 2.1 authorization server for herald's client tests, issuing access tokens as JWTs
signed by a JOSE library no one here wrote (PyJWT, with `cryptography` for the key), so that
herald's own resource server (`[[issuer]]`) verifies what herald's client obtained.

It approves every authorization request at once (the test's "browser" follows its redirect),
checks PKCE (S256), the redirect URI and the client, and serves: RFC 8414 metadata
(with `authorization_response_iss_parameter_supported`), its JWKS, dynamic registration,
the authorization code, refresh, and client credentials for the pre-registered client
`edge` / `edge-secret` (client_secret_basic).

Usage: oauth_server.py   (the first line printed is {"port": N, "issuer": URL})

Orders on stdin, one JSON line each, answered with one JSON line:
  {"ttl": N}        -> {"ttl": N}   access tokens issued from now on live N seconds
  {"issued": true}  -> {"grants": {TYPE: COUNT}, "tokens": [every access and refresh token]}
  {"fail_next": 503 or 400} -> the next token request answers 503, or 400 invalid_grant
  {"hold_next": true} -> the next refresh is made (its refresh token retired, the new one
                         issued) and its answer held back until {"release": true}
  {"wait_held": true} -> {"held": true} once that refresh is held
  {"release": true}   -> the held answer goes out
"""

import base64
import hashlib
import json
import secrets
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode, urlparse

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

LOCK = threading.Lock()
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
ISSUER = None
TTL = 3600
CLIENTS = {"edge": "edge-secret"}  # id -> secret (None: a public client)
CODES = {}  # code -> the authorization request
REFRESH = {}  # refresh token -> (client id, sub, scope, resource)
GRANTS = {}
TOKENS = []
FAIL_NEXT = []  # statuses the next token requests answer with instead


def b64url(raw):
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, status, doc, headers=()):
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def form(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n).decode()
        if self.headers.get("Content-Type", "").startswith("application/json"):
            return json.loads(raw or "{}")
        return {k: v[0] for k, v in parse_qs(raw).items()}

    def do_GET(self):
        url = urlparse(self.path)
        if url.path == "/.well-known/oauth-authorization-server":
            return self.answer(
                200,
                {
                    "issuer": ISSUER,
                    "jwks_uri": ISSUER + "/jwks",
                    "authorization_endpoint": ISSUER + "/authorize",
                    "token_endpoint": ISSUER + "/token",
                    "registration_endpoint": ISSUER + "/register",
                    "response_types_supported": ["code"],
                    "grant_types_supported": ["authorization_code", "refresh_token", "client_credentials"],
                    "code_challenge_methods_supported": ["S256"],
                    "token_endpoint_auth_methods_supported": ["none", "client_secret_basic"],
                    "scopes_supported": ["herald:*", "offline_access"],
                    "authorization_response_iss_parameter_supported": True,
                },
            )
        if url.path == "/jwks":
            jwk = json.loads(RSAAlgorithm.to_jwk(KEY.public_key()))
            jwk.update({"kid": "k1", "use": "sig", "alg": "RS256"})
            return self.answer(200, {"keys": [jwk]})
        if url.path == "/authorize":
            q = {k: v[0] for k, v in parse_qs(url.query).items()}
            if q.get("client_id") not in CLIENTS or q.get("code_challenge_method") != "S256":
                return self.answer(400, {"error": "invalid_request"})
            code = secrets.token_urlsafe(16)
            with LOCK:
                CODES[code] = q
            back = q["redirect_uri"] + "?" + urlencode({"code": code, "state": q.get("state", ""), "iss": ISSUER})
            self.send_response(302)
            self.send_header("Location", back)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        return self.answer(404, {"error": "not_found"})

    def client(self, f):
        """The authenticated client id, or None."""
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Basic "):
            cid, _, secret = base64.b64decode(auth[6:]).decode().partition(":")
            return cid if CLIENTS.get(cid) == secret else None
        cid = f.get("client_id")
        return cid if cid in CLIENTS and CLIENTS[cid] is None else None

    def do_POST(self):
        url = urlparse(self.path)
        f = self.form()
        if url.path == "/register":
            cid = "dyn-" + secrets.token_hex(4)
            with LOCK:
                CLIENTS[cid] = None
            return self.answer(201, {"client_id": cid, "token_endpoint_auth_method": "none",
                                     "redirect_uris": f.get("redirect_uris", [])})
        if url.path != "/token":
            return self.answer(404, {"error": "not_found"})
        with LOCK:
            fail = FAIL_NEXT.pop(0) if FAIL_NEXT else None
        if fail == 503:
            return self.answer(503, {})
        if fail == 400:
            return self.answer(400, {"error": "invalid_grant"})
        cid = self.client(f)
        if cid is None:
            return self.answer(401, {"error": "invalid_client"})
        grant = f.get("grant_type")
        with LOCK:
            GRANTS[grant] = GRANTS.get(grant, 0) + 1
            if grant == "authorization_code":
                req = CODES.pop(f.get("code", ""), None)
                if req is None or req["client_id"] != cid or req["redirect_uri"] != f.get("redirect_uri"):
                    return self.answer(400, {"error": "invalid_grant"})
                want = b64url(hashlib.sha256(f.get("code_verifier", "").encode()).digest())
                if want != req["code_challenge"] or req.get("resource") != f.get("resource"):
                    return self.answer(400, {"error": "invalid_grant"})
                sub, scope, resource = "person-1", req.get("scope", ""), f["resource"]
            elif grant == "refresh_token":
                held = REFRESH.pop(f.get("refresh_token", ""), None)
                if held is None or held[0] != cid:
                    return self.answer(400, {"error": "invalid_grant"})
                _, sub, scope, resource = held
            elif grant == "client_credentials":
                sub, scope, resource = cid, f.get("scope", ""), f.get("resource", "")
            else:
                return self.answer(400, {"error": "unsupported_grant_type"})
            now = int(time.time())
            claims = {"iss": ISSUER, "aud": resource, "sub": sub, "client_id": cid,
                      "scope": " ".join(s for s in scope.split() if s != "offline_access"),
                      "iat": now, "exp": now + TTL}
            access = jwt.encode(claims, KEY, algorithm="RS256", headers={"kid": "k1"})
            doc = {"access_token": access, "token_type": "Bearer", "expires_in": TTL, "scope": scope}
            TOKENS.append(access)
            if grant != "client_credentials":
                rt = secrets.token_urlsafe(24)
                REFRESH[rt] = (cid, sub, scope, resource)
                TOKENS.append(rt)
                doc["refresh_token"] = rt
        if grant == "refresh_token" and HOLD["armed"]:
            HOLD["armed"] = False
            HOLD["held"].set()
            HOLD["release"].wait(60)
        return self.answer(200, doc)


HOLD = {"armed": False, "held": threading.Event(), "release": threading.Event()}


def handle(order):
    global TTL
    if "ttl" in order:
        TTL = int(order["ttl"])
        return {"ttl": TTL}
    if "fail_next" in order:
        with LOCK:
            FAIL_NEXT.append(int(order["fail_next"]))
        return {"fail_next": FAIL_NEXT}
    if "hold_next" in order:
        HOLD["held"].clear()
        HOLD["release"].clear()
        HOLD["armed"] = True
        return {"armed": True}
    if "wait_held" in order:
        return {"held": HOLD["held"].wait(60)}
    if "release" in order:
        HOLD["release"].set()
        return {"released": True}
    if "issued" in order:
        with LOCK:
            return {"grants": dict(GRANTS), "tokens": list(TOKENS)}
    return {"error": "unknown order"}


def main():
    global ISSUER
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port = server.server_address[1]
    ISSUER = f"http://127.0.0.1:{port}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(json.dumps({"port": port, "issuer": ISSUER}), flush=True)
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            out = handle(json.loads(line))
        except Exception as e:  # the test reads the error
            out = {"error": repr(e)}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
