//! Adyen: an HMAC of the documented notification fields, inside the body's
//! `additionalData.hmacSignature`.

use std::borrow::Cow;
use std::time::Duration;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::common::{self, Keys};
use super::macros;
use super::{KeyError, Secret, SecretFormat, Verified, Verifier, VerifyError};

/// Verifies Adyen standard webhooks (JSON notifications) signed with an HMAC key.
///
/// # What is signed
///
/// Not the body: the values of eight fields of the `NotificationRequestItem`, joined
/// with `:` and not escaped, as Adyen documents and its libraries compute:
///
/// `pspReference:originalReference:merchantAccountCode:merchantReference:amount.value:amount.currency:eventCode:success`
///
/// A missing field counts as empty (`originalReference` usually is). HMAC-SHA256,
/// keyed with the **hex-decoded** HMAC key from the Customer Area, standard base64,
/// in `additionalData.hmacSignature` of the item. Strings are read as JSON strings
/// (escapes decoded); `amount.value` must be an integer and `success` `true` or
/// `false` (a string or a boolean).
///
/// Every other field of the item (`eventDate`, `reason`, `paymentMethod`, the rest
/// of `additionalData`) and the envelope's `live` are **not authenticated**: a forger
/// holding one genuine item can change them. Nor does the signed text mark where one
/// field ends, so a value containing `:` (a merchant reference can) could be split
/// differently; the fields the event id is made of are refused if they hold a `:`.
///
/// # One item per request
///
/// Adyen sends one `NotificationRequestItem` per request (`notificationItems` is an
/// array of one). A body with several items is **refused** (`malformed_body`):
/// the guard claims one id per request, and an answer for a batch could not say
/// which items were processed. If an account receives batches, ask Adyen to send
/// single notifications.
///
/// # Id and limits
///
/// - Event id: `{eventCode}:{pspReference}:{success}`, the combination Adyen
///   documents as unique (an event may come first with `success` `false`, then
///   `true`). All three are signed.
/// - No timestamp is signed: no replay window; deduplication on the signed id stops
///   a replay.
/// - Retry window: Adyen retries a failing endpoint's queue for 30 days (2, 5, 10,
///   15, 30 minutes, 1, 2, 4, 8 hours, then every 8 hours), and waits 10 s for an
///   answer.
/// - Older Adyen integrations expect `[accepted]` in the answer's body.
///
/// ```
/// use webhook_guard::verify::{Adyen, AdyenItem, Verifier};
///
/// let adyen = Adyen::new(["44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056"]).unwrap();
/// let item = AdyenItem {
///     psp_reference: "7914073381342284",
///     merchant_account_code: "TestMerchant",
///     merchant_reference: "TestPayment-1407325143704",
///     value: 1130,
///     currency: "EUR",
///     event_code: "AUTHORISATION",
///     success: true,
///     ..AdyenItem::default()
/// };
/// assert_eq!(adyen.signature(&item), "coqCmt/IZ4E3CzPvMY8zTjQVL5hYJUiBRg8UU+iCWo0=");
/// let body = adyen.notification(&item);
/// let verified = adyen.verify(&[("", ""); 0], body.as_bytes(), chrono::Utc::now()).unwrap();
/// assert_eq!(verified.event_id.as_deref(), Some("AUTHORISATION:7914073381342284:true"));
/// ```
#[derive(Debug, Clone)]
pub struct Adyen {
    keys: Keys,
}

/// The signed fields of one notification item, to sign test notifications with
/// [`Adyen::signature`] and [`Adyen::notification`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdyenItem<'a> {
    /// `pspReference`.
    pub psp_reference: &'a str,
    /// `originalReference` (empty for most events).
    pub original_reference: &'a str,
    /// `merchantAccountCode`.
    pub merchant_account_code: &'a str,
    /// `merchantReference`.
    pub merchant_reference: &'a str,
    /// `amount.value`, in minor units.
    pub value: i64,
    /// `amount.currency`.
    pub currency: &'a str,
    /// `eventCode`.
    pub event_code: &'a str,
    /// `success`.
    pub success: bool,
}

impl Default for AdyenItem<'_> {
    fn default() -> Self {
        Self {
            psp_reference: "",
            original_reference: "",
            merchant_account_code: "",
            merchant_reference: "",
            value: 0,
            currency: "",
            event_code: "",
            success: true,
        }
    }
}

impl Adyen {
    /// What the constructor accepts as a secret: the endpoint's HMAC key as the
    /// Customer Area shows it. Adyen's verification recipe converts the key from
    /// hex to bytes, so only hexadecimal digits are accepted (its length is not
    /// published, so not checked), without surrounding whitespace (a trailing
    /// newline from an environment variable is refused).
    pub const SECRET_FORMAT: SecretFormat = SecretFormat::new("Adyen").hex();

