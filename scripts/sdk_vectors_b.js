// Cross-check vectors for the Square, SendGrid, Adyen, Mailgun, Intercom, GitLab,
// Typeform, Calendly and Dropbox presets, one JSON object per line on stdout.
//
// Deliveries are signed by the providers' own SDKs where they sign (Square's
// `createHmacOverride`, Adyen's `hmacValidator`, SendGrid's ECDSA library
// `starkbank-ecdsa`, beside Node's OpenSSL) and judged by the SDKs where they
// verify (`WebhooksHelper.verifySignature`, `EventWebhook.verifySignature`,
// `hmacValidator.validateHMAC`). Providers without an SDK helper (Mailgun, Intercom,
// Typeform, Calendly, Dropbox, GitLab) are signed and judged by the documented
// algorithm, written here independently of the Rust code. Bodies are random:
// minified, pretty, CRLF and \u-escaped JSON with non-ASCII text; each signed
// delivery has tampered twins. `sdk_ok` is the SDK's (or the reference's) verdict;
// the Rust verifier must give the same one, and the same event id.
//
// Run by scripts/sdk_vectors_b.sh with NODE_PATH set to its package cache.
'use strict';

const crypto = require('crypto');
const { EventWebhook } = require('@sendgrid/eventwebhook');
const starkbank = require('starkbank-ecdsa');
// Its curves are not exported from the package root.
const { prime256v1 } = require(
  require('path').join(require('path').dirname(require.resolve('starkbank-ecdsa')), 'ellipticcurve/curve.js'),
);
const { WebhooksHelper } = require('square');
// Not in the package's exports: loaded by path, the helper WebhooksHelper signs with.
const { createHmacOverride } = require(
  require('path').join(require('path').dirname(require.resolve('square')), 'core/crypto/createHmacOverride.js'),
);
const { hmacValidator } = require('@adyen/api-library');

const PER_PROVIDER = 12;
const NOW = Math.floor(Date.now() / 1000);
const out = [];

const rand = (n) => crypto.randomInt(n);
const pick = (xs) => xs[rand(xs.length)];
const hex = (n) => crypto.randomBytes(n).toString('hex');
const TEXTS = [
  'plain text',
  'café ☕ 日本語 עברית 🎉 Ωmega',
  'quote " backslash \\ slash / tab \t newline \n',
  'line\u2028separator and bidi \u202e override',
  'emoji 👩‍💻 and combining é',
];
const STYLES = ['min', 'pretty', 'crlf', 'escaped'];

/** A JSON text of `value` in `style`. */
function render(value, style) {
  switch (style) {
    case 'min':
      return JSON.stringify(value);
    case 'pretty':
      return JSON.stringify(value, null, 2);
    case 'crlf':
      return JSON.stringify(value, null, 4).replace(/\n/g, '\r\n');
    case 'escaped':
      return JSON.stringify(value).replace(
        /[\u007f-\uffff]/g,
        (c) => '\\u' + c.charCodeAt(0).toString(16).padStart(4, '0'),
      );
    default:
      throw new Error(style);
  }
}

/** A random nested payload. */
function payload() {
  return {
    note: pick(TEXTS),
    amount: rand(1_000_000),
    nested: { list: [1, 'two', { three: pick(TEXTS) }], flag: rand(2) === 1, nothing: null },
  };
}

/** The same JSON text with one insignificant space added: other raw bytes. */
function respace(text) {
  return text.replace('{', '{ ');
}

function push(v) {
  for (const k of ['provider', 'label', 'secrets', 'headers', 'body', 'now', 'sdk_ok']) {
    if (!(k in v)) throw new Error(`vector without ${k}: ${JSON.stringify(v)}`);
  }
  out.push({ ...v, body: Buffer.from(v.body, 'utf8').toString('base64') });
}

const hmac = (alg, key, data, enc) => crypto.createHmac(alg, key).update(data).digest(enc);

