//! Ranges of configuration values. Every duration, count and size a config sets is checked
//! against one, so no value can overflow a clock or a buffer later, and a value out of
//! range is refused with the range in the message.

use std::fmt::Display;
use std::time::Duration;

/// `Ok` when `value` lies in `min..=max`, else "must be between MIN and MAX, got VALUE".
pub fn count_in<T: PartialOrd + Display>(value: T, min: T, max: T) -> Result<(), String> {
    if value < min || value > max {
        return Err(format!("must be between {min} and {max}, got {value}"));
    }
    Ok(())
}

/// [`count_in`] for durations, written as config files write them (`"30s"`, `"1day"`).
pub fn duration_in(value: Duration, min: Duration, max: Duration) -> Result<(), String> {
    if value < min || value > max {
        return Err(format!(
            "must be between {} and {}, got {}",
            humantime::format_duration(min),
            humantime::format_duration(max),
            humantime::format_duration(value)
        ));
    }
    Ok(())
}

/// `key` and the message of a failed check, as one message.
pub fn named(key: &str) -> impl Fn(String) -> String + '_ {
    move |message| format!("{key} {message}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_state_the_range_and_the_value() {
        assert_eq!(count_in(5, 1, 10), Ok(()));
        assert_eq!(
            count_in(0u32, 1, 10).map_err(named("max_pages")),
            Err("max_pages must be between 1 and 10, got 0".to_string())
        );
        let day = Duration::from_secs(86_400);
        assert_eq!(
            duration_in(Duration::from_secs(90_000), Duration::ZERO, day),
            Err("must be between 0s and 1day, got 1day 1h".to_string())
        );
    }
}
