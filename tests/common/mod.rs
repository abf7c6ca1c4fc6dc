//! What the property-test files share.

use proptest::test_runner::Config as ProptestConfig;

/// `default` cases per property, or as many as `PROPTEST_CASES` asks for (to explore
/// further: README.md, Development).
pub(crate) fn cases(default: u32) -> ProptestConfig {
    let config = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_some() {
        config
    } else {
        ProptestConfig {
            cases: default,
            ..config
        }
    }
}