async function square() {
  for (let i = 0; i < PER_PROVIDER; i++) {
    const key = crypto.randomBytes(16).toString('base64url');
    const url = `https://example.com/webhooks/square/${hex(4)}?q=${hex(2)}`;
    const id = crypto.randomUUID();
    const style = STYLES[i % STYLES.length];
    const body = render({ merchant_id: 'MLEFBHHSJGVHD', type: 'payment.updated', event_id: id, data: payload() }, style);
    const sig = await createHmacOverride(url + body, key);
    const judge = (b, s, u) => WebhooksHelper.verifySignature({ requestBody: b, signatureHeader: s, signatureKey: key, notificationUrl: u });
    const base = { provider: 'square', secrets: [key], url, now: NOW };
    const h = (s) => [['x-square-hmacsha256-signature', s]];
    push({ ...base, label: `signed ${style}`, headers: h(sig), body, sdk_ok: await judge(body, sig, url), id });
    const spaced = respace(body);
    push({ ...base, label: `respaced ${style}`, headers: h(sig), body: spaced, sdk_ok: await judge(spaced, sig, url) });
    const other = url + 'x';
    push({ ...base, label: `other url ${style}`, url: other, headers: h(sig), body, sdk_ok: await judge(body, sig, other) });
  }
}

function sendgrid() {
  for (let i = 0; i < PER_PROVIDER; i++) {
    const style = STYLES[i % STYLES.length];
    const count = i % 3 === 0 ? 3 : 1;
    const ids = Array.from({ length: count }, () => crypto.randomBytes(18).toString('base64url'));
    const events = ids.map((sg_event_id) => ({ email: 'a@example.com', timestamp: NOW, event: pick(['delivered', 'open', 'click']), sg_event_id, ...payload() }));
    const body = render(events, style);
    const ts = String(NOW - rand(60));
    let publicKey;
    let sig;
    if (i % 2 === 0) {
      // SendGrid's own ECDSA library signs.
      const priv = new starkbank.PrivateKey(prime256v1);
      publicKey = priv.publicKey().toPem().replace(/-----[^-]+-----|\s/g, '');
      sig = starkbank.Ecdsa.sign(ts + body, priv).toBase64();
    } else {
      // OpenSSL through Node, as an independent signer.
      const { privateKey, publicKey: pub } = crypto.generateKeyPairSync('ec', { namedCurve: 'prime256v1' });
      publicKey = pub.export({ type: 'spki', format: 'der' }).toString('base64');
      sig = crypto.sign('sha256', Buffer.from(ts + body, 'utf8'), { key: privateKey, dsaEncoding: 'der' }).toString('base64');
    }
    const ew = new EventWebhook();
    const judge = (b, s, t) => ew.verifySignature(ew.convertPublicKeyToECDSA(publicKey), b, s, t);
    const id = count === 1
      ? ids[0]
      : 'batch-' + crypto.createHash('sha256').update(ids.join('\n')).digest('hex').slice(0, 32);
    const base = { provider: 'sendgrid', secrets: [publicKey], now: Number(ts) };
    const h = (s, t) => [['X-Twilio-Email-Event-Webhook-Signature', s], ['X-Twilio-Email-Event-Webhook-Timestamp', t]];
    push({ ...base, label: `signed ${style} x${count}`, headers: h(sig, ts), body, sdk_ok: judge(body, sig, ts), id });
    const spaced = respace(body);
    push({ ...base, label: `respaced ${style}`, headers: h(sig, ts), body: spaced, sdk_ok: judge(spaced, sig, ts) });
    const later = String(Number(ts) + 1);
    push({ ...base, label: `other timestamp ${style}`, headers: h(sig, later), body, sdk_ok: judge(body, sig, later) });
  }
}

