//! Incremental sync of a `kind = "rest"` provider (`incremental = { ... }`): the query
//! parameter that asks only for what changed since the stream's cursor, the page's
//! watermark read from each record's `cursor_field`, and the end of a newest-first listing
//! at the first record older than the cursor.

use std::fmt::{self, Write as _};
use std::time::Duration;

use chrono::format::{Item, Parsed, StrftimeItems};
use chrono::{DateTime, NaiveDate, NaiveTime, SecondsFormat, TimeDelta, Utc};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::field_path::FieldPath;
use crate::adapter::watermark_time;
use crate::quote::quoted;
use crate::record::json_type_name;
use crate::{IdSpec, PageItem, RecordStage, RejectedRecord, Watermark};

/// The longest `incremental.lookback`.
const MAX_LOOKBACK: Duration = Duration::from_secs(30 * 24 * 60 * 60);

/// `incremental = { ... }`: how a stream syncs only what changed since its last complete
/// run. Without it every run is a full pass.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IncrementalConfig {
    /// Dotted path of the field of each record that says when it last changed, e.g.
    /// `"updated_at"`; a segment in double quotes may hold dots. A page's watermark is the
    /// newest value among its records; a record without the field (or with `null`) does not
    /// count, and a record whose value cannot be read in `format` is set aside with the
    /// reason. Required.
    pub cursor_field: String,
    /// The query parameter that carries the cursor, e.g. `"updated_since"`: on an
    /// incremental run, the stream's cursor minus `lookback`, written in `format`; on a full
    /// pass, `start` if given, else nothing. Sent on every page built from `base_url` and
    /// `path`; the next-page URLs of `link` and `next_url` pagination are followed as the
    /// API gives them. `param`, `stop_when_older` or both must be set.
    #[serde(default)]
    pub param: Option<String>,
    /// How times are written in `param` and read from `cursor_field`: `"rfc3339"` (sent as
    /// `2024-01-02T03:04:05Z`, whole seconds), `"epoch"` (seconds, a JSON number or a string
    /// of digits in records), `"epoch_ms"` (milliseconds, likewise), `"date"`
    /// (`YYYY-MM-DD`, UTC), or a strftime pattern such as `"%Y-%m-%d %H:%M:%S"` (UTC; it
    /// must be able to read back what it writes). Default `"rfc3339"`.
    #[serde(default = "default_format")]
    pub format: String,
    /// Whether the API's filter includes its bound (`>=`). True (the default) sends the
    /// cursor as is: records changed at the cursor itself are fetched again and absorbed by
    /// their key. False sends the cursor plus the format's smallest unit (a second, a
    /// millisecond, a day, or the finest field of the pattern): nothing is fetched twice,
    /// but a record that changes later within the cursor's unit is missed.
    #[serde(default = "default_inclusive")]
    pub inclusive: bool,
    /// How far before the cursor to start again, for APIs whose records show up late,
    /// e.g. `"5m"`. 0 to 30 days, default 0.
    #[serde(default)]
    pub lookback: Option<String>,
    /// An RFC 3339 time sent as `param` on a full pass (a stream without a cursor), e.g.
    /// `"2024-01-01T00:00:00Z"`. Needs `param`. Omitted: a full pass sends no `param`.
    #[serde(default)]
    pub start: Option<String>,
    /// For APIs that list newest first and cannot filter: on an incremental run, the
    /// listing ends at the first record whose `cursor_field` is older than the cursor minus
    /// `lookback`. That record and the rest of the page are not kept, and no further page
    /// is asked for. Records without the field do not end it. Default false.
    #[serde(default)]
    pub stop_when_older: bool,
}

fn default_format() -> String {
    "rfc3339".to_string()
}

fn default_inclusive() -> bool {
    true
}

