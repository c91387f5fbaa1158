//! `streams = [...]` in a provider table: which of the kind's streams a connection syncs,
//! and the namespace each stream's records are stored under.

use tributary_providers::{ProviderConfig, StreamSpec};

/// The longest namespace (`records.provider` is a 64-character column).
const MAX_NAMESPACE_LEN: usize = 64;

/// One stream a provider syncs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamSettings {
    /// The stream's name (`issues`, `pull_requests`).
    pub name: String,
    /// What its records' `provider` column holds: the provider's name for the kind's
    /// primary stream (where records were before streams), `PROVIDER.STREAM` otherwise.
    /// Provider names have no `.`, so no two streams of any providers share one.
    pub namespace: String,
    /// For a child stream, the stream whose stored records it is listed per.
    pub parent: Option<ParentStream>,
}

/// The parent of a child stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParentStream {
    pub name: String,
    /// Where the parent's records are stored.
    pub namespace: String,
}

/// The namespace of stream `stream` of provider `provider` whose kind's primary stream is
/// `primary`.
pub fn namespace(provider: &str, primary: &str, stream: &str) -> String {
    if stream == primary {
        provider.to_string()
    } else {
        format!("{provider}.{stream}")
    }
}

/// The `streams` key of provider `provider`: the named streams (the primary one when
/// absent) in the order runs take them, every parent before its children. Errors are
/// messages about the key.
pub(super) fn parse(
    provider: &str,
    adapter: &ProviderConfig,
    value: Option<toml::Value>,
) -> Result<Vec<StreamSettings>, String> {
    let known = adapter.streams();
    let Some(primary) = known.first() else {
        return Err(format!("kind {:?} has no streams", adapter.kind()));
    };
    let names = match value {
        None => vec![primary.name.clone()],
        Some(value) => names(value, adapter.kind(), &known)?,
    };
    let mut streams: Vec<StreamSettings> = Vec::with_capacity(names.len());
    for name in &names {
        let spec = known
            .iter()
            .find(|spec| &spec.name == name)
            .ok_or_else(|| unknown(name, adapter.kind(), &known))?;
        let parent = match &spec.parent {
            None => None,
            Some(parent) if names.contains(parent) => Some(ParentStream {
                name: parent.clone(),
                namespace: namespace(provider, &primary.name, parent),
            }),
            Some(parent) => {
                return Err(format!(
                    "stream {name:?} is listed once per stored record of {parent:?}, which \
                     `streams` does not list: add {parent:?}"
                ))
            }
        };
        let namespace = namespace(provider, &primary.name, name);
        if namespace.len() > MAX_NAMESPACE_LEN {
            return Err(format!(
                "stream {name:?} stores its records as provider {namespace:?}, longer than \
                 {MAX_NAMESPACE_LEN} characters: shorten the provider's name"
            ));
        }
        streams.push(StreamSettings {
            name: name.clone(),
            namespace,
            parent,
        });
    }
    Ok(parents_first(streams))
}

/// The names in a `streams` array: strings, each once, at least one.
fn names(value: toml::Value, kind: &str, known: &[StreamSpec]) -> Result<Vec<String>, String> {
    let toml::Value::Array(items) = value else {
        return Err(format!(
            "expected an array of stream names, got {}",
            value.type_str()
        ));
    };
    if items.is_empty() {
        return Err(format!(
            "expected at least one stream of {}",
            choices(kind, known)
        ));
    }
    let mut names: Vec<String> = Vec::with_capacity(items.len());
    for item in items {
        let toml::Value::String(name) = item else {
            return Err(format!(
                "expected stream names as strings, got {}",
                item.type_str()
            ));
        };
        if names.contains(&name) {
            return Err(format!("stream {name:?} is listed twice"));
        }
        names.push(name);
    }
    Ok(names)
}

fn unknown(name: &str, kind: &str, known: &[StreamSpec]) -> String {
    format!("unknown stream {name:?}: {}", choices(kind, known))
}

fn choices(kind: &str, known: &[StreamSpec]) -> String {
    let names: Vec<&str> = known.iter().map(|spec| spec.name.as_str()).collect();
    format!("kind {kind:?} has {}", names.join(", "))
}

/// The streams reordered so that every parent comes before its children, otherwise in
/// the order given. Every parent is listed (checked above), so each round places one.
fn parents_first(mut waiting: Vec<StreamSettings>) -> Vec<StreamSettings> {
    let mut ordered: Vec<StreamSettings> = Vec::with_capacity(waiting.len());
    while !waiting.is_empty() {
        let ready = waiting.iter().position(|stream| {
            stream
                .parent
                .as_ref()
                .is_none_or(|parent| ordered.iter().any(|placed| placed.name == parent.name))
        });
        // A cycle of parents cannot be declared by a kind; place the rest as given.
        let index = ready.unwrap_or(0);
        ordered.push(waiting.remove(index));
    }
    ordered
}
