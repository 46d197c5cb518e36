//! The AWS Lambda integration, driven with the events each HTTP source sends: API
//! Gateway REST (v1) and HTTP (v2) APIs, a Function URL and an ALB, as the Lambda
//! runtime deserializes them (`LambdaRequest`), with a Lambda context whose
//! deadline the test sets.

use crate::support::web::{body, guard, sign, SIGNATURE_HEADER};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use chrono::{TimeDelta, Utc};
use lambda_http::request::LambdaRequest;
use lambda_http::{Body, Context, Request, RequestExt as _, Response, Service as _};
use webhook_guard::integrations::lambda;
use webhook_guard::store::RecordState;
use webhook_guard::{HandlerError, MemoryStore, OwnedEvent, WebhookGuard};

/// The four HTTP event sources of a Lambda function.
#[derive(Clone, Copy, Debug)]
enum Source {
    RestApi,
    HttpApi,
    FunctionUrl,
    Alb,
}

const SOURCES: [Source; 4] = [
    Source::RestApi,
    Source::HttpApi,
    Source::FunctionUrl,
    Source::Alb,
];

/// An API Gateway REST API (payload 1.0) proxy event, as API Gateway sends it.
const REST_API: &str = r#"{
  "resource": "/webhooks",
  "path": "/webhooks",
  "httpMethod": "POST",
  "headers": {
    "Accept": "*/*; q=0.5, application/xml",
    "Content-Type": "application/json; charset=utf-8",
    "Host": "gy415nuibc.execute-api.us-east-1.amazonaws.com",
    "User-Agent": "Stripe/1.0 (+https://stripe.com/docs/webhooks)",
    "X-Amzn-Trace-Id": "Root=1-6751c6a0-0a1b2c3d4e5f60718293a4b5",
    "X-Forwarded-For": "54.187.174.169",
    "X-Forwarded-Port": "443",
    "X-Forwarded-Proto": "https"
  },
  "multiValueHeaders": {
    "Accept": ["*/*; q=0.5, application/xml"],
    "Content-Type": ["application/json; charset=utf-8"],
    "Host": ["gy415nuibc.execute-api.us-east-1.amazonaws.com"],
    "User-Agent": ["Stripe/1.0 (+https://stripe.com/docs/webhooks)"],
    "X-Amzn-Trace-Id": ["Root=1-6751c6a0-0a1b2c3d4e5f60718293a4b5"],
    "X-Forwarded-For": ["54.187.174.169"],
    "X-Forwarded-Port": ["443"],
    "X-Forwarded-Proto": ["https"]
  },
  "queryStringParameters": null,
  "multiValueQueryStringParameters": null,
  "pathParameters": null,
  "stageVariables": null,
  "requestContext": {
    "resourceId": "roq9wj",
    "resourcePath": "/webhooks",
    "httpMethod": "POST",
    "extendedRequestId": "CQbFzFhYoAMEYpQ=",
    "requestTime": "05/Dec/2026:15:00:00 +0000",
    "path": "/prod/webhooks",
    "accountId": "123456789012",
    "protocol": "HTTP/1.1",
    "stage": "prod",
    "domainPrefix": "gy415nuibc",
    "requestTimeEpoch": 1796482800000,
    "requestId": "c6af9ac6-7b61-11e6-9a41-93e8deadbeef",
    "identity": {
      "cognitoIdentityPoolId": null,
      "accountId": null,
      "cognitoIdentityId": null,
      "caller": null,
      "sourceIp": "54.187.174.169",
      "principalOrgId": null,
      "accessKey": null,
      "cognitoAuthenticationType": null,
      "cognitoAuthenticationProvider": null,
      "userArn": null,
      "userAgent": "Stripe/1.0 (+https://stripe.com/docs/webhooks)",
      "user": null
    },
    "domainName": "gy415nuibc.execute-api.us-east-1.amazonaws.com",
    "apiId": "gy415nuibc"
  },
  "body": null,
  "isBase64Encoded": false
}"#;

