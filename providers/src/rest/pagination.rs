//! Pagination of a `kind = "rest"` provider: the URL of a page and where the next one starts.

use reqwest::header::LINK;
use serde_json::value::RawValue;
use serde_json::Value;
use url::Url;

use super::config::{PaginationConfig, PaginationType, RestConfig};
use super::field_path::FieldPath;
use super::link;
use crate::http::{cap_body, display_url, display_url_text, JsonResponse};
use crate::raw::{lookup_raw, to_value};
use crate::record::json_type_name;
use crate::{FetchError, IdSpec, PagePosition, Watermark};

/// The URL of the page at `position` (`None`: the first page). `filter` is the
/// incremental query parameter, sent on every page built from `base_url` and `path`.
pub(super) fn page_url(
    config: &RestConfig,
    position: Option<&PagePosition>,
    filter: Option<&(String, String)>,
) -> Result<Url, FetchError> {
    let pagination = &config.pagination;
    let param: Option<(&str, String)> = match (pagination.kind, position) {
        (_, None) => match pagination.kind {
            PaginationType::Offset => Some((pagination.offset_param(), "0".to_string())),
            PaginationType::Page => {
                Some((pagination.page_param(), pagination.first_page().to_string()))
            }
            _ => None,
        },
        (PaginationType::Cursor, Some(PagePosition::Cursor { cursor })) => {
            let name = pagination
                .cursor_param
                .as_deref()
                .ok_or_else(|| FetchError::Client {
                    message:
                        "pagination.cursor_param is required when pagination.type = \"cursor\""
                            .to_string(),
                })?;
            Some((name, cursor.clone()))
        }
        (PaginationType::Header, Some(PagePosition::Cursor { cursor })) => Some((
            required(pagination.cursor_param.as_deref(), "cursor_param", "header")?,
            cursor.clone(),
        )),
        (PaginationType::HasMore, Some(PagePosition::Cursor { cursor })) => Some((
            required(pagination.after_param.as_deref(), "after_param", "has_more")?,
            cursor.clone(),
        )),
        (PaginationType::Offset, Some(PagePosition::Offset { offset })) => {
            Some((pagination.offset_param(), offset.to_string()))
        }
        (
            PaginationType::Page,
            Some(PagePosition::Page { page } | PagePosition::RestartedPage { page, .. }),
        ) => Some((pagination.page_param(), page.to_string())),
        (PaginationType::Link | PaginationType::NextUrl, Some(PagePosition::Url { url })) => {
            return followed_url(config, url);
        }
        (kind, Some(other)) => {
            return Err(FetchError::PositionMismatch {
                message: format!(
                    "cannot fetch the page at {other:?}: pagination.type = \"{}\" does not use \
                     that kind of position (was the pagination changed since the checkpoint?)",
                    kind.as_str()
                ),
            })
        }
    };
    let mut url = config
        .endpoint()
        .map_err(|message| FetchError::InvalidUrl {
            url: display_url(&config.base_url),
            message,
        })?;
    {
        let mut query = url.query_pairs_mut();
        for (name, value) in &config.query {
            query.append_pair(name, value);
        }
        if let Some(name) = &pagination.page_size_param {
            query.append_pair(name, &pagination.page_size.to_string());
        }
        if let Some((name, value)) = filter {
            query.append_pair(name, value);
        }
        if let Some((name, value)) = param {
            query.append_pair(name, &value);
        }
    }
    // `query_pairs_mut` leaves a bare `?` when nothing was appended.
    if url.query() == Some("") {
        url.set_query(None);
    }
    Ok(url)
}

/// The position after a full page `page` of a listing with `max_page`, read by the
/// newest change. When the page holds a record older than its newest (`from.oldest` <
/// `from.newest`), the first page again, asked from the newest: that leaves at least one
/// record behind, and since the listing is sorted, every earlier page's too. Otherwise
/// (records that share one time) the next page number of the same listing, up to
/// `max_page`; past it, starting over from the newest when that is past the time the
/// listing asks from (`since`, `None` for the run's own). An error when nothing can move
/// the listing on.
fn keyset_next(
    pagination: &PaginationConfig,
    max_page: u64,
    page: u64,
    from: &NextFrom<'_>,
    since: Option<&Watermark>,
) -> Result<PagePosition, String> {
    let restart = |newest: &Watermark| PagePosition::RestartedPage {
        page: pagination.first_page(),
        since: newest.clone(),
    };
    if let (Some(newest), Some(oldest)) = (from.newest, from.oldest) {
        if oldest < newest {
            return Ok(restart(newest));
        }
    }
    let next = page.saturating_add(1);
    if next <= max_page {
        return Ok(match since {
            Some(since) => PagePosition::RestartedPage {
                page: next,
                since: since.clone(),
            },
            None => PagePosition::Page { page: next },
        });
    }
    match (from.newest, since) {
        (Some(newest), since) if since.is_none_or(|since| newest > since) => Ok(restart(newest)),
        (Some(newest), _) => Err(format!(
            "pages {} to {max_page} (pagination.max_page, the last the API serves) hold only \
             records changed at {}: more records share that time than the API serves pages, \
             so the listing cannot go on",
            pagination.first_page(),
            newest.describe()
        )),
        (None, _) => Err(format!(
            "page {max_page} is pagination.max_page, the last the API serves, and none of its \
             records holds incremental.cursor_field to ask the next page from"
        )),
    }
}