function adyen() {
  const v = new hmacValidator();
  for (let i = 0; i < PER_PROVIDER; i++) {
    const key = hex(32).toUpperCase();
    const style = STYLES[i % STYLES.length];
    const item = {
      pspReference: String(1e15 + rand(2 ** 47)),
      originalReference: i % 3 === 0 ? String(1e15 + rand(2 ** 47)) : '',
      merchantAccountCode: pick(['TestMerchant', 'Café_ECOM']),
      merchantReference: `order ${pick(TEXTS)}:${rand(1000)}`,
      amount: { value: rand(100000), currency: pick(['EUR', 'USD', 'JPY']) },
      eventCode: pick(['AUTHORISATION', 'CAPTURE', 'REFUND', 'CANCELLATION']),
      eventDate: '2024-01-01T00:00:00+01:00',
      paymentMethod: 'visa',
      reason: pick(TEXTS),
      success: pick(['true', 'false']),
    };
    item.additionalData = { hmacSignature: v.calculateHmac(item, key) };
    const wrap = (it) => render({ live: 'false', notificationItems: [{ NotificationRequestItem: it }] }, style);
    const base = { provider: 'adyen', secrets: [key], headers: [], now: NOW };
    const id = `${item.eventCode}:${item.pspReference}:${item.success}`;
    push({ ...base, label: `signed ${style}`, body: wrap(item), sdk_ok: v.validateHMAC(item, key), id });
    const more = { ...item, amount: { ...item.amount, value: item.amount.value + 1 } };
    push({ ...base, label: `amount changed ${style}`, body: wrap(more), sdk_ok: v.validateHMAC(more, key) });
    const ref = { ...item, merchantReference: item.merchantReference + '!' };
    push({ ...base, label: `reference changed ${style}`, body: wrap(ref), sdk_ok: v.validateHMAC(ref, key) });
    // `reason` is not signed: the SDK accepts the change, and so must the preset.
    const reason = { ...item, reason: 'rewritten' };
    push({ ...base, label: `unsigned reason changed ${style}`, body: wrap(reason), sdk_ok: v.validateHMAC(reason, key), id });
  }
}

function mailgun() {
  const check = (key, sig) => hmac('sha256', key, sig.timestamp + sig.token, 'hex') === sig.signature;
  for (let i = 0; i < PER_PROVIDER; i++) {
    const key = hex(16);
    const style = STYLES[i % STYLES.length];
    const token = hex(25);
    const signature = { timestamp: String(NOW - rand(60)), token };
    signature.signature = hmac('sha256', key, signature.timestamp + token, 'hex');
    const data = { event: 'delivered', id: hex(11), timestamp: NOW + 0.5, ...payload() };
    const body = (sig, d) => render({ signature: sig, 'event-data': d }, style);
    const base = { provider: 'mailgun', secrets: [key], headers: [], now: NOW };
    push({ ...base, label: `signed ${style}`, body: body(signature, data), sdk_ok: check(key, signature), id: token });
    const otherToken = { ...signature, token: hex(25) };
    push({ ...base, label: `other token ${style}`, body: body(otherToken, data), sdk_ok: check(key, otherToken) });
    const otherTime = { ...signature, timestamp: String(Number(signature.timestamp) + 1) };
    push({ ...base, label: `other timestamp ${style}`, body: body(otherTime, data), sdk_ok: check(key, otherTime) });
    // The event data is not signed: the documented check passes, the id stays the token.
    const forged = { ...data, event: 'unsubscribed' };
    push({ ...base, label: `unsigned event-data changed ${style}`, body: body(signature, forged), sdk_ok: check(key, signature), id: token });
  }
}

/** Providers that sign the raw body with one HMAC in one header. */
function rawBodyHmac(provider, header, sign, idOf) {
  for (let i = 0; i < PER_PROVIDER; i++) {
    const key = crypto.randomBytes(24).toString('base64url');
    const style = STYLES[i % STYLES.length];
    const { value, id } = idOf(i);
    const body = render(value, style);
    const sig = sign(key, body);
    const base = { provider, secrets: [key], now: NOW };
    const reference = (b, s) => sign(key, b) === s;
    push({ ...base, label: `signed ${style}`, headers: [[header, sig]], body, sdk_ok: reference(body, sig), ...id });
    const spaced = respace(body);
    push({ ...base, label: `respaced ${style}`, headers: [[header, sig]], body: spaced, sdk_ok: reference(spaced, sig) });
    const wrongKey = sign(key + 'x', body);
    push({ ...base, label: `other key ${style}`, headers: [[header, wrongKey]], body, sdk_ok: reference(body, wrongKey) });
  }
}