/// An API Gateway HTTP API (payload 2.0) event.
const HTTP_API: &str = r#"{
  "version": "2.0",
  "routeKey": "POST /webhooks",
  "rawPath": "/webhooks",
  "rawQueryString": "",
  "headers": {
    "accept": "*/*; q=0.5, application/xml",
    "content-type": "application/json; charset=utf-8",
    "host": "r3pmxmplak.execute-api.us-east-2.amazonaws.com",
    "user-agent": "Stripe/1.0 (+https://stripe.com/docs/webhooks)",
    "x-amzn-trace-id": "Root=1-6751c6a0-0a1b2c3d4e5f60718293a4b5",
    "x-forwarded-for": "54.187.174.169",
    "x-forwarded-port": "443",
    "x-forwarded-proto": "https"
  },
  "requestContext": {
    "accountId": "123456789012",
    "apiId": "r3pmxmplak",
    "domainName": "r3pmxmplak.execute-api.us-east-2.amazonaws.com",
    "domainPrefix": "r3pmxmplak",
    "http": {
      "method": "POST",
      "path": "/webhooks",
      "protocol": "HTTP/1.1",
      "sourceIp": "54.187.174.169",
      "userAgent": "Stripe/1.0 (+https://stripe.com/docs/webhooks)"
    },
    "requestId": "JKJaXmPLvHcESHA=",
    "routeKey": "POST /webhooks",
    "stage": "$default",
    "time": "05/Dec/2026:15:00:00 +0000",
    "timeEpoch": 1796482800000
  },
  "isBase64Encoded": false
}"#;

/// A Lambda Function URL event (the payload 2.0 format, from a `lambda-url` host,
/// with no authorizer).
const FUNCTION_URL: &str = r#"{
  "version": "2.0",
  "routeKey": "$default",
  "rawPath": "/webhooks",
  "rawQueryString": "",
  "headers": {
    "accept": "*/*; q=0.5, application/xml",
    "content-type": "application/json; charset=utf-8",
    "host": "a1b2c3d4e5f6g7h8i9j0kl3mno.lambda-url.us-east-1.on.aws",
    "user-agent": "Stripe/1.0 (+https://stripe.com/docs/webhooks)",
    "x-amzn-tls-cipher-suite": "ECDHE-RSA-AES128-GCM-SHA256",
    "x-amzn-tls-version": "TLSv1.2",
    "x-amzn-trace-id": "Root=1-6751c6a0-0a1b2c3d4e5f60718293a4b5",
    "x-forwarded-for": "54.187.174.169",
    "x-forwarded-port": "443",
    "x-forwarded-proto": "https"
  },
  "requestContext": {
    "accountId": "anonymous",
    "apiId": "a1b2c3d4e5f6g7h8i9j0kl3mno",
    "domainName": "a1b2c3d4e5f6g7h8i9j0kl3mno.lambda-url.us-east-1.on.aws",
    "domainPrefix": "a1b2c3d4e5f6g7h8i9j0kl3mno",
    "http": {
      "method": "POST",
      "path": "/webhooks",
      "protocol": "HTTP/1.1",
      "sourceIp": "54.187.174.169",
      "userAgent": "Stripe/1.0 (+https://stripe.com/docs/webhooks)"
    },
    "requestId": "9b3b9a4e-4a8c-4b8d-8c1f-2f7c6d0e5a11",
    "routeKey": "$default",
    "stage": "$default",
    "time": "05/Dec/2026:15:00:00 +0000",
    "timeEpoch": 1796482800000
  },
  "isBase64Encoded": false
}"#;

/// An Application Load Balancer target group event (single-value headers).
const ALB: &str = r#"{
  "requestContext": {
    "elb": {
      "targetGroupArn": "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/webhooks/6d0ecf831eec9f09"
    }
  },
  "httpMethod": "POST",
  "path": "/webhooks",
  "queryStringParameters": {},
  "headers": {
    "accept": "*/*; q=0.5, application/xml",
    "content-type": "application/json; charset=utf-8",
    "host": "webhooks-1334523864.us-east-1.elb.amazonaws.com",
    "user-agent": "Stripe/1.0 (+https://stripe.com/docs/webhooks)",
    "x-amzn-trace-id": "Root=1-6751c6a0-0a1b2c3d4e5f60718293a4b5",
    "x-forwarded-for": "54.187.174.169",
    "x-forwarded-port": "443",
    "x-forwarded-proto": "https"
  },
  "body": "",
  "isBase64Encoded": false
}"#;

/// The JSON event `source` sends for a POST of `body` with `signature`: the body as
/// text, or base64-encoded with `isBase64Encoded` set.
fn event_json(source: Source, body: &[u8], signature: &str, base64: bool) -> String {
    let template = match source {
        Source::RestApi => REST_API,
        Source::HttpApi => HTTP_API,
        Source::FunctionUrl => FUNCTION_URL,
        Source::Alb => ALB,
    };
    let mut event: serde_json::Value = serde_json::from_str(template).unwrap();
    let text = if base64 {
        base64::engine::general_purpose::STANDARD.encode(body)
    } else {
        String::from_utf8(body.to_vec()).unwrap()
    };
    event["body"] = text.into();
    event["isBase64Encoded"] = base64.into();
    event["headers"][SIGNATURE_HEADER] = signature.into();
    if let Source::RestApi = source {
        event["multiValueHeaders"][SIGNATURE_HEADER] = serde_json::json!([signature]);
    }
    serde_json::to_string(&event).unwrap()
}

