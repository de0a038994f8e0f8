//! Keys from who the caller really is, in a real Envoy: `jwt_authn` verifies tokens
//! signed in the test against a local JWKS and leaves their claims in dynamic metadata
//! (`payload_in_metadata`); the filter keys buckets by a claim read from there, and
//! never from the token itself.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
use serde_json::{Value, json};
use sluice_tests::{Client, Envoy, EnvoyOptions, Req};

const ISSUER: &str = "https://issuer.sluice.test";
const PAYLOAD: &str = "claims";

/// An ES256 signing key and the JWKS that publishes its public half.
struct Signer {
    key: EcdsaKeyPair,
    rng: SystemRandom,
}

impl Signer {
    fn new() -> Signer {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap();
        Signer { key, rng }
    }

    fn jwks(&self) -> String {
        // An uncompressed P-256 point: 0x04, then x and y, 32 bytes each.
        let point = self.key.public_key().as_ref();
        json!({"keys": [{
            "kty": "EC", "crv": "P-256", "alg": "ES256", "kid": "test", "use": "sig",
            "x": URL_SAFE_NO_PAD.encode(&point[1..33]),
            "y": URL_SAFE_NO_PAD.encode(&point[33..65]),
        }]})
        .to_string()
    }

    /// A compact JWS over `claims` (with the issuer and a far expiry added).
    fn token(&self, claims: Value) -> String {
        let header = json!({"alg": "ES256", "typ": "JWT", "kid": "test"});
        let mut claims = claims;
        claims["iss"] = json!(ISSUER);
        claims["exp"] = json!(4_102_444_800u64); // 2100-01-01
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let signature = self.key.sign(&self.rng, signing_input.as_bytes()).unwrap();
        format!(
            "{signing_input}.{}",
            URL_SAFE_NO_PAD.encode(signature.as_ref())
        )
    }
}

/// The same claims with no signature at all (`alg: none`).
fn unsigned_token(claims: Value) -> String {
    let header = json!({"alg": "none", "typ": "JWT"});
    let mut claims = claims;
    claims["iss"] = json!(ISSUER);
    format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    )
}

/// `jwt_authn` with one provider: `/strict/` requires a valid token; `/lenient/` verifies
/// one when present but lets the request on whatever happens (only a valid token leaves
/// claims in metadata).
fn jwt_authn(jwks: &str) -> Value {
    json!({
        "name": "envoy.filters.http.jwt_authn",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication",
            "providers": {"test": {
                "issuer": ISSUER,
                "local_jwks": {"inline_string": jwks},
                "payload_in_metadata": PAYLOAD,
                "forward": true,
            }},
            "rules": [
                {"match": {"prefix": "/strict/"}, "requires": {"provider_name": "test"}},
                {"match": {"prefix": "/lenient/"}, "requires": {"requires_any": {"requirements": [
                    {"provider_name": "test"}, {"allow_missing_or_failed": {}},
                ]}}},
            ],
        },
    })
}

fn claim(path: &[&str]) -> Value {
    let mut full = vec![PAYLOAD];
    full.extend_from_slice(path);
    json!({"metadata": {"filter": "envoy.filters.http.jwt_authn", "path": full}})
}

fn bearer(path: &str, token: &str) -> Req {
    Req::get(path).header("authorization", format!("Bearer {token}"))
}

#[test]
fn verified_claims_key_buckets_and_forged_or_unsigned_tokens_spend_no_one_s() {
    let signer = Signer::new();
    let forger = Signer::new();
    let envoy = Envoy::start(EnvoyOptions {
        rules: json!([
            {"name": "per-subject", "key": claim(&["sub"]),
             "key_missing": {"fallback": "anonymous"},
             "limits": [{"requests": 3, "period": "hour"}]},
            // A match condition on a claim: only the `beta` plan is limited here.
            {"name": "beta-group", "match": {"path_prefix": "/strict/beta",
               "values": [{"value": claim(&["plan"]), "equals": "beta"}]},
             "key": {"composite": [claim(&["org", "id"]), "path"]},
             "limits": [{"requests": 1, "period": "hour"}]},
        ]),
        filters_before: vec![jwt_authn(&signer.jwks())],
        ..Default::default()
    });
    let client = Client::connect(envoy.listener_addr(), 2);
    // Sorted: the client's two connections answer in either order.
    let statuses = |req: &Req, n: usize| -> Vec<u16> {
        let mut statuses: Vec<u16> = client
            .run((0..n).map(|_| req.clone()))
            .iter()
            .map(|r| r.status)
            .collect();
        statuses.sort_unstable();
        statuses
    };

    // A claim-keyed rule limits per claim value.
    let alice = signer.token(json!({"sub": "alice"}));
    assert_eq!(
        statuses(&bearer("/strict/a", &alice), 4),
        [200, 200, 200, 429]
    );
    let denied = client.send(bearer("/strict/a", &alice));
    assert_eq!(denied.status, 429);
    assert_eq!(denied.header("x-sluice-rule"), Some("per-subject"));
    assert_eq!(denied.header("x-sluice-limit"), Some("per-subject"));
    let bob = signer.token(json!({"sub": "bob"}));
    assert_eq!(
        statuses(&bearer("/strict/a", &bob), 1),
        [200],
        "bob has his own bucket"
    );

    // A forged signature claiming to be carol is refused by jwt_authn before Sluice, and
    // spends nothing of carol's.
    let forged_carol = forger.token(json!({"sub": "carol"}));
    assert_eq!(statuses(&bearer("/strict/a", &forged_carol), 5), [401; 5]);
    let carol = signer.token(json!({"sub": "carol"}));
    assert_eq!(
        statuses(&bearer("/strict/a", &carol), 4),
        [200, 200, 200, 429]
    );

    // Where jwt_authn lets a failed token on, its claims are never read: a forged or an
    // unsigned token naming bob draws from the fallback bucket, not bob's (he has 2 left),
    // and not alice's (she has none).
    let forged_alice = forger.token(json!({"sub": "alice"}));
    let unsigned_bob = unsigned_token(json!({"sub": "bob"}));
    assert_eq!(
        statuses(&bearer("/lenient/a", &forged_alice), 2),
        [200, 200],
        "alice's bucket is empty: these were not charged to her"
    );
    assert_eq!(
        statuses(&bearer("/lenient/a", &unsigned_bob), 2),
        [200, 429]
    );
    assert_eq!(
        statuses(&Req::get("/lenient/a"), 1),
        [429],
        "no token: the same fallback"
    );
    assert_eq!(
        statuses(&bearer("/lenient/a", &bob), 3),
        [200, 200, 429],
        "bob's own bucket was untouched by tokens that only named him"
    );
    assert_eq!(envoy.counter("wasmcustom.sluice_key_fallback_total"), 5);

    // A nested claim in a composite key, and a claim as a match condition.
    let beta = |org: &str| {
        signer.token(json!({"sub": format!("beta-{org}"), "plan": "beta", "org": {"id": org}}))
    };
    let staff_only = signer.token(json!({"sub": "dave", "plan": "pro", "org": {"id": "o1"}}));
    assert_eq!(
        statuses(&bearer("/strict/beta", &beta("o1")), 2),
        [200, 429]
    );
    assert_eq!(
        client
            .send(bearer("/strict/beta", &beta("o1")))
            .header("x-sluice-rule"),
        Some("beta-group")
    );
    assert_eq!(
        statuses(&bearer("/strict/beta", &beta("o2")), 1),
        [200],
        "per org"
    );
    assert_eq!(
        statuses(&bearer("/strict/beta", &staff_only), 2),
        [200, 200],
        "not in `beta`: the rule does not match"
    );
}