impl IncrementalConfig {
    /// The checked settings, or a message naming the key that is wrong.
    pub(crate) fn plan(&self) -> Result<Incremental, String> {
        let cursor_field = FieldPath::parse(&self.cursor_field)
            .map_err(|message| format!("incremental.cursor_field {message}"))?;
        if let Some(param) = &self.param {
            if param.trim().is_empty() {
                return Err("incremental.param must not be empty".to_string());
            }
        }
        if self.param.is_none() && !self.stop_when_older {
            return Err(
                "incremental needs param (the query parameter the cursor is sent as), \
                 stop_when_older = true (for newest-first listings), or both"
                    .to_string(),
            );
        }
        let format = TimeFormat::parse(&self.format)?;
        let unit = format.unit();
        if !self.inclusive && unit.is_none() {
            return Err(format!(
                "incremental.inclusive = false adds the format's smallest unit to the cursor, \
                 but incremental.format {} has no field finer than a month",
                quoted(&self.format)
            ));
        }
        let lookback = match &self.lookback {
            None => Duration::ZERO,
            Some(text) => humantime::parse_duration(text).map_err(|err| {
                format!(
                    "incremental.lookback {} is not a duration such as \"5m\" or \"1h\": {err}",
                    quoted(text)
                )
            })?,
        };
        crate::bounds::duration_in(lookback, Duration::ZERO, MAX_LOOKBACK)
            .map_err(crate::bounds::named("incremental.lookback"))?;
        let lookback = TimeDelta::from_std(lookback)
            .map_err(|err| format!("incremental.lookback is out of range: {err}"))?;
        let start = match &self.start {
            None => None,
            Some(_) if self.param.is_none() => {
                return Err(
                    "incremental.start is sent as incremental.param, which is not set".to_string(),
                )
            }
            Some(text) => Some(
                DateTime::parse_from_rfc3339(text)
                    .map_err(|err| {
                        format!(
                            "incremental.start {} is not an RFC 3339 time such as \
                             \"2024-01-01T00:00:00Z\": {err}",
                            quoted(text)
                        )
                    })?
                    .with_timezone(&Utc),
            ),
        };
        Ok(Incremental {
            cursor_field,
            param: self.param.clone(),
            format,
            unit: if self.inclusive { None } else { unit },
            lookback,
            start,
            stop_when_older: self.stop_when_older,
        })
    }
}

/// Checked `incremental` settings.
#[derive(Clone, Debug)]
pub(crate) struct Incremental {
    cursor_field: FieldPath,
    param: Option<String>,
    format: TimeFormat,
    /// For `inclusive = false`: what is added to the cursor. `None` when inclusive.
    unit: Option<TimeDelta>,
    lookback: TimeDelta,
    start: Option<DateTime<Utc>>,
    stop_when_older: bool,
}

/// What one run sends and where it stops, from the stream's cursor.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct RunFilter {
    /// The query parameter and its value, when one is sent.
    pub param: Option<(String, String)>,
    /// With `stop_when_older` on an incremental run: the listing ends at the first record
    /// older than this.
    pub older_than: Option<DateTime<Utc>>,
}

/// A page's records read with `cursor_field`.
#[derive(Debug, Default)]
pub(crate) struct ReadRecords {
    /// The records kept, keyed, in the API's order.
    pub items: Vec<PageItem>,
    /// The newest `cursor_field` among them.
    pub watermark: Option<Watermark>,
    /// The oldest `cursor_field` among them.
    pub oldest: Option<Watermark>,
    /// How many lie beyond the clock by more than [`crate::WATERMARK_CLOCK_SKEW`].
    pub ahead: u64,
    /// Whether a record older than [`RunFilter::older_than`] ended the listing.
    pub ended: bool,
}

impl Incremental {
    /// The parameter to send and the bound to stop at, for a run from `since` (`None`: a
    /// full pass).
    pub(crate) fn for_run(&self, since: Option<&Watermark>) -> Result<RunFilter, String> {
        let Some(since) = since else {
            let param = match (&self.param, self.start) {
                (Some(name), Some(start)) => Some((name.clone(), self.format.write(start)?)),
                _ => None,
            };
            return Ok(RunFilter {
                param,
                older_than: None,
            });
        };
        let cursor = watermark_time(since).ok_or_else(|| {
            format!("the stream's cursor {since:?} is not a time that can be represented")
        })?;
        let from = cursor.checked_sub_signed(self.lookback).ok_or_else(|| {
            format!(
                "the stream's cursor {cursor} minus incremental.lookback is before the earliest \
                 time that can be represented"
            )
        })?;
        let param = match &self.param {
            None => None,
            Some(name) => {
                let sent = match self.unit {
                    None => from,
                    Some(unit) => from.checked_add_signed(unit).ok_or_else(|| {
                        format!(
                            "the stream's cursor {cursor} plus the unit incremental.inclusive = \
                             false adds is past the latest time that can be represented"
                        )
                    })?,
                };
                Some((name.clone(), self.format.write(sent)?))
            }
        };
        Ok(RunFilter {
            param,
            older_than: self.stop_when_older.then_some(from),
        })
    }

    /// The parameter of a listing started over past `pagination.max_page` from `since`,
    /// the newest value read before: sent as read, inclusive and without `lookback`, so
    /// the records that share it and were not yet read are listed and nothing read
    /// before is asked for again beyond those.
    pub(crate) fn restart_from(&self, since: &Watermark) -> Result<RunFilter, String> {
        let time = watermark_time(since).ok_or_else(|| {
            format!("the time {since:?} to start the listing over from cannot be represented")
        })?;
        Ok(RunFilter {
            param: match &self.param {
                Some(name) => Some((name.clone(), self.format.write(time)?)),
                None => None,
            },
            older_than: None,
        })
    }

