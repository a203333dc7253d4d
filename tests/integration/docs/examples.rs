//! Every `console` block in the README and `docs/` runs as written (`$ balancer …`, from the
//! repository's root) and prints what the block shows; `[..]` and `...` stand for what varies.
//! Refresh the outputs after a deliberate change with `TRYCMD=overwrite`.

#[test]
fn every_console_example_prints_what_the_docs_show() {
    trycmd::TestCases::new().case("README.md").case("docs/*.md");
}
