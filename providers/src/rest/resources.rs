//! `[providers.NAME.resources.RESOURCE]`: the streams of a `kind = "rest"` provider beyond
//! the primary one (`records`, described by the top-level keys), what each inherits from
//! the top-level keys, and the templates of a child resource, rendered once per parent
//! record.

use std::collections::BTreeMap;
use std::fmt;

use reqwest::header::HeaderValue;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::config::{hidden_headers, shown_query, PaginationConfig, RestConfig};
use super::field_path::FieldPath;
use super::filter::RecordsFilter;
use super::incremental::IncrementalConfig;
use super::template::{Encoding, Template};
use crate::quote::quoted;
use crate::StreamSpec;

/// The name of the primary stream, which the top-level keys describe.
pub(crate) const PRIMARY: &str = "records";

/// The longest resource name: stream names are stored in 64-character columns.
const MAX_NAME_LEN: usize = 64;

/// What a placeholder is replaced with when a child's settings are checked.
const SAMPLE: &str = "1";

/// One `[providers.NAME.resources.RESOURCE]` table: another listing of the same API, synced
/// as the stream RESOURCE. `base_url` and `auth` are the top-level ones (they cannot be set
/// here); `query` and `headers` are merged over the top-level ones; `records_path`,
/// `id_field`/`key_fields` and `pagination` are the top-level ones unless given here;
/// `incremental`, `records_filter` and `fields` belong to the resource alone. Its `Debug`
/// hides every header value and the values of secret query parameters.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceConfig {
    /// Path of the list endpoint, appended to `base_url` as the top-level `path` is, e.g.
    /// `"/v1/projects/{parent.id}/tasks"`. Required.
    pub path: String,
    /// The stream this one is listed once per stored record of: `"records"` or another
    /// resource's name. The resource's `path`, `query` values and `headers` values may then
    /// name the parent's fields as `{parent.FIELD}`. Omitted: listed once per run.
    #[serde(default)]
    pub parent: Option<String>,
    /// As the top-level `records_path`; `""` is the body itself. Omitted: the top-level one.
    #[serde(default)]
    pub records_path: Option<String>,
    /// As the top-level `id_field`. When neither `id_field` nor `key_fields` is given here,
    /// the top-level ones apply.
    #[serde(default)]
    pub id_field: Option<String>,
    /// As the top-level `key_fields` (see `id_field` for what is inherited).
    #[serde(default)]
    pub key_fields: Option<Vec<String>>,
    /// As the top-level `[pagination]` table, which it replaces as a whole. Omitted: the
    /// top-level one.
    #[serde(default)]
    pub pagination: Option<PaginationConfig>,
    /// As the top-level `incremental`, for this resource alone. Omitted: full passes.
    #[serde(default)]
    pub incremental: Option<IncrementalConfig>,
    /// Query parameters sent besides the top-level ones; a name given in both sends this
    /// value.
    #[serde(default)]
    pub query: BTreeMap<String, String>,
    /// Headers sent besides the top-level ones; a name given in both (in any case) sends
    /// this value.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// As the top-level `records_filter`, for this resource alone.
    #[serde(default)]
    pub records_filter: Option<RecordsFilter>,
    /// As the top-level `fields`: more fields the resource's children may name.
    #[serde(default)]
    pub fields: Vec<String>,
}

impl fmt::Debug for ResourceConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResourceConfig")
            .field("path", &self.path)
            .field("parent", &self.parent)
            .field("records_path", &self.records_path)
            .field("id_field", &self.id_field)
            .field("key_fields", &self.key_fields)
            .field("pagination", &self.pagination)
            .field("incremental", &self.incremental)
            .field("query", &shown_query(&self.query))
            .field("headers", &hidden_headers(&self.headers))
            .field("records_filter", &self.records_filter)
            .field("fields", &self.fields)
            .finish()
    }
}

/// The streams a config describes: `records` first, then the resources in name order.
pub(crate) fn streams(config: &RestConfig) -> Vec<StreamSpec> {
    let mut streams = vec![StreamSpec::top(PRIMARY)];
    streams.extend(
        config
            .resources
            .iter()
            .map(|(name, resource)| match &resource.parent {
                Some(parent) => StreamSpec::child(name, parent),
                None => StreamSpec::top(name),
            }),
    );
    streams
}

/// One stream's settings with what it inherits resolved.
#[derive(Clone, Debug)]
pub(crate) struct StreamPlan {
    /// The resource's name, or `records`.
    pub(crate) name: String,
    /// The parent stream of a child resource.
    pub(crate) parent: Option<String>,
    /// The stream's settings as one config without resources. A child's path, query
    /// values and header values hold their templates rendered with a sample value: see
    /// [`StreamPlan::for_parent`].
    pub(crate) config: RestConfig,
    /// A child's templates.
    templates: Option<Templates>,
}

