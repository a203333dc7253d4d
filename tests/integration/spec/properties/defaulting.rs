//! Validation and defaulting never panic on arbitrary specs; the defaults patch, applied, is
//! exactly `with_defaults(spec)` and leaves nothing to do; a valid Balancer with its optional
//! fields dropped is still valid once mutated.

use balancer::api::conversion::{PRESERVED_ANNOTATION, Version};
use balancer::spec::ObjectName;
use balancer::spec::admit;
use balancer::webhook::admission::{self, MAX_WARNINGS, Outcome, Webhook};
use balancer::webhook::review::MAX_UID_BYTES;
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{Value, json};

use super::conversion::{
    DERIVED_STATUS, V1ALPHA1, V1BETA1, any_desired_version, any_object, arb_v1alpha1_object, arb_v1alpha1_spec,
    arb_v1beta1_object, beta_only, check_conversion, conversion_envelope, convert_value, without_derived_status,
};
use super::review::{
    any_operation, any_webhook, check_answer, checked, envelope, hostile_object, hostile_text, object, review,
    spec_like_json, spec_of, validate_as, wire_patch,
};
use super::strategies::{
    CASES, DEFAULTS, PortDrop, arb_json, arb_spec, arb_text, defaulted, defaults_patch, drop_optional_fields,
    readable_spec, replace_somewhere, valid_balancer,
};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn validation_and_defaulting_never_panic(
        name in option::of(arb_text()),
        generate_name in option::of(arb_text()),
        spec in arb_spec(),
    ) {
        let meta = (name, generate_name);
        let report = validate_as(&meta, &spec);
        prop_assert_eq!(report.is_valid(), report.errors.is_empty());
        prop_assert_eq!(&validate_as(&meta, &spec), &report, "validation is deterministic");
        for error in &report.errors {
            prop_assert!(
                error.field.starts_with("metadata.") || error.field.starts_with("spec."),
                "unexpected field path {:?}", error.field
            );
            prop_assert!(!error.detail.is_empty());
        }
        let defaulted = defaulted(&spec);
        let _ = validate_as(&meta, &defaulted);
        let patch = defaults_patch(&spec);
        prop_assert!(patch.0.len() <= 4 + 4 * spec.ports.len() + 3 * spec.backends.len());
        prop_assert!(defaults_patch(&defaulted).0.is_empty(), "with_defaults leaves nothing to default");
        // admit is exactly: defaults, then the rules.
        match admit(ObjectName::from_meta(meta.0.as_deref(), meta.1.as_deref()), spec.clone(), &DEFAULTS) {
            Ok(admitted) => {
                prop_assert_eq!(&*admitted, &defaulted);
                prop_assert_eq!(admitted.warnings().to_vec(), validate_as(&meta, &defaulted).warnings);
                prop_assert_eq!(admitted.replicas(), defaulted.replicas.unwrap_or_default());
            }
            Err(report) => prop_assert_eq!(report, validate_as(&meta, &defaulted)),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn defaults_patch_applies_matches_with_defaults_and_is_idempotent(spec in readable_spec()) {
        let original = object("p", &spec);
        prop_assert_eq!(&spec_of(&original), &spec, "the spec survives a JSON round trip");

        let mut doc = original.clone();
        let patch = defaults_patch(&spec);
        json_patch::patch(&mut doc, &patch.0)
            .map_err(|e| TestCaseError::fail(format!("the defaults patch does not apply: {e}")))?;
        let patched = spec_of(&doc);
        prop_assert_eq!(&patched, &defaulted(&spec));
        prop_assert!(defaults_patch(&patched).0.is_empty(), "second patch: {:?}", defaults_patch(&patched));
        // A spec within the list bounds always gets a replica count.
        prop_assert_eq!(patched.replicas, Some(spec.replicas.unwrap_or(DEFAULTS.replicas)));

        // The patch only touches the spec.
        prop_assert_eq!(&doc["metadata"], &original["metadata"]);
        prop_assert_eq!(&doc["apiVersion"], &original["apiVersion"]);
        prop_assert_eq!(&doc["kind"], &original["kind"]);
    }

    #[test]
    fn the_mutating_webhook_is_idempotent(spec in readable_spec()) {
        let original = object("p", &spec);
        let first = review(Webhook::Mutate, &envelope("uid-1", "CREATE", original.clone()))
            .map_err(|e| TestCaseError::fail(format!("refused as a bad request: {e}")))?;
        let wire = check_answer(&first)?;
        let patch = wire_patch(&wire);
        prop_assert_eq!(first.outcome == Outcome::Patched, !patch.0.is_empty());
        let mut doc = original;
        json_patch::patch(&mut doc, &patch.0)
            .map_err(|e| TestCaseError::fail(format!("the webhook's patch does not apply: {e}")))?;
        prop_assert_eq!(&spec_of(&doc), &defaulted(&spec));

        let second = review(Webhook::Mutate, &envelope("uid-2", "UPDATE", doc))
            .map_err(|e| TestCaseError::fail(format!("refused as a bad request: {e}")))?;
        let wire = check_answer(&second)?;
        prop_assert_eq!(second.outcome, Outcome::Allowed);
        prop_assert!(wire.pointer("/response/patch").is_none());
    }
}

fn port_drops() -> impl Strategy<Value = Vec<PortDrop>> {
    vec((0u8..3, 0u8..3).prop_map(|(protocol, target_port)| PortDrop { protocol, target_port }), 8)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn valid_balancers_are_valid(valid in valid_balancer()) {
        let report = balancer::spec::validate(ObjectName::Name(&valid.name), &valid.spec, &DEFAULTS);
        prop_assert!(report.is_valid(), "{:#?}", report.errors);
        prop_assert!(defaults_patch(&valid.spec).0.is_empty(), "every optional field is set");
        let admitted = admit(ObjectName::Name(&valid.name), valid.spec.clone(), &DEFAULTS)
            .map_err(|r| TestCaseError::fail(format!("not admitted: {:?}", r.errors)))?;
        prop_assert_eq!(&*admitted, &valid.spec);
    }

    #[test]
    fn a_mutated_valid_balancer_stays_valid(
        valid in valid_balancer(),
        ports in port_drops(),
        weights in vec(any::<bool>(), 8),
        single_port_name in any::<bool>(),
        replicas in any::<bool>(),
    ) {
        let dropped = drop_optional_fields(&valid.spec, &ports, &weights, single_port_name, replicas);
        let defaulted = defaulted(&dropped);
        let report = balancer::spec::validate(ObjectName::Name(&valid.name), &defaulted, &DEFAULTS);
        prop_assert!(report.is_valid(), "{:#?}", report.errors);

        // The same through both webhooks, in the order the API server calls them.
        let mut doc = object(&valid.name, &dropped);
        let mutated = review(Webhook::Mutate, &envelope("uid-m", "CREATE", doc.clone()))
            .map_err(|e| TestCaseError::fail(format!("refused as a bad request: {e}")))?;
        let wire = check_answer(&mutated)?;
        json_patch::patch(&mut doc, &wire_patch(&wire).0)
            .map_err(|e| TestCaseError::fail(format!("the webhook's patch does not apply: {e}")))?;
        prop_assert_eq!(&spec_of(&doc), &defaulted);
        let validated = review(Webhook::Validate, &envelope("uid-v", "CREATE", doc))
            .map_err(|e| TestCaseError::fail(format!("refused as a bad request: {e}")))?;
        check_answer(&validated)?;
        prop_assert_eq!(validated.outcome, Outcome::Allowed);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn review_survives_arbitrary_bytes(webhook in any_webhook(), body in vec(any::<u8>(), 0..512)) {
        checked(admission::review(webhook, &body, &DEFAULTS))?;
    }

    #[test]
    fn review_survives_arbitrary_json_bodies(webhook in any_webhook(), body in arb_json()) {
        checked(review(webhook, &body))?;
    }

    /// Any spec, well-formed or not, in a well-formed review is answered, never refused as a bad request.
    #[test]
    fn review_answers_any_spec_and_echoes_the_uid(
        webhook in any_webhook(),
        uid in prop_oneof!["[ -~]{1,36}", ".{1,8}"],
        operation in any_operation(),
        name in "[a-z][a-z0-9-]{0,10}",
        spec in prop_oneof![arb_json(), spec_like_json()],
    ) {
        let object = json!({
            "apiVersion": "exposer.hliangzhao.io/v1beta1",
            "kind": "Balancer",
            "metadata": {"name": name, "namespace": "default"},
            "spec": spec,
        });
        let answer = review(webhook, &envelope(&uid, operation, object.clone()))
            .map_err(|e| TestCaseError::fail(format!("refused as a bad request: {e}")))?;
        let wire = check_answer(&answer)?;
        prop_assert_eq!(wire.pointer("/response/uid"), Some(&json!(uid)));

        let writes = matches!(operation, "CREATE" | "UPDATE");
        match balancer::spec::parse_spec(&object) {
            _ if !writes => prop_assert_eq!(answer.outcome, Outcome::Allowed),
            Err(error) => {
                prop_assert_eq!(answer.outcome, Outcome::Denied);
                let message = &answer.review.response.as_ref().unwrap().result.message;
                prop_assert_eq!(message, &balancer::spec::denial_message(&name, &[error]));
            }
            Ok(parsed) => match webhook {
                Webhook::Validate => {
                    // The validating webhook judges the spec as it will be stored: defaulted.
                    let (expected, report_warnings) = match admit(ObjectName::Name(&name), parsed, &DEFAULTS) {
                        Ok(admitted) => (Outcome::Allowed, admitted.warnings().to_vec()),
                        Err(report) => (Outcome::Denied, report.warnings),
                    };
                    prop_assert_eq!(answer.outcome, expected);
                    let warnings = answer.review.response.as_ref().unwrap().warnings.clone().unwrap_or_default();
                    let listed = report_warnings.len().min(MAX_WARNINGS);
                    prop_assert_eq!(&warnings[..listed], &report_warnings[..listed]);
                    if report_warnings.len() > MAX_WARNINGS {
                        let more = format!("and {} more warnings", report_warnings.len() - MAX_WARNINGS);
                        prop_assert_eq!(warnings.last(), Some(&more));
                    }
                }
                Webhook::Mutate => {
                    let patch = defaults_patch(&parsed);
                    let expected = if patch.0.is_empty() { Outcome::Allowed } else { Outcome::Patched };
                    prop_assert_eq!(answer.outcome, expected);
                    prop_assert_eq!(wire_patch(&wire), patch);
                }
            },
        }
    }

    /// A well-formed review with any one part replaced by arbitrary JSON: answered or refused,
    /// never a panic or a server error, and an answer carries the uid the request had.
    #[test]
    fn review_survives_any_part_of_the_envelope_replaced(
        webhook in any_webhook(),
        operation in any_operation(),
        spec in arb_spec(),
        which in any::<Index>(),
        with in arb_json(),
    ) {
        let body = replace_somewhere(envelope("uid-x", operation, object("p", &spec)), which, with);
        if let Some(wire) = checked(review(webhook, &body))? {
            let uid = body.pointer("/request/uid").and_then(Value::as_str);
            prop_assert!(uid.is_some_and(|u| !u.is_empty()), "answered without a usable uid: {}", body);
            prop_assert_eq!(wire.pointer("/response/uid").and_then(Value::as_str), uid);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Names, labels and values of any length and content, in any number up to past every
    /// list bound, under both webhooks: the answer never exceeds MAX_ANSWER_BYTES, and a
    /// body refused as a bad request gets a short reason.
    #[test]
    fn no_answer_exceeds_the_size_bound(
        webhook in any_webhook(),
        operation in any_operation(),
        uid in prop_oneof![Just("u".repeat(MAX_UID_BYTES)), "[ -~]{1,36}", hostile_text()],
        object in hostile_object(),
    ) {
        let body = envelope(&uid, operation, object);
        match review(webhook, &body) {
            Ok(answer) => {
                check_answer(&answer)?;
            }
            Err(bad) => prop_assert!(bad.to_string().len() <= 2 * 1024, "a {}-byte reason", bad.to_string().len()),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    /// v1alpha1 → v1beta1 → v1alpha1 is the identity: a Go-era object read as the storage
    /// version and written back is unchanged.
    #[test]
    fn v1alpha1_to_v1beta1_and_back_is_the_identity(alpha in arb_v1alpha1_object()) {
        let beta = convert_value(&alpha, Version::V1beta1)?;
        prop_assert_eq!(&beta["apiVersion"], V1BETA1);
        prop_assert_eq!(&beta["metadata"], &alpha["metadata"], "nothing to restore, nothing changed");
        prop_assert_eq!(beta.get("spec"), alpha.get("spec"));
        if let Some(status) = alpha.get("status") {
            prop_assert_eq!(&beta["status"]["activeBackends"], &status["activeBackendsNum"]);
            prop_assert_eq!(&beta["status"]["obsoleteBackends"], &status["obsoleteBackendsNum"]);
            prop_assert!(beta["status"].get("activeBackendsNum").is_none());
        }
        let back = convert_value(&beta, Version::V1alpha1)?;
        prop_assert_eq!(&back, &alpha);
    }

    /// v1beta1 → v1alpha1 → v1beta1 is the identity for everything but the derived status fields
    /// v1alpha1 lacks (the controller writes them again; a v1alpha1 client must not set them):
    /// the spec fields v1alpha1 cannot say ride in the annotation.
    #[test]
    fn v1beta1_to_v1alpha1_and_back_is_the_identity(beta in arb_v1beta1_object()) {
        let alpha = convert_value(&beta, Version::V1alpha1)?;
        prop_assert_eq!(&alpha["apiVersion"], V1ALPHA1);
        // Nothing v1alpha1 does not know is left in its spec or status.
        let (spec_only, status_only) = beta_only(&beta);
        for field in &spec_only {
            prop_assert!(alpha["spec"].get(field.as_str()).is_none(), "spec.{} leaked into v1alpha1: {}", field, alpha);
        }
        for field in &status_only {
            prop_assert!(alpha["status"].get(field.as_str()).is_none(), "status.{} leaked into v1alpha1: {}", field, alpha);
        }
        // Nor in its list items: v1beta1's per-port and per-backend fields ride in the annotation too.
        let item_only = |object: &Value| -> usize {
            let count = |list: &str, fields: &[&str]| {
                object["spec"][list].as_array().map_or(0, |items| {
                    items.iter().map(|item| fields.iter().filter(|f| item.get(**f).is_some()).count()).sum()
                })
            };
            count("ports", &["connectTimeout", "idleTimeout", "nodePort", "proxyProtocol", "acceptProxyProtocol"])
                + count("backends", &["maxFails", "failTimeout", "maxConnections", "backup"])
        };
        prop_assert_eq!(item_only(&alpha), 0, "item fields leaked into v1alpha1: {}", alpha);
        let annotation = alpha["metadata"]["annotations"].get(PRESERVED_ANNOTATION);
        let moved = !spec_only.is_empty() || item_only(&beta) > 0;
        prop_assert_eq!(annotation.is_some(), moved, "{}", alpha);
        let back = convert_value(&alpha, Version::V1beta1)?;
        prop_assert_eq!(&back, &without_derived_status(&beta));
    }

    /// A v1alpha1 object that carries the annotation (it was converted from v1beta1) also
    /// round-trips, and a read-modify-write through v1alpha1 keeps the v1beta1-only fields.
    #[test]
    fn an_annotated_v1alpha1_object_round_trips_and_keeps_the_v1beta1_fields(
        beta in arb_v1beta1_object(),
        other in arb_v1alpha1_spec(),
    ) {
        let alpha = convert_value(&beta, Version::V1alpha1)?;
        let again = convert_value(&convert_value(&alpha, Version::V1beta1)?, Version::V1alpha1)?;
        prop_assert_eq!(&again, &alpha);

        // A v1alpha1 client replaces the shared spec fields (kubectl apply of a Go-era manifest).
        let mut edited = alpha;
        match other {
            Some(spec) => edited["spec"] = spec,
            None => { edited.as_object_mut().unwrap().remove("spec"); }
        }
        let read = convert_value(&edited, Version::V1beta1)?;
        prop_assert_eq!(read["spec"].get("replicas"), beta["spec"].get("replicas"));
        prop_assert_eq!(read["spec"].get("sessionAffinity"), beta["spec"].get("sessionAffinity"));
        prop_assert_eq!(read["spec"].get("service"), beta["spec"].get("service"));
        for field in DERIVED_STATUS {
            prop_assert!(read["status"].get(field).is_none(), "status.{} came back from v1alpha1", field);
        }
        prop_assert_eq!(&read["metadata"], &beta["metadata"]);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn conversion_review_survives_arbitrary_bytes(body in vec(any::<u8>(), 0..512)) {
        check_conversion(&body)?;
    }

    #[test]
    fn conversion_review_survives_arbitrary_json(body in arb_json()) {
        check_conversion(&serde_json::to_vec(&body).expect("encodes"))?;
    }

    /// A well-formed review of any objects, to any version, is always answered (never a
    /// bad request), with the uid.
    #[test]
    fn conversion_review_answers_any_objects(
        uid in prop_oneof!["[ -~]{1,36}", ".{1,8}"],
        desired in any_desired_version(),
        objects in vec(any_object(), 0..4),
    ) {
        let body = serde_json::to_vec(&conversion_envelope(&uid, &desired, objects)).expect("encodes");
        let answer = check_conversion(&body)?;
        prop_assert!(answer.is_some(), "a well-formed review was refused as a bad request");
    }

    /// Any part of a well-formed review replaced by arbitrary JSON: answered or refused, never a panic.
    #[test]
    fn conversion_review_survives_any_part_replaced(
        desired in any_desired_version(),
        objects in vec(any_object(), 0..3),
        which in any::<Index>(),
        with in arb_json(),
    ) {
        let body = replace_somewhere(conversion_envelope("uid-c", &desired, objects), which, with);
        check_conversion(&serde_json::to_vec(&body).expect("encodes"))?;
    }
}