    /// Keys `records` with `spec` and reads each one's `cursor_field`: the newest value is
    /// the page's watermark. With `older_than`, the records from the first one older than it
    /// are left out and the listing ends. A record whose value cannot be read is set aside
    /// with the reason.
    pub(crate) fn read_records(
        &self,
        spec: &IdSpec,
        records: &[&RawValue],
        older_than: Option<DateTime<Utc>>,
    ) -> ReadRecords {
        let now = Utc::now();
        let mut values = Vec::with_capacity(records.len());
        let mut ended = false;
        for record in records {
            let value = self.value_of(record);
            if let (Ok(Some(value)), Some(bound)) = (&value, older_than) {
                if is_before(value, bound) {
                    ended = true;
                    break;
                }
            }
            values.push(value);
        }
        let kept = records.get(..values.len()).unwrap_or(records);
        let (mut items, _) = crate::adapter::identify_records(spec, kept, None);
        let mut read = ReadRecords {
            ended,
            ..ReadRecords::default()
        };
        for (item, value) in items.iter_mut().zip(values) {
            match value {
                Ok(None) => {}
                Ok(Some(watermark)) => {
                    if watermark.is_beyond_skew(now) {
                        read.ahead = read.ahead.saturating_add(1);
                    }
                    read.oldest = Some(match read.oldest.take() {
                        Some(oldest) => oldest.min(watermark.clone()),
                        None => watermark.clone(),
                    });
                    read.watermark = read.watermark.take().max(Some(watermark));
                }
                Err(message) => {
                    if let PageItem::Record(record) = item {
                        *item = PageItem::Rejected(unreadable(record, message));
                    }
                }
            }
        }
        read.items = items;
        read
    }

    /// A stored record keyed with `spec`, set aside as [`Incremental::read_records`] sets
    /// aside a fetched one whose `cursor_field` cannot be read.
    pub(crate) fn check_stored(
        &self,
        spec: &IdSpec,
        payload: &RawValue,
    ) -> Result<crate::Record, RejectedRecord> {
        let mut record = spec.identify_raw(payload)?;
        match self.value_of(payload) {
            Ok(_) => Ok(record),
            Err(message) => Err(unreadable(&mut record, message)),
        }
    }

    /// The record's `cursor_field`: `None` when it is missing or null, an error naming the
    /// field and the format when it cannot be read.
    fn value_of(&self, record: &RawValue) -> Result<Option<Watermark>, String> {
        let Some(raw) = self.cursor_field.lookup(record) else {
            return Ok(None);
        };
        let value = crate::raw::to_value(raw);
        if value.is_null() {
            return Ok(None);
        }
        self.format.read(&value).map(Some).map_err(|why| {
            format!(
                "incremental.cursor_field `{}` holds {}, which is not {}: {why}",
                self.cursor_field,
                quoted(&value.to_string()),
                self.format
            )
        })
    }
}

/// `record` set aside because its `cursor_field` cannot be read, for `message`.
fn unreadable(record: &mut crate::Record, message: String) -> RejectedRecord {
    RejectedRecord {
        external_id: Some(record.external_id.clone()),
        stage: RecordStage::Validate,
        message: message.into(),
        payload: std::mem::take(&mut record.payload),
    }
}

/// Whether `value` lies before `time`.
fn is_before(value: &Watermark, time: DateTime<Utc>) -> bool {
    match value {
        Watermark::Time(own) => *own < time,
        Watermark::Epoch(seconds) => match DateTime::from_timestamp(*seconds, 0) {
            Some(own) => own < time,
            // Beyond what a time can hold: before every time when negative.
            None => *seconds < 0,
        },
    }
}

/// `incremental.format`.
#[derive(Clone, Debug)]
enum TimeFormat {
    Rfc3339,
    Epoch,
    EpochMs,
    Date,
    Pattern {
        text: String,
        items: Vec<Item<'static>>,
    },
}

impl fmt::Display for TimeFormat {
    /// The format as messages name it: "an rfc3339 time", "a strftime time "%Y"".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TimeFormat::Rfc3339 => f.write_str("an rfc3339 time"),
            TimeFormat::Epoch => f.write_str("an epoch time in seconds"),
            TimeFormat::EpochMs => f.write_str("an epoch time in milliseconds"),
            TimeFormat::Date => f.write_str("a date (YYYY-MM-DD)"),
            TimeFormat::Pattern { text, .. } => write!(f, "a time in the format {text:?}"),
        }
    }
}

