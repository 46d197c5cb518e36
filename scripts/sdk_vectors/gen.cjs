// Deliveries signed by the providers' own Node SDKs (and, where a provider ships
// none, by its documentation's recipe on Node's crypto), for tests/it/sdk_vectors.rs.
// Usage: node gen.cjs OUT.json   (NODE_PATH points at the installed SDKs)
"use strict";
const crypto = require("crypto");
const fs = require("fs");
const twilio = require("twilio");
const { Signature } = require("@hubspot/api-client");
const { verifyKey } = require("discord-interactions");

const PER_KIND = 12;
const vectors = [];
const b64 = (s) => Buffer.from(s).toString("base64");
const pick = (xs) => xs[crypto.randomInt(xs.length)];
const text = () => {
  const parts = ["plain", "é", "日本語", "🚀", "a\r\nb", "quote\"d", "back\\slash", "+plus", "a&b=c", "  spaced  ", "\u2028", "%41"];
  let out = "";
  for (let i = 0, n = 1 + crypto.randomInt(4); i < n; i++) out += pick(parts);
  return out;
};
const json = (value) => {
  if (crypto.randomInt(2)) return JSON.stringify(value);
  const pretty = JSON.stringify(value, null, 1 + crypto.randomInt(4));
  return crypto.randomInt(2) ? pretty.replace(/\n/g, "\r\n") : pretty;
};
const tamper = (body) => {
  const buf = Buffer.from(body);
  const at = crypto.randomInt(buf.length);
  buf[at] = buf[at] === 0x61 ? 0x62 : 0x61;
  return buf;
};
// The twin of a form body changes a decoded value: Twilio signs the decoded
// parameters, so `%C3` and `%c3` (a flipped byte) are the same delivery.
const push = (v, body, extra, twin) => {
  vectors.push({ ...v, body_b64: b64(body), ...extra });
  vectors.push({ ...v, body_b64: b64(twin === undefined ? tamper(body) : twin), expect: "reject", tampered: true });
};
const nowSecs = Math.floor(Date.now() / 1000);