function calendly() {
  for (let i = 0; i < PER_PROVIDER; i++) {
    const key = hex(32);
    const style = STYLES[i % STYLES.length];
    const uri = `https://api.calendly.com/scheduled_events/${hex(8)}/invitees/${hex(8)}`;
    const event = pick(['invitee.created', 'invitee.canceled']);
    const body = render({ created_at: '2024-05-01T10:00:00.000000Z', event, payload: { uri, ...payload() } }, style);
    const t = NOW - rand(60);
    const sign = (tt, b) => `t=${tt},v1=${hmac('sha256', key, `${tt}.${b}`, 'hex')}`;
    const reference = (header, b) => {
      const parts = Object.fromEntries(header.split(',').map((p) => p.split('=')));
      return hmac('sha256', key, `${parts.t}.${b}`, 'hex') === parts.v1;
    };
    const h = sign(t, body);
    const base = { provider: 'calendly', secrets: [key], now: NOW };
    const H = 'Calendly-Webhook-Signature';
    push({ ...base, label: `signed ${style}`, headers: [[H, h]], body, sdk_ok: reference(h, body), id: `${event}:${uri}` });
    const moved = h.replace(`t=${t}`, `t=${t + 1}`);
    push({ ...base, label: `other t ${style}`, headers: [[H, moved]], body, sdk_ok: reference(moved, body) });
    const spaced = respace(body);
    push({ ...base, label: `respaced ${style}`, headers: [[H, h]], body: spaced, sdk_ok: reference(h, spaced) });
  }
}

function gitlab() {
  for (let i = 0; i < PER_PROVIDER; i++) {
    const token = crypto.randomBytes(20).toString('base64url');
    const uuid = crypto.randomUUID();
    const idem = crypto.randomUUID();
    const body = render({ object_kind: 'push', ...payload() }, STYLES[i % STYLES.length]);
    const base = { provider: 'gitlab', secrets: [token], now: NOW, body };
    const ids = i % 2 === 0 ? [['X-Gitlab-Event-UUID', uuid], ['Idempotency-Key', idem]] : [['X-Gitlab-Event-UUID', uuid]];
    push({ ...base, label: 'token', headers: [['X-Gitlab-Token', token], ...ids], sdk_ok: true, id: i % 2 === 0 ? idem : uuid });
    const upper = token.toUpperCase() === token ? token + 'x' : token.toUpperCase();
    push({ ...base, label: 'other case', headers: [['X-Gitlab-Token', upper], ...ids], sdk_ok: false });
    push({ ...base, label: 'prefix', headers: [['X-Gitlab-Token', token.slice(0, -1)], ...ids], sdk_ok: false });
  }
}

(async () => {
  await square();
  sendgrid();
  adyen();
  mailgun();
  rawBodyHmac('intercom', 'X-Hub-Signature', (k, b) => 'sha1=' + hmac('sha1', k, b, 'hex'), () => {
    const id = 'notif_' + crypto.randomUUID();
    return { value: { type: 'notification_event', id, topic: 'contact.user.created', data: { item: payload() } }, id: { id } };
  });
  rawBodyHmac('typeform', 'Typeform-Signature', (k, b) => 'sha256=' + hmac('sha256', k, b, 'base64'), () => {
    const id = hex(13).toUpperCase();
    return { value: { event_id: id, event_type: 'form_response', form_response: payload() }, id: { id } };
  });
  rawBodyHmac('dropbox', 'X-Dropbox-Signature', (k, b) => hmac('sha256', k, b, 'hex'), () => ({
    value: { list_folder: { accounts: [`dbid:${hex(12)}`] }, delta: { users: [rand(1e6)] }, extra: payload() },
    id: { id_prefix: `dropbox-${NOW * 1000}-` },
  }));
  calendly();
  gitlab();
  const signed = out.filter((v) => v.sdk_ok).length;
  if (signed === 0 || signed === out.length) throw new Error('vectors must hold both verdicts');
  for (const v of out) process.stdout.write(JSON.stringify(v) + '\n');
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