impl TimeFormat {
    fn parse(text: &str) -> Result<TimeFormat, String> {
        let format = match text {
            "rfc3339" => TimeFormat::Rfc3339,
            "epoch" => TimeFormat::Epoch,
            "epoch_ms" => TimeFormat::EpochMs,
            "date" => TimeFormat::Date,
            pattern if pattern.contains('%') => {
                let items = StrftimeItems::new(pattern).parse_to_owned().map_err(|_| {
                    format!(
                        "incremental.format {} is not a valid strftime pattern: it holds an \
                         unknown or incomplete % specifier",
                        quoted(pattern)
                    )
                })?;
                TimeFormat::Pattern {
                    text: pattern.to_string(),
                    items,
                }
            }
            other => {
                return Err(format!(
                    "incremental.format {} is not \"rfc3339\", \"epoch\", \"epoch_ms\", \"date\" \
                     or a strftime pattern such as \"%Y-%m-%d %H:%M:%S\"",
                    quoted(other)
                ))
            }
        };
        if let TimeFormat::Pattern { text, .. } = &format {
            format.check_round_trip().map_err(|why| {
                format!(
                    "incremental.format {} cannot be used as a cursor: {why}",
                    quoted(text)
                )
            })?;
        }
        Ok(format)
    }

    /// A pattern must write a time without error and read it back to a time it writes the
    /// same way (so it holds at least a full date).
    fn check_round_trip(&self) -> Result<(), String> {
        let sample = DateTime::from_timestamp(1_709_618_828, 123_456_789)
            .ok_or_else(|| "no sample time".to_string())?;
        let written = self.write(sample)?;
        let read = self
            .read(&Value::String(written.clone()))
            .map_err(|why| format!("it writes {written:?}, which it cannot read back ({why})"))?;
        let read = watermark_time(&read).ok_or_else(|| "no time read back".to_string())?;
        let again = self.write(read)?;
        if again != written {
            return Err(format!(
                "it writes {written:?}, which reads back as {again:?} (the pattern needs at \
                 least a full date)"
            ));
        }
        Ok(())
    }

    /// `time` as this format writes it.
    fn write(&self, time: DateTime<Utc>) -> Result<String, String> {
        match self {
            TimeFormat::Rfc3339 => Ok(time.to_rfc3339_opts(SecondsFormat::Secs, true)),
            TimeFormat::Epoch => Ok(time.timestamp().to_string()),
            TimeFormat::EpochMs => Ok(time.timestamp_millis().to_string()),
            TimeFormat::Date => Ok(time.date_naive().to_string()),
            TimeFormat::Pattern { text, items } => {
                // `DelayedFormat::to_string` panics on an item that fails to write; `write!`
                // reports it.
                let mut written = String::new();
                write!(written, "{}", time.format_with_items(items.iter())).map_err(|_| {
                    format!("incremental.format {} cannot write {time}", quoted(text))
                })?;
                Ok(written)
            }
        }
    }

    /// The smallest step the format shows; `None` when it shows nothing finer than a month.
    fn unit(&self) -> Option<TimeDelta> {
        match self {
            TimeFormat::Rfc3339 | TimeFormat::Epoch => Some(TimeDelta::seconds(1)),
            TimeFormat::EpochMs => Some(TimeDelta::milliseconds(1)),
            TimeFormat::Date => Some(TimeDelta::days(1)),
            TimeFormat::Pattern { .. } => {
                // The finest step that changes what the pattern writes, from a time aligned
                // to every step (midnight UTC).
                let aligned = DateTime::from_timestamp(1_709_596_800, 0)?;
                let before = self.write(aligned).ok()?;
                [
                    TimeDelta::nanoseconds(1),
                    TimeDelta::microseconds(1),
                    TimeDelta::milliseconds(1),
                    TimeDelta::seconds(1),
                    TimeDelta::minutes(1),
                    TimeDelta::hours(1),
                    TimeDelta::days(1),
                ]
                .into_iter()
                .find(|step| {
                    aligned
                        .checked_add_signed(*step)
                        .and_then(|later| self.write(later).ok())
                        .is_some_and(|after| after != before)
                })
            }
        }
    }