async function main() {
  // Twilio (twilio npm): form bodies and JSON bodies under bodySHA256.
  const token = crypto.randomBytes(16).toString("hex");
  const publicUrl = "https://hooks.example.com/twilio/in";
  for (let i = 0; i < PER_KIND; i++) {
    const params = {};
    for (let k = 0, n = 1 + crypto.randomInt(6); k < n; k++) params[pick(["Body", "From", "To", "MessageSid", "Ünïcode", "A", "a", "Z1"]) + k] = text();
    const body = new URLSearchParams(params).toString();
    const query = "tenant=" + encodeURIComponent(text()) + "&n=" + i;
    const url = publicUrl + "?" + query;
    const sig = twilio.getExpectedTwilioSignature(token, url, params);
    if (!twilio.validateRequest(token, sig, url, params)) throw new Error("twilio form self-check");
    const v = { provider: "twilio", sdk: "twilio npm", secret: token, url: publicUrl, method: "POST", target: "/in?" + query,
      headers: [["X-Twilio-Signature", sig], ["I-Twilio-Idempotency-Token", "idem-" + i]], now: nowSecs, expect: "ok", id: "idem-" + i };
    const changed = { ...params };
    const first = Object.keys(changed)[0];
    changed[first] += "x";
    push(v, body, {}, new URLSearchParams(changed).toString());
  }
  for (let i = 0; i < PER_KIND; i++) {
    const body = json({ MessageSid: "SM" + i, Body: text(), nested: { list: [text(), i, true, null] } });
    const hash = twilio.getExpectedBodyHash(body);
    const url = publicUrl + "?n=" + i + "&bodySHA256=" + hash;
    const sig = twilio.getExpectedTwilioSignature(token, url, {});
    if (!twilio.validateRequestWithBody(token, sig, url, body)) throw new Error("twilio body self-check");
    const v = { provider: "twilio", sdk: "twilio npm", secret: token, url: publicUrl, method: "POST", target: "/twilio/in?n=" + i + "&bodySHA256=" + hash,
      headers: [["X-Twilio-Signature", sig], ["I-Twilio-Idempotency-Token", "idem-json-" + i]], now: nowSecs, expect: "ok", id: "idem-json-" + i };
    push(v, body, {});
  }

  // HubSpot v3 (@hubspot/api-client Signature): method + URI + body + timestamp.
  const clientSecret = crypto.randomUUID();
  const hsUrl = "https://hooks.example.com/hubspot";
  for (let i = 0; i < PER_KIND; i++) {
    const events = [];
    for (let k = 0, n = 1 + crypto.randomInt(3); k < n; k++) {
      events.push({ eventId: crypto.randomInt(1e9), subscriptionId: 1 + k, portalId: 62515, occurredAt: Date.now(), subscriptionType: "contact.propertyChange",
        attemptNumber: crypto.randomInt(3), objectId: crypto.randomInt(1e6), propertyName: "firstname", propertyValue: text() });
    }
    const body = json(events);
    const timestamp = Date.now();
    // The SDK takes the URI as HubSpot signs it (its listed escapes decoded); the
    // request carries it encoded.
    const url = hsUrl + "?portal=62515&x=a:b&n=" + i;
    const options = { clientSecret, requestBody: body, url, timestamp, method: "POST", signatureVersion: "v3" };
    const sig = Signature.getSignature("POST", "v3", options);
    if (!Signature.isValid({ ...options, signature: sig })) throw new Error("hubspot self-check");
    const v = { provider: "hubspot", sdk: "@hubspot/api-client", secret: clientSecret, url: hsUrl, method: "POST", target: "/hubspot?portal=62515&x=a%3Ab&n=" + i,
      headers: [["X-HubSpot-Signature-v3", sig], ["X-HubSpot-Request-Timestamp", String(timestamp)]], now: Math.floor(timestamp / 1000), expect: "ok" };
    push(v, body, {});
  }

  // Discord (keys and signatures from Node's ed25519, checked by discord-interactions).
  const { publicKey, privateKey } = crypto.generateKeyPairSync("ed25519");
  const publicHex = publicKey.export({ format: "der", type: "spki" }).subarray(-32).toString("hex");
  for (let i = 0; i < PER_KIND; i++) {
    const ping = i % 4 === 0;
    const id = String(1000000000000000000n + BigInt(crypto.randomInt(1e12)));
    const body = json(ping ? { id, type: 1, application_id: "1", version: 1 } : { id, type: 2, data: { name: "echo", options: [{ name: "text", value: text() }] } });
    const ts = String(nowSecs);
    const sig = crypto.sign(null, Buffer.concat([Buffer.from(ts), Buffer.from(body)]), privateKey).toString("hex");
    if (!(await verifyKey(body, sig, ts, publicHex))) throw new Error("discord self-check");
    const v = { provider: "discord", sdk: "discord-interactions (verifyKey)", secret: publicHex, method: "POST", target: "/discord",
      headers: [["X-Signature-Ed25519", sig], ["X-Signature-Timestamp", ts]], now: nowSecs, expect: "ok" };
    push(v, body, ping ? { handshake: '{"type":1}' } : { id });
  }

  // Zoom, Meta, Twitch: no signing SDK; their documentation's recipes on Node's crypto.
  const hmac = (key, data, enc) => crypto.createHmac("sha256", key).update(data).digest(enc);
  const zoomSecret = crypto.randomBytes(16).toString("base64url");
  for (let i = 0; i < PER_KIND; i++) {
    const validation = i % 4 === 0;
    const plainToken = crypto.randomBytes(16).toString("base64url");
    const body = json(validation ? { payload: { plainToken }, event_ts: Date.now(), event: "endpoint.url_validation" }
      : { event: "meeting.started", event_ts: Date.now(), payload: { account_id: "A", object: { id: String(i), topic: text() } } });
    const ts = String(nowSecs);
    const sig = "v0=" + hmac(zoomSecret, `v0:${ts}:${body}`, "hex");
    const v = { provider: "zoom", sdk: "Zoom docs' recipe", secret: zoomSecret, method: "POST", target: "/zoom",
      headers: [["x-zm-signature", sig], ["x-zm-request-timestamp", ts]], now: nowSecs, expect: "ok" };
    const extra = validation ? { handshake: JSON.stringify({ plainToken, encryptedToken: hmac(zoomSecret, plainToken, "hex") }) }
      : { id: "sha256:" + crypto.createHash("sha256").update(body).digest("hex") };
    push(v, body, extra);
  }
  const appSecret = crypto.randomBytes(16).toString("hex");
  for (let i = 0; i < PER_KIND; i++) {
    const body = json({ object: "whatsapp_business_account", entry: [{ id: "0", changes: [{ field: "messages", value: { messages: [{ id: "wamid." + i, text: { body: text() } }] } }] }] });
    const v = { provider: "meta", sdk: "Meta docs' recipe", secret: appSecret, method: "POST", target: "/meta",
      headers: [["X-Hub-Signature-256", "sha256=" + hmac(appSecret, body, "hex")]], now: nowSecs, expect: "ok" };
    push(v, body, { id: "sha256:" + crypto.createHash("sha256").update(body).digest("hex") });
  }
  const twitchSecret = crypto.randomBytes(12).toString("hex");
  for (let i = 0; i < PER_KIND; i++) {
    const challenge = i % 4 === 0;
    const id = crypto.randomUUID();
    const ts = new Date().toISOString().replace("Z", "123456Z");
    const body = json(challenge ? { challenge: crypto.randomBytes(12).toString("hex"), subscription: { id: "s", status: "webhook_callback_verification_pending", type: "channel.follow" } }
      : { subscription: { id: "s", status: "enabled", type: "channel.follow" }, event: { user_name: text() } });
    const sig = "sha256=" + hmac(twitchSecret, id + ts + body, "hex");
    const v = { provider: "twitch", sdk: "Twitch docs' recipe", secret: twitchSecret, method: "POST", target: "/twitch",
      headers: [["Twitch-Eventsub-Message-Id", id], ["Twitch-Eventsub-Message-Timestamp", ts], ["Twitch-Eventsub-Message-Signature", sig],
        ["Twitch-Eventsub-Message-Type", challenge ? "webhook_callback_verification" : "notification"]], now: nowSecs, expect: "ok" };
    push(v, body, challenge ? { handshake: JSON.parse(body).challenge } : { id });
  }
  fs.writeFileSync(process.argv[2], JSON.stringify(vectors));
}

main().catch((e) => { console.error(e); process.exit(1); });
