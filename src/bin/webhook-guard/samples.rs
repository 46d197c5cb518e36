//! `send` for Square, SendGrid, Adyen, Mailgun, Intercom, GitLab, Typeform,
//! Calendly and Dropbox: each one's signer, sample event and headers.

use std::borrow::Cow;

use chrono::{SecondsFormat, Utc};
use webhook_guard::store::FencingToken;
use webhook_guard::verify::{
    Adyen, AdyenItem, Calendly, Dropbox, Intercom, KeyError, Mailgun, Provider, SendGrid, Square,
    Typeform,
};

/// A preset keyed with the secret, to sign with.
pub(crate) enum Extra {
    Square(Square),
    /// The base64 P-256 private key (SendGrid keeps its own; the receiver is
    /// configured with the public key `send` prints).
    SendGrid(String),
    Adyen(Adyen),
    Mailgun(Mailgun),
    Intercom(Intercom),
    /// The secret token, sent as it is.
    GitLab(String),
    Typeform(Typeform),
    Calendly(Calendly),
    Dropbox(Dropbox),
}

/// `len` random lowercase hex digits.
pub(crate) fn random_hex(len: usize) -> String {
    let mut out = String::new();
    while out.len() < len {
        out.push_str(&format!("{:016x}", FencingToken::random().0));
    }
    out.truncate(len);
    out
}

fn q(s: &str) -> String {
    serde_json::to_string(s).expect("strings serialize")
}

impl Extra {
    /// The signer of `provider`, or `None` for a provider `send.rs` signs itself.
    /// `url` is the notification URL (Square signs it).
    pub(crate) fn new(provider: Provider, secret: &str, url: &str) -> Option<Result<Self, String>> {
        let key = |e: KeyError| format!("--secret: {e}");
        let s = [secret];
        let built = match provider {
            Provider::Square => Square::new(url, s).map(Self::Square).map_err(key),
            Provider::SendGrid => SendGrid::public_key_of(secret)
                .map(|_| Self::SendGrid(secret.to_owned()))
                .map_err(|e| {
                    format!(
                        "--secret: {e} (for sendgrid, the private key that signs; the \
                         receiver is configured with its public key)"
                    )
                }),
            Provider::Adyen => Adyen::new(s).map(Self::Adyen).map_err(key),
            Provider::Mailgun => Mailgun::new(s).map(Self::Mailgun).map_err(key),
            Provider::Intercom => Intercom::new(s).map(Self::Intercom).map_err(key),
            Provider::GitLab if secret.is_empty() => Err(key(KeyError::EmptySecret)),
            Provider::GitLab => Ok(Self::GitLab(secret.to_owned())),
            Provider::Typeform => Typeform::new(s).map(Self::Typeform).map_err(key),
            Provider::Calendly => Calendly::new(s).map(Self::Calendly).map_err(key),
            Provider::Dropbox => Dropbox::new(s).map(Self::Dropbox).map_err(key),
            _ => return None,
        };
        Some(built)
    }

    /// A line to print before sending, if the receiver needs to know something.
    pub(crate) fn note(&self) -> Option<String> {
        match self {
            Self::SendGrid(private) => SendGrid::public_key_of(private)
                .ok()
                .map(|public| format!("sendgrid verification (public) key: {public}")),
            Self::Square(s) => Some(format!(
                "square notification URL signed: {}",
                s.notification_url()
            )),
            _ => None,
        }
    }

