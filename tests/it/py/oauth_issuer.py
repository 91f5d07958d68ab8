"""An identity provider for herald's OAuth tests, on a JOSE library no one here wrote (PyJWT,
with `cryptography` for the keys): it serves its RFC 8414 metadata and its JWKS over HTTP, and
mints access tokens on request.

Usage: oauth_issuer.py   (the first line printed is {"port": N, "issuer": URL})

Each line on stdin is an order, answered with one JSON line on stdout:
  {"mint": CLAIMS, "kid": "rsa1", "alg": "RS256"}  -> {"token": T}  (iss defaults to this issuer)
  {"none": CLAIMS}                                 -> {"token": T}  (alg none, unsigned)
  {"confused": CLAIMS}                             -> {"token": T}  (HS256 keyed with the RSA
                                                       public key's PEM: the classic confusion)
  {"rotate": "rsa2", "drop": ["rsa1"]}             -> {"keys": [...]}  (a new RSA key listed,
                                                       the dropped ones no longer listed)
  {"fetches": true}                                -> {"fetches": N}  (JWKS GETs so far)
"""

import base64
import hashlib
import hmac
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

LOCK = threading.Lock()
KEYS = {}  # kid -> (private key, alg family)
LISTED = []  # kids in the JWKS
FETCHES = 0
ISSUER = None


def add_rsa(kid):
    KEYS[kid] = (rsa.generate_private_key(public_exponent=65537, key_size=2048), "RSA")
    LISTED.append(kid)


def jwks():
    out = []
    for kid in LISTED:
        key, family = KEYS[kid]
        pub = key.public_key()
        if family == "RSA":
            jwk = json.loads(RSAAlgorithm.to_jwk(pub))
        elif family == "EC":
            jwk = json.loads(ECAlgorithm.to_jwk(pub))
        else:
            jwk = json.loads(OKPAlgorithm.to_jwk(pub))
        jwk["kid"] = kid
        jwk["use"] = "sig"
        out.append(jwk)
    return {"keys": out}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, status, doc):
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        global FETCHES
        if self.path == "/.well-known/oauth-authorization-server":
            return self.answer(
                200,
                {
                    "issuer": ISSUER,
                    "jwks_uri": ISSUER + "/jwks",
                    "authorization_endpoint": ISSUER + "/authorize",
                    "token_endpoint": ISSUER + "/token",
                    "response_types_supported": ["code"],
                },
            )
        if self.path == "/jwks":
            with LOCK:
                FETCHES += 1
                doc = jwks()
            return self.answer(200, doc)
        return self.answer(404, {"error": "not_found"})


def b64(raw):
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def claims_of(order_claims):
    c = {"iss": ISSUER, "iat": int(time.time())}
    c.update(order_claims)
    return c


def handle(order):
    if "mint" in order:
        kid = order.get("kid", "rsa1")
        key, _ = KEYS[kid]
        token = jwt.encode(
            claims_of(order["mint"]), key, algorithm=order.get("alg", "RS256"), headers={"kid": kid}
        )
        return {"token": token}
    if "none" in order:
        return {"token": jwt.encode(claims_of(order["none"]), None, algorithm="none", headers={"kid": "rsa1"})}
    if "confused" in order:
        pem = KEYS["rsa1"][0].public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        header = b64(json.dumps({"alg": "HS256", "kid": "rsa1", "typ": "JWT"}).encode())
        body = b64(json.dumps(claims_of(order["confused"])).encode())
        sig = hmac.new(pem, f"{header}.{body}".encode(), hashlib.sha256).digest()
        return {"token": f"{header}.{body}.{b64(sig)}"}
    if "rotate" in order:
        with LOCK:
            add_rsa(order["rotate"])
            for kid in order.get("drop", []):
                LISTED.remove(kid)
            return {"keys": list(LISTED)}
    if "fetches" in order:
        with LOCK:
            return {"fetches": FETCHES}
    return {"error": "unknown order"}


def main():
    global ISSUER
    add_rsa("rsa1")
    KEYS["ec1"] = (ec.generate_private_key(ec.SECP256R1()), "EC")
    LISTED.append("ec1")
    KEYS["ed1"] = (ed25519.Ed25519PrivateKey.generate(), "OKP")
    LISTED.append("ed1")
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
