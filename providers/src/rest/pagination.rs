//! Pagination of a `kind = "rest"` provider: the URL of a page and where the next one starts.

use reqwest::header::LINK;
use serde_json::Value;
use url::Url;

use super::config::{PaginationConfig, PaginationType, RestConfig};
use super::link;
use crate::http::{cap_body, display_url, display_url_text, JsonResponse};
use crate::raw::{lookup_raw, to_value};
use crate::record::json_type_name;
use crate::{FetchError, PagePosition};

/// The URL of the page at `position` (`None`: the first page).
pub(super) fn page_url(
    config: &RestConfig,
    position: Option<&PagePosition>,
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
        (PaginationType::Offset, Some(PagePosition::Offset { offset })) => {
            Some((pagination.offset_param(), offset.to_string()))
        }
        (PaginationType::Page, Some(PagePosition::Page { page })) => {
            Some((pagination.page_param(), page.to_string()))
        }
        (PaginationType::Link, Some(PagePosition::Url { url })) => {
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

/// A next-page URL given by the API, fetched as is but only on the configured origin, so the
/// token is never sent to another host.
fn followed_url(config: &RestConfig, text: &str) -> Result<Url, FetchError> {
    crate::adapter::same_origin_url(&config.base_url, text)
}

/// Where the page after this one starts; `None` when this was the last page. `records` is
/// the number of records the page held.
pub(super) fn next_position(
    pagination: &PaginationConfig,
    position: Option<&PagePosition>,
    response: &JsonResponse,
    records: u64,
) -> Result<Option<PagePosition>, FetchError> {
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
            let page = match position {
                Some(PagePosition::Page { page }) => *page,
                _ => pagination.first_page(),
            };
            Ok(full_page.then(|| PagePosition::Page {
                page: page.saturating_add(1),
            }))
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
            Ok(Some(PagePosition::Url {
                url: next.to_string(),
            }))
        }
    }
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