/// The request the Lambda runtime hands the function for `json`, with a context
/// whose deadline is `deadline_ms` (ms since the epoch).
fn request(source: Source, json: &str, deadline_ms: i64) -> Request {
    let event: LambdaRequest = serde_json::from_str(json).unwrap();
    let kind_ok = matches!(
        (source, &event),
        (Source::RestApi, LambdaRequest::ApiGatewayV1(_))
            | (
                Source::HttpApi | Source::FunctionUrl,
                LambdaRequest::ApiGatewayV2(_)
            )
            | (Source::Alb, LambdaRequest::Alb(_))
    );
    assert!(kind_ok, "{source:?} read as {event:?}");
    let mut context = Context::default();
    context.request_id = "8476a536-e9f4-11e8-9739-2dfe598c3fcd".into();
    context.deadline = u64::try_from(deadline_ms).unwrap();
    Request::from(event).with_lambda_context(context)
}

/// A delivery of `body` signed over `signed`, from `source`, with 30 s left.
fn delivery(source: Source, body: &[u8], signed: &[u8], base64: bool) -> Request {
    let json = event_json(source, body, &sign(signed), base64);
    let deadline = Utc::now() + TimeDelta::seconds(30);
    request(source, &json, deadline.timestamp_millis())
}

fn json(response: &Response<Body>) -> serde_json::Value {
    serde_json::from_slice(response.body()).unwrap()
}

/// A guarded function counting its runs; each run checks that it got the body the
/// test sent.
fn function(
    guard: WebhookGuard,
    sent: Vec<u8>,
) -> (
    impl lambda_http::Service<Request, Response = Response<Body>, Error = std::convert::Infallible>,
    Arc<AtomicUsize>,
) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let service = lambda::guarded(guard, move |event: OwnedEvent| {
        let (counter, sent) = (counter.clone(), sent.clone());
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            assert_eq!(event.body(), &sent[..], "the handler sees the exact bytes");
            Ok::<_, HandlerError>(())
        }
    });
    (service, runs)
}

/// Every source, with a text body and with a base64-encoded one: the signature
/// over the exact (decoded) bytes verifies, the first delivery is processed and the
/// second is a duplicate.
#[tokio::test]
async fn every_source_is_processed_once_then_duplicate_with_text_and_base64_bodies() {
    for source in SOURCES {
        for base64 in [false, true] {
            let id = format!("evt_{source:?}_{base64}");
            // Spacing and a trailing newline a re-serialization would not keep.
            let mut sent = body(&id);
            sent.splice(1..1, *b" ");
            sent.extend_from_slice(b"\n");
            let (mut service, runs) = function(guard(MemoryStore::new()), sent.clone());

            let first = service
                .call(delivery(source, &sent, &sent, base64))
                .await
                .unwrap();
            assert_eq!(first.status(), 200, "{source:?} base64={base64}");
            assert_eq!(json(&first)["outcome"], "processed");
            assert_eq!(json(&first)["id"], id.as_str());
            assert_eq!(first.headers()["content-type"], "application/json");

            let again = service
                .call(delivery(source, &sent, &sent, base64))
                .await
                .unwrap();
            assert_eq!(again.status(), 200, "{source:?} base64={base64}");
            assert_eq!(json(&again)["outcome"], "duplicate");
            assert_eq!(runs.load(Ordering::SeqCst), 1, "{source:?} base64={base64}");
        }
    }
}