    /// Adyen retries for 30 days.
    pub const RETRY_WINDOW: Duration = Duration::from_secs(30 * 24 * 3600);

    /// A verifier keyed with one or more HMAC keys, each written in hex as the
    /// Customer Area shows it (64 hex digits).
    ///
    /// # Errors
    /// [`KeyError::EmptySecret`] if no key is given or one is empty; the other
    /// [`KeyError`]s of [`Self::SECRET_FORMAT`] (surrounding whitespace, a
    /// character that is no hex digit); [`KeyError::BadEncoding`] for an odd
    /// number of hex digits.
    pub fn new<S: Into<Secret>>(secrets: impl IntoIterator<Item = S>) -> Result<Self, KeyError> {
        Ok(Self {
            keys: Keys::from_secrets_with(secrets, |s| {
                Self::SECRET_FORMAT.check(&s)?;
                hex::decode(s.expose())
                    .map(Secret::new)
                    .map_err(|_| KeyError::BadEncoding("hex (the HMAC key as Adyen shows it)"))
            })?,
        })
    }

    /// The `hmacSignature` of `item`, under the first key.
    pub fn signature(&self, item: &AdyenItem<'_>) -> String {
        let text = signed_text(&[
            item.psp_reference.as_bytes(),
            item.original_reference.as_bytes(),
            item.merchant_account_code.as_bytes(),
            item.merchant_reference.as_bytes(),
            item.value.to_string().as_bytes(),
            item.currency.as_bytes(),
            item.event_code.as_bytes(),
            if item.success { b"true" } else { b"false" },
        ]);
        common::base64_encode(&self.keys.sign_first(&[&text]))
    }

    /// A whole notification body carrying `item`, signed, as Adyen sends it (a test
    /// notification: `"live":"false"`).
    pub fn notification(&self, item: &AdyenItem<'_>) -> String {
        let json = serde_json::json!({
            "live": "false",
            "notificationItems": [{
                "NotificationRequestItem": {
                    "additionalData": { "hmacSignature": self.signature(item) },
                    "amount": { "currency": item.currency, "value": item.value },
                    "eventCode": item.event_code,
                    "eventDate": "2024-01-01T00:00:00+01:00",
                    "merchantAccountCode": item.merchant_account_code,
                    "merchantReference": item.merchant_reference,
                    "originalReference": item.original_reference,
                    "pspReference": item.psp_reference,
                    "success": if item.success { "true" } else { "false" },
                }
            }]
        });
        json.to_string()
    }
}

/// The eight values joined with `:`.
fn signed_text(parts: &[&[u8]; 8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(parts.iter().map(|p| p.len() + 1).sum());
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            out.push(b':');
        }
        out.extend_from_slice(part);
    }
    out
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(rename = "notificationItems", borrow)]
    items: Vec<Wrapper<'a>>,
}

#[derive(Deserialize)]
struct Wrapper<'a> {
    #[serde(rename = "NotificationRequestItem", borrow)]
    item: Item<'a>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Item<'a> {
    #[serde(borrow, default)]
    psp_reference: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    original_reference: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    merchant_account_code: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    merchant_reference: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    amount: Option<Amount<'a>>,
    #[serde(borrow, default)]
    event_code: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    success: Option<&'a RawValue>,
    #[serde(borrow, default)]
    additional_data: Option<AdditionalData<'a>>,
}

#[derive(Deserialize)]
struct Amount<'a> {
    #[serde(borrow, default)]
    value: Option<&'a RawValue>,
    #[serde(borrow, default)]
    currency: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct AdditionalData<'a> {
    #[serde(rename = "hmacSignature", borrow, default)]
    hmac_signature: Option<Cow<'a, str>>,
}

fn bad(reason: &'static str) -> VerifyError {
    VerifyError::MalformedBody(reason)
}

/// `amount.value` as written: a JSON integer (or a string of one).
fn value_text(raw: Option<&RawValue>) -> Result<String, VerifyError> {
    let Some(raw) = raw else {
        return Ok(String::new());
    };
    let text = raw.get();
    let digits = text
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(text);
    let body = digits.strip_prefix('-').unwrap_or(digits);
    if text == "null" {
        return Ok(String::new());
    }
    if body.is_empty() || body.len() > 19 || !body.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad("amount.value is not an integer"));
    }
    Ok(digits.to_owned())
}

/// `success` as `true` or `false`, from a string or a boolean.
fn success_text(raw: Option<&RawValue>) -> Result<&'static str, VerifyError> {
    match raw.map(RawValue::get) {
        Some("true" | "\"true\"") => Ok("true"),
        Some("false" | "\"false\"") => Ok("false"),
        _ => Err(bad("success is not true or false")),
    }
}