/// The templates of a child resource (only its own query parameters and headers: the
/// inherited ones are never templates).
#[derive(Clone, Debug)]
struct Templates {
    path: Template,
    query: Vec<(String, Template)>,
    headers: Vec<(String, Template)>,
}

impl StreamPlan {
    /// The settings the children of `parent` are listed with: every template rendered with
    /// the parent's fields. The message says which field of the parent is missing or
    /// unusable, and which key names it.
    pub(crate) fn for_parent(
        &self,
        parent: &crate::ParentRecord<'_>,
    ) -> Result<RestConfig, String> {
        let Some(templates) = &self.templates else {
            return Ok(self.config.clone());
        };
        let parent_stream = self.parent.as_deref().unwrap_or(PRIMARY);
        let record = format!(
            "the parent record {} of stream {parent_stream:?}",
            quoted(parent.external_id)
        );
        let payload = serde_json::from_str::<&RawValue>(parent.payload)
            .map_err(|err| format!("{record} is not JSON: {err}"))?;
        let name = &self.name;
        let render = |template: &Template, encoding, key: &str| {
            template
                .render(payload, encoding)
                .map_err(|why| format!("{record} {why}, which resources.{name}.{key} names"))
        };
        let mut config = self.config.clone();
        config.path = render(&templates.path, Encoding::PathSegment, "path")?;
        for (param, template) in &templates.query {
            let value = render(template, Encoding::Raw, &format!("query.{param}"))?;
            config.query.insert(param.clone(), value);
        }
        for (header, template) in &templates.headers {
            let key = format!("headers.{header}");
            let value = render(template, Encoding::Raw, &key)?;
            if HeaderValue::from_str(&value).is_err() {
                return Err(format!(
                    "{record} gives resources.{name}.{key} a value that is not a valid HTTP \
                     header value"
                ));
            }
            config.headers.insert(header.clone(), value);
        }
        Ok(config)
    }
}

/// The plan of every stream, `records` first; a resource whose settings are wrong has the
/// message instead.
pub(crate) fn plans(config: &RestConfig) -> Vec<(String, Result<StreamPlan, String>)> {
    let mut primary = config.clone();
    primary.resources = BTreeMap::new();
    let mut plans = vec![(
        PRIMARY.to_string(),
        Ok(StreamPlan {
            name: PRIMARY.to_string(),
            parent: None,
            config: primary,
            templates: None,
        }),
    )];
    for (name, resource) in &config.resources {
        plans.push((name.clone(), plan(config, name, resource)));
    }
    plans
}

/// A resource's templates parsed and its settings merged with the top-level ones.
fn plan(config: &RestConfig, name: &str, resource: &ResourceConfig) -> Result<StreamPlan, String> {
    let key = |rest: &str| format!("resources.{name}.{rest}");
    let parse = |text: &str, at: String| {
        let template = Template::parse(text).map_err(|why| format!("{at} {why}"))?;
        if resource.parent.is_none() {
            if let Some(field) = template.fields().next() {
                return Err(format!(
                    "{at} names {{parent.{field}}}, but resources.{name} has no parent: set \
                     parent to the stream whose records it is listed per, or write {{{{ and \
                     }}}} for literal braces"
                ));
            }
        }
        Ok(template)
    };
    let path = parse(&resource.path, key("path"))?;
    let query = resource
        .query
        .iter()
        .map(|(param, text)| Ok((param.clone(), parse(text, key(&format!("query.{param}")))?)))
        .collect::<Result<Vec<_>, String>>()?;
    let headers = resource
        .headers
        .iter()
        .map(|(header, text)| {
            Ok((
                header.clone(),
                parse(text, key(&format!("headers.{header}")))?,
            ))
        })
        .collect::<Result<Vec<_>, String>>()?;

    let mut merged = config.clone();
    merged.resources = BTreeMap::new();
    merged.path = path.render_sample(SAMPLE);
    if resource.records_path.is_some() {
        merged.records_path = resource.records_path.clone();
    }
    if resource.id_field.is_some() || resource.key_fields.is_some() {
        merged.id_field = resource.id_field.clone();
        merged.key_fields = resource.key_fields.clone();
    }
    if let Some(pagination) = &resource.pagination {
        merged.pagination = pagination.clone();
    }
    merged.incremental = resource.incremental.clone();
    merged.records_filter = resource.records_filter.clone();
    merged.fields = resource.fields.clone();
    for (param, template) in &query {
        merged
            .query
            .insert(param.clone(), template.render_sample(SAMPLE));
    }
    for (header, template) in &headers {
        merged
            .headers
            .retain(|inherited, _| !inherited.eq_ignore_ascii_case(header));
        merged
            .headers
            .insert(header.clone(), template.render_sample(SAMPLE));
    }
    let templates = resource.parent.is_some().then_some(Templates {
        path,
        query,
        headers,
    });
    Ok(StreamPlan {
        name: name.to_string(),
        parent: resource.parent.clone(),
        config: merged,
        templates,
    })
}