/// A pagination parameter `validate` requires for `kind`.
fn required<'a>(value: Option<&'a str>, key: &str, kind: &str) -> Result<&'a str, FetchError> {
    value.ok_or_else(|| FetchError::Client {
        message: format!("pagination.{key} is required when pagination.type = \"{kind}\""),
    })
}

/// A next-page URL given by the API, fetched as is but only on the configured origin, so the
/// token is never sent to another host.
fn followed_url(config: &RestConfig, text: &str) -> Result<Url, FetchError> {
    crate::adapter::same_origin_url(&config.base_url, text)
}

/// What the next position is read from besides the response.
pub(super) struct NextFrom<'a> {
    pub pagination: &'a PaginationConfig,
    /// Next-page URLs must be on its origin.
    pub base_url: &'a Url,
    /// Keys the last record for `has_more` pagination.
    pub id_spec: &'a IdSpec,
    /// The page's records, as the API listed them.
    pub records: &'a [&'a RawValue],
    /// The newest and the oldest `incremental.cursor_field` among the page's records: a
    /// listing with `max_page` starts over from the newest.
    pub newest: Option<&'a Watermark>,
    pub oldest: Option<&'a Watermark>,
}

/// Where the page after this one starts; `None` when this was the last page.
pub(super) fn next_position(
    from: &NextFrom<'_>,
    position: Option<&PagePosition>,
    response: &JsonResponse,
) -> Result<Option<PagePosition>, FetchError> {
    let pagination = from.pagination;
    let records = u64::try_from(from.records.len()).unwrap_or(u64::MAX);
    let shape = |message: String| FetchError::Shape {
        url: display_url(&response.url),
        message,
        body: cap_body(response.body.get().as_bytes()),
    };
    // A short page is the last one, but only when the page size was asked for.
    let full_page =
        records > 0 && (pagination.page_size_param.is_none() || records >= pagination.page_size);
    match pagination.kind {
        PaginationType::None => Ok(None),
        PaginationType::Cursor => {
            let path = pagination.cursor_path.as_deref().unwrap_or_default();
            match lookup_raw(&response.body, path).map(to_value) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(cursor)) if cursor.is_empty() => Ok(None),
                Some(Value::String(cursor)) => Ok(Some(PagePosition::Cursor { cursor })),
                Some(Value::Number(number)) => Ok(Some(PagePosition::Cursor {
                    cursor: number.to_string(),
                })),
                Some(other) => Err(shape(format!(
                    "pagination.cursor_path `{path}` is {}, expected a string or a number",
                    json_type_name(&other)
                ))),
            }
        }
        PaginationType::Offset => {
            let offset = match position {
                Some(PagePosition::Offset { offset }) => *offset,
                _ => 0,
            };
            Ok(full_page.then(|| PagePosition::Offset {
                offset: offset.saturating_add(records),
            }))
        }
        PaginationType::Page => {
            let (page, since) = match position {
                Some(PagePosition::Page { page }) => (*page, None),
                Some(PagePosition::RestartedPage { page, since }) => (*page, Some(since)),
                _ => (pagination.first_page(), None),
            };
            if !full_page {
                return Ok(None);
            }
            match pagination.max_page {
                Some(max_page) => keyset_next(pagination, max_page, page, from, since)
                    .map(Some)
                    .map_err(shape),
                None => Ok(Some(PagePosition::Page {
                    page: page.saturating_add(1),
                })),
            }
        }
        PaginationType::Link => {
            let values = response
                .headers
                .get_all(LINK)
                .iter()
                .map(|value| {
                    value
                        .to_str()
                        .map_err(|_| shape("the Link header is not visible ASCII text".to_string()))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let Some(target) = link::next_target(values)
                .map_err(|message| shape(format!("malformed Link header: {message}")))?
            else {
                return Ok(None);
            };
            let next = response.url.join(&target).map_err(|err| {
                shape(format!(
                    "the Link header's rel=\"next\" target {:?} is not a valid URL: {err}",
                    display_url_text(&target)
                ))
            })?;
            same_origin(from.base_url, next).map_err(shape)
        }
        PaginationType::NextUrl => {
            let path = field_path(pagination.next_url_path.as_deref(), "next_url_path")?;
            match path.lookup(&response.body).map(to_value) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(text)) if text.trim().is_empty() => Ok(None),
                Some(Value::String(text)) => {
                    let next = next_url(from.base_url, text.trim()).map_err(|message| {
                        shape(format!("pagination.next_url_path `{path}`: {message}"))
                    })?;
                    same_origin(from.base_url, next).map_err(shape)
                }
                Some(other) => Err(shape(format!(
                    "pagination.next_url_path `{path}` is {}, expected a URL string",
                    json_type_name(&other)
                ))),
            }
        }
        PaginationType::Header => {
            let name = required(pagination.next_header.as_deref(), "next_header", "header")?;
            let Some(value) = response.headers.get(name) else {
                return Ok(None);
            };
            let token = value.to_str().map_err(|_| {
                shape(format!(
                    "the {name} header (pagination.next_header) is not visible ASCII text"
                ))
            })?;
            let token = token.trim();
            Ok((!token.is_empty()).then(|| PagePosition::Cursor {
                cursor: token.to_string(),
            }))
        }
        PaginationType::HasMore => {
            let path = field_path(Some(pagination.has_more_path()), "has_more_path")?;
            match path.lookup(&response.body).map(to_value) {
                None | Some(Value::Bool(false)) => Ok(None),
                Some(Value::Bool(true)) => {
                    let Some(last) = from.records.last() else {
                        return Err(shape(format!(
                            "pagination.has_more_path `{path}` is true, but the page holds no \
                             records, so there is no last id to send as pagination.after_param"
                        )));
                    };
                    let id = from.id_spec.identify_raw(last).map_err(|rejected| {
                        shape(format!(
                            "pagination.has_more_path `{path}` is true, but the page's last \
                             record has no id to send as pagination.after_param: {}",
                            rejected.message
                        ))
                    })?;
                    Ok(Some(PagePosition::Cursor {
                        cursor: id.external_id,
                    }))
                }
                Some(other) => Err(shape(format!(
                    "pagination.has_more_path `{path}` is {}, expected true or false",
                    json_type_name(&other)
                ))),
            }
        }
    }
}