impl Verifier for Adyen {
    macros::verifier! {
        rekeyed(by new);
        verify |self, _headers, body, _now| {
            let envelope: Envelope<'_> = serde_json::from_slice(body)
                .map_err(|_| bad("not an Adyen notification with notificationItems"))?;
            let item =
                match envelope.items.as_slice() {
                    [one] => &one.item,
                    [] => return Err(bad("notificationItems is empty")),
                    _ => return Err(bad(
                        "several notificationItems in one request: one item per request is supported",
                    )),
                };
            let text = |v: &Option<Cow<'_, str>>| v.as_deref().unwrap_or("").to_owned();
            let psp = text(&item.psp_reference);
            let event_code = text(&item.event_code);
            let value = value_text(item.amount.as_ref().and_then(|a| a.value))?;
            let currency = item
                .amount
                .as_ref()
                .map(|a| text(&a.currency))
                .unwrap_or_default();
            let success = success_text(item.success)?;
            if psp.is_empty() || event_code.is_empty() {
                return Err(bad("pspReference or eventCode is missing"));
            }
            if [&psp, &event_code, &currency]
                .iter()
                .any(|f| f.contains(':'))
            {
                return Err(bad("pspReference, eventCode or currency holds a `:`"));
            }
            let signature = item
                .additional_data
                .as_ref()
                .and_then(|d| d.hmac_signature.as_deref())
                .ok_or(VerifyError::NoUsableSignature)?;
            let tag = common::base64_32(signature.as_bytes())
                .ok_or(bad("hmacSignature is not base64 of 32 bytes"))?;
            let signed = signed_text(&[
                psp.as_bytes(),
                text(&item.original_reference).as_bytes(),
                text(&item.merchant_account_code).as_bytes(),
                text(&item.merchant_reference).as_bytes(),
                value.as_bytes(),
                currency.as_bytes(),
                event_code.as_bytes(),
                success.as_bytes(),
            ]);
            self.keys.check(&[&signed], &[tag])?;
            let id = format!("{event_code}:{psp}:{success}");
            Ok(Verified::with_event_id(id))
        }
        event_meta: crate::meta::MetaExtractor::custom(meta);
        retry_window;
        answer_timeout: 10;
    }
}

