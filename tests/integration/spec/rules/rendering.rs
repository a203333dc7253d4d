//! How field errors and the denial message are written.

use balancer::spec::FieldError;
use balancer::spec::denial_message;

use super::table::sample;

fn field_error(field: &str, detail: &str) -> FieldError {
    FieldError { field: field.into(), detail: detail.into() }
}

#[test]
fn field_errors_render_as_path_colon_problem() {
    assert_eq!(
        field_error("spec.backends[1].weight", "must be between 0 and 100, got 150").to_string(),
        "spec.backends[1].weight: must be between 0 and 100, got 150"
    );
}

#[test]
fn denial_message_with_one_error_has_no_brackets() {
    assert_eq!(
        denial_message("example-balancer", &[field_error("spec.ports", "must have at least one port")]),
        "Balancer \"example-balancer\" is invalid: spec.ports: must have at least one port"
    );
}

#[test]
fn denial_message_with_several_errors_lists_them_in_brackets() {
    assert_eq!(
        denial_message(
            "example-balancer",
            &[
                field_error("spec.ports[1].name", "duplicate port name \"http\" (also spec.ports[0].name)"),
                field_error("spec.backends[1].weight", "must be between 0 and 100, got 150"),
                field_error("spec.backends", "must have at least one backend"),
            ]
        ),
        "Balancer \"example-balancer\" is invalid: [spec.ports[1].name: duplicate port name \"http\" \
         (also spec.ports[0].name), spec.backends[1].weight: must be between 0 and 100, got 150, \
         spec.backends: must have at least one backend]"
    );
}

#[test]
fn denial_message_without_a_name_omits_it() {
    assert_eq!(denial_message("", &[field_error("spec", "is required")]), "Balancer is invalid: spec: is required");
    assert_eq!(
        denial_message("", &[field_error("a", "b"), field_error("c", "d")]),
        "Balancer is invalid: [a: b, c: d]"
    );
}

#[test]
fn denial_message_from_a_real_report() {
    let mut subject = sample();
    subject.spec.backends[1].weight = Some(150);
    subject.spec.ports[0].port = 0;
    let report = subject.report();
    assert_eq!(
        denial_message("example-balancer", &report.errors),
        "Balancer \"example-balancer\" is invalid: [spec.ports[0].port: must be between 1 and 65535, got 0, \
         spec.backends[1].weight: must be between 0 and 100, got 150]"
    );
}

/// A denial lists the first 16 errors and counts the rest, so that its size is bounded however
/// many errors a spec has.
#[test]
fn denial_message_lists_sixteen_errors_and_counts_the_rest() {
    let errors = |n: usize| -> Vec<FieldError> {
        (0..n).map(|i| field_error(&format!("spec.ports[{i}].port"), "must be between 1 and 65535, got 0")).collect()
    };
    let sixteen = denial_message("lb", &errors(16));
    assert!(sixteen.ends_with("spec.ports[15].port: must be between 1 and 65535, got 0]"), "{sixteen}");
    assert!(!sixteen.contains("more errors"), "{sixteen}");
    let eighteen = denial_message("lb", &errors(18));
    assert!(eighteen.contains("spec.ports[15].port") && !eighteen.contains("spec.ports[16].port"), "{eighteen}");
    assert!(eighteen.ends_with(", and 2 more errors]"), "{eighteen}");
}