    /// The body field holding the event id, for providers that put it there.
    pub(crate) fn id_field(&self) -> Option<&'static str> {
        match self {
            Self::Square(_) | Self::Typeform(_) => Some("event_id"),
            Self::Intercom(_) => Some("id"),
            _ => None,
        }
    }

    /// Why `--body-file` cannot be used, for providers whose signature is built
    /// into a body `send` writes.
    pub(crate) fn refuses_body_file(&self) -> Option<&'static str> {
        match self {
            Self::Adyen(_) => Some(
                "adyen signs fields inside the body: send's sample only (set the \
                 pspReference with --event-id)",
            ),
            _ => None,
        }
    }

    /// The event's id as the preset will read it (or what it depends on), and its
    /// body: `file` as it is, or a sample. For Mailgun the body is the `event-data`
    /// object, wrapped and signed anew for each delivery.
    pub(crate) fn event(&self, id: Option<String>, file: Option<Vec<u8>>) -> (String, Vec<u8>) {
        let now = Utc::now();
        let secs = now.timestamp();
        let rfc = now.to_rfc3339_opts(SecondsFormat::Millis, true);
        let uuid = || uuid::Uuid::new_v4().to_string();
        match self {
            Self::Adyen(adyen) => {
                let psp = id.unwrap_or_else(|| {
                    let n = FencingToken::random().0 % 10_000_000_000_000_000;
                    format!("{n:016}")
                });
                let item = AdyenItem {
                    psp_reference: &psp,
                    merchant_account_code: "TestMerchant",
                    merchant_reference: "order-1234",
                    value: 2000,
                    currency: "EUR",
                    event_code: "AUTHORISATION",
                    success: true,
                    ..AdyenItem::default()
                };
                (
                    format!("AUTHORISATION:{psp}:true"),
                    adyen.notification(&item).into_bytes(),
                )
            }
            Self::Calendly(_) => {
                let invitee = id.unwrap_or_else(|| random_hex(16).to_uppercase());
                let uri = format!(
                    "https://api.calendly.com/scheduled_events/GBGBDCAADAEDCRZ2/invitees/{invitee}"
                );
                let body = file.unwrap_or_else(|| {
                    format!(
                        r#"{{"created_at":{},"created_by":"https://api.calendly.com/users/AAAAAAAAAAAAAAAA","event":"invitee.created","payload":{{"uri":{},"email":"test@example.com","name":"Test Invitee","status":"active","scheduled_event":{{"uri":"https://api.calendly.com/scheduled_events/GBGBDCAADAEDCRZ2"}}}}}}"#,
                        q(&rfc),
                        q(&uri)
                    )
                    .into_bytes()
                });
                (format!("invitee.created:{uri}"), body)
            }
            Self::Dropbox(_) => (
                "(a fresh id per delivery)".into(),
                file.unwrap_or_else(|| {
                    br#"{"list_folder":{"accounts":["dbid:AAH4f99T0taONIb-OurWxbNQ6ywGRopQngc"]},"delta":{"users":[12345678]}}"#.to_vec()
                }),
            ),
            Self::Mailgun(_) => {
                let id = id.unwrap_or_else(|| random_hex(22));
                let data = file.unwrap_or_else(|| {
                    format!(
                        r#"{{"event":"delivered","id":{},"timestamp":{secs}.5,"recipient":"alice@example.com","message":{{"headers":{{"message-id":"{}@example.com"}}}}}}"#,
                        q(&id),
                        random_hex(20)
                    )
                    .into_bytes()
                });
                (format!("{id} (the guard's id: each delivery's token)"), data)
            }
            Self::SendGrid(_) => {
                let id = id.unwrap_or_else(|| random_hex(32));
                let body = file.unwrap_or_else(|| {
                    format!(
                        r#"[{{"email":"alice@example.com","timestamp":{secs},"event":"delivered","sg_event_id":{},"sg_message_id":"{}.filter0001"}}]"#,
                        q(&id),
                        random_hex(22)
                    )
                    .into_bytes()
                });
                (id, body)
            }
            Self::GitLab(_) => (
                id.unwrap_or_else(uuid),
                file.unwrap_or_else(|| {
                    br#"{"object_kind":"push","event_name":"push","ref":"refs/heads/main","checkout_sha":"da1560886d4f094c3e6c9ef40349f7d38b5d27d7","project":{"id":15,"path_with_namespace":"group/project"},"total_commits_count":1}"#.to_vec()
                }),
            ),
            Self::Square(_) | Self::Typeform(_) | Self::Intercom(_) => {
                let id = id.unwrap_or_else(|| match self {
                    Self::Intercom(_) => format!("notif_{}", uuid()),
                    Self::Typeform(_) => random_hex(26).to_uppercase(),
                    _ => uuid(),
                });
                let body = match self {
                    Self::Square(_) => format!(
                        r#"{{"merchant_id":"MLEFBHHSJGVHD","type":"payment.updated","event_id":{},"created_at":{},"data":{{"type":"payment","id":"KkAkhdMsgzn59SM8A89WgKwekxLZY","object":{{"payment":{{"id":"KkAkhdMsgzn59SM8A89WgKwekxLZY","status":"COMPLETED","amount_money":{{"amount":2000,"currency":"USD"}}}}}}}}}}"#,
                        q(&id),
                        q(&rfc)
                    ),
                    Self::Typeform(_) => format!(
                        r#"{{"event_id":{},"event_type":"form_response","form_response":{{"form_id":"lT4Z3j","token":"{}","submitted_at":{},"answers":[{{"type":"text","text":"It's a test","field":{{"id":"DlXFaesGBpoF","type":"long_text"}}}}]}}}}"#,
                        q(&id),
                        random_hex(32),
                        q(&rfc)
                    ),
                    _ => format!(
                        r#"{{"type":"notification_event","app_id":"abc123","data":{{"type":"notification_event_data","item":{{"type":"contact","id":"6762f0dd1bb69f9f2193bb7d","role":"user"}}}},"links":{{}},"id":{},"topic":"contact.user.created","delivery_status":"pending","delivery_attempts":1,"delivered_at":0,"first_sent_at":{secs},"created_at":{secs},"self":null}}"#,
                        q(&id)
                    ),
                };
                (id, body.into_bytes())
            }
        }
    }

    /// The body of one delivery at `now`: Mailgun's is signed anew, with a fresh
    /// token (as Mailgun signs each attempt); the others' is the event's body.
    pub(crate) fn body<'e>(&self, body: &'e [u8], now: i64) -> Cow<'e, [u8]> {
        match self {
            Self::Mailgun(m) => {
                let data = String::from_utf8_lossy(body);
                Cow::Owned(m.envelope(now, &random_hex(50), data.trim()).into_bytes())
            }
            _ => Cow::Borrowed(body),
        }
    }

    /// The headers of one delivery of `body` (with the event `id`) at `now`.
    pub(crate) fn headers(&self, id: &str, body: &[u8], now: i64) -> Vec<(String, String)> {
        let h = |pairs: Vec<(&str, String)>| {
            pairs
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect::<Vec<_>>()
        };
        match self {
            Self::Square(s) => h(vec![
                ("x-square-hmacsha256-signature", s.sign(body)),
                ("square-environment", "Sandbox".into()),
            ]),
            Self::SendGrid(private) => h(SendGrid::sign_headers(private, now, body)
                .expect("the key was checked when the signer was built")),
            Self::Adyen(_) | Self::Mailgun(_) => Vec::new(),
            Self::Intercom(s) => h(vec![("X-Hub-Signature", s.sign(body))]),
            Self::GitLab(token) => h(vec![
                ("X-Gitlab-Event", "Push Hook".into()),
                ("X-Gitlab-Token", token.clone()),
                ("X-Gitlab-Event-UUID", id.to_owned()),
                ("Idempotency-Key", id.to_owned()),
                ("X-Gitlab-Instance", "https://gitlab.example.com".into()),
            ]),
            Self::Typeform(s) => h(vec![("Typeform-Signature", s.sign(body))]),
            Self::Calendly(s) => h(vec![("Calendly-Webhook-Signature", s.sign(body, now))]),
            Self::Dropbox(s) => h(vec![("X-Dropbox-Signature", s.sign(body))]),
        }
    }
}