/// Checks every resource: its name, its parent (known, no cycle), its templates (well
/// formed, naming only fields the parent has) and its settings merged with what it
/// inherits.
pub(super) fn validate(config: &RestConfig) -> Result<(), String> {
    for (name, resource) in &config.resources {
        validate_name(name)?;
        if let Some(parent) = &resource.parent {
            if parent != PRIMARY && !config.resources.contains_key(parent) {
                let mut known = vec![format!("{PRIMARY:?}")];
                known.extend(config.resources.keys().map(|name| format!("{name:?}")));
                return Err(format!(
                    "resources.{name}.parent {parent:?} is not a stream of this provider; \
                     expected one of: {}",
                    known.join(", ")
                ));
            }
        }
    }
    for name in config.resources.keys() {
        if let Some(cycle) = parent_cycle(config, name) {
            return Err(format!(
                "resources.{name}.parent makes the parents a cycle ({}); a chain of parents \
                 must end at a stream without one",
                cycle.join(" -> ")
            ));
        }
    }
    for (name, plan) in plans(config).into_iter().skip(1) {
        let plan = plan?;
        if let (Some(parent), Some(templates)) = (&plan.parent, &plan.templates) {
            let has = parent_fields(config, parent);
            let named = std::iter::once(("path".to_string(), &templates.path))
                .chain(
                    templates
                        .query
                        .iter()
                        .map(|(param, template)| (format!("query.{param}"), template)),
                )
                .chain(
                    templates
                        .headers
                        .iter()
                        .map(|(header, template)| (format!("headers.{header}"), template)),
                );
            for (key, template) in named {
                if let Some(field) = template
                    .fields()
                    .find(|field| !has.iter().any(|own| own.segments() == field.segments()))
                {
                    let fields_key = match parent.as_str() {
                        PRIMARY => "fields".to_string(),
                        resource => format!("resources.{resource}.fields"),
                    };
                    return Err(format!(
                        "resources.{name}.{key} names {{parent.{field}}}, a field the parent \
                         stream {parent:?} does not have: a parent has its id_field, its \
                         key_fields, its incremental.cursor_field and the fields its `fields` \
                         lists; add {:?} to {fields_key}",
                        field.to_string()
                    ));
                }
            }
        }
        plan.config
            .validate_stream()
            .map_err(|message| format!("resources.{name}: {message}"))?;
    }
    Ok(())
}

/// Lowercase letters, digits and `_`, not `records`.
fn validate_name(name: &str) -> Result<(), String> {
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
    if name.is_empty() || !name.chars().all(allowed) {
        return Err(format!(
            "resources.{} is not a valid resource name: expected lowercase letters, digits \
             and `_`",
            quoted(name)
        ));
    }
    if name == PRIMARY {
        return Err(format!(
            "resources.{PRIMARY} is not a valid resource name: {PRIMARY:?} is the stream the \
             top-level keys describe"
        ));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!(
            "resources.{name} is not a valid resource name: longer than {MAX_NAME_LEN} \
             characters"
        ));
    }
    Ok(())
}

/// The chain of parents from `start` back to `start`, if its parents form a cycle.
fn parent_cycle(config: &RestConfig, start: &str) -> Option<Vec<String>> {
    let mut chain = vec![start.to_string()];
    let mut current = start;
    // A chain longer than the resources must repeat one.
    for _ in 0..=config.resources.len() {
        let parent = config.resources.get(current)?.parent.as_deref()?;
        chain.push(parent.to_string());
        if parent == start {
            return Some(chain);
        }
        current = parent;
    }
    // A cycle that does not pass `start`: reported when its own members are checked.
    None
}

/// The fields a child's templates may name in the records of stream `parent`: its id
/// field or key fields (inherited ones included), its `incremental.cursor_field` and its
/// `fields`.
fn parent_fields(config: &RestConfig, parent: &str) -> Vec<FieldPath> {
    let (id_field, key_fields, incremental, fields) = match config.resources.get(parent) {
        Some(resource) if resource.id_field.is_some() || resource.key_fields.is_some() => (
            resource.id_field.as_ref(),
            resource.key_fields.as_ref(),
            resource.incremental.as_ref(),
            &resource.fields,
        ),
        Some(resource) => (
            config.id_field.as_ref(),
            config.key_fields.as_ref(),
            resource.incremental.as_ref(),
            &resource.fields,
        ),
        None => (
            config.id_field.as_ref(),
            config.key_fields.as_ref(),
            config.incremental.as_ref(),
            &config.fields,
        ),
    };
    let default_id = (id_field.is_none() && key_fields.is_none()).then(|| "id".to_string());
    id_field
        .into_iter()
        .chain(default_id.as_ref())
        .chain(key_fields.into_iter().flatten())
        .chain(incremental.map(|incremental| &incremental.cursor_field))
        .chain(fields)
        .filter_map(|text| FieldPath::parse(text).ok())
        .collect()
}