/// A path `validate` checked, parsed again.
fn field_path(text: Option<&str>, key: &str) -> Result<FieldPath, FetchError> {
    let text = text.ok_or_else(|| FetchError::Client {
        message: format!("pagination.{key} is required"),
    })?;
    FieldPath::parse(text).map_err(|message| FetchError::Client {
        message: format!("pagination.{key} {message}"),
    })
}

/// The next-page URL `text` from a body: absolute, or appended to `base_url` the way
/// `path` is.
fn next_url(base_url: &Url, text: &str) -> Result<Url, String> {
    let joined;
    let absolute = match Url::parse(text) {
        Ok(url) => return Ok(url),
        Err(url::ParseError::RelativeUrlWithoutBase) => {
            let base = base_url.as_str().trim_end_matches('/');
            joined = if text.starts_with('/') {
                format!("{base}{text}")
            } else {
                format!("{base}/{text}")
            };
            &joined
        }
        Err(err) => {
            return Err(format!(
                "the next-page URL {:?} is not a valid URL: {err}",
                display_url_text(text)
            ))
        }
    };
    Url::parse(absolute).map_err(|err| {
        format!(
            "the next-page URL {:?} is not a valid URL: {err}",
            display_url_text(absolute)
        )
    })
}

/// `next` as the next position when it is on the origin of `base_url`; another origin is
/// refused here, before the page's records are handed on, so the run stops with the reason.
fn same_origin(base_url: &Url, next: Url) -> Result<Option<PagePosition>, String> {
    if next.origin() != base_url.origin() {
        return Err(format!(
            "the next-page URL {} is not on the origin of base_url ({}), so it is not \
             followed with the connection's credentials",
            display_url(&next),
            base_url.origin().ascii_serialization()
        ));
    }
    Ok(Some(PagePosition::Url {
        url: next.to_string(),
    }))
}

/// Sets the query parameter `name` to `value`, replacing any it already had.
pub(super) fn set_query_param(url: &mut Url, name: &str, value: &str) {
    let kept = pairs_without(url, name);
    url.query_pairs_mut()
        .clear()
        .extend_pairs(kept)
        .append_pair(name, value);
}

/// `text` without the query parameter `name` (text that is not a URL is kept as it is).
pub(super) fn without_query_param(text: &str, name: &str) -> String {
    let Ok(mut url) = Url::parse(text) else {
        return text.to_string();
    };
    if !url.query_pairs().any(|(key, _)| key == name) {
        return text.to_string();
    }
    let kept = pairs_without(&url, name);
    url.query_pairs_mut().clear().extend_pairs(kept);
    if url.query() == Some("") {
        url.set_query(None);
    }
    url.to_string()
}

fn pairs_without(url: &Url, name: &str) -> Vec<(String, String)> {
    url.query_pairs()
        .filter(|(key, _)| key != name)
        .map(|(key, value)| (key.into_owned(), value.into_owned()))
        .collect()
}
