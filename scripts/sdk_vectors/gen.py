"""Deliveries signed by the providers' own Python SDKs (twilio's RequestValidator,
PyNaCl for Discord), for tests/it/sdk_vectors.rs. Usage: python gen.py OUT.json"""
import base64
import hashlib
import json
import secrets
import sys
import time
from urllib.parse import quote, urlencode

from nacl.signing import SigningKey
from twilio.request_validator import RequestValidator

PER_KIND = 12
PARTS = ["plain", "é", "日本語", "🚀", "a\r\nb", 'quote"d', "back\\slash", "+plus", "a&b=c", "  spaced  ", "\u2028", "%41"]


def text():
    return "".join(secrets.choice(PARTS) for _ in range(1 + secrets.randbelow(4)))


def dump(value):
    if secrets.randbelow(2):
        return json.dumps(value, ensure_ascii=secrets.randbelow(2) == 0, separators=(",", ":"))
    pretty = json.dumps(value, ensure_ascii=False, indent=1 + secrets.randbelow(4))
    return pretty.replace("\n", "\r\n") if secrets.randbelow(2) else pretty


def tamper(body):
    buf = bytearray(body)
    at = secrets.randbelow(len(buf))
    buf[at] = 0x62 if buf[at] == 0x61 else 0x61
    return bytes(buf)


vectors = []


def push(vector, body, extra, twin=None):
    # The twin of a form body changes a decoded value: Twilio signs the decoded
    # parameters, so `%C3` and `%c3` (a flipped byte) are the same delivery.
    twin = tamper(body) if twin is None else twin
    vectors.append({**vector, "body_b64": base64.b64encode(body).decode(), **extra})
    vectors.append({**vector, "body_b64": base64.b64encode(twin).decode(), "expect": "reject", "tampered": True})


now = int(time.time())
token = secrets.token_hex(16)
validator = RequestValidator(token)
public = "https://hooks.example.com/twilio/py"
for i in range(PER_KIND):
    params = {secrets.choice(["Body", "From", "To", "SmsSid", "Ünïcode", "b"]) + str(k): text() for k in range(1 + secrets.randbelow(6))}
    body = urlencode(params)
    query = "tenant=" + quote(text(), safe="") + "&n=" + str(i)
    url = public + "?" + query
    sig = validator.compute_signature(url, params)
    assert validator.validate(url, params, sig)
    push({"provider": "twilio", "sdk": "twilio PyPI", "secret": token, "url": public, "method": "POST", "target": "/py?" + query,
          "headers": [["X-Twilio-Signature", sig], ["I-Twilio-Idempotency-Token", "py-" + str(i)]], "now": now, "expect": "ok", "id": "py-" + str(i)},
         body.encode(), {}, urlencode({**params, next(iter(params)): params[next(iter(params))] + "x"}).encode())
for i in range(PER_KIND):
    body = dump({"MessageSid": "SM" + str(i), "Body": text()})
    url = public + "?bodySHA256=" + validator.compute_hash(body)
    sig = validator.compute_signature(url, {})
    assert validator.validate(url, body, sig)
    push({"provider": "twilio", "sdk": "twilio PyPI", "secret": token, "url": public, "method": "POST",
          "target": "/py?bodySHA256=" + validator.compute_hash(body), "headers": [["X-Twilio-Signature", sig]], "now": now, "expect": "ok"},
         body.encode(), {})

key = SigningKey.generate()
public_hex = key.verify_key.encode().hex()
for i in range(PER_KIND):
    ping = i % 4 == 0
    ident = str(10**18 + secrets.randbelow(10**12))
    body = dump({"id": ident, "type": 1} if ping else {"id": ident, "type": 3, "data": {"custom_id": text()}}).encode()
    ts = str(now)
    sig = key.sign(ts.encode() + body).signature.hex()
    key.verify_key.verify(ts.encode() + body, bytes.fromhex(sig))
    push({"provider": "discord", "sdk": "PyNaCl", "secret": public_hex, "method": "POST", "target": "/discord",
          "headers": [["X-Signature-Ed25519", sig], ["X-Signature-Timestamp", ts]], "now": now, "expect": "ok"},
         body, {"handshake": '{"type":1}'} if ping else {"id": ident})

with open(sys.argv[1], "w") as out:
    json.dump(vectors, out)
