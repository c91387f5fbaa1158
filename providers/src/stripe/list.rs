//! Reading Stripe's list objects (`{"object": "list", "data": [...], "has_more": ...}`),
//! and one page of a stream's own list.

use serde_json::value::RawValue;
use serde_json::Value;
use url::Url;

use super::position::StripePosition;
use super::streams::Stream;
use crate::adapter;
use crate::http::{cap_body, display_url, Answered};
use crate::quote::quote_cursor;
use crate::raw::{array_items, lookup_raw, text_kind, to_value, ListShape, RawList, RawObject};
use crate::record::json_type_name;
use crate::{FetchError, Page, ParentRecord, Watermark};

/// One page of a stream's list to ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ListPage {
    /// The object the page continues after (`starting_after`); `None` for the first page.
    pub after: Option<String>,
    /// Only objects created at or after this second (`created[gte]`).
    pub created_gte: Option<i64>,
    /// The watermark the page carries.
    pub watermark: ListWatermark,
}

/// The watermark a page of a list carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ListWatermark {
    /// The newest `created` among its objects (a list read by `created[gte]`).
    NewestCreated,
    /// This epoch second: the first page of a full pass says when the pass began.
    At(i64),
    /// None: the page says nothing about what the next run may skip.
    Without,
}

impl ListPage {
    /// The page's URL for `stream` (with `parent`'s invoice id, for line items).
    pub fn url(
        &self,
        base: &Url,
        stream: &Stream,
        invoice_id: Option<&str>,
        limit: u32,
    ) -> Result<Url, FetchError> {
        let mut url = stream.list_url(base, invoice_id)?;
        {
            let mut query = url.query_pairs_mut();
            query.append_pair("limit", &limit.to_string());
            if let Some(id) = &self.after {
                query.append_pair("starting_after", id);
            }
            if let Some(since) = self.created_gte {
                query.append_pair("created[gte]", &since.to_string());
            }
        }
        Ok(url)
    }
}

/// A list object's items, still raw, and whether more follow.
pub(super) struct StripeList<'a> {
    /// The `data` array's elements in the order Stripe sent them.
    pub items: Vec<&'a RawValue>,
    /// `has_more`: whether the list goes on past these items.
    pub has_more: bool,
}

/// The error for a body that is JSON but not the list expected.
pub(super) fn shape_error(answered: &Answered<'_>, message: String) -> FetchError {
    FetchError::Shape {
        url: display_url(answered.url),
        message,
        body: cap_body(answered.text.as_bytes()),
    }
}

/// Reads the answer as a list object of `what` (`"charges"`, `"events"`).
pub(super) fn read<'a>(answered: &Answered<'a>, what: &str) -> Result<StripeList<'a>, FetchError> {
    let text = answered.text;
    let list = read_list_fields(text, answered.max_records).ok_or_else(|| {
        shape_error(
            answered,
            format!(
                "the body is {}, expected a Stripe list object",
                text_kind(text).name()
            ),
        )
    })?;
    let items = match list.items {
        Some(Ok(items)) => items,
        Some(Err(not_items)) => {
            let max = answered.max_records;
            return Err(adapter::unreadable_records(
                answered.url,
                text,
                max,
                not_items,
                |kind| format!("`data` is {}, expected an array of {what}", kind.name()),
            ));
        }
        None => {
            let message = format!("`data` is missing, expected an array of {what}");
            return Err(shape_error(answered, message));
        }
    };
    let has_more = match list.fields.get("has_more").map(to_value) {
        Some(Value::Bool(has_more)) => has_more,
        found => {
            let found = found.as_ref().map_or("missing", json_type_name);
            return Err(shape_error(
                answered,
                format!("`has_more` is {found}, expected a boolean (is this a Stripe list?)"),
            ));
        }
    };
    Ok(StripeList { items, has_more })
}

/// The list's fields with `data` read in the same scan that checks the body is JSON, or
/// by the slower way when that fails (e.g. a number past f64 in `data`, which only the
/// record-by-record scan keeps). `None` when the body is not a JSON object.
fn read_list_fields(text: &str, max_records: usize) -> Option<RawList<'_>> {
    let shape = ListShape {
        key: "data",
        fields: &["has_more"],
        max_items: max_records,
    };
    RawList::parse_text(text, shape).or_else(|| {
        let body: &RawValue = serde_json::from_str(text).ok()?;
        let fields = RawObject::parse(body, &["data", "has_more"])?;
        let items = fields
            .get("data")
            .map(|data| array_items(data, max_records));
        Some(RawList { fields, items })
    })
}

/// The `id` of `item` (the `object` named in the message) to page on from: a string
/// that can stand in a position, or a shape error saying why the list cannot go on.
pub(super) fn continue_id(
    answered: &Answered<'_>,
    item: Option<&RawValue>,
    object: &str,
) -> Result<String, FetchError> {
    match item.and_then(|item| lookup_raw(item, "id")).map(to_value) {
        Some(Value::String(id)) if StripePosition::can_hold(&id) => Ok(id),
        Some(Value::String(id)) => Err(shape_error(
            answered,
            format!(
                "the {object} id {} cannot be continued from: it is empty or not visible ASCII",
                quote_cursor(&id)
            ),
        )),
        _ => Err(shape_error(
            answered,
            format!(
                "`has_more` is true, but the page has no {object} with a string `id` to \
                 continue from"
            ),
        )),
    }
}

/// One page of a stream's list: its objects keyed by `id` in the order Stripe sent them
/// (newest first), and the position after the last one while `has_more` is true.
pub(super) fn read_page(
    answered: &Answered<'_>,
    object: &str,
    watermark: ListWatermark,
) -> Result<Page, FetchError> {
    let list = read(answered, &format!("{object} objects"))?;
    let next = if list.has_more {
        let after = continue_id(
            answered,
            list.items.last().copied(),
            &format!("last {object}"),
        )?;
        Some(StripePosition::List { after }.into_page_position())
    } else {
        None
    };
    let created = adapter::WatermarkField::Epoch("created");
    let mut page = adapter::page_by_id(&list.items, created, next);
    match watermark {
        ListWatermark::NewestCreated => {}
        ListWatermark::At(second) => page.watermark = Some(Watermark::Epoch(second)),
        ListWatermark::Without => page.watermark = None,
    }
    Ok(page)
}

/// A page that lists nothing because the invoice's lines cannot be listed, saying why.
pub(super) fn parent_gone(reason: String) -> Page {
    Page {
        parent_gone: Some(reason),
        ..Page::default()
    }
}

/// The parent of a line-items page. Only a bug in the caller asks for one without its
/// invoice, since the stream is a child of `invoices`.
pub(super) fn parent_of<'a>(
    stream: &Stream,
    parent: Option<ParentRecord<'a>>,
) -> Result<ParentRecord<'a>, FetchError> {
    parent.ok_or_else(|| FetchError::Client {
        message: format!(
            "the {} stream is listed per invoice, but its page was asked for without one",
            stream.name
        ),
    })
}