/// A bad signature is answered 401 from every source and runs nothing; for a
/// base64-encoded event, a signature made over the base64 text (not the bytes it
/// encodes) is refused too.
#[tokio::test]
async fn a_bad_signature_is_refused_401_from_every_source() {
    for source in SOURCES {
        let sent = body("evt_forged");
        let (mut service, runs) = function(guard(MemoryStore::new()), sent.clone());

        let forged = service
            .call(delivery(source, &sent, b"another body", false))
            .await
            .unwrap();
        assert_eq!(forged.status(), 401, "{source:?}");
        assert_eq!(json(&forged)["outcome"], "rejected");

        let encoded = base64::engine::general_purpose::STANDARD.encode(&sent);
        let over_text = service
            .call(delivery(source, &sent, encoded.as_bytes(), true))
            .await
            .unwrap();
        assert_eq!(over_text.status(), 401, "{source:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 0, "{source:?}");

        // The same event signed over its bytes goes through.
        let signed = service
            .call(delivery(source, &sent, &sent, true))
            .await
            .unwrap();
        assert_eq!(signed.status(), 200, "{source:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{source:?}");
    }
}

/// An invocation that runs out its time (the environment frozen or killed at the
/// deadline: nothing is released) holds the id until its deadline and no longer,
/// even after its handler renewed the lease; a redelivery before the deadline is
/// answered `InProgress`, one after it takes the claim over and runs the handler.
#[tokio::test]
async fn a_timed_out_invocation_holds_the_id_until_its_deadline_only() {
    let guard = guard(MemoryStore::new());
    assert_eq!(guard.lease(), Duration::from_secs(300), "the default lease");
    let sent = body("evt_timeout");
    let signature = sign(&sent);
    let deadline = Utc::now() + TimeDelta::milliseconds(1500);
    let json = event_json(Source::HttpApi, &sent, &signature, false);

    // The first invocation: its handler waits for `go`, renews the lease, then hangs.
    let (started, running) = tokio::sync::oneshot::channel();
    let (go, ready) = tokio::sync::oneshot::channel::<()>();
    let (renewed, renewing) = tokio::sync::oneshot::channel();
    let mut invocation = Box::pin(lambda::handle_request(
        &guard,
        request(Source::HttpApi, &json, deadline.timestamp_millis()),
        move |event: OwnedEvent| async move {
            started.send(()).unwrap();
            ready.await.unwrap();
            event.renew_lease().await.unwrap();
            renewed.send(()).unwrap();
            std::future::pending::<Result<(), HandlerError>>().await
        },
    ));
    tokio::select! {
        _ = &mut invocation => panic!("the hung handler answered"),
        started = running => started.unwrap(),
    }
    let claimed = guard.inspect("evt_timeout").await.unwrap().unwrap();
    go.send(()).unwrap();
    tokio::select! {
        _ = &mut invocation => panic!("the hung handler answered"),
        renewed = renewing => renewed.unwrap(),
    }
    // Frozen, as Lambda leaves it at the deadline: no drop, nothing released.
    std::mem::forget(invocation);

    let record = guard.inspect("evt_timeout").await.unwrap().unwrap();
    for (when, record) in [("claimed", &claimed), ("renewed", &record)] {
        assert_eq!(record.state, RecordState::InProgress, "{when}");
        assert!(
            record.lease_until <= deadline,
            "{when}: lease until {} past the deadline {deadline}",
            record.lease_until
        );
        assert!(
            record.lease_until > Utc::now(),
            "{when}: the lease holds until the deadline"
        );
    }

    // A retry within the deadline finds the claim held.
    let later_deadline = (Utc::now() + TimeDelta::seconds(30)).timestamp_millis();
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = |runs: Arc<AtomicUsize>| {
        move |_event: OwnedEvent| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, HandlerError>(())
        }
    };
    let retry = request(Source::HttpApi, &json, later_deadline);
    let held = lambda::handle_request(&guard, retry, handler(runs.clone())).await;
    assert_eq!(held.status(), 409);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(held.body()).unwrap()["outcome"],
        "in_progress"
    );
    let retry_after: u64 = held.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        retry_after <= 2,
        "Retry-After {retry_after}s, past the deadline"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    // Past the deadline, the provider's retry takes the claim over.
    let past = (deadline - Utc::now()).to_std().unwrap_or_default() + Duration::from_millis(50);
    tokio::time::sleep(past).await;
    let retry = request(Source::HttpApi, &json, later_deadline);
    let taken = lambda::handle_request(&guard, retry, handler(runs.clone())).await;
    assert_eq!(taken.status(), 200);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(taken.body()).unwrap()["outcome"],
        "processed"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let record = guard.inspect("evt_timeout").await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Completed);
    assert_eq!(record.attempts, 2, "the second claim of the id");
}

/// A request with no Lambda context keeps the guard's whole lease.
#[tokio::test]
async fn without_a_context_the_claim_keeps_the_guards_lease() {
    let guard = guard(MemoryStore::new());
    let sent = body("evt_no_context");
    let json = event_json(Source::Alb, &sent, &sign(&sent), false);
    let event: LambdaRequest = serde_json::from_str(&json).unwrap();
    let (started, running) = tokio::sync::oneshot::channel();
    let before = Utc::now();
    let mut invocation = Box::pin(lambda::handle_request(
        &guard,
        Request::from(event),
        move |_event: OwnedEvent| async move {
            started.send(()).unwrap();
            std::future::pending::<Result<(), HandlerError>>().await
        },
    ));
    tokio::select! {
        _ = &mut invocation => panic!("the hung handler answered"),
        started = running => started.unwrap(),
    }
    std::mem::forget(invocation);
    let record = guard.inspect("evt_no_context").await.unwrap().unwrap();
    let lease = TimeDelta::from_std(guard.lease()).unwrap();
    assert!(record.lease_until >= before + lease - TimeDelta::seconds(1));
}
