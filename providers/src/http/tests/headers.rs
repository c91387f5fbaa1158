//! `Retry-After` of any value: a wait of at most [`MAX_ASKED_WAIT`], never a panic.

use proptest::prelude::*;
use std::time::UNIX_EPOCH;

use super::*;
use crate::test_support::{header_map, header_text, proptest_config};

#[test]
fn retry_after_beyond_a_day_is_read_as_a_day() {
    let now = SystemTime::now();
    let wait = |value: &str| retry_after(&header_map(&[("retry-after", value)]), now);
    assert_eq!(wait("18446744073709551615"), Some(MAX_ASKED_WAIT));
    assert_eq!(wait("Fri, 31 Dec 9999 23:59:59 GMT"), Some(MAX_ASKED_WAIT));
    assert_eq!(wait("Sun, 06 Nov 1994 08:49:37 GMT"), Some(Duration::ZERO));
    assert_eq!(wait("120"), Some(Duration::from_secs(120)));
    assert_eq!(wait("-5"), None);
    assert_eq!(wait("99999999999999999999999"), None);
}

#[test]
fn retry_after_in_decimal_seconds_is_read_as_sent() {
    let now = SystemTime::now();
    let wait = |value: &str| retry_after(&header_map(&[("retry-after", value)]), now);
    assert_eq!(wait("2.0"), Some(Duration::from_secs(2)));
    assert_eq!(wait("0.25"), Some(Duration::from_millis(250)));
    assert_eq!(wait("1.000000001"), Some(Duration::new(1, 1)));
    assert_eq!(wait("86400.5"), Some(MAX_ASKED_WAIT));
    for unreadable in ["2.", ".5", "1.0000000001", "1.2.3", "1,5", "+1.5", "1.5e3"] {
        assert_eq!(wait(unreadable), None, "{unreadable}");
    }
}

proptest! {
    #![proptest_config(proptest_config(1024, 0x7265_7472))]

    #[test]
    fn any_retry_after_is_a_wait_of_at_most_a_day(
        value in header_text(),
        now in 0u64..253_402_300_800,
    ) {
        let now = UNIX_EPOCH + Duration::from_secs(now);
        let wait = retry_after(&header_map(&[("retry-after", &value)]), now);
        prop_assert!(wait.is_none_or(|wait| wait <= MAX_ASKED_WAIT), "{value:?}: {wait:?}");
    }
}