/// `eventCode`, `eventDate`, and the payment the item is about: `originalReference`
/// for a modification, else `pspReference`.
fn meta(body: &[u8]) -> crate::meta::EventMeta {
    let item = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| {
            v.get("notificationItems")?
                .get(0)?
                .get("NotificationRequestItem")
                .cloned()
        });
    let field = |name: &str| {
        item.as_ref()?
            .get(name)?
            .as_str()
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    let object = field("originalReference").or_else(|| field("pspReference"));
    crate::meta::EventMeta::new(
        field("eventCode"),
        field("eventDate")
            .as_deref()
            .and_then(crate::meta::parse_time),
        object,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::testing::*;

    /// Adyen's documentation example key and item.
    const DOCS_KEY: &str = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";
    const DOCS_BODY: &str = r#"{"live":"false","notificationItems":[{"NotificationRequestItem":{"additionalData":{"hmacSignature":"coqCmt/IZ4E3CzPvMY8zTjQVL5hYJUiBRg8UU+iCWo0="},"amount":{"value":1130,"currency":"EUR"},"pspReference":"7914073381342284","eventCode":"AUTHORISATION","eventDate":"2019-05-06T17:15:34.121+02:00","merchantAccountCode":"TestMerchant","merchantReference":"TestPayment-1407325143704","paymentMethod":"visa","success":"true"}}]}"#;

    fn verify(key: &str, body: &str) -> Result<Verified, VerifyError> {
        Adyen::new([key])
            .unwrap()
            .verify(&[("", ""); 0], body.as_bytes(), Utc::now())
    }

    #[test]
    fn documentation_vector() {
        let v = verify(DOCS_KEY, DOCS_BODY).unwrap();
        assert_eq!(
            v.event_id.as_deref(),
            Some("AUTHORISATION:7914073381342284:true")
        );
        // Lowercase hex keys are the same key.
        assert!(verify(&DOCS_KEY.to_lowercase(), DOCS_BODY).is_ok());
        // A signed field changed: refused. An unsigned one: accepted (documented).
        let tampered = DOCS_BODY.replace("1130", "1131");
        assert_eq!(verify(DOCS_KEY, &tampered), Err(VerifyError::NoMatch));
        let moved = DOCS_BODY.replace("\"visa\"", "\"mc\"");
        assert!(verify(DOCS_KEY, &moved).is_ok());
        let meta = Adyen::new([DOCS_KEY])
            .unwrap()
            .event_meta()
            .unwrap()
            .extract(DOCS_BODY.as_bytes());
        assert_eq!(meta.event_type.as_deref(), Some("AUTHORISATION"));
        assert_eq!(meta.object.as_deref(), Some("7914073381342284"));
        assert!(meta.created_at.is_some());
    }

    #[test]
    fn sdk_vectors() {
        // adyen-node-api-library's HmacValidator test: CAPTURE with an
        // originalReference, key DFB1EB…, expected `xhpHvYq2…`.
        let node = Adyen::new(["DFB1EB5485895CFA84146406857104ABB4CBCABDC8AAF103A624C8F6A3EAAB00"])
            .unwrap();
        let item = AdyenItem {
            psp_reference: "pspReference",
            original_reference: "originalReference",
            merchant_account_code: "merchantAccount",
            merchant_reference: "reference",
            value: 1000,
            currency: "EUR",
            event_code: "CAPTURE",
            success: true,
        };
        assert_eq!(
            node.signature(&item),
            "xhpHvYq2u2Np0rstbZ6QjLGu7JWhvf7Iwaa6EviJSX0="
        );
        let body = node.notification(&item);
        assert!(node
            .verify(&[("", ""); 0], body.as_bytes(), Utc::now())
            .is_ok());
        // adyen-php-api-library: a zero-value REFUND under the docs key.
        let zero = AdyenItem {
            psp_reference: "7914073381342284",
            merchant_account_code: "TestMerchant",
            merchant_reference: "TestPayment-1407325143704",
            value: 0,
            currency: "EUR",
            event_code: "REFUND",
            ..AdyenItem::default()
        };
        assert_eq!(
            Adyen::new([DOCS_KEY]).unwrap().signature(&zero),
            "J7HhsgZo5KwqdB7LFZJV6rfQgp+RqC2kuYyw/3x3w+8="
        );
    }

    #[test]
    fn batches_and_bad_bodies_are_refused_clearly() {
        let item = DOCS_BODY
            .split_once("\"notificationItems\":[")
            .unwrap()
            .1
            .trim_end_matches("]}");
        let two = format!(r#"{{"live":"false","notificationItems":[{item},{item}]}}"#);
        assert_eq!(
            verify(DOCS_KEY, &two),
            Err(VerifyError::MalformedBody(
                "several notificationItems in one request: one item per request is supported"
            ))
        );
        let none = r#"{"live":"false","notificationItems":[]}"#;
        assert_eq!(
            verify(DOCS_KEY, none),
            Err(VerifyError::MalformedBody("notificationItems is empty"))
        );
        let unsigned = DOCS_BODY.replace("hmacSignature", "other");
        assert_eq!(
            verify(DOCS_KEY, &unsigned),
            Err(VerifyError::NoUsableSignature)
        );
        let float = DOCS_BODY.replace("1130", "11.30");
        assert!(matches!(
            verify(DOCS_KEY, &float),
            Err(VerifyError::MalformedBody(_))
        ));
        let maybe = DOCS_BODY.replace("\"success\":\"true\"", "\"success\":\"maybe\"");
        assert!(matches!(
            verify(DOCS_KEY, &maybe),
            Err(VerifyError::MalformedBody(_))
        ));
        let dup = DOCS_BODY.replace(
            "\"eventCode\":\"AUTHORISATION\"",
            "\"eventCode\":\"AUTHORISATION\",\"eventCode\":\"REFUND\"",
        );
        assert!(matches!(
            verify(DOCS_KEY, &dup),
            Err(VerifyError::MalformedBody(_))
        ));
        assert!(matches!(
            verify(DOCS_KEY, "[]"),
            Err(VerifyError::MalformedBody(_))
        ));
        assert_eq!(
            Adyen::new(["not hex"]).unwrap_err(),
            KeyError::BadCharacters {
                provider: "Adyen",
                expected: "hexadecimal digits"
            }
        );
        assert!(matches!(Adyen::new(["ABC"]), Err(KeyError::BadEncoding(_))));
        assert_eq!(Adyen::new([""]).unwrap_err(), KeyError::EmptySecret);
    }

    #[test]
    fn a_boolean_success_signs_as_its_text() {
        let body = DOCS_BODY.replace("\"success\":\"true\"", "\"success\":true");
        assert!(verify(DOCS_KEY, &body).is_ok());
        let rotated = Adyen::new(["00", DOCS_KEY]).unwrap();
        assert!(rotated
            .verify(&[("", ""); 0], DOCS_BODY.as_bytes(), Utc::now())
            .is_ok());
    }
}