    /// A record's value (not null) in this format.
    fn read(&self, value: &Value) -> Result<Watermark, String> {
        let text = match (self, value) {
            (TimeFormat::Epoch, value) => return integer(value).map(Watermark::Epoch),
            (TimeFormat::EpochMs, value) => {
                let millis = integer(value)?;
                return DateTime::from_timestamp_millis(millis)
                    .map(Watermark::Time)
                    .ok_or_else(|| "out of the range of times".to_string());
            }
            (_, Value::String(text)) => text,
            (_, other) => return Err(format!("it is {}", json_type_name(other))),
        };
        let time = match self {
            TimeFormat::Rfc3339 => DateTime::parse_from_rfc3339(text)
                .map(|time| time.with_timezone(&Utc))
                .map_err(|err| err.to_string())?,
            TimeFormat::Date => NaiveDate::parse_from_str(text, "%Y-%m-%d")
                .map(|date| date.and_time(NaiveTime::MIN).and_utc())
                .map_err(|err| err.to_string())?,
            TimeFormat::Pattern { items, .. } => read_pattern(items, text)?,
            TimeFormat::Epoch | TimeFormat::EpochMs => {
                return Err("epoch values are read above".to_string())
            }
        };
        Ok(Watermark::Time(time))
    }
}

/// An integer: a JSON integer, or a string of digits with an optional leading `-`.
fn integer(value: &Value) -> Result<i64, String> {
    match value {
        Value::Number(number) => number
            .as_i64()
            .ok_or_else(|| "it is not an integer that fits in 64 bits".to_string()),
        Value::String(text) => text
            .parse::<i64>()
            .map_err(|err| format!("the string is not an integer: {err}")),
        other => Err(format!("it is {}", json_type_name(other))),
    }
}

/// `text` read with a strftime pattern: a time with its offset, else a date and time in
/// UTC, else a date at midnight UTC.
fn read_pattern(items: &[Item<'static>], text: &str) -> Result<DateTime<Utc>, String> {
    let mut parsed = Parsed::new();
    chrono::format::parse(&mut parsed, text, items.iter()).map_err(|err| err.to_string())?;
    if let Ok(time) = parsed.to_datetime() {
        return Ok(time.with_timezone(&Utc));
    }
    if let Ok(time) = parsed.to_naive_datetime_with_offset(0) {
        return Ok(time.and_utc());
    }
    parsed
        .to_naive_date()
        .map(|date| date.and_time(NaiveTime::MIN).and_utc())
        .map_err(|err| err.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn format(text: &str) -> Result<TimeFormat, String> {
        TimeFormat::parse(text)
    }

    fn time(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn formats_write_and_read_their_values() {
        let at = time("2024-03-05T06:07:08.250Z");
        let cases = [
            ("rfc3339", "2024-03-05T06:07:08Z"),
            ("epoch", "1709618828"),
            ("epoch_ms", "1709618828250"),
            ("date", "2024-03-05"),
            ("%Y/%m/%d %H:%M", "2024/03/05 06:07"),
            ("%s", "1709618828"),
        ];
        for (name, expected) in cases {
            let format = format(name).unwrap();
            assert_eq!(format.write(at).unwrap(), expected, "{name}");
            let read = format.read(&Value::String(expected.into())).unwrap();
            assert_eq!(
                format.write(watermark_time(&read).unwrap()).unwrap(),
                expected
            );
        }
        let epoch = format("epoch").unwrap();
        assert_eq!(epoch.read(&serde_json::json!(12)), Ok(Watermark::Epoch(12)));
        assert!(epoch.read(&serde_json::json!(1.5)).is_err());
        assert!(epoch.read(&serde_json::json!("12a")).is_err());
    }

    #[test]
    fn units_are_the_finest_field_written() {
        let unit = |text: &str| format(text).unwrap().unit();
        assert_eq!(unit("rfc3339"), Some(TimeDelta::seconds(1)));
        assert_eq!(unit("epoch_ms"), Some(TimeDelta::milliseconds(1)));
        assert_eq!(unit("%Y-%m-%dT%H:%M"), Some(TimeDelta::minutes(1)));
        assert_eq!(
            unit("%Y-%m-%d %H:%M:%S%.3f"),
            Some(TimeDelta::milliseconds(1))
        );
        assert_eq!(unit("%d.%m.%Y"), Some(TimeDelta::days(1)));
    }

    #[test]
    fn unusable_patterns_are_refused() {
        for (bad, expected) in [
            ("%Y-%m-%Q", "not a valid strftime pattern"),
            ("%", "not a valid strftime pattern"),
            ("%Y-%m", "cannot be used as a cursor"),
            ("%H:%M", "cannot be used as a cursor"),
            ("RFC3339", "is not \"rfc3339\""),
        ] {
            let message = format(bad).unwrap_err();
            assert!(message.contains(expected), "{bad}: {message}");
            assert!(message.starts_with("incremental.format"), "{message}");
        }
    }
}
